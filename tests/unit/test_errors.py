"""The CLI's exit codes and the interrupts: one enum, one base class, one signal-to-status rule."""

from __future__ import annotations

import pickle
import signal

import pytest

from diagtools.errors import ExitCode, Interrupted, SweepInterrupted, Terminated
from diagtools.usecases.run import RunInterrupted


def test_exit_codes_are_named_and_a_signal_gives_128_plus_its_number():
    assert [int(code) for code in ExitCode] == [0, 1, 2, 3, 127]
    assert ExitCode.for_signal(signal.SIGINT) == 130
    assert ExitCode.for_signal(signal.SIGTERM) == 143
    assert ExitCode.for_signal(signal.SIGHUP) == 129


@pytest.mark.parametrize(
    ("stopped", "code"),
    [
        (Interrupted(), 130),
        (Terminated(signal.SIGTERM), 143),
        (Terminated(signal.SIGHUP), 129),
        (SweepInterrupted("partial", signal.SIGTERM), 143),
        (SweepInterrupted("partial"), 130),
        (RunInterrupted(signal.SIGINT, None), 130),  # type: ignore[arg-type]
    ],
)
def test_every_interrupt_is_one_kind_with_one_exit_code_rule(stopped, code):
    assert isinstance(stopped, Interrupted)
    assert isinstance(stopped, KeyboardInterrupt)  # code that stops on Ctrl-C still stops
    assert stopped.exit_code == code


def test_a_sweep_interrupt_crosses_a_process_boundary_with_what_it_had():
    copied = pickle.loads(pickle.dumps(SweepInterrupted("partial", signal.SIGHUP)))
    assert (copied.result, copied.signum, copied.exit_code) == ("partial", signal.SIGHUP, 129)
