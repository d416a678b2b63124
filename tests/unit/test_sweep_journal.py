"""The journal's records of what rows were scanned with: the environment, the file digests, the learned preload."""

from __future__ import annotations

import json

from diagtools.model.sweep import SweepRow
from diagtools.model.verdict import ScanStatus
from diagtools.usecases.sweep_discover import locate_tree
from diagtools.usecases.sweep_environment import Environment, _distributions
from diagtools.usecases.sweep_journal import Fingerprints, Journal, Learned

HEADER = {"schema": "diagtools.sweep/1", "package": "pj", "paths": []}
HERE = Environment("py1", "drv1", {"numpy 2.0": "aa", "torch 2.14.0": "bb"})


def package(make_tree):
    return make_tree({"pj/__init__.py": "", "pj/a.py": "A = 1\n", "pj/b.py": "B = 1\n"})


def row(module, fingerprints, deps=()):
    plain = SweepRow(module, ScanStatus.OK, False, None, 0.0, deps=tuple(deps))
    return SweepRow(module, ScanStatus.OK, False, None, 0.0, deps=tuple(deps), fingerprint=fingerprints.of(plain))


def journal_of(path, root, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in [HEADER, *lines]))
    return Journal(path, "pj", ())


def test_the_environment_names_what_changed():
    later = Environment("py2", "drv1", {"torch 2.14.1": "cc", "numpy 2.0": "ab", "triton 3.8": "dd"})
    assert later.change_since(HERE) == (
        "the interpreter changed; installed distributions changed: torch 2.14.0 removed, torch 2.14.1 added, "
        "triton 3.8 added and 1 more"
    )
    assert HERE.change_since(Environment.from_json(HERE.to_json())) == ""
    assert Environment.from_json(HERE.to_json()).digest == HERE.digest
    for bad in (5, None, {"python": "p"}, {"python": "p", "driver": "d", "distributions": {"x": 1}}):
        assert Environment.from_json(bad) is None


def test_rows_are_kept_or_rescanned_with_their_reason(make_tree, tmp_path):
    root = package(make_tree)
    tree = locate_tree("pj", (str(root),), ())
    fingerprints = Fingerprints(tree)
    files = fingerprints.swept()
    kept, edited = row("pj.a", fingerprints), row("pj.b", fingerprints, deps=["pj/a.py"])
    lines = [{"environment": HERE.to_json()}, {"files": files}, kept.to_json(), edited.to_json()]
    (root / "pj" / "b.py").write_text("B = 2\n")
    with journal_of(tmp_path / "j.jsonl", root, lines) as journal:
        reused = journal.reuse(Fingerprints(tree), HERE)
    assert set(reused.rows) == {"pj.a"}
    assert reused.stale == {"pj.b": "pj/b.py changed"}
    assert reused.journaled
    written = [json.loads(line) for line in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert written[-1] == {"files": {"pj/b.py": Fingerprints(tree).digest("pj/b.py")}}  # only what changed
    assert not any("environment" in line for line in written[5:])  # the same environment: not written again


def test_hostile_records_never_keep_a_row_nor_stop_the_sweep(make_tree, tmp_path):
    """Records a tool or a person could write by hand: each is ignored, and a row after an environment that
    cannot be read is scanned again rather than trusted."""
    root = package(make_tree)
    tree = locate_tree("pj", (str(root),), ())
    fingerprints = Fingerprints(tree)
    lines = [
        {"environment": "not one"},
        {"files": ["not", "a", "map"]},
        {"files": {"pj/a.py": 7}},
        {"preload": {"learned": [1, 2]}},
        {"preload": "vllm.config"},
        row("pj.a", fingerprints).to_json(),
    ]
    with journal_of(tmp_path / "j.jsonl", root, lines) as journal:
        reused = journal.reuse(fingerprints, HERE)
    assert reused.rows == {}
    assert reused.stale == {"pj.a": "the journal did not record the environment it was scanned in"}
    assert reused.learned is None


def test_the_learned_preload_is_read_back_the_last_one_winning(make_tree, tmp_path):
    root = package(make_tree)
    tree = locate_tree("pj", (str(root),), ())
    first, last = Learned(("zmq", "pj.a"), ("zmq",)), Learned(("pj.a",), ())
    lines = [{"environment": HERE.to_json()}, first.to_json(), last.to_json(), {"preload": {"learned": []}}]
    with journal_of(tmp_path / "j.jsonl", root, lines) as journal:
        assert journal.reuse(Fingerprints(tree), HERE).learned == last


def test_distributions_leave_out_the_swept_packages_own(tmp_path):
    for name, record in {"pj-1.0.dist-info": "pj/__init__.py,,\n", "zmq-26.0.dist-info": "zmq/__init__.py,,\n"}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "RECORD").write_text(record)
    (tmp_path / "stray-0.1.dist-info").mkdir()  # no RECORD: still listed, by what it has
    found = _distributions([str(tmp_path), str(tmp_path / "missing")], "pj")
    assert set(found) == {"zmq 26.0", "stray 0.1"}
