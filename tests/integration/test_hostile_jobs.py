"""Python jobs that fight the worker they run in: the guards still hold and the pool goes on.

A ``python`` job runs inside its worker process, so it can do to that process what any code
can. These are the accidents (and carelessness) a job is capable of: leaving its worker's
process group, leaving a daemon behind, closing the worker's descriptors. Each must cost
that job its attempt, never another job's, and never the run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
from jobfns import QueueView, assert_pdf, cli_args, py_job, run_cli, stage, wait_for_pid


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
    assert_pdf(out / "next.pdf", "next")
    assert gone(int(pidfile.read_text()))


def test_a_cancel_reaches_a_job_that_moved_its_worker_out_of_its_group(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a running job that has moved its worker into another process group
    stage(tmp_path)
    pidfile = tmp_path / "worker.pid"
    manifest = write_manifest([py_job("escaper", "leave_group_and_hang", s=600,
                                      pidfile=str(pidfile))])
    queue, out = tmp_path / "q", tmp_path / "out"
    from jobfns import Runner

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


# -- a job that breaks its worker's descriptors --------------------------------------------


def test_a_job_that_closes_its_workers_descriptors_fails_alone(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that closes every descriptor of its worker but the socket to the runner
    # (and would write a good PDF), allowed two attempts, and a job after it
    stage(tmp_path)
    manifest = write_manifest([{**py_job("closer", "close_worker_fds"), "max_attempts": 2},
                               py_job("next", "write_pdf")])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When one worker at a time runs them
    result = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1",
                                                  "--backoff-base", "0"))

    # Then the run goes on (no I/O error of the queue): the closer fails each attempt,
    # saying why, and is dead-lettered; the next job completes in a fresh worker
    assert result.returncode == 1, result.stdout + result.stderr
    view = QueueView(queue)
    attempts = view.record("dead", "closer")["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed", "failed"], attempts
    assert all("file descriptor" in a["error"] for a in attempts), attempts
    assert view.ids("done") == {"next"}
    assert_pdf(out / "next.pdf", "next")
    assert not (out / "closer.pdf").exists()
