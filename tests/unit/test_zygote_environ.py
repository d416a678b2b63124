"""The search for the files that hold a name (the sweep zygote's ``zygote_environ``), run in this process."""

from __future__ import annotations

import fcntl  # noqa: F401 - the search imports these two as it runs, with sys.path patched below
import importlib.util
import json
import os
import select  # noqa: F401
import shlex
import subprocess
import sys
import textwrap
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


_FRESH_PYTHON = """
import fcntl, importlib.util, json, select, sys
spec = importlib.util.spec_from_file_location("_search", sys.argv[1])
search_file = importlib.util.module_from_spec(spec)
spec.loader.exec_module(search_file)
given = json.loads(sys.argv[2])
sys.path[:] = given["path"]
"""


def _in_fresh_python(body, **given):
    """Run ``body`` in a fresh interpreter (one thread, as the zygote's search child: readers are forked only
    in such a process, whatever threads this test process runs) and return what it prints, as JSON."""
    program = _FRESH_PYTHON + textwrap.dedent(body)
    search_file = str(agents.AGENTS_DIR / "zygote_environ.py")
    done = subprocess.run(
        [sys.executable, "-c", program, search_file, json.dumps(given)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_readers_report_the_first_holder_in_the_walks_order(tmp_path):
    """Files are read by several forked readers at once; the holder reported is still the first in the walk's
    order (the package's), though a later one (on ``sys.path``) is read by another reader, and every file
    is read when no file holds a name."""
    name, missing = f"EV_{uuid.uuid4().hex.upper()}", "NO_FILE_" + uuid.uuid4().hex
    package, later = tmp_path / "src" / "pk", tmp_path / "later"
    _many_files(package, 300)
    _many_files(later, 5)
    (package / "zz_reader.py").write_text(f"import os\nos.environ.get('{name}')\n", encoding="utf-8")
    (later / "other.py").write_text(f"import os\nos.environ.get('{name}')\n", encoding="utf-8")
    answer = _in_fresh_python(
        """
        with search_file._Search([given["name"]], set(), 60.0) as search:
            readers = len(search.readers)
            search.walk(given["package"])
            search.walk(given["later"])
        held = search_file.held_elsewhere([given["name"], given["missing"]], [], first=[given["package"]])
        print(json.dumps({"readers": readers, "holders": search.holders(), "failed": search.failed, "held": held}))
        """,
        path=[str(later)],
        name=name,
        missing=missing,
        package=str(package),
        later=str(later),
    )
    reader = str(package / "zz_reader.py")
    assert answer["readers"] > 1
    assert answer == {
        "readers": answer["readers"],
        "holders": {name: reader},
        "failed": False,
        "held": {name: [f"{reader} holds its name", reader]},
    }


def test_a_reader_that_ends_early_keeps_no_name(tmp_path):
    """A reader that fails on a file may have left files unread: no name is kept, and the reason says so."""
    folder = tmp_path / "pk"
    _many_files(folder, 40)
    missing = "NO_FILE_" + uuid.uuid4().hex
    answer = _in_fresh_python(
        """
        real = search_file._names_in

        def failing(path, needles):
            if path.endswith("m0007.py"):
                raise MemoryError("a reader failed")
            return real(path, needles)

        search_file._names_in = failing
        with search_file._Search([given["missing"]], set(), 60.0) as search:
            readers = len(search.readers)
        print(json.dumps({"readers": readers, "held": search_file.held_elsewhere([given["missing"]], [])}))
        """,
        path=[str(folder)],
        missing=missing,
    )
    assert answer["readers"] > 1
    assert answer["held"] == {missing: ["the search for its name could not read every file", ""]}


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
