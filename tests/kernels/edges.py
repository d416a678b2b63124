"""The inputs that tell a wrong kernel from a right one: each reaches a path the random inputs miss.

``eps``: rows whose mean square is near the epsilon, so an epsilon ten times off (or a constant in
its place) moves every stored value far beyond the output's precision.  ``logits``: scores of +200
(exp overflows in fp32 unless the softmax subtracts its maximum first).  ``slots``: working rows
stored at the cache's first and last slot.  ``tiles-K`` (the faithful variant): the zero, tiny
(below the amax floor), large-exponent and negative tiles starting at FP8 tile K, so each quarter of
the store meets every edge for some K in 0, 2, 4, 6.  ``random``: the seeded random inputs alone.

Each builder takes a seed: every random input here is seeded, so a failure reproduces.
"""

from __future__ import annotations

from diagtools.kernels.reference import Inputs, make_inputs
from diagtools.kernels.state import LAYOUTS
from diagtools.kernels.state_reference import StateInputs, make_state_inputs

from .tolerances import with_edge_tiles

SIMPLIFIED_EDGES = ("random", "eps", "logits", "slots")
STATE_EDGES = ("random", "eps", "logits", "slots", "tiles-0", "tiles-2", "tiles-4", "tiles-6")
C4_REQUESTS = ((0, 13), (5, 6), (30, 2), (6, 1), (10, 1))  # a first group, windows across blocks, decodes
C128_EDGE_REQUESTS = ((0, 256), (284, 100))  # C128 boundaries at 127, 255 and 383
EDGE_EPS = 1e-3  # with rows scaled so their mean square is about this


def simplified_edge(kind: str, *, head_dim: int = 128, seed: int = 0) -> Inputs:
    """Simplified-kernel inputs (12 groups, ratio 4) that reach the path ``kind`` names."""
    inputs = make_inputs(12, head_dim, padding=0.0, seed=seed)
    eps = 1e-6
    if kind == "random":
        pass
    elif kind == "eps":
        eps = EDGE_EPS
        inputs.kv.mul_(0.03)  # bf16 rows of about 0.03: mean square near 1e-3
    elif kind == "logits":
        inputs.score.add_(200.0)
    elif kind == "slots":
        last = inputs.kv_cache.shape[0] * inputs.kv_cache.shape[1] - 1
        _give_slot(inputs.slot_mapping, 0, 0)
        _give_slot(inputs.slot_mapping, len(inputs.slot_mapping) - 1, last)
    else:
        raise ValueError(f"no simplified edge {kind!r}")
    return Inputs(*inputs.args(), ratio=4, eps=eps)


def state_edge(kind: str, *, ratio: int = 4, seed: int = 0) -> StateInputs:
    """Faithful-variant inputs (C4 requests, or one C128 boundary) that reach the path ``kind`` names."""
    requests = C4_REQUESTS if ratio == 4 else C128_EDGE_REQUESTS
    if kind == "slots":
        requests = ((0, 8),) if ratio == 4 else ((0, 256),)
    inputs = make_state_inputs(ratio, requests, padding=0.0, state_block=4 if ratio == 4 else 16, seed=seed)
    width = LAYOUTS[ratio].width
    eps = 1e-6
    if kind == "random":
        pass
    elif kind == "eps":
        eps = EDGE_EPS
        inputs.state_cache[..., :width] *= 0.03
    elif kind == "logits":
        inputs.state_cache[..., width:] += 200.0
    elif kind == "slots":
        working = inputs.working().nonzero().flatten()
        last = inputs.kv_cache.shape[0] * inputs.kv_cache.shape[1] - 1
        inputs.slot_mapping[working[0]], inputs.slot_mapping[working[-1]] = 0, last
    elif kind.startswith("tiles-"):
        with_edge_tiles(inputs, first=int(kind.split("-")[1]))
    else:
        raise ValueError(f"no state edge {kind!r}")
    return StateInputs(*inputs.args(), ratio=ratio, eps=eps)


def _give_slot(slots, group: int, slot: int) -> None:
    """Group ``group`` stores at ``slot``; a group that held it takes ``group``'s old slot (no two share one)."""
    holder = (slots == slot).nonzero().flatten()
    if holder.numel():
        slots[holder[0]] = slots[group].clone()
    slots[group] = slot
