"""KV-cache helpers; the CUDA kernel is imported where it runs."""


def gather_k_cache(cache, slots):
    from deepseek_v4.nvidia.ops.dequant_gather_k_cutedsl import dequantize_and_gather_k_cache_cutedsl

    return dequantize_and_gather_k_cache_cutedsl(cache, slots)
