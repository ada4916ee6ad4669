"""`renderctl top`: attached to a live runner in a pseudo-terminal, and without a runner."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from clihelp import RENDERCTL, cli, env, job, poll, stopped, write_jobs


def read_pty_until(fd: int, needle: bytes, *, timeout_s: float = 20) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout_s
    while needle not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} never appeared; got {buf[-2000:]!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the other side closed
                break
            buf += chunk
    return buf


def wait_reading_pty(proc: subprocess.Popen[bytes], fd: int, *, timeout_s: float = 10) -> int:
    """Wait for ``proc`` to exit while reading its terminal, as a real terminal does: a
    program whose last frame does not fit the pty's buffer blocks writing it otherwise."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        left = deadline - time.monotonic()
        assert left > 0, f"still running after {timeout_s:g}s"
        if select.select([fd], [], [], min(left, 0.05))[0]:
            try:
                os.read(fd, 65536)
            except OSError:  # EIO: the other side closed
                return proc.wait(timeout=max(0.0, left))
    return proc.returncode


def quits_quietly_on_ctrl_c(top: subprocess.Popen[bytes], master: int) -> None:
    """Ctrl-C (SIGINT) ends ``top``, drawing on terminal ``master``, with exit 0 and no
    traceback."""
    top.send_signal(signal.SIGINT)
    assert wait_reading_pty(top, master) == 0
    assert top.stderr is not None and b"Traceback" not in top.stderr.read()


def top_on_a_pty(q: Path, cwd: Path, *, term: str = "xterm-256color", columns: int = 140,
                 own_group: bool = False, sized: bool = False,
                 launcher: list[str] = RENDERCTL) -> tuple[subprocess.Popen[bytes], int]:
    """``renderctl top --queue Q`` writing to a pseudo-terminal (colour allowed): the process
    and the terminal's master end to read. own_group: a process group of its own, as a
    shell's job control starts a command (so that Ctrl-Z can stop it); sized: its width
    from the terminal, not from $COLUMNS (which rich prefers)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    top_env = {**env(), "TERM": term}
    top_env.pop("NO_COLOR")
    if sized:
        top_env.pop("COLUMNS")
    top = subprocess.Popen([*launcher, "top", "--queue", str(q)], cwd=cwd, env=top_env,
                           stdin=slave, stdout=slave, stderr=subprocess.PIPE, close_fds=True,
                           process_group=0 if own_group else None)
    os.close(slave)
    return top, master


def test_top_shows_the_running_job_and_leaves_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    # Given a runner busy with a long job
    manifest = write_jobs(tmp_path / "m", [job("long-sleeper", "sleep", params={"s": "60"})])
    q, out = tmp_path / "q", tmp_path / "out"
    runner = subprocess.Popen([*RENDERCTL, "run", str(manifest), "--queue", str(q), "--out",
                               str(out), "-j", "1", "--grace", "0"], cwd=tmp_path, env=env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def sleeper_in_snapshot() -> bool:
            try:
                state = json.loads((q / "runner.state.json").read_text())
            except (OSError, ValueError):
                return False
            return any(j["id"] == "long-sleeper" for j in state["running"])

        poll(sleeper_in_snapshot, what="the runner's snapshot to show the job running")
        # When `top` runs on a terminal
        top, master = top_on_a_pty(q, tmp_path)
        try:
            # Then it shows the running job, its runner and workers
            screen = read_pty_until(master, b"long-sleeper")
            screen += read_pty_until(master, b"alive")
            assert b"\x1b[" in screen  # a live, styled view
            # And Ctrl-C leaves it quietly with exit 0
            quits_quietly_on_ctrl_c(top, master)
        finally:
            if top.poll() is None:
                top.kill()
            os.close(master)
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=30)
    # With no runner left, `top --once` says so and still shows the counts
    once = cli("top", "--queue", q, "--once", cwd=tmp_path)
    assert once.returncode == 0, once.stderr
    assert "no runner is alive" in once.stdout
    assert "pending 1" in once.stdout  # released on SIGTERM, not lost
    assert "\x1b[" not in once.stdout  # plain text on a pipe


def test_top_after_the_terminal_changed_width_draws_from_a_cleared_screen(
        tmp_path: Path) -> None:
    # Given top drawing a queue on a 140-column terminal, frame after frame
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    q = tmp_path / "q"
    assert cli("submit", manifest, "--queue", q, cwd=tmp_path).returncode == 0
    top, master = top_on_a_pty(q, tmp_path, sized=True)
    try:
        screen = read_pty_until(master, b"pending")
        screen += read_pty_until(master, b"\x1b[1A")  # a second frame, over the first
        assert b"\x1b[2J" not in screen  # (same width: only the last frame is erased)

        # When the terminal is narrowed to 60 columns (reflowing what it shows)
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 60, 0, 0))

        # Then the next frame starts from a cleared screen, as the run's dashboard does
        # (before: rich erased the old frame's rows, leaving its reflowed pieces: audit BC)
        read_pty_until(master, b"\x1b[H\x1b[2J")
        quits_quietly_on_ctrl_c(top, master)
    finally:
        if top.poll() is None:
            top.kill()
        os.close(master)


def test_top_whose_terminal_closes_exits_129_as_a_hangup(tmp_path: Path) -> None:
    # Given top drawing a queue on a terminal
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    q = tmp_path / "q"
    assert cli("submit", manifest, "--queue", q, cwd=tmp_path).returncode == 0
    # (through the installed script's entry point, whose early handlers make a stop
    # signal an exit code)
    top, master = top_on_a_pty(q, tmp_path, launcher=[sys.executable, "-m", "renderctl"])
    try:
        read_pty_until(master, b"pending")
        # When the terminal goes away (its window closed): every write fails (EIO), and
        # the kernel sends SIGHUP
        os.close(master)
        top.send_signal(signal.SIGHUP)
        code = top.wait(timeout=10)
    finally:
        if top.poll() is None:
            top.kill()
    # Then it exits 129, the hangup README's table says, quietly (the live view's last
    # write to the closed terminal made it "I/O error", exit 74: a script took a hangup
    # for a broken queue; audit CN)
    assert top.stderr is not None
    stderr = top.stderr.read().decode()
    assert code == 129, stderr
    assert "error" not in stderr.lower(), stderr


def test_top_once_on_a_pipe_prints_whole_plain_lines(tmp_path: Path) -> None:
    # Given a runner busy with a job whose id is wider than a terminal
    long_id = "a-job-id-wider-than-any-terminal-" + "x" * 80
    manifest = write_jobs(tmp_path / "m", [job(long_id, "sleep", params={"s": "60"})])
    q, out = tmp_path / "q", tmp_path / "out"
    runner = subprocess.Popen([*RENDERCTL, "run", str(manifest), "--queue", str(q), "--out",
                               str(out), "-j", "1", "--grace", "0"], cwd=tmp_path, env=env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def worker_pid() -> int | None:
            try:
                state = json.loads((q / "runner.state.json").read_text())
            except (OSError, ValueError):
                return None
            return next((j["pid"] for j in state["running"] if j["id"] == long_id), None)

        pid = poll(worker_pid, what="the runner's snapshot to show the job running")

        # When `top --once` writes to a pipe, under an 80-column COLUMNS
        once = cli("top", "--queue", q, "--once", cwd=tmp_path, extra_env={"COLUMNS": "80"})
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=30)

    # Then it prints plain lines: no box drawing, nothing cut, the whole id and the worker's
    # pid on the running job's line, the runner and the counts as the frame shows them
    assert once.returncode == 0, once.stderr
    text = once.stdout
    assert not any("\u2500" <= ch <= "\u259f" for ch in text), text  # box and bar glyphs
    assert "\u2026" not in text and "\x1b[" not in text, text
    [line] = [ln for ln in text.splitlines() if long_id in ln]
    assert line.startswith(f"running {long_id} kind=python worker_pid={pid} attempt=1 "), line
    assert f"queue {q}" in text.splitlines(), text
    assert "workers 1/1 alive" in text and "queue: pending 0  running 1  done 0" in text, text


def runner_of_a_long_job(tmp_path: Path, job_id: str) -> tuple[Path, subprocess.Popen[bytes]]:
    """A runner (one worker) started on a queue of one 60 s job: the queue and the runner."""
    manifest = write_jobs(tmp_path / "m", [job(job_id, "sleep", params={"s": "60"})])
    q = tmp_path / "q"
    runner = subprocess.Popen([*RENDERCTL, "run", str(manifest), "--queue", str(q), "--out",
                               str(tmp_path / "out"), "-j", "1"], cwd=tmp_path, env=env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return q, runner


def test_status_and_top_say_whose_pid_they_show(tmp_path: Path) -> None:
    # Given a runner busy with a long job
    q, runner = runner_of_a_long_job(tmp_path, "long")
    try:
        poll(lambda: (q / "running" / "long.json").exists(), what="the job to be claimed")
        # When status prints its plain line for the running job
        status = cli("status", "--queue", q, cwd=tmp_path)
    finally:
        # And the runner then dies without a word (its workers die with it)
        runner.kill()
        runner.wait(timeout=30)

    # Then status names the pid it shows as the lease holder's, the runner (as --json does)
    [line] = [ln for ln in status.stdout.splitlines() if ln.startswith("running long ")]
    assert line.endswith(f" holder_pid={runner.pid}"), line
    # And top, left with only the lease to go by, does not pass the runner's pid off as a
    # worker's
    once = cli("top", "--queue", q, "--once", cwd=tmp_path)
    assert once.returncode == 0, once.stderr
    [line] = [ln for ln in once.stdout.splitlines() if ln.startswith("running long ")]
    assert " worker_pid=- " in line, line


def test_top_shows_the_last_failures_of_a_long_log_reading_only_its_tail(
        tmp_path: Path) -> None:
    from renderctl.cli.top import TAIL_BYTES, TopFeed
    from renderctl.store import Queue

    # Given a log of several MB: old failures, then many completions, then 5 recent failures
    q = Queue(tmp_path / "q")
    q.events.append({"ts": 1.0, "event": "dead", "job": f"old-{i}", "outcome": "failed",
                     "error": "old"} for i in range(100))
    q.events.append({"ts": 2.0, "event": "completed", "job": f"ok-{i}", "outcome": "completed",
                     "padding": "x" * 200} for i in range(3 * TAIL_BYTES // 250))
    q.events.append({"ts": 3.0, "event": "dead", "job": f"new-{i}", "outcome": "failed",
                     "error": "recent"} for i in range(5))
    size = q.events.path.stat().st_size
    assert size > 3 * TAIL_BYTES

    # When top builds its first snapshot
    feed = TopFeed(q)
    start = feed.offset
    snap = feed.snapshot()

    # Then it read from a line's start within the last TAIL_BYTES, and shows the 5 recent
    assert size - TAIL_BYTES <= start < size
    assert q.events.path.read_bytes()[start - 1:start] == b"\n"
    assert [f["job"] for f in snap["recent_failures"]] == [f"new-{i}" for i in range(5)]


def test_tail_offset_is_the_first_whole_line_of_the_tail(tmp_path: Path) -> None:
    from renderctl.events import EventLog

    log = EventLog(tmp_path / "e.jsonl")
    assert log.tail_offset(100) == 0  # no log yet
    log.append({"n": i} for i in range(100))  # lines of 9-11 bytes
    data = log.path.read_bytes()
    for max_bytes in range(0, len(data) + 3):
        off = log.tail_offset(max_bytes)
        assert off == 0 or data[off - 1:off] == b"\n", max_bytes
        assert len(data) - off <= max_bytes or off == 0, max_bytes
        # nothing whole is left out: the line before `off` does not fit
        if off > 0:
            start = data.rfind(b"\n", 0, off - 1) + 1
            assert len(data) - start > max_bytes, max_bytes


def test_top_without_a_runner_counts_retries_from_the_log_and_names_the_output_root(
        tmp_path: Path) -> None:
    # Given a queue whose runner has gone: one job retried once, then dead-lettered
    manifest = write_jobs(tmp_path / "m", [job("flaky", "fail", max_attempts=2)])
    q, out = tmp_path / "q", tmp_path / "out"
    assert cli("run", manifest, "--queue", q, "--out", out, "--backoff-base", "0",
               cwd=tmp_path).returncode == 1

    # When top looks at it
    once = cli("top", "--queue", q, "--once", cwd=tmp_path)

    # Then its retries agree with the retry it lists among the failures, and it names the
    # output root its jobs were submitted with
    assert once.returncode == 0, once.stderr
    lines = once.stdout.splitlines()
    assert any(ln.startswith("failure flaky event=retry ") for ln in lines), lines
    assert "retries 1" in once.stdout and "retries 0" not in once.stdout, once.stdout
    assert f"output root {out}" in lines, lines


def test_top_without_a_runner_does_not_guess_retries_from_part_of_a_log(
        tmp_path: Path) -> None:
    from renderctl.cli.dashboard import dashboard_lines
    from renderctl.cli.top import TAIL_BYTES, TopFeed
    from renderctl.store import Queue

    # Given a log longer than what top reads, with a retry in its tail
    q = Queue(tmp_path / "q")
    q.events.append({"ts": 1.0, "event": "completed", "job": f"ok-{i}", "outcome": "completed",
                     "padding": "x" * 200} for i in range(2 * TAIL_BYTES // 250))
    q.events.append([{"ts": 2.0, "event": "retry", "job": "r", "attempt": 1,
                      "outcome": "failed", "error": "boom"}])

    # When top builds its snapshot
    lines = dashboard_lines(TopFeed(q).snapshot())

    # Then it shows no count rather than a wrong one
    [counts] = [ln for ln in lines if ln.startswith("queue: ")]
    assert counts.endswith("retries -"), counts


def test_top_with_a_runner_takes_the_oldest_pending_age_from_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from renderctl.cli import top
    from renderctl.store import Queue

    # Given a queue a runner holds, whose snapshot says how long its oldest job has waited
    q = Queue(tmp_path / "q")
    monkeypatch.setattr(top, "read_runner_state",
                        lambda queue: {"pid": 1, "oldest_pending_age_s": 42.0})

    # When top builds its frames, then it shows that age, and does not stat every pending
    # record for it (at 100,000 pending, ~0.3 s of each half-second frame)
    def no_scan(self: Queue) -> float:
        raise AssertionError("pending/ scanned for its oldest file")

    monkeypatch.setattr(Queue, "oldest_pending_age_s", no_scan)
    feed = top.TopFeed(q)
    assert feed.snapshot()["oldest_pending_age_s"] == 42.0
    # (without a runner, the folder is all there is)
    monkeypatch.setattr(top, "read_runner_state", lambda queue: None)
    with pytest.raises(AssertionError, match="scanned"):
        feed.snapshot()


def test_top_with_a_runner_lists_only_the_jobs_its_snapshot_says_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from renderctl.cli import top
    from renderctl.policy import ClaimIndex
    from renderctl.store import Holder, Queue

    # Given a queue with three jobs claimed (a runner's prefetch: leases in running/)
    q = Queue(tmp_path / "q")
    q.submit([{"id": j, "kind": "python", "callable": "m:f", "output": f"{j}.bin"}
              for j in ("a", "b", "c")], base=tmp_path, out_root=tmp_path / "out")
    index = ClaimIndex()
    q.load_index(index)
    claims, _ = q.claim(index, holder=Holder("h", "b", os.getpid(), None), lease_s=60,
                        limit=3, token_prefix="t")
    assert len(claims) == 3

    # When the runner's snapshot caught no job mid-run (millisecond jobs, between them)
    monkeypatch.setattr(top, "read_runner_state",
                        lambda queue: {"pid": 1, "running": [], "oldest_pending_age_s": 0})
    snap = top.TopFeed(q).snapshot()

    # Then top lists none running (before: every lease, prefetched claims included, as
    # "running" beside "workers 2/2 alive": audit BC)
    assert snap["running"] == []
    # (without a runner, the leases are all there is to show)
    monkeypatch.setattr(top, "read_runner_state", lambda queue: None)
    assert sorted(j["id"] for j in top.TopFeed(q).snapshot()["running"]) == ["a", "b", "c"]


def test_top_lists_a_folder_that_is_slow_to_list_less_often_than_each_frame(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from renderctl.cli import top
    from renderctl.clock import FakeClock
    from renderctl.store import Queue, QueueStatus

    # Given a queue whose folders take 0.2 s to list (done/ holds 300,000 records)
    clock = FakeClock()
    q = Queue(tmp_path / "q", clock=clock)
    listed = Queue.status

    def slow_status(self: Queue, **kw: bool) -> QueueStatus:
        clock.advance(0.2)
        return listed(self, **kw)

    monkeypatch.setattr(Queue, "status", slow_status)
    monkeypatch.setattr(top, "read_runner_state", lambda queue: None)
    feed = top.TopFeed(q)
    assert feed.snapshot()["queue_counts"]["dead"] == 0

    # When a job is dead-lettered meanwhile, and half-second frames follow
    (q.dir("dead") / "x.json").write_text("{}")
    frames = []
    for _ in range(8):
        clock.advance(0.5)
        frames.append(feed.snapshot()["queue_counts"]["dead"])

    # Then the folders are listed again only after ten times what a listing took (2 s:
    # they were listed at every frame, a core busy at 300,000), and then the count shows
    assert frames == [0, 0, 0, 1, 1, 1, 1, 1], frames


def test_top_on_a_dumb_terminal_prints_plain_lines_at_once(tmp_path: Path) -> None:
    from renderctl.store import Queue

    # Given a queue, and a terminal that cannot move its cursor (TERM=dumb: an editor's
    # shell buffer), where a live view draws nothing until it stops
    q = tmp_path / "q"
    Queue(q).close()

    # When `top` runs there
    top, master = top_on_a_pty(q, tmp_path, term="dumb", columns=100)
    try:
        # Then it prints the frame's lines, as on a pipe, and exits by itself
        screen = read_pty_until(master, b"no runner is alive")
        assert wait_reading_pty(top, master) == 0
    finally:
        if top.poll() is None:
            top.kill()
        os.close(master)
    assert b"\x1b[" not in screen and f"queue {q}".encode() in screen, screen


def test_ctrl_z_on_top_gives_the_terminal_its_cursor_back_and_fg_redraws(
        tmp_path: Path) -> None:
    from renderctl.store import Queue

    # Given `top` drawing its live view of a queue on a terminal, in a process group of its
    # own as a shell's job control starts it
    q = tmp_path / "q"
    Queue(q).close()
    top, master = top_on_a_pty(q, tmp_path, own_group=True)
    try:
        screen = read_pty_until(master, b"\x1b[?25l")  # the live view hides the cursor

        # When Ctrl-Z (SIGTSTP to its group) stops it
        os.killpg(top.pid, signal.SIGTSTP)
        screen += read_pty_until(master, b"\x1b[?25h")

        # Then it shows the cursor again, and then it is stopped
        poll(lambda: stopped(top.pid), what="top to be stopped")

        # And `fg` (SIGCONT to its group) draws a fresh live view, cursor hidden again
        os.killpg(top.pid, signal.SIGCONT)
        read_pty_until(master, b"\x1b[?25l")
        quits_quietly_on_ctrl_c(top, master)
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
        os.close(master)


def test_top_with_its_runner_dead_shows_its_running_jobs_as_orphaned(tmp_path: Path) -> None:
    # Given a runner busy with a long job, then SIGKILLed (its job dies with it; its record
    # stays in running/ until the next run recovers it)
    q, runner = runner_of_a_long_job(tmp_path, "long-sleeper")
    try:
        def started() -> bool:  # (claimed is not enough: its lease may not be written yet)
            res = cli("status", "--queue", q, "--json", cwd=tmp_path)
            return res.returncode == 0 and any(
                j.get("started") for j in json.loads(res.stdout)["running_jobs"])

        poll(started, what="the job to start")
    finally:
        runner.kill()
        runner.wait(timeout=30)

    # When `top --once` looks
    once = cli("top", "--queue", q, "--once", cwd=tmp_path)

    # Then the job is shown as orphaned, as `status` shows it, not as running on against its
    # timeout (audit DV)
    assert once.returncode == 0, once.stderr
    [line] = [ln for ln in once.stdout.splitlines() if ln.startswith("running long-sleeper")]
    assert "elapsed=orphaned" in line, line
    assert line.endswith("(its runner is dead: the next run recovers it)"), line
