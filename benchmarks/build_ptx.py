"""Regenerate the CuTe DSL kernels' shipped PTX (``diagtools/kernels/ptx/``) for sm_90a; no GPU needed.

Run: ``CUTE_DSL_ARCH=sm_90a .venv/bin/python benchmarks/build_ptx.py`` after changing a kernel.
``tests/kernels/test_cutedsl_impl.py`` and ``tests/kernels/test_state_cutedsl.py`` fail while the
shipped copies differ from a fresh compile.
"""

from __future__ import annotations

import tempfile

from diagtools.kernels import cutedsl_impl, state_cutedsl


def main() -> None:
    cutedsl_impl.PTX_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        for head_dim, ratio in cutedsl_impl.PREBUILT:
            path = cutedsl_impl.prebuilt_path(head_dim, ratio)
            path.write_text(cutedsl_impl.compile_ptx(head_dim, ratio, folder))
            print(f"wrote {path} ({path.stat().st_size} bytes)")
        for ratio, stage in state_cutedsl.PREBUILT:
            path = state_cutedsl.prebuilt_path(ratio, stage)
            path.write_text(state_cutedsl.compile_ptx(ratio, folder, stage=stage))
            print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
