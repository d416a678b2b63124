"""A long call in a notebook cell shows what it does while it runs: checked in a real Jupyter kernel."""

from __future__ import annotations

import time

from diagtools.frontends.progress import working
from tests.conftest import require

CELL = """
import diagtools
with diagtools.working("scanning slowpkg"):
    result = diagtools.scan("slowpkg", path=[{root!r}], driver="simulated", cuts=False)
print(result.verdict)
"""


def _messages_of(client, msg_id: str, timeout: float) -> list[tuple[float, str, dict]]:
    """(arrival, type, content) of every output message the cell sent, until it went idle."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            message = client.get_iopub_msg(timeout=1)
        except Exception:  # queue.Empty: nothing yet
            continue
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "status" and content["execution_state"] == "idle":
            return seen
        seen.append((time.monotonic(), kind, content))
    raise AssertionError(f"the cell did not finish in {timeout} s: {seen}")


def test_a_long_cell_shows_its_phase_and_seconds_before_it_ends(make_tree):
    manager_module = require("jupyter_client.manager", "notebook")
    root = make_tree({"slowpkg.py": "import time\ntime.sleep(3)\n"})
    manager, client = manager_module.start_new_kernel(kernel_name="python3")
    try:
        msg_id = client.execute(CELL.format(root=str(root)))
        messages = _messages_of(client, msg_id, timeout=240)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    displays = ("display_data", "update_display_data")
    shown = [(at, content["data"]["text/plain"]) for at, kind, content in messages if kind in displays]
    ended = next(at for at, kind, _ in messages if kind == "stream")  # the verdict printed after the block
    assert shown[0][1].startswith("scanning slowpkg ("), shown  # at once, with its seconds
    live = [text for at, text in shown if at < ended and "importing slowpkg in a fresh subkernel" in text]
    assert live, shown  # the subkernel run in progress, named while the cell still ran
    assert len({text for _, text in shown if text.endswith(" s)")}) >= 3  # the seconds tick
    assert shown[-1][1].startswith("scanning slowpkg: done in ")  # what stays in the saved notebook


def test_outside_a_notebook_it_draws_only_on_a_terminal(make_tree, capsys):
    root = make_tree({"quiet.py": ""})
    import diagtools

    with working("scanning quiet") as phase:
        phase("a step of its own")
        diagtools.scan("quiet", path=[str(root)], driver="simulated", cuts=False)
    assert capsys.readouterr().err == ""  # pytest's stderr is no terminal: nothing drawn


def test_a_failing_display_never_stops_the_run(make_tree):
    from diagtools.runner.subkernel import starting_runs

    root = make_tree({"plain.py": ""})
    import diagtools

    def broken(request):
        raise RuntimeError("display gone")

    with starting_runs(broken):
        result = diagtools.scan("plain", path=[str(root)], driver="simulated", cuts=False)
    assert result.ok
