"""Common ops. Heavy ones are imported from their own module, not from here."""

from .fused_q_kv_rmsnorm import fused_q_kv_rmsnorm

__all__ = ["fused_q_kv_rmsnorm"]
