"""The documented import path of the notebook panels; they live in :mod:`diagtools.frontends.widgets`."""

from diagtools.frontends.widgets import BenchPanel, ReplayPanel, ScanPanel

__all__ = ["BenchPanel", "ReplayPanel", "ScanPanel"]
