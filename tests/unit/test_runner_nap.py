"""The runner's nap: when it may leave workers' messages unread, and what still wakes it.

The policy is read off the runner's own state (no processes); the wake-up test uses the
runner's real signal pipe and a real signal, and no sleeps: the nap it would take is hours.
"""

from __future__ import annotations

import os
import signal
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest

from renderctl.runner import NAP_MAX_S, STOP_SIGNALS, Runner
from renderctl.settings import RunnerSettings
from renderctl.store import Queue


def worker(*, running: bool = True, queued: int = 0, retiring: bool = False) -> SimpleNamespace:
    return SimpleNamespace(current=object() if running else None,
                           queued=deque(object() for _ in range(queued)), retiring=retiring)


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    r = Runner(Queue(tmp_path / "q"), RunnerSettings(workers=2))
    r._avg_exec = 0.004  # as after a few 4 ms jobs
    return r


def test_naps_only_while_every_worker_has_a_job_queued_behind_its_running_one(
        runner: Runner) -> None:
    runner.workers = {0: worker(queued=3), 1: worker(queued=2)}  # type: ignore[dict-item]
    # The shortest queue bounds it: half of what that worker has left to do.
    assert runner._nap() == pytest.approx(2 * 0.004 / 2)

    runner.workers[1] = worker(queued=0)  # type: ignore[assignment]
    assert runner._nap() == 0.0  # it may need a job as soon as its current one ends

    runner.workers[1] = worker(running=False, queued=0)  # type: ignore[assignment]
    assert runner._nap() == 0.0


def test_a_retiring_worker_does_not_hold_the_others_awake(runner: Runner) -> None:
    runner.workers = {0: worker(queued=2), 1: worker(queued=0, retiring=True)}  # type: ignore
    assert runner._nap() == pytest.approx(2 * 0.004 / 2)


def test_no_nap_before_job_times_are_known_or_once_stopping(runner: Runner) -> None:
    runner.workers = {0: worker(queued=3), 1: worker(queued=3)}  # type: ignore[dict-item]
    runner._avg_exec = 0.0
    assert runner._nap() == 0.0
    runner._avg_exec = 0.004
    runner.stop_signal = signal.SIGTERM
    assert runner._nap() == 0.0


def test_a_nap_is_short_even_behind_long_queued_jobs(runner: Runner) -> None:
    # (`--prefetch 4` with minute-long jobs): a start or a result is never read much later
    runner.workers = {0: worker(queued=3), 1: worker(queued=3)}  # type: ignore[dict-item]
    runner._avg_exec = 60.0
    assert runner._nap() == NAP_MAX_S <= 0.05


def test_a_signal_ends_a_nap_at_once(runner: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    # Queues that allow a 30 s nap (the cap raised to allow it); a cancel request (SIGUSR1)
    # must not wait for it to end.
    monkeypatch.setattr("renderctl.runner.NAP_MAX_S", 3600.0)
    runner.workers = {0: worker(queued=3), 1: worker(queued=3)}  # type: ignore[dict-item]
    runner._avg_exec = 20.0
    assert runner._nap() == pytest.approx(30.0)
    # Every handler _install_signals sets: one left behind (SIGQUIT's, say) would outlive
    # this test, and a Ctrl-\ at the pytest run would call a dead runner's handler.
    touched = (*STOP_SIGNALS, signal.SIGTSTP, signal.SIGUSR1)
    saved = {s: signal.getsignal(s) for s in touched}
    runner._install_signals()
    try:
        runner.wake_cancel = False
        os.kill(os.getpid(), signal.SIGUSR1)  # handled before _wait polls: its byte waits
        t0 = time.monotonic()
        runner._wait(None)
        assert time.monotonic() - t0 < 10
        assert runner.wake_cancel
    finally:
        signal.set_wakeup_fd(-1)
        for s, h in saved.items():
            signal.signal(s, h)
        for fd in (runner._wake_r, runner._wake_w):
            os.close(fd)
