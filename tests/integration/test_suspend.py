"""Ctrl-Z on `renderctl run`: the whole run pauses, jobs included, and the pause costs no job
its timeout. A terminal stops only its foreground process group (the runner and its fork
server); each job runs in a group of its own, so the runner stops those itself.

Real processes and signals: SIGTSTP to the runner's process group as a terminal sends it,
SIGCONT as `fg` or `kill -CONT PID` does; "stopped" is read from /proc. Also the other ways a
run gets paused in part (SIGSTOP of its group, a terminal's Ctrl-S), which must not stop it
supervising."""

from __future__ import annotations

import contextlib
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
from typing import Any

import psutil
import pytest
from jobfns import (
    RENDERCTL,
    QueueView,
    Runner,
    _env,
    assert_pdf,
    cgroup_v1_writable,
    cli_args,
    held_job,
    hold_spawned_workers,
    py_job,
    signal_mask,
    stage,
    stopped,
    wait_for_pid,
    wait_until,
)

TSTP_BIT = 1 << (signal.SIGTSTP - 1)


def ctrl_z(runner: Runner, pid: int, what: str) -> None:
    """SIGTSTP to the runner's process group, as a terminal's Ctrl-Z sends it; returns once
    the runner said `suspended` and it and ``pid`` (``what``) are stopped."""
    os.killpg(runner.pid, signal.SIGTSTP)
    runner.until(lambda line: line.startswith("suspended"))
    wait_until(lambda: stopped(runner.pid) and stopped(pid), timeout_s=10,
               what=f"the runner and {what} to be stopped")


def new_terminal(*, no_color: bool) -> tuple[int, int, dict[str, str]]:
    """A new 120x40 terminal (a pty): its master and slave ends, and the environment of a
    process drawn on it (NO_COLOR unset unless ``no_color``)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**_env(None), "TERM": "xterm-256color"}
    if not no_color:
        env.pop("NO_COLOR")
    return master, slave, env


def read_for(master: int, seen: bytearray, s: float) -> None:
    """Add what the terminal shows in the next ``s`` seconds to ``seen``."""
    deadline = time.monotonic() + s
    while (left := deadline - time.monotonic()) > 0:
        if select.select([master], [], [], left)[0]:
            try:
                seen.extend(os.read(master, 65536))
            except OSError:
                return  # EIO: nothing holds the terminal any more


def run_on_a_terminal(queue: Path, out: Path, manifest: Path, *extra: str, workers: int = 1,
                      no_color: bool = False, stalled: bool = False,
                      ) -> tuple[subprocess.Popen[bytes], int]:
    """`renderctl run --workers N MANIFEST` on a new 120x40 terminal (a pty), in a process
    group of its own as a shell starts it: the process and the terminal's master end.
    ``stalled``: a terminal whose reader stopped reading, almost full (see stall)."""
    master, slave, env = new_terminal(no_color=no_color)
    if stalled:
        stall(master, slave)
    proc = subprocess.Popen([*RENDERCTL, "run", *cli_args(queue, out, "--workers", str(workers)),
                             *extra, str(manifest)], stdin=slave, stdout=slave,
                            stderr=subprocess.PIPE, env=env, process_group=0)
    os.close(slave)
    return proc, master


def end_on_a_terminal(proc: subprocess.Popen[bytes], master: int) -> None:
    """Kill a run started by run_on_a_terminal unless it ended, and close its terminal."""
    with contextlib.suppress(OSError):
        os.write(master, b"\x11")  # (Ctrl-Q, in case it was left stopped)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    os.close(master)


def stall(master: int, slave: int) -> None:
    """Fill terminal ``slave`` as a program that outran its reader does (an SSH session on a
    network gone quiet), then let the reader take a few KB: room for less than a few more."""
    writer = os.open(os.ttyname(slave), os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(writer, b"." * 256)
        os.read(master, 4095)
        room = select.poll()
        room.register(writer, select.POLLOUT)
        wait_until(lambda: room.poll(0), what="the terminal to take more")
    finally:
        os.close(writer)


def continue_runner(runner: Runner) -> str:
    """SIGCONT to the runner alone (`kill -CONT PID`); its `resumed` line."""
    os.kill(runner.pid, signal.SIGCONT)
    return runner.until(lambda line: line.startswith("resumed"))


@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_ctrl_z_pauses_the_jobs_with_the_runner_and_the_pause_costs_no_timeout(
        tmp_path: Path, write_manifest: Any, start_method: str) -> None:
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a run, in a process group of its own as a shell starts it, whose one worker is
    # replaced after each job, running the first of two jobs with a 2 s timeout (workers
    # from the fork server, or forked from the runner itself)
    first, go1 = held_job(tmp_path, "first", timeout_s=2)
    second, go2 = held_job(tmp_path, "second", timeout_s=60)  # held until exec_s is read
    manifest = write_manifest([first, second])
    runner = Runner(*cli_args(queue, out, "--workers", "1", "--max-jobs-per-worker", "1",
                              "--start-method", start_method), manifest, own_group=True)
    try:
        job = wait_for_pid(tmp_path / "first.pid")

        # When the terminal sends SIGTSTP (Ctrl-Z) to the runner's process group
        # Then the runner says so and stops, and the job, in a group of its own, stops too
        ctrl_z(runner, job, "its job")
        # but not the fork server, which ignores it (a runner starting a worker waits on
        # it: stopped, it held the runner short of its pause, and the run hung), while the
        # job, forked from it, started with SIGTSTP's default action like every other
        assert not TSTP_BIT & signal_mask(job)
        if start_method == "forkserver":
            server = next(p for p in psutil.Process(runner.pid).children()
                          if "multiprocessing.forkserver" in " ".join(p.cmdline()))
            assert not stopped(server.pid) and TSTP_BIT & signal_mask(server.pid)
        # and stays stopped for a pause longer than its timeout (the pause is the test)
        time.sleep(2.5)
        assert stopped(job) and stopped(runner.pid)
        assert not (out / "first.pdf").exists()

        # When only the runner is continued (`kill -CONT PID`), and the job is then let
        # finish
        resumed = continue_runner(runner)
        go1.touch()

        # Then the run's execution times, for the dashboard and the prefetch depth, leave
        # the pause out, as the attempt's record and the metric do (before: p99 2.6 s for a
        # job of a few ms: audit BC)
        def exec_times() -> dict[str, Any] | None:
            with contextlib.suppress(OSError, ValueError):  # (between its writes)
                exec_s: dict[str, Any] | None = json.loads(
                    (queue / "runner.state.json").read_text())["exec_s"]
                return exec_s  # None until a job has finished
            return None

        assert wait_until(exec_times, timeout_s=20)["p99"] < 1.5
        go2.touch()

        # And the run goes on: the job completes in its one attempt (the pause did not count
        # against its 2 s timeout), and the second job gets a new worker
        assert runner.wait() == 0, (runner.lines, runner.stderr())
    finally:
        go1.touch()
        go2.touch()
        runner.kill()
    assert float(resumed.split("after ")[1].split("s ")[0]) >= 2.5, resumed  # the pause, told
    view = QueueView(queue)
    assert view.ids("done") == {"first", "second"}, runner.lines
    attempts = view.record("done", "first")["attempts"]
    assert [a["outcome"] for a in attempts] == ["completed"], attempts
    # And its attempt says how much of its (wall-clock) elapsed time was the pause
    assert 2.5 <= attempts[0]["paused_s"] <= attempts[0]["elapsed_s"], attempts
    assert "paused_s" not in view.record("done", "second")["attempts"][0]
    for j in ("first", "second"):
        assert_pdf(out / f"{j}.pdf", j)


def test_sigtstp_to_a_runner_nothing_could_continue_does_not_stop_it(
        tmp_path: Path, write_manifest: Any) -> None:
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a run in a session of its own (a service, a detached job: an orphaned process
    # group, which the kernel does not let SIGTSTP stop) running a job
    job, go = held_job(tmp_path, "solo", timeout_s=30)
    runner = Runner(*cli_args(queue, out, "--workers", "1", "--json"), write_manifest([job]),
                    new_session=True)
    try:
        pid = wait_for_pid(tmp_path / "solo.pid")
        # When it gets SIGTSTP
        os.kill(runner.pid, signal.SIGTSTP)
        # Then it pauses and resumes at once, its job with it: nothing is left stopped
        line = runner.until(lambda line: '"resumed"' in line)
        assert json.loads(line)["paused_s"] < 1.0, line
        assert not stopped(runner.pid) and not stopped(pid)
        go.touch()
        assert runner.wait() == 0, (runner.lines, runner.stderr())
    finally:
        go.touch()
        runner.kill()
    events = [json.loads(line) for line in runner.lines]
    suspended = next(e for e in events if e["event"] == "suspended")
    assert suspended["running"] == 1 and suspended["pid"] == runner.pid, suspended
    assert_pdf(out / "solo.pdf", "solo")


def test_ctrl_z_gives_the_terminal_its_cursor_back_and_fg_redraws_the_dashboard(
        tmp_path: Path, write_manifest: Any) -> None:
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a run drawing its dashboard on a terminal, running a job
    job, go = held_job(tmp_path, "shown", timeout_s=30)
    proc, master = run_on_a_terminal(queue, out, write_manifest([job]))
    seen = bytearray()
    try:
        wait_for_pid(tmp_path / "shown.pid")
        wait_until(lambda: read_for(master, seen, 0.05) or b"\x1b[?25l" in seen, timeout_s=20,
                   what="the dashboard to hide the cursor")
        # When Ctrl-Z stops it
        os.killpg(proc.pid, signal.SIGTSTP)
        wait_until(lambda: stopped(proc.pid), timeout_s=10, what="the runner to stop")
        read_for(master, seen, 0.2)
        # Then the cursor was shown again before it stopped (the shell's prompt needs it)
        hidden_at = seen.rindex(b"\x1b[?25l")
        assert seen.find(b"\x1b[?25h", hidden_at) != -1, bytes(seen[hidden_at:])
        before = len(seen)

        # And `fg` (SIGCONT to its group) draws the dashboard afresh, cursor hidden again
        os.killpg(proc.pid, signal.SIGCONT)
        wait_until(lambda: read_for(master, seen, 0.05) or b"\x1b[?25l" in seen[before:],
                   timeout_s=20,
                   what="the dashboard to be drawn again")
        go.touch()
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert_pdf(out / "shown.pdf", "shown")


def test_ctrl_z_while_a_spawned_worker_starts_and_kill_cont_of_the_runner_goes_on(
        tmp_path: Path, write_manifest: Any) -> None:
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a run with `--start-method spawn`, whose one worker is replaced after each job,
    # and a hook that holds every spawned worker after the first in its start (a new
    # interpreter importing its modules: ~0.1 s or more, in the runner's process group till
    # it has a group of its own, so a terminal's Ctrl-Z stops it with the runner). Armed
    # from the start: the successor is spawned as the first job is handed out; armed once
    # that job ran, the successor could pass the hook first, and the hold then waited on
    # the first job's done record and a third worker's start (20 s once, under load).
    env, hold = hold_spawned_workers(tmp_path, skip=1)
    (hold / "armed").touch()
    first, go1 = held_job(tmp_path, "first", timeout_s=30)
    second, go2 = held_job(tmp_path, "second", timeout_s=30)
    go2.touch()
    runner = Runner(*cli_args(queue, out, "--workers", "1", "--max-jobs-per-worker", "1",
                              "--start-method", "spawn"),
                    write_manifest([first, second]), env=env, own_group=True)
    try:
        wait_for_pid(tmp_path / "first.pid")
        go1.touch()
        starting = wait_for_pid(hold / "starting.pid")  # the next worker, held in its start

        # When the terminal sends SIGTSTP (Ctrl-Z) to the runner's process group
        ctrl_z(runner, starting, "the starting worker")
        # ... and only the runner is continued (`kill -CONT PID`)
        continue_runner(runner)

        # Then the runner continues the worker the terminal stopped with it (left stopped,
        # it never said it was ready, and the run waited for it for good)
        wait_until(lambda: not stopped(starting), timeout_s=10,
                   what="the starting worker to be continued")
        (hold / "release").touch()
        assert runner.wait() == 0, (runner.lines, runner.stderr())
    finally:
        for f in (go1, hold / "release"):
            f.touch()
        runner.kill()
    assert QueueView(queue).ids("done") == {"first", "second"}, runner.lines
    for j in ("first", "second"):
        assert_pdf(out / f"{j}.pdf", j)


@pytest.mark.skipif(not cgroup_v1_writable(), reason="needs the cgroup guard (v1 writable)")
def test_ctrl_z_pauses_a_process_that_left_its_jobs_group(
        tmp_path: Path, write_manifest: Any) -> None:
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a run, in a process group of its own as a shell starts it, whose job started a
    # daemon (setsid(): a session and group of its own, out of the worker's group) and
    # still runs
    stage(tmp_path)
    daemon_pid = tmp_path / "daemon.pid"
    job = {**py_job("d", "leave_a_daemon", pidfile=str(daemon_pid), hang_s=2),
           "timeout_s": 60}
    runner = Runner(*cli_args(queue, out, "--workers", "1"), write_manifest([job]),
                    own_group=True)
    daemon = None
    try:
        daemon = wait_for_pid(daemon_pid, what="the daemon to start")
        assert os.getpgid(daemon) == os.getsid(daemon) != os.getsid(runner.pid)  # its own

        # When the terminal sends SIGTSTP (Ctrl-Z) to the runner's process group
        # Then the daemon is paused with the run (before, it ran on unwatched)
        ctrl_z(runner, daemon, "the daemon")

        # And when the runner is continued, it is too, and the run ends as it would have
        continue_runner(runner)
        wait_until(lambda: not psutil.pid_exists(daemon) or not stopped(daemon),
                   timeout_s=10, what="the daemon to be continued")
        assert runner.wait() == 0, (runner.lines, runner.stderr())
    finally:
        runner.kill()
        if daemon is not None:
            with contextlib.suppress(OSError):
                os.kill(daemon, signal.SIGKILL)
    assert QueueView(queue).ids("done") == {"d"}, runner.lines
    assert_pdf(out / "d.pdf", "d")


def test_ctrl_z_continues_each_job_process_once(tmp_path: Path, write_manifest: Any) -> None:
    ROUNDS = 6  # noqa: N806
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a run, in a process group of its own as a shell starts it, whose python job
    # counts the SIGCONTs it is sent
    stage(tmp_path)
    pidfile, go, count = tmp_path / "c.pid", tmp_path / "go", tmp_path / "conts"
    job = {**py_job("c", "count_sigconts", pidfile=str(pidfile), go=str(go),
                    countfile=str(count)), "max_attempts": 1}
    runner = Runner(*cli_args(queue, out, "--workers", "1"), write_manifest([job]),
                    own_group=True)
    try:
        pid = wait_for_pid(pidfile)

        # When the terminal sends SIGTSTP (Ctrl-Z), and the runner is continued, six times
        # (two SIGCONTs sent microseconds apart to a stopped process are often delivered as
        # one: six rounds make a double sending show)
        for n in range(1, ROUNDS + 1):
            ctrl_z(runner, pid, "the job")
            continue_runner(runner)
            # (its SIGCONT taken before the next stop, which would discard it unseen)
            wait_until(lambda n=n: int(count.read_text()) >= n, timeout_s=10,
                       what="the job to see its SIGCONT")
        go.touch()
        assert runner.wait() == 0, (runner.lines, runner.stderr())
    finally:
        go.touch()
        runner.kill()

    # Then the job was continued once a round: before, its group's SIGCONT was sent again
    # to each process of its worker's slot (a job's SIGCONT handler ran twice)
    assert count.read_text() == str(ROUNDS)
    assert_pdf(out / "c.pdf", "c")


@pytest.mark.parametrize("then", ["jobs_end", "sigterm"])
def test_a_runner_continued_alone_after_a_sigstop_of_its_group_still_ends(
        tmp_path: Path, write_manifest: Any, then: str) -> None:
    from renderctl.errors import ExitCode

    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a runner in a process group of its own (with its fork server), two jobs running
    stage(tmp_path)
    manifest = write_manifest([py_job(j, "sleep_then_write", s=1.5) for j in ("a", "b")])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "2", "--grace", "0.2",
                                        "--json", "--start-method", "forkserver"),
                    own_group=True)
    try:
        for j in ("a", "b"):
            runner.until(lambda ln, j=j: '"started"' in ln and f'"{j}"' in ln)
        server = next(p.pid for p in psutil.Process(runner.pid).children()
                      if "multiprocessing.forkserver" in " ".join(p.cmdline()))

        # When that whole group is stopped (SIGSTOP) and only the runner continued; then
        # the jobs end, or a SIGTERM asks it to stop
        os.killpg(runner.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(runner.pid) and stopped(server),
                   what="the runner and its fork server to be stopped")
        os.kill(runner.pid, signal.SIGCONT)
        if then == "sigterm":
            runner.proc.send_signal(signal.SIGTERM)

        # Then the run ends as it would have (before: the fork server stayed stopped, and the
        # runner waited for good at its exit, or spun at 100% CPU in a drain that never
        # ended), and nothing of it is left stopped
        code = runner.wait(30)
        if then == "jobs_end":
            assert code == ExitCode.OK, runner.lines
            assert QueueView(queue).ids("done") == {"a", "b"}
        else:
            assert code == ExitCode.SIGTERM, runner.lines
            assert QueueView(queue).ids("pending") | QueueView(queue).ids("done") == {"a", "b"}
        wait_until(lambda: not psutil.pid_exists(server) or not stopped(server),
                   what="the fork server to go")
    finally:
        runner.kill()


def test_a_runner_continued_alone_after_a_sigstop_of_its_group_still_starts_workers(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import run_cli

    from renderctl.errors import ExitCode

    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a following runner in a process group of its own (with its fork server), whose
    # one worker is replaced after each job
    stage(tmp_path)
    runner = Runner(*cli_args(queue, out, "--workers", "1", "--max-jobs-per-worker", "1",
                              "--follow", "--json", "--start-method", "forkserver"),
                    own_group=True)
    try:
        runner.until(lambda ln: '"runner_started"' in ln)
        server = next(p.pid for p in psutil.Process(runner.pid).children()
                      if "multiprocessing.forkserver" in " ".join(p.cmdline()))
        # (its worker ready, in a group of its own: one still starting is in the server's,
        # stopped with it, and judged by the start timeout)
        wait_until(lambda: any(p.pid != server and os.getpgid(p.pid) == p.pid
                               for p in psutil.Process(server).children()),
                   what="the worker to be ready")

        # When that whole group is stopped by SIGSTOP (not Ctrl-Z's SIGTSTP, which the fork
        # server ignores), and only the runner is continued (`kill -CONT PID`)
        os.killpg(runner.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(runner.pid) and stopped(server),
                   what="the runner and its fork server to be stopped")
        os.kill(runner.pid, signal.SIGCONT)
        wait_until(lambda: not stopped(runner.pid), what="the runner to go on")

        # Then jobs submitted now still run, each needing a new worker from the fork server
        # (before: the runner waited on the stopped server for good, at the first start)
        ids = ["a", "b", "c"]
        assert run_cli("submit", write_manifest([py_job(j, "write_pdf") for j in ids]),
                       *cli_args(queue, out)).returncode == 0
        for j in ids:
            runner.until(lambda ln, j=j: '"completed"' in ln and f'"{j}"' in ln, timeout_s=30)
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM, runner.lines
    finally:
        runner.kill()
    for j in ids:
        assert_pdf(out / f"{j}.pdf", j)


@pytest.mark.parametrize("shown", ["dashboard", "plain", "json"])
def test_ctrl_s_on_the_terminal_does_not_stop_the_run_supervising_its_jobs(
        tmp_path: Path, write_manifest: Any, shown: str) -> None:
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a run on a terminal (its dashboard; plain lines under NO_COLOR; JSON Lines),
    # running a job that ends when told and one of one attempt that would take 30 s but
    # has a 2 s timeout
    stage(tmp_path)
    pid = tmp_path / "slow.pid"
    quick, go = held_job(tmp_path, "quick", timeout_s=60)
    job = {**py_job("slow", "sleep_then_write", s=30, pidfile=str(pid)),
           "timeout_s": 2, "max_attempts": 1}
    proc, master = run_on_a_terminal(queue, out, write_manifest([quick, job]),
                                     *(["--json"] if shown == "json" else []), workers=2,
                                     no_color=shown == "plain")
    seen = bytearray()

    def read_some() -> int:  # (what the terminal shows; it is never left unread)
        if select.select([master], [], [], 0.05)[0]:
            with contextlib.suppress(OSError):
                chunk = os.read(master, 65536)
                seen.extend(chunk)
                return len(chunk)
        return 0

    try:
        wait_until(lambda: read_some() < 0 or (pid.exists() and (tmp_path / "quick.pid")
                                               .exists()), what="the jobs to start")

        # When the user presses Ctrl-S (XOFF): the terminal stops taking output, and then
        # the first job completes (a line, or a frame, to show)
        os.write(master, b"\x13")
        go.touch()

        # Then the run still supervises its job meanwhile: killed at its timeout and
        # dead-lettered (before: the next frame or line waited for Ctrl-Q, and the runner's
        # whole loop with it)
        wait_until(lambda: read_some() < 0 or "slow" in QueueView(queue).ids("dead"),
                   timeout_s=15, what="the job to be killed at its timeout")
        # And after Ctrl-Q the run ends as usual, its lines all shown, in order
        os.write(master, b"\x11")
        wait_until(lambda: read_some() < 0 or proc.poll() is not None, timeout_s=30,
                   what="the run to end")
        assert proc.returncode == 1, proc.stderr.read() if proc.stderr else ""
        while read_some():
            pass
        text = seen.decode(errors="replace")
        if shown == "plain":
            assert text.index("runner started") < text.index("completed quick") \
                < text.index("dead      slow") < text.index("summary: done 1, dead 1"), text
        if shown == "json":
            assert text.index('"runner_started"') < text.index('"completed"') \
                < text.index('"dead"') < text.index('"summary"'), text
    finally:
        end_on_a_terminal(proc, master)
    attempts = QueueView(queue).record("dead", "slow")["attempts"]
    assert [a["outcome"] for a in attempts] == ["timeout"], attempts


@pytest.mark.parametrize("shown", ["dashboard", "plain", "json"])
def test_a_terminal_whose_reader_stalled_does_not_stop_the_run_supervising_its_jobs(
        tmp_path: Path, write_manifest: Any, shown: str) -> None:
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a run on a terminal whose reader stalled with room for a few KB more (its
    # dashboard; plain lines under NO_COLOR; JSON Lines), of 80 quick jobs and one of one
    # attempt that would take 30 s but has a 3 s timeout
    stage(tmp_path)
    slow = {**py_job("slow", "sleep_then_write", s=30), "timeout_s": 3, "max_attempts": 1}
    quick = [py_job(f"q{n}", "write_one_byte", output=f"q{n}.bin") for n in range(80)]
    proc, master = run_on_a_terminal(queue, out, write_manifest([slow, *quick]),
                                     *(["--json"] if shown == "json" else []), workers=2,
                                     no_color=shown == "plain", stalled=True)
    seen = bytearray()
    try:
        # When the run writes more than the terminal has room for (its lines, its frames)
        # Then it still supervises its job while nobody reads: killed at its timeout and
        # dead-lettered (before: a write the poll let through found less room than it
        # needed and waited, and the runner's whole loop with it)
        wait_until(lambda: proc.poll() is not None or "slow" in QueueView(queue).ids("dead"),
                   timeout_s=20, what="the job to be killed at its timeout")
        assert QueueView(queue).ids("done") == {f"q{n}" for n in range(80)}

        # And once the reader reads again, the run ends as usual, its lines all shown, in
        # order
        def ended() -> bool:
            read_for(master, seen, 0.05)
            return proc.poll() is not None

        wait_until(ended, timeout_s=30, what="the run to end")
        read_for(master, seen, 0.2)
        assert proc.returncode == 1, proc.stderr.read() if proc.stderr else ""
        text = seen.decode(errors="replace")
        if shown == "json":
            events = [json.loads(ln[ln.index("{"):]) for ln in text.splitlines() if "{" in ln]
            assert [e["event"] for e in events if e["event"] in ("completed", "dead")] \
                .count("completed") == 80
            assert events[-1]["event"] == "summary" and events[-1]["counts"]["dead"] == 1
        else:
            assert "summary: done 80, dead 1" in text, text[-2000:]
        if shown == "plain":
            assert text.index("runner started") < text.index("dead      slow") \
                < text.index("summary:"), text[-2000:]
    finally:
        end_on_a_terminal(proc, master)
    attempts = QueueView(queue).record("dead", "slow")["attempts"]
    assert [a["outcome"] for a in attempts] == ["timeout"], attempts


# A shell's `renderctl run ... &` on a terminal: a session whose controlling terminal is the
# pty, this launcher its foreground group, the run forked into a group of its own (the
# background), the terminal set to `stty tostop` if asked. The launcher says the run's pid,
# then each stop of it ("stopped N", as a shell's "[1]+ Stopped (tty output)"), and exits
# with its code.
LAUNCH_IN_THE_BACKGROUND = r"""
import os, sys, termios
os.setsid()
tty = os.open(sys.argv[1], os.O_RDWR)  # a session leader's first terminal: its controlling one
if sys.argv[2] == "tostop":
    mode = termios.tcgetattr(tty)
    mode[3] |= termios.TOSTOP
    termios.tcsetattr(tty, termios.TCSANOW, mode)
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    os.dup2(tty, 0)
    os.dup2(tty, 1)
    os.execv(sys.argv[3], sys.argv[3:])
try:
    os.setpgid(pid, pid)  # as a shell does, in both: whichever runs first
except PermissionError:
    pass  # EACCES: the child has exec'd already, having set its group itself (under load)
print(pid, flush=True)
while True:
    _, status = os.waitpid(pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        print("stopped", os.WSTOPSIG(status), flush=True)
        continue
    sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_in_the_background(queue: Path, out: Path, manifest: Path, *, tostop: bool,
                          dashboard: bool) -> tuple[subprocess.Popen[str], int, int]:
    """`renderctl run --workers 2 MANIFEST &` on a new 120x40 terminal (see
    LAUNCH_IN_THE_BACKGROUND): the launcher, the run's pid and the terminal's master end."""
    master, slave, env = new_terminal(no_color=not dashboard)
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCH_IN_THE_BACKGROUND, os.ttyname(slave),
         "tostop" if tostop else "-", *RENDERCTL, "run",
         *cli_args(queue, out, "--workers", "2"), str(manifest)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    os.close(slave)
    assert launcher.stdout is not None
    try:
        return launcher, int(launcher.stdout.readline()), master
    except ValueError:
        launcher.kill()
        os.close(master)
        raise


def read_until_exit(launcher: subprocess.Popen[str], master: int) -> str:
    """What the terminal shows until the launcher exits (and 0.2 s of quiet after)."""
    seen = bytearray()
    deadline = time.monotonic() + 30
    while launcher.poll() is None and time.monotonic() < deadline:
        if select.select([master], [], [], 0.1)[0]:
            with contextlib.suppress(OSError):
                seen.extend(os.read(master, 65536))
    with contextlib.suppress(OSError):
        while select.select([master], [], [], 0.2)[0]:
            seen.extend(os.read(master, 65536))
    return seen.decode(errors="replace")


def end_launch(launcher: subprocess.Popen[str], pid: int, master: int) -> None:
    if launcher.poll() is None and pid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    if launcher.poll() is None:
        launcher.kill()
    launcher.wait()
    os.close(master)


@pytest.mark.parametrize("display", ["dashboard", "plain"])
def test_a_run_in_the_background_under_tostop_runs_its_jobs_and_stops_only_to_report(
        tmp_path: Path, write_manifest: Any, display: str) -> None:
    from jobfns import run_cli

    # Given `renderctl run` started in the background (`&`) on a terminal set to stop a
    # background process that writes to it (`stty tostop`), with the dashboard or plain lines
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    ids = ["a", "b", "c"]
    manifest = write_manifest([py_job(j, "write_pdf") for j in ids])
    launcher, pid, master = run_in_the_background(queue, out, manifest, tostop=True,
                                                  dashboard=display == "dashboard")
    assert launcher.stdout is not None
    try:
        # When it runs
        # Then every job completes while it stays in the background: it holds its lines
        # instead of writing them (the kernel stopped it at its first line, the "accepted"
        # one, before it ran any job)
        wait_until(lambda: QueueView(queue).ids("done") == set(ids), timeout_s=60,
                   what=lambda: f"the jobs to complete; the run is {psutil.Process(pid).status()}")
        # and it stops only then, to write them, the queue let go by then
        assert launcher.stdout.readline().split() == ["stopped", str(int(signal.SIGTTOU))]
        status = run_cli("status", "--queue", queue)
        assert "no runner" in status.stdout, status.stdout

        # When the user brings it to the foreground (here: tostop cleared, and continued)
        mode = termios.tcgetattr(master)
        mode[3] &= ~termios.TOSTOP
        termios.tcsetattr(master, termios.TCSANOW, mode)
        os.killpg(pid, signal.SIGCONT)

        # Then it writes what it held, in order, and exits 0
        text = read_until_exit(launcher, master)
        assert launcher.wait(5) == 0, (text, launcher.stderr.read() if launcher.stderr else "")
    finally:
        end_launch(launcher, pid, master)
    # (the dashboard's last frame below the line written before it, as in the foreground)
    after = "output root" if display == "dashboard" else "summary: done 3"
    assert 0 <= text.index("accepted 3 job(s)") < text.index(after) \
        < text.index("summary: done 3") + 1, text
    for j in ids:
        assert_pdf(out / f"{j}.pdf", j)


def test_the_dashboard_of_a_run_in_the_background_waits_for_the_foreground(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given `renderctl run ... &` on a terminal (no tostop: a background process may write),
    # with the dashboard, one job done and one held running
    queue, out = tmp_path / "q", tmp_path / "out"
    held, go = held_job(tmp_path, "held")
    manifest = write_manifest([py_job("quick", "write_pdf"), held])
    launcher, pid, master = run_in_the_background(queue, out, manifest, tostop=False,
                                                  dashboard=True)
    try:
        wait_for_pid(tmp_path / "held.pid")
        wait_until(lambda: "quick" in QueueView(queue).ids("done"), what="quick to complete")

        # When it runs on in the background for a second (four frames' time)
        shown = bytearray()
        read_for(master, shown, 1.0)

        # Then it drew no frame over the shell's screen (it drew them there, four a second)
        assert b"output root" not in shown, shown.decode(errors="replace")
        # And at its end, it draws the last frame and the summary all the same
        go.touch()
        text = read_until_exit(launcher, master)
        assert launcher.wait(5) == 0, text
    finally:
        end_launch(launcher, pid, master)
    assert "output root" in text and "summary: done 2" in text, text


# Lines held by a process in the background under tostop, past a hold limit of 3.
HOLD_PAST_THE_LIMIT = """
import sys
from renderctl.cli.reporters import Lines
Lines.HOLD_MAX = 3
lines = Lines()
for n in range(10):
    lines.write(f"line {n}\\n")
print("held", len(lines.held), "dropped", lines.dropped, file=sys.stderr, flush=True)
lines.flush(wait=True)
"""


def test_lines_held_in_the_background_past_the_limit_drop_the_oldest_not_stop_the_run(
        tmp_path: Path) -> None:
    # Given `run`'s lines on a terminal set to tostop, written in the background, more of
    # them than it holds (here 3, 100,000 in a run: hours of a --follow run)
    master, slave = pty.openpty()
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCH_IN_THE_BACKGROUND, os.ttyname(slave), "tostop",
         sys.executable, "-c", HOLD_PAST_THE_LIMIT],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(None))
    os.close(slave)
    assert launcher.stdout is not None and launcher.stderr is not None
    pid = 0
    try:
        pid = int(launcher.stdout.readline())

        # When it writes them
        # Then it stops (SIGTTOU) only at its end, to write what it holds: not as it wrote
        # them, where waiting for room is the kernel's stop; the oldest went, 3 stay held
        assert launcher.stdout.readline().split() == ["stopped", str(int(signal.SIGTTOU))]
        assert select.select([launcher.stderr], [], [], 5)[0], "stopped before its end"
        assert launcher.stderr.readline().split() == ["held", "3", "dropped", "7"]

        # When it is in the foreground again: the note, then the lines held, in order
        mode = termios.tcgetattr(master)
        mode[3] &= ~termios.TOSTOP
        termios.tcsetattr(master, termios.TCSANOW, mode)
        os.killpg(pid, signal.SIGCONT)
        text = read_until_exit(launcher, master)
        assert launcher.wait(5) == 0
        assert "7 earlier line(s) were dropped" in launcher.stderr.read()
    finally:
        end_launch(launcher, pid, master)
    assert [ln for ln in text.splitlines() if ln.startswith("line")] == [
        "line 7", "line 8", "line 9"], text


def test_the_dashboard_counts_jobs_claimed_ahead_and_a_stop_neither_loses_them_nor_retries(
        tmp_path: Path, write_manifest: Any) -> None:
    import json
    import re

    from renderctl.cli.dashboard import dashboard_lines

    # Given four held jobs for one worker, all claimed at once (--prefetch 4): one runs,
    # three wait queued in the worker
    jobs = [held_job(tmp_path, f"h{n}", priority=4 - n)[0] for n in range(4)]
    manifest = write_manifest(jobs)
    queue, out = tmp_path / "q", tmp_path / "out"
    proc, master = run_on_a_terminal(queue, out, manifest, "--prefetch", "4", "--grace", "0.2")
    seen = bytearray()
    try:
        wait_for_pid(tmp_path / "h0.pid")

        # Then the runner's figures count the three as pending, not started (they were in
        # no count: "pending 0  running 1", and the folders said running 4)
        def counts_line() -> str | None:
            read_for(master, seen, 0.05)
            try:
                snap = json.loads((queue / "runner.state.json").read_text())
            except (OSError, ValueError):
                return None
            line = next(ln for ln in dashboard_lines(snap) if ln.startswith("this run:"))
            return line if snap.get("running") and snap.get("not_started") == 3 else None

        line = wait_until(counts_line, what="the runner's state with one job running")
        assert line.startswith("this run: pending 3  running 1  done 0"), line

        # When it is stopped (SIGTERM; the running job is released after a 0.2 s grace)
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None:
            read_for(master, seen, 0.1)
        read_for(master, seen, 0.3)
    finally:
        end_on_a_terminal(proc, master)
    assert proc.returncode == 143
    # Then its last frame has all four pending again (the three released unstarted were
    # counted nowhere: "0/1 jobs, pending 1") and no retry (a release is not one)
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))
    last = screen[screen.rindex("this run:"):]
    assert re.match(r"this run: pending 4\s+running 0\s+done 0", last), last[:200]
    assert re.search(r"retries\s+0\b", last), last[:300]  # (it may wrap there)
    # (nor a failure: h0's release was listed among "the last failures"; audit CN)
    assert "released" not in last, last
    assert re.findall(r"\b\d+/\d+ jobs\b", screen)[-1] == "0/4 jobs", screen[-2000:]
    assert QueueView(queue).ids("pending") == {f"h{n}" for n in range(4)}


def test_a_sigcont_that_comes_before_the_runner_stops_itself_is_not_lost(
        tmp_path: Path, write_manifest: Any) -> None:
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a run with a job running, which SIGSTOPs itself at `suspend:stopping` (jobs
    # paused for a Ctrl-Z, the runner not yet stopped): the moment a SIGCONT sent soon after
    # the SIGTSTP can reach it (50 ms after, while the loop was busy starting workers, the
    # run stayed stopped for good, holding the queue)
    job, go = held_job(tmp_path, "j", timeout_s=60)
    runner = Runner(*cli_args(queue, out, "--workers", "1"), write_manifest([job]),
                    env={"RENDERCTL_STOP_AT": "suspend:stopping"}, own_group=True)
    try:
        pid = wait_for_pid(tmp_path / "j.pid")
        os.killpg(runner.pid, signal.SIGTSTP)
        runner.until(lambda line: line.startswith("suspended"))
        wait_until(lambda: stopped(runner.pid) and stopped(pid), timeout_s=10,
                   what="the runner (at its stop point) and the job to be stopped")

        # When the one SIGCONT comes (`kill -CONT PID`), before the runner's own stop
        os.kill(runner.pid, signal.SIGCONT)

        # Then the pause ends there: the job is continued, and the run finishes it, with no
        # second SIGCONT
        runner.until(lambda line: line.startswith("resumed"))
        wait_until(lambda: not stopped(pid), timeout_s=10, what="the job to be continued")
        go.touch()
        assert runner.wait() == 0, (runner.lines, runner.stderr())
    finally:
        go.touch()
        runner.kill()
    assert QueueView(queue).ids("done") == {"j"}
    assert_pdf(out / "j.pdf", "j")
