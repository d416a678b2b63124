"""Front ends: the command line, the pytest plugin, notebook widgets, magics and progress bars, the demo job.

Argument parsing, wiring and printing only: every decision lives in the use cases.
"""
