"""The command line as a person meets it: version, usage hints, colour, and the graph as SVG."""

from __future__ import annotations

import os
import subprocess

import pytest

import diagtools
from diagtools.specimens import get
from tests.conftest import DIAGTOOLS, cli


def test_version():
    done = cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"diagtools {diagtools.__version__}"


@pytest.mark.parametrize(
    ("args", "hint"),
    [(["bogus"], "(see diagtools --help)"), (["scan"], "(see diagtools scan --help)")],
)
def test_usage_errors_point_at_the_right_help(args, hint):
    done = cli(*args)
    assert done.returncode == 2
    assert done.stderr.strip().endswith(hint)
    assert "diagtools diagtools" not in done.stderr


def scan_common_ops(*extra: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    specimen = get("common_ops")
    command = [DIAGTOOLS, "scan", specimen.target, "--path", str(specimen.tree("before")), "--driver", "simulated"]
    return subprocess.run(
        [*command, *extra], capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **env}
    )


def test_colour_only_when_asked_or_on_a_terminal_and_never_with_no_color(tmp_path):
    plain = scan_common_ops(env={"NO_COLOR": "1", "FORCE_COLOR": "1"})
    assert plain.returncode == 0, plain.stderr
    assert "\x1b[" not in plain.stdout
    forced = scan_common_ops("--svg", str(tmp_path / "graph.svg"), env={"FORCE_COLOR": "1", "NO_COLOR": ""})
    assert forced.returncode == 0, forced.stderr
    assert "\x1b[31mCUDA initialized: YES\x1b[0m" in forced.stdout
    svg = (tmp_path / "graph.svg").read_text()
    assert svg.lstrip().startswith("<?xml")
    assert 'class="node culprit"' in svg


def test_colour_follows_structure_never_a_users_words(make_tree):
    """Modules named ``clean``, ``failed`` and ``unknown`` keep their names uncoloured; a name holding the style's
    own mark characters opens no colour; the verdict words and the CUDA line are coloured by what they mean."""
    mark = "\ue000" + "0" * 16 + "bad\ue001"
    root = make_tree(
        {
            "words/__init__.py": "",
            "words/clean.py": "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n",
            "words/failed.py": "X = 1\n",
            "words/unknown.py": "raise ImportError('status: ok; CUDA initialized: no')\n",
            f"words/odd{mark}.py": "X = 2\n",
        }
    )
    env = {**os.environ, "FORCE_COLOR": "1", "NO_COLOR": "", "COLUMNS": "200"}
    swept = subprocess.run(
        [DIAGTOOLS, "sweep", "words", "--path", str(root), "--driver", "simulated", "--fresh"],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert swept.returncode in (0, 1), swept.stderr
    for name in ("words.clean", "words.failed", "words.unknown"):
        line = next(line for line in swept.stdout.splitlines() if line.startswith(name))
        assert line.split()[0] == name  # the name itself carries no colour code
    assert "\x1b[31mYES\x1b[0m" in swept.stdout
    assert "\x1b[32mno\x1b[0m" in swept.stdout
    assert "\x1b[33m?\x1b[0m" in swept.stdout
    assert "\ue000" not in swept.stdout.replace(mark, "")  # no mark of the render's own is left behind
    scanned = subprocess.run(
        [DIAGTOOLS, "scan", "words.unknown", "--path", str(root), "--driver", "simulated"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert "\x1b[32m" not in scanned.stdout  # "status: ok; CUDA initialized: no" is the target's text, not ours
    assert "\x1b[33munknown\x1b[0m" in scanned.stdout
    assert "  status: import-error" in scanned.stdout  # the run's own health: neutral words


def test_a_long_scan_shows_what_it_does_on_a_terminal_while_it_runs(make_tree):
    """The phase line appears on a terminal at once, counts seconds while the import runs, and is cleared before
    the report; a pipe gets none of it."""
    import pty
    import select
    import time

    root = make_tree({"slowpkg.py": "import time\ntime.sleep(2.5)\n"})
    command = [DIAGTOOLS, "scan", "slowpkg", "--path", str(root), "--driver", "simulated", "--no-cuts"]
    main, child = pty.openpty()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=child, text=True)
    os.close(child)
    seen, started = b"", time.monotonic()
    try:
        while process.poll() is None and time.monotonic() - started < 60:
            if select.select([main], [], [], 0.2)[0]:
                try:
                    seen += os.read(main, 4096)
                except OSError:
                    break
            if b"importing slowpkg in a fresh subkernel (" in seen and process.poll() is None:
                break  # shown while the scan still runs
        assert b"importing slowpkg in a fresh subkernel (" in seen, seen
        assert process.poll() is None  # before the end
        out, _ = process.communicate(timeout=60)
        while select.select([main], [], [], 0.2)[0]:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the terminal's last writer is gone
                break
            if not chunk:
                break
            seen += chunk
        assert seen.endswith(b"\r\x1b[K"), seen[-80:]  # the line is cleared before the report
    finally:
        if process.poll() is None:
            process.kill()
        os.close(main)
    assert out.startswith("diagtools scan slowpkg")  # the report itself is unchanged
    piped = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert "importing" not in piped.stderr  # no terminal, no line


def test_a_sweep_says_what_it_does_before_its_first_row(make_tree):
    """Before any row is done (the zygote preloading a slow package), a terminal shows the preload and the
    scanning to come, with its seconds; the bar follows once rows finish."""
    import pty
    import select
    import time

    root = make_tree(
        {"slowsweep/__init__.py": "import time\ntime.sleep(3)\n", "slowsweep/a.py": "", "slowsweep/b.py": ""}
    )
    command = [DIAGTOOLS, "sweep", "slowsweep", "--path", str(root), "--driver", "simulated", "--jobs", "1"]
    main, child = pty.openpty()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=child, text=True)
    os.close(child)
    seen, started = b"", time.monotonic()
    wanted = b"preloading slowsweep in the zygote, then scanning 3 module(s), 1 at a time ("
    try:
        while process.poll() is None and time.monotonic() - started < 120 and wanted not in seen:
            if select.select([main], [], [], 0.2)[0]:
                try:
                    seen += os.read(main, 4096)
                except OSError:
                    break
        assert wanted in seen, seen
        assert b"module/s" not in seen  # no bar before the first row
        assert b"3/3" not in seen
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
        os.close(main)
    assert process.returncode == 0
    assert "slowsweep.a" in out


def test_a_piped_scan_names_its_target_before_the_scan_ends(tmp_path):
    """The report's first line comes as the subkernel starts, not with the rest: a long import says at once what is
    scanned, on a pipe too.  The target waits for a file the test writes only after reading that line."""
    go, gave_up = tmp_path / "go", tmp_path / "gave-up"
    (tmp_path / "slowpkg.py").write_text(
        "import os, time\n"
        "deadline = time.monotonic() + 120\n"
        f"while not os.path.exists({str(go)!r}):\n"
        "    if time.monotonic() > deadline:\n"
        f"        open({str(gave_up)!r}, 'w').close()\n"
        "        break\n"
        "    time.sleep(0.02)\n",
        encoding="utf-8",
    )
    command = [DIAGTOOLS, "scan", "slowpkg", "--path", str(tmp_path), "--driver", "simulated"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            first = process.stdout.readline()
            assert not gave_up.exists()  # the target was still waiting: the line came before the scan's end
            assert first == "diagtools scan slowpkg\n"
            go.write_text("")
            rest, errors = process.communicate(timeout=120)
        finally:
            process.kill()
    assert process.returncode == 0, errors
    assert rest.startswith("  driver: simulated driver"), rest
    assert "diagtools scan" not in rest  # said once
