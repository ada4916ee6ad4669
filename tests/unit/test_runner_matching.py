"""A worker's answers name the assignment (its RunJob.seq), and the runner matches on that.

Read off the runner's own state (no processes): a worker is a handle with its queue, and
its messages are handed to ``Runner._on_message`` in the order a real worker sends them.
The real-process race (cancel, then replace, in the same worker) is in
tests/integration/test_races_cancel.py."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from renderctl.lifecycle import Outcome
from renderctl.messages import DropKind, Dropped, Finished, Started
from renderctl.runner import Assignment, Runner, WorkerHandle
from renderctl.settings import RunnerSettings
from renderctl.store import Queue


class Events:
    def __init__(self) -> None:
        self.seen: list[Mapping[str, Any]] = []

    def event(self, ev: Mapping[str, Any]) -> None:
        self.seen.append(ev)

    def tick(self, runner: Runner) -> None:
        pass


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def kills() -> list[Outcome]:
    """The reasons the runner killed a worker for (no process is signalled)."""
    return []


@pytest.fixture
def runner(tmp_path: Path, events: Events, kills: list[Outcome],
           monkeypatch: pytest.MonkeyPatch) -> Runner:
    r = Runner(Queue(tmp_path / "q"), RunnerSettings(workers=1), reporter=events)
    monkeypatch.setattr(r, "_kill", lambda w, reason, **kw: kills.append(reason))
    return r


def handle() -> WorkerHandle:
    return WorkerHandle(index=0, proc=None, conn=None, slot=None, gate=None,  # type: ignore
                        started_log="", pid=4242, pgid=4242)


def assign(w: WorkerHandle, job_id: str, token: str) -> Assignment:
    """``job_id`` queued in ``w`` as the runner's _send queues it: the next number."""
    claim = SimpleNamespace(job_id=job_id, lease=SimpleNamespace(token=token, attempt=1))
    a = Assignment(claim=claim, final=Path("x.pdf"), tmp=Path(".x.tmp"),  # type: ignore
                   output_kind="file", memory_mb=100, seq=w.assigned_total + 1)
    w.queued.append(a)
    w.assigned_total += 1
    return a


def test_a_late_drop_of_a_job_taken_back_does_not_take_its_new_assignment(
        runner: Runner, kills: list[Outcome]) -> None:
    # Given j1 and j2 taken back from a worker (it will answer each with Dropped), and j2
    # sent back to the same worker before the runner read the answer about it
    w = handle()
    assign(w, "j1", "t1")
    assign(w, "j2", "t2")
    w.queued.clear()  # _take_back
    again = assign(w, "j2", "t2")

    # When the worker's answers about the old assignments come in, then it starts the new
    runner._on_message(w, Dropped((1,), DropKind.SKIP, "taken back"))
    runner._on_message(w, Dropped((2,), DropKind.SKIP, "taken back"))
    assert list(w.queued) == [again] and not runner.ready
    runner._on_message(w, Started("j2", "t2", seq=again.seq, wall=0.0))

    # Then that start is supervised: j2 runs, once, where the runner sent it
    assert w.current is again and not w.queued and not runner.ready
    assert kills == []


def test_a_start_of_an_assignment_the_runner_does_not_hold_kills_the_worker(
        runner: Runner, events: Events, kills: list[Outcome]) -> None:
    # Given a worker with x queued as its second assignment
    w = handle()
    w.assigned_total = 1
    x = assign(w, "x", "tx")

    # When it says it started an assignment the runner neither holds nor cancelled
    runner._on_message(w, Started("y", "ty", seq=1, wall=0.0))

    # Then the worker is killed (the job runs unwatched otherwise), and what it holds is
    # released, not charged, at its death
    assert kills == [Outcome.RELEASED]
    assert w.unsupervised and w.kill_target is None and list(w.queued) == [x]
    assert [e["event"] for e in events.seen] == ["worker_unsupervised"]
    assert events.seen[0]["job"] == "y"


def test_a_start_of_an_assignment_whose_cancel_was_asked_kills_it_as_cancelled(
        runner: Runner, kills: list[Outcome]) -> None:
    # Given x queued, its cancel asked once the worker had started it (its gate said so:
    # it stays queued, marked, rather than being recorded as never started; audit DM)
    w = handle()
    x = assign(w, "x", "tx")
    x.cancel_requested = True

    # When the worker's Started for it arrives
    runner._on_message(w, Started("x", "tx", seq=x.seq, wall=0.0))

    # Then it is the worker's job, killed as cancelled (its attempt recorded as such)
    assert kills == [Outcome.CANCELLED]
    assert w.current is x and not w.unsupervised


@pytest.mark.parametrize("kind", [DropKind.RETIRE, DropKind.ABOVE_CEILING, DropKind.LEAKED])
def test_a_worker_that_handed_its_jobs_back_to_retire_is_sent_none_of_them_again(
        runner: Runner, monkeypatch: pytest.MonkeyPatch, kind: DropKind) -> None:
    # Given the runner's one worker holding j1 and j2, neither started
    w = handle()
    w.started_any = True
    runner.workers[0] = w
    assign(w, "j1", "t1")
    assign(w, "j2", "t2")
    sent: list[str] = []
    monkeypatch.setattr(runner, "_send", lambda w, a: sent.append(a.claim.job_id))

    # When it hands them back because it is leaving (its fork server died, its slot holds
    # too much), then the runner dispatches what is ready
    runner._on_message(w, Dropped((1, 2), kind, "leaving"))
    runner._dispatch_ready(2)

    # Then they wait for another worker (its successor): sent back to the leaving one,
    # they waited for its death, up to RETIRE_BOUND_S, each resend counted as one of its
    # jobs (audit DW)
    assert sent == []
    assert [a.claim.job_id for a in runner.ready] == ["j1", "j2"]


def test_a_result_read_after_the_stop_grace_killed_its_job_is_the_jobs_own(
        runner: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a worker running j1 in a run being stopped whose grace has run out
    w = handle()
    w.slot = SimpleNamespace(pids=list, peak_bytes=lambda: None)  # type: ignore[assignment]
    runner.workers[0] = w
    j1 = assign(w, "j1", "t1")
    j1.claim.record = SimpleNamespace(spec=SimpleNamespace(inputs=()))  # type: ignore[attr-defined]
    runner._on_message(w, Started("j1", "t1", seq=j1.seq, wall=0.0))
    monkeypatch.setattr(runner, "_kill", Runner._kill.__get__(runner))  # the real one
    monkeypatch.setattr(Runner, "_kill_now", staticmethod(lambda w: None))  # (no process)
    monkeypatch.setattr(runner, "_tell", lambda w, msg: None)
    recorded: list[tuple[str, str]] = []
    monkeypatch.setattr(runner, "_complete", lambda a, fin: recorded.append((a.job_id,
                                                                             fin.outcome)))
    runner.stop_signal, runner.stop_deadline = 15, 0.0

    # When the drain kills it (released, uncharged), and then reads the result the worker
    # had sent just before: the job completed, its output checked
    runner._drain(1.0)
    assert w.kill_reason is Outcome.RELEASED
    runner._on_message(w, Finished("j1", "t1", Outcome.COMPLETED.value, 0.5, seq=j1.seq))

    # Then that result is recorded: "released" threw the checked output away and ran the
    # job again at the next start (audit DW)
    assert recorded == [("j1", "completed")]


def test_quick_failures_do_not_size_the_prefetch_depth(runner: Runner) -> None:
    # Given a run whose first results are attempts that failed at once (1 ms each)
    for _ in range(9):
        runner._observe_exec(0.001, sizing=False)

    # Then the depth stays at one job per worker: a failing job says nothing of how long
    # the others take (they made it 32, and jobs of seconds were sent 16 deep behind one
    # another, a retry come due waiting behind them all; audit EJ)
    assert runner._prefetch_depth() == 1

    # While completed jobs that quick, and failures that took long, do size it
    for _ in range(3):
        runner._observe_exec(0.001)
    assert runner._prefetch_depth() == 32
    runner._observe_exec(0.5, sizing=False)
    assert runner._prefetch_depth() == 1
