"""How `run` tells its story on a pipe: one plain line per event, or JSON Lines."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from renderctl.cli.console import (
    Stdout,
    dumps,
    err,
    human_bytes,
    human_duration,
    one_line,
)
from renderctl.errors import os_error_message
from renderctl.runner import Runner, RunSummary

# Events printed in plain mode; the rest (claimed, started) would drown the useful lines.
PLAIN_EVENTS = frozenset({"completed", "retry", "dead", "cancelled", "expired", "released",
                          "recovered", "fenced", "runner_started", "stopping", "corrupt",
                          "halted", "suspended", "resumed", "worker_start_timeout",
                          "worker_unresponsive", "worker_unsupervised"})


class Lines:
    """`run`'s lines on stdout. While stdout takes no more now (a terminal's Ctrl-S, until
    Ctrl-Q; a terminal or a full pipe whose reader is slow, stalled or paused: `| less` not
    scrolled), they are held, in order, and written once it takes them again: a write would
    wait, and the runner's whole loop with it (no timeout, cancel or memory check). What a
    write began and could not finish waits in ``out`` (see console.Stdout); a dashboard
    draws through the same ``out``, after the lines."""

    HOLD_MAX = 100_000  # lines (~15 MB); past it, wait for the reader after all

    def __init__(self, out: Stdout | None = None) -> None:
        self.out = out if out is not None else Stdout()
        self.held: deque[str] = deque()
        self.lost: OSError | None = None  # stdout failed (a full disk): later lines are lost
        self.dropped = 0  # the oldest lines let go, held past HOLD_MAX in the background

    @property
    def waiting(self) -> bool:
        """Whether anything written is not all out yet."""
        return bool(self.held or self.out.pending)

    def write(self, text: str) -> None:
        self.held.append(text)
        if len(self.held) > self.HOLD_MAX and self.out.room.stops_writer():
            # In the background under `stty tostop` (hours of a --follow run), waiting for
            # room would have the kernel stop the run, its jobs left unwatched until `fg`:
            # the oldest line goes instead, and a note says how many did.
            self.held.popleft()
            self.dropped += 1
            return
        self.flush(wait=len(self.held) > self.HOLD_MAX)

    def flush(self, *, wait: bool = False) -> None:
        """Write what is held, as far as stdout takes it now (all of it: ``wait``)."""
        if self.dropped and self.held and (wait or self.out.room()):
            err(f"note: {self.dropped} earlier line(s) were dropped while the run was in "
                f"the background (over {self.HOLD_MAX:,} held); the queue and its "
                "events.jsonl have every outcome")
            self.dropped = 0
        try:
            # Lines move to ``out`` only once it has written the last ones: held here, they
            # are what the background's HOLD_MAX counts and drops.
            if self.out.drain(wait=wait) and self.held and (wait or self.out.room()):
                self.out.write("".join(self.held))
                self.held.clear()
                self.out.drain(wait=wait)
        except OSError as exc:
            # stdout cannot take more (`> log` on a full disk, a quota): the lines are
            # lost, not the outcomes, which the queue keeps. Raised into the runner's
            # loop, it ended the run and left the running jobs to be charged `crashed`.
            self.lost = exc
            self.discard()
            err(f"warning: cannot write stdout ({os_error_message(exc)}); the run's "
                "lines from here on are lost, not its jobs (every outcome is in the "
                "queue and its events.jsonl); it will exit 74")

    def discard(self) -> None:
        """Drop what is held and what comes: stdout cannot take it, or is not waited for."""
        self.held.clear()
        self.out.discard()


class _LinesReporter:
    """A reporter that writes lines (held while stdout takes no more: see Lines)."""

    def __init__(self, lines: Lines) -> None:
        self.lines = lines

    def tick(self, runner: Runner) -> None:
        self.lines.flush()


class PlainReporter(_LinesReporter):
    """One line per state change, no colour; `--quiet` keeps only failures."""

    def __init__(self, lines: Lines, *, quiet: bool = False) -> None:
        super().__init__(lines)
        self.quiet = quiet

    def event(self, ev: Mapping[str, Any]) -> None:
        name = ev.get("event")
        if name not in PLAIN_EVENTS:
            return
        if self.quiet and name in ("completed", "runner_started", "recovered", "released"):
            return
        self.lines.write(format_event(ev) + "\n")


def format_event(ev: Mapping[str, Any]) -> str:
    name = ev.get("event")
    if name == "runner_started":
        return (f"runner started: pid {ev['pid']}, {ev['workers']} worker(s), memory guard "
                f"{ev['guard']}, budget {ev['budget_mb']} MB, {ev['pending']} pending")
    if name == "corrupt":
        return (f"corrupt   {one_line(ev['file'])}: {one_line(ev['reason'])}; moved to "
                f"corrupt/{one_line(ev['moved_to'])} (kept, not run)")
    if name == "suspended":
        return (f"suspended (SIGTSTP): {ev['running']} running job(s) paused with the run; "
                f"`fg` or `kill -CONT {ev['pid']}` resumes")
    if name == "resumed":
        return f"resumed   after {human_duration(ev['paused_s'])} (not counted against timeouts)"
    if name == "worker_start_timeout":
        return (f"worker    pid {ev['worker']} not ready {human_duration(ev['timeout_s'])} after "
                "its start: killed (a failed start; five in a row halt the run)")
    if name == "worker_unresponsive":
        waited = human_duration(ev["timeout_s"])
        return (f"worker    pid {ev['worker']} held {len(ev['jobs'])} job(s) for {waited} "
                "without starting one (stopped? hung?): killed; they run elsewhere, uncharged")
    if name == "worker_unsupervised":
        return (f"worker    pid {ev['worker']} started {one_line(str(ev['job']))} unasked (an "
                "attempt the runner did not hold): killed; its jobs run elsewhere, uncharged")
    if name == "halted":
        return f"halted    {one_line(ev['reason'])}"
    if name == "stopping" and ev.get("again"):
        return (f"stopping on {ev['signal']} again: the grace is skipped; {ev['running']} running"
                " job(s) killed now and returned to pending uncharged")
    if name == "stopping" and ev["signal"] == "SIGQUIT":
        return (f"stopping on SIGQUIT: no new jobs; {ev['running']} running job(s) killed now "
                "and returned to pending uncharged (SIGQUIT again quits at once)")
    if name == "stopping":
        return (f"stopping on {ev['signal']}: no new jobs; {ev['running']} running job(s) get "
                f"{ev['grace_s']:g}s to finish (signal again to skip)")
    parts = [f"{name:<9}", str(ev.get("job"))]
    if ev.get("attempt") is not None:
        parts.append(f"attempt={ev['attempt']}")
    if ev.get("outcome") and ev.get("outcome") != "completed":
        parts.append(f"outcome={ev['outcome']}")
    if ev.get("elapsed_s") is not None:
        parts.append(human_duration(ev["elapsed_s"]))
    if ev.get("paused_s"):
        parts.append(f"(paused {human_duration(ev['paused_s'])})")
    if ev.get("peak_memory_bytes"):
        parts.append(f"peak={human_bytes(ev['peak_memory_bytes'])}")
    if ev.get("output"):
        parts.append(one_line(ev["output"]))
    if name == "retry" and ev.get("retry_at"):
        parts.append(f"retry in {human_duration(max(0.0, ev['retry_at'] - time.time()))}")
    # A job's exception text may span lines (a traceback, a tool's stderr): one event is
    # one line on a pipe, so it is escaped there; --json keeps it whole.
    if ev.get("error"):
        parts.append(f"error: {one_line(ev['error'])}")
    elif ev.get("reason") and name != "completed":
        parts.append(f"({one_line(ev['reason'])})")
    if name == "recovered":
        parts.append(f"-> {ev.get('state')}")
    return " ".join(parts)


class JsonReporter(_LinesReporter):
    """JSON Lines: one object per state change (schema in the README)."""

    def event(self, ev: Mapping[str, Any]) -> None:
        self.lines.write(dumps({"ts": round(time.time(), 6), **ev}) + "\n")


def summary_line(s: RunSummary) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in s.counts.items())
    n = sum(s.counts.values())
    per_job = f" ({s.runner_cpu_s / n * 1000:.2f} ms/job)" if n else ""
    return (f"summary: {counts}; {s.wall_s:.1f}s wall, {s.jobs_per_s:.1f} jobs/s; "
            f"runner CPU {s.runner_cpu_s:.2f}s{per_job}; exit {int(s.exit_code)}")


def summary_json(s: RunSummary) -> dict[str, Any]:
    return {"event": "summary", "counts": dict(s.counts), "wall_s": round(s.wall_s, 3),
            "jobs_per_s": round(s.jobs_per_s, 3), "exit_code": int(s.exit_code),
            "guard": s.guard, "workers": s.workers, "runner_cpu_s": round(s.runner_cpu_s, 3)}
