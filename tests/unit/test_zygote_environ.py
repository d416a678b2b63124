"""The search for the files that hold a name (the sweep zygote's ``zygote_environ``), run in this process."""

from __future__ import annotations

import fcntl  # noqa: F401 - the search imports these two as it runs, with sys.path patched below
import importlib.util
import os
import select  # noqa: F401
import shlex
import subprocess
import sys
import threading
import uuid

import pytest

from diagtools import agents


@pytest.fixture(scope="module")
def environ_search():
    spec = importlib.util.spec_from_file_location("_test_zygote_environ", agents.AGENTS_DIR / "zygote_environ.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_folders_are_searched_first(environ_search, tmp_path, monkeypatch):
    """A name held both by a file in a folder earlier on ``sys.path`` and by one in the swept package is
    reported as the package's (the search ends once every name is found)."""
    name = f"EV_{uuid.uuid4().hex.upper()}"
    early, package = tmp_path / "early", tmp_path / "src" / "pk"
    early.mkdir()
    package.mkdir(parents=True)
    (early / "other.py").write_text(f"import os\nos.environ.get('{name}')\n", encoding="utf-8")
    (package / "reader.py").write_text(f"import os\nos.environ.get('{name}')\n", encoding="utf-8")
    monkeypatch.setattr(sys, "path", [str(early), str(tmp_path / "src")])
    held = environ_search.held_elsewhere([name], [], first=[str(package) + "/"])
    assert held == {name: (f"{package / 'reader.py'} holds its name", str(package / "reader.py"))}
    assert environ_search.held_elsewhere([name], []) == {
        name: (f"{early / 'other.py'} holds its name", str(early / "other.py"))
    }


def test_a_name_no_file_holds_is_not_held(environ_search, tmp_path, monkeypatch):
    """Every file is read (the package's folders, the mapped libraries, each ``sys.path`` folder) and the name
    is in none of them."""
    package = tmp_path / "pk"
    package.mkdir()
    (package / "setter.py").write_text("import os\nos.environ['X' + 'Y'] = '1'\n", encoding="utf-8")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert environ_search.held_elsewhere(["NO_FILE_" + uuid.uuid4().hex], [], first=[str(package)]) == {}


def _build_library(tmp_path, names, pad_bytes=0):
    """A native library whose ``getenv`` call names ``names["data"]`` (loaded data), with ``names["symbol"]``
    only a static symbol's name (the symbol table) and ``names["device"]`` only in a ``.nv_fatbin`` section;
    ``pad_bytes`` of loaded constants make it a large file."""
    source = tmp_path / "names.c"
    pad = f"__attribute__((used)) static const char pad[{pad_bytes}] = {{1}};\n" if pad_bytes else ""
    source.write_text(
        "#include <stdlib.h>\n"
        f'const char *reads(void) {{ return getenv("{names["data"]}"); }}\n'
        f"static int {names['symbol']};\n"
        f"int touch(void) {{ return {names['symbol']}++; }}\n"
        f'__attribute__((section(".nv_fatbin"), used)) static const char device[] = "{names["device"]}";\n' + pad,
        encoding="utf-8",
    )
    library = tmp_path / "lib" / "libnames.so"
    library.parent.mkdir()
    compiler = shlex.split(os.environ.get("CC", "cc"))
    subprocess.run([*compiler, "-shared", "-fPIC", "-O0", "-o", str(library), str(source)], check=True)
    return library


@pytest.mark.parametrize("pad_bytes", [0, 6 << 20], ids=["small", "larger-than-one-read"])
def test_a_native_library_holds_every_name_in_its_bytes(environ_search, tmp_path, monkeypatch, pad_bytes):
    """A native library is read whole: a ``getenv`` argument, a static symbol's name and a string in its
    GPU code section are all held (the search does not guess which parts of a file a program reads)."""
    tag = uuid.uuid4().hex.upper()
    names = {part: f"EV_{part.upper()}_{tag}" for part in ("data", "symbol", "device")}
    library = _build_library(tmp_path, names, pad_bytes)
    assert (library.stat().st_size > environ_search._CHUNK) == bool(pad_bytes)
    monkeypatch.setattr(sys, "path", [str(library.parent)])
    held = environ_search.held_elsewhere(list(names.values()), [])
    assert held == dict.fromkeys(names.values(), (f"{library} holds its name", str(library)))


def test_a_name_across_two_reads_of_a_large_file_is_held(environ_search, tmp_path, monkeypatch):
    """A large file is read a part at a time; a name that starts in one part and ends in the next is seen."""
    name = f"EV_ACROSS_{uuid.uuid4().hex.upper()}"
    chunk = environ_search._CHUNK
    data = bytearray(3 * chunk)
    data[chunk - 5 : chunk - 5 + len(name)] = name.encode()
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "table.bin").write_bytes(bytes(data))
    monkeypatch.setattr(sys, "path", [str(folder)])
    assert environ_search.held_elsewhere([name], []) == {
        name: (f"{folder / 'table.bin'} holds its name", str(folder / "table.bin"))
    }


def _many_files(folder, count):
    folder.mkdir(parents=True)
    for index in range(count):
        (folder / f"m{index:04d}.py").write_text(f"value = {index}\n", encoding="utf-8")


def test_readers_report_the_first_holder_in_the_walks_order(environ_search, tmp_path, monkeypatch):
    """Files are read by several forked readers at once; the holder reported is still the first in the walk's
    order (the package's), though a later one (on ``sys.path``) is read by another reader, and every file
    is read when no file holds a name."""
    name = f"EV_{uuid.uuid4().hex.upper()}"
    package, later = tmp_path / "src" / "pk", tmp_path / "later"
    _many_files(package, 300)
    _many_files(later, 5)
    (package / "zz_reader.py").write_text(f"import os\nos.environ.get('{name}')\n", encoding="utf-8")
    (later / "other.py").write_text(f"import os\nos.environ.get('{name}')\n", encoding="utf-8")
    monkeypatch.setattr(sys, "path", [str(later)])
    with environ_search._Search([name], set(), 60.0) as search:
        assert len(search.readers) == environ_search.READERS > 1
        search.walk(str(package))
        search.walk(str(later))
    assert search.holders() == {name: str(package / "zz_reader.py")}
    assert not search.failed
    missing = "NO_FILE_" + uuid.uuid4().hex
    assert environ_search.held_elsewhere([name, missing], [], first=[str(package)]) == {
        name: (f"{package / 'zz_reader.py'} holds its name", str(package / "zz_reader.py"))
    }


def test_a_reader_that_ends_early_keeps_no_name(environ_search, tmp_path, monkeypatch):
    """A reader that fails on a file may have left files unread: no name is kept, and the reason says so."""
    folder = tmp_path / "pk"
    _many_files(folder, 40)
    real = environ_search._names_in

    def failing(path, needles):
        if path.endswith("m0007.py"):
            raise MemoryError("a reader failed")
        return real(path, needles)

    monkeypatch.setattr(environ_search, "_names_in", failing)
    monkeypatch.setattr(sys, "path", [str(folder)])
    missing = "NO_FILE_" + uuid.uuid4().hex
    assert environ_search.held_elsewhere([missing], []) == {
        missing: ("the search for its name could not read every file", "")
    }


def test_a_process_with_threads_reads_alone(environ_search, tmp_path, monkeypatch):
    """Forking a process that runs threads is not safe: the search reads every file itself, with the same answer."""
    name = f"EV_{uuid.uuid4().hex.upper()}"
    folder = tmp_path / "pk"
    _many_files(folder, 20)
    (folder / "reader.py").write_text(f"import os\nos.environ.get('{name}')\n", encoding="utf-8")
    monkeypatch.setattr(sys, "path", [str(folder)])
    release = threading.Event()
    waiter = threading.Thread(target=release.wait)
    waiter.start()
    try:
        with environ_search._Search([name], set(), 60.0) as search:
            assert search.readers == []
        assert environ_search.held_elsewhere([name], []) == {
            name: (f"{folder / 'reader.py'} holds its name", str(folder / "reader.py"))
        }
    finally:
        release.set()
        waiter.join()


def test_a_fifo_on_the_path_is_not_read(environ_search, tmp_path, monkeypatch):
    """A FIFO, in a searched folder or as a ``sys.path`` entry, would block whoever opens it: it is passed by,
    and the search ends with the name found in the folder's file."""
    name = f"EV_{uuid.uuid4().hex.upper()}"
    folder = tmp_path / "pk"
    folder.mkdir()
    os.mkfifo(folder / "a_pipe")
    os.mkfifo(tmp_path / "entry_pipe")
    (folder / "reader.py").write_text(f"import os\nos.environ.get('{name}')\n", encoding="utf-8")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "entry_pipe"), str(folder)])
    missing = "NO_FILE_" + uuid.uuid4().hex
    assert environ_search.held_elsewhere([name, missing], []) == {
        name: (f"{folder / 'reader.py'} holds its name", str(folder / "reader.py"))
    }
