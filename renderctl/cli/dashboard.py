"""The live dashboard of `run` (on a terminal) and `top`: one pure render function.

``render_dashboard(snapshot)`` turns the runner's snapshot (``Runner.snapshot()``, or
``runner.state.json`` read by `top`) into a rich renderable; it does no I/O, so tests feed it
a fixture dict. Optional keys beyond the runner's own: ``out_root``, ``runner_alive``
(False: `top` found no runner), ``runner_suspended`` (True: `top` found it stopped),
``queue_counts`` (folder counts), ``oldest_pending_age_s``,
``dead_depth``, ``in_flight`` (claimed jobs not yet finished, prefetched ones included);
``retries`` may be None (`top` without a runner could not count them: shown as "-").

``DashboardReporter`` drives a rich ``Live`` with ``auto_refresh=False``: the runner process
forks, so no thread may exist in it; frames are drawn from the runner's ``tick`` at most
``fps`` times a second, and a tick that is not due costs one clock read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.control import Control
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from renderctl.cli.console import (
    Room,
    Stdout,
    human_bytes,
    human_duration,
    no_controls,
    one_line,
    reader_gone,
    silence_stdout,
    table_width,
)

if TYPE_CHECKING:
    from renderctl.cli.reporters import Lines

MEMORY_WARN = 0.85  # share of the ceiling at which a job's memory bar turns red
TERMINAL = ("done", "dead", "cancelled", "expired")
DEFAULT_FPS = 4.0
MEMORY_BAR = 12  # the width of a running job's memory bar (a space follows it)
SLOW_INTERVAL_S = 2.0  # folder scans (dead-letter depth, oldest pending) at most this often


def _pct(p: Mapping[str, Any] | None) -> str:
    if not p:
        return "p50 -  p99 -"
    return f"p50 {human_duration(p.get('p50'))}  p99 {human_duration(p.get('p99'))}"


def _progress(snap: Mapping[str, Any]) -> tuple[int, int, int]:
    """(finished, remaining, total) of the batch this runner works on."""
    qc = snap.get("queue_counts")
    # With no runner there is no "this run": the whole queue is the batch. With one, the
    # runner's own figures, all of one instant: its finished count and the folders' later
    # pending count would add up to a batch that shrinks as its jobs finish.
    whole_queue = snap.get("runner_alive") is False or "pending_known" not in snap
    counts = (qc if qc and snap.get("runner_alive") is False else snap.get("counts")) or {}
    finished = sum(int(counts.get(s, 0)) for s in TERMINAL)
    if qc and whole_queue:
        remaining = int(qc.get("pending", 0)) + int(qc.get("running", 0))
    else:
        # in_flight: every job claimed and not finished, those waiting for a worker
        # (claimed_waiting) among them.
        in_flight = snap.get("in_flight")
        if in_flight is None:
            in_flight = (int(snap.get("claimed_waiting") or 0)
                         + len(snap.get("running") or ()))
        remaining = int(snap.get("pending_known") or 0) + int(in_flight)
    return finished, remaining, finished + remaining


def _header_rows(snap: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(label, text, style) of each header line, for the frame and its plain form alike."""
    # Escaped like a job's text: a folder named with an escape sequence (a title-setting
    # OSC, a screen clear) was sent to the terminal in every frame (audit BC).
    rows = [("queue", no_controls(str(snap.get("queue") or "-")), ""),
            ("output root", no_controls(str(snap.get("out_root") or "-")), "")]
    if snap.get("runner_alive") is False:
        rows.append(("runner", "no runner is alive for this queue (counts are from its "
                               "folders)", "bold yellow"))
        return rows
    alive, desired = snap.get("workers_alive", 0), snap.get("workers_desired", 0)
    # "stopped": the run's loop has ended (its last frame, which stays on the screen): its
    # workers are gone because it let them go, nothing to flag.
    ended = bool(snap.get("stopped"))
    pid = snap.get("pid", "-")
    if snap.get("runner_suspended"):
        rows.append(("runner", f"pid {pid} is STOPPED (Ctrl-Z, SIGSTOP): `fg` in its shell or "
                               f"`kill -CONT {pid}` resumes it; figures as it left them",
                     "bold yellow"))
    else:
        rows.append(("runner", f"pid {pid}, up {human_duration(snap.get('uptime_s'))}"
                     + (" - ended" if ended else " - STOPPING" if snap.get("stopping")
                        else ""), ""))
    rows += [
        ("workers", f"{alive}/{desired} alive",
         "yellow" if alive < desired and not ended else ""),
        ("memory guard", f"{snap.get('guard') or '-'}; budget {snap.get('budget_mb', '-')} MB",
         ""),
    ]
    return rows


def _header(snap: Mapping[str, Any]) -> Table:
    return _header_from(_header_rows(snap))


def _header_from(rows: Sequence[tuple[str, str, str]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, text, style in rows:
        grid.add_row(label, Text(text, style=style))
    return grid


def _progress_text(snap: Mapping[str, Any]) -> str:
    finished, remaining, total = _progress(snap)
    uptime = float(snap.get("uptime_s") or 0.0)
    rate = finished / uptime if uptime > 0 else 0.0
    if snap.get("stopped"):
        # The run's last frame: what it left pending is no longer coming (audit CN: "ETA
        # 2.1m" under "ended", after a Ctrl-C).
        eta = "-" if remaining else "0s"
    else:
        eta = human_duration(remaining / rate) if rate > 0 and remaining else (
            "-" if remaining else "0s")
    return f"{finished}/{total} jobs  {rate:.1f} jobs/s  ETA {eta}"


def _progress_row(snap: Mapping[str, Any], width: int) -> Table:
    finished, _, total = _progress(snap)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(width=max(10, width // 3))
    grid.add_column()
    grid.add_row(ProgressBar(total=max(total, 1), completed=finished if total else 0,
                             width=max(10, width // 3)),
                 _progress_text(snap))
    return grid


def _memory_cell(job: Mapping[str, Any]) -> RenderableType:
    used = job.get("memory_bytes")
    limit = job.get("memory_limit_bytes")
    if not limit:
        return Text(human_bytes(used))
    share = (used or 0) / limit
    hot = share >= MEMORY_WARN
    style = "red" if hot else "green"
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=MEMORY_BAR)
    grid.add_column()
    grid.add_row(ProgressBar(total=float(limit), completed=float(min(used or 0, limit)),
                             width=MEMORY_BAR, complete_style=style, finished_style=style),
                 Text(f"{human_bytes(used)}/{human_bytes(limit)}",
                      style="bold red" if hot else ""))
    return grid


RUNNING_COLUMNS = ("id", "kind", "worker pid", "attempt", "elapsed / timeout",
                   "memory / ceiling")


def _late(job: Mapping[str, Any]) -> bool:
    if job.get("orphaned"):
        return False
    elapsed, timeout = job.get("elapsed_s"), job.get("timeout_s")
    return bool(timeout) and (elapsed or 0) >= MEMORY_WARN * float(timeout or 0)


def _hot(job: Mapping[str, Any]) -> bool:
    limit = job.get("memory_limit_bytes") or 0
    return limit > 0 and (job.get("memory_bytes") or 0) / limit >= MEMORY_WARN


def _running_line(j: Mapping[str, Any]) -> str:
    """One running job on one line, as `top` prints it on a pipe."""
    memory = human_bytes(j.get("memory_bytes"))
    if j.get("memory_limit_bytes"):
        memory += f"/{human_bytes(j.get('memory_limit_bytes'))}"
    return (f"running {j.get('id')} kind={j.get('kind') or '-'} "
            f"worker_pid={j.get('pid') or '-'} attempt={j.get('attempt') or '-'} "
            f"elapsed={_elapsed(j, '/')} memory={memory}"
            + (f" ({ORPHANED})" if j.get("orphaned") else ""))


# A running record whose runner is dead (`top` with no runner alive): not running at all.
ORPHANED = "its runner is dead: the next run recovers it"


def _elapsed(j: Mapping[str, Any], sep: str) -> str:
    """Its time against its timeout; "orphaned" for one that is not running at all."""
    if j.get("orphaned"):
        return "orphaned"
    return f"{human_duration(j.get('elapsed_s'))}{sep}{human_duration(j.get('timeout_s'))}"


def _running(jobs: Sequence[Mapping[str, Any]], *, width: int = 120,
             limit: int = 20) -> RenderableType:
    shown = list(jobs)[:limit]
    rows = [(str(j.get("id")), str(j.get("kind") or "-"), str(j.get("pid") or "-"),
             str(j.get("attempt") or "-"),
             _elapsed(j, " / "),
             f"{human_bytes(j.get('memory_bytes'))}/{human_bytes(j.get('memory_limit_bytes'))}"
             if j.get("memory_limit_bytes") else human_bytes(j.get("memory_bytes")))
            for j in shown]
    # The memory cell's bar is not text: counted as as many spaces.
    measured = [(*row[:5], " " * (MEMORY_BAR + 1) * bool(j.get("memory_limit_bytes"))
                 + row[5]) for row, j in zip(rows, shown, strict=True)]
    more = f"... {len(jobs) - limit} more" if len(jobs) > limit else None
    title = f"running ({len(jobs)})"
    if table_width(zip(RUNNING_COLUMNS, *measured, strict=True)) > width:
        # Too narrow for the table (rich would cut every cell, or drop columns): a line
        # per job, which wraps whole, red when the job nears its timeout or ceiling.
        lines = [Text(title, style="italic")]
        lines += [Text(_running_line(j), style="red" if _late(j) or _hot(j) else "")
                  for j in shown]
        if more:
            lines.append(Text(more))
        return Group(*lines)
    t = Table(title=title, title_justify="left", expand=False)
    for col in RUNNING_COLUMNS:
        t.add_column(col, no_wrap=True)
    for row, j in zip(rows, shown, strict=True):
        t.add_row(*map(Text, row[:4]), Text(row[4], style="red" if _late(j) else ""),
                  _memory_cell(j))
    if more:
        t.add_row(more, "", "", "", "", "")
    return t


def _count_parts(snap: Mapping[str, Any]) -> tuple[str, dict[str, Any], Any]:
    """(whose counts, the count per state, dead-letter depth) of the counts lines."""
    counts = dict(snap.get("counts") or {})
    qc = snap.get("queue_counts")
    if qc:
        shown = {s: qc.get(s, 0) for s in ("pending", "running", *TERMINAL)}
        whose = "queue"
    else:
        # Pending: not started yet, those claimed already (prefetched into a worker,
        # waiting for one) included; they are in running/, but ran nowhere so far.
        shown = {"pending": int(snap.get("pending_known") or 0)
                 + int(snap.get("not_started") or 0),
                 # (Finished and waiting for the group commit too: still in running/
                 # until it, and left out they made the counts add up short of the
                 # progress line's total, by up to a batch; audit CN.)
                 "running": len(snap.get("running") or ())
                 + int(snap.get("finishing") or 0),
                 **{s: counts.get(s, 0) for s in TERMINAL}}
        whose = "this run"
    dead = snap.get("dead_depth")
    if dead is None:
        dead = (qc or counts).get("dead", 0)
    return whose, shown, dead


def _retries(snap: Mapping[str, Any]) -> str:
    """The retries count; "-" when ``retries`` is None (`top` could not count them)."""
    n = snap.get("retries", 0)
    return "-" if n is None else str(n)


class _Pairs:
    """A heading and "label count" pairs, two spaces apart, wrapped between pairs only (as
    Text, a narrow terminal broke the line between "retries" and its 0: audit DB)."""

    def __init__(self, head: Text, pairs: Sequence[Text], gap: int = 2) -> None:
        self.head, self.pairs, self.gap = head, pairs, gap

    def __rich_console__(self, console: Console, options: Any) -> Any:
        line = self.head.copy()
        for i, pair in enumerate(self.pairs):
            if i and line.cell_len + self.gap + pair.cell_len > options.max_width:
                yield line
                line = Text()
            elif i:
                line.append(" " * self.gap)
            line.append_text(pair)
        yield line


def _counts(snap: Mapping[str, Any]) -> RenderableType:
    whose, shown, dead = _count_parts(snap)
    pairs = [Text(f"{state} {n}",
                  style="bold red" if state in ("dead", "cancelled", "expired") and n else "")
             for state, n in shown.items()]
    pairs.append(Text(f"retries {_retries(snap)}"))
    depth = [Text(f"dead-letter depth {dead}", style="bold white on red" if dead else ""),
             Text(f"oldest pending {human_duration(snap.get('oldest_pending_age_s'))}")]
    return Group(_Pairs(Text(f"{whose}: ", style="bold"), pairs), _Pairs(Text(), depth, 3))


def _latency(snap: Mapping[str, Any]) -> _Pairs:
    wait, run = Text("accepted -> first attempt ", style="bold"), Text("execution ", style="bold")
    wait.append(_pct(snap.get("wait_s")))
    run.append(_pct(snap.get("exec_s")))
    return _Pairs(Text(), [wait, run], 4)


FAILURE_COLUMNS = ("id", "event", "attempt", "outcome", "cause")
MIN_CAUSE = 20


def _failure_parts(f: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
    # One line per failure (a multi-line exception escaped).
    return (str(f.get("job")), str(f.get("event") or "-"), str(f.get("attempt") or "-"),
            str(f.get("outcome") or "-"), one_line(f.get("error") or f.get("reason") or "-"))


def _failure_line(f: Mapping[str, Any]) -> str:
    """One failure on one line, as `top` prints it on a pipe."""
    job, event, attempt, outcome, cause = _failure_parts(f)
    return f"failure {job} event={event} attempt={attempt} outcome={outcome} cause={cause}"


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells of the terminal: a CJK character takes two, and
    cut by characters such a cause took twice the rows meant for it (audit BC). Cut in the
    middle: a cause's end is the telling part ("command exited with status 3: ... disk
    quota exceeded", the tool's own last line; cut at the end it was gone: audit EV)."""
    if cell_len(text) <= width:
        return text
    head = _cells(text, max(1, (width - 3) // 3))
    tail = _cells(text[::-1], width - 3 - cell_len(head))[::-1]
    return head + "..." + tail


def _cells(text: str, width: int) -> str:
    """The start of ``text`` in at most ``width`` cells, never padded (set_cell_size pads a
    wide character cut in half with a space, where a line then wrapped)."""
    n = 0
    for i, ch in enumerate(text):
        n += cell_len(ch)
        if n > width:
            return text[:i]
    return text


def _failures(fails: Sequence[Mapping[str, Any]], *, width: int) -> RenderableType:
    rows = [_failure_parts(f) for f in list(fails)[-5:]]
    fixed = table_width(zip(FAILURE_COLUMNS[:4], *(r[:4] for r in rows), strict=True))
    if fixed + MIN_CAUSE + 3 > width:
        # Too narrow for the table: a line per failure, cut to three rows of the terminal
        # (to no less of its cause than the table shows).
        lines = [Text("last failures", style="italic")]
        for f, row in zip(list(fails)[-5:], rows, strict=True):
            line = _failure_line(f)
            prefix = line[:len(line) - len(row[4])]
            lines.append(Text(prefix + _cut(row[4], max(MIN_CAUSE,
                                                        3 * width - 1 - cell_len(prefix)))))
        return Group(*lines)
    t = Table(title="last failures", title_justify="left", expand=False)
    for col in FAILURE_COLUMNS:
        t.add_column(col, no_wrap=col != "cause", overflow="fold")
    cause_w = max(MIN_CAUSE, width - fixed - 3)
    for job, event, attempt, outcome, cause in rows:
        # Text, not a str: rich would read "[...]" in a job's message as markup.
        t.add_row(Text(job), Text(event), Text(attempt), Text(outcome, style="red"),
                  Text(_cut(cause, cause_w)))
    return t


def redraw(live: Live, console: Console, frame: RenderableType, last_width: int | None) -> int:
    """Redraw ``live`` with ``frame``, from a cleared screen if the terminal's width is no
    longer ``last_width`` (that of the last frame; None: none drawn yet); the width now.

    Most terminals (tmux, VTE, iTerm2) reflow what they show to a new width: the last
    frame's lines wrap into more rows, or join, and rich, erasing as many rows as that frame
    had, left pieces of it above the new one (and then above the final frame)."""
    width = console.width
    if last_width not in (None, width):
        console.control(Control.home(), Control.clear())
        live._live_render._shape = None  # drawn from the top: nothing above to erase
    live.update(frame, refresh=True)
    return width


def render_dashboard(snapshot: Mapping[str, Any], *, width: int = 120,
                     height: int | None = None,
                     console: Console | None = None) -> RenderableType:
    """The whole dashboard for one snapshot; pure (no I/O), ``width`` sizes the bars.

    ``height`` (with the ``console`` it is drawn on): the terminal's rows. A frame taller is
    cut at the bottom (rich's Live), and what is cut must be what matters least: a 40x10
    pane showed the queue's path, the output root and the memory guard, and never the
    counts or the failures (audit EV). So the fixed header goes first (a runner that is not
    alive or is stopped keeps its line), then the latencies, then the running table (its
    count kept). The parts are drawn once, here, and the frame is those lines."""
    header = _header(snapshot)
    running = snapshot.get("running") or ()
    running_part: RenderableType = (_running(running, width=width) if running
                                    else Text("running: none", style="dim"))
    latency = _latency(snapshot)
    fails = snapshot.get("recent_failures") or ()
    parts: list[RenderableType] = [header, _progress_row(snapshot, width), running_part,
                                   _counts(snapshot), latency]
    if fails:
        parts.append(_failures(fails, width=width))
    if height is None or console is None:
        return Group(*parts)
    options = console.options.update(width=width, height=None)  # (set, it pads and crops)
    drawn = [console.render_lines(p, options, pad=False) for p in parts]
    room = height - 1  # (Live keeps the last row for its cursor)
    trouble = [row for row in _header_rows(snapshot) if row[0] == "runner" and row[2]]
    for drop, stand_in in (
            (header, _header_from(trouble) if trouble else None),
            (latency, None),
            (running_part, Text(f"running: {len(running)} (too few rows to list)",
                                style="dim") if running else None)):
        if sum(map(len, drawn)) <= room:
            break
        i = parts.index(drop)
        if stand_in is None:
            del parts[i], drawn[i]
        else:
            parts[i] = stand_in
            drawn[i] = console.render_lines(stand_in, options, pad=False)
    if fails and sum(map(len, drawn)) > room:
        # Still too tall (review ET: 29 rows for 15 at 40x16, rich's "..." cutting the
        # newest failures): the newest that fit, a line each.
        above = sum(map(len, drawn[:-1]))
        drawn[-1] = console.render_lines(
            _failures_compact(fails, width=width, rows=max(2, room - above)), options,
            pad=False)
    return _Drawn([line for lines in drawn for line in lines])


def _failures_compact(fails: Sequence[Mapping[str, Any]], *, width: int,
                      rows: int) -> RenderableType:
    """The last failures in ``rows`` rows: a heading, then the newest, one line each (its
    cause cut in the middle to fit)."""
    shown = list(fails)[-5:][-(rows - 1):]
    head = "last failures" + (f" (newest {len(shown)} of {min(5, len(fails))})"
                              if len(shown) < min(5, len(fails)) else "")
    lines = [Text(_cut(head, width), style="italic", no_wrap=True)]
    for f in shown:
        job, _, _, outcome, cause = _failure_parts(f)
        prefix = _cut(f"{job} {outcome}: ", max(8, width // 2))
        lines.append(Text(prefix + _cut(cause, max(8, width - cell_len(prefix))),
                          no_wrap=True, overflow="crop"))
    return Group(*lines)


class _Drawn:
    """Lines rendered already (``Console.render_lines``), drawn as they are."""

    def __init__(self, lines: list[list[Segment]]) -> None:
        self.lines = lines

    def __rich_console__(self, console: Console, options: Any) -> Any:
        newline = Segment.line()
        for line in self.lines:
            yield from line
            yield newline


def dashboard_lines(snapshot: Mapping[str, Any]) -> list[str]:
    """The dashboard's information as plain lines, for `top` on a pipe: no box drawing and
    nothing cut to a terminal's width (a script greps whole ids and pids), every running
    job and failure on one line of its own (a multi-line error escaped, as `status` and
    `dead list` do)."""
    lines = [f"{label} {text}" for label, text, _ in _header_rows(snapshot)]
    lines.append(f"progress {_progress_text(snapshot)}")
    running = snapshot.get("running") or ()
    if not running:
        lines.append("running: none")
    lines += [_running_line(j) for j in running]
    whose, shown, dead = _count_parts(snapshot)
    lines.append(f"{whose}: " + "  ".join(f"{state} {n}" for state, n in shown.items())
                 + f"  retries {_retries(snapshot)}")
    lines.append(f"dead-letter depth {dead}   oldest pending "
                 f"{human_duration(snapshot.get('oldest_pending_age_s'))}")
    lines.append(f"accepted -> first attempt {_pct(snapshot.get('wait_s'))}    "
                 f"execution {_pct(snapshot.get('exec_s'))}")
    lines += [_failure_line(f) for f in list(snapshot.get("recent_failures") or ())[-5:]]
    return lines


class DashboardReporter:
    """`run`'s live dashboard: a Reporter that redraws from ``tick`` at most ``fps`` a second."""

    def __init__(self, console: Console, *, out_root: str | None = None,
                 fps: float = DEFAULT_FPS, lines: Lines | None = None) -> None:
        self.console = console
        # What `run` wrote before the dashboard (its "accepted" line), perhaps still held
        # (see Lines): written before the dashboard draws below it.
        self.lines = lines
        self.out_root = out_root
        self.interval_s = 1.0 / fps
        self.live: Live | None = None
        self._due = 0.0
        self._slow_due = 0.0
        self._slow: dict[str, Any] = {}
        self.gone = False  # the terminal hung up: draw nothing more
        self._width: int | None = None  # the terminal's, when the last frame was drawn
        self._room = Room(console.file, foreground_only=True)  # (see tick)
        # What `run` draws through (see console.Stdout): a frame its terminal took only part
        # of is written out before the next one is drawn.
        file = console.file
        self._out = file if isinstance(file, Stdout) else None

    def _draw(self, draw: Any) -> None:
        """Draw, unless the terminal is gone. A closed terminal window or a dropped SSH
        session fails writes with EIO: the runner drains on the SIGHUP that came with it,
        and must not die of its display meanwhile (its jobs would be charged a crash)."""
        if self.gone or (self._out is not None and self._out.gone):
            return
        try:
            draw()
        except OSError as exc:
            if not reader_gone(exc):
                raise
            self.gone = True
            silence_stdout(self.console.file)

    def start(self) -> None:
        # No threads (auto_refresh=False) and no stdout redirection: the runner forks, and a
        # forked worker must not inherit a proxy that draws on our terminal.
        self.live = Live(console=self.console, auto_refresh=False, transient=False,
                         redirect_stdout=False, redirect_stderr=False)
        self.live.start()
        self._width = None  # a new dashboard below what is there: nothing to clear

    def event(self, ev: Mapping[str, Any]) -> None:
        if ev.get("event") == "suspended" and self.live is not None:
            # Give the shell its terminal back: the last frame stays, the cursor shows, and
            # the next tick draws a fresh dashboard below whatever the shell printed.
            live, self.live = self.live, None
            self._draw(live.stop)
        if ev.get("event") in ("dead", "stopping", "runner_started", "resumed"):
            self._due = 0.0  # show these at the next tick, not a frame later
        if ev.get("event") == "dead":
            self._slow_due = 0.0  # and the dead-letter depth with it, not 2 s later

    def tick(self, runner: Any) -> None:
        now = time.monotonic()
        if now < self._due:
            return
        self._due = now + self.interval_s
        if not self._room():
            # The terminal's output is stopped (Ctrl-S): a frame would wait for Ctrl-Q, and
            # the runner's whole loop with it (seen: a 2 s timeout not enforced for as long
            # as it stayed stopped). Skipped until it takes one again; also while we run in
            # the background, where frames would be drawn over the shell's.
            return
        if self.lines is not None:
            self.lines.flush()
            if self.lines.waiting:
                return
        if self._out is not None and not self._out.drain():
            # A frame the terminal took only part of (stopped by Ctrl-S as it was written;
            # a reader that stalled): the rest goes first, and the frames meanwhile are
            # skipped, not stacked up.
            return
        if self.live is None:
            # Started at the first tick, not before: a runner that cannot get the queue
            # (another one holds it) must leave the terminal as it found it.
            self._draw(self.start)
        live = self.live
        if live is not None:
            self._draw(lambda: self._update(live, self.frame(runner, now)))

    def _update(self, live: Live, frame: RenderableType) -> None:
        self._width = redraw(live, self.console, frame, self._width)

    def frame(self, runner: Any, now: float, *, whole: bool = False) -> RenderableType:
        snap = dict(runner.snapshot())
        snap["out_root"] = self.out_root
        if now >= self._slow_due:
            # Folder scans are dearer than a frame: every SLOW_INTERVAL_S only.
            self._slow_due = now + SLOW_INTERVAL_S
            q = runner.q
            self._slow = {"dead_depth": q.count("dead")}
        for k, v in self._slow.items():
            snap.setdefault(k, v)
        return render_dashboard(snap, width=self.console.width,
                                height=None if whole else self.console.height,
                                console=self.console)

    def close(self, runner: Any | None = None) -> None:
        """Draw the last frame (it stays on screen) and give the terminal back."""
        if self.live is None:
            if self.lines is not None:
                self.lines.flush(wait=True)  # (written above the frame, as in tick)
            if runner is None or getattr(runner, "holder", None) is None:
                return  # it never ran (e.g. the queue was busy): draw nothing
            self._draw(self.start)
        live = self.live
        if live is None:
            return
        try:
            if runner is not None:
                if self._out is not None:
                    self._out.drain(wait=True)  # (the frame the last one would follow)
                self._slow_due = 0.0
                # Whole: rich draws the last frame past the terminal's height, into the
                # scrollback, where it stays (the header too)
                self._draw(lambda: self._update(live, self.frame(runner, time.monotonic(),
                                                                 whole=True)))
        finally:
            self._draw(live.stop)
            self.live = None
            if self._out is not None:
                self._out.drain(wait=True)
