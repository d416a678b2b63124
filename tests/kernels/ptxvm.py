"""A small PTX interpreter: runs the shipped CuTe DSL kernels on the CPU, on real CPU tensors.

It executes the exact PTX text the GPU would load, with the arguments the real host code packs
(``plan_launch``), over memory that is the CPU tensors' own storage, so a wrong index, a wrong
byte order or a wrong layout in the compiled kernel shows up as wrong bytes in the output.  It
also refuses what the hardware would fault on or leave undefined: a global access outside the
tensor its address was derived from (each kernel parameter's pointer is followed through the
address arithmetic), a misaligned vector access, a shared access outside the CTA's allocation,
a shuffle whose member mask does not match the lanes that execute it or that reads an exited
lane, a data race on shared memory between two warps of a CTA (a byte written by one warp
and read or written by another with no barrier between), and a race on global memory between
two CTAs of the launch (a byte one CTA wrote that another reads or writes, or one CTA read that
another writes: nothing orders CTAs within a launch).

Scope: the instructions these kernels use (integer and fp32 arithmetic, compares and selects,
conversions to bf16 and packed e4m3, ``ex2``/``rcp``/``rsqrt``, vector loads and stores, warp
shuffles, one CTA barrier).  Every modifier is either modelled or refused with :class:`PtxError`:
``.ftz`` flushes fp32 subnormal inputs and results to zero (a ``setp.ftz`` compares them as
zeros); ``cvt`` to bf16 rounds ``.rn`` or ``.rz``, and a conversion not modelled is refused when
the PTX is parsed; ``fma`` rounds once (exactly, by rounding to odd in fp64 first); ``mul.hi``
keeps the high half; ``shfl`` follows the PTX definition of its clamp and segment mask (``c``)
and checks its member mask.  The approximate instructions (``ex2``, ``rcp``, ``rsqrt``
``.approx``) are correctly rounded in fp32 by default, or off by the largest error the PTX ISA
allows (``approximate="low"`` or ``"high"``: 2 ulp, 1 ulp and a relative 2**-22.9), so a check
can show that the kernel's output holds wherever in that range a GPU lands.

A warp runs in lockstep over numpy arrays of its 32 lanes; a lane that branches away waits, and
the warp always steps the lanes with the lowest program counter, which reconverges structured
control flow.  Between two barriers the warps of a CTA run in one of :data:`SCHEDULES`: each
warp to the barrier in turn, in reverse, or one instruction each in turn.

Each launch also counts, per CTA, whether it wrote any global byte (a CTA that does work), per
warp whether it stored anything (a warp that does work), and
per warp-wide memory instruction, the bytes it touched and whether they were one contiguous
range (global memory), and its worst shared-memory bank conflict: :class:`LaunchStats`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

LANES = 32
BANKS = 32
SCHEDULES = ("in order", "reverse", "round robin")
_NO_ORIGIN = -1


class PtxError(RuntimeError):
    """The kernel did something this interpreter (or the hardware) refuses."""


@dataclass(frozen=True)
class Instruction:
    line: int
    guard: str | None  # "%p1" or "!%p1"
    opcode: str
    operands: tuple[str, ...]


@dataclass
class Buffer:
    base: int
    data: np.ndarray  # uint8 view of a tensor's storage
    read_bytes: int = 0
    written_bytes: int = 0
    writer: np.ndarray | None = None  # per byte: the CTA that wrote it (-1: none)
    reader: np.ndarray | None = None  # per byte: the CTA that read it (-1: none, -2: several)

    def __post_init__(self) -> None:
        self.writer = np.full(self.data.size, -1, dtype=np.int32)
        self.reader = np.full(self.data.size, -1, dtype=np.int32)


@dataclass
class AccessStats:
    """One memory instruction (a PTX line), over every time a warp executed it."""

    space: str
    kind: str  # "ld" or "st"
    lane_bytes: int  # bytes each lane moves
    executed: int = 0
    bytes: int = 0  # distinct bytes, summed over executions
    contiguous: int = 0  # executions whose bytes were one contiguous range
    worst_conflict: int = 0  # shared memory: the most distinct words one bank served in one phase


@dataclass
class LaunchStats:
    """What one launch did, for the layout benchmark and the tests."""

    ctas: int = 0
    working_ctas: int = 0  # CTAs that wrote at least one global byte
    warps: int = 0
    working_warps: int = 0  # warps that stored anything (global or shared memory)
    # global bytes loaded and not yet used (in PTX order), at the most: by one warp, and by one CTA's warps together
    warp_in_flight: int = 0
    cta_in_flight: int = 0
    accesses: dict[int, AccessStats] = field(default_factory=dict)

    def of(self, space: str, kind: str) -> list[AccessStats]:
        return [a for a in self.accesses.values() if a.space == space and a.kind == kind and a.executed]


class Memory:
    """Global memory: the storage of the given CPU tensors, at their real addresses."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.buffers = sorted(
            (Buffer(t.data_ptr(), t.detach().reshape(-1).view(torch.uint8).numpy()) for t in tensors if t.numel()),
            key=lambda b: b.base,
        )
        self.written = 0

    def origin_of(self, address: int) -> int:
        """The buffer a pointer parameter points into (its start, or inside it); -1 for none."""
        for i, buffer in enumerate(self.buffers):
            if buffer.base <= address < buffer.base + buffer.data.size:
                return i
        return _NO_ORIGIN

    def locate(self, addresses: np.ndarray, origins: np.ndarray, size: int) -> np.ndarray:
        """Each address's offset in the buffer it was derived from; a :class:`PtxError` for an
        address of no known origin or one outside its own tensor (even if inside another)."""
        if (origins == _NO_ORIGIN).any():
            bad = int(addresses[origins == _NO_ORIGIN][0])
            raise PtxError(f"global access at {bad:#x} through an address not derived from a pointer parameter")
        offsets = np.zeros(addresses.shape, dtype=np.int64)
        for i in np.unique(origins):
            buffer = self.buffers[int(i)]
            mine = origins == i
            inside = (addresses[mine] >= buffer.base) & (addresses[mine] + size <= buffer.base + buffer.data.size)
            if not inside.all():
                bad = int(addresses[mine][~inside][0])
                raise PtxError(
                    f"global access of {size} bytes at {bad:#x} is outside the tensor its address came from "
                    f"({buffer.data.size} bytes at {buffer.base:#x})"
                )
            offsets[mine] = (addresses[mine] - buffer.base).astype(np.int64)
        return offsets

    def read(self, addresses: np.ndarray, origins: np.ndarray, size: int, cta: int = 0) -> np.ndarray:
        """``[n, size]`` bytes, read by CTA ``cta``: a byte another CTA of the launch wrote is a race (no
        ordering between CTAs exists in a launch)."""
        offsets = self.locate(addresses, origins, size)
        out = np.empty((addresses.size, size), dtype=np.uint8)
        for i, (b, o) in enumerate(zip(origins, offsets, strict=True)):
            buffer = self.buffers[b]
            out[i] = buffer.data[o : o + size]
            buffer.read_bytes += size
            _check_cta_race(buffer, o, size, cta, "read")
            readers = buffer.reader[o : o + size]
            readers[:] = np.where((readers == -1) | (readers == cta), cta, -2)
        return out

    def write(self, addresses: np.ndarray, origins: np.ndarray, rows: np.ndarray, cta: int = 0) -> None:
        """Store ``rows`` for CTA ``cta``: a byte another CTA wrote or read in this launch is a race."""
        offsets = self.locate(addresses, origins, rows.shape[1])
        for i, (b, o) in enumerate(zip(origins, offsets, strict=True)):
            buffer = self.buffers[b]
            size = rows.shape[1]
            _check_cta_race(buffer, o, size, cta, "write")
            buffer.data[o : o + size] = rows[i]
            buffer.written_bytes += size
            buffer.writer[o : o + size] = cta
        self.written += rows.size

    def next_launch(self) -> None:
        """A launch ended: the next one on the stream is ordered after it, so nothing it did can race."""
        for buffer in self.buffers:
            buffer.writer[:] = -1
            buffer.reader[:] = -1

    def traffic(self, tensor: torch.Tensor) -> tuple[int, int]:
        """Bytes the kernel read from and wrote to ``tensor``'s storage, over every lane."""
        for buffer in self.buffers:
            if buffer.base == tensor.data_ptr():
                return buffer.read_bytes, buffer.written_bytes
        raise KeyError("not a tensor of this memory")


# The largest error the PTX ISA allows each approximate instruction (fp32): ex2.approx 2 ulp from the
# correctly rounded result, rcp.approx 1 ulp, rsqrt.approx a relative error of 2**-22.9.
APPROXIMATION_ERRORS = {"ex2": ("ulp", 2), "rcp": ("ulp", 1), "rsqrt": ("relative", 2**-22.9)}
APPROXIMATIONS = ("exact", "low", "high")


def _approximated(op: str, rounded: np.ndarray, approximate: str) -> np.ndarray:
    """The correctly rounded fp32 ``rounded`` moved by the ISA's largest error toward zero (``low``) or away
    from it (``high``); ``exact`` leaves it.  Infinities, zeros and NaNs stay (the ISA's special cases)."""
    if approximate == "exact":
        return rounded
    kind, amount = APPROXIMATION_ERRORS[op]
    finite = np.isfinite(rounded) & (rounded != 0)
    magnitude = np.abs(rounded.astype(np.float32))
    if kind == "ulp":
        target = np.float32(0) if approximate == "low" else np.float32(np.inf)
        for _ in range(amount):
            magnitude = np.where(finite, np.nextafter(magnitude, target), magnitude)
    else:  # the relative bound, then the fp32 value on the far side of it
        factor = 1 - amount if approximate == "low" else 1 + amount
        with np.errstate(over="ignore"):
            moved = (magnitude.astype(np.float64) * factor).astype(np.float32)
        magnitude = np.where(finite, moved, magnitude)
    return np.copysign(magnitude, rounded).astype(np.float32)


def _check_cta_race(buffer: Buffer, offset: int, size: int, cta: int, access: str) -> None:
    """A global-memory race between CTAs of one launch: a byte written by one CTA and read or written by
    another (a write after another CTA's read counts too: the order between CTAs is not defined)."""
    writers = buffer.writer[offset : offset + size]
    other_writer = (writers != -1) & (writers != cta)
    if access == "write":
        readers = buffer.reader[offset : offset + size]
        other_reader = (readers == -2) | ((readers != -1) & (readers != cta))
    else:
        other_reader = np.zeros(size, dtype=bool)
    if other_writer.any() or other_reader.any():
        first = int(np.flatnonzero(other_writer | other_reader)[0])
        who = f"CTA {int(writers[first])} wrote" if other_writer[first] else "another CTA read"
        raise PtxError(
            f"global-memory race between CTAs: CTA {cta} {access}s byte {offset + first} of a tensor that {who}"
        )


class Shared:
    """One CTA's shared memory, with the race detector: per byte, the warp that wrote it and the
    warps that read it since the last barrier."""

    def __init__(self, size: int) -> None:
        self.data = np.zeros(size, dtype=np.uint8)
        self.writer = np.full(size, -1, dtype=np.int16)
        self.readers = np.zeros(size, dtype=np.uint64)

    def barrier(self) -> None:
        self.writer[:] = -1
        self.readers[:] = 0

    def _bytes(self, addresses: np.ndarray, size: int) -> np.ndarray:
        if ((addresses + size) > self.data.size).any():
            raise PtxError(f"shared access of {size} bytes outside the CTA's {self.data.size} bytes")
        return (addresses.astype(np.int64)[:, None] + np.arange(size)).reshape(-1)

    def read(self, warp: int, addresses: np.ndarray, size: int) -> np.ndarray:
        touched = self._bytes(addresses, size)
        others = (self.writer[touched] >= 0) & (self.writer[touched] != warp)
        if others.any():
            raise PtxError(f"shared-memory race: warp {warp} reads a byte warp {self.writer[touched][others][0]} wrote")
        self.readers[touched] |= np.uint64(1 << warp)
        return self.data[touched].reshape(addresses.size, size)

    def write(self, warp: int, addresses: np.ndarray, rows: np.ndarray) -> None:
        touched = self._bytes(addresses, rows.shape[1])
        others = ((self.writer[touched] >= 0) & (self.writer[touched] != warp)) | (
            (self.readers[touched] & ~np.uint64(1 << warp)) != 0
        )
        if others.any():
            raise PtxError(f"shared-memory race: warp {warp} writes a byte another warp used since the barrier")
        self.writer[touched] = warp
        self.data[touched] = rows.reshape(-1)


# ----------------------------------------------------------------------------- parsing

_ENTRY = re.compile(r"\.visible \.entry (\w+)\(([^)]*)\)", re.S)
_SHARED = re.compile(r"\.shared \.align (\d+) \.b8 (\w+)\[(\d+)\];")
_TYPE_NAMES = {"f32", "s32", "u32", "b32", "s64", "u64", "b64", "b16", "u16", "s16", "b8", "u8", "s8", "pred"}
_RELATIONS = {"lt", "le", "gt", "ge", "eq", "ne", "ltu", "leu", "gtu", "geu", "equ", "neu", "num", "nan"}
# Every modifier the interpreter models, per opcode; anything else is refused when the PTX is parsed.
_MODIFIERS: dict[str, set[str]] = {
    "add": {"rn", "ftz"},
    "sub": {"rn", "ftz"},
    "mul": {"rn", "ftz", "lo", "hi", "wide"},
    "mad": {"lo", "hi", "wide"},
    "fma": {"rn", "ftz"},
    "div": {"rn"},
    "rem": set(),
    "max": {"ftz"},
    "min": {"ftz"},
    "and": set(),
    "or": set(),
    "xor": set(),
    "not": set(),
    "shl": set(),
    "shr": set(),
    "abs": {"ftz"},
    "ex2": {"approx", "ftz"},
    "rcp": {"approx", "rn", "ftz"},
    "rsqrt": {"approx", "ftz"},
    "setp": _RELATIONS | {"ftz"},
    "selp": set(),
    "mov": set(),
    "cvt": {"rn", "rz", "satfinite", "bf16", "bf16x2", "e4m3x2"},
    "shfl": {"sync", "bfly", "idx", "up", "down"},
    "ld": {"global", "shared", "param", "v2", "v4", "nc"},
    "st": {"global", "shared", "v2", "v4"},
    "bra": {"uni"},
    "ret": set(),
    "exit": set(),
    "bar": {"sync"},
}
_FLOAT_ROUNDED = {"add", "sub", "mul", "fma", "div"}  # fp32 forms that round: only to nearest even is modelled


def _split_operands(text: str) -> tuple[str, ...]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return tuple(parts)


def _check_modifiers(number: int, opcode: str, operands: tuple[str, ...]) -> None:
    """Refuse an opcode or modifier the interpreter does not model (never run it approximately)."""
    op, *parts = opcode.split(".")
    if op not in _MODIFIERS:
        raise PtxError(f"line {number}: opcode {opcode} is not supported")
    unknown = [p for p in parts if p not in _MODIFIERS[op] and p not in _TYPE_NAMES]
    if unknown:
        raise PtxError(f"line {number}: {opcode}: modifier .{'.'.join(unknown)} is not modelled")
    if op == "fma" and "rn" not in parts:
        raise PtxError(f"line {number}: {opcode}: only fma.rn is modelled")
    if op in ("ex2", "rsqrt") and "approx" not in parts:
        raise PtxError(f"line {number}: {opcode}: only the .approx form is modelled")
    if op == "mad" and "hi" in parts:
        raise PtxError(f"line {number}: {opcode}: mad.hi is not modelled")
    if op == "bar" and len(operands) != 1:
        raise PtxError(f"line {number}: {opcode}: a barrier with a thread count is not modelled")
    if op == "shfl" and ("sync" not in parts or len(operands) != 5):
        raise PtxError(f"line {number}: {opcode}: only shfl.sync with a member mask is modelled")
    if op == "cvt" and not _conversion_modelled(parts):
        raise PtxError(f"line {number}: {opcode}: this conversion is not modelled")


_INTEGERS = {"s64", "u64", "s32", "u32"}


def _conversion_modelled(parts: list[str]) -> bool:
    """The conversions :meth:`_Warp.convert` runs, checked when the PTX is parsed, not when one is reached."""
    if len(parts) < 2:
        return False
    destination, source, modes = parts[-2], parts[-1], set(parts[:-2])
    return (
        (destination in ("bf16x2", "bf16") and source == "f32" and modes in ({"rn"}, {"rz"}))
        or (destination == "e4m3x2" and source == "f32" and modes == {"rn", "satfinite"})
        or (destination == "f32" and source == "bf16" and not modes)
        or (destination in _INTEGERS and source in _INTEGERS and not modes)
    )


class Kernel:
    """One parsed ``.entry``: parameters, shared variables, instructions and labels."""

    def __init__(self, ptx: str) -> None:
        self.approximate = "exact"  # how the approximate instructions answer in the run under way
        match = _ENTRY.search(ptx)
        if match is None:
            raise PtxError("no .entry in the PTX")
        self.name = match.group(1)
        self.params = re.findall(r"\.param \.(\w+)(?: \.ptr \.global \.align \d+)? (\w+)", match.group(2))
        body = ptx[match.end() :]
        threads = re.search(r"\.reqntid (\d+)", body[: body.index("{")])
        self.threads = int(threads.group(1)) if threads else None
        self.shared: dict[str, int] = {}
        self.shared_bytes = 0
        self.instructions: list[Instruction] = []
        self.labels: dict[str, int] = {}
        for number, raw in enumerate(body[body.index("{") + 1 :].splitlines()):
            line = raw.split("//", 1)[0].strip()
            if not line or line in ("{", "}") or line.startswith(".reg"):
                continue
            shared = _SHARED.match(line)
            if shared:
                align, name, size = int(shared.group(1)), shared.group(2), int(shared.group(3))
                self.shared_bytes = -(-self.shared_bytes // align) * align
                self.shared[name] = self.shared_bytes
                self.shared_bytes += size
                continue
            if line.endswith(":"):
                self.labels[line[:-1]] = len(self.instructions)
                continue
            instruction = _parse(number, line)
            _check_modifiers(number, instruction.opcode, instruction.operands)
            self.instructions.append(instruction)

    def run(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        arguments,
        memory: Memory,
        *,
        schedule: str = "in order",
        stats: LaunchStats | None = None,
        approximate: str = "exact",
    ) -> LaunchStats:
        """Execute the launch, the warps of each CTA interleaved by ``schedule``; return what it did.

        ``approximate``: the approximate instructions' results correctly rounded (``exact``), or off by the
        largest error the PTX ISA allows, toward zero (``low``) or away from it (``high``), as a GPU may be.
        """
        if approximate not in APPROXIMATIONS:
            raise ValueError(f"approximate must be one of {APPROXIMATIONS}")
        self.approximate = approximate
        if grid[1:] != (1, 1) or block[1:] != (1, 1):
            raise PtxError("only 1-D launches are supported")
        if self.threads is not None and block[0] != self.threads:
            raise PtxError(f"the kernel requires {self.threads} threads a CTA, the launch has {block[0]}")
        if len(arguments) != len(self.params):
            raise PtxError(f"{len(arguments)} arguments for {len(self.params)} parameters")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}")
        stats = stats if stats is not None else LaunchStats()
        params = {name: (kind, value) for (kind, name), value in zip(self.params, arguments, strict=True)}
        fine = schedule == "round robin"
        for cta in range(grid[0]):
            shared = Shared(self.shared_bytes)
            written = memory.written
            warps = [
                _Warp(self, params, memory, shared, stats, cta=cta, ctas=grid[0], threads=block[0], warp=w)
                for w in range(-(-block[0] // LANES))
            ]
            _run_cta([w.run(fine) for w in warps], shared, schedule)
            stats.ctas += 1
            stats.working_ctas += memory.written > written
            stats.warps += len(warps)
            stats.working_warps += sum(w.stored for w in warps)
            stats.warp_in_flight = max(stats.warp_in_flight, *(w.most_in_flight for w in warps))
            stats.cta_in_flight = max(stats.cta_in_flight, sum(w.most_in_flight for w in warps))
        return stats


def _parse(number: int, line: str) -> Instruction:
    guard = None
    if line.startswith("@"):
        guard, line = line[1:].split(None, 1)
    line = line.rstrip(";").strip()
    opcode, _, rest = line.partition(" ")
    return Instruction(number, guard, opcode.strip(), _split_operands(rest.strip()))


def _run_cta(warps: list[Iterator[bool]], shared: Shared, schedule: str) -> None:
    """Run the warps of a CTA between barriers in ``schedule``'s order, releasing them together
    at each barrier (a warp's iterator yields True at a barrier, False after an instruction)."""
    live = list(warps)
    while live:
        arrived: list[Iterator[bool]] = []
        if schedule == "round robin":
            pending = list(live)
            while pending:
                still = []
                for warp in pending:
                    at_barrier = next(warp, None)
                    if at_barrier is None:
                        continue
                    (arrived if at_barrier else still).append(warp)
                pending = still
        else:
            for warp in live if schedule == "in order" else live[::-1]:
                at_barrier = next(warp, None)
                while at_barrier is False:
                    at_barrier = next(warp, None)
                if at_barrier:
                    arrived.append(warp)
        live = [w for w in live if any(w is a for a in arrived)]  # the CTA's own order
        shared.barrier()


# ----------------------------------------------------------------------------- execution

_TYPES = {
    "f32": np.float32,
    "s32": np.int32,
    "u32": np.uint32,
    "b32": np.uint32,
    "s64": np.int64,
    "u64": np.uint64,
    "b64": np.uint64,
    "b16": np.uint16,
    "u16": np.uint16,
    "s16": np.int16,
    "b8": np.uint8,
    "u8": np.uint8,
    "s8": np.int8,
}
_ORIGIN_OPS = {"add", "sub", "mad", "mov", "selp"}  # address arithmetic: the result keeps its pointer's origin


def _as(bits: np.ndarray, kind: str) -> np.ndarray:
    """Register bits (uint64) as values of a PTX type."""
    dtype = np.dtype(_TYPES[kind])
    if dtype.itemsize == 8:
        return bits.view(dtype)
    return bits.astype(np.dtype(f"u{dtype.itemsize}")).view(dtype)


def _bits(values: np.ndarray) -> np.ndarray:
    """Values of any type back to register bits (zero-extended)."""
    values = np.asarray(values)
    unsigned = values.view(np.dtype(f"u{values.dtype.itemsize}")) if values.dtype.kind != "b" else values
    return unsigned.astype(np.uint64)


def _f32_bits(values: np.ndarray) -> np.ndarray:
    return _bits(np.asarray(values, dtype=np.float32))


def _flush(values: np.ndarray) -> np.ndarray:
    """``.ftz``: fp32 subnormals become zero of the same sign."""
    values = np.asarray(values, dtype=np.float32)
    tiny = np.abs(values) < np.finfo(np.float32).tiny
    return np.where(tiny & np.isfinite(values), np.copysign(np.float32(0), values), values)


def _bf16_round(f32: np.ndarray, mode: str = "rn") -> np.ndarray:
    """fp32 to bf16 bits, to nearest even (``rn``) or toward zero (``rz``); NaN kept a NaN."""
    bits = f32.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 if mode == "rn" else bits >> 16
    return np.where(np.isnan(f32), 0x7FC0, rounded & 0xFFFF).astype(np.uint64)


def _e4m3(f32: np.ndarray) -> np.ndarray:
    """fp32 to e4m3 bytes, round to nearest even, saturating to +-448 (``.satfinite``)."""
    clamped = np.where(np.isnan(f32), f32, np.clip(f32, -448.0, 448.0))
    return torch.from_numpy(clamped.astype(np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a * b + c`` rounded once to fp32 (nearest even).  The product is exact in fp64; the sum
    is taken exactly as ``s + e`` (TwoSum) and ``s`` is moved to the odd neighbour toward ``e``
    when inexact (rounding to odd), after which one rounding to fp32 is correct."""
    a, b, c = (np.asarray(x, dtype=np.float32).astype(np.float64) for x in (a, b, c))
    with np.errstate(all="ignore"):
        product = a * b
        s = product + c
        back = s - product
        e = (product - (s - back)) + (c - back)
        odd = (s.view(np.uint64) & np.uint64(1)).astype(bool)
        inexact = np.isfinite(s) & (e != 0) & ~odd
        nudged = np.nextafter(s, np.where(e > 0, np.inf, -np.inf))
        return np.where(inexact, nudged, s).astype(np.float32)


class _Warp:
    def __init__(self, kernel: Kernel, params, memory, shared, stats, *, cta, ctas, threads, warp) -> None:
        self.kernel, self.params, self.memory, self.shared, self.stats = kernel, params, memory, shared, stats
        self.warp, self.cta = warp, cta
        self.registers: dict[str, np.ndarray] = {}
        self.origins: dict[str, np.ndarray] = {}  # per register and lane: the buffer its pointer came from
        lanes = np.arange(LANES)
        self.special = {
            "%laneid": lanes.astype(np.uint64),
            "%tid.x": (warp * LANES + lanes).astype(np.uint64),
            "%ctaid.x": np.full(LANES, cta, dtype=np.uint64),
            "%nctaid.x": np.full(LANES, ctas, dtype=np.uint64),
            "%ntid.x": np.full(LANES, threads, dtype=np.uint64),
        }
        self.alive = warp * LANES + lanes < threads
        self.pc = np.zeros(LANES, dtype=np.int64)
        self.stored = False
        self.in_flight: dict[str, int] = {}  # per register a global load wrote and nothing read yet: its bytes
        self.most_in_flight = 0

    # --- operands

    def value(self, operand: str) -> np.ndarray:
        """An operand's bits for every lane."""
        self.in_flight.pop(operand, None)  # a use waits for the load that wrote it
        if operand in self.registers:
            return self.registers[operand]
        if operand in self.special:
            return self.special[operand]
        if operand.startswith("%"):  # never written: undefined on the GPU, all ones here (a NaN as fp32)
            return np.full(LANES, 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)
        if operand in self.kernel.shared:
            return np.full(LANES, self.kernel.shared[operand], dtype=np.uint64)
        if operand[:2] in ("0f", "0F"):
            return np.full(LANES, int(operand[2:], 16), dtype=np.uint64)
        number = int(operand, 0)
        return np.full(LANES, number & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)

    def origin(self, operand: str) -> np.ndarray:
        return self.origins.get(operand, np.full(LANES, _NO_ORIGIN, dtype=np.int64))

    def write(self, operand: str, bits: np.ndarray, mask: np.ndarray, origin: np.ndarray | None = None) -> None:
        self.in_flight.pop(operand, None)  # overwritten: whatever a load put there is no longer awaited
        old = self.registers.get(operand, np.full(LANES, 0xFFFFFFFFFFFFFFFF, dtype=np.uint64))
        self.registers[operand] = np.where(mask, np.asarray(bits, dtype=np.uint64), old)
        if origin is not None or operand in self.origins:
            new = origin if origin is not None else np.full(LANES, _NO_ORIGIN, dtype=np.int64)
            self.origins[operand] = np.where(mask, new, self.origin(operand))

    def address(self, operand: str) -> tuple[np.ndarray, np.ndarray]:
        """The lanes' addresses and the buffers their base register points into."""
        inner = operand.strip("[]")
        base, _, offset = inner.partition("+")
        addresses = self.value(base) + np.uint64(int(offset or "0", 0) % 2**64)  # wraps, as addresses do
        return addresses, self.origin(base)

    def carried_origin(self, op: str, operands: tuple[str, ...]) -> np.ndarray | None:
        """Address arithmetic keeps the origin of its one pointer operand (two pointers: none)."""
        if op not in _ORIGIN_OPS:
            return None
        if op == "mov":
            result = self.origin(operands[1])
        elif op == "mad":  # a * b + c: the pointer is the addend
            result = self.origin(operands[3])
        elif op == "selp":
            result = np.where(self.value(operands[3]).astype(bool), *(self.origin(x) for x in operands[1:3]))
        else:
            a, b = (self.origin(x) for x in operands[1:3])
            result = np.where((a >= 0) & (b < 0), a, np.where((b >= 0) & (a < 0), b, _NO_ORIGIN))
        return None if (result < 0).all() else result

    # --- the loop

    def run(self, fine: bool) -> Iterator[bool]:
        """Step the warp; yield True at each barrier, and False after every instruction when ``fine``."""
        code, labels = self.kernel.instructions, self.kernel.labels
        while self.alive.any():
            current = int(self.pc[self.alive].min())
            if current >= len(code):
                raise PtxError("ran past the end of the kernel")
            active = self.alive & (self.pc == current)
            instruction = code[current]
            mask = active.copy()
            if instruction.guard is not None:
                negate = instruction.guard.startswith("!")
                predicate = self.value(instruction.guard.lstrip("!")).astype(bool)
                mask &= ~predicate if negate else predicate
            base = instruction.opcode.split(".")[0]
            if base == "bra":
                self.pc[mask] = labels[instruction.operands[0]]
                self.pc[active & ~mask] = current + 1
                continue
            if base in ("ret", "exit"):
                self.alive &= ~mask
                self.pc[active & ~mask] = current + 1
                continue
            if base == "bar":
                if (self.alive & ~active).any():
                    raise PtxError(f"line {instruction.line}: a barrier reached by part of a warp")
                self.pc[active] = current + 1
                yield True
                continue
            try:
                self.execute(instruction, mask)
            except PtxError as error:
                raise PtxError(f"line {instruction.line} ({instruction.opcode}): {error}") from None
            self.pc[active] = current + 1
            if fine:
                yield False

    def execute(self, ins: Instruction, mask: np.ndarray) -> None:  # noqa: PLR0912 - one branch per opcode
        parts = ins.opcode.split(".")
        op, kind = parts[0], parts[-1]
        o = ins.operands
        if op == "shfl":
            self.shuffle(parts, o, mask)
            return
        if not mask.any():
            return
        if op == "ld":
            self.load(parts, o, mask, ins.line)
        elif op == "st":
            self.store(parts, o, mask, ins.line)
        elif op == "mov":
            self.move(kind, o, mask)
        elif op in ("add", "sub", "mul", "mad", "fma", "div", "rem", "max", "min"):
            self.arithmetic(op, parts, kind, o, mask)
        elif op in ("and", "or", "xor", "not"):
            self.logic(op, kind, o, mask)
        elif op in ("shl", "shr"):
            self.shift(op, kind, o, mask)
        elif op == "abs":
            if kind != "f32":
                raise PtxError(f"abs.{kind} is not modelled")
            self.write(o[0], _f32_bits(self.float_result(np.abs(self.float_operand(o[1], parts)), parts)), mask)
        elif op in ("ex2", "rcp", "rsqrt"):
            x = self.float_operand(o[1], parts).astype(np.float64)
            with np.errstate(all="ignore"):
                result = {"ex2": np.exp2, "rcp": lambda v: 1.0 / v, "rsqrt": lambda v: 1.0 / np.sqrt(v)}[op](x)
            rounded = self.float_result(result, parts)
            if "approx" in parts:
                rounded = self.float_result(_approximated(op, rounded, self.kernel.approximate), parts)
            self.write(o[0], _f32_bits(rounded), mask)
        elif op == "setp":
            a, b = self.value(o[1]), self.value(o[2])
            if kind == "f32" and "ftz" in parts:  # subnormal operands compare as zeros of their sign
                a, b = (_bits(self.float_operand(x, parts)).astype(np.uint64) for x in o[1:3])
            self.write(o[0], _compare(parts[1], kind, a, b).astype(np.uint64), mask)
        elif op == "selp":
            chosen = np.where(self.value(o[3]).astype(bool), self.value(o[1]), self.value(o[2]))
            self.write(o[0], chosen & _mask_of(kind), mask, self.carried_origin(op, o))
        elif op == "cvt":
            self.convert(parts, o, mask)

    def move(self, kind, o, mask) -> None:
        if o[0].startswith("{"):  # unpack a b32 into two b16, low half first
            low, high = (x.strip() for x in o[0].strip("{}").split(","))
            source = self.value(o[1])
            self.write(low, source & 0xFFFF, mask)
            self.write(high, (source >> 16) & 0xFFFF, mask)
        elif o[1].startswith("{"):  # pack two b16 (or two b32), low half first
            pieces = [x.strip() for x in o[1].strip("{}").split(",")]
            width = 16 if kind == "b32" else 32
            packed = self.value(pieces[0]) | (self.value(pieces[1]) << np.uint64(width))
            self.write(o[0], packed, mask)
        else:
            self.write(o[0], self.value(o[1]) & _mask_of(kind), mask, self.carried_origin("mov", o))

    def logic(self, op, kind, o, mask) -> None:
        if kind == "pred":
            a = self.value(o[1]).astype(bool)
            b = self.value(o[2]).astype(bool) if op != "not" else None
            result = {"and": lambda: a & b, "or": lambda: a | b, "xor": lambda: a ^ b, "not": lambda: ~a}[op]()
            self.write(o[0], result.astype(np.uint64), mask)
            return
        a = self.value(o[1])
        if op == "not":
            result = ~a
        else:
            b = self.value(o[2])
            result = {"and": a & b, "or": a | b, "xor": a ^ b}[op]
        self.write(o[0], result & _mask_of(kind), mask)

    def shift(self, op, kind, o, mask) -> None:
        a, amount = _as(self.value(o[1]), kind), _as(self.value(o[2]), "u32").astype(np.uint64)
        width = np.dtype(_TYPES[kind]).itemsize * 8
        amount = np.minimum(amount, width)
        if op == "shl":
            result = _bits(a).astype(np.uint64) << amount
            result = np.where(amount >= width, 0, result)
        elif kind.startswith("s"):
            result = _bits((a.astype(np.int64) >> np.minimum(amount, width - 1).astype(np.int64)).astype(a.dtype))
        else:
            result = np.where(amount >= width, 0, _bits(a) >> amount)
        self.write(o[0], result & _mask_of(kind), mask)

    def float_operand(self, operand: str, parts) -> np.ndarray:
        value = _as(self.value(operand), "f32")
        return _flush(value) if "ftz" in parts else value

    def float_result(self, value: np.ndarray, parts) -> np.ndarray:
        with np.errstate(over="ignore"):  # fp32 overflow is inf, as on the GPU
            value = np.asarray(value).astype(np.float32)
        return _flush(value) if "ftz" in parts else value

    def arithmetic(self, op, parts, kind, o, mask) -> None:
        if kind == "f32":
            a, b = (self.float_operand(x, parts) for x in o[1:3])
            if op == "fma":
                result = fma_f32(a, b, self.float_operand(o[3], parts))
            elif op in ("max", "min"):
                result = (np.fmax if op == "max" else np.fmin)(a, b)
            else:  # one operation in fp64, then one rounding to fp32: correctly rounded (53 >= 2 * 24 + 2)
                a, b = a.astype(np.float64), b.astype(np.float64)
                with np.errstate(all="ignore"):
                    result = {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[op]
            self.write(o[0], _f32_bits(self.float_result(result, parts)), mask)
            return
        if op == "fma":
            raise PtxError(f"fma.{kind} is not modelled")
        wide, high = "wide" in parts, "hi" in parts
        a, b = (_as(self.value(x), kind).astype(object) for x in o[1:3])
        width = np.dtype(_TYPES[kind]).itemsize * 8
        if op in ("div", "rem"):
            b = np.where(mask, b, 1)
            if (b == 0).any():
                raise PtxError("integer division by zero")
            quotient = np.array([_trunc_div(x, y) for x, y in zip(a, b, strict=True)], dtype=object)
            result = quotient if op == "div" else a - quotient * b
        elif op in ("max", "min"):
            result = np.where((a > b) == (op == "max"), a, b)
        elif op in ("mul", "mad"):
            result = a * b
            if high:  # the high half of the 2n-bit product
                result = np.array([int(v) >> width for v in result], dtype=object)
            if op == "mad":
                result = result + _as(self.value(o[3]), _wide_kind(kind) if wide else kind).astype(object)
        else:
            result = a + b if op == "add" else a - b
        width *= 2 if wide else 1
        bits = np.array([int(v) & ((1 << width) - 1) for v in result], dtype=np.uint64)
        self.write(o[0], bits, mask, self.carried_origin(op, o))

    def convert(self, parts, o, mask) -> None:
        destination, source = parts[-2], parts[-1]
        modes = set(parts[1:-2])
        value = self.value(o[1])
        if destination in ("bf16x2", "bf16") and source == "f32" and modes in ({"rn"}, {"rz"}):
            mode = modes.pop()
            if destination == "bf16x2":
                high, low = (_bf16_round(_as(self.value(x), "f32"), mode) for x in o[1:3])
                self.write(o[0], (high << np.uint64(16)) | low, mask)
            else:
                self.write(o[0], _bf16_round(_as(value, "f32"), mode), mask)
        elif destination == "e4m3x2" and source == "f32" and modes == {"rn", "satfinite"}:
            high, low = (_e4m3(_as(self.value(x), "f32")).astype(np.uint64) for x in o[1:3])
            self.write(o[0], (high << np.uint64(8)) | low, mask)
        elif destination == "f32" and source == "bf16" and not modes:
            self.write(o[0], (value & 0xFFFF) << np.uint64(16), mask)
        elif destination in ("s64", "u64", "s32", "u32") and source in ("s64", "u64", "s32", "u32") and not modes:
            converted = _as(value, source).astype(_TYPES[destination])
            self.write(o[0], _bits(converted), mask)
        else:
            raise PtxError(f"{'.'.join(parts)} is not modelled")

    def shuffle(self, parts, o, mask) -> None:
        """``shfl.sync.mode.b32 d, a, b, c, membermask`` as PTX defines it: ``c`` packs the clamp
        value (bits 0-4) and the segment mask (bits 8-12); a source lane out of range reads the
        lane itself.  Every executing lane must be in the member mask, every member must execute
        it, and no lane may read an exited lane."""
        if "|" in o[0]:
            raise PtxError("the shuffle's predicate output is not modelled")
        if not mask.any():
            return
        member_bits = self.value(o[4]) & _U32
        if (member_bits[mask] != member_bits[mask][0]).any():
            raise PtxError("lanes executing a shuffle disagree on its member mask")
        lanes = np.arange(LANES)
        members = ((int(member_bits[mask][0]) >> lanes) & 1).astype(bool)
        if (mask & ~members).any():
            raise PtxError("a lane outside the member mask executes the shuffle")
        if (members & ~mask).any():
            raise PtxError("a lane of the member mask does not execute the shuffle (it exited or diverged)")
        mode = parts[2]
        b = (self.value(o[2]).astype(np.int64)) & 31
        c = self.value(o[3]).astype(np.int64)
        clamp, segment = c & 31, (c >> 8) & 31
        max_lane = (lanes & segment) | (clamp & ~segment)
        min_lane = lanes & segment
        if mode == "up":
            j = lanes - b
            valid = j >= max_lane
        elif mode == "down":
            j = lanes + b
            valid = j <= max_lane
        elif mode == "bfly":
            j = lanes ^ b
            valid = j <= max_lane
        else:  # idx
            j = min_lane | (b & ~segment)
            valid = j <= max_lane
        j = np.where(valid, j, lanes)
        if (~members[j] & mask).any():
            raise PtxError("a shuffle read a lane outside its member mask")
        source = self.value(o[1])
        self.write(o[0], source[j], mask)

    def load(self, parts, o, mask, line) -> None:
        space = parts[1]
        if space == "param":
            kind, value = self.kernel_param(o[1])
            raw = np.float32(value).view(np.uint32) if kind == "f32" else int(value) & (2**64 - 1)
            bits = np.uint64(raw)
            origin = self.memory.origin_of(int(value)) if kind in ("u64", "b64", "s64") else _NO_ORIGIN
            self.write(o[0], np.full(LANES, bits, dtype=np.uint64), mask, np.full(LANES, origin, dtype=np.int64))
            return
        vector = int(parts[2][1:]) if parts[2].startswith("v") else 1
        kind = parts[-1]
        size = np.dtype(_TYPES[kind]).itemsize
        targets = [x.strip() for x in o[0].strip("{}").split(",")]
        addresses, origins = self.address(o[1])
        addresses, origins = addresses[mask], origins[mask]
        if (addresses % (size * vector)).any():
            raise PtxError(f"misaligned {size * vector}-byte {space} load")
        self.record(line, space, "ld", addresses, size * vector)
        if space == "global":
            data = self.memory.read(addresses, origins, size * vector, self.cta)
        else:
            data = self.shared.read(self.warp, addresses, size * vector)
        for i, target in enumerate(targets):
            element = data[:, i * size : (i + 1) * size].copy().view(_TYPES[kind]).reshape(-1)
            full = np.zeros(LANES, dtype=np.uint64)
            full[mask] = _bits(element.astype(np.int64)) if kind.startswith("s") else _bits(element)
            self.write(target, full, mask)
            if space == "global":
                self.in_flight[target] = size * addresses.size
        self.most_in_flight = max(self.most_in_flight, sum(self.in_flight.values()))

    def store(self, parts, o, mask, line) -> None:
        space = parts[1]
        vector = int(parts[2][1:]) if parts[2].startswith("v") else 1
        kind = parts[-1]
        size = np.dtype(_TYPES[kind]).itemsize
        sources = [x.strip() for x in o[1].strip("{}").split(",")]
        addresses, origins = self.address(o[0])
        addresses, origins = addresses[mask], origins[mask]
        if (addresses % (size * vector)).any():
            raise PtxError(f"misaligned {size * vector}-byte {space} store")
        values = np.stack([self.value(s)[mask] & _mask_of(kind) for s in sources], axis=1)
        rows = values.astype(_TYPES[kind] if not kind.startswith("s") else np.dtype(f"u{size}")).view(np.uint8)
        rows = rows.reshape(addresses.size, size * vector)
        self.record(line, space, "st", addresses, size * vector)
        self.stored = True
        if space == "global":
            self.memory.write(addresses, origins, rows, self.cta)
        else:
            self.shared.write(self.warp, addresses, rows)

    def record(self, line: int, space: str, kind: str, addresses: np.ndarray, size: int) -> None:
        """Count one warp-wide access: distinct bytes, one contiguous range or not, bank conflicts."""
        entry = self.stats.accesses.setdefault(line, AccessStats(space, kind, size))
        starts = np.unique(addresses.astype(np.int64))
        entry.executed += 1
        entry.bytes += _distinct_bytes(starts, size)
        entry.contiguous += bool((np.diff(starts) <= size).all())
        if space == "shared":
            entry.worst_conflict = max(entry.worst_conflict, bank_conflict(addresses, size))

    def kernel_param(self, operand: str):
        name = operand.strip("[]")
        if name not in self.params:
            raise PtxError(f"unknown parameter {name}")
        return self.params[name]


_U32 = np.uint64(0xFFFFFFFF)


def _distinct_bytes(starts: np.ndarray, size: int) -> int:
    if starts.size == 0:
        return 0
    gaps = np.minimum(np.diff(starts), size)
    return int(gaps.sum()) + size


def bank_conflict(addresses: np.ndarray, size: int) -> int:
    """The most distinct 4-byte words one bank serves in one phase of a warp's shared access
    (1: conflict-free).  A 4-byte access is one phase of 32 lanes, 8 bytes two of 16, 16 bytes
    four of 8 (lanes in order); lanes reading the same word share it (a broadcast)."""
    lanes_per_phase = LANES * 4 // max(size, 4)
    worst = 1
    for start in range(0, addresses.size, lanes_per_phase):
        phase = addresses[start : start + lanes_per_phase].astype(np.int64)
        words = np.unique((phase[:, None] + np.arange(0, max(size, 4), 4)).reshape(-1) // 4)
        worst = max(worst, int(np.bincount(words % BANKS).max()))
    return worst


def _mask_of(kind: str) -> np.uint64:
    if kind == "pred":
        return np.uint64(1)
    width = np.dtype(_TYPES[kind]).itemsize * 8
    return np.uint64((1 << width) - 1)


def _wide_kind(kind: str) -> str:
    return {"s32": "s64", "u32": "u64"}[kind]


def _trunc_div(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b >= 0) else -quotient


def _compare(relation: str, kind: str, a_bits: np.ndarray, b_bits: np.ndarray) -> np.ndarray:
    """setp: on floats the plain relations are ordered (false with a NaN), the ``u`` ones unordered."""
    if kind.startswith("b"):
        kind = "u" + kind[1:]
    a, b = _as(a_bits, kind), _as(b_bits, kind)
    if kind == "f32":
        unordered = np.isnan(a) | np.isnan(b)
        if relation in ("num", "nan"):
            return ~unordered if relation == "num" else unordered
        base = relation[:-1] if relation.endswith("u") and relation != "u" else relation
        with np.errstate(invalid="ignore"):
            plain = _relation(base, a, b) & ~unordered
        return plain | unordered if relation.endswith("u") else plain
    if relation not in ("lt", "le", "gt", "ge", "eq", "ne"):
        raise PtxError(f"setp.{relation}.{kind} is not modelled")
    return _relation(relation, a, b)


def _relation(relation: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[relation]


def run_launch(
    ptx: str | Callable[[Any], str],
    launch,
    *,
    schedule: str = "in order",
    stats: LaunchStats | None = None,
    approximate: str = "exact",
) -> Memory:
    """Run a host-side launch plan (grid, block, packed arguments, the tensors it keeps alive) on
    the CPU through the PTX, after its device-side preparation (as a launch, or a CUDA graph's replay,
    runs it); return the memory, which counts the traffic per tensor over every stage.

    ``ptx``: the kernel's text, or, for a plan of several stages (``launch.stages()``), a function from a
    stage's ``config`` to its text.  Each stage is a launch of its own on one stream: what one stage wrote,
    the next reads without a race, and the CTAs within each stage are checked against one another."""
    if launch.prepare is not None:
        launch.prepare()
    stages = launch.stages()
    if isinstance(ptx, str) and len(stages) > 1:
        raise ValueError(f"a plan of {len(stages)} stages needs the PTX of each: pass a function of its config")
    memory = Memory(launch.keep_alive)
    for stage in stages:
        kernel = Kernel(ptx if isinstance(ptx, str) else ptx(stage.config))
        kernel.run(
            stage.grid, stage.block, stage.arguments, memory, schedule=schedule, stats=stats, approximate=approximate
        )
        memory.next_launch()
    return memory
