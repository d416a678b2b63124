"""The deferral rewrite: what a cut's patch does to one file, without running a subkernel.

The rewritten packages here are pure Python and touch no driver, so importing
them in this process is safe: it proves that ``from package import name``
still works after a re-export became lazy.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from diagtools.errors import CannotDeferError
from diagtools.usecases.defer import defer, line_map, public_names


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def rewrite(tmp_path: Path, files: dict[str, str], file: str, lines: list[int], module: str) -> str:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text))
    target = tmp_path / file
    return defer(str(target), target.read_text(), lines, package=target.name == "__init__.py", module=module).after


@pytest.fixture
def fresh_import(tmp_path, monkeypatch):
    """Import a module from ``tmp_path`` and forget it (and its package) afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded: list[str] = []

    def load(name: str):
        importlib.invalidate_caches()
        loaded.append(name)
        return importlib.import_module(name)

    yield load
    for name in list(sys.modules):
        if any(name == top or name.startswith(top + ".") for top in {n.split(".")[0] for n in loaded}):
            del sys.modules[name]


OPS = {
    "kit/__init__.py": "",
    "kit/ops/__init__.py": '''
        """Ops, re-exported."""

        # the heavy one
        from .heavy import heavy_op  # noqa: F401
        from .light import light_op

        __all__ = ["heavy_op", "light_op"]
        ''',
    "kit/ops/heavy.py": "LOADED = True\n\ndef heavy_op(x):\n    return x * 2\n",
    "kit/ops/light.py": "def light_op(x):\n    return x\n",
}


def test_a_reexport_becomes_a_lazy_attribute_that_still_imports_by_name(tmp_path, fresh_import):
    after = rewrite(tmp_path, OPS, "kit/ops/__init__.py", [4], "kit.ops")
    (tmp_path / "kit/ops/__init__.py").write_text(after)
    ops = fresh_import("kit.ops")
    assert "kit.ops.heavy" not in sys.modules  # the import no longer runs the heavy module
    assert "heavy_op" in dir(ops)
    from kit.ops import heavy_op  # the caller's line keeps working

    assert heavy_op(3) == 6
    assert "kit.ops.heavy" in sys.modules
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        _ = ops.nothing


def test_the_rewrite_keeps_the_rest_of_the_file_and_its_comments(tmp_path):
    before = dedent(OPS["kit/ops/__init__.py"])
    after = rewrite(tmp_path, OPS, "kit/ops/__init__.py", [4], "kit.ops")
    assert "# the heavy one\n    from .heavy import heavy_op  # noqa: F401" in after  # moved with its comments
    assert "from .light import light_op\n" in after
    assert '__all__ = ["heavy_op", "light_op"]' in after  # kept: type checkers and star imports see the names
    assert "if TYPE_CHECKING:" in after
    assert after.count("from typing import TYPE_CHECKING") == 1
    kept = [line for line in before.splitlines() if "heavy" not in line]
    assert all(line in after.splitlines() for line in kept)
    assert not any(line != line.rstrip() for line in after.splitlines())  # no trailing whitespace
    compile(after, "x.py", "exec")


def test_an_import_used_only_in_functions_moves_into_them(tmp_path):
    files = {
        "app/fusion.py": '''
            """Fusion."""

            from kernels import rmsnorm, other


            def fused(x):
                """Docstring stays first."""
                return rmsnorm(x)


            def unrelated():
                return 1
            ''',
    }
    after = rewrite(tmp_path, files, "app/fusion.py", [3], "app.fusion")
    assert "\nfrom kernels import rmsnorm, other" not in after  # no longer run at import...
    assert "if TYPE_CHECKING:\n    from kernels import rmsnorm, other" in after  # ...but seen by type checkers
    assert '    """Docstring stays first."""\n    from kernels import rmsnorm\n\n    return rmsnorm(x)' in after
    assert "def unrelated():\n    return 1" in after
    assert "__getattr__" in after  # `other` is used nowhere in the module: callers may import it from here


def test_a_name_needed_while_the_module_is_imported_cannot_wait(tmp_path):
    files = {
        "app/config.py": """
            from platforms import current_platform


            class Config:
                devices = current_platform.count
            """,
    }
    with pytest.raises(CannotDeferError) as refused:
        rewrite(tmp_path, files, "app/config.py", [1], "app.config")
    assert refused.value.line == 5
    assert "`current_platform` is used at line 5 while the module is imported" in str(refused.value)


def test_an_annotation_is_a_use_unless_annotations_are_postponed(tmp_path):
    plain = {"app/op.py": "from cfg import Config\n\n\ndef op(config: Config):\n    return config\n"}
    with pytest.raises(CannotDeferError, match="in an annotation evaluated at definition"):
        rewrite(tmp_path, plain, "app/op.py", [1], "app.op")
    postponed = {"app/op.py": "from __future__ import annotations\n\n" + plain["app/op.py"]}
    after = rewrite(tmp_path, postponed, "app/op.py", [3], "app.op")
    assert "if TYPE_CHECKING:\n    from cfg import Config" in after  # type checkers keep the name
    assert after.index("from __future__ import annotations") < after.index("from typing import TYPE_CHECKING")


@pytest.mark.parametrize(
    ("source", "line", "reason"),
    [
        ("try:\n    from .x import y\nexcept ImportError:\n    y = None\n", 2, "inside a module-level `try` block"),
        ("import os\nVALUE = os.getpid()\n", 2, "not a single import statement"),
        ("import a; import b\n", 1, "not a single import statement"),
        ("from __future__ import annotations\n", 1, "__future__ import cannot be deferred"),
        ("from .x import y\ny = 2\n", 1, "`y` is also bound at line 2"),
        ("from .x import y\n\ndef __getattr__(name):\n    raise AttributeError(name)\n", 1, "already defines"),
        ("def broken(:\n", 1, "does not parse"),
        ("import a.b\n", 1, "`import a.b` binds `a`"),
        ("from .x import y\nf = lambda: y\n", 1, "module-level lambda"),
        ("\n\n", 2, "no statement of the module starts there"),
    ],
)
def test_what_cannot_be_deferred_is_refused_with_its_line_and_reason(tmp_path, source, line, reason):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "x.py").write_text("y = 1\n")
    target = package / "__init__.py"
    with pytest.raises(CannotDeferError, match=reason.replace("(", r"\(").replace("`", "`")):
        defer(str(target), source, [line], package=True, module="pkg")


def test_a_star_reexport_defers_every_public_name(tmp_path, fresh_import):
    files = {
        "star/__init__.py": "from .kern import *\n",
        "star/kern.py": "__all__ = ['fast', 'slow']\nfast = 1\nslow = 2\n_private = 3\n",
    }
    after = rewrite(tmp_path, files, "star/__init__.py", [1], "star")
    (tmp_path / "star/__init__.py").write_text(after)
    star = fresh_import("star")
    assert "star.kern" not in sys.modules
    assert (star.fast, star.slow) == (1, 2)
    assert public_names("import os\nfrom x import y as z\ndef f(): pass\n_h = 1\nK = 2\n") == ("os", "z", "f", "K")


def test_a_submodule_reexport_resolves_to_the_module(tmp_path, fresh_import):
    files = {"sub/__init__.py": "from . import heavy\n", "sub/heavy.py": "X = 5\n"}
    after = rewrite(tmp_path, files, "sub/__init__.py", [1], "sub")
    (tmp_path / "sub/__init__.py").write_text(after)
    package = fresh_import("sub")
    assert "sub.heavy" not in sys.modules
    assert package.heavy.X == 5


def test_two_statements_of_one_file_are_deferred_together(tmp_path, fresh_import):
    files = {
        "two/__init__.py": "from .a import A\nfrom .b import B\n\nVERSION = 1\n",
        "two/a.py": "A = 'a'\n",
        "two/b.py": "B = 'b'\n",
    }
    after = rewrite(tmp_path, files, "two/__init__.py", [1, 2], "two")
    (tmp_path / "two/__init__.py").write_text(after)
    package = fresh_import("two")
    assert {"two.a", "two.b"}.isdisjoint(sys.modules)
    assert (package.A, package.B, package.VERSION) == ("a", "b", 1)


def test_line_map_follows_the_lines_the_rewrite_kept():
    before = "a\nb\nc\nd\n"
    after = "a\nnew\nc\nd\nextra\n"
    assert line_map(before, after) == {1: 1, 3: 3, 4: 4}
