"""Operations other processes perform on a queue a runner may be serving: cancel."""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from renderctl.errors import Interrupted, QueueIOError, UserError, os_error_message
from renderctl.lifecycle import State
from renderctl.manifest import is_job_id
from renderctl.store import CANCEL_BATCH, JobRecord, Queue, TakenPending

WAKE_EVERY_S = 0.005


@dataclass(frozen=True)
class CancelResult:
    """What `cancel` did for one id."""

    job_id: str
    outcome: str  # cancelled | cancel requested | already <state> | not found


def cancel_jobs(q: Queue, job_ids: Sequence[str], *,
                crash_hook: Callable[[str], None] | None = None) -> list[CancelResult]:
    """Cancel each job: pending at once; running via the runner (or directly if none runs).

    A queue that cannot be used (its folder removed, unwritable) raises ``QueueIOError``,
    as a submit does; the ids before the one that failed are cancelled (those of its
    batch of pending ones, moved to cancelled/ but perhaps not yet durable, may be either)."""
    if isinstance(job_ids, str | bytes):
        # Each character would be an id: cancel_jobs(q, "inv-1") cancelled "i", "n", ...
        raise UserError(f"cancel_jobs() takes a list of ids, got the string {job_ids!r}; "
                        "put it in a list")
    try:
        # Named first: a cancel killed between taking jobs from pending/ and settling them
        # leaves them in cancelled/ unsettled (no reason, no event, not synced); the next
        # open of the queue finishes what this names (Queue.settle_interrupted_cancels).
        intent = q.note_cancels([j for j in job_ids if is_job_id(j)])
        results = _cancel_jobs(q, job_ids, crash_hook=crash_hook)
        q.forget_cancels(intent)
        return results
    except OSError as exc:
        raise QueueIOError(os_error_message(exc)) from exc


def _cancel_jobs(q: Queue, job_ids: Sequence[str], *,
                 crash_hook: Callable[[str], None] | None = None) -> list[CancelResult]:
    results: list[CancelResult] = []
    # Pending jobs are taken out of pending/ one by one, in order, and settled (made durable
    # and logged) CANCEL_BATCH at a time, one sync each: reported only once settled.
    taken: list[TakenPending] = []

    def settle() -> None:
        q.settle_cancelled(taken, crash_hook=crash_hook)
        taken.clear()

    # The runner acts on requests when woken (or at its next poll). Woken as requests are
    # made, not once after the last id: a long list took 1.3 s, and a job prefetched into a
    # worker whose request was among the first started and published meanwhile. At most
    # one wake-up per WAKE_EVERY_S: each makes the runner list every open request.
    unwoken = False
    last_wake = -math.inf
    # A runner may be waiting for nothing but a job we cancel here (its retry's backoff).
    ended_pending = False

    def wake(*, now: bool = False) -> None:
        nonlocal unwoken, last_wake
        unwoken = True
        t = time.monotonic()
        if now or t - last_wake >= WAKE_EVERY_S:
            q.signal_runner(signal.SIGUSR1)
            unwoken, last_wake = False, t

    try:
        for jid in job_ids:
            if q.stop_signal() is not None:
                break  # (the ids answered so far are the command's to report; no later one)
            if not is_job_id(jid):
                # No job has it (a web tier passing on a request's id): not a path to try.
                results.append(CancelResult(jid, "not found"))
                continue
            if crash_hook is not None:
                crash_hook("cancel:before")
            took = q.take_pending(jid)
            if took is not None:
                taken.append(took)
                ended_pending = True
                results.append(CancelResult(jid, "cancelled"))
                if len(taken) >= CANCEL_BATCH:
                    settle()
                continue
            view = q.find(jid)
            if view is None:
                results.append(CancelResult(jid, "not found"))
            elif view.state is State.RUNNING:
                with q.try_runner_lock() as no_runner:
                    # Looked at again under the lock: a runner may have moved it since.
                    orphan = q.find(jid) if no_runner else None
                    if orphan is not None and orphan.state is State.RUNNING:
                        # The holder is gone: nobody else will act on the request, so settle
                        # the orphan ourselves while holding the lock a new runner would need.
                        results.append(_cancel_orphan(q, orphan.record))
                        continue
                q.request_cancel(jid)
                wake()
                results.append(CancelResult(jid, "cancel requested"))
            elif view.state is State.PENDING:
                # Claimed and returned between our two looks: try once more.
                ok = q.cancel_pending(jid)
                results.append(CancelResult(jid, "cancelled" if ok else "cancel requested"))
                if not ok:
                    q.request_cancel(jid)
                    wake()
            else:
                results.append(CancelResult(jid, f"already {view.state.value}"))
    except Interrupted:
        pass  # a lock waited for ended on the stop: the ids before it are answered
    if q.stop_signal() is not None:
        # The stop is obeyed: what was taken is settled now, whatever waits it meets.
        q.stop_requested = None
    settle()
    if unwoken or ended_pending:
        wake(now=True)
    return results


def _cancel_orphan(q: Queue, rec: JobRecord) -> CancelResult:
    """Cancel a job its dead runner left in running/, judged as recovery judges it: if its
    output is published and its own, it completed and the cancel came too late; otherwise
    it is cancelled, with the attempt the runner died in (if it had started) on record."""
    # Lazily: it brings psutil (~9 ms), which the usual cancel (a runner alive) never needs.
    from renderctl.recovery import (
        apply_verdicts,
        cancelled_orphan,
        judge_orphan,
        kill_stale_workers,
        released_tokens,
        started_tokens,
    )

    kill_stale_workers(q)
    now = q.clock.wall()
    orphan = judge_orphan(rec, started=started_tokens(q), now=now,
                          released=released_tokens(q))
    if orphan.done is not None:
        tmps = [orphan.published_tmp] if orphan.published_tmp is not None else []
        apply_verdicts(q, [orphan.done], tmps, logged_after="jobs completed")
        return CancelResult(rec.spec.id, f"already {State.DONE.value}")
    # (Cancelled once durable, whatever the event log says: review DP, exit 74 for it.)
    apply_verdicts(q, [cancelled_orphan(rec, orphan, now)], [], logged_after="jobs cancelled")
    return CancelResult(rec.spec.id, "cancelled")
