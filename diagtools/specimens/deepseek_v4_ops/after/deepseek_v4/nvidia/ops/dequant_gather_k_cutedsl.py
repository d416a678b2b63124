"""Another CuTe DSL kernel module: it imports cutlass at top level and asks the GPU's arch, too."""

from cutlass.base_dsl.runtime.cuda import get_compute_capability_major_minor

ARCH_MAJOR, ARCH_MINOR = get_compute_capability_major_minor()


def dequantize_and_gather_k_cache_cutedsl(cache, slots):
    """Placeholder for the dequantize-and-gather kernel launch."""
    return cache, slots
