"""Regenerate the CuTe DSL kernel's shipped PTX (``diagtools/kernels/ptx/``) for sm_90a; no GPU needed.

Run: ``CUTE_DSL_ARCH=sm_90a .venv/bin/python benchmarks/build_ptx.py`` after changing the kernel.
``tests/kernels/test_cutedsl_impl.py`` fails while the shipped copies differ from a fresh compile.
"""

from __future__ import annotations

import tempfile

from diagtools.kernels.cutedsl_impl import PREBUILT, PTX_DIR, compile_ptx, prebuilt_path


def main() -> None:
    PTX_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        for head_dim, ratio in PREBUILT:
            path = prebuilt_path(head_dim, ratio)
            path.write_text(compile_ptx(head_dim, ratio, folder))
            print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
