"""A small PTX interpreter: runs the shipped CuTe DSL kernels on the CPU, on real CPU tensors.

It executes the exact PTX text the GPU would load, with the arguments the real host code packs
(``plan_launch``), over memory that is the CPU tensors' own storage, so a wrong index, a wrong
byte order or a wrong layout in the compiled kernel shows up as wrong bytes in the output.  It
also refuses what the hardware would fault on: a global access outside every tensor, a
misaligned vector access, a shared access outside the CTA's allocation.

Scope: the instructions these kernels use (integer and fp32 arithmetic, compares and selects,
conversions to bf16 and packed e4m3, ``ex2``/``rcp``/``rsqrt``, vector loads and stores,
warp shuffles, one CTA barrier).  A warp runs in lockstep over numpy arrays of its 32 lanes; a
lane that branches away waits, and the warp always steps the lanes with the lowest program
counter, which reconverges structured control flow.  Approximate instructions are computed
exactly in fp32; ``fma`` rounds once.  Anything else raises :class:`PtxError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

LANES = 32
_U32 = np.uint64(0xFFFFFFFF)


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


class Memory:
    """Global memory: the storage of the given CPU tensors, at their real addresses."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.buffers = sorted(
            (Buffer(t.data_ptr(), t.detach().reshape(-1).view(torch.uint8).numpy()) for t in tensors if t.numel()),
            key=lambda b: b.base,
        )

    def locate(self, addresses: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Each address's buffer index and offset; a :class:`PtxError` for any access outside them."""
        index = np.full(addresses.shape, -1)
        offsets = np.zeros(addresses.shape, dtype=np.int64)
        for i, buffer in enumerate(self.buffers):
            inside = (addresses >= buffer.base) & (addresses + size <= buffer.base + buffer.data.size)
            index[inside] = i
            offsets[inside] = (addresses[inside] - buffer.base).astype(np.int64)
        if (index < 0).any():
            bad = int(addresses[index < 0][0])
            raise PtxError(f"global access of {size} bytes at {bad:#x} is outside every tensor")
        return index, offsets

    def read(self, addresses: np.ndarray, size: int) -> np.ndarray:
        """``[n, size]`` bytes."""
        index, offsets = self.locate(addresses, size)
        out = np.empty((addresses.size, size), dtype=np.uint8)
        for i, (b, o) in enumerate(zip(index, offsets, strict=True)):
            out[i] = self.buffers[b].data[o : o + size]
            self.buffers[b].read_bytes += size
        return out

    def write(self, addresses: np.ndarray, rows: np.ndarray) -> None:
        index, offsets = self.locate(addresses, rows.shape[1])
        for i, (b, o) in enumerate(zip(index, offsets, strict=True)):
            self.buffers[b].data[o : o + rows.shape[1]] = rows[i]
            self.buffers[b].written_bytes += rows.shape[1]

    def traffic(self, tensor: torch.Tensor) -> tuple[int, int]:
        """Bytes the kernel read from and wrote to ``tensor``'s storage, over every lane."""
        for buffer in self.buffers:
            if buffer.base == tensor.data_ptr():
                return buffer.read_bytes, buffer.written_bytes
        raise KeyError("not a tensor of this memory")


# ----------------------------------------------------------------------------- parsing

_ENTRY = re.compile(r"\.visible \.entry (\w+)\(([^)]*)\)", re.S)
_SHARED = re.compile(r"\.shared \.align (\d+) \.b8 (\w+)\[(\d+)\];")


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


class Kernel:
    """One parsed ``.entry``: parameters, shared variables, instructions and labels."""

    def __init__(self, ptx: str) -> None:
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
            self.instructions.append(_parse(number, line))

    def run(self, grid: tuple[int, int, int], block: tuple[int, int, int], arguments, memory: Memory) -> int:
        """Execute the launch; return how many instructions the warps stepped."""
        if grid[1:] != (1, 1) or block[1:] != (1, 1):
            raise PtxError("only 1-D launches are supported")
        if self.threads is not None and block[0] != self.threads:
            raise PtxError(f"the kernel requires {self.threads} threads a CTA, the launch has {block[0]}")
        if len(arguments) != len(self.params):
            raise PtxError(f"{len(arguments)} arguments for {len(self.params)} parameters")
        params = {name: (kind, value) for (kind, name), value in zip(self.params, arguments, strict=True)}
        steps = 0
        for cta in range(grid[0]):
            shared = np.zeros(self.shared_bytes, dtype=np.uint8)
            warps = [
                _Warp(self, params, memory, shared, cta=cta, ctas=grid[0], threads=block[0], warp=w).run()
                for w in range(-(-block[0] // LANES))
            ]
            steps += _run_cta(warps)
        return steps


def _parse(number: int, line: str) -> Instruction:
    guard = None
    if line.startswith("@"):
        guard, line = line[1:].split(None, 1)
    line = line.rstrip(";").strip()
    opcode, _, rest = line.partition(" ")
    return Instruction(number, guard, opcode.strip(), _split_operands(rest.strip()))


def _run_cta(warps: list[Iterator[int]]) -> int:
    """Run the warps of a CTA, releasing them together at each barrier."""
    steps, live = 0, list(warps)
    while live:
        waiting = []
        for warp in live:
            try:
                steps += next(warp)  # runs to the next barrier, or to its end
                waiting.append(warp)
            except StopIteration as done:
                steps += done.value or 0
        live = waiting
    return steps


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


def _bf16_round(f32: np.ndarray) -> np.ndarray:
    """fp32 to bf16 bits, round to nearest even (NaN kept a NaN)."""
    bits = f32.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(np.isnan(f32), 0x7FC0, rounded & 0xFFFF).astype(np.uint64)


def _e4m3(f32: np.ndarray) -> np.ndarray:
    """fp32 to e4m3 bytes, round to nearest even, saturating to +-448 (``.satfinite``)."""
    clamped = np.where(np.isnan(f32), f32, np.clip(f32, -448.0, 448.0))
    return torch.from_numpy(clamped.astype(np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


class _Warp:
    def __init__(self, kernel: Kernel, params, memory, shared, *, cta, ctas, threads, warp) -> None:
        self.kernel, self.params, self.memory, self.shared = kernel, params, memory, shared
        self.registers: dict[str, np.ndarray] = {}
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

    # --- operands

    def value(self, operand: str) -> np.ndarray:
        """An operand's bits for every lane."""
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

    def write(self, operand: str, bits: np.ndarray, mask: np.ndarray) -> None:
        old = self.registers.get(operand, np.full(LANES, 0xFFFFFFFFFFFFFFFF, dtype=np.uint64))
        self.registers[operand] = np.where(mask, np.asarray(bits, dtype=np.uint64), old)

    def address(self, operand: str) -> np.ndarray:
        inner = operand.strip("[]")
        base, _, offset = inner.partition("+")
        return self.value(base) + np.uint64(int(offset or "0", 0) % 2**64)  # wraps, as addresses do

    # --- the loop

    def run(self) -> Iterator[int]:
        code, labels = self.kernel.instructions, self.kernel.labels
        steps = 0
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
            steps += 1
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
                yield steps
                steps = 0
                self.pc[active] = current + 1
                continue
            try:
                self.execute(instruction, mask)
            except PtxError as error:
                raise PtxError(f"line {instruction.line} ({instruction.opcode}): {error}") from None
            self.pc[active] = current + 1
        return steps

    def execute(self, ins: Instruction, mask: np.ndarray) -> None:  # noqa: PLR0912, PLR0915 - one branch per opcode
        parts = ins.opcode.split(".")
        op, kind = parts[0], parts[-1]
        o = ins.operands
        if not mask.any() and op not in ("shfl",):
            return
        if op == "ld":
            self.load(parts, o, mask)
        elif op == "st":
            self.store(parts, o, mask)
        elif op == "mov":
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
                self.write(o[0], self.value(o[1]) & _mask_of(kind), mask)
        elif op in ("add", "sub", "mul", "mad", "fma", "div", "rem", "max", "min"):
            self.arithmetic(op, parts, kind, o, mask)
        elif op in ("and", "or", "xor", "not"):
            if kind == "pred":
                a = self.value(o[1]).astype(bool)
                b = self.value(o[2]).astype(bool) if op != "not" else None
                result = {"and": lambda: a & b, "or": lambda: a | b, "xor": lambda: a ^ b, "not": lambda: ~a}[op]()
                self.write(o[0], result.astype(np.uint64), mask)
            else:
                a = self.value(o[1])
                if op == "not":
                    result = ~a
                else:
                    b = self.value(o[2])
                    result = {"and": a & b, "or": a | b, "xor": a ^ b}[op]
                self.write(o[0], result & _mask_of(kind), mask)
        elif op in ("shl", "shr"):
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
        elif op == "abs":
            self.write(o[0], _f32_bits(np.abs(_as(self.value(o[1]), "f32"))), mask)
        elif op in ("ex2", "rcp", "rsqrt"):
            x = _as(self.value(o[1]), "f32").astype(np.float64)
            with np.errstate(all="ignore"):
                result = {"ex2": np.exp2, "rcp": lambda v: 1.0 / v, "rsqrt": lambda v: 1.0 / np.sqrt(v)}[op](x)
            self.write(o[0], _f32_bits(result.astype(np.float32)), mask)
        elif op == "setp":
            self.write(o[0], _compare(parts[1], kind, self.value(o[1]), self.value(o[2])).astype(np.uint64), mask)
        elif op == "selp":
            chosen = np.where(self.value(o[3]).astype(bool), self.value(o[1]), self.value(o[2]))
            self.write(o[0], chosen & _mask_of(kind), mask)
        elif op == "cvt":
            self.convert(parts, o, mask)
        elif op == "shfl":
            self.shuffle(parts, o, mask)
        else:
            raise PtxError(f"opcode {ins.opcode} is not supported")

    def arithmetic(self, op, parts, kind, o, mask) -> None:
        if kind == "f32":
            a, b = (_as(self.value(x), "f32").astype(np.float64) for x in o[1:3])
            if op == "fma":
                result = a * b + _as(self.value(o[3]), "f32").astype(np.float64)  # a*b is exact in fp64
            elif op in ("max", "min"):
                pick = np.fmax if op == "max" else np.fmin
                result = pick(a, b)
            else:
                with np.errstate(all="ignore"):
                    result = {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[op]
            with np.errstate(over="ignore"):  # fp32 overflow is inf, as on the GPU
                self.write(o[0], _f32_bits(result.astype(np.float32)), mask)
            return
        wide = "wide" in parts
        a, b = (_as(self.value(x), kind).astype(object) for x in o[1:3])
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
            if op == "mad":
                result = result + _as(self.value(o[3]), _wide_kind(kind) if wide else kind).astype(object)
        else:
            result = a + b if op == "add" else a - b
        width = np.dtype(_TYPES[kind]).itemsize * 8 * (2 if wide else 1)
        self.write(o[0], np.array([int(v) & ((1 << width) - 1) for v in result], dtype=np.uint64), mask)

    def convert(self, parts, o, mask) -> None:
        destination, source = parts[-2], parts[-1]
        value = self.value(o[1])
        if destination == "bf16x2":
            high, low = (_bf16_round(_as(self.value(x), "f32")) for x in o[1:3])
            self.write(o[0], (high << np.uint64(16)) | low, mask)
        elif destination == "e4m3x2":
            high, low = (_e4m3(_as(self.value(x), "f32")).astype(np.uint64) for x in o[1:3])
            self.write(o[0], (high << np.uint64(8)) | low, mask)
        elif destination == "bf16":
            self.write(o[0], _bf16_round(_as(value, "f32")), mask)
        elif destination == "f32" and source == "bf16":
            self.write(o[0], (value & 0xFFFF) << np.uint64(16), mask)
        elif destination in ("s64", "u64", "s32", "u32") and source in ("s64", "u64", "s32", "u32"):
            converted = _as(value, source).astype(_TYPES[destination])
            self.write(o[0], _bits(converted), mask)
        else:
            raise PtxError(f"cvt.{destination}.{source} is not supported")

    def shuffle(self, parts, o, mask) -> None:
        mode = parts[2]
        source = self.value(o[1])
        selector = self.value(o[2]).astype(np.int64) & 31
        lanes = np.arange(LANES)
        if mode == "bfly":
            partner = lanes ^ selector
        elif mode == "idx":
            partner = selector
        else:
            raise PtxError(f"shfl mode {mode} is not supported")
        if not (self.alive[partner] | ~mask).all():
            raise PtxError("a shuffle read a lane that has exited")
        self.write(o[0], source[partner], mask)

    def load(self, parts, o, mask) -> None:
        space = parts[1]
        if space == "param":
            kind, value = self.kernel_param(o[1])
            raw = np.float32(value).view(np.uint32) if kind == "f32" else int(value) & (2**64 - 1)
            bits = np.uint64(raw)
            self.write(o[0], np.full(LANES, bits, dtype=np.uint64), mask)
            return
        vector = int(parts[2][1:]) if parts[2].startswith("v") else 1
        kind = parts[-1]
        size = np.dtype(_TYPES[kind]).itemsize
        targets = [x.strip() for x in o[0].strip("{}").split(",")]
        addresses = self.address(o[1])[mask]
        if (addresses % (size * vector)).any():
            raise PtxError(f"misaligned {size * vector}-byte {space} load")
        data = self.read(space, addresses, size * vector)
        for i, target in enumerate(targets):
            element = data[:, i * size : (i + 1) * size].copy().view(_TYPES[kind]).reshape(-1)
            widened = element.astype(np.int64) if kind.startswith("s") else element
            full = np.zeros(LANES, dtype=np.uint64)
            full[mask] = _bits(widened.astype(np.int64)) if kind.startswith("s") else _bits(widened)
            self.write(target, full, mask)

    def store(self, parts, o, mask) -> None:
        space = parts[1]
        vector = int(parts[2][1:]) if parts[2].startswith("v") else 1
        kind = parts[-1]
        size = np.dtype(_TYPES[kind]).itemsize
        sources = [x.strip() for x in o[1].strip("{}").split(",")]
        addresses = self.address(o[0])[mask]
        if (addresses % (size * vector)).any():
            raise PtxError(f"misaligned {size * vector}-byte {space} store")
        values = np.stack([self.value(s)[mask] & _mask_of(kind) for s in sources], axis=1)
        rows = values.astype(_TYPES[kind] if not kind.startswith("s") else np.dtype(f"u{size}")).view(np.uint8)
        rows = rows.reshape(addresses.size, size * vector)
        if space == "global":
            self.memory.write(addresses, rows)
        elif space == "shared":
            self.check_shared(addresses, size * vector)
            for address, row in zip(addresses, rows, strict=True):
                self.shared[int(address) : int(address) + row.size] = row
        else:
            raise PtxError(f"st.{space} is not supported")

    def read(self, space, addresses, size) -> np.ndarray:
        if space == "global":
            return self.memory.read(addresses, size)
        if space == "shared":
            self.check_shared(addresses, size)
            return (
                np.stack([self.shared[int(a) : int(a) + size] for a in addresses])
                if addresses.size
                else (np.zeros((0, size), dtype=np.uint8))
            )
        raise PtxError(f"ld.{space} is not supported")

    def check_shared(self, addresses, size) -> None:
        if ((addresses + size) > self.shared.size).any():
            raise PtxError(f"shared access of {size} bytes outside the CTA's {self.shared.size} bytes")

    def kernel_param(self, operand: str):
        name = operand.strip("[]")
        if name not in self.params:
            raise PtxError(f"unknown parameter {name}")
        return self.params[name]


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
    if kind.startswith("b"):
        kind = "u" + kind[1:]
    a, b = _as(a_bits, kind), _as(b_bits, kind)
    return {
        "lt": a < b,
        "le": a <= b,
        "gt": a > b,
        "ge": a >= b,
        "eq": a == b,
        "ne": a != b,
    }[relation]


def run_launch(ptx: str, launch) -> Memory:
    """Run a host-side launch plan (grid, block, packed arguments, the tensors it keeps alive) on
    the CPU through the PTX; return the memory, which counts the traffic per tensor."""
    memory = Memory(launch.keep_alive)
    Kernel(ptx).run(launch.grid, launch.block, launch.arguments, memory)
    return memory
