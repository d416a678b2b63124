"""The ``diagtools run`` agent.

This directory is put first on ``PYTHONPATH`` of the watched command, so every
Python process of its tree imports the ``sitecustomize`` here, which loads
``_diagtools_run_agent`` (standard library only) and then chains to any
``sitecustomize`` the process would have imported otherwise.
"""

from pathlib import Path

from diagtools.protocol import RUN_AGENT_MODULE

HOOK_DIR = Path(__file__).resolve().parent
AGENT_FILE = HOOK_DIR / f"{RUN_AGENT_MODULE}.py"
