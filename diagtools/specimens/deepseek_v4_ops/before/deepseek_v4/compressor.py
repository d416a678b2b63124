"""The compressor layer: picks the CuTe DSL kernel only when it runs on CUDA."""


def compress(kv, score):
    from deepseek_v4.nvidia.ops.sparse_attn_compress_cutedsl import sparse_attn_compress

    return sparse_attn_compress(kv, score)
