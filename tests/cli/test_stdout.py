"""`run`'s stdout (console.Stdout): a write never waits, what waits keeps its order.

Real pipes, terminals (ptys) and files; the one interleaving a test cannot arrange from
outside (Ctrl-S landing between the poll and the write) is arranged by having the poll
asked first, as it was before the key was pressed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import select
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renderctl.cli.console import Stdout


@contextlib.contextmanager
def no_longer_than(seconds: float) -> Iterator[None]:
    """Fail, rather than hang the suite, if the block waits longer than ``seconds``."""
    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"waited over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def read_all(fd: int, until: int, *, timeout_s: float = 10) -> bytes:
    got = bytearray()
    deadline = time.monotonic() + timeout_s
    while len(got) < until and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            got += os.read(fd, 1 << 16)
    return bytes(got)


def lines(n: int, width: int = 100) -> list[str]:
    return [f"{i:06d} " + "x" * (width - 8) + "\n" for i in range(n)]


def test_a_pipe_nobody_reads_keeps_what_it_cannot_take_and_gets_it_all_in_order() -> None:
    # Given stdout on a pipe whose reader does not read
    r, w = os.pipe()
    stream = os.fdopen(w, "w")
    try:
        out = Stdout(stream)
        sent = lines(30, 10_000)  # 300 KB: more than the pipe holds (64 KB)

        # When more is written than the pipe holds, in writes bigger than its last room
        with no_longer_than(5):
            for text in sent:
                out.write(text)
                out.flush()
            # Then no write waited, and what it could not take is kept
            assert not out.drain()
        assert 0 < len(out.pending) < 300_000

        # And once the reader reads, all of it arrives, in order, nothing twice
        with no_longer_than(10):
            got = bytearray()
            while not out.drain():
                got += read_all(r, 1)
            got += read_all(r, 300_000 - len(got))
        assert got.decode() == "".join(sent)
    finally:
        stream.close()
        os.close(r)


def test_a_terminal_stopped_by_ctrl_s_after_the_poll_said_room_does_not_stop_the_writer() -> None:
    # Given stdout on a terminal, asked for room before the user pressed Ctrl-S (the poll
    # then said yes), and the key pressed now
    master, slave = pty.openpty()
    stream = os.fdopen(slave, "w")
    try:
        out = Stdout(stream)
        out.room = lambda: True  # type: ignore[assignment,method-assign]
        os.write(master, b"\x13")
        stopped = select.poll()
        stopped.register(slave, select.POLLOUT)
        deadline = time.monotonic() + 5
        while stopped.poll(0) and time.monotonic() < deadline:
            time.sleep(0.01)  # (the line discipline takes the key asynchronously)
        assert not stopped.poll(0), "the terminal did not stop"

        # When a frame is written
        frame = "".join(lines(40, 120))
        with no_longer_than(5):
            out.write(frame)
            out.flush()
            # Then the write did not wait for Ctrl-Q: the frame is kept
            assert not out.drain()
        assert out.pending

        # And after Ctrl-Q it is shown whole (the terminal adds its \r to each \n)
        os.write(master, b"\x11")
        with no_longer_than(10):
            got = bytearray()
            while not out.drain():
                got += read_all(master, 1, timeout_s=0.1)
            got += read_all(master, len(frame) + 40 - len(got))
        assert got.decode().replace("\r\n", "\n") == frame
    finally:
        stream.close()
        os.close(master)


def test_a_reader_gone_silences_stdout_and_is_not_an_error() -> None:
    # Given stdout on a pipe that holds kept bytes, and its reader gone (`run | head -3`)
    r, w = os.pipe()
    stream = os.fdopen(w, "w")
    try:
        out = Stdout(stream)
        for text in lines(1000):
            out.write(text)
        assert not out.drain()
        os.close(r)

        # When it is written to again
        out.write("more\n")
        # Then that is no error: everything from here on goes nowhere
        assert out.drain(wait=True) and out.gone and not out.pending
        out.write("and more\n")
        assert out.drain() and not out.pending
        assert os.path.samefile(f"/proc/self/fd/{w}", os.devnull)
    finally:
        stream.close()


def test_a_file_is_written_at_its_end_not_reopened_at_its_start(tmp_path: Path) -> None:
    # Given stdout redirected to a log that already has lines (`run >> log`), and a line
    # the stream itself still buffers
    log = tmp_path / "run.log"
    log.write_text("earlier\n")
    with open(log, "a") as stream:
        stream.write("buffered\n")
        out = Stdout(stream)

        # When lines are written
        out.write("runner started\n")
        assert out.drain()

    # Then they follow what was there, in order (a descriptor opened anew would have its
    # own offset, and write over the log from its start)
    assert log.read_text() == "earlier\nbuffered\nrunner started\n"


def test_a_stream_without_a_descriptor_is_written_through() -> None:
    stream = io.StringIO()
    out = Stdout(stream)
    out.write("é and \U0001f600\n")
    assert out.drain() and stream.getvalue() == "é and \U0001f600\n"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=3000), st.integers(0, 70_000)), max_size=12))
def test_writes_and_reads_in_any_order_arrive_as_written(
        steps: list[tuple[str, int]]) -> None:
    # Given a pipe, and writes and reads of any size in any order
    r, w = os.pipe()
    os.set_blocking(r, False)
    stream = os.fdopen(w, "w", encoding="utf-8")
    try:
        out = Stdout(stream)
        got = bytearray()
        with no_longer_than(10):
            for text, n in steps:
                out.write(text)
                out.drain()
                with contextlib.suppress(BlockingIOError):
                    got += os.read(r, n) if n else b""
            while not out.drain():
                with contextlib.suppress(BlockingIOError):
                    got += os.read(r, 1 << 16)
            with contextlib.suppress(BlockingIOError):
                while chunk := os.read(r, 1 << 16):
                    got += chunk
        # Then the reader got exactly what was written, in order
        assert got.decode("utf-8", "surrogateescape") == "".join(
            t.encode("utf-8", "backslashreplace").decode("utf-8") for t, _ in steps)
    finally:
        stream.close()
        os.close(r)


def test_a_refusals_json_message_is_its_reason_not_the_notes_said_before(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from renderctl.cli import console

    # Given a note and a warning said on the way, then the error that refuses the command
    monkeypatch.setattr(console, "_errors", console.collections.deque(maxlen=20))
    monkeypatch.setattr(console, "_stdout_used", False)
    console.err("note: no manifest given, and the queue holds no job to run")
    console.err("warning: --out only applies to jobs this command submits")
    console.err("cannot open the lock file q/runner.lock: Permission denied")
    capsys.readouterr()
    # When the refusal's JSON is printed
    console.json_refusal(74, "run")
    # Then its message is the error alone (audit CE: the note came first in it)
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"accepted": [], "error": "io_error",
                   "message": "cannot open the lock file q/runner.lock: Permission denied"}
