"""The dashboard is a pure function of a snapshot: render fixtures, read the screen."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from renderctl.cli.console import human_duration, one_line
from renderctl.cli.dashboard import DashboardReporter, dashboard_lines, render_dashboard

MB = 1024 * 1024


@pytest.fixture
def snapshot() -> dict[str, Any]:
    """A runner snapshot as `Runner.snapshot()` returns it, mid-batch."""
    return {
        "schema": 1, "ts": 1_700_000_000.0, "pid": 4242, "queue": "/srv/q",
        "out_root": "/srv/out", "guard": "cgroup-v2", "workers_desired": 4,
        "workers_alive": 3, "budget_mb": 1600, "uptime_s": 20.0,
        "counts": {"done": 30, "dead": 2, "cancelled": 0, "expired": 0},
        "retries": 5, "pending_known": 60, "claimed_waiting": 2, "in_flight": 8,
        "running": [
            {"id": "inv-cool", "kind": "invoice", "pid": 101, "attempt": 1, "elapsed_s": 1.5,
             "timeout_s": 120, "memory_bytes": 40 * MB, "memory_limit_bytes": 400 * MB},
            {"id": "report-hot", "kind": "report", "pid": 102, "attempt": 2,
             "elapsed_s": 9.0, "timeout_s": 60, "memory_bytes": 360 * MB,
             "memory_limit_bytes": 400 * MB},
        ],
        "wait_s": {"p50": 0.25, "p99": 3.5, "n": 40},
        "exec_s": {"p50": 0.75, "p99": 12.0, "n": 40},
        "recent_failures": [
            {"event": "dead", "job": "inv-bad", "attempt": 3, "outcome": "memory",
             "error": "crossed its memory ceiling of 400 MB; peak 512 MB"},
        ],
        "dead_depth": 7, "oldest_pending_age_s": 95.0, "stopping": False,
    }


def record(snap: dict[str, Any], width: int = 120) -> Console:
    c = Console(record=True, width=width, force_terminal=True, color_system="truecolor")
    c.print(render_dashboard(snap, width=width))
    return c


def style_of(c: Console, needle: str) -> set[str]:
    """Styles of the segments whose text contains ``needle`` (after a render)."""
    return {str(seg.style) for seg in c._record_buffer if needle in seg.text and seg.style}


def test_header_progress_and_counts(snapshot: dict[str, Any]) -> None:
    text = record(snapshot).export_text()
    # Header: queue, output root, workers alive/desired, memory guard, budget.
    assert "/srv/q" in text and "/srv/out" in text
    assert "3/4 alive" in text and "cgroup-v2" in text and "1600 MB" in text
    # Progress: 32 finished of 32 + (60 pending + 8 in flight, the 2 claimed and waiting
    # for a worker among them); 1.6 jobs/s.
    assert "32/100 jobs" in text and "1.6 jobs/s" in text and "ETA 42.5s" in text
    assert "━" in text  # the bar itself
    assert "done 30" in text and "dead 2" in text and "retries 5" in text
    assert "dead-letter depth 7" in text and "oldest pending 95.0s" in text
    # Waiting for a first attempt is shown apart from execution time.
    assert "accepted -> first attempt p50 250ms  p99 3.5s" in text
    assert "execution p50 750ms  p99 12.0s" in text


@pytest.mark.parametrize("width", [50, 60, 80])
def test_counts_wrap_between_pairs_never_between_a_label_and_its_count(
        snapshot: dict[str, Any], width: int) -> None:
    # (at 80 columns the line broke as "... expired 0  retries" / "0"; audit DB)
    lines = record(snapshot, width=width).export_text().splitlines()
    for pair in ("pending 60", "running 2", "done 30", "dead 2", "cancelled 0", "expired 0",
                 "retries 5", "dead-letter depth 7", "oldest pending 95.0s",
                 "execution p50 750ms  p99 12.0s"):
        assert any(pair in line for line in lines), (pair, lines)


def test_running_jobs_table_with_memory_bars(snapshot: dict[str, Any]) -> None:
    c = record(snapshot)
    text = c.export_text(clear=False)
    for needle in ("inv-cool", "report-hot", "invoice", "101", "1.5s / 2.0m", "9.0s / 60.0s",
                   "40.0MiB/400.0MiB", "360.0MiB/400.0MiB"):
        assert needle in text, needle
    # 90% of the ceiling is red; 10% is not.
    assert any("red" in s for s in style_of(c, "360.0MiB/400.0MiB"))
    assert not any("red" in s for s in style_of(c, "40.0MiB/400.0MiB"))
    html = c.export_html()
    assert "inv-cool" in html


def test_memory_bar_turns_red_at_85_percent(snapshot: dict[str, Any]) -> None:
    job = snapshot["running"][0]
    for used_mb, red in ((339, False), (340, True)):  # 340/400 = 85%
        snap = {**snapshot, "running": [{**job, "memory_bytes": used_mb * MB}]}
        c = record(snap)
        styles = style_of(c, f"{used_mb}.0MiB/400.0MiB")
        assert any("red" in s for s in styles) is red, (used_mb, styles)


def test_failures_and_dead_letter_highlight(snapshot: dict[str, Any]) -> None:
    c = record(snapshot)
    text = c.export_text(clear=False)
    assert "last failures" in text and "inv-bad" in text and "memory" in text
    assert "crossed its memory ceiling of 400 MB" in text
    assert any("on red" in s for s in style_of(c, "dead-letter depth 7"))
    calm = record({**snapshot, "dead_depth": 0, "recent_failures": []})
    assert not any("red" in s for s in style_of(calm, "dead-letter depth 0"))
    assert "last failures" not in calm.export_text()


def test_a_failure_with_lines_and_brackets_is_one_literal_row(snapshot: dict[str, Any]) -> None:
    # Given a failure whose message spans lines and holds what rich would read as markup
    snapshot["recent_failures"] = [{"event": "dead", "job": "j", "attempt": 1,
                                    "outcome": "failed", "error": "boom [/]\nsecond"}]
    # When the dashboard is drawn
    text = record(snapshot).export_text()
    # Then the message is shown as written, on the row of its job
    [row] = [ln for ln in text.splitlines() if " j " in ln and "failed" in ln]
    assert "boom [/]\\nsecond" in row, text


def test_plain_lines_carry_what_the_frame_shows(snapshot: dict[str, Any]) -> None:
    # Given a failure spanning lines, when the snapshot is written as plain lines
    snapshot["recent_failures"][0]["error"] = "boom [/]\nsecond"
    lines = dashboard_lines(snapshot)
    # Then each part of the frame is there, one line each, nothing cut or boxed
    for expected in ("queue /srv/q", "output root /srv/out", "runner pid 4242, up 20.0s",
                     "workers 3/4 alive", "memory guard cgroup-v2; budget 1600 MB",
                     "progress 32/100 jobs  1.6 jobs/s  ETA 42.5s",
                     "running inv-cool kind=invoice worker_pid=101 attempt=1 elapsed=1.5s/2.0m "
                     "memory=40.0MiB/400.0MiB",
                     "this run: pending 60  running 2  done 30  dead 2  cancelled 0  "
                     "expired 0  retries 5",
                     "dead-letter depth 7   oldest pending 95.0s",
                     "accepted -> first attempt p50 250ms  p99 3.5s    "
                     "execution p50 750ms  p99 12.0s",
                     "failure inv-bad event=dead attempt=3 outcome=memory "
                     "cause=boom [/]\\nsecond"):
        assert expected in lines, (expected, lines)
    assert dashboard_lines({"runner_alive": False})[2].startswith("runner no runner is alive")


def test_no_runner_and_empty_snapshot_render() -> None:
    text = record({"queue": "/q", "runner_alive": False,
                   "queue_counts": {"pending": 2, "running": 0, "done": 3, "dead": 1,
                                    "cancelled": 0, "expired": 0}}).export_text()
    assert "no runner is alive" in text
    assert "pending 2" in text and "done 3" in text and "4/6 jobs" in text
    assert "running: none" in record({}).export_text()


def test_reporter_is_rate_limited_and_cheap_when_not_due(snapshot: dict[str, Any]) -> None:
    class FakeQueue:
        def count(self, state: str) -> int:
            return 0

        def dir(self, name: str) -> str:
            return "/nonexistent"

    class FakeRunner:
        q = FakeQueue()
        workers: dict[int, Any] = {}
        holder = object()
        calls = 0

        def snapshot(self) -> dict[str, Any]:
            self.calls += 1
            return snapshot

    console = Console(record=True, width=120, force_terminal=True)
    rep = DashboardReporter(console, out_root="/srv/out", fps=4)
    runner = FakeRunner()
    for _ in range(2000):
        rep.tick(runner)
    assert runner.calls == 1  # 2000 ticks within a frame period: one frame
    rep.close(runner)
    assert "report-hot" in console.export_text()


def test_a_frame_after_the_terminal_changed_width_is_drawn_from_a_cleared_screen(
        snapshot: dict[str, Any]) -> None:
    import io

    class FakeQueue:
        def count(self, state: str) -> int:
            return 0

    class FakeRunner:
        q = FakeQueue()
        holder = object()

        def snapshot(self) -> dict[str, Any]:
            return snapshot

    # Given the run's dashboard drawn twice on a 120-column terminal
    screen = io.StringIO()
    console = Console(file=screen, width=120, force_terminal=True, color_system=None)
    rep = DashboardReporter(console, out_root="/srv/out")
    runner = FakeRunner()
    rep.tick(runner)
    rep._due = 0.0  # (the next frame is due now)
    rep.tick(runner)
    # (a redraw at the same width erases the last frame's rows, and clears nothing else)
    assert "\x1b[2J" not in screen.getvalue() and "\x1b[1A" in screen.getvalue()
    drawn = len(screen.getvalue())

    # When the terminal is narrowed to 40 columns (reflowing what it shows: the last frame's
    # rows are no longer the rows rich would erase) and the next frame is drawn
    console.width = 40
    rep._due = 0.0
    rep.tick(runner)

    # Then it starts from a cleared screen, erasing no rows above it (pieces of the old
    # frame were left on screen above the new one)
    after = screen.getvalue()[drawn:]
    assert after.startswith("\x1b[H\x1b[2J"), repr(after[:40])
    assert "\x1b[1A" not in after.split("\x1b[2J", 1)[1].split("report-hot")[0]
    assert "report-hot" in after
    rep.close(runner)


def test_top_progress_is_of_one_instant_the_runners(snapshot: dict[str, Any]) -> None:
    # Given `top`'s snapshot: the runner's (written each second) and the folder counts read
    # now, after 10 more jobs finished
    snap = {**snapshot, "runner_alive": True,
            "queue_counts": {"pending": 50, "running": 10, "done": 40, "dead": 2,
                             "cancelled": 0, "expired": 0}}
    # When it is drawn, then the batch's size is the runner's 32 + 68, not 32 finished of
    # the runner's second plus the 60 left now (a total that shrinks while jobs finish)
    assert "progress 32/100 jobs  1.6 jobs/s  ETA 42.5s" in dashboard_lines(snap)
    # (the counts line is the folders', as it says)
    assert "queue: pending 50  running 10  done 40  dead 2  cancelled 0  expired 0  " \
           "retries 5" in dashboard_lines(snap)


def test_the_last_frame_of_a_run_says_it_finished_and_raises_no_alarm(
        snapshot: dict[str, Any]) -> None:
    # Given the runner's last snapshot: its loop has ended and its workers are gone
    snap = {**snapshot, "stopped": True, "workers_alive": 0, "running": []}
    # When it is drawn (it stays on the screen after the run)
    c = record(snap)
    # Then it says the run ended, and the workers are not flagged as missing
    assert "pid 4242, up 20.0s - ended" in c.export_text(clear=False)
    assert not any("yellow" in s for s in style_of(c, "0/4 alive"))
    assert "runner pid 4242, up 20.0s - ended" in dashboard_lines(snap)
    # (and gives no time left for the jobs it leaves pending: no run is coming for them;
    # "ETA 42.5s" under "ended", audit CN)
    assert "progress 32/100 jobs  1.6 jobs/s  ETA -" in dashboard_lines(snap)
    # (while it runs, fewer workers than wanted are)
    assert any("yellow" in s for s in style_of(record(snapshot), "3/4 alive"))


def test_a_dead_letter_shows_in_the_depth_at_the_next_frame(snapshot: dict[str, Any]) -> None:
    # Given the run's dashboard, drawn once with nothing in dead/
    class Folders:
        dead = 0

        def count(self, state: str) -> int:
            return self.dead if state == "dead" else 0

    class FakeRunner:
        q = Folders()
        holder = object()

        def snapshot(self) -> dict[str, Any]:
            return {k: v for k, v in snapshot.items() if k != "dead_depth"}

    console = Console(record=True, width=120, force_terminal=True)
    rep = DashboardReporter(console, out_root="/srv/out", fps=4)
    runner = FakeRunner()
    rep.tick(runner)
    assert "dead-letter depth 0" in console.export_text()

    # When a job is dead-lettered (and reported) within the folder scan's 2-second period
    runner.q.dead = 1
    rep.event({"event": "dead", "job": "x"})
    rep.tick(runner)

    # Then the next frame counts it, as the run's own count of dead jobs does
    assert "dead-letter depth 1" in console.export_text()
    rep.close(runner)


@pytest.mark.parametrize(("seconds", "shown"), [
    (None, "-"), (0.0004, "0ms"), (0.9994, "999ms"), (0.9996, "1.0s"), (119.94, "119.9s"),
    (119.96, "2.0m"), (7196.9, "119.9m"), (7197.1, "2.0h"), (172_619.0, "47.9h"),
    (172_621.0, "2.0d"), (8.6399e9, "99998.8d"), (8.64e9, "1e+05d"), (1e300, "1.16e+295d"),
])
def test_a_duration_reads_in_the_unit_its_rounded_value_belongs_to(
        seconds: float | None, shown: str) -> None:
    # 0.9996 s once read "1000ms" and 119.96 s "120.0s": rounding crossed into the next unit
    assert human_duration(seconds) == shown


def test_a_plain_line_shows_bidirectional_controls_rather_than_obeying_them() -> None:
    # A job's message with a right-to-left override (U+202E) reversed the rest of its line
    # as a terminal showed it; isolates (U+2066-U+2069) too. Shown as escapes instead.
    line = one_line("error: \u202edesab\u2066x\u2069 done")
    assert line == "error: \\u202edesab\\u2066x\\u2069 done"
    assert one_line("ordinary text, accents é and 株") == "ordinary text, accents é and 株"


def test_a_plain_line_shows_invisible_characters() -> None:
    # "inv\u200b.pdf" and "inv.pdf" were shown alike (audit CF)
    assert one_line("inv\u200b.pdf inv\u2060.pdf \ufeffx") == \
        "inv\\u200b.pdf inv\\u2060.pdf \\ufeffx"


def test_a_queue_or_output_root_named_with_escapes_cannot_drive_the_terminal(
        snapshot: dict[str, Any]) -> None:
    # Given folders whose names hold a title-setting OSC and a screen clear
    snapshot["queue"] = "/srv/q\x1b]0;pwned\x07"
    snapshot["out_root"] = "/srv/o\x1b[2J"
    # When the frame and its plain lines are drawn
    frame = record(snapshot).export_text()
    lines = dashboard_lines(snapshot)
    # Then the names are shown escaped, as a job's text is (before: sent raw in every
    # frame: audit BC)
    for text in (frame, "\n".join(lines)):
        assert "\x1b" not in text and "\x07" not in text
        assert "/srv/q\\x1b]0;pwned\\x07" in text and "/srv/o\\x1b[2J" in text


@pytest.mark.parametrize("width", [120, 40])
def test_a_wide_character_cause_takes_no_more_rows_than_a_narrow_one(
        snapshot: dict[str, Any], width: int) -> None:
    # Given two failures' causes of 600 characters: ASCII, and CJK (two cells each)
    def rows(cause: str) -> int:
        snapshot["recent_failures"] = [{"event": "dead", "job": "j", "attempt": 1,
                                        "outcome": "failed", "error": cause}]
        return len(record(snapshot, width).export_text().splitlines())

    # When each is drawn in the table (120 columns) or as lines (40), then the CJK one is
    # cut to as many rows (before: cut by characters, twice the rows: audit BC)
    assert rows("错" * 600) == rows("x" * 600)


@pytest.mark.parametrize(("width", "height"), [(40, 16), (60, 20), (80, 14), (120, 30)])
def test_a_short_terminal_keeps_progress_counts_and_failures_and_drops_fixed_lines_first(
        snapshot: dict[str, Any], width: int, height: int) -> None:
    # Given a snapshot with two running jobs and a failure, for a terminal of few rows
    # When it is drawn for that height
    c = Console(record=True, width=width, height=height, force_terminal=True)
    c.print(render_dashboard(snapshot, width=width, height=height, console=c))
    lines = c.export_text().splitlines()

    # Then it fits (Live keeps a row for its cursor: what did not fit was cut at the
    # bottom), and what is cut is the fixed header, then the latencies, then the running
    # table, never the progress, the counts or the last failures (audit EV: at 40x10 only
    # the queue's path, the output root and the guard showed, and never a failure)
    text = "\n".join(lines).rstrip()
    assert len(lines) <= height - 1, text
    for needle in ("32/100 jobs", "done 30", "dead 2", "dead-letter depth 7", "inv-bad"):
        assert needle in text, (needle, text)
    full = record(snapshot, width).export_text().rstrip()
    if len(full.splitlines()) <= height - 1:
        assert text == full  # room for all: nothing dropped
    else:
        assert "/srv/out" not in text
        if "report-hot" not in text:
            assert "running: 2" in text and "execution p50" not in text


def test_a_short_terminal_keeps_the_line_that_says_no_runner_is_alive(
        snapshot: dict[str, Any]) -> None:
    snapshot["runner_alive"] = False
    snapshot["queue_counts"] = {"pending": 60, "running": 0, "done": 30, "dead": 2}
    c = Console(record=True, width=40, height=12, force_terminal=True)
    c.print(render_dashboard(snapshot, width=40, height=12, console=c))
    text = c.export_text()
    assert "no runner is alive" in text and "/srv/out" not in text, text


@pytest.mark.parametrize("width", [40, 80, 120])
def test_a_long_cause_is_cut_in_the_middle_keeping_the_tools_last_words(
        snapshot: dict[str, Any], width: int) -> None:
    # Given a command's failure whose cause ends with its tool's own message
    snapshot["recent_failures"] = [{
        "event": "dead", "job": "cmd", "attempt": 1, "outcome": "failed",
        "error": "command exited with status 3: " + "stderr line " * 40 + "quota exceeded"}]
    # When drawn, then the cause keeps its start and its end (audit EV: cut at the end, the
    # tool's message was exactly what went)
    text = " ".join(record(snapshot, width).export_text().split())  # (wrapped at 40)
    assert "quota exceeded" in text and "command" in text and "..." in text, text


@pytest.mark.parametrize(("width", "height"), [(40, 16), (60, 12), (100, 10), (80, 11)])
def test_a_short_terminal_shows_the_newest_failures_a_line_each_rather_than_be_cut(
        snapshot: dict[str, Any], width: int, height: int) -> None:
    # Given eight running jobs and five failures with long causes (wide characters too)
    snapshot["running"] = [{**snapshot["running"][0], "id": f"run-{i}"} for i in range(8)]
    snapshot["recent_failures"] = [
        {"event": "dead", "job": f"bad-{i}", "attempt": 1, "outcome": "failed",
         "error": "command exited with status 3: " + "错误 " * 40 + f"end-{i}"}
        for i in range(5)]

    # When drawn for a short terminal
    c = Console(record=True, width=width, height=height, force_terminal=True)
    c.print(render_dashboard(snapshot, width=width, height=height, console=c))
    lines = c.export_text().rstrip().splitlines()

    # Then it fits (review ET: 29 rows for 15 at 40x16, rich's crop taking the newest
    # failures), with the progress, and the newest failure whole to its cause's end
    text = "\n".join(lines)
    assert len(lines) <= height - 1, text
    assert "32/100 jobs" in text and "bad-4" in text and "end-4" in text, text
