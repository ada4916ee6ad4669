"""A worker that cannot set its job's memory ceiling: no traceback, and never the job without it.

Before each job a worker writes the job's ceiling into its slot's cgroup files (or, for
the same ceiling as the last job's, resets the peak counters). A write that failed (EIO
from cgroupfs, the cgroup gone) escaped as a traceback and killed the worker; the runner
replaced it, worker after worker, for good (1,208 in 90 s under strace's fault injection).
Now the worker tries again after a pause; if the fault passes the job runs (under its
ceiling) and the run goes on, if it stays the worker is Broken: the run stops with 74,
naming the cgroup file and the error, and charges nothing.

The faults are real, not mocks:

- A worker driven directly, whose slot is a folder laid out as a cgroup v1 slot with one of
  its files a symlink to /dev/full (every write: ENOSPC). Any user.
- A real run (root, cgroup v1): its worker is frozen after its first job (RENDERCTL_STOP_AT
  =worker:checked) and its slot's cgroup renamed (v1 allows it; the worker stays in it,
  charged and limited as before), so that the next job's ceiling, written by path, is
  refused (ENOENT). Renamed back once the worker waits to try again, the fault was
  one-off; left, it stays.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jobfns import (
    QueueView,
    Runner,
    _pdf,
    cgroup_v1_writable,
    cli_args,
    held_job,
    py_job,
    run_cli,
    stage,
    stopped,
    wait_for_pid,
    wait_until,
)

from renderctl import proctree
from renderctl.errors import ExitCode
from renderctl.messages import Broken, Ready, RunJob, Stop
from renderctl.worker import WorkerConfig, worker_main

MB = 1024 * 1024
CEILING_ERROR = "cannot set the job's memory ceiling"

needs_cgroup_v1 = pytest.mark.skipif(not cgroup_v1_writable(),
                                     reason="cgroup v1 memory controller not writable")


# -- a worker driven directly --------------------------------------------------------------


@pytest.mark.parametrize("broken", ["memory.limit_in_bytes", "memory.max_usage_in_bytes"],
                         ids=["the ceiling", "the peak counter"])
def test_a_worker_whose_slot_refuses_every_write_says_so_once_and_starts_nothing(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], broken: str) -> None:
    # Given a worker whose slot is laid out as a cgroup v1 slot, one of the files it writes
    # before each job being /dev/full (every write: ENOSPC)
    slot = tmp_path / "slot"
    slot.mkdir()
    for name, text in (("memory.limit_in_bytes", "9223372036854771712\n"),
                       ("memory.max_usage_in_bytes", "0\n"), ("memory.failcnt", "0\n"),
                       ("memory.usage_in_bytes", "0\n"), ("memory.stat", "")):
        if name == broken:
            (slot / name).symlink_to("/dev/full")
        else:
            (slot / name).write_text(text)
    started_log, marker = tmp_path / "started.log", tmp_path / "ran"
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    config = WorkerConfig(slot_path=str(slot), started_log=str(started_log),
                          work_root=str(tmp_path))
    proc = ctx.Process(target=worker_main, args=(child, config))
    proc.start()
    child.close()
    try:
        assert isinstance(parent.recv(), Ready)

        # When it is given a job
        stage(tmp_path / "jobs")
        spec = {"id": "a", "kind": "python", "callable": "jobfns:write_one_byte",
                "pythonpath": str(tmp_path / "jobs"), "inputs": [], "params": {}}
        parent.send((RunJob("a", 1, "t-1", spec, str(marker), "file", 200 * MB), Stop()))

        # Then (after trying again) it says why it cannot go on, on one line naming the
        # file, and exits 74 without starting the job (not even in its started log: the
        # runner's recovery charges nothing) and without a traceback
        assert parent.poll(30), "the worker said nothing"
        msg = parent.recv()
        assert isinstance(msg, Broken), msg
        assert msg.error == (f"{CEILING_ERROR}: I/O error ({slot}/{broken}): "
                             "No space left on device")
        proc.join(timeout=10)
        assert proc.exitcode == ExitCode.IO_ERROR
        assert not marker.exists()
        assert started_log.read_text() == ""
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert "Traceback" not in capfd.readouterr().err


# -- a real run ----------------------------------------------------------------------------


def two_jobs(tmp_path: Path, write_manifest: Any) -> Path:
    """A manifest of two jobs of different ceilings (so that the second one's is written,
    not just its peak counters reset), of one attempt each (any attempt charged would
    dead-letter them). The first is a command: a python job's worker checks, after the job,
    that it is still in its slot's cgroup, which a renamed slot would fail."""
    folder = stage(tmp_path / "jobs")
    _pdf(folder / "in.pdf", "first")
    return write_manifest([
        {"id": "first", "kind": "command", "argv": ["cp", "{input}", "{output}"],
         "input": "in.pdf", "output": "first.pdf", "memory_mb": 200},
        {**py_job("second", "write_pdf"), "memory_mb": 300},
    ], defaults={"max_attempts": 1}, folder=folder)


def memory_cgroup_dir(pid: int) -> Path:
    """The folder of the cgroup v1 memory group ``pid`` is in (a worker's: its slot)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, fs = left.split(), right.split()
        if fs[0] == "cgroup" and "memory" in fs[2].split(","):
            mount_point, root = Path(fields[4]), fields[3]
            break
    else:
        raise AssertionError("no cgroup v1 memory hierarchy is mounted")
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return mount_point / os.path.relpath(path, root)
    raise AssertionError(f"process {pid} is in no memory cgroup")


def stopped_worker(runner: Runner) -> tuple[int, Path]:
    """The pid of the run's worker, once it has stopped after its first job, and its slot."""
    started = runner.until(lambda line: '"started"' in line)
    worker = int(json.loads(started)["worker"])
    wait_until(lambda: stopped(worker), timeout_s=30, what="the worker to stop")
    slot = memory_cgroup_dir(worker)
    assert slot.parent.name == f"renderctl-{runner.pid}", slot
    return worker, slot


def in_syscall(pid: int) -> str:
    """The number of the system call ``pid`` waits in, or "" (running, or in none)."""
    try:
        nr = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return ""
    return nr if nr.isdigit() else ""


def sleep_syscall() -> str:
    """What ``in_syscall`` says of a Python process in ``time.sleep`` (clock_nanosleep's
    number, which differs by architecture)."""
    if not Path(f"/proc/{os.getpid()}/syscall").exists():
        pytest.skip("needs /proc/PID/syscall to see a worker wait to try again")
    proc = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); "
                             "time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        seen: list[str] = []

        def settled() -> str:
            seen.append(in_syscall(proc.pid))
            return seen[-1] if seen[-3:] == [seen[-1]] * 3 else ""

        return wait_until(settled, what="a sleeping process to show its system call")
    finally:
        proc.kill()
        proc.wait()


def remove_cgroup(path: Path) -> None:
    """Teardown: a slot left renamed by a runner that did not end well (it removes its
    slots as it ends; one renamed is found there too)."""
    if not path.is_dir():
        return
    with contextlib.suppress(OSError):
        for pid in (path / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(OSError):
        wait_until(lambda: not (path / "cgroup.procs").read_text().split(), timeout_s=5)
        path.rmdir()


def attempts(view: QueueView, state: str, job_id: str) -> list[str]:
    return [a["outcome"] for a in view.record(state, job_id)["attempts"]]


@needs_cgroup_v1
def test_a_ceiling_write_that_fails_once_costs_a_moment_not_a_traceback_nor_the_job(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a run of two jobs in one worker, frozen after the first (worker:checked)
    sleeping = sleep_syscall()
    manifest = two_jobs(tmp_path, write_manifest)
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--json"),
                    env={"RENDERCTL_STOP_AT": "worker:checked",
                         # Pauses wide enough to be caught in on a loaded machine.
                         "RENDERCTL_TEST_LIMIT_RETRY_S": "2"})
    away = None
    try:
        worker, slot = stopped_worker(runner)

        # When the second job's ceiling cannot be written at first (the slot's cgroup is
        # not at its path), and can be once the worker waits to try again
        away = slot.with_name(f"{slot.name}.away")
        slot.rename(away)
        try:
            os.kill(worker, signal.SIGCONT)

            def waiting() -> bool:
                if not proctree.pid_alive(worker):
                    raise AssertionError(f"the worker died: {runner.lines}")
                return in_syscall(worker) == sleeping

            wait_until(waiting, interval_s=0.001, what="the worker to wait to try again")
        finally:
            away.rename(slot)
        code = runner.wait()
        stderr = runner.stderr()
    finally:
        runner.close()
        if away is not None:
            remove_cgroup(away)

    # Then the run ends 0 with no traceback: both jobs completed at their first attempt,
    # the second under its ceiling
    assert code == ExitCode.OK, (runner.lines, stderr)
    assert "Traceback" not in stderr + "".join(runner.lines), stderr
    view = QueueView(queue)
    assert view.states_of({"first", "second"}) == {"first": ["done"], "second": ["done"]}
    assert attempts(view, "done", "first") == attempts(view, "done", "second") == ["completed"]


@needs_cgroup_v1
def test_a_ceiling_that_cannot_be_set_stops_the_run_with_74_naming_the_file_charging_nothing(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a run of two jobs in one worker, frozen after the first (worker:checked)
    manifest = two_jobs(tmp_path, write_manifest)
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--json"),
                    env={"RENDERCTL_STOP_AT": "worker:checked"})
    away = None
    try:
        worker, slot = stopped_worker(runner)

        # When the second job's ceiling can never be written (the slot's cgroup is not at
        # its path, for good)
        away = slot.with_name(f"{slot.name}.away")
        slot.rename(away)
        os.kill(worker, signal.SIGCONT)
        code = runner.wait()
        stderr = runner.stderr()
    finally:
        runner.close()
        if away is not None:
            remove_cgroup(away)

    # Then the run stops with 74, saying on one line which cgroup file could not be
    # written and why, with no traceback (and no worker replaced over and over)
    assert code == ExitCode.IO_ERROR, (runner.lines, stderr)
    assert "Traceback" not in stderr + "".join(runner.lines), stderr
    said = [line for line in stderr.splitlines() if CEILING_ERROR in line]
    assert len(said) == 1, stderr
    assert f"({slot}/memory.limit_in_bytes): No such file or directory" in said[0], said
    # and the first job's result, which the worker held while it tried, was recorded; the
    # second job never started: it is still in the queue, charged nothing
    view = QueueView(queue)
    assert attempts(view, "done", "first") == ["completed"]
    [where] = view.states_of({"second"})["second"]
    assert where in ("pending", "running") and attempts(view, where, "second") == []

    # When the queue is run again (its runner makes fresh slots)
    again = run_cli("run", *cli_args(queue, out, "--workers", "1"))

    # Then the second job completes at its first attempt, and the first is not run again
    assert again.returncode == ExitCode.OK, again.stdout + again.stderr
    assert view.states_of({"first", "second"}) == {"first": ["done"], "second": ["done"]}
    assert attempts(view, "done", "first") == attempts(view, "done", "second") == ["completed"]
    assert (out / "first.pdf").exists() and (out / "second.pdf").exists()


def started_on(runner: Runner, job_id: str) -> int:
    """The pid of the worker the run's "started" event gives for ``job_id``."""

    def started(line: str) -> bool:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            return bool(event.get("event") == "started" and event.get("job") == job_id)
        return False

    return int(json.loads(runner.until(started))["worker"])


@needs_cgroup_v1
def test_a_broken_worker_halts_the_run_and_lets_the_other_workers_job_finish_uncharged(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a run of three jobs in two workers, frozen after their first job each
    # (worker:checked): "first" (a command) in one, then "long" in the other, which holds
    # until the test says go, and "second" (another ceiling), which can only go to the
    # first one's worker once that one is let go; one attempt each
    folder = stage(tmp_path / "jobs")
    _pdf(folder / "in.pdf", "first")
    long_job, go = held_job(folder, "long", memory_mb=200)
    manifest = write_manifest([
        {"id": "first", "kind": "command", "argv": ["cp", "{input}", "{output}"],
         "input": "in.pdf", "output": "first.pdf", "memory_mb": 200},
        long_job,
        {**py_job("second", "write_pdf"), "memory_mb": 300},
    ], defaults={"max_attempts": 1}, folder=folder)
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "2", "--json"),
                    env={"RENDERCTL_STOP_AT": "worker:checked"})
    away = None
    other = None
    try:
        broken = started_on(runner, "first")
        other = started_on(runner, "long")
        assert other != broken, runner.lines
        held = wait_for_pid(folder / "long.pid", what="the long job to start")
        wait_until(lambda: stopped(broken), timeout_s=30, what="the first job's worker to stop")
        slot = memory_cgroup_dir(broken)
        assert slot.parent.name == f"renderctl-{runner.pid}", slot

        # When, while "long" runs in the other worker, the first one's next job's ceiling
        # can never be written (its slot's cgroup is not at its path, for good): that
        # worker is Broken
        away = slot.with_name(f"{slot.name}.away")
        slot.rename(away)
        os.kill(broken, signal.SIGCONT)

        # Then the run halts (no new job starts) and does not end: the other worker's job
        # runs on, not killed
        runner.until(lambda line: '"halted"' in line, timeout_s=30)
        assert proctree.pid_alive(held), "the other worker's job was killed"
        assert not (out / "long.pdf").exists()

        # When that job ends (its worker, frozen after it, let go)
        go.touch()
        wait_until(lambda: stopped(other), timeout_s=30, what="the long job's worker to stop")
        os.kill(other, signal.SIGCONT)
        code = runner.wait()
        stderr = runner.stderr()
    finally:
        go.touch()
        runner.close()
        if other is not None and proctree.pid_alive(other):
            with contextlib.suppress(ProcessLookupError):
                os.kill(other, signal.SIGCONT)  # a run that did not end well: let it go
        if away is not None:
            remove_cgroup(away)

    # Then the run ends 74, saying (its one line on stderr) which cgroup file could not be
    # written and why, with no traceback
    assert code == ExitCode.IO_ERROR, (runner.lines, stderr)
    assert "Traceback" not in stderr + "".join(runner.lines), stderr
    [said] = stderr.splitlines()
    assert CEILING_ERROR in said, stderr
    assert f"({slot}/memory.limit_in_bytes): No such file or directory" in said, said
    # and the other worker's job completed at its one attempt: no crashed attempt, no
    # second one; the first job completed; the second never started, charged nothing
    view = QueueView(queue)
    assert view.states_of({"first", "long"}) == {"first": ["done"], "long": ["done"]}
    assert attempts(view, "done", "long") == attempts(view, "done", "first") == ["completed"]
    assert (out / "long.pdf").exists()
    [where] = view.states_of({"second"})["second"]
    assert where in ("pending", "running") and attempts(view, where, "second") == []

    # When the queue is run again (its runner makes fresh slots)
    again = run_cli("run", *cli_args(queue, out, "--workers", "2"))

    # Then the second job completes at its first attempt, and neither other job runs again
    assert again.returncode == ExitCode.OK, again.stdout + again.stderr
    assert "Traceback" not in again.stdout + again.stderr, again.stderr
    assert view.states_of({"first", "long", "second"}) == {
        "first": ["done"], "long": ["done"], "second": ["done"]}
    assert attempts(view, "done", "first") == attempts(view, "done", "long") \
        == attempts(view, "done", "second") == ["completed"]
    assert (out / "second.pdf").exists()
