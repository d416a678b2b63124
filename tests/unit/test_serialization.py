"""The protocol's JSON encoder and every result's ``from_json``, fed arbitrary Unicode and documents.

Properties: any text the agents encode comes back identical through ``json``;
any document handed to a reader either reads or raises ``SchemaError`` naming
the field (never ``KeyError``, ``TypeError`` or a silent wrong value); every
result survives ``from_json(to_json())`` unchanged.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagtools import protocol
from diagtools.errors import SchemaError
from diagtools.model.bisect import BisectResult, BisectStep
from diagtools.model.diff import ScanDiff
from diagtools.model.replay import ChildOutcome, DriverCall, ParentState, ReplayComparison, ReplayResult
from diagtools.model.run import ChildSaw, DriverRefusal, Finding, ProcessRecord, ProcessStart, RunResult
from diagtools.model.scan import Culprit, DriverInfo, ImportNode, ScanResult, Site, StartupInfo, TargetFailure
from diagtools.model.serial import json_text
from diagtools.model.sweep import CUDA_SOURCES, SWEEP_MODES, SweepResult, SweepRow
from diagtools.model.verdict import ScanStatus, Verdict
from diagtools.runner import events as event_reader
from tests.conftest import require

ANY_CHARACTER = st.characters(exclude_categories=())  # surrogates and controls included
TEXT = st.text(ANY_CHARACTER, max_size=40)
FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)
JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | FINITE | TEXT
JSON = st.recursive(
    JSON_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4), max_leaves=20
)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- the encoder ---------------------------------------------------------------------------


@FAST
@given(TEXT)
def test_any_text_round_trips_through_the_encoder(text):
    assert json.loads(protocol.encode_str(text)) == text


def test_an_astral_non_printable_character_round_trips():
    assert json.loads(protocol.encode_str("\U000e0067")) == "\U000e0067"
    assert protocol.encode_str("\U000e0067") == '"\\udb40\\udc67"'


@FAST
@given(JSON)
def test_any_document_round_trips_through_the_encoder(document):
    assert json.loads(protocol.encode(document)) == document


@FAST
@given(st.binary(max_size=300))
def test_the_reader_never_fails_on_arbitrary_bytes(data):
    decoded = event_reader.decode_events(data)
    assert all(event["e"] in protocol.EVENTS for event in decoded.events)


# An agent's event lines, and the same lines as a target might mangle them: the fast parser must give
# exactly json.loads's answer (kept, skipped and counted, or not counted) for every one.
BEGIN = (
    '{"e":"begin","n":"a.b","p":null,"f":"/x/a/b.py",'
    '"l":["/x/a/__init__.py",3,"<module>"],"th":1,"ph":"import","t":1.5}'
)
LINE_VARIANTS = st.sampled_from(
    [
        BEGIN,
        ' {"e":"done"}',  # blanks around a whole object: json.loads accepts them
        '{"e":"done"}\t ',
        '{"e":"done"} {"e":"done"}',  # extra data after the object
        '{"e":"done"',  # torn
        "\ufeff" + '{"e":"done"}',  # a byte-order mark
        '{"e":"end","n":"a","ok":true,"t":NaN}',  # not finite
        BEGIN.replace('3,"<module>"', '"3","<module>"'),  # a frame whose line is not a number
        BEGIN.replace('["/x/a/__init__.py",3,"<module>"]', "null"),
        '{"e":"nope"}',
        "[1, 2]",
        "[" * 5000,  # deeper than the decoder's recursion limit
        "",
        "   ",
        "garbage \xff",
    ]
)


def _reference_decode(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """What the reader keeps and skips, with json.loads on every line (the reader's contract, spelled out)."""
    lines = data.split(b"\n")
    lines.pop()
    events, skipped = [], 0
    for line in lines:
        try:
            event = json.loads(line.decode("utf-8", "backslashreplace"))
        except (ValueError, RecursionError):
            event = None
        if isinstance(event, dict) and event.get("e") in protocol.EVENTS:
            event = event if _reference_valid(event) else None
        else:
            event = None
        if event is None:
            skipped += line.strip() != b""
        else:
            events.append(event)
    return events, skipped + (1 if data and not data.endswith(b"\n") else 0)


def _reference_valid(event: dict[str, Any]) -> bool:
    """Every field of its kind present; each field of a typed kind of the type it must have, else a finite ``t``."""
    if any(name not in event for name in protocol.EVENTS[event["e"]]):
        return False
    typed = event["e"] in event_reader._TYPED_KINDS
    for name, value in event.items():
        check = event_reader.FIELD_TYPES.get(name) if typed else event_reader.FIELD_TYPES["t"] if name == "t" else None
        if check is not None and not check(value):
            return False
    return True


@FAST
@given(st.lists(LINE_VARIANTS, max_size=8), st.booleans())
def test_the_reader_keeps_and_counts_every_line_as_json_loads_would(lines, torn_tail):
    data = "".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape")
    data += b'{"e":"do' if torn_tail else b""
    decoded = event_reader.decode_events(data)
    assert (decoded.events, decoded.skipped) == _reference_decode(data)


@FAST
@given(st.lists(LINE_VARIANTS, max_size=8), st.booleans(), st.lists(st.integers(0, 2000), max_size=6))
def test_bytes_read_in_pieces_give_what_they_give_at_once(lines, torn_tail, cuts):
    data = "".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape")
    data += b'{"e":"do' if torn_tail else b""
    reader = event_reader.EventReader()
    edges = [0, *sorted(cut % (len(data) + 1) for cut in cuts), len(data)]
    for start, end in itertools.pairwise(edges):
        reader.feed(data[start:end])
    decoded = reader.close()
    assert (decoded.events, decoded.skipped) == _reference_decode(data)


def test_the_reader_keeps_an_event_with_blanks_around_it_and_counts_the_rest():
    data = b' {"e":"done"}\n{"e":"done"} x\n\n{"e":"begin","n":"a"}\n{"e":"done"'
    decoded = event_reader.decode_events(data)
    assert decoded.events == [{"e": "done"}]
    assert decoded.skipped == 3  # extra data, a begin without its fields, the torn last line (not the blank one)


# ---- valid results -------------------------------------------------------------------------

NAMES = st.text(string.ascii_letters + "._<>", min_size=1, max_size=12)
SITES = st.builds(Site, TEXT, st.integers(0, 10_000), NAMES, TEXT)
STACKS = st.lists(SITES, max_size=3).map(tuple)
CULPRITS = st.builds(
    Culprit,
    module=st.none() | NAMES,
    chain=st.lists(NAMES, max_size=3).map(tuple),
    site=st.none() | SITES,
    stack=STACKS,
    phase=st.sampled_from(["startup", "import", "main", "thread", "shutdown"]),
    thread=TEXT,
    evidence=st.sampled_from(["driver-hook", "trace", "state-probe"]),
    module_site=st.none() | SITES,
    thread_started_at=st.none() | SITES,
    stack_dropped=st.integers(0, 5),
    context=st.none() | TEXT,
)
DRIVERS = st.builds(
    DriverInfo, st.sampled_from(["real", "simulated", "none"]), NAMES, st.none() | TEXT, st.lists(TEXT).map(tuple)
)
PIDS = st.integers(1, 2**22)
SAWS = st.builds(
    ChildSaw,
    st.lists(st.builds(DriverRefusal, NAMES, st.integers(0, 999), st.none() | SITES, STACKS), max_size=2).map(tuple),
    st.none() | TEXT,
    st.none() | st.integers(-64, 255),
    st.booleans(),
)
STARTS = st.builds(
    ProcessStart,
    st.sampled_from(["fork", "forkserver", "spawn", "subprocess"]),
    st.none() | PIDS,
    STACKS,
    st.booleans(),
    st.none() | st.lists(TEXT, max_size=3).map(tuple),
    st.none() | TEXT,
)
RECORDS = st.builds(
    ProcessRecord,
    PIDS,
    st.none() | PIDS,
    st.lists(TEXT, max_size=3).map(tuple),
    st.none() | CULPRITS,
    st.lists(STARTS, max_size=2).map(tuple),
    st.sampled_from(["exec", "fork"]),
    st.none() | SAWS,
)
FINDINGS = st.builds(
    Finding,
    st.sampled_from(["poisoned-fork", "cuda-initialized"]),
    PIDS,
    st.none() | PIDS,
    STACKS,
    st.none() | CULPRITS,
    st.none() | st.sampled_from(["fork", "forkserver"]),
    st.none() | SAWS,
    st.none() | TEXT,
)
RUNS = st.builds(
    RunResult,
    st.lists(TEXT, min_size=1, max_size=3).map(tuple),
    st.none() | st.integers(-64, 255),
    DRIVERS,
    st.lists(RECORDS, max_size=2).map(tuple),
    st.lists(FINDINGS, max_size=2).map(tuple),
    st.sampled_from(["poisoned-fork", "initializes-cuda", "clean", "unknown"]),
    st.lists(TEXT, max_size=2).map(tuple),
    st.booleans(),
    st.floats(0, 1e6),
    st.none() | TEXT,
    st.none() | TEXT,
)
SCANS = st.builds(
    ScanResult,
    targets=st.lists(NAMES, max_size=2).map(tuple),
    status=st.sampled_from(["ok", "import-error", "crashed", "timeout", "exited", "channel-lost"]),
    driver=DRIVERS,
    cuda_initialized=st.booleans(),
    modules=st.lists(
        st.builds(ImportNode, NAMES, st.none() | NAMES, st.none() | TEXT, st.floats(0, 10), st.floats(0, 10)),
        max_size=2,
    ).map(tuple),
    culprits=st.lists(CULPRITS, max_size=1).map(tuple),
    startup=st.builds(StartupInfo, st.booleans(), st.integers(0, 99), st.floats(0, 10)),
    error=st.none() | st.builds(TargetFailure, NAMES, TEXT, TEXT, st.none() | TEXT, st.none() | st.integers(0, 99)),
    stdout=TEXT,
)
REPLAYS = st.builds(
    ReplayResult,
    NAMES,
    st.lists(TEXT, max_size=2).map(tuple),
    st.sampled_from(["cuinit", "ctypes", "torch"]),
    st.sampled_from(["fork", "spawn", "forkserver"]),
    DRIVERS,
    st.sampled_from(["ok", "failed", "setup-error", "channel-lost"]),
    st.none() | st.builds(ParentState, st.booleans(), st.none() | st.integers(-1, 3)),
    st.none()
    | st.builds(
        ChildOutcome,
        st.sampled_from(["ok", "failed", "crashed"]),
        st.none() | st.integers(-9, 9),
        driver_calls=st.lists(st.builds(DriverCall, NAMES, st.integers(0, 999), NAMES), max_size=2).map(tuple),
    ),
)
BISECTS = st.builds(
    BisectResult,
    NAMES,
    NAMES,
    NAMES,
    st.none() | NAMES,
    TEXT,
    st.lists(TEXT, max_size=2).map(tuple),
    st.none() | CULPRITS,
    st.lists(st.builds(BisectStep, NAMES, NAMES, NAMES), max_size=2).map(tuple),
)
NAME_LISTS = st.lists(NAMES, max_size=3).map(tuple)
SWEEP_ROWS = st.builds(
    SweepRow,
    module=NAMES,
    status=st.sampled_from(["ok", "import-error", "crashed", "timeout", "error"]),
    cuda_initialized=st.booleans(),
    culprit=st.none() | CULPRITS,
    import_s=st.floats(0, 1e6),
    error=TEXT,
    started=FINITE,
    finished=FINITE,
    verdict=st.none() | st.sampled_from(list(Verdict)),
    cuda_source=st.sampled_from(CUDA_SOURCES),
    mode=st.sampled_from(SWEEP_MODES),
    preloaded=st.booleans(),
    fingerprint=TEXT,
    deps=st.lists(TEXT, max_size=3).map(tuple),
)
SWEEPS = st.builds(
    SweepResult,
    NAMES,
    st.lists(SWEEP_ROWS, max_size=3).map(tuple),
    st.integers(0, 99),
    st.floats(0, 1e6),
    st.sampled_from(SWEEP_MODES),
    NAME_LISTS,
    TEXT,
    st.integers(0, 99),
    st.lists(TEXT, max_size=2).map(tuple),
)
EDGES = st.lists(st.tuples(NAMES, NAMES), max_size=2).map(tuple)
DIFFS = st.builds(ScanDiff, SCANS, SCANS, NAME_LISTS, NAME_LISTS, EDGES, EDGES, st.none() | st.tuples(NAMES, NAMES))

RESULTS: list[tuple[type[Any], Any]] = [
    (RunResult, RUNS),
    (ScanResult, SCANS),
    (ReplayResult, REPLAYS),
    (BisectResult, BISECTS),
    (SweepRow, SWEEP_ROWS),
    (SweepResult, SWEEPS),
    (ScanDiff, DIFFS),
]


@pytest.mark.parametrize(("kind", "strategy"), RESULTS, ids=[kind.__name__ for kind, _ in RESULTS])
def test_every_result_round_trips(kind, strategy):
    @FAST
    @given(strategy)
    def check(result):
        document = json.loads(json.dumps(result.to_json()))
        assert kind.from_json(document) == result

    check()


@pytest.mark.parametrize(("kind", "strategy"), RESULTS, ids=[kind.__name__ for kind, _ in RESULTS])
def test_every_result_is_written_as_the_standard_indented_json(kind, strategy):
    @FAST
    @given(strategy)
    def check(result):
        document = result.to_json()
        assert json_text(document) == json.dumps(document, indent=2, sort_keys=True)

    check()


ANY_FLOAT = st.floats(width=64)  # NaN and the infinities too, which json writes as NaN and Infinity
NESTED = st.recursive(
    st.none() | st.booleans() | st.integers() | ANY_FLOAT | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)


@FAST
@given(NESTED)
def test_any_document_is_written_as_the_standard_indented_json(document):
    assert json_text(document) == json.dumps(document, indent=2, sort_keys=True)


@pytest.mark.parametrize(
    "document",
    [
        {1: "a", 2: [3, {}]},
        {"a": {1.5: None}},
        {"a": (1, 2)},
        [{"x": True}, {"y": []}, [[]]],
        {"a": {"b": {"c": 1.5}}},
        [],
        {},
        "x",
        3,
    ],
    ids=["int-keys", "float-key-inside", "tuple", "empty-items", "deep", "empty-list", "empty-dict", "text", "number"],
)
def test_a_document_of_other_shapes_is_written_as_json_dumps_writes_it(document):
    assert json_text(document) == json.dumps(document, indent=2, sort_keys=True)


def test_a_circular_document_is_refused_as_json_dumps_refuses_it():
    document: dict[str, Any] = {"a": [1]}
    document["a"].append(document)
    with pytest.raises(ValueError, match="Circular reference"):
        json_text(document)


def test_a_comparison_round_trips():
    @FAST
    @given(st.lists(st.tuples(st.sampled_from(["before", "after"]), REPLAYS), max_size=3).map(tuple))
    def check(runs):
        comparison = ReplayComparison("pkg", runs)
        assert ReplayComparison.from_json(json.loads(json.dumps(comparison.to_json()))) == comparison

    check()


# ---- arbitrary documents ---------------------------------------------------------------------

READERS = [
    RunResult,
    ScanResult,
    ReplayResult,
    ReplayComparison,
    BisectResult,
    Culprit,
    ProcessRecord,
    Finding,
    SweepRow,
    SweepResult,
    ScanDiff,
]


@pytest.mark.parametrize("kind", READERS, ids=[kind.__name__ for kind in READERS])
def test_an_arbitrary_document_reads_or_raises_schema_error(kind):
    schema = getattr(kind, "SCHEMA", "") or getattr(kind, "_SCHEMA_NAME", "")

    @FAST
    @given(JSON, st.booleans())
    def check(document, stamped):
        if stamped and isinstance(document, dict) and schema:
            document = {**document, "schema": schema}
        with contextlib.suppress(SchemaError):
            kind.from_json(document)

    check()


def _schema_error(kind: Any, document: Any) -> SchemaError | None:
    """The error reading ``document`` raised, or None when it read."""
    try:
        kind.from_json(document)
    except SchemaError as error:
        return error
    return None


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            paths += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths += _paths(item, (*prefix, index))
    return paths


def _replaced(document: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = json.loads(json.dumps(document))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return copy


@pytest.mark.parametrize(("kind", "strategy"), RESULTS, ids=[kind.__name__ for kind, _ in RESULTS])
def test_a_corrupted_field_reads_or_is_named(kind, strategy):
    @FAST
    @given(strategy, st.data(), JSON)
    def check(result, data, new):
        document = json.loads(json.dumps(result.to_json()))
        path = data.draw(st.sampled_from([p for p in _paths(document) if p != ("schema",)]))
        corrupted = _replaced(document, path, new)
        error = _schema_error(kind, corrupted)
        if error is not None:
            assert error.field, error
            assert str(error.field).split(".")[0].split("[")[0] == path[0], (error.field, path)

    check()


def test_a_bad_run_document_names_the_field():
    document = json.loads(json.dumps(RunResult(("x",), 0, DriverInfo("none"), (), (), "clean").to_json()))
    document["processes"] = [{"pid": "10", "parent": None, "argv": [], "cuinit": None}]
    with pytest.raises(SchemaError, match=r"processes\[0\]\.pid"):
        RunResult.from_json(document)
    del document["processes"]
    document["verdict"] = "maybe"
    with pytest.raises(SchemaError, match="verdict"):
        RunResult.from_json(document)
    with pytest.raises(SchemaError, match="replay"):
        ReplayResult.from_json({"schema": "diagtools.replay/1", "target": 5})
    with pytest.raises(SchemaError, match="target"):
        ReplayResult.from_json({"schema": "diagtools.replay/1", "target": 5})
    with pytest.raises(SchemaError, match="first_bad"):
        BisectResult.from_json({"schema": "diagtools.bisect/1", "target": "t", "good": "a", "bad": "b", "first_bad": 3})


OLD_ROW = {"module": "pkg.a", "status": "ok", "cuda_initialized": True, "culprit": None, "import_s": 0.5}


def test_a_sweep_row_of_an_older_version_reads_with_todays_defaults():
    row = SweepRow.from_json(OLD_ROW)
    assert (row.cuda_source, row.verdict, row.mode, row.deps) == ("self", Verdict.INITIALIZES_CUDA, "fresh", ())
    clean = SweepRow.from_json({"module": "pkg.b", "status": "import-error", "cuda_initialized": False})
    assert (clean.cuda_source, clean.verdict, clean.culprit, clean.import_s) == ("none", Verdict.UNKNOWN, None, 0.0)


def test_a_bad_sweep_or_diff_document_names_the_field():
    with pytest.raises(SchemaError, match=r"diagtools\.sweep/1 document: cuda_initialized must be true or false"):
        SweepRow.from_json({**OLD_ROW, "cuda_initialized": "yes"})
    with pytest.raises(SchemaError, match="cuda_source must be one of"):
        SweepRow.from_json({**OLD_ROW, "cuda_source": "elsewhere"})
    with pytest.raises(SchemaError, match=r"deps\[1\] must be a string"):
        SweepRow.from_json({**OLD_ROW, "deps": ["a.py", 3]})
    with pytest.raises(SchemaError, match=r"rows\[0\]\.module is missing"):
        SweepResult.from_json({"schema": "diagtools.sweep/1", "package": "pkg", "rows": [{"status": "ok"}]})
    scan = ScanResult(("pkg",), "ok", DriverInfo("simulated"), False).to_json()
    with pytest.raises(SchemaError, match=r"broken_edge must be a list of 2 items"):
        ScanDiff.from_json(
            {"schema": "diagtools.diff/1", "before": scan, "after": scan, "removed_modules": [], "added_modules": [],
             "removed_edges": [], "added_edges": [], "broken_edge": ["a"]}
        )  # fmt: skip


def test_a_bad_journal_row_is_a_one_line_error_naming_line_and_field(tmp_path):
    from diagtools.errors import UsageError
    from diagtools.usecases.sweep_journal import Journal

    path = tmp_path / "sweep.jsonl"
    header = {"schema": "diagtools.sweep/1", "package": "pkg", "paths": []}
    path.write_text(json.dumps(header) + "\n" + json.dumps({**OLD_ROW, "import_s": "slow"}) + "\n")
    with Journal(path, "pkg", ()) as journal, pytest.raises(UsageError) as caught:
        journal.valid_rows(None)  # type: ignore[arg-type]  # the bad row fails before any fingerprint is taken
    message = str(caught.value)
    assert "\n" not in message
    assert f"{path}:2 is not a diagtools.sweep/1 row: import_s must be a finite number" in message


# ---- presentation in IPython -----------------------------------------------------------------


def test_results_print_as_their_text_report_in_ipython():
    pretty = require("IPython.lib.pretty", "notebook").pretty

    run = RunResult(("python", "app.py"), 0, DriverInfo("none"), (), (), "clean")
    assert pretty(run) == str(run)
    assert pretty(run).startswith("diagtools run: python app.py")
    scan = ScanResult(("pkg",), "ok", DriverInfo("simulated"), False)
    assert pretty(scan) == str(scan)
    assert pretty(scan).startswith("diagtools scan pkg")
    bisect = BisectResult("pkg", "a" * 40, "b" * 40, None, "", (), None, (), ("c" * 40,))
    assert pretty(bisect).startswith("diagtools bisect pkg")
    for kind in (ScanDiff, SweepResult):
        assert "_repr_pretty_" in vars(kind)


def _datetime_iso(epoch: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@FAST
@given(
    st.one_of(
        st.floats(min_value=1e-6, max_value=4e9, allow_nan=False, allow_infinity=False),
        # fractions that round up to the next second, or sit on a half microsecond
        st.integers(1, 4_000_000_000).map(lambda s: s + 0.9999995),
        st.integers(1, 4_000_000_000).map(lambda s: s + 0.0000005),
    )
)
def test_timestamps_read_as_datetime_writes_them(epoch):
    from diagtools.model.common import iso_time

    assert iso_time(epoch) == _datetime_iso(epoch)
    assert iso_time(0) == ""


def test_a_sweep_rows_status_is_the_scan_status_enum_and_a_stray_word_is_refused():
    row = SweepRow.from_json({"module": "m", "status": "error", "cuda_initialized": False, "culprit": None})
    assert row.status is ScanStatus.ERROR
    assert row.verdict is Verdict.UNKNOWN
    assert SweepRow("m", "timeout", False, None, 0.0).status is ScanStatus.TIMEOUT
    with pytest.raises(SchemaError, match="status"):
        SweepRow.from_json({"module": "m", "status": "fine", "cuda_initialized": False, "culprit": None})
