"""What a sweep reads from the package's files without importing it: the names its sources import."""

from __future__ import annotations

from diagtools.usecases.sweep_discover import locate_tree, names_imported


def test_the_names_a_package_imports_are_read_from_its_files_once_per_tree(make_tree):
    root = make_tree(
        {
            "pj/__init__.py": "import torch.cuda as tc, os\n",
            "pj/a.py": "from triton import jit  # kernels\nx = __import__('numpy')\n",
            "pj/b.py": "def f():\n    import importlib\n    return importlib.import_module('cutlass')\n",
        }
    )
    tree = locate_tree("pj", (str(root),), ())
    expected = {"torch", "os", "triton", "numpy", "importlib", "cutlass"}
    assert tree.imported_names == names_imported(tree) == expected
    (root / "pj" / "a.py").write_text("import pynvml\n")
    assert tree.imported_names == expected  # read once: a sweep's stages see the same names
    assert locate_tree("pj", (str(root),), ()).imported_names == expected - {"triton", "numpy"} | {"pynvml"}
