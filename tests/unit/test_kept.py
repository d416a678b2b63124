"""The one keeper client: its status parser, its read bounds, shared by scan, run and the zygote."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from diagtools import protocol
from diagtools.runner import kept as keeper_client
from diagtools.runner.kept import bounded_lines, start_kept
from diagtools.runner.watch import read_records

DONE = b'{"e":"done"}\n'


def test_a_record_file_is_read_to_the_channels_bound_and_the_rest_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(keeper_client, "CHANNEL_LIMIT", len(DONE) * 3 + 5)
    path = tmp_path / "records.jsonl"
    path.write_bytes(DONE * 10 + b"torn")
    data, dropped = bounded_lines(path)
    assert data == DONE * 3
    assert dropped == 7  # the seven whole lines past the bound; the torn tail is no line


def test_a_file_within_the_bound_is_read_whole(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_bytes(DONE * 3)
    assert bounded_lines(path) == (DONE * 3, 0)
    assert bounded_lines(tmp_path / "missing") == (b"", 0)


def test_run_records_past_the_bound_count_as_skipped_as_a_subkernels_channel_does(tmp_path, monkeypatch):
    monkeypatch.setattr(keeper_client, "CHANNEL_LIMIT", len(DONE) * 2)
    (tmp_path / "41-a.jsonl").write_bytes(DONE * 5)
    records = read_records(tmp_path)
    assert records.files == (({"e": "done"},) * 2,)
    assert records.skipped == 3


def test_the_keeper_reports_pid_and_exit_through_the_client():
    kept = start_kept([sys.executable, "-c", "raise SystemExit(7)"], stdout=subprocess.DEVNULL)
    try:
        assert kept.pid is not None
        assert kept.wait(20)  # the keeper leaves once the command and its tree are gone
    finally:
        code = kept.release()
    assert (code, kept.reported, kept.ended, kept.swept) == (7, 7, True, True)
    assert kept.release() == 7  # a second release only answers


def test_a_command_that_cannot_start_is_an_error_not_an_exit_code(tmp_path):
    kept = start_kept([str(tmp_path / "no-such-program")], stderr=subprocess.DEVNULL)
    code = kept.release()
    assert code is None
    assert kept.reported == 127
    assert kept.error
    assert "No such file" in kept.error
    assert kept.never_kept() is None  # the keeper ran and said why


def test_abort_all_ends_every_kept_tree_of_this_process():
    kept = start_kept([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL)
    try:
        keeper_client.abort_all()
        assert kept.wait(20)
    finally:
        kept.release()
    assert kept.reported == -9


SHOW_FDS = (
    "import os, json\n"
    "names = ('DIAGTOOLS_CHANNEL_FD', 'DIAGTOOLS_DUMP_FD')\n"
    "fds = [int(os.environ[name]) for name in names]\n"
    "print(json.dumps([fds, [os.get_inheritable(fd) for fd in fds], [os.fstat(fd).st_ino for fd in fds]]))\n"
)


@pytest.mark.parametrize("soft_limit", [None, 256])
def test_the_keeper_puts_the_channel_and_dump_high_where_the_protocol_says(tmp_path, soft_limit):
    """One rule for private descriptors: the keeper moves them with the protocol's own ``move_high``."""
    out = tmp_path / "out"
    channel_r, channel_w = os.pipe()
    dump = os.memfd_create("dump", 0)

    def low_limit():
        if soft_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft_limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    with out.open("wb") as sink:
        kept = start_kept(
            [sys.executable, "-c", SHOW_FDS],
            stdout=sink,
            channel=channel_w,
            dump=dump,
            popen=lambda *a, **k: subprocess.Popen(*a, **k, preexec_fn=low_limit),  # noqa: PLW1509
        )
        try:
            assert kept.wait(20)
        finally:
            kept.release()
    (channel_fd, dump_fd), inheritable, inodes = json.loads(out.read_text())
    assert (channel_fd, dump_fd) == (protocol.HIGH_FD, protocol.HIGH_FD + 1)
    assert inheritable == [True, True]  # the target's own files: it hands them to nothing by accident, but has them
    assert inodes == [os.fstat(channel_w).st_ino, os.fstat(dump).st_ino]
    for fd in (channel_r, channel_w, dump):
        os.close(fd)
