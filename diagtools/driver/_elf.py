"""Read a shared library's dynamic identity: its SONAME and its exported, versioned functions.

The simulated CUDA runtime must look like the real one to the dynamic loader: the same
SONAME, the same symbol version node (a library linked against the real runtime asks for
``cudaMalloc@libcudart.so.13`` and the loader refuses a library without that node) and the
same exported names.  So they are read from the installed real library, with this small
ELF64 little-endian reader (standard library only; no binutils needed at run time).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DynamicIdentity", "ElfError", "read_dynamic_identity"]

_SHT_DYNSYM, _SHT_DYNAMIC = 11, 6
_SHT_GNU_VERDEF, _SHT_GNU_VERSYM = 0x6FFFFFFD, 0x6FFFFFFF
_DT_SONAME = 14
_STT_FUNC, _STB_GLOBAL, _STB_WEAK = 2, 1, 2
_SHN_UNDEF = 0
_VERSYM_HIDDEN = 0x8000


class ElfError(ValueError):
    """The file is not a 64-bit little-endian ELF shared library this reader understands."""


@dataclass(frozen=True)
class DynamicIdentity:
    """What the loader sees of a library: SONAME, version nodes, and each exported function's version."""

    soname: str
    versions: tuple[str, ...]
    functions: dict[str, str]  # name -> version node ("" when unversioned)


@dataclass(frozen=True)
class _Section:
    kind: int
    offset: int
    size: int
    link: int
    entry_size: int


def _sections(data: bytes) -> list[_Section]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for index in range(shnum):
        _, kind, _, _, offset, size, link, _, _, entry_size = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + index * shentsize
        )
        sections.append(_Section(kind, offset, size, link, entry_size))
    return sections


def _string(data: bytes, table: _Section, offset: int) -> str:
    start = table.offset + offset
    return data[start : data.index(b"\0", start)].decode("ascii", "replace")


def _verdefs(data: bytes, sections: list[_Section]) -> dict[int, str]:
    """Version index -> version node name, from .gnu.version_d."""
    names: dict[int, str] = {}
    for section in sections:
        if section.kind != _SHT_GNU_VERDEF:
            continue
        strings, at = sections[section.link], section.offset
        while True:
            _, _, index, _, _, aux, following = struct.unpack_from("<HHHHIII", data, at)
            (name_offset,) = struct.unpack_from("<I", data, at + aux)
            names[index] = _string(data, strings, name_offset)
            if following == 0:
                break
            at += following
    return names


def _soname(data: bytes, sections: list[_Section]) -> str:
    for section in sections:
        if section.kind != _SHT_DYNAMIC:
            continue
        for at in range(section.offset, section.offset + section.size, 16):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == _DT_SONAME:
                return _string(data, sections[section.link], value)
    return ""


def read_dynamic_identity(path: Path) -> DynamicIdentity:
    """The SONAME, version nodes and exported functions (defined, global or weak) of ``path``."""
    try:
        data = path.read_bytes()
        sections = _sections(data)
        verdefs = _verdefs(data, sections)
        dynsym = next(s for s in sections if s.kind == _SHT_DYNSYM)
        versym = next((s for s in sections if s.kind == _SHT_GNU_VERSYM), None)
        strings = sections[dynsym.link]
        functions: dict[str, str] = {}
        for index in range(dynsym.size // dynsym.entry_size):
            at = dynsym.offset + index * dynsym.entry_size
            name_offset, info, _, shndx = struct.unpack_from("<IBBH", data, at)
            if shndx == _SHN_UNDEF or info & 0xF != _STT_FUNC or info >> 4 not in (_STB_GLOBAL, _STB_WEAK):
                continue
            version = ""
            if versym is not None:
                (raw,) = struct.unpack_from("<H", data, versym.offset + index * 2)
                version = verdefs.get(raw & ~_VERSYM_HIDDEN, "")
            functions[_string(data, strings, name_offset)] = version
    except (OSError, struct.error, StopIteration, IndexError, ValueError) as exc:
        raise ElfError(f"{path}: {exc}") from None
    # index 1 is the library's own base definition (named after the file), not a node
    nodes = tuple(name for index, name in sorted(verdefs.items()) if index > 1)
    return DynamicIdentity(_soname(data, sections), nodes, functions)
