"""Common ops, re-exported for convenience."""

from .fused_allreduce_rms_norm import fused_allreduce_rms_norm
from .fused_q_kv_rmsnorm import fused_q_kv_rmsnorm

__all__ = ["fused_allreduce_rms_norm", "fused_q_kv_rmsnorm"]
