"""Python jobs that fight the worker they run in: the guards still hold and the pool goes on.

A ``python`` job runs inside its worker process, so it can do to that process what any code
can. These are the accidents (and carelessness) a job is capable of: leaving its worker's
process group, leaving a daemon behind, closing the worker's descriptors. Each must cost
that job its attempt, never another job's, and never the run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from jobfns import (
    RENDERCTL,
    QueueView,
    Runner,
    assert_pdf,
    cgroup_v1_writable,
    cli_args,
    held_job,
    json_lines,
    pdf_text,
    py_job,
    run_cli,
    stage,
    wait_for_pid,
    wait_until,
)

MB = 1 << 20
needs_cgroup_v1 = pytest.mark.skipif(not cgroup_v1_writable(),
                                     reason="cgroup v1 memory controller not writable here")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_job_that_moves_its_worker_out_of_its_group_still_times_out(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that moves its worker into another process group and hangs, and a job after it
    stage(tmp_path)
    pidfile = tmp_path / "worker.pid"
    manifest = write_manifest([
        {**py_job("escaper", "leave_group_and_hang", s=600, pidfile=str(pidfile)),
         "timeout_s": 1, "max_attempts": 1},
        py_job("next", "write_pdf"),
    ])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When one worker runs both
    t0 = time.monotonic()
    result = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1",
                                                  "--kill-grace", "0.5"), timeout=60)
    elapsed = time.monotonic() - t0

    # Then the hang is killed at its timeout (the worker with it) and the next job completes
    assert result.returncode == 1, result.stdout + result.stderr
    assert elapsed < 20, f"the escaped job ran {elapsed:.1f}s past its 1 s timeout"
    view = QueueView(queue)
    dead = view.record("dead", "escaper")
    assert [a["outcome"] for a in dead["attempts"]] == ["timeout"]
    assert view.ids("done") == {"next"}
    assert_pdf(tmp_path / "out" / "next.pdf", "next")
    assert gone(int(pidfile.read_text()))


def test_a_cancel_reaches_a_job_that_moved_its_worker_out_of_its_group(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a running job that has moved its worker into another process group
    stage(tmp_path)
    pidfile = tmp_path / "worker.pid"
    manifest = write_manifest([py_job("escaper", "leave_group_and_hang", s=600,
                                      pidfile=str(pidfile))])
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1"))
    try:
        worker = wait_for_pid(pidfile)

        # When it is cancelled
        assert run_cli("cancel", "escaper", "--queue", queue).returncode == 0

        # Then the run ends with the job cancelled and its worker dead
        assert runner.wait(30) == 1
        assert QueueView(queue).ids("cancelled") == {"escaper"}
        assert gone(worker)
    finally:
        runner.close()
        if pidfile.exists() and not gone(int(pidfile.read_text())):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def run_in_one_worker(tmp_path: Path, manifest: Path, *extra: str
                      ) -> tuple[subprocess.CompletedProcess[str], QueueView]:
    """`renderctl run` of ``manifest`` with one worker: its jobs run one after another in
    the same worker process (while it lives). Queue in tmp_path/q, outputs in tmp_path/out."""
    result = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out",
                                                "--workers", "1", *extra), timeout=30)
    return result, QueueView(tmp_path / "q")


@pytest.fixture
def leftover(tmp_path: Path) -> Iterator[Path]:
    """Where a job's leftover process writes its pid; killed after the test if it runs."""
    pidfile = tmp_path / "leftover.pid"
    yield pidfile
    if pidfile.exists() and not gone(pid := int(pidfile.read_text())):
        os.kill(pid, signal.SIGKILL)


# -- a job's leftovers die with the job ----------------------------------------------------


@needs_cgroup_v1
def test_a_daemon_left_by_a_job_is_not_charged_to_the_next_job(
        tmp_path: Path, write_manifest: Any, leftover: Path) -> None:
    # Given a job that leaves a setsid() daemon holding 80 MB and succeeds, then a job that
    # needs 90 MB, both under a 150 MB ceiling, in one worker
    stage(tmp_path)
    manifest = write_manifest([py_job("daemon", "leave_a_daemon", mb=80, pidfile=str(leftover)),
                               py_job("victim", "allocate", mb=90)],
                              defaults={"memory_mb": 150, "max_attempts": 1})
    # When one worker runs both under the cgroup guard
    result, view = run_in_one_worker(tmp_path, manifest, "--memory-guard", "cgroup-v1")

    # Then both complete: the daemon died with its job, before the next one started
    assert result.returncode == 0, result.stdout + result.stderr
    assert view.ids("done") == {"daemon", "victim"}
    assert gone(int(leftover.read_text()))


def test_a_background_process_of_a_command_dies_before_the_next_job(
        tmp_path: Path, write_manifest: Any, leftover: Path) -> None:
    # Given a command that starts `sleep` in the background and exits 0, and a job after it
    # that fails if that sleep still runs
    stage(tmp_path)
    manifest = write_manifest([
        {"id": "bg", "kind": "command", "output": "bg.txt",
         "argv": ["sh", "-c", f"sleep 120 & echo $! > {leftover}; echo ok > {{output}}"]},
        py_job("next", "fail_if_alive", pidfile=str(leftover)),
    ], defaults={"max_attempts": 1})
    # When one worker runs both
    result, view = run_in_one_worker(tmp_path, manifest)

    # Then both complete: the background sleep was gone when the next job started
    assert result.returncode == 0, result.stdout + result.stderr
    assert view.ids("done") == {"bg", "next"}


# A job's leftover: once the worker is stopped (at worker:checked, its job's output checked),
# it empties that output, as a tool's background helper finishing late would.
SPOIL_WHEN_STOPPED = """
import os, sys, time
marker, worker, output = sys.argv[1], int(sys.argv[2]), sys.argv[3]
while True:
    with open(f"/proc/{worker}/stat") as fh:
        if fh.read().rsplit(")", 1)[1].split()[0] == "T":
            break
    time.sleep(0.005)
open(output, "wb").close()
open(marker, "w").close()
"""


@pytest.mark.parametrize("kind", ["command", "python"])
def test_what_a_job_left_running_cannot_change_its_output_after_the_check(
        tmp_path: Path, write_manifest: Any, leftover: Path, kind: str) -> None:
    import sys

    from jobfns import _pdf, sha256_of, stopped

    # Given a job (a command, or a python callable) that writes a good PDF and succeeds,
    # leaving a process behind that empties the output once the worker has checked it
    # (frozen at worker:checked)
    stage(tmp_path)
    good, spoiler, marker = tmp_path / "good.pdf", tmp_path / "spoil.py", tmp_path / "spoiled"
    _pdf(good, "bg")
    spoiler.write_text(SPOIL_WHEN_STOPPED)
    spoil = [sys.executable, str(spoiler), str(marker)]
    if kind == "command":
        # (sh GOOD OUTPUT PIDFILE SPOIL...: its parent, $PPID, is the worker)
        script = 'cp "$1" "$2"; o=$2 p=$3; shift 3; "$@" $PPID "$o" & echo $! > "$p"; exit 0'
        job = {"id": "bg", "kind": "command", "output": "bg.pdf",
               "argv": ["sh", "-c", script, "sh", str(good), "{output}", str(leftover), *spoil]}
    else:
        job = py_job("bg", "write_then_leave", argv=spoil, pidfile=str(leftover))
    manifest = write_manifest([{**job, "max_attempts": 1}])
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--json"),
                    env={"RENDERCTL_STOP_AT": "worker:checked"})
    try:
        started = runner.until(lambda line: '"started"' in line)
        worker = int(json.loads(started)["worker"])
        wait_until(lambda: stopped(worker), timeout_s=30, what="the worker to stop")
        pid = wait_for_pid(leftover)

        # When the worker goes on from there
        wait_until(lambda: marker.exists() or gone(pid), timeout_s=30,
                   what="the leftover to act or be gone")
        os.kill(worker, signal.SIGCONT)

        # Then the leftover was killed before the check: the output published is the one
        # checked and recorded, whole (it was emptied after the check and published so,
        # recorded with the good PDF's hash)
        assert runner.wait() == 0, runner.lines
    finally:
        runner.close()
    assert not marker.exists()
    published = out / "bg.pdf"
    assert QueueView(queue).record("done", "bg")["result"]["sha256"] == sha256_of(published)
    assert_pdf(published, "bg")


def test_a_thread_a_job_left_holding_its_output_cannot_change_it_after_the_check(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import sha256_of, stopped

    # Given a python job that writes a good PDF and succeeds, leaving a thread that holds
    # the output open for writing, its worker frozen once the output is checked
    # (worker:checked)
    stage(tmp_path)
    fdfile = tmp_path / "fd"
    manifest = write_manifest([{**py_job("held", "write_then_hold_open", fdfile=str(fdfile)),
                                "max_attempts": 1}])
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--json"),
                    env={"RENDERCTL_STOP_AT": "worker:checked"})
    try:
        wait_until(fdfile.exists, timeout_s=30, what="the job to run")
        worker, fd = map(int, fdfile.read_text().split())
        wait_until(lambda: stopped(worker), timeout_s=30, what="the worker to stop")

        # When what that thread holds is written to after the check (here by the test,
        # through the worker's descriptor: the thread would do it when it next runs), and
        # the worker goes on
        with open(f"/proc/{worker}/fd/{fd}", "r+b") as held:
            held.truncate(0)
            held.write(b"not a PDF any more")
        os.kill(worker, signal.SIGCONT)

        # Then the output published is the one checked and recorded, whole (it was the
        # file the thread held: published spoilt, under the good PDF's hash)
        assert runner.wait() == 0, runner.lines
    finally:
        runner.close()
    published = out / "held.pdf"
    assert QueueView(queue).record("done", "held")["result"]["sha256"] == sha256_of(published)
    assert_pdf(published, "held")


def test_a_timeout_kill_takes_the_jobs_escaped_daemon_with_it_under_sampling(
        tmp_path: Path, write_manifest: Any, leftover: Path) -> None:
    # Given a job that leaves a SIGTERM-ignoring setsid() daemon and hangs past its timeout,
    # under the sampling guard (no cgroup to find the daemon by)
    stage(tmp_path)
    manifest = write_manifest([
        {**py_job("hang", "leave_a_daemon", pidfile=str(leftover), hang_s=600, ignore_term=True),
         "timeout_s": 1, "max_attempts": 1}])
    # When the runner times it out and exits
    result, view = run_in_one_worker(tmp_path, manifest, "--memory-guard", "sampling",
                                     "--kill-grace", "0.5")

    # Then the job timed out, and its daemon is gone with it
    assert result.returncode == 1, result.stdout + result.stderr
    assert [a["outcome"] for a in view.record("dead", "hang")["attempts"]] == ["timeout"]
    wait_until(lambda: gone(int(leftover.read_text())), timeout_s=5,
               what="the daemon of the timed-out job to die")


# A command that, on SIGTERM, starts a process in a new session (its pid to argv[1]) and
# exits: its worker then dies of the SIGTERM itself, before the kill grace is over.
START_ON_TERM_AND_EXIT = """
import os, signal, subprocess, sys, time
def start(signum, frame):
    child = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, start_new_session=True)
    with open(sys.argv[1] + ".tmp", "w") as fh:
        fh.write(str(child.pid))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    sys.exit(0)
signal.signal(signal.SIGTERM, start)
while True:
    time.sleep(3600)
"""


@pytest.mark.parametrize("kind", ["python", "command"])
def test_a_timeout_kill_takes_a_process_the_job_started_in_its_grace_under_sampling(
        tmp_path: Path, write_manifest: Any, leftover: Path, kind: str) -> None:
    # Given a job that, on SIGTERM, starts a process in a new session and hangs past its
    # timeout (python: in its worker, hanging on; command: the tool, exiting at once),
    # under the sampling guard (no cgroup to find that process by, and the job's tree as it
    # was at the SIGTERM does not hold it)
    stage(tmp_path)
    if kind == "python":
        job = py_job("hang", "start_a_process_on_term", pidfile=str(leftover))
    else:
        job = {"id": "hang", "kind": "command", "output": "hang.pdf", "argv": [
            sys.executable, "-c", START_ON_TERM_AND_EXIT, str(leftover), "{output}"]}
    manifest = write_manifest([{**job, "timeout_s": 1, "max_attempts": 1}])

    # When the runner times it out (SIGKILL after the kill grace) and exits
    result, view = run_in_one_worker(tmp_path, manifest, "--memory-guard", "sampling",
                                     "--kill-grace", "0.5")

    # Then the attempt is a timeout, and the process the job started in its grace is gone
    assert result.returncode == 1, result.stdout + result.stderr
    assert [a["outcome"] for a in view.record("dead", "hang")["attempts"]] == ["timeout"]
    started = int(leftover.read_text())
    wait_until(lambda: gone(started), timeout_s=2,
               what="the process the job started on SIGTERM to die with it")


@pytest.mark.parametrize("when", ["in_its_kill_grace", "on_its_own"])
def test_a_process_left_by_a_job_that_ended_its_worker_dies_with_it_under_sampling(
        tmp_path: Path, write_manifest: Any, leftover: Path, when: str) -> None:
    # Given a python job that starts a process in a new session and then ends its own
    # worker (os._exit): in its kill grace, on the SIGTERM of its timeout, or on its own;
    # under the sampling guard, where no cgroup holds that process and no kill of the
    # worker's tree can find it once the worker is gone
    stage(tmp_path)
    if when == "in_its_kill_grace":
        job = {**py_job("ends", "start_a_process_on_term", pidfile=str(leftover),
                        exit_worker=True), "timeout_s": 1}
    else:
        job = py_job("ends", "leave_a_daemon", pidfile=str(leftover), ignore_term=True,
                     exit_worker=True)
    manifest = write_manifest([{**job, "max_attempts": 1}])

    # When it runs
    result, view = run_in_one_worker(tmp_path, manifest, "--memory-guard", "sampling",
                                     "--kill-grace", "5")

    # Then its attempt is charged, and the process it left is gone (the runner, the
    # subreaper above its workers, inherited it and killed it)
    assert result.returncode == 1, result.stdout + result.stderr
    outcome = "timeout" if when == "in_its_kill_grace" else "failed"  # (its exit code 3)
    assert [a["outcome"] for a in view.record("dead", "ends")["attempts"]] == [outcome]
    left = int(leftover.read_text())
    wait_until(lambda: gone(left), timeout_s=2, what="the process the job left to die")


def test_a_killed_runners_workers_take_their_jobs_daemons_with_them(
        tmp_path: Path, write_manifest: Any, leftover: Path) -> None:
    # Given a running job that has left a SIGTERM-ignoring setsid() daemon and hangs
    stage(tmp_path)
    manifest = write_manifest([py_job("hang", "leave_a_daemon", pidfile=str(leftover),
                                      hang_s=600, ignore_term=True)])
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1"))
    try:
        daemon = wait_for_pid(leftover, what="the job's daemon to start")

        # When the runner is SIGKILLed
        runner.kill()

        # Then the daemon dies too: nothing of the job runs on unsupervised
        wait_until(lambda: gone(daemon), timeout_s=10, what="the daemon to die with the runner")
    finally:
        runner.close()


# -- a job that breaks its worker's descriptors --------------------------------------------


def test_a_job_that_closes_its_workers_descriptors_fails_alone(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that closes every descriptor of its worker but the socket to the runner
    # (and would write a good PDF), allowed two attempts, and a job after it
    stage(tmp_path)
    manifest = write_manifest([{**py_job("closer", "close_worker_fds"), "max_attempts": 2},
                               py_job("next", "write_pdf")])

    # When one worker at a time runs them
    result, view = run_in_one_worker(tmp_path, manifest, "--backoff-base", "0")

    # Then the run goes on (no I/O error of the queue): the closer fails each attempt,
    # saying why, and is dead-lettered; the next job completes in a fresh worker
    assert result.returncode == 1, result.stdout + result.stderr
    attempts = view.record("dead", "closer")["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed", "failed"], attempts
    assert all("file descriptor" in a["error"] for a in attempts), attempts
    assert view.ids("done") == {"next"}
    assert_pdf(tmp_path / "out" / "next.pdf", "next")
    assert not (tmp_path / "out" / "closer.pdf").exists()


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_a_job_that_closes_its_workers_descriptors_does_not_hold_the_runner(
        tmp_path: Path, write_manifest: Any, start_method: str) -> None:
    # Given a job that closes its worker's descriptors (but the socket to the runner), then
    # runs 20 s under a 2 s timeout, and twelve quick jobs for the other worker
    stage(tmp_path)
    manifest = write_manifest(
        [{**py_job("closer", "close_worker_fds_then_sleep", s=20), "timeout_s": 2,
          "max_attempts": 1}]
        + [py_job(f"quick-{n}", "write_one_byte", f"quick-{n}.bin") for n in range(12)])
    t0 = time.monotonic()

    # When two workers started by each method run them
    result = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out",
                                                "--workers", "2", "--start-method",
                                                start_method), timeout=60)

    # Then the closer is killed at its timeout and the quick jobs all complete: under fork
    # and spawn, the closed pipe made the runner think the worker dead and wait for it,
    # frozen, until the job ended 20 s later
    elapsed = time.monotonic() - t0
    assert result.returncode == 1, result.stdout + result.stderr
    view = QueueView(tmp_path / "q")
    assert [a["outcome"] for a in view.record("dead", "closer")["attempts"]] == ["timeout"]
    assert view.ids("done") == {f"quick-{n}" for n in range(12)}
    assert elapsed < 15, elapsed


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_a_job_cannot_release_the_runners_lock(
        tmp_path: Path, write_manifest: Any, start_method: str) -> None:
    # Given a runner whose job has tried to unlock every descriptor it has
    stage(tmp_path)
    pidfile = tmp_path / "job.pid"
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("unlocker", "unlock_every_fd_then_sleep", s=30,
                                      pidfile=str(pidfile))])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--start-method",
                                        start_method))
    try:
        wait_for_pid(pidfile)
        # When a second runner starts on the queue
        second = run_cli("run", *cli_args(queue, out), timeout=30)
    finally:
        runner.close()
    # Then it is refused, the queue being held: under fork the job held copies of the
    # runner's locked descriptors, and its unlock let a second runner in beside the first
    assert second.returncode == 75, second.stdout + second.stderr
    assert f"pid {runner.pid}" in second.stderr, second.stderr


def test_a_job_that_closes_its_workers_connection_leaves_the_runner_idle(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that closes its worker's connection to the runner, then runs 3 s
    stage(tmp_path)
    pidfile = tmp_path / "job.pid"
    manifest = write_manifest([{**py_job("closer", "close_all_fds_then_sleep", s=3,
                                         pidfile=str(pidfile)), "max_attempts": 1}])
    runner = Runner(manifest, *cli_args(tmp_path / "q", tmp_path / "out", "--workers", "1"))
    try:
        wait_for_pid(pidfile)
        proc = psutil.Process(runner.pid)
        time.sleep(0.3)  # (its connection is closed by now: the job's first act)

        # When the runner has waited a second for that job
        before = sum(proc.cpu_times()[:2])
        time.sleep(1.0)
        used = sum(proc.cpu_times()[:2]) - before

        # Then it waited asleep (it spun at 100% of a CPU until the job ended: the closed
        # socket polled readable at once, every pass)
        assert used < 0.3, f"the runner used {used:.2f} s of CPU in 1 s"
        assert runner.wait(30) == 1, (runner.lines, runner.stderr())
    finally:
        runner.close()
    attempt = QueueView(tmp_path / "q").record("dead", "closer")["attempts"][-1]
    assert attempt["outcome"] == "failed", attempt


def test_a_worker_stopped_partway_through_a_message_never_freezes_the_runner(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job whose worker stops (SIGSTOP) having sent the runner only the start of a
    # message, and another job, in the other worker, that overruns its timeout
    stage(tmp_path)
    pidfile = tmp_path / "stopped.pid"
    manifest = write_manifest([
        {**py_job("stops", "stop_mid_message", pidfile=str(pidfile)), "priority": 10,
         "timeout_s": 3, "max_attempts": 1},
        {**py_job("overruns", "sleep_then_write", s=300), "timeout_s": 2,
         "max_attempts": 1}])
    queue = tmp_path / "q"

    # When they run
    runner = Runner(manifest, *cli_args(queue, tmp_path / "out", "--workers", "2",
                                        "--kill-grace", "0.5", "--json"))
    try:
        worker = wait_for_pid(pidfile, what="the worker to send part of a message")
        wait_until(lambda: psutil.Process(worker).status() == psutil.STATUS_STOPPED,
                   what="the worker to stop")

        # Then the runner still supervises: it kills both jobs at their timeouts (it used
        # to wait for the rest of the message for good, seeing no timeout, cancel or
        # signal again) and finishes the run
        assert runner.wait(timeout_s=30) == 1, runner.lines
    finally:
        runner.close()
    view = QueueView(queue)
    for job in ("stops", "overruns"):
        attempts = view.record("dead", job)["attempts"]
        assert [a["outcome"] for a in attempts] == ["timeout"], (job, attempts)
    assert gone(worker)


@pytest.mark.parametrize("garbage", [
    "00000004deadbeef",  # a whole frame that unpickles to nothing
    "7fffffff",  # a length no worker sends (the runner would wait to read 2 GB)
    "ffffffff00000000ffffffff",  # Connection's 64-bit form, past any message of ours
])
def test_a_job_writing_into_its_workers_connection_fails_alone(
        tmp_path: Path, write_manifest: Any, garbage: str) -> None:
    # Given a job that writes bytes of its own into its worker's connection to the runner
    # (a library writing to the wrong descriptor), and a job after it
    stage(tmp_path)
    manifest = write_manifest([
        {**py_job("garbler", "garble_channel", bytes=garbage, hang_s=30), "max_attempts": 1,
         "priority": 10},
        py_job("next", "write_pdf")])

    # When one worker at a time runs them
    result, view = run_in_one_worker(tmp_path, manifest)

    # Then the garbler's attempt fails, saying why (the runner used to die of the
    # unreadable message, or wait for 2 GB that never came); the next job completes
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [attempt] = view.record("dead", "garbler")["attempts"]
    assert attempt["outcome"] == "failed", attempt
    assert "connection to the runner" in attempt["error"], attempt
    assert view.ids("done") == {"next"}
    assert_pdf(tmp_path / "out" / "next.pdf", "next")


def test_a_job_that_leaves_its_worker_without_descriptors_costs_only_its_worker(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that writes its PDF and then leaves every descriptor of its worker in
    # use, and a job after it
    stage(tmp_path)
    manifest = write_manifest([{**py_job("hoarder", "exhaust_fds"), "priority": 2},
                               {**py_job("next", "write_pdf"), "priority": 1}])

    # When one worker at a time runs them
    result, view = run_in_one_worker(tmp_path, manifest, "--prefetch", "2")

    # Then the run goes on (not an I/O error of the queue, exit 74): the hoarder's output is
    # its own and completes, its worker is replaced, and the next job completes
    assert result.returncode == 0, result.stdout + result.stderr
    assert view.ids("done") == {"hoarder", "next"}
    assert_pdf(tmp_path / "out" / "next.pdf", "next")
    assert_pdf(tmp_path / "out" / "hoarder.pdf", "hoarder")


def test_what_a_job_writes_to_stdout_takes_bounded_disk_space(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a python job and a command job that each write 300 MB to stdout, then wait
    stage(tmp_path)
    go = tmp_path / "go"
    pidfile = tmp_path / "py.pid"
    cmd_pid = tmp_path / "cmd.pid"
    manifest = write_manifest([
        py_job("py", "shout_then_wait", mb=300, pidfile=str(pidfile), go=str(go)),
        {"id": "cmd", "kind": "command", "output": "cmd.bin", "argv": [
            "sh", "-c", 'head -c 314572800 /dev/zero; echo "the last words" >&2; echo $$ > "$1";'
            ' while [ ! -e "$2" ]; do sleep 0.01; done; : > "$0"',
            "{output}", str(cmd_pid), str(go)]}])
    runner = Runner(*cli_args(tmp_path / "q", tmp_path / "out", "--workers", "2"), manifest)
    try:
        # When both have written it and wait
        py_worker = wait_for_pid(pidfile)
        shell = psutil.Process(wait_for_pid(cmd_pid))
        # Found from each job's working folder (its cwd), inside this runner's work root: a
        # glob of every /tmp/renderctl-work-* also matched a killed runner's left by an
        # earlier test whose worker had the same pid.
        capture = Path(psutil.Process(py_worker).cwd()).parent / f"w{py_worker}.out"
        log = Path(f"{shell.cwd()}.stdout")
        assert capture.exists() and log.exists(), (capture, log)

        # Then what their output takes on disk is bounded (the tail stays): one job cannot
        # fill the disk its neighbours and the queue write to
        for f in (capture, log):
            wait_until(lambda f=f: os.stat(f).st_blocks * 512 <= 64 * MB,
                       timeout_s=10, what=f"{f} to shrink")
            assert os.stat(f).st_size >= 300 * MB
        go.touch()
        assert runner.wait(30) == 0, runner.lines
    finally:
        go.touch()
        runner.close()
    view = QueueView(tmp_path / "q")
    assert view.ids("done") == {"py", "cmd"}
    [attempt] = view.record("done", "py")["attempts"]
    assert attempt["stderr_tail"].endswith("the last words"), attempt


def test_a_job_failing_with_a_huge_or_unprintable_message_is_recorded_in_bounded_form(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job whose exception message is 5 million characters long, one whose
    # exception cannot even be turned into a string, each allowed two attempts, and a job
    stage(tmp_path)
    manifest = write_manifest([{**py_job("loud", "fail_at_length", chars=5_000_000),
                                "max_attempts": 2},
                               {**py_job("mute", "fail_unprintably"), "max_attempts": 2},
                               py_job("next", "write_pdf")])

    # When one worker runs them, with the run's events as JSON Lines
    result, view = run_in_one_worker(tmp_path, manifest, "--backoff-base", "0", "--json")

    # Then each is dead after two failed attempts whose error says what was raised, cut to
    # a size a record, an event line and a terminal can carry, saying that it was cut
    assert result.returncode == 1, result.stderr[-2000:]
    loud = view.record("dead", "loud")["attempts"]
    assert [a["outcome"] for a in loud] == ["failed", "failed"]
    for a in loud:
        assert a["error"].startswith("RuntimeError: start-of-message xxx"), a["error"][:100]
        assert "cut" in a["error"] and "end-of-message" in a["error"]
        assert len(a["error"]) <= 8192 and len(a["traceback_tail"]) <= 8192
    mute = view.record("dead", "mute")["attempts"]
    assert [a["outcome"] for a in mute] == ["failed", "failed"], mute
    assert all(a["error"].startswith("_Unprintable") for a in mute), mute
    assert max(map(len, result.stdout.splitlines())) <= 64 * 1024
    assert (tmp_path / "q" / "dead" / "loud.json").stat().st_size <= 64 * 1024
    assert view.ids("done") == {"next"}


# -- a job that lifts its own memory ceiling -----------------------------------------------


@needs_cgroup_v1
def test_a_job_that_lifts_its_ceiling_lifts_it_for_nobody(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given, under 100 MB ceilings in one worker: a job that lifts its slot's ceiling and
    # then takes 150 MB, one that lifts it and stays small, and a job that takes 300 MB
    stage(tmp_path)
    manifest = write_manifest([py_job("lift-big", "lift_my_ceiling", mb=150),
                               py_job("lift-small", "lift_my_ceiling", mb=10),
                               py_job("hog", "allocate", mb=300)],
                              defaults={"memory_mb": 100, "max_attempts": 1})

    # When they run one after another under the cgroup guard
    result, view = run_in_one_worker(tmp_path, manifest, "--memory-guard", "cgroup-v1")

    # Then the job that went past its ceiling is recorded `memory` (with its peak), the
    # small one completes, and the hog after them meets its own 100 MB ceiling
    assert result.returncode == 1, result.stdout + result.stderr
    big = view.record("dead", "lift-big")["attempts"]
    assert [a["outcome"] for a in big] == ["memory"], big
    assert big[0]["peak_memory_bytes"] > 100 * MB
    assert view.ids("done") == {"lift-small"}
    hog = view.record("dead", "hog")["attempts"]
    assert [a["outcome"] for a in hog] == ["memory"], hog
    assert hog[0]["peak_memory_bytes"] <= 100 * MB
    assert not (tmp_path / "out" / "lift-big.pdf").exists()


def test_a_job_finds_the_process_as_no_earlier_job_left_it(
        tmp_path: Path, write_manifest: Any) -> None:
    import json

    # Given one worker that runs: an observer, a job changing process-wide state (signals,
    # mask, umask, limits, time zone, locale, stdout, C environment, a timer, the decimal
    # context, socket timeout, warnings filters, logging, argv, gc, hooks, affinity, nice,
    # random's seed, prctl's flags), an observer
    stage(tmp_path)
    report = tmp_path / "seen.jsonl"
    manifest = write_manifest([
        {**py_job("before", "observe_process", report=str(report)), "priority": 3},
        {**py_job("polluter", "pollute_process"), "priority": 2},
        {**py_job("after", "observe_process", report=str(report)), "priority": 1},
    ])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When they run in that order in one worker
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then the second observer sees exactly what the first did, and in the same worker
    assert res.returncode == 0, res.stdout + res.stderr
    before, after = (json.loads(line) for line in report.read_text().splitlines())
    assert before.pop("pid") == after.pop("pid"), "not one worker: the test proves nothing"
    import random
    assert after.pop("random") != random.Random(1).random(), "the polluter's seed leaked"
    before.pop("random")
    assert after == before


def test_a_job_reads_nothing_of_the_runners_stdin_even_after_one_closed_its_own(
        tmp_path: Path, write_manifest: Any) -> None:
    import json

    # Given a runner whose stdin holds a line meant for someone else (a shell loop), and
    # one worker running a job that reads its stdin and closes it, then one that reads
    stage(tmp_path)
    report = tmp_path / "seen.jsonl"
    manifest = write_manifest([
        {**py_job("first", "read_stdin", report=str(report), close=True), "priority": 2},
        {**py_job("second", "read_stdin", report=str(report)), "priority": 1},
    ])
    feed = tmp_path / "feed.txt"
    feed.write_text("NOT-FOR-JOBS\n")
    with feed.open() as stdin:
        res = subprocess.run([*RENDERCTL, "run", str(manifest), *cli_args(
            tmp_path / "q", tmp_path / "out", "--workers", "1")], stdin=stdin,
            capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})

    # Then neither read anything, through sys.stdin or fd 0 (review DO: fd 0 was the
    # runner's stdin, and sys.stdin put back over it read the line)
    assert res.returncode == 0, res.stdout + res.stderr
    seen = [json.loads(line) for line in report.read_text().splitlines()]
    assert seen == [{"sys.stdin": "", "fd0": ""}] * 2, seen


def test_a_file_a_job_left_open_is_closed_before_the_next_job_in_its_worker(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given one worker that runs a job locking a file through a module global it never
    # closes, then a job that takes the same lock without waiting
    stage(tmp_path)
    lock, report = tmp_path / "the.lock", tmp_path / "seen.jsonl"
    manifest = write_manifest([
        {**py_job("leaver", "leave_a_lock_open", lock=str(lock), report=str(report)),
         "priority": 2},
        {**py_job("taker", "take_the_lock", lock=str(lock), report=str(report)),
         "max_attempts": 1, "priority": 1},
    ])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When they run in that order in one worker
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then the second gets the lock and finds no file of the first's open (before: the lock
    # was still held, and the file open at /proc/self/fd; audit DD)
    assert res.returncode == 0, res.stdout + res.stderr
    leaver, taker = (json.loads(line) for line in report.read_text().splitlines())
    assert leaver["pid"] == taker["pid"], "not one worker: the test proves nothing"
    assert str(lock) not in taker["open"], taker["open"]
    assert_pdf(out / "taker.pdf", "taker")


@pytest.mark.parametrize("which", ["stdout", "started"])
def test_closing_what_a_job_left_costs_no_later_job_even_a_wrapper_of_the_workers_fd(
        tmp_path: Path, write_manifest: Any, which: str) -> None:
    # Given one worker that runs a job leaving a file object over one of the worker's own
    # descriptors (its stdout, or its started log) and a file of its own in a module
    # global, then two plain jobs with one attempt each
    stage(tmp_path)
    manifest = write_manifest([
        {**py_job("careless", "lose_a_wrapper_of_a_worker_fd", which=which,
                  file=str(tmp_path / "left.txt")), "priority": 3},
        {**py_job("n1", "write_pdf"), "max_attempts": 1, "priority": 2},
        {**py_job("n2", "write_pdf"), "max_attempts": 1, "priority": 1},
    ])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When they run in that order
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then all complete: the collection after the careless job closed the worker's
    # descriptor, which was put back (stdout) or the worker replaced (review DE: the next
    # job failed "closed or replaced the worker's file descriptor 1", or the run halted
    # with an I/O error on the started log)
    assert res.returncode == 0, res.stdout + res.stderr
    for jid in ("careless", "n1", "n2"):
        assert_pdf(out / f"{jid}.pdf", jid)


def test_what_a_jobs_finalizer_prints_as_the_worker_collects_is_the_jobs_output(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that leaves an object whose finalizer prints, and a file, behind
    stage(tmp_path)
    manifest = write_manifest([py_job("noisy", "lose_a_noisy_object",
                                      file=str(tmp_path / "left.txt"))])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When it runs under `run --json`
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1", "--json"))

    # Then the run's stdout stays JSON Lines (review DG: the line landed in the middle of
    # the stream, printed through the runner's own stdout), and the line is the job's
    assert res.returncode == 0, res.stdout + res.stderr
    assert "FINALIZER-SPOKE" not in res.stdout + res.stderr
    json_lines(res.stdout)  # (each line parses)
    rec = QueueView(queue).record("done", "noisy")
    assert "FINALIZER-SPOKE" in (rec["attempts"][-1].get("stderr_tail") or ""), rec


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_a_job_starts_with_default_signal_handlers_whatever_the_start_method(
        tmp_path: Path, write_manifest: Any, start_method: str) -> None:
    # Given a job that records its process's signal handlers
    stage(tmp_path)
    report = tmp_path / "seen.jsonl"
    manifest = write_manifest([py_job("obs", "observe_process", report=str(report))])

    # When a runner started with this start method runs it
    res = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out", "--workers",
                                             "1", "--start-method", start_method))

    # Then every handler is the default (under fork, SIGCONT's was the runner's own), but
    # SIGXFSZ and SIGPIPE, which Python itself ignores (a python job sees what it would
    # under `python`), and the worker's parent-death signal
    assert res.returncode == 0, res.stdout + res.stderr
    handlers = json.loads(report.read_text())["handlers"]
    from renderctl.worker import PARENT_DEATH_SIGNAL

    odd = {int(s): h for s, h in handlers.items() if h != str(signal.SIG_DFL)}
    assert odd.pop(int(signal.SIGXFSZ)) == str(signal.SIG_IGN)
    assert odd.pop(int(signal.SIGPIPE)) == str(signal.SIG_IGN)
    assert "_die_with_group" in odd.pop(int(PARENT_DEATH_SIGNAL))
    assert odd == {}


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_a_jobs_garbage_collection_walks_only_its_own_objects(
        tmp_path: Path, write_manifest: Any, start_method: str) -> None:
    # Given an invoice (the renderers loaded), then a job that counts the objects a
    # collection would walk, with a thousand jobs pending behind them (records the runner
    # holds: under fork, a worker's inheritance)
    stage(tmp_path)
    sample = Path(__file__).resolve().parents[2] / "sample-inputs" / "invoices" / "0001.json"
    manifest = write_manifest([
        {"id": "inv", "kind": "invoice", "input": str(sample), "output": "inv.pdf",
         "priority": 3},
        {**py_job("count", "count_collected", output="count.json"), "priority": 2},
        *(py_job(f"n{i}", "write_pdf") for i in range(1000)),
    ])
    out = tmp_path / "out"

    # When one worker runs them
    res = run_cli("run", manifest, *cli_args(tmp_path / "q", out, "--workers", "1",
                                             "--start-method", start_method), timeout=120)

    # Then a collection in the job walks a few thousand objects, not the ~45,000 the worker
    # inherited or loaded (the fork server's modules; under fork the runner's heap): a
    # gc.collect() took ~25-40 ms, and under fork copied the runner's pages into the slot
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads((out / "count.json").read_text())["objects"] < 10_000


def test_an_invoice_after_a_job_that_lowered_decimal_precision_renders(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given, for one worker, a python job that leaves the decimal precision at 3 digits,
    # then a built-in invoice whose totals need more
    stage(tmp_path)
    invoice = Path(__file__).resolve().parents[2] / "sample-inputs" / "invoices" / "0001.json"
    manifest = write_manifest([
        {**py_job("lazy", "set_decimal_precision", prec=3), "priority": 2},
        {"id": "inv", "kind": "invoice", "input": str(invoice), "output": "inv.pdf",
         "max_attempts": 1, "priority": 1},
    ])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When one worker runs both
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then the invoice renders as in a fresh worker
    assert res.returncode == 0, res.stdout + res.stderr
    assert pdf_text(out / "inv.pdf")[0] == 1
    assert QueueView(queue).record("done", "inv")["attempts"][-1]["outcome"] == "completed"


def test_an_invoice_after_a_job_that_registered_its_own_helvetica_draws_standard_fonts(
        tmp_path: Path, write_manifest: Any) -> None:
    from pypdf import PdfReader

    # Given, for one worker, a python job that registers a TrueType font as "Helvetica",
    # then a built-in invoice (which draws with the standard fonts)
    stage(tmp_path)
    invoice = Path(__file__).resolve().parents[2] / "sample-inputs" / "invoices" / "0001.json"
    manifest = write_manifest([
        {**py_job("font", "register_font"), "priority": 2},
        {"id": "inv", "kind": "invoice", "input": str(invoice), "output": "inv.pdf",
         "priority": 1},
    ])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When one worker runs both
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then the invoice's fonts are the standard ones, as in a fresh worker (the job's font
    # was embedded in it, unannounced)
    assert res.returncode == 0, res.stdout + res.stderr
    fonts = {str(f.get_object()["/BaseFont"]) for page in PdfReader(out / "inv.pdf").pages
             for f in page["/Resources"]["/Font"].values()}
    assert fonts and all(f.startswith("/Helvetica") for f in fonts), fonts


def test_what_a_library_sets_up_when_first_imported_holds_for_every_job_in_a_worker(
        tmp_path: Path, write_manifest: Any) -> None:
    import json
    import sysconfig
    import uuid

    # Given a library (installed where libraries are: it stays imported between jobs) that
    # sets its logger's level and adds a warnings filter when imported, as urllib3 does
    lib = f"rctl_test_lib_{uuid.uuid4().hex[:8]}"
    source = Path(sysconfig.get_paths()["purelib"]) / f"{lib}.py"
    source.write_text(
        "import logging, warnings\n"
        "class LibWarning(UserWarning):\n    pass\n"
        "logging.getLogger(__name__).setLevel(logging.INFO)\n"
        "warnings.simplefilter('always', LibWarning, append=True)\n")
    stage(tmp_path)
    report = tmp_path / "seen.jsonl"
    manifest = write_manifest([
        {**py_job(f"j{n}", "observe_library_setup", lib=lib, report=str(report)),
         "priority": 3 - n} for n in range(3)])

    # When one worker runs three jobs that import it
    try:
        res = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out",
                                                  "--workers", "1"))
    finally:
        source.unlink()

    # Then each finds it set up as the first did (the clean slate puts back what jobs
    # change, not what a library did once when it was imported)
    assert res.returncode == 0, res.stdout + res.stderr
    seen = [json.loads(line) for line in report.read_text().splitlines()]
    assert len({s.pop("pid") for s in seen}) == 1, "not one worker: the test proves nothing"
    assert seen == [{"logger_info": True, "filter": True}] * 3


def test_a_job_that_leaves_a_thread_running_retires_its_worker(
        tmp_path: Path, write_manifest: Any) -> None:
    import json

    # Given a job that leaves a thread running, then a job that looks at its process
    stage(tmp_path)
    report, pidfile = tmp_path / "seen.jsonl", tmp_path / "leaker.pid"
    manifest = write_manifest([
        {**py_job("leaker", "leave_a_thread", pidfile=str(pidfile)), "priority": 2},
        {**py_job("after", "observe_process", report=str(report)), "priority": 1},
    ])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When one worker slot runs both
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then both complete, the second in a fresh worker with no thread but its own
    assert res.returncode == 0, res.stdout + res.stderr
    seen = json.loads(report.read_text())
    assert seen["pid"] != int(pidfile.read_text())
    assert seen["threads"] == 1
    assert_pdf(out / "leaker.pdf", "leaker")
    if cgroup_v1_writable():  # its peak is still read (only broken descriptors forbid it)
        assert QueueView(queue).record("done", "leaker")["result"]["peak_memory_bytes"]


def _after_a_leaker(tmp_path: Path, write_manifest: Any, leaker: str, second: dict[str, Any],
                    *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run, in one worker slot, a job (``leaker``) that leaves 150 MB charged to its slot,
    then ``second`` (one attempt); returns the run and the queue (outputs in tmp_path/out)."""
    stage(tmp_path)
    shm = Path("/dev/shm") / f"renderctl-test-{os.getpid()}"
    manifest = write_manifest([
        {**py_job("leaker", leaker, shm=str(shm), mb=150), "memory_mb": 400, "priority": 2},
        {**second, "max_attempts": 1, "priority": 1},
    ])
    queue = tmp_path / "q"
    try:
        res = run_cli("run", manifest, *cli_args(queue, tmp_path / "out", "--workers", "1",
                                                  "--prefetch", "2", *extra))
    finally:
        shm.unlink(missing_ok=True)
    return res, queue


@needs_cgroup_v1
def test_what_a_killed_workers_job_left_in_its_slot_is_not_in_the_next_workers_peaks(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that leaves 40 MB in /dev/shm (charged to its slot) and is killed for its
    # timeout, its worker with it, then a small job, on one worker: the successor takes
    # the slot over, the 40 MB still charged there (below what gets a slot dropped)
    stage(tmp_path)
    shm = Path("/dev/shm") / f"renderctl-test-{os.getpid()}-slot"
    manifest = write_manifest([
        {**py_job("hung", "leave_shm_then_hang", shm=str(shm), mb=40), "timeout_s": 2,
         "max_attempts": 1, "priority": 2},
        {**py_job("small", "write_pdf"), "priority": 1},
    ])
    queue = tmp_path / "q"
    try:
        res = run_cli("run", manifest, *cli_args(queue, tmp_path / "out", "--workers", "1",
                                                  "--kill-grace", "0.2"))
    finally:
        shm.unlink(missing_ok=True)

    # Then the small job's recorded peak is its own worker's and its own, not the 40 MB
    # (audit DQ: identical jobs' peaks doubled over 20 minutes of workers killed and
    # replaced, as each successor counted what its slot held as it started)
    assert res.returncode == 1, res.stdout + res.stderr
    peak = QueueView(queue).record("done", "small")["result"]["peak_memory_bytes"]
    assert peak < 30 * 1024 * 1024, peak


@needs_cgroup_v1
def test_memory_a_job_left_in_tmpfs_is_not_charged_to_a_later_job(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that leaves 150 MB in /dev/shm (charged to its slot), then a job with a
    # 100 MB ceiling, in one worker slot
    # When they run
    res, queue = _after_a_leaker(tmp_path, write_manifest, "leave_shm",
                                 {**py_job("b", "write_pdf"), "memory_mb": 100})

    # Then the second runs in a fresh slot and completes
    assert res.returncode == 0, res.stdout + res.stderr
    assert QueueView(queue).states_of(["leaker", "b"]) == {"leaker": ["done"], "b": ["done"]}
    assert_pdf(tmp_path / "out" / "b.pdf", "b")


@pytest.mark.parametrize(("leaker", "guard"), [
    pytest.param("leak_memory", "cgroup-v1", marks=needs_cgroup_v1),
    pytest.param("leave_shm", "cgroup-v1", marks=needs_cgroup_v1),
    pytest.param("leak_memory", "sampling"),
])
def test_memory_a_job_leaves_behind_does_not_kill_the_next_job_under_the_same_ceiling(
        tmp_path: Path, write_manifest: Any, leaker: str, guard: str) -> None:
    # Given a job that leaves 150 MB charged to its slot (in the worker's heap, or in
    # /dev/shm), then a job that needs 300 MB of its 400 MB ceiling, in one worker slot
    # When they run
    res, queue = _after_a_leaker(tmp_path, write_manifest, leaker,
                                 {**py_job("innocent", "allocate", mb=300), "memory_mb": 400},
                                 "--memory-guard", guard)

    # Then the second runs in a fresh worker and slot, and completes with its own peak
    assert res.returncode == 0, res.stdout + res.stderr
    view = QueueView(queue)
    assert view.states_of(["leaker", "innocent"]) == {"leaker": ["done"], "innocent": ["done"]}
    assert_pdf(tmp_path / "out" / "innocent.pdf", "innocent")
    peak = view.record("done", "innocent")["result"]["peak_memory_bytes"]
    # (exact under a cgroup; sampled every 50 ms otherwise, so perhaps caught mid-growth)
    assert (300 if guard == "cgroup-v1" else 200) << 20 < peak < 400 << 20, peak


@pytest.mark.parametrize("guard", [
    pytest.param("cgroup-v1", marks=needs_cgroup_v1),
    "sampling",
])
def test_memory_a_job_leaves_below_the_allowance_does_not_count_against_the_next_job(
        tmp_path: Path, write_manifest: Any, guard: str) -> None:
    # Given a job that leaves 40 MB in its worker (below the 64 MB that retires a worker:
    # a module-level cache, say), then a job needing 365 MB of its 400 MB ceiling, which
    # the two together exceed
    stage(tmp_path)
    manifest = write_manifest([
        {**py_job("leaker", "leak_memory", mb=40), "memory_mb": 400, "priority": 2},
        {**py_job("innocent", "allocate", mb=365, hold_s=0.3), "memory_mb": 400,
         "max_attempts": 1, "priority": 1},
    ])
    queue = tmp_path / "q"

    # When one worker runs both
    res = run_cli("run", manifest, *cli_args(queue, tmp_path / "out", "--workers", "1",
                                             "--json", "--memory-guard", guard))

    # Then the second completes in the same worker, as it would have in a fresh one, and
    # its peak is its own
    assert res.returncode == 0, res.stdout + res.stderr
    workers = {e["worker"] for e in json_lines(res.stdout) if e["event"] == "started"}
    assert len(workers) == 1, res.stdout
    assert_pdf(tmp_path / "out" / "innocent.pdf", "innocent")
    peak = QueueView(queue).record("done", "innocent")["result"]["peak_memory_bytes"]
    assert (365 if guard == "cgroup-v1" else 250) << 20 < peak < 400 << 20, peak


@pytest.mark.parametrize("guard", [
    pytest.param("cgroup-v1", marks=needs_cgroup_v1),
    "sampling",
])
def test_memory_a_built_in_renderer_leaves_behind_does_not_kill_the_next_job(
        tmp_path: Path, write_manifest: Any, guard: str) -> None:
    # Given a renderer kind from an installed package (as built-in kinds run: no user code
    # purged after it) that leaves 100 MB held in its worker (malloc'd in C, as a leaking
    # library would), then a job needing 365 MB of its 400 MB ceiling
    stage(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "hoard_plugin.py").write_text(HOARD_PLUGIN)
    info = site / "hoard_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hoard-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[renderctl.renderers]\nhoard = hoard_plugin:SPEC\n")
    manifest = write_manifest([
        {"id": "hoard", "kind": "hoard", "output": "hoard.pdf", "memory_mb": 400,
         "priority": 2},
        {**py_job("innocent", "allocate", mb=365, hold_s=0.3), "memory_mb": 400,
         "priority": 1},
    ], defaults={"max_attempts": 1})
    queue = tmp_path / "q"

    # When one worker is to run both
    res = run_cli("run", manifest, *cli_args(queue, tmp_path / "out", "--workers", "1",
                                             "--json", "--memory-guard", guard), timeout=90,
                  env={"PYTHONPATH": os.pathsep.join([str(site),
                                                      os.environ.get("PYTHONPATH", "")])})

    # Then both complete, the second in a fresh worker (only python and command jobs were
    # judged for what they left: the second was killed at its own ceiling)
    assert res.returncode == 0, res.stdout + res.stderr
    workers = [e["worker"] for e in json_lines(res.stdout) if e["event"] == "started"]
    assert len(set(workers)) == 2, res.stdout
    assert_pdf(tmp_path / "out" / "hoard.pdf", "hoard")
    assert_pdf(tmp_path / "out" / "innocent.pdf", "innocent")


HOARD_PLUGIN = """
import ctypes
import os

from renderctl.render.base import RendererSpec

SPEC = RendererSpec(kind="hoard", target="hoard_plugin:render",
                    description="Leaves 100 MB held.", min_inputs=0, max_inputs=0, params=())


def render(inputs, output, params):
    from reportlab.pdfgen import canvas

    size = 100 << 20
    held = ctypes.CDLL(None).malloc
    held.restype = ctypes.c_void_p
    ctypes.memset(held(size), 1, size)
    c = canvas.Canvas(str(output))
    c.drawString(72, 720, os.environ["RENDERCTL_JOB_ID"])
    c.showPage()
    c.save()
"""


@needs_cgroup_v1
def test_a_leak_hidden_by_page_cache_going_away_still_retires_the_worker(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given, in one worker slot: a job that leaves 120 MB of page cache (a file it wrote,
    # kept), a job that leaks 120 MB and deletes that file (the slot's usage barely moves),
    # then a job needing 330 MB of its 400 MB ceiling
    stage(tmp_path)
    cache = tmp_path / "cached.bin"
    manifest = write_manifest([
        {**py_job("a", "fill_cache", path=str(cache), mb=120), "priority": 3},
        {**py_job("b", "leak_and_tidy", path=str(cache), mb=120), "priority": 2},
        {**py_job("c", "allocate", mb=330), "memory_mb": 400, "max_attempts": 1,
         "priority": 1},
    ])
    queue = tmp_path / "q"

    # When they run
    res = run_cli("run", manifest, *cli_args(queue, tmp_path / "out", "--workers", "1",
                                             "--memory-guard", "cgroup-v1"))

    # Then the leak is seen, its worker retires, and the third completes in a fresh slot
    assert res.returncode == 0, res.stdout + res.stderr
    assert QueueView(queue).states_of(["c"]) == {"c": ["done"]}
    assert_pdf(tmp_path / "out" / "c.pdf", "c")


@needs_cgroup_v1
def test_scratch_files_in_a_jobs_working_directory_on_tmpfs_are_not_leftovers(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given jobs that each leave 100 MB of scratch in their working directory, which is on
    # tmpfs (TMPDIR=/dev/shm for the runner; on many systems /tmp is tmpfs): memory,
    # charged to the slot, until the worker empties the directory after the job
    stage(tmp_path)
    jobs = [{**py_job(f"j{n}", "stage_scratch", mb=100), "priority": 9 - n} for n in range(4)]
    queue, out = tmp_path / "q", tmp_path / "out"

    # When one worker runs them
    res = run_cli("run", write_manifest(jobs), *cli_args(queue, out, "--workers", "1",
                                                         "--json"),
                  env={"TMPDIR": "/dev/shm"})

    # Then they complete in that one worker: none is retired for memory it no longer holds
    assert res.returncode == 0, res.stdout + res.stderr
    workers = {e["worker"] for e in json_lines(res.stdout) if e["event"] == "started"}
    assert len(workers) == 1, res.stdout


@pytest.mark.parametrize("ctx", ["spawn", "forkserver"])
def test_jobs_may_use_multiprocessing_one_after_another_in_one_worker(
        tmp_path: Path, write_manifest: Any, ctx: str) -> None:
    # Given two jobs that each start a child through multiprocessing (whose helper processes
    # the worker kills after each job, as leftovers)
    stage(tmp_path)
    manifest = write_manifest([
        {**py_job(f"{ctx}-{n}", "use_multiprocessing", ctx=ctx), "max_attempts": 1,
         "priority": 3 - n} for n in (1, 2)])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When one worker runs both
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then both complete (the second does not die writing to the first's dead helpers)
    assert res.returncode == 0, res.stdout + res.stderr
    for n in (1, 2):
        assert_pdf(out / f"{ctx}-{n}.pdf", f"{ctx}-{n}")


def test_jobs_that_misuse_the_call_get_a_true_outcome_and_spare_their_worker(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given, for one worker: a job whose forked child returns instead of exiting (or fails:
    # raises, exits 5); an async and a generator function, and a plain one that returns a
    # generator; an exception that breaks traceback formatting; a chain of 100,000
    # exceptions; then an ordinary job
    stage(tmp_path)
    manifest = write_manifest([
        {**py_job("forks", "fork_child_returns"), "priority": 9},
        {**py_job("async", "async_job"), "priority": 8},
        {**py_job("gen", "generator_job"), "priority": 7},
        {**py_job("wrapped-gen", "wrapped_generator_job"), "priority": 7},
        {**py_job("evasive", "raise_evasive"), "priority": 6},
        {**py_job("deep", "raise_deep_chain", links=100_000), "timeout_s": 20, "priority": 5},
        {**py_job("surrogates", "raise_surrogates"), "priority": 4},
        {**py_job("child-raises", "fork_child_fails", how="raise"), "priority": 3},
        {**py_job("child-exits", "fork_child_fails", how="exit"), "priority": 3},
        {**py_job("child-says", "fork_child_fails", how="message"), "priority": 3},
        {**py_job("genexpr", "returns_a_generator"), "priority": 2},
        {**py_job("last", "write_pdf"), "priority": 1},
    ], defaults={"max_attempts": 1})

    # When one worker runs them
    t0 = time.monotonic()
    result, view = run_in_one_worker(tmp_path, manifest)
    took = time.monotonic() - t0

    # Then each outcome says what happened (none "crashed": the worker outlived them all)
    assert result.returncode == 1, result.stdout + result.stderr
    assert view.ids("done") == {"forks", "genexpr", "last"}, result.stdout
    attempts = {j: view.record("dead", j)["attempts"][-1]
                for j in ("async", "gen", "wrapped-gen", "evasive", "deep", "surrogates",
                          "child-raises", "child-exits", "child-says")}
    assert all(a["outcome"] == "failed" for a in attempts.values()), attempts
    assert "is an async function: it returned a coroutine" in attempts["async"]["error"]
    assert "is a generator function" in attempts["gen"]["error"]
    assert "is a generator function" in attempts["wrapped-gen"]["error"]
    assert attempts["evasive"]["error"] == "_Evasive: evasive"
    assert "could not be formatted" in attempts["evasive"]["traceback_tail"]
    assert attempts["deep"]["error"] == "ValueError: link 99999"
    assert attempts["deep"]["elapsed_s"] < 5, attempts["deep"]
    # (a forked child's own failure shows in its exit status, as a script's would)
    assert attempts["child-raises"]["error"] == "RuntimeError: child exited 1"
    assert attempts["child-exits"]["error"] == "RuntimeError: child exited 5"
    # (sys.exit("message"): exit 1 and the message on stderr, as Python does)
    assert attempts["child-says"]["error"] == "RuntimeError: child exited 1"
    assert "the child gave up" in (attempts["child-says"]["stderr_tail"] or ""), attempts
    # (escaped: JSON's "\udcff" for a lone surrogate made jq refuse the whole event log)
    assert attempts["surrogates"]["error"] == "ValueError: bad \\xff byte \\ud800 here"
    for raw in (tmp_path / "q" / "events.jsonl", tmp_path / "q" / "dead" / "surrogates.json"):
        for line in raw.read_text().splitlines():
            # (A strict decoder's view: no lone surrogate anywhere, which UTF-8 cannot hold.)
            json.dumps(json.loads(line), ensure_ascii=False).encode("utf-8")
    assert_pdf(tmp_path / "out" / "forks.pdf", "forks")
    assert_pdf(tmp_path / "out" / "last.pdf", "last")
    print(f"\n[misuse] {took:.1f}s")


INSTALLED_RENDER = """
from pathlib import Path

CALLS = []


def build(inputs, output, params):
    CALLS.append(params.get("who"))
    Path(output).write_text(" ".join(map(str, CALLS)))
"""


@pytest.fixture
def installed_package() -> Iterator[str]:
    """A package of the user's installed where libraries are (site-packages), as a user's
    own code is when deployed with pip; removed after the test."""
    import sysconfig
    import uuid

    name = f"rctl_installed_{uuid.uuid4().hex[:12]}"
    pkg = Path(sysconfig.get_paths()["purelib"]) / name
    pkg.mkdir()
    try:
        (pkg / "__init__.py").write_text("")
        (pkg / "render.py").write_text(INSTALLED_RENDER)
        yield name
    finally:
        import shutil

        shutil.rmtree(pkg, ignore_errors=True)


def test_an_installed_package_with_an_extension_module_stays_loaded(
        tmp_path: Path, write_manifest: Any, installed_package: str) -> None:
    # Given the user's installed package with an extension module of its own (a copy of
    # the standard library's _bisect: its init function is named for it), which its Python
    # code imports; re-imported for each job, the package's new classes would not be the
    # ones the extension keeps (review CG: isinstance failed from the second job on)
    import importlib.util
    import shutil
    import sysconfig

    origin = importlib.util.find_spec("_bisect").origin
    if not origin or not origin.endswith(".so"):
        pytest.skip("_bisect is built into this interpreter")
    pkg = Path(sysconfig.get_paths()["purelib"]) / installed_package
    shutil.copy(origin, pkg / Path(origin).name)
    (pkg / "render.py").write_text("from . import _bisect\n" + INSTALLED_RENDER)
    stage(tmp_path)
    call = f"{installed_package}.render:build"
    manifest = write_manifest([{"id": f"j{i}", "kind": "python", "callable": call,
                                "output": f"j{i}.txt", "params": {"who": f"j{i}"},
                                "priority": 10 - i} for i in (1, 2, 3)],
                              defaults={"max_attempts": 1})

    # When one worker runs three jobs calling it
    result, _ = run_in_one_worker(tmp_path, manifest)

    # Then it is a library's, loaded once, state and all, as before (README says so)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "out" / "j3.txt").read_text() == "j1 j2 j3"


def test_a_fork_handler_of_the_users_installed_package_retires_its_worker(
        tmp_path: Path, write_manifest: Any, installed_package: str) -> None:
    # Given the user's installed package registering a fork handler as it is imported
    # (again for each job: a library's would stay, one; these piled up, one a job, and ran
    # in every later fork of the worker: review CG)
    import sysconfig

    pkg = Path(sysconfig.get_paths()["purelib"]) / installed_package
    (pkg / "__init__.py").write_text("import os\nos.register_at_fork(after_in_child=int)\n")
    (pkg / "render.py").write_text(
        "import os\nfrom pathlib import Path\n\n\ndef build(inputs, output, params):\n"
        "    Path(output).write_text(str(os.getpid()))\n")
    stage(tmp_path)
    call = f"{installed_package}.render:build"
    manifest = write_manifest([{"id": f"j{i}", "kind": "python", "callable": call,
                                "output": f"j{i}.txt", "priority": 10 - i} for i in (1, 2, 3)],
                              defaults={"max_attempts": 1})

    # When one worker at a time runs three jobs calling it
    result, _ = run_in_one_worker(tmp_path, manifest)

    # Then each ran in a fresh worker (the one before it retired)
    assert result.returncode == 0, result.stdout + result.stderr
    pids = {(tmp_path / "out" / f"j{i}.txt").read_text() for i in (1, 2, 3)}
    assert len(pids) == 3, pids


@pytest.mark.parametrize("uses_at", [11, 8], ids=["other-code-first", "other-code-second"])
def test_an_installed_package_of_the_users_is_imported_afresh_for_each_job(
        tmp_path: Path, write_manifest: Any, installed_package: str, uses_at: int) -> None:
    # Given jobs calling a function of an installed package that counts its calls in a module
    # global, and a job of other code that imports that package (first: it is then loaded
    # as a library would be, before any job names it; or second)
    stage(tmp_path)
    call = f"{installed_package}.render:build"
    jobs = [{"id": f"j{i}", "kind": "python", "callable": call, "output": f"j{i}.txt",
             "params": {"who": f"j{i}"}, "priority": 10 - i} for i in (1, 3, 4)]
    jobs.append({**py_job("uses", "call_installed", output="uses.txt", target=call),
                 "priority": uses_at})
    manifest = write_manifest(jobs, defaults={"max_attempts": 1})

    # When one worker runs them one after another
    result, view = run_in_one_worker(tmp_path, manifest)

    # Then each job saw only its own call: the package was not kept as a library would be
    assert result.returncode == 0, result.stdout + result.stderr
    out = tmp_path / "out"
    assert {i: (out / f"{i}.txt").read_text() for i in ("j1", "uses", "j3", "j4")} == {
        "j1": "j1", "uses": "uses", "j3": "j3", "j4": "j4"}


@pytest.mark.parametrize("ctx", ["spawn"])  # (a fork pool's went without a SIGPIPE here)
def test_a_job_that_leaves_its_pool_running_completes(
        tmp_path: Path, write_manifest: Any, ctx: str) -> None:
    # Given a job that writes its output and returns with a multiprocessing pool running
    # (whose processes the worker kills after the job, as leftovers, while the pool's
    # threads still write to them), then an ordinary job, on one worker
    stage(tmp_path)
    manifest = write_manifest([
        {**py_job("pool", "leave_a_pool", ctx=ctx), "priority": 2},
        {**py_job("next", "write_pdf"), "priority": 1},
    ], defaults={"max_attempts": 1})
    queue, out = tmp_path / "q", tmp_path / "out"

    # When one worker runs them
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then both complete: the first was not recorded crashed (its worker killed by SIGPIPE)
    assert res.returncode == 0, res.stdout + res.stderr
    view = QueueView(queue)
    assert view.ids("done") == {"pool", "next"}, res.stdout
    assert [a["outcome"] for a in view.record("done", "pool")["attempts"]] == ["completed"]
    for jid in ("pool", "next"):
        assert_pdf(out / f"{jid}.pdf", jid)


def test_a_job_that_leaves_a_non_daemon_thread_does_not_hold_up_the_run(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job leaving a non-daemon thread (an interpreter waits for those at exit),
    # then two ordinary jobs, on one worker
    stage(tmp_path)
    manifest = write_manifest([
        {**py_job("leaker", "leave_a_thread", daemon=False,
                  pidfile=str(tmp_path / "leaker.pid")), "priority": 3},
        {**py_job("next-1", "write_pdf"), "priority": 2},
        {**py_job("next-2", "write_pdf"), "priority": 1},
    ])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When they run
    t0 = time.monotonic()
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"), timeout=60)

    # Then all complete promptly: the retiring worker exits (or is killed), not waits
    assert res.returncode == 0, res.stdout + res.stderr
    assert time.monotonic() - t0 < 20
    assert QueueView(queue).ids("done") == {"leaker", "next-1", "next-2"}


def pids_cgroup_v1_writable() -> bool:
    """Whether this process's cgroup in a v1 pids hierarchy takes child groups (as root)."""
    from renderctl import guards

    own = guards._own_pids_dir()
    return own is not None and cgroup_v1_writable()


@pytest.mark.skipif(not pids_cgroup_v1_writable(), reason="no writable cgroup v1 pids hierarchy")
def test_a_fork_bomb_meets_its_slots_task_limit_and_the_other_jobs_flow_on(
        tmp_path: Path, write_manifest: Any) -> None:
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a job forking as long as it can (bounded at 2,000 here) under a ceiling too
    # large to stop it (a process costs ~1 MB of it), beside ordinary jobs; each worker
    # slot may hold 64 tasks (4,096 outside tests)
    manifest = write_manifest([
        {**py_job("bomb", "fork_until_refused", most=2000, pids=str(tmp_path / "pids")),
         "memory_mb": 8000},
        *(py_job(f"calm-{i}", "write_pdf") for i in range(4))])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "2", "--json"),
                    env={"RENDERCTL_TEST_SLOT_PIDS_MAX": "64"})
    try:
        assert runner.wait(120) == 0, (runner.lines, runner.stderr())
    finally:
        runner.close()
    # Then its forks were refused at the limit (without it: 2,000 processes, and a real
    # bomb reached the machine's pid_max, where no process anywhere could fork)
    pages, text = pdf_text(out / "bomb.pdf")
    made = int(text.split()[1].rstrip(","))
    assert 32 <= made < 64 and "refused (Resource temporarily unavailable)" in text, text
    # And its children died with its attempt; the other jobs completed
    children = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert len(children) == made and all(gone(pid) for pid in children)
    assert QueueView(queue).ids("done") == {"bomb", *(f"calm-{i}" for i in range(4))}
    for i in range(4):
        assert_pdf(out / f"calm-{i}.pdf", f"calm-{i}")
    # And the runner's pids cgroup went with it
    from renderctl import guards

    own = guards._own_pids_dir()
    assert own is not None and not (own / f"renderctl-{runner.pid}").exists()


# -- what no job's end can undo, and what a job does to its worker's surroundings ----------


def test_a_tree_thousands_of_folders_deep_left_by_a_job_is_removed_and_costs_no_one(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given, for one worker, a job that leaves a tree 5,000 folders deep in its working
    # folder, then another job
    stage(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    manifest = write_manifest([
        {**py_job("deep", "leave_deep_tree", depth=5000), "priority": 2},
        {**py_job("after", "write_pdf"), "priority": 1},
    ], defaults={"max_attempts": 1})

    # When one worker runs both, the work root under our TMPDIR
    result = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out",
                                                "--workers", "1"),
                     env={"TMPDIR": str(scratch)}, timeout=60)

    # Then both complete and the run ends well, leaving nothing in TMPDIR (before: rmtree's
    # recursion raised RecursionError out of the worker's clean-up, then out of the runner's,
    # which died with a traceback, the job to be recovered and die again: audit ES)
    assert result.returncode == 0 and "Traceback" not in result.stderr, \
        result.stdout + result.stderr
    assert QueueView(tmp_path / "q").ids("done") == {"deep", "after"}
    assert_pdf(tmp_path / "out" / "after.pdf", "after")
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("what", ["audithook", "atfork", "atfork_posix", "no_new_privs",
                                  "setuid", "seteuid", "library_atfork", "unrestorable",
                                  "unfreeze", "securebits"])
def test_a_job_that_changes_its_worker_for_good_retires_it(
        tmp_path: Path, write_manifest: Any, what: str) -> None:
    # Given, for one worker, a job that leaves a change nothing can take back (an audit
    # hook, a fork handler, no_new_privs, root given up for nobody; seteuid to nobody and
    # back, which leaves the identity as it was and clears the parent-death signal: audit
    # BY), or that the clean-up fails on (audit DL: the worker died, charged to the next
    # job), or unfreezes its heap (audit EU: every later collection walks it), or imports
    # a library that registers a fork handler (which is no such change), then a job that
    # records its pid
    stage(tmp_path)
    report, log = tmp_path / "seen.jsonl", tmp_path / "audit.log"
    manifest = write_manifest([
        {**py_job("taint", "taint_worker", what=what, report=str(report), log=str(log)),
         "priority": 2},
        {**py_job("after", "observe_process", report=str(report)), "priority": 1},
    ], defaults={"max_attempts": 1})

    # When one worker runs both
    result, view = run_in_one_worker(tmp_path, manifest)

    # Then the run goes on (nobody's user cannot keep the worker's folders: that stopped
    # the run with exit 74) and the second job runs in a fresh worker. The first completes,
    # but for the one that gave up root: its worker cannot read its output to check it
    if what == "setuid":
        assert result.returncode == 1, result.stdout + result.stderr
        attempt = view.record("dead", "taint")["attempts"][-1]
        assert attempt["outcome"] == "failed" and "Permission denied" in attempt["error"]
        assert view.ids("done") == {"after"}
    else:
        assert result.returncode == 0, result.stdout + result.stderr
        assert view.ids("done") == {"taint", "after"}
    first, second = (json.loads(line)["pid"] for line in report.read_text().splitlines())
    if what == "library_atfork":
        assert first == second, "a library's own set-up retired its worker"
        return
    assert first != second, "the tainted worker ran the next job"
    assert_pdf(tmp_path / "out" / "after.pdf", "after")
    if what == "audithook":
        assert "after" not in log.read_text()


@pytest.mark.parametrize("how", ["file", "remoded"])
def test_a_job_that_replaces_the_work_root_costs_only_its_worker(
        tmp_path: Path, write_manifest: Any, how: str) -> None:
    # Given, for one worker, a command that removes the folder holding its working folder
    # (the runner's work root) and leaves a file in its place, or opens that folder to
    # everyone, then two python jobs
    stage(tmp_path)
    wreck = ('r=$(dirname "$PWD"); rm -rf "$r"; echo x > "$r"; echo ok > "$1"'
             if how == "file" else 'chmod 777 "$(dirname "$PWD")"; echo ok > "$1"')
    manifest = write_manifest([
        {"id": "wreck", "kind": "command", "argv": ["sh", "-c", wreck, "sh", "{output}"],
         "output": "wreck.txt", "priority": 3},
        {**py_job("next1", "write_pdf"), "priority": 2},
        {**py_job("next2", "write_pdf"), "priority": 1},
    ], defaults={"max_attempts": 1})
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()

    # When one worker at a time runs them, each replaced after its job (the work root in a
    # TMPDIR of the test's own)
    result = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out",
                                                "--workers", "1",
                                                "--max-jobs-per-worker", "1"),
                     env={"TMPDIR": str(tmp)}, timeout=30)

    # Then every job completes (the run stopped with exit 74, "Not a directory", at every
    # run until the job had used its attempts), and nothing is left in TMPDIR (a re-moded
    # root, replaced for the workers to come, goes at the end with the new one)
    assert result.returncode == 0, result.stdout + result.stderr
    assert QueueView(tmp_path / "q").ids("done") == {"wreck", "next1", "next2"}
    for job in ("next1", "next2"):
        assert_pdf(tmp_path / "out" / f"{job}.pdf", job)
    assert [p.name for p in tmp.iterdir() if p.name.startswith("renderctl-work")] == []


def test_a_job_that_wrecks_the_work_root_under_an_idle_worker_costs_it_nothing(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given two workers: four commands that fail their first attempt (each leaving a mark)
    # and come back after a backoff, and one that, once all four are marked and back in
    # pending/ (the other worker done with them, idle), removes the runner's work root and
    # leaves a file in its place
    marks = tmp_path / "marks"
    marks.mkdir()
    queue = tmp_path / "q"
    again = ('if [ "$RENDERCTL_ATTEMPT" = 1 ]; then : > "$2"; exit 3; fi; echo ok > "$1"')
    wreck = ('until [ "$(ls "$2" | wc -l)" -ge 4 ] && [ "$(ls "$3" | wc -l)" -ge 4 ]; do '
             'sleep 0.01; done; r=$(dirname "$PWD"); rm -rf "$r"; echo x > "$r"; '
             'echo ok > "$1"')
    manifest = write_manifest([
        {"id": "wreck", "kind": "command", "output": "wreck.txt", "priority": 9,
         "argv": ["sh", "-c", wreck, "sh", "{output}", str(marks), str(queue / "pending")]},
        *({"id": f"again{i}", "kind": "command", "output": f"again{i}.txt",
           "argv": ["sh", "-c", again, "sh", "{output}", str(marks / str(i))]}
          for i in range(4)),
    ], defaults={"max_attempts": 2})
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()

    # When they run (the retries 2 s after their failure: the idle worker's working folder
    # is gone by then)
    result = run_cli("run", manifest, *cli_args(queue, tmp_path / "out", "--workers", "2",
                                                "--backoff-base", "2"),
                     env={"TMPDIR": str(tmp)}, timeout=60)

    # Then every job completes at its second attempt: the idle worker retires and hands its
    # job back uncharged (its chdir failed: the run stopped with exit 74, and the job that
    # worker held was dead-lettered, "worker exited with status 74 during the job")
    assert result.returncode == 0, result.stdout + result.stderr
    view = QueueView(queue)
    assert view.ids("done") == {"wreck", *(f"again{i}" for i in range(4))}
    for i in range(4):
        assert len(view.record("done", f"again{i}")["attempts"]) == 2
        assert (tmp_path / "out" / f"again{i}.txt").read_text() == "ok\n"
    assert [p.name for p in tmp.iterdir() if p.name.startswith("renderctl-work")] == []


def test_a_command_that_lowers_its_workers_open_file_limit_costs_only_itself(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given, for one worker, a command that lowers its worker's open-file limit to 20 (from
    # outside, by pid: no wrapper in the worker sees it), then a python job
    stage(tmp_path)
    lower = ("import os, resource, sys; "
             "resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (20, 20)); "
             "open(sys.argv[1], 'w').write('ok')")
    manifest = write_manifest([
        {"id": "lower", "kind": "command", "argv": [sys.executable, "-c", lower, "{output}"],
         "output": "lower.txt", "priority": 2},
        {**py_job("after", "write_pdf"), "priority": 1},
    ], defaults={"max_attempts": 1})

    # When one worker runs both
    result = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out",
                                                "--workers", "1"))

    # Then the next job completes: the worker put its limit back (it could not set the
    # next job's memory ceiling, "Too many open files": the run halted with exit 74, at
    # every run until that job was dead). The command may fail of its own act (its output
    # checked by a worker with 20 descriptors).
    assert result.returncode in (0, 1), result.stdout + result.stderr
    view = QueueView(tmp_path / "q")
    assert "after" in view.ids("done")
    assert_pdf(tmp_path / "out" / "after.pdf", "after")
    assert view.ids("done") | view.ids("dead") == {"lower", "after"}


def test_what_a_command_changes_in_its_worker_from_outside_no_later_job_finds(
        tmp_path: Path, write_manifest: Any) -> None:
    import json

    # Given, for one worker, an observer, a command that sets its worker's timer slack to
    # 200 ms, its I/O priority to idle and its OOM score to 900 (from outside, by pid: as
    # `ionice -p $PPID` does), then an observer
    stage(tmp_path)
    report = tmp_path / "seen.jsonl"
    change = ('echo 200000000 > /proc/$PPID/timerslack_ns && ionice -c 3 -p $PPID && '
              'echo 900 > /proc/$PPID/oom_score_adj && echo ok > "$1"')
    manifest = write_manifest([
        {**py_job("before", "observe_process", report=str(report)), "priority": 3},
        {"id": "change", "kind": "command", "argv": ["sh", "-c", change, "sh", "{output}"],
         "output": "change.txt", "priority": 2},
        {**py_job("after", "observe_process", report=str(report)), "priority": 1},
    ], defaults={"max_attempts": 1})

    # When one worker runs them in that order
    result = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out",
                                                "--workers", "1"))

    # Then the second observer finds what the first did (review ET: a later job's 1 ms
    # sleeps took 200-300 ms, at idle I/O priority)
    assert result.returncode == 0, result.stdout + result.stderr
    before, after = (json.loads(line) for line in report.read_text().splitlines())
    assert before["pid"] == after["pid"], "not one worker: the test proves nothing"
    assert after["prctl"] == before["prctl"]


@pytest.mark.parametrize("what", ["fifo", "folder", "symlink", "hardlink"])
def test_a_job_that_replaces_the_queues_spare_record_files_costs_nothing(
        tmp_path: Path, write_manifest: Any, what: str) -> None:
    # Given, for one worker, a job, then one that puts a FIFO, a folder, or a symlink or
    # hard link (to a file of the user's) in place of each spare record file in tmp/ (inodes
    # the runner keeps to refill with later records), then another job
    stage(tmp_path)
    queue = tmp_path / "q"
    target = tmp_path / "precious.txt"
    target.write_text("mine")
    manifest = write_manifest([
        {**py_job("first", "write_pdf"), "priority": 3},
        {**py_job("planter", "plant_in_spares", queue=str(queue), what=what,
                  target=str(target)), "priority": 2},
        {**py_job("after", "write_pdf"), "priority": 1},
    ], defaults={"max_attempts": 1})

    # When they run
    result = run_cli("run", manifest, *cli_args(queue, tmp_path / "out", "--workers", "1"),
                     timeout=30)

    # Then all complete, and what was planted is gone (a FIFO held the runner in open() for
    # good, and every restart too; a folder or symlink stopped the run with exit 74; the
    # hard-linked file was overwritten with a record)
    assert result.returncode == 0, result.stdout + result.stderr
    assert QueueView(queue).ids("done") == {"first", "planter", "after"}
    for job in ("first", "planter", "after"):
        assert_pdf(tmp_path / "out" / f"{job}.pdf", job)
    assert target.read_text() == "mine"
    assert not any(p.is_symlink() or p.is_dir() or p.is_fifo()
               or p.lstat().st_nlink > 1 for p in (queue / "tmp").iterdir())


def test_a_fifo_in_place_of_the_event_log_stops_the_run_instead_of_hanging_it(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given, for one worker, a job that puts a FIFO where the queue's event log is, then
    # another job
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    log = queue / "events.jsonl"
    manifest = write_manifest([
        {**py_job("fifo", "fifo_for_file", path=str(log)), "priority": 2},
        {**py_job("after", "write_pdf"), "priority": 1},
    ], defaults={"max_attempts": 1})

    # When they run
    first = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"), timeout=30)

    # Then the run stops with an I/O error naming the log (it waited in open() for a
    # reader, for good, as did every restart), and once the FIFO is removed the next run
    # completes the other job, uncharged (the one that stopped the run, running then, is
    # charged its attempt)
    assert first.returncode == 74, first.stdout + first.stderr
    assert "events.jsonl" in first.stderr and "not a regular file" in first.stderr
    # (and the commands that read the log answer meanwhile: `metrics` waited for a writer)
    for command in ("status", "metrics"):
        assert run_cli(command, "--queue", queue, timeout=10).returncode == 0
    log.unlink()
    again = run_cli("run", "--queue", queue, timeout=30)
    assert again.returncode == 1, again.stdout + again.stderr
    view = QueueView(queue)
    assert view.ids("done") == {"after"} and view.ids("dead") == {"fifo"}
    assert [a["outcome"] for a in view.record("done", "after")["attempts"]] == ["completed"]
    assert_pdf(out / "after.pdf", "after")


def test_a_folder_in_place_of_the_runners_state_file_costs_nothing(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that puts a folder where the runner keeps its state for `top`
    # (QUEUE/runner.state.json), and another job
    stage(tmp_path)
    queue = tmp_path / "q"
    manifest = write_manifest([
        {**py_job("folder", "folder_for_file", path=str(queue / "runner.state.json")),
         "priority": 2},
        {**py_job("after", "write_pdf"), "priority": 1},
    ], defaults={"max_attempts": 1})

    # When they run
    result = run_cli("run", manifest, *cli_args(queue, tmp_path / "out", "--workers", "1"))

    # Then the run ends well: the state file is an aid to `top`, not the queue (its removal
    # at the end failed, "Is a directory", and the run exited 74 with every job done)
    assert result.returncode == 0, result.stdout + result.stderr
    assert QueueView(queue).ids("done") == {"folder", "after"}


def test_an_output_hard_linked_to_a_file_elsewhere_is_not_published(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job whose output is a hard link to a file outside the output root
    stage(tmp_path)
    outside = tmp_path / "outside.pdf"
    from jobfns import _pdf

    _pdf(outside, "outside")
    before = outside.read_bytes()
    manifest = write_manifest([py_job("hard", "hardlink_output", target=str(outside))],
                              defaults={"max_attempts": 1})

    # When it runs
    result, view = run_in_one_worker(tmp_path, manifest)

    # Then it is an invalid output (published, it would change with that file after its
    # check and hash), nothing is published, and the file outside is untouched
    assert result.returncode == 1, result.stdout + result.stderr
    attempt = view.record("dead", "hard")["attempts"][-1]
    assert attempt["outcome"] == "invalid_output" and "hard link" in attempt["error"]
    assert not (tmp_path / "out" / "hard.pdf").exists()
    assert outside.read_bytes() == before and os.stat(outside).st_nlink == 1


def test_a_hard_linked_output_that_is_no_pdf_is_named_as_the_job_names_it(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job whose output, not a PDF, is a hard link to a file elsewhere
    stage(tmp_path)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"data")
    manifest = write_manifest([py_job("hard", "hardlink_output", output="sub/hard.bin",
                                      target=str(outside))], defaults={"max_attempts": 1})

    # When it runs
    _, view = run_in_one_worker(tmp_path, manifest)

    # Then the error names the output as the job does (it named the attempt's temporary,
    # .rctl-<tag>.tmp: audit FU)
    error = view.record("dead", "hard")["attempts"][-1]["error"]
    assert error.startswith("sub/hard.bin: the file has 1 other hard link(s)"), error


def test_a_process_that_joined_the_runners_group_dies_with_its_worker_under_sampling(
        tmp_path: Path, write_manifest: Any, leftover: Path) -> None:
    # Given a job that starts a process in the runner's own process group, then ends its
    # worker; under the sampling guard (no cgroup finds that process)
    stage(tmp_path)
    manifest = write_manifest([
        {**py_job("joins", "join_runner_group_and_end_worker", pidfile=str(leftover)),
         "priority": 2},
        {**py_job("next", "write_pdf"), "priority": 1},
    ], defaults={"max_attempts": 1})

    # When it runs (the runner in a group of its own, not the test session's: when the
    # worker ends, the kernel finds that group orphaned, and if any process of it is stopped
    # then, as another test's may be, it sends the whole group SIGHUP and SIGCONT, which
    # killed pytest and its workers mid-run)
    result = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out",
                                                "--workers", "1", "--memory-guard",
                                                "sampling"), timeout=30, own_group=True)
    view = QueueView(tmp_path / "q")

    # Then its attempt is charged, the next job completes, and the process is killed (the
    # runner spared everything in its own group: it ran on after the run)
    assert result.returncode == 1, result.stdout + result.stderr
    assert view.ids("done") == {"next"}
    left = int(leftover.read_text())
    wait_until(lambda: gone(left), timeout_s=2, what="the process in the runner's group to die")


@pytest.mark.parametrize("guard", [
    pytest.param("cgroup-v1", marks=needs_cgroup_v1), "sampling"])
def test_a_sibling_a_job_made_of_its_worker_does_not_outlive_the_job(
        tmp_path: Path, write_manifest: Any, leftover: Path, guard: str) -> None:
    # Given a job that makes a process a sibling of its worker (clone(CLONE_PARENT): no
    # kill of the worker's tree reaches it) in a new session, and completes; then a job
    # the test holds until that process is gone
    stage(tmp_path)
    go = tmp_path / "go"
    manifest = write_manifest([
        {**py_job("sibling", "escape_as_sibling", pidfile=str(leftover)), "priority": 2},
        {**py_job("held", "wait_for_go", pidfile=str(tmp_path / "held.pid"), go=str(go)),
         "priority": 1},
    ], defaults={"max_attempts": 1})
    runner = Runner(manifest, *cli_args(tmp_path / "q", tmp_path / "out", "--workers", "1",
                                        "--memory-guard", guard))
    try:
        # When the runner goes on to the next job
        wait_for_pid(tmp_path / "held.pid", what="the held job to start")
        sibling = int(leftover.read_text())

        # Then the sibling is killed while the run goes on (under cgroup-v1 before the
        # next job started, with the first job's slot; under sampling by the runner, the
        # fork server's parent); it ran on, in the slot of the jobs after it, until the
        # run ended (and under sampling, after it)
        wait_until(lambda: gone(sibling), timeout_s=3, what="the worker's sibling to die")
        go.touch()
        assert runner.wait(30) == 0, (runner.lines, runner.stderr())
    finally:
        go.touch()
        runner.close()
    assert QueueView(tmp_path / "q").ids("done") == {"sibling", "held"}


@needs_cgroup_v1
def test_a_sibling_a_job_made_of_its_worker_dies_with_a_killed_runner(
        tmp_path: Path, write_manifest: Any, leftover: Path) -> None:
    # Given a running job that has made a sibling of its worker in a new session (in its
    # slot: under cgroup-v1) and hangs
    stage(tmp_path)
    manifest = write_manifest([py_job("sibling", "escape_as_sibling", pidfile=str(leftover),
                                      hang_s=600)])
    runner = Runner(manifest, *cli_args(tmp_path / "q", tmp_path / "out", "--workers", "1",
                                        "--memory-guard", "cgroup-v1"))
    try:
        sibling = wait_for_pid(leftover, what="the sibling to start")

        # When the runner is SIGKILLed
        runner.kill()

        # Then the sibling dies within 2 s too (the reaper empties the runner's slots)
        wait_until(lambda: gone(sibling), timeout_s=2, what="the sibling to die with the runner")
    finally:
        runner.close()


@needs_cgroup_v1
def test_a_sibling_a_failed_job_made_of_its_worker_is_gone_before_the_next_job(
        tmp_path: Path, write_manifest: Any, leftover: Path) -> None:
    # Given a job that makes a sibling of its worker (clone(CLONE_PARENT)) in a new session
    # and then fails, and a job after it in the same worker that looks for that sibling
    stage(tmp_path)
    report = tmp_path / "seen.json"
    manifest = write_manifest([
        {**py_job("sibling", "escape_as_sibling", pidfile=str(leftover), fail=True),
         "priority": 2},
        {**py_job("probe", "report_alive", pidfile=str(leftover), report=str(report)),
         "priority": 1},
    ], defaults={"max_attempts": 1})

    # When one worker runs both under the cgroup guard
    result, view = run_in_one_worker(tmp_path, manifest, "--memory-guard", "cgroup-v1")

    # Then the sibling was gone when the next job started (the slot was swept after
    # successes only: it ran on in the next job's slot until the runner's periodic sweep)
    assert result.returncode == 1, result.stdout + result.stderr
    assert view.ids("done") == {"probe"}
    assert json.loads(report.read_text()) == {"alive": False}


def test_a_process_the_runner_had_before_the_run_is_left_alone(
        tmp_path: Path, write_manifest: Any, leftover: Path) -> None:
    # Given a runner started the way container entrypoints do: a sidecar started in the
    # background, then the runner exec'd in the same process (so the sidecar is its child)
    stage(tmp_path)
    manifest = write_manifest([py_job("slow", "sleep_then_write", s=2.5)])
    # (its output elsewhere: the pipes must close when the runner ends)
    script = f'sleep 300 >/dev/null 2>&1 & echo $! > {leftover}; exec "$@"'
    res = subprocess.run(["sh", "-c", script, "sh", *RENDERCTL, "run", str(manifest),
                          *cli_args(tmp_path / "q", tmp_path / "out", "--workers", "1")],
                         capture_output=True, text=True, timeout=60)

    # When the run has lasted past the runner's periodic sweep of orphans (~1 s), then ended
    assert res.returncode == 0, res.stdout + res.stderr

    # Then the sidecar still runs (it was killed as a job's leftover)
    assert not gone(int(leftover.read_text()))


@needs_cgroup_v1
def test_a_sigkilled_runner_leaves_no_cgroup_behind_even_if_no_runner_follows(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner with the cgroup guard, a job running in one of its slots
    from renderctl import guards

    job, go = held_job(tmp_path, "held")
    manifest = write_manifest([job])
    runner = Runner(manifest, *cli_args(tmp_path / "q", tmp_path / "out", "--workers", "2",
                                        "--json"))
    try:
        job_pid = wait_for_pid(tmp_path / "held.pid")
        own = guards._own_cgroup_dir(True, "memory")
        assert own is not None
        mine = [own / f"renderctl-{runner.pid}"]
        pids_own = guards._own_pids_dir()
        if pids_own is not None:
            mine.append(pids_own / f"renderctl-{runner.pid}")
        assert all(d.is_dir() for d in mine), mine

        # When the runner is SIGKILLed, and no runner is started after it
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait()

        # Then its job dies, and its cgroups (memory, and pids where it had them) are gone
        # within seconds: before, they stayed until a runner started in the same parent
        # cgroup, for good if none ever did (three such were found on this machine)
        wait_until(lambda: gone(job_pid), what="the job to die", timeout_s=5)
        wait_until(lambda: not any(d.exists() for d in mine), timeout_s=5,
                   what=lambda: f"the runner's cgroups to go: {[d for d in mine if d.exists()]}")
    finally:
        go.touch()
        runner.close()


def test_a_sigkilled_runner_leaves_no_work_root_behind_even_if_no_runner_follows(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner whose job has left scratch in its working folder, and runs on
    job, go = held_job(tmp_path, "held")
    manifest = write_manifest([job])
    runner = Runner(manifest, *cli_args(tmp_path / "q", tmp_path / "out", "--workers", "1"))
    try:
        job_pid = wait_for_pid(tmp_path / "held.pid")
        note, = (tmp_path / "q" / "control").glob(f"work.{runner.pid}-*")
        root = Path(note.read_text().split("\n")[0])
        assert root.name.startswith("renderctl-work-") and root.is_dir(), root
        cwd = Path(os.readlink(f"/proc/{job_pid}/cwd"))
        assert cwd.parent == root, (cwd, root)
        (cwd / "scratch.bin").write_bytes(b"s" * 4096)

        # When the runner is SIGKILLed, and no runner is started after it
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait()

        # Then the job dies, and the work root goes with it, scratch and all: before, only
        # the queue's next runner removed it, and a queue never run again (a CI job's) left
        # it in /tmp for good
        wait_until(lambda: gone(job_pid), what="the job to die", timeout_s=5)
        wait_until(lambda: not root.exists(), timeout_s=5, what=f"{root} to go")
    finally:
        go.touch()
        runner.close()


def test_a_job_that_stops_the_fork_server_does_not_stall_the_run(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that SIGSTOPs the fork server (its worker's parent) and a job that times
    # out meanwhile, its worker killed
    stage(tmp_path)
    manifest = write_manifest([
        py_job("stopper", "stop_parent_then_write"),
        {**py_job("slow", "sleep_then_write", s=600), "timeout_s": 2, "max_attempts": 1},
    ])

    # When they run
    t0 = time.monotonic()
    res = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out", "--workers",
                                             "2", "--kill-grace", "0.5",
                                             "--start-method", "forkserver"), timeout=60)

    # Then the run ends on its own: the stopped fork server, which reports its workers'
    # deaths, is resumed (the killed worker's job was never settled, the runner spinning
    # a core, until a signal ended the run), and the timeout is charged as it happened
    assert res.returncode == 1, res.stdout + res.stderr
    assert time.monotonic() - t0 < 30
    view = QueueView(tmp_path / "q")
    assert view.states_of(["stopper", "slow"]) == {"stopper": ["done"], "slow": ["dead"]}
    attempt = view.record("dead", "slow")["attempts"][-1]
    assert attempt["outcome"] == "timeout" and attempt["elapsed_s"] < 5


@pytest.mark.parametrize("sigalrm", ["as_is", "blocked"])
def test_a_fork_server_stopped_while_the_runner_starts_a_worker_does_not_hang_the_run(
        tmp_path: Path, write_manifest: Any, sigalrm: str) -> None:
    from jobfns import resume_all, signal_mask, stopped

    # Given a run of two jobs on one worker replaced after each job, the runner frozen as it
    # starts the second worker (start_worker's second pass: the first's successor, started
    # while the first job runs; after the runner resumed a stopped fork server, before it
    # asks that server for the worker); in one case started with SIGALRM blocked (a signal
    # mask inherited from whatever started it)
    stage(tmp_path)
    manifest = write_manifest([py_job("first", "write_pdf"), py_job("second", "write_pdf")])
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM} if sigalrm == "blocked"
                                  else set())
    try:
        runner = Runner(manifest, *cli_args(tmp_path / "q", tmp_path / "out", "--workers",
                                            "1", "--max-jobs-per-worker", "1",
                                            "--start-method", "forkserver", "--json"),
                        env={"RENDERCTL_STOP_AT": "start_worker:n=2"})
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    servers: list[Any] = []
    try:
        blocked = bool(signal_mask(runner.pid, "SigBlk") & 1 << (signal.SIGALRM - 1))
        assert blocked == (sigalrm == "blocked")
        wait_until(lambda: stopped(runner.pid), timeout_s=30, what="the runner to stop")
        servers = [p for p in psutil.Process(runner.pid).children()
                   if "multiprocessing.forkserver" in " ".join(p.cmdline())]
        assert len(servers) == 1, servers

        # When the fork server is SIGSTOPped there (as a job in another worker, its child,
        # can do at any moment), and the runner goes on
        servers[0].suspend()
        os.kill(runner.pid, signal.SIGCONT)

        # Then the run ends on its own, both jobs done: the start resumes the server it
        # waits on (before, it blocked reading the stopped server's answer, for good)
        code = runner.wait(30)
    finally:
        resume_all(servers)
        runner.close()
    assert code == 0, (runner.lines, runner.stderr())
    view = QueueView(tmp_path / "q")
    assert view.states_of(["first", "second"]) == {"first": ["done"], "second": ["done"]}
    for i in ("first", "second"):
        assert_pdf(tmp_path / "out" / f"{i}.pdf", i)


@pytest.mark.parametrize("then", ["finish", "kill_waiter", "kill_waiter_unseen"])
def test_a_job_that_kills_the_fork_server_takes_no_other_job_down(
        tmp_path: Path, write_manifest: Any, then: str) -> None:
    # Given jobs of one attempt each (the waiter two): one that waits in its worker for the
    # test's word, one that SIGKILLs the fork server (its worker's parent, as every worker's
    # is) once the first has started, and more to run after (on workers from a fork server
    # started anew)
    stage(tmp_path)
    started, go, killed = tmp_path / "waiter.pid", tmp_path / "go", tmp_path / "killed"
    killer_started, kill_now = tmp_path / "killer.pid", tmp_path / "kill-now"
    manifest = write_manifest([
        {**py_job("waiter", "wait_for_go", pidfile=str(started), go=str(go)),
         "max_attempts": 2},
        {**py_job("killer", "kill_parent_then_write", started=str(killer_started),
                  wait_for=str(kill_now if then == "kill_waiter_unseen" else started),
                  killed=str(killed)), "max_attempts": 1},
        *({**py_job(f"after{i}", "write_pdf"), "max_attempts": 1} for i in range(4)),
    ])
    runner = Runner(manifest, *cli_args(tmp_path / "q", tmp_path / "out", "--workers", "2",
                                        "--max-jobs-per-worker", "1",
                                        "--start-method", "forkserver", "--json"))
    try:
        # When the fork server is killed while the waiter runs (and then, in one case, the
        # waiter's worker is SIGKILLed from outside, as the runner's child it now is)
        if then == "kill_waiter_unseen":
            # (the runner stopped meanwhile: it sees the server's death and the worker's at
            # once, as a runner busy elsewhere may; before, the worker's outcome was then
            # `failed`, "exited with status 255", whenever the other worker's adoption had
            # forgotten the dead server first: 1 of ~2,000 in CI)
            wait_for_pid(started)
            wait_for_pid(killer_started)
            os.kill(runner.pid, signal.SIGSTOP)
            kill_now.touch()
        wait_for_pid(killed, what="the job that killed the fork server to outlive it")
        if then.startswith("kill_waiter"):
            os.kill(wait_for_pid(started), signal.SIGKILL)
            started.unlink()
            if then == "kill_waiter_unseen":
                os.kill(runner.pid, signal.SIGCONT)
            wait_for_pid(started, what="the waiter's second attempt")
        go.touch()
        code = runner.wait(60)
    finally:
        go.touch()
        runner.close()

    # Then every job completes at its first attempt: the workers lived on (before, each
    # running job died with the server, charged `crashed`, and so was dead-lettered); a
    # worker killed after is told apart by its real status, reaped by the runner (the dead
    # server cannot report it), and its job is retried
    assert code == 0, (runner.lines, runner.stderr())
    view = QueueView(tmp_path / "q")
    ids = ["waiter", "killer", *(f"after{i}" for i in range(4))]
    assert view.states_of(ids) == {i: ["done"] for i in ids}
    for i in ids:
        attempts = view.record("done", i)["attempts"]
        if i == "waiter" and then.startswith("kill_waiter"):
            assert [a["outcome"] for a in attempts] == ["crashed", "completed"]
            assert attempts[0]["signal"] == signal.SIGKILL, attempts[0]
            assert "SIGKILL (not sent by renderctl)" in attempts[0]["error"]
        else:
            assert [a["outcome"] for a in attempts] == ["completed"]
        assert_pdf(tmp_path / "out" / f"{i}.pdf", i)


def test_after_a_fork_server_kill_no_job_starts_where_its_parent_is_the_runner(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given one worker (recycled only after 1,000 jobs): a job that kills the fork server,
    # then one that SIGSTOPs its worker's parent (`kill -STOP $PPID`), then one more
    stage(tmp_path)
    manifest = write_manifest([
        py_job("killer", "kill_parent_then_write", wait_for=str(tmp_path),
               killed=str(tmp_path / "killed")),
        py_job("stopper", "stop_parent_then_write"),
        py_job("after", "write_pdf"),
    ])

    # When they run
    res = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out", "--workers",
                                             "1", "--start-method", "forkserver"), timeout=60)

    # Then all complete at their first attempt: the stopper ran in a fresh worker (a new
    # fork server's child), whose stopped parent the runner resumes as ever; before, it ran
    # in the first worker, whose parent was the runner by then, and stopped the run for good
    assert res.returncode == 0, res.stdout + res.stderr
    view = QueueView(tmp_path / "q")
    ids = ["killer", "stopper", "after"]
    assert view.states_of(ids) == {i: ["done"] for i in ids}
    for i in ids:
        assert [a["outcome"] for a in view.record("done", i)["attempts"]] == ["completed"]
        assert_pdf(tmp_path / "out" / f"{i}.pdf", i)


def test_a_worker_whose_fork_server_dies_as_it_begins_runs_no_job(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import resume_all, stopped

    # Given one worker, each worker frozen as it begins (worker:born: before it arms its
    # parent-death signal), and a job that notes its parent
    stage(tmp_path)
    pidfile = tmp_path / "job.pid"
    manifest = write_manifest([{**py_job("job", "write_pdf_noting_parent",
                                         pidfile=str(pidfile)), "max_attempts": 1}])
    runner = Runner(manifest, *cli_args(tmp_path / "q", tmp_path / "out", "--workers", "1",
                                        "--start-method", "forkserver", "--json"),
                    env={"RENDERCTL_STOP_AT": "worker:born"})

    def frozen_worker(seen: set[int]) -> psutil.Process | None:
        for p in psutil.Process(runner.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if p.pid not in seen and stopped(p.pid):
                    return p
        return None

    frozen: list[psutil.Process] = []
    try:
        first = wait_until(lambda: frozen_worker(set()), timeout_s=30,
                           what="the first worker to begin")
        frozen.append(first)

        # When its fork server dies there (the worker begins as the runner's child, with no
        # parent-death signal to tell it so), and it goes on; then its successor, from a
        # new fork server, goes on too
        first.parent().kill()
        wait_until(lambda: first.ppid() == runner.pid, timeout_s=30,
                   what="the runner to adopt the first worker")
        first.resume()
        second = wait_until(lambda: frozen_worker({first.pid}) or pidfile.exists(),
                            timeout_s=30, what="a second worker to begin")
        if isinstance(second, psutil.Process):
            frozen.append(second)
            second.resume()
        code = runner.wait(30)
    finally:
        resume_all(frozen)
        runner.close()

    # Then the job ran in the second worker, a fork server's child, at its first attempt:
    # the first handed it back uncharged (before, the job ran there with the runner for its
    # parent, where a `kill -STOP $PPID` stops the whole run)
    assert code == 0, (runner.lines, runner.stderr())
    job_pid, job_parent = map(int, pidfile.read_text().split())
    assert (job_pid, job_parent != runner.pid) == (frozen[-1].pid, True), (first.pid, job_parent)
    attempts = QueueView(tmp_path / "q").record("done", "job")["attempts"]
    assert [a["outcome"] for a in attempts] == ["completed"]
    assert_pdf(tmp_path / "out" / "job.pdf", "job")


def test_a_worker_that_outlived_its_fork_server_exits_with_its_own_status(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that kills the fork server, waits for it to go, then exits with status 255
    stage(tmp_path)
    manifest = write_manifest([
        {**py_job("killer", "kill_parent_then_write", wait_for=str(tmp_path),
                  killed=str(tmp_path / "killed"), exit=255), "max_attempts": 1},
    ])

    # When it runs
    res = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out",
                                             "--start-method", "forkserver"), timeout=60)

    # Then its attempt is that exit (status 255, reaped by the runner), not a death with the
    # fork server
    assert res.returncode == 1, res.stdout + res.stderr
    attempt = QueueView(tmp_path / "q").record("dead", "killer")["attempts"][-1]
    assert (attempt["outcome"], attempt["exit_code"]) == ("failed", 255), attempt
    assert attempt["error"] == "worker exited with status 255 during the job"
