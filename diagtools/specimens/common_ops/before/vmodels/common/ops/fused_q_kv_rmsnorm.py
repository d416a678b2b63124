"""A light op: pure Python, safe to import anywhere."""


def fused_q_kv_rmsnorm(q, kv, eps=1e-6):
    return q, kv
