"""The driver's build cache: compile the shipped C sources once, keyed by what they were built from.

Every library diagtools builds (the simulated world's, the injection hook, the
start recorder, the probe extension) is compiled on first use into a cache
directory (``$DIAGTOOLS_CACHE_DIR`` or the XDG cache), under a key made from
its source, the compiler and its flags, so a second run costs one ``stat``;
a small record per input stamp lets a process skip even the hashing.  Paths
handed to the dynamic loader are made safe for it (:func:`loader_safe`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from diagtools import protocol
from diagtools.errors import CacheDirectoryError, DriverBuildError

__all__ = ["build_injection_library", "build_probe_extension", "build_starts_library", "cache_dir", "loader_safe"]


_SOURCES = Path(__file__).resolve().parent


_ABI3_FLOOR = "3.10"  # cuprobe.c's Py_LIMITED_API


def cache_dir() -> Path:
    """Where compiled artefacts live: ``$DIAGTOOLS_CACHE_DIR`` or the XDG cache."""
    override = os.environ.get(protocol.CACHE_DIR)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "diagtools"


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "cc"))


def _build_key(*parts: str | bytes) -> str:
    import hashlib  # only needed to build: a valid cache is found by its stamp (see _recorded)

    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _compile(what: str, source: Path | list[Path], output: Path, extra: list[str]) -> Path:
    """Compile ``source`` (one file or several) into the shared object ``output`` unless it already exists."""
    if output.exists():
        return output
    import tempfile  # only needed to compile

    sources = source if isinstance(source, list) else [source]
    with _cache_writes(what, output.parent):
        output.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=output.parent, suffix=".so.tmp")
        os.close(fd)
    command = [*_compiler(), "-shared", "-fPIC", "-O2", "-o", tmp, *map(str, sources), *extra]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)  # the compiler may have removed it already
        raise DriverBuildError(what, shlex.join(command), str(exc)) from None
    if done.returncode != 0:
        Path(tmp).unlink(missing_ok=True)  # the compiler may have removed it already
        raise DriverBuildError(what, shlex.join(command), done.stderr or done.stdout)
    with _cache_writes(what, output.parent):
        os.replace(tmp, output)
    return output


@contextlib.contextmanager
def _cache_writes(what: str, where: Path) -> Any:
    """Turn a failure to write into the cache directory into an error that says what, where, and what to set."""
    try:
        yield
    except OSError as exc:
        raise CacheDirectoryError(what, str(where), exc.strerror or str(exc)) from None


def _stamp(paths: Iterable[Path], *parts: str) -> tuple[object, ...]:
    """Cheap identity of a build: the cache, the compiler, each input's stat (not its contents), ``parts``."""
    stamps: list[object] = [str(cache_dir()), *_compiler()]
    for path in paths:
        try:
            info = path.stat()
        except OSError:
            continue
        stamps.append((str(path), info.st_mtime_ns, info.st_size))
    return (*stamps, *parts)


def _write_if_changed(path: Path, text: str) -> Path:
    if not path.exists() or path.read_text() != text:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def _link_alias(directory: Path, alias: str, target: str) -> None:
    link = directory / alias
    if link.is_symlink() and os.readlink(link) == target:
        return
    tmp = directory / f".{alias}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _stamp_file(kind: str, stamp: tuple[object, ...]) -> Path:
    """Where the record of a ``kind`` build from inputs with this stamp lives.

    The name is a cheap checksum (no ``hashlib``, whose OpenSSL costs a scan
    milliseconds); the record holds the whole stamp, so two stamps that share
    a name only cost a rebuild, never a wrong answer.
    """
    text = repr(stamp).encode("utf-8", "backslashreplace")
    return cache_dir() / kind / "by-stamp" / f"{zlib.crc32(text):08x}{zlib.adler32(text):08x}"


def _recorded(kind: str, stamp: tuple[object, ...]) -> dict[str, Any] | None:
    """The record an earlier process wrote for a ``kind`` build with this exact stamp, or ``None``."""
    try:
        record = json.loads(_stamp_file(kind, stamp).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("stamp") == repr(stamp) else None


def _record(kind: str, stamp: tuple[object, ...], record: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        path = _stamp_file(kind, stamp)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_if_changed(path, json.dumps({**record, "stamp": repr(stamp)}))


def build_injection_library() -> Path:
    """A ``CUDA_INJECTION64_PATH`` library that reports a real cuInit to the probe."""
    source = _SOURCES / "simcuda.c"
    key = _build_key(source.read_bytes(), (_SOURCES / "simworld.h").read_bytes(), *_compiler(), "injection")
    library = cache_dir() / "injection" / key / "libdiagtools_injection.so"
    return _compile("the CUDA injection hook", source, library, ["-DDIAGTOOLS_INJECTION_ONLY", "-ldl"])


def build_starts_library() -> Path:
    """The ``LD_PRELOAD`` library that names each Python program a run's command starts (see ``starts.c``)."""
    source = _SOURCES / "starts.c"
    names = [f'-DRUN_DIR_VARIABLE="{protocol.RUN_DIR}"', f'-DSTARTS_FILE="{protocol.RUN_STARTS}"']
    key = _build_key(source.read_bytes(), *_compiler(), "starts", *names)
    library = cache_dir() / "starts" / key / "libdiagtools_starts.so"
    return loader_safe(_compile("the process-start recorder", source, library, names).parent) / library.name


def build_probe_extension() -> Path:
    """The compiled ``_diagtools_cuprobe`` extension, built once for every supported interpreter.

    It uses only the stable ABI of CPython 3.10 (``Py_LIMITED_API``), so the
    key names no interpreter: a scan with ``--python`` loads the same file.
    """
    source = _SOURCES / "cuprobe.c"
    stamp = _stamp((source,), "abi3", _ABI3_FLOOR)
    recorded = _recorded("cuprobe", stamp)
    if recorded is not None and Path(str(recorded.get("library"))).exists():
        return Path(str(recorded["library"]))
    key = _build_key(source.read_bytes(), *_compiler(), "abi3", _ABI3_FLOOR)
    library = cache_dir() / "cuprobe" / key / "_diagtools_cuprobe.abi3.so"
    if not library.exists():
        import sysconfig  # only needed to compile: finding the headers costs a few ms

        include = sysconfig.get_paths()["include"]
        _compile("the CUDA state probe", source, library, [f"-I{include}", "-ldl"])
    _record("cuprobe", stamp, {"library": str(library)})
    return library


_LOADER_UNSAFE = frozenset(" \t\n:;$")


def loader_safe(directory: Path) -> Path:
    """``directory``, or a private symlink to it whose path the loader's lists can carry.

    A cache under a home folder named with a space or a colon would otherwise be
    cut in two by ``LD_PRELOAD``/``LD_LIBRARY_PATH``, and another CUDA runtime
    found instead.  The link lives in the first temporary folder with a plain
    path, is named by this user and the folder, and is reused only when it is
    this user's and points at ``directory``.
    """
    if not _LOADER_UNSAFE.intersection(str(directory)):
        return directory
    target = os.path.realpath(directory)
    name = f"diagtools-{os.getuid()}-{zlib.crc32(target.encode('utf-8', 'surrogateescape')):08x}"
    for base in (os.environ.get("TMPDIR", ""), "/tmp", "/var/tmp", "/dev/shm"):
        if not base or _LOADER_UNSAFE.intersection(base) or not os.path.isdir(base):
            continue
        link = Path(base, name)
        with contextlib.suppress(FileExistsError, OSError):
            os.symlink(target, link)
        if _ours(link, target):
            return link
    raise CacheDirectoryError(
        "the simulated driver",
        str(directory),
        "its path holds a space, colon or '$' that the loader cannot "
        "take, and no private link to it could be made in /tmp",
    )


def _ours(link: Path, target: str) -> bool:
    try:
        stat = os.lstat(link)
        return stat.st_uid == os.getuid() and os.path.islink(link) and os.readlink(link) == target
    except OSError:
        return False
