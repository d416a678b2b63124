"""Model layers, re-exported for convenience."""

from .quant_fusion import fused_rms_quant

__all__ = ["fused_rms_quant"]
