"""`status` and the dashboard on a terminal of any width: nothing cut, nothing read as markup.

rich cuts a table wider than the terminal cell by cell ("pe…", "inv-…") and drops whole
columns; on a terminal that narrow the views print lines instead, which wrap whole.
"""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from renderctl.cli import views
from renderctl.cli.dashboard import render_dashboard
from renderctl.store import Queue, QueueStatus

MB = 1024 * 1024
LONG_ID = "tenant-a.invoice-2026-12-01-" + "x" * 100  # 128 characters, the longest id


def terminal(width: int) -> Console:
    return Console(record=True, width=width, force_terminal=True, color_system=None)


def screen(c: Console) -> str:
    """What the terminal shows, with rich's wrapping undone (an id folded across lines)."""
    return c.export_text(clear=False).replace("\n", "")


@pytest.fixture
def on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(views, "plain", lambda: False)


def running_record(job_id: str) -> Any:
    spec = SimpleNamespace(id=job_id, kind="invoice", memory_mb=400, timeout_s=120.0)
    return SimpleNamespace(spec=spec, lease=None)


@pytest.mark.usefixtures("on_a_terminal")
@pytest.mark.parametrize("width", [20, 40, 80, 120])
def test_status_on_a_terminal_shows_every_count_and_id_whole(tmp_path: Path,
                                                             width: int) -> None:
    # Given a queue with a job running under a 128-character id
    q = Queue(tmp_path / "q")
    st = q.status()
    st = QueueStatus(counts={**st.counts, "pending": 12345, "done": 100000}, corrupt=0,
                     oldest_pending_age_s=5.0, running=(running_record(LONG_ID),),
                     runner=None)

    # When status draws it on a terminal of this width
    c = terminal(width)
    views.render_status(c, q, st)

    # Then every state's count is there with its name, and the id whole
    text = screen(c)
    assert "…" not in text, c.export_text()
    assert LONG_ID in text, c.export_text()
    if "pending=12345" not in text:  # the table: names above, counts below, in order
        lines = c.export_text(clear=False).splitlines()
        [header] = [ln for ln in lines if "pending" in ln and "corrupt" in ln]
        [row] = [ln for ln in lines if "12345" in ln]
        assert [x.strip() for x in header.split("┃")[1:8]] == [
            "pending", "running", "done", "dead", "cancelled", "expired", "corrupt"], header
        assert [x.strip() for x in row.split("│")[1:8]] == [
            "12345", "0", "100000", "0", "0", "0", "0"], row


@pytest.mark.usefixtures("on_a_terminal")
@pytest.mark.parametrize("folder", ["[/]", "[red]x[/red]", "[bold"])
def test_status_on_a_terminal_shows_a_queue_path_with_brackets_as_written(
        tmp_path: Path, folder: str) -> None:
    # Given a queue inside a folder whose name rich would read as markup
    q = Queue(tmp_path / folder / "q")

    # When status draws it on a terminal, then the path is shown as it is (no error)
    c = terminal(200)
    views.render_status(c, q, q.status())
    assert f"queue {tmp_path / folder / 'q'}" in c.export_text(clear=False)


@pytest.mark.parametrize("on_terminal", [True, False])
def test_status_shows_a_queue_path_with_escapes_escaped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        on_terminal: bool) -> None:
    # Given a queue inside a folder whose name holds a title-setting OSC
    q = Queue(tmp_path / "q\x1b]0;pwned\x07")
    monkeypatch.setattr(views, "plain", lambda: not on_terminal)

    # When status draws it, on a terminal or as plain lines
    c = terminal(200)
    views.render_status(c, q, q.status())

    # Then the name is shown escaped, never sent raw (audit BC)
    text = c.export_text(clear=False) + capsys.readouterr().out
    assert "\x1b" not in text and "\x07" not in text, text
    assert "q\\x1b]0;pwned\\x07" in text, text


def test_a_terminals_console_shows_emoji_codes_as_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from renderctl.cli import console as out

    # Given the console a command draws on a terminal with
    monkeypatch.setattr(out, "plain", lambda: False)
    buf = io.StringIO()
    c = out.console(file=buf)
    # When a job's error holding rich's emoji codes is shown (as `show` does)
    c.print("    error: :smile: :thumbs_up:", markup=False)
    # Then it reads as the job wrote it (before: a smiley, on a terminal only: audit BC)
    assert ":smile: :thumbs_up:" in buf.getvalue()


@pytest.fixture
def snapshot() -> dict[str, Any]:
    return {
        "pid": 4242, "queue": "/srv/q", "out_root": "/srv/out", "guard": "cgroup-v2",
        "workers_desired": 2, "workers_alive": 2, "budget_mb": 1600, "uptime_s": 20.0,
        "counts": {"done": 30, "dead": 1, "cancelled": 0, "expired": 0},
        "retries": 0, "pending_known": 60, "claimed_waiting": 0, "in_flight": 2,
        "running": [
            {"id": "inv-0001", "kind": "invoice", "pid": 101, "attempt": 1, "elapsed_s": 1.5,
             "timeout_s": 120, "memory_bytes": 40 * MB, "memory_limit_bytes": 400 * MB},
            {"id": LONG_ID, "kind": "report", "pid": 102, "attempt": 2, "elapsed_s": 9.0,
             "timeout_s": 60, "memory_bytes": 360 * MB, "memory_limit_bytes": 400 * MB},
        ],
        "recent_failures": [
            {"event": "dead", "job": "inv-bad", "attempt": 3, "outcome": "invalid_input",
             "error": "broken.pdf: truncated PDF"},
        ],
    }


@pytest.mark.parametrize("width", [40, 80, 100, 300])
def test_dashboard_shows_each_running_job_and_failure_whole_at_any_width(
        snapshot: dict[str, Any], width: int) -> None:
    # When the dashboard is drawn on a terminal of this width
    c = terminal(width)
    c.print(render_dashboard(snapshot, width=width))
    text = screen(c)

    # Then each running job's id, kind, worker pid, attempt, times and memory are there,
    # and each failure's id, outcome and the start of its cause: nothing cut to "…"
    assert "…" not in text, c.export_text()
    for needle in ("inv-0001", LONG_ID, "invoice", "report", "101", "102", "1.5s", "2.0m",
                   "9.0s", "60.0s", "40.0MiB/400.0MiB", "360.0MiB/400.0MiB", "inv-bad",
                   "invalid_input", "broken.pdf: truncated"):
        assert needle in text, (needle, c.export_text())


def test_show_prints_the_last_attempts_tails_whole_and_says_what_it_leaves_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from renderctl.lifecycle import State
    from renderctl.store import JobView

    # Given a dead job of two attempts, each with 20 lines of stderr holding form feeds
    # (pdftotext's page breaks), the last also with a traceback
    q = Queue(tmp_path / "q")
    q.submit([{"id": "j", "kind": "python", "callable": "m:f", "output": "j.bin"}],
             base=tmp_path, out_root=tmp_path / "out")
    view = q.get("j")
    tail = "\n".join(f"line {i}\fpage" for i in range(20))
    trace = "Traceback (most recent call last):\n  File \"m.py\", line 3, in f\nValueError: bad"
    rec = replace(view.record, attempts=(
        {"n": 1, "outcome": "failed", "stderr_tail": tail},
        {"n": 2, "outcome": "failed", "stderr_tail": tail, "traceback_tail": trace}))
    monkeypatch.setattr(views, "plain", lambda: True)

    # When show prints it
    views.render_job(terminal(200), JobView(State.DEAD, rec, view.path))

    # Then the first attempt shows its last five lines, saying 15 are left out; the last
    # attempt its 20 and its traceback (audit EV: 5 lines and no traceback, unsaid); each
    # line whole (before: the form feeds cut them: BK)
    out = capsys.readouterr().out.splitlines()
    first, second = out.index("  attempt 1: failed, elapsed -"), out.index(
        "  attempt 2: failed, elapsed -")
    lines = [f"    | line {i}\\x0cpage" for i in range(20)]
    assert out[first + 1:second] == [
        "    stderr (last 5 of 20 lines kept; --json has them all):", *lines[15:]]
    assert out[second + 1:] == ["    stderr:", *lines, "    traceback:",
                                *(f"    | {ln}" for ln in trace.splitlines())]


def test_a_stop_signal_and_a_second_one_each_say_what_happens_to_running_jobs() -> None:
    from renderctl.cli.reporters import format_event

    first = {"event": "stopping", "signal": "SIGTERM", "grace_s": 30.0, "running": 2}
    again = {**first, "grace_s": 0.0, "again": True}
    assert format_event(first) == ("stopping on SIGTERM: no new jobs; 2 running job(s) get 30s "
                                   "to finish (signal again to skip)")
    # (a second signal was silent: the jobs were killed with the grace not out, unexplained)
    assert format_event(again) == ("stopping on SIGTERM again: the grace is skipped; 2 running "
                                   "job(s) killed now and returned to pending uncharged")
