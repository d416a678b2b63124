"""Which CUDA driver a subkernel saw: the one part of a scan's model the runner needs before it starts one.

:class:`DriverInfo` lives here, not in :mod:`diagtools.model.scan` (which
re-exports it), so that choosing a driver does not build the scan's dozen
dataclasses first: ``diagtools scan`` imports those while its subkernel starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagtools.model.serial import Serial

__all__ = ["DRIVER_KINDS", "DriverInfo"]

DRIVER_KINDS = ("real", "simulated", "none")


@dataclass(frozen=True)
class DriverInfo(Serial):
    """Which CUDA driver the subkernel saw: ``real``, ``simulated`` or ``none``."""

    kind: str = field(metadata={"choices": DRIVER_KINDS})
    requested: str = ""  # what the caller asked for (``auto``...); the kind itself when not given
    library: str | None = None
    libraries: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.requested:
            object.__setattr__(self, "requested", self.kind)

    @property
    def blind(self) -> str | None:
        """Why nothing run on this driver can show a cuInit (``--driver none``), else ``None``: a doubt that
        every verdict (scan, run, sweep, bisect, postmortem) takes the same way."""
        return "no driver was loaded, so a cuInit could not be observed" if self.kind == "none" else None

    def describe(self) -> str:
        where = f" ({self.library})" if self.library else ""
        label = {
            "simulated": "simulated driver, a libcuda.so.1 stand-in with no GPU",
            "real": "real CUDA driver",
            "none": "no CUDA driver",
        }[self.kind]
        extra = [name for name in self.libraries if not name.startswith("libcuda.")]
        also = f"; also simulated: {', '.join(extra)}" if extra else ""
        return f"{label}{where}{also}"
