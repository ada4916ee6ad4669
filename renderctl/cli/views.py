"""Rendering `status` and `show`, as rich tables on a terminal, plain lines otherwise."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from renderctl import proctree
from renderctl.cli.console import (
    human_bytes,
    human_duration,
    no_controls,
    one_line,
    plain,
    table_width,
)
from renderctl.errors import text_lines
from renderctl.lifecycle import State
from renderctl.store import JobView, Queue, QueueStatus

STATUS_SCHEMA_VERSION = 1
# `show`: lines of an earlier attempt's stderr and traceback tails (the last one's: all kept).
EARLIER_TAIL_LINES = 5


def holder_dead(r: Any, alive: dict[Any, bool | None]) -> bool | None:
    """Whether the runner holding the lease of the running record ``r`` is dead (the next
    run recovers the job); None where that cannot be told (another host, no start time).
    ``alive`` keeps each holder's verdict for the records after."""
    h = r.lease.holder if r.lease is not None else None
    if h is None or h.start_time is None:
        return None
    if h not in alive:
        alive[h] = proctree.holder_alive(host=h.host, boot_id=h.boot_id, pid=h.pid,
                                         start_time=h.start_time)
    return None if alive[h] is None else not alive[h]


def status_json(q: Queue, st: QueueStatus) -> dict[str, Any]:
    """`status --json`: stable schema; counts for every state at top level."""
    now = q.clock.wall()
    # Which claims a worker has started (its started log), and when: a job claimed and
    # queued behind another in a worker is running/ too, and timed from its claim it looked
    # like a fifth job running under a budget for four (audit DM).
    started: dict[str, float | None] = {}
    if st.running:
        from renderctl.recovery import started_tokens

        started = started_tokens(q, last_bytes=4096)

    alive: dict[Any, bool | None] = {}

    def orphaned(r: Any) -> bool | None:
        return holder_dead(r, alive)

    def timing(r: Any) -> dict[str, Any]:
        """Whether the job's attempt started, and its time since (or since its claim)."""
        if r.lease is None:
            return {"started": False, "elapsed_s": None}
        token = r.lease.token
        began = (started[token] or r.lease.claimed_at) if token in started else None
        return {"started": began is not None,
                "elapsed_s": max(0.0, now - (began or r.lease.claimed_at))}

    return {
        "schema": STATUS_SCHEMA_VERSION,
        "queue": str(q.path),
        **{s.value: st.counts[s.value] for s in State},
        "corrupt": st.corrupt,
        "oldest_pending_age_s": st.oldest_pending_age_s,
        "runner": runner_json(st.runner),
        "memory_guard": memory_guard(st),
        "running_jobs": [
            {"id": r.spec.id, "kind": r.spec.kind,
             "attempt": r.lease.attempt if r.lease else None,
             "holder_pid": r.lease.holder.pid if r.lease else None,
             "orphaned": orphaned(r),
             **timing(r),
             "memory_mb": r.spec.memory_mb, "timeout_s": r.spec.timeout_s}
            for r in st.running
        ],
    }


def runner_json(runner: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The holder record, with ``stopped``: whether the runner is stopped (Ctrl-Z, SIGSTOP:
    its jobs are paused with it, or, after a bare SIGSTOP, run on unwatched); null where
    that cannot be told (another host)."""
    if not runner:
        return None if runner is None else {}
    stopped = None
    with contextlib.suppress(KeyError, TypeError, ValueError):
        if proctree.holder_alive(host=runner["host"], boot_id=runner["boot_id"],
                                 pid=int(runner["pid"]), start_time=int(runner["start_time"])):
            stopped = proctree.is_stopped(int(runner["pid"]))
    return {**runner, "stopped": stopped}


def memory_guard(st: QueueStatus) -> str:
    """The guard the live runner uses, else the one a runner started now would use."""
    if st.runner and st.runner.get("guard"):
        return str(st.runner["guard"])
    from renderctl.guards import available_memory_guard

    try:
        return available_memory_guard()
    except OSError:
        return "sampling"


def render_status(c: Console, q: Queue, st: QueueStatus) -> None:
    data = status_json(q, st)
    runner = data["runner"]
    pid = runner.get("pid") if runner else None
    stopped = (f" (stopped: `fg` in its shell or `kill -CONT {pid}` resumes it)"
               if runner and runner["stopped"] else "")
    runner_line = (f"runner pid {pid} on {runner.get('host')}{stopped}, memory guard "
                   f"{data['memory_guard']}" if runner
                   else f"no runner (memory guard here: {data['memory_guard']})")
    states = [s.value for s in State]
    counts = [(s, str(data[s])) for s in states] + [("corrupt", str(st.corrupt))]
    # holder_pid, as --json names it: the runner holding the lease, not the worker (`top`
    # shows the worker's pid; a bare "pid" read as either).
    running_lines = [f"running {j['id']} kind={j['kind']} attempt={j['attempt'] or '-'} "
                     f"elapsed={_elapsed(j)} holder_pid={j['holder_pid'] or '-'}"
                     + (" (its runner is dead: the next run recovers it)" if j["orphaned"]
                        else "")
                     for j in data["running_jobs"]]
    if plain():
        print(f"queue {no_controls(str(q.path))}: "
              + " ".join(f"{k}={v}" for k, v in counts))
        print(f"oldest pending: {human_duration(st.oldest_pending_age_s)}; {runner_line}")
        for line in running_lines:
            print(line)
        return
    # Text, not str: rich would read "[...]" in a folder's name as markup. A table wider
    # than the terminal would be cut ("pe…"): its lines instead, which wrap.
    if table_width(counts) <= c.width:
        c.print(Text(f"queue {no_controls(str(q.path))}"))
        t = Table(show_header=True)
        for name, _ in counts:
            t.add_column(name, justify="right")
        t.add_row(*[n for _, n in counts])
        c.print(t)
    else:
        c.print(Text(f"queue {no_controls(str(q.path))}: "
                     + " ".join(f"{k}={v}" for k, v in counts)))
    c.print(Text(f"oldest pending: {human_duration(st.oldest_pending_age_s)}; {runner_line}"))
    if not data["running_jobs"]:
        return
    lost = sum(1 for j in data["running_jobs"] if j["orphaned"])
    if lost:
        c.print(Text(f"{lost} running job(s) held by a runner that is dead: the next "
                     "`renderctl run` recovers them"))
    columns = ("id", "kind", "attempt", "elapsed", "timeout", "ceiling")
    rows = [(str(j["id"]), str(j["kind"]), str(j["attempt"] or "-"), _elapsed(j),
             human_duration(j["timeout_s"]), f"{j['memory_mb']} MB")
            for j in data["running_jobs"]]
    if table_width(zip(columns, *rows, strict=True)) > c.width:
        for line in running_lines:
            c.print(Text(line))
        return
    rt = Table(title="running")
    for col in columns:
        rt.add_column(col)
    for row in rows:
        rt.add_row(*map(Text, row))
    c.print(rt)


def _elapsed(job: Mapping[str, Any]) -> str:
    """A running job's time since it started, or "queued": claimed, queued in a worker
    behind its running job (prefetch), not started."""
    return human_duration(job["elapsed_s"]) if job["started"] else "queued"


def show_json(view: JobView) -> dict[str, Any]:
    rec = view.record
    return {
        "id": rec.spec.id,
        "state": view.state.value,
        "spec": rec.spec.to_json(),
        "accepted_at": rec.accepted_at,
        "attempts": [dict(a) for a in rec.attempts],
        "lease": rec.lease.to_json() if rec.lease else None,
        "result": dict(rec.result) if rec.result else None,
        "reason": rec.reason,
        "not_before": rec.not_before or None,
        "file": str(view.path),
    }


def _ts(t: float | None) -> str:
    if not t:
        return "-"
    try:
        return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
    except (OverflowError, ValueError, OSError):
        # Past the year 9999 (`--backoff-base 1e300` schedules a retry there) or not a
        # time at all (a hand-edited record): `show` ended in a traceback.
        return f"{t:g} (epoch seconds)"


def render_job(c: Console, view: JobView) -> None:
    rec = view.record
    lines = [
        f"job {rec.spec.id}: {view.state.value}"
        + (f" ({one_line(rec.reason)})" if rec.reason else ""),
        f"  kind {rec.spec.kind}; output {one_line(rec.spec.output_path)}",
        f"  accepted {_ts(rec.accepted_at)}; ceiling {rec.spec.memory_mb} MB; "
        f"timeout {human_duration(rec.spec.timeout_s)}; max attempts {rec.spec.max_attempts}"
        + (f"; deadline {_ts(rec.spec.deadline)}" if rec.spec.deadline else ""),
    ]
    if view.state is State.PENDING and rec.not_before > time.time():
        # Waiting out a retry's backoff: why a pending job does not start, and until when.
        # (Not one past: a released job's is the moment of its release; audit FU.)
        lines.append(f"  next attempt not before {_ts(rec.not_before)}")
    if rec.result:
        r = rec.result
        n = r.get("pages")
        pages = f"{n} page{'' if n == 1 else 's'}, " if n is not None else ""  # not a PDF
        lines.append(f"  published {one_line(r.get('path'))} "
                     f"({human_bytes(r.get('bytes'))}, {pages}"
                     f"sha256 {str(r.get('sha256'))[:16]}...)")
    if rec.lease and view.state is State.RUNNING:
        lines.append(f"  lease: attempt {rec.lease.attempt}, holder pid {rec.lease.holder.pid} "
                     f"on {rec.lease.holder.host}, expires {_ts(rec.lease.expires_at)}")
    for a in rec.attempts:
        detail = [f"attempt {a.get('n')}: {a.get('outcome')}",
                  f"elapsed {human_duration(a.get('elapsed_s'))}"]
        if a.get("paused_s"):
            detail.append(f"of which paused {human_duration(a['paused_s'])} (Ctrl-Z)")
        if a.get("peak_memory_bytes"):
            detail.append(f"peak {human_bytes(a['peak_memory_bytes'])}")
        if a.get("exit_code") is not None:
            detail.append(f"exit {a['exit_code']}")
        if a.get("signal"):
            detail.append(f"signal {a['signal']}")
        lines.append("  " + ", ".join(detail))
        if a.get("error"):
            # A job's text may hold newlines and escape codes: shown, not obeyed.
            lines.append(f"    error: {one_line(a['error'])}")
        # The last attempt's tails whole (what an operator opens `show` for: audit EV, a
        # traceback shown not at all, 5 of 20 stderr lines without a word), earlier ones'
        # last lines; what is left out is said.
        last = a is rec.attempts[-1]
        for key, label in (("stderr_tail", "stderr"), ("traceback_tail", "traceback")):
            if a.get(key):
                tail = text_lines(str(a[key]))
                shown = tail if last else tail[-EARLIER_TAIL_LINES:]
                lines.append(f"    {label}"
                             + (f" (last {len(shown)} of {len(tail)} lines kept; --json has "
                                "them all)" if len(shown) < len(tail) else "") + ":")
                lines.extend(f"    | {ln.rstrip()}" for ln in shown)  # (indented: kept)
    # Every field of a hand-edited record may hold ESC or BEL (an attempt's outcome, the
    # lease's host): shown, not obeyed.
    lines = [no_controls(ln) for ln in lines]
    if plain():
        print("\n".join(lines))
    else:
        for ln in lines:
            c.print(ln, markup=False)
