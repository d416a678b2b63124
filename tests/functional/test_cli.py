"""The diagtools command: text report, JSON, exit codes, one-line errors."""

from __future__ import annotations

import argparse
import json

from tests.conftest import MARK, cli, marked_line

LEAF = f"import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)  {MARK}\n"


def test_text_report_names_driver_culprit_chain_and_source_line(make_tree):
    root = make_tree({"pkg/__init__.py": "from . import leaf\n", "pkg/leaf.py": LEAF})
    done = cli("scan", "pkg", "--path", str(root), "--driver", "simulated")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "driver: simulated driver" in out
    assert "culprit: pkg.leaf" in out
    assert "chain: pkg -> pkg.leaf" in out
    assert f" pkg/leaf.py:{marked_line(root / 'pkg/leaf.py')} in" in out  # relative to the package root it came from
    assert str(root) not in out
    assert "cuInit(0)" in out


def test_json_to_stdout_is_the_documented_schema(make_tree):
    root = make_tree({"pkg/__init__.py": "from . import leaf\n", "pkg/leaf.py": LEAF})
    done = cli("scan", "pkg", "--path", str(root), "--driver", "simulated", "--json", "-")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["schema"] == "diagtools.scan/1"
    for key in ("status", "driver", "cuda_initialized", "startup", "modules", "culprits", "error"):
        assert key in document
    assert document["driver"]["kind"] == "simulated"
    assert document["startup"]["cuda_initialized"] is False
    node = next(m for m in document["modules"] if m["name"] == "pkg.leaf")
    assert set(node) >= {"name", "parent", "file", "self_s", "cumulative_s", "initializes_cuda", "threads_started"}
    culprit = document["culprits"][0]
    assert set(culprit) >= {"module", "chain", "site", "stack", "phase"}
    assert culprit["site"]["line"] == marked_line(root / "pkg/leaf.py")


def test_json_file_and_fail_on_cuda_exit_code(make_tree, tmp_path):
    root = make_tree({"pkg/__init__.py": "from . import leaf\n", "pkg/leaf.py": LEAF, "clean.py": "X = 1\n"})
    out = tmp_path / "scan.json"
    done = cli("scan", "pkg", "--path", str(root), "--driver", "simulated", "--json", str(out), "--fail-on-cuda")
    assert done.returncode == 1
    assert json.loads(out.read_text())["cuda_initialized"] is True
    assert "culprit: pkg.leaf" in done.stdout
    clean = cli("scan", "clean", "--path", str(root), "--driver", "simulated", "--fail-on-cuda")
    assert clean.returncode == 0, clean.stderr
    assert "CUDA initialized: no" in clean.stdout


def test_target_failure_exits_3_with_the_error(make_tree):
    root = make_tree({"bad.py": "raise ValueError('nope')\n"})
    done = cli("scan", "bad", "--path", str(root), "--driver", "simulated")
    assert done.returncode == 3
    assert "status: import-error" in done.stdout
    assert "ValueError: nope" in done.stdout


def test_usage_errors_are_one_line_and_exit_2(tmp_path):
    cases = [
        ("scan", "not a module"),
        ("scan", "ok_name", "--path", str(tmp_path / "missing")),
        ("scan", "ok_name", "--driver", "bogus"),
        ("scan", "ok_name", "--timeout", "-1"),
        ("scan",),
        ("frobnicate",),
    ]
    for args in cases:
        done = cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (args, done.stderr)
        assert lines[0].startswith("diagtools: error:"), (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_debug_shows_the_traceback(tmp_path):
    done = cli("--debug", "scan", "ok_name", "--path", str(tmp_path / "missing"))
    assert done.returncode != 0
    assert "Traceback" in done.stderr
    assert "UsageError" in done.stderr


def test_every_option_says_what_it_does_and_its_default_and_the_top_help_shows_examples():
    from diagtools.frontends.cli import _COMMANDS, _build_parser

    parser = _build_parser()
    assert "examples:" in parser.format_help()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name in _COMMANDS:
        sub = commands.choices[name]
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            text = sub._get_formatter()._expand_help(action) if action.help else ""
            if not text:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
            elif (
                action.option_strings
                and action.default not in (None, True, False, [], argparse.SUPPRESS)
                and (str(action.default) not in text)
            ):
                missing.append(f"{name} {action.option_strings[0]}: default {action.default!r} not said")
    assert not missing, "\n".join(missing)
