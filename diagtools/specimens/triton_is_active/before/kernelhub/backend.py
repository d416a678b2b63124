"""Backend selection, decided once when the module is imported."""

from triton.backends.nvidia.driver import CudaDriver

HAS_GPU = CudaDriver.is_active()


def has_gpu():
    return HAS_GPU
