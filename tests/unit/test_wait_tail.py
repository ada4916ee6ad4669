"""`wait` reads only what the event log gained: the ids on its new whole lines. (Every
waited-for job was looked at on every poll the log grew: a wait on a batch was quadratic.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

from renderctl.events import EventLog, LogTail


def line(job: str, event: str = "completed") -> bytes:
    return (json.dumps({"ts": 1.0, "event": event, "job": job}) + "\n").encode()


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_only_lines_appended_after_the_start_are_news(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(line("old"))
    tail = LogTail(log)
    assert tail.news() == set()
    append(log, line("a") + line("b", "claimed") + b'{"event": "summary"}\n')
    assert tail.news() == {"a", "b"}
    assert tail.news() == set()


def test_a_torn_last_line_is_read_once_complete(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"")
    tail = LogTail(log)
    whole = line("torn")
    append(log, line("a") + whole[:9])
    assert tail.news() == {"a"}
    append(log, whole[9:])
    assert tail.news() == {"torn"}


def test_an_event_appended_after_a_torn_line_starts_a_line_of_its_own(tmp_path: Path) -> None:
    # Given a log a power loss left ending in half a line
    log = tmp_path / "events.jsonl"
    log.write_bytes(line("a") + line("cut")[:15])
    tail = LogTail(log)

    # When a new process appends an event, then another
    EventLog(log).append([{"ts": 2.0, "event": "completed", "job": "b"}])
    EventLog(log).append([{"ts": 3.0, "event": "completed", "job": "c"}])

    # Then both are whole lines, read as such (before: the first was glued to the
    # fragment and lost with it; audit DF), and only the fragment is lost
    assert tail.news() == {"b", "c"}
    lines = log.read_bytes().splitlines()
    assert [json.loads(x)["job"] for x in lines[2:]] == ["b", "c"]


def test_a_writer_that_keeps_the_log_open_sees_a_half_line_another_left(
        tmp_path: Path) -> None:
    # Given a writer (a --follow runner) that appended once and keeps the log open, and
    # another process that then left half a line (a short write on a full disk)
    log = tmp_path / "events.jsonl"
    writer = EventLog(log)
    writer.append([{"ts": 1.0, "event": "completed", "job": "j1"}])
    append(log, line("cut")[:20])

    # When the first writer appends again
    writer.append([{"ts": 2.0, "event": "completed", "job": "j2"}])

    # Then its line is whole (review DG: the check was made only as the log was opened)
    assert [json.loads(x)["job"] for x in log.read_bytes().splitlines()
            if x.endswith(b"}") and x.startswith(b"{")] == ["j1", "j2"]


def test_a_damaged_line_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"")
    tail = LogTail(log)
    append(log, b'{"job": \n[1, 2]\n"text"\n' + line("b"))
    assert tail.news() == {"b"}


def test_a_rotated_or_missing_log_asks_for_a_full_look(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(line("a"))
    tail = LogTail(log)
    os.rename(log, tmp_path / "events.jsonl.1")
    assert tail.news() is None  # gone: what the old one gained is unknown
    assert tail.news() == set()  # (not asked again while there is none)
    log.write_bytes(line("new"))
    assert tail.news() is None  # a new file: look at everything
    assert tail.news() == {"new"}  # ... and read it from its start
    log.write_bytes(b"")  # truncated in place (copytruncate)
    assert tail.news() is None


def test_a_missing_log_at_the_start_is_no_news_until_it_appears(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    tail = LogTail(log)
    assert tail.news() == set()
    log.write_bytes(line("a"))
    assert tail.news() is None
    assert tail.news() == {"a"}


def test_a_backlog_is_read_over_polls_and_a_huge_line_does_not_stick(
        tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"")
    tail = LogTail(log, read_max=64)
    append(log, b"x" * 200 + b"\n" + line("after"))
    seen: set[str] = set()
    for _ in range(10):
        seen |= tail.news() or set()
    assert seen == {"after"}


def test_a_folder_or_fifo_at_the_log_is_no_log(tmp_path: Path) -> None:
    # (README: `wait` reads anything but a regular file there as no log; a folder made the
    # read raise, a FIFO would have asked for a full look on every poll)
    log = tmp_path / "events.jsonl"
    log.mkdir()
    tail = LogTail(log)
    assert tail.news() == set()
    log.rmdir()
    os.mkfifo(log)
    assert tail.news() == set()
    assert tail.news() == set()
    log.unlink()
    log.write_bytes(line("a"))
    assert tail.news() is None
    assert tail.news() == {"a"}


def test_a_deeply_nested_line_or_a_power_loss_hole_does_not_stop_the_reading(
        tmp_path: Path) -> None:
    # (jobs run as the runner's user and can append to the log: 200,000 '[' made json
    # raise RecursionError, a traceback out of `wait`, `top` and metrics; NULs are what a
    # power loss leaves where unsynced lines were, before the next line)
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"")
    tail = LogTail(log)
    append(log, b"[" * 200_000 + b"\n" + b"\0" * 64 + line("after-hole"))
    assert tail.news() == {"after-hole"}
    events, _ = EventLog(log).read()
    assert [e["job"] for e in events] == ["after-hole"]
