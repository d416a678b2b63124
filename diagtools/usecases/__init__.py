"""Use cases: scan, replay, sweep, bisect, and the self-check, each a short sequence of named steps.

They build requests, run subkernels through :mod:`diagtools.runner`, and turn
what came back into :mod:`diagtools.model` values.  No printing, no widgets.
"""
