"""Operations other processes perform on a queue a runner may be serving: cancel."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass, replace

from renderctl.lifecycle import State
from renderctl.store import Queue, Transition


@dataclass(frozen=True)
class CancelResult:
    """What `cancel` did for one id."""

    job_id: str
    outcome: str  # cancelled | cancel requested | already <state> | not found


def cancel_jobs(q: Queue, job_ids: Sequence[str]) -> list[CancelResult]:
    """Cancel each job: pending at once; running via the runner (or directly if none runs)."""
    results: list[CancelResult] = []
    wake = False
    for jid in job_ids:
        if q.cancel_pending(jid):
            results.append(CancelResult(jid, "cancelled"))
            continue
        view = q.find(jid)
        if view is None:
            results.append(CancelResult(jid, "not found"))
        elif view.state is State.RUNNING:
            with q.try_runner_lock() as no_runner:
                if no_runner:
                    # The holder is gone: nobody else will act on the request, so move the
                    # orphan ourselves while holding the lock a new runner would need.
                    now = q.clock.wall()
                    rec = replace(view.record, lease=None, reason="cancelled (no runner)",
                                  changed_at=now)
                    q.finish([Transition(rec, State.CANCELLED)])
                    results.append(CancelResult(jid, "cancelled"))
                    continue
            q.request_cancel(jid)
            wake = True
            results.append(CancelResult(jid, "cancel requested"))
        elif view.state is State.PENDING:
            # Claimed and returned between our two looks: try once more.
            ok = q.cancel_pending(jid)
            results.append(CancelResult(jid, "cancelled" if ok else "cancel requested"))
            if not ok:
                q.request_cancel(jid)
                wake = True
        else:
            results.append(CancelResult(jid, f"already {view.state.value}"))
    if wake:
        q.signal_runner(signal.SIGUSR1)  # wake its loop now rather than at its next poll
    return results
