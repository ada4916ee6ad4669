"""`renderctl top`: the dashboard of a queue that another process runs.

Fed by the runner's ``runner.state.json`` (rewritten each second), ``Queue.status()`` for
the folder counts and, when no runner is alive, the running records and ``events.jsonl``
for the last failures. No runner holding the lock (``Queue.runner_info()`` is None) is said
plainly; the counts are still shown, the retries are counted from the log when it was read
whole ("-" otherwise), and with nothing running the output root is that of the job the log
spoke of last.
"""

from __future__ import annotations

import signal
from collections import deque
from typing import Any

from rich.console import Console
from rich.live import Live

from renderctl.cli.console import write_out
from renderctl.cli.dashboard import dashboard_lines, redraw, render_dashboard
from renderctl.cli.views import holder_dead, runner_json
from renderctl.metrics import read_runner_state
from renderctl.proctree import suspend_self
from renderctl.store import Queue, QueueStatus

FAILURE_EVENTS = ("dead", "retry", "cancelled", "expired")
TAIL_BYTES = 1 << 20
# The folders are listed again only after this many times what their last listing took:
# done/ holds every job until pruned, and listing 300,000 records each half-second frame
# kept a core busy beside the renders (`top` <= ~10% of one, the counts that much later).
STATUS_COST_FACTOR = 10


class TopFeed:
    """Builds dashboard snapshots of a queue from what its runner leaves on disk."""

    def __init__(self, queue: Queue) -> None:
        self.q = queue
        # Only the last failures are shown: the log's tail has them (it grows ~340 bytes a
        # job, so whole it can be hundreds of MB; 1 MB is the last ~3,000 jobs).
        self.offset = queue.events.tail_offset(TAIL_BYTES)
        self.failures: deque[dict[str, Any]] = deque(maxlen=5)
        # The queue's retries, when no runner counts this run's: known only if the whole
        # log is read (None: shown as "-", not as a count of its tail).
        self.retries: int | None = 0 if self.offset == 0 else None
        self.last_job: str | None = None  # of the log's latest event naming a job
        self._root: tuple[str, str | None] | None = None  # (job id, its output root)
        self._status: tuple[bool, QueueStatus] | None = None  # (runner's age?, the figures)
        self._status_due = 0.0  # monotonic: when the folders may be listed again

    def _tail_failures(self) -> None:
        events, self.offset = self.q.events.read(offset=self.offset)
        for ev in events:
            if isinstance(ev.get("job"), str):
                self.last_job = ev["job"]
            if ev.get("event") == "retry" and self.retries is not None:
                self.retries += 1
            if ev.get("event") in FAILURE_EVENTS and (ev.get("error") or ev.get("outcome")
                                                      or ev.get("event") == "expired"):
                self.failures.append(ev)

    def _last_root(self) -> str | None:
        """The output root of the job the log spoke of last: with nothing running, the
        best cheap guess at where this queue's outputs go (one record read per new job)."""
        jid = self.last_job
        if jid is None:
            return None
        if self._root is None or self._root[0] != jid:
            view = self.q.find(jid)
            self._root = (jid, view.record.spec.out_root if view is not None else None)
        return self._root[1]

    def _folders(self, from_runner: bool) -> QueueStatus:
        """The folders' figures, listed again once STATUS_COST_FACTOR times their last
        listing has passed (or the runner came or went: whose oldest pending age to show)."""
        now = self.q.clock.monotonic()
        if self._status is None or self._status[0] != from_runner or now >= self._status_due:
            st = self.q.status(oldest_pending=not from_runner)
            took = self.q.clock.monotonic() - now
            self._status, self._status_due = (from_runner, st), now + STATUS_COST_FACTOR * took
        return self._status[1]

    def snapshot(self) -> dict[str, Any]:
        state = read_runner_state(self.q)
        # A runner's snapshot has the oldest pending age from its index: the folder's
        # would stat every pending record each frame (~0.3 s at 100,000 pending).
        from_runner = "oldest_pending_age_s" in (state or {})
        st = self._folders(from_runner)
        self._tail_failures()
        snap: dict[str, Any] = dict(state or {})
        now = self.q.clock.wall()
        snap["queue"] = str(self.q.path)
        snap["runner_alive"] = state is not None
        if state is not None:
            # Stopped (Ctrl-Z, SIGSTOP), it writes no snapshot: the last one stays, frozen.
            info = runner_json(self.q.runner_info())
            snap["runner_suspended"] = bool(info and info.get("stopped"))
            if info and "pid" not in snap:
                # Alive, not yet through its first snapshot (its first second, or stopped
                # within it): its pid from the lock's holder record, not "pid -".
                snap["pid"] = info.get("pid")
        snap["queue_counts"] = dict(st.counts)
        if not from_runner:
            snap["oldest_pending_age_s"] = st.oldest_pending_age_s
        snap["dead_depth"] = st.counts.get("dead", 0)
        roots = {r.spec.out_root for r in st.running}
        snap["out_root"] = ", ".join(sorted(roots)) if roots else self._last_root()
        if state is None:
            snap["retries"] = self.retries
        if "running" not in (state or {}) and st.running:
            # No runner snapshot (none alive, or not written yet): the leases tell enough,
            # except the worker: a lease names its runner, whose pid is not a worker's.
            # (Only then: a runner's snapshot that caught no job mid-run is right, and
            # every lease would list its prefetched claims as running: audit BC.)
            # A job whose runner is dead says so, as `status` does: its time against its
            # timeout kept growing as if it ran (audit DV).
            alive: dict[Any, bool | None] = {}
            snap["running"] = [
                {"id": r.spec.id, "kind": r.spec.kind, "pid": None,
                 "attempt": r.lease.attempt if r.lease else None,
                 "elapsed_s": max(0.0, now - r.lease.claimed_at) if r.lease else None,
                 "timeout_s": r.spec.timeout_s, "memory_bytes": None,
                 "memory_limit_bytes": r.spec.memory_mb * 1024 * 1024,
                 "orphaned": holder_dead(r, alive)}
                for r in st.running]
        if not snap.get("recent_failures"):
            snap["recent_failures"] = list(self.failures)
        snap.setdefault("counts", {})
        return snap


def run_top(queue: Queue, console: Console, *, once: bool, interval_s: float = 0.5) -> None:
    """Redraw until Ctrl-C (or once); returns normally either way."""
    feed = TopFeed(queue)
    if not console.is_terminal or console.is_dumb_terminal:
        # Plain lines, as `status` prints on a pipe: a frame would be boxes cut to 80 columns.
        # (A dumb terminal cannot redraw: a live view would show nothing until it stopped.)
        write_out("\n".join(dashboard_lines(feed.snapshot())) + "\n")
        return
    if once:
        console.print(render_dashboard(feed.snapshot(), width=console.width))
        return
    # SIGTERM ends `top` as quietly as Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # Ctrl-Z is taken between frames (blocked, and waited for in place of the sleep), so
    # the live view is left whole, its cursor shown, before the shell gets the terminal. (An
    # exception raised from a handler could land inside Live.start() and leave it half set.)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTSTP})
    try:
        while True:
            with Live(console=console, auto_refresh=False, transient=False,
                      redirect_stdout=False, redirect_stderr=False) as live:
                width = None  # (a new live view, below what is on the screen)
                while True:
                    # As the run's dashboard: from a cleared screen after a width change
                    width = redraw(live, console,
                                   render_dashboard(feed.snapshot(), width=console.width,
                                                    height=console.height, console=console),
                                   width)
                    # A display refresh period, not a wait on a condition
                    if signal.sigtimedwait({signal.SIGTSTP}, interval_s) is not None:
                        break
            suspend_self()  # `fg` draws a fresh live view below the shell's lines
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        # The live view's last writes failed on a terminal that is gone, as a stop signal's
        # exit left it (SIGHUP: the window closed; EIO since): the signal's exit stands,
        # not "I/O error" (74), which tells a script the queue is at fault (audit CN).
        stop = exc.__context__
        if isinstance(stop, SystemExit):
            raise stop from None
        if not isinstance(stop, KeyboardInterrupt):
            raise
