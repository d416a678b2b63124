"""Built-in specimens: small packages that reproduce real import-time CUDA bugs.

Each specimen has an ``after/`` tree (the fix) and, where the story has one, a
``before/`` tree (the bug).  Scan them like any package of your own::

    diagtools.scan(s.target, path=[s.tree("before")])
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Specimen", "all_specimens", "get"]

_ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Specimen:
    """A package with a known import-time CUDA initialization, and its fix.

    ``culprit`` is the module the scan must blame in ``before/`` and
    ``site_text`` a fragment of the source line it must point at;
    ``line_text``, when set, a fragment of the line to change (the user's own
    line, when the initializer lies in a third-party package).
    """

    name: str
    title: str
    story: str
    target: str
    culprit: str | None
    site_text: str
    fix: str
    line_text: str = ""

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(v for v in ("before", "after") if (_ROOT / self.name / v).is_dir())

    def tree(self, variant: str = "before") -> Path:
        """The import root of one variant; raises ``ValueError`` for an unknown one."""
        if variant not in self.variants:
            raise ValueError(f"specimen {self.name!r} has no {variant!r} tree; it has {', '.join(self.variants)}")
        return _ROOT / self.name / variant


_SPECIMENS = (
    Specimen(
        name="deepseek_v4_ops",
        title="DeepSeek-V4 nvidia/ops re-export of a CuTe DSL leaf",
        story=(
            "vllm/models/deepseek_v4/nvidia/ops/__init__.py re-exported kernels whose modules import cutlass "
            "at top level and query the GPU arch, so importing the ops package called cuInit before vLLM forked "
            "its EngineCore workers: 'RuntimeError: CUDA driver initialization failed'."
        ),
        target="deepseek_v4.nvidia.ops",
        culprit="deepseek_v4.nvidia.ops.sparse_attn_compress_cutedsl",
        site_text="cuInit(0)",
        fix="the package __init__ keeps only its docstring; callers import the leaf module where they use it",
    ),
    Specimen(
        name="common_ops",
        title="common/ops re-export that pulls model/config code",
        story=(
            "vllm/models/common/ops/__init__.py gained a re-export of fused_allreduce_rms_norm, whose module "
            "imports the model config, which detects the platform by initializing CUDA; found by a manual "
            "git bisect after 'Cannot re-initialize CUDA in forked subprocess'."
        ),
        target="vmodels.common.ops",
        culprit="vmodels.platforms",
        site_text="cuInit(0)",
        fix="drop the re-export; the three callers import vmodels.common.ops.fused_allreduce_rms_norm directly",
    ),
    Specimen(
        name="third_party_init",
        title="A user's import of a third-party library that initializes CUDA",
        story=(
            "vllm's rms_quant_fusion.py imported flashinfer at top level; flashinfer/jit/env.py builds a "
            "CompilationContext at import, which asks the driver for the GPU's architecture.  The line that "
            "initializes CUDA is in a package nobody in vLLM can edit; the line to change is vLLM's own import."
        ),
        target="ringllm.layers",
        culprit="jitkern.jit.env",
        site_text="cuInit(0)",
        fix="import the kernel library inside the function that uses it",
        line_text="from jitkern import rmsnorm",
    ),
    Specimen(
        name="triton_is_active",
        title="Triton's CudaDriver.is_active() probe at import",
        story=(
            "Triton >= 3.8 answers is_active() by loading libcuda.so.1 through ctypes and calling cuInit; a "
            "module that asks at import time initializes the driver for everyone who imports it."
        ),
        target="kernelhub",
        culprit="kernelhub.backend",
        site_text="cu_init(0)",
        fix="ask on first use, inside a cached function",
    ),
    Specimen(
        name="lazy_clean",
        title="A lazily resolved ops package (PEP 562)",
        story="The package resolves its GPU submodules on first attribute access, so importing it is clean.",
        target="lazyops",
        culprit=None,
        site_text="",
        fix="nothing to fix: this is the pattern the fixes move towards",
    ),
)


def all_specimens() -> tuple[Specimen, ...]:
    """Every built-in specimen, in a stable order."""
    return _SPECIMENS


def get(name: str) -> Specimen:
    """The specimen called ``name``; raises ``KeyError`` listing the known ones."""
    for specimen in _SPECIMENS:
        if specimen.name == name:
            return specimen
    raise KeyError(f"no specimen {name!r}; known: {', '.join(s.name for s in _SPECIMENS)}")
