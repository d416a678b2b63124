"""The search for the files that hold a name (the sweep zygote's ``zygote_environ``), run in this process."""

from __future__ import annotations

import importlib.util
import mmap  # noqa: F401 - the search imports it when it maps a large file, with sys.path patched below
import sys
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
