"""One runner per queue, even when QUEUE/runner.lock is removed or replaced while it runs.

runner.lock is a file a person can `rm` or `mv` over; the exclusion must not depend on it.
Real `renderctl run` processes, real files; nothing is mocked."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from jobfns import QueueView, Runner, cli_args, py_job, run_cli, stage, wait_for_pid

from renderctl.errors import ExitCode


def _tamper(queue: Path, how: str) -> None:
    lock = queue / "runner.lock"
    if how == "removed":
        os.unlink(lock)  # `rm QUEUE/runner.lock`
    else:
        # `mv newfile QUEUE/runner.lock`: a new inode under the old name
        new = queue / "newfile"
        new.write_text("not a lock\n")
        os.replace(new, lock)


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_second_runner_is_refused_after_runner_lock_is_tampered_with(
        tmp_path: Path, write_manifest: Any, how: str) -> None:
    # Given a runner in the middle of a job
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    pidfile = tmp_path / "job.pid"
    manifest = write_manifest([py_job("slow", "sleep_then_write", s=6, pidfile=str(pidfile))])
    first = Runner(manifest, *cli_args(queue, out, "--workers", "1"))
    try:
        job_pid = wait_for_pid(pidfile)

        # When runner.lock is removed or replaced by hand, and a second runner starts
        _tamper(queue, how)
        second = run_cli("run", *cli_args(queue, out, "--workers", "1"), timeout=30)

        # Then the second is turned away with 75, naming the first runner's pid
        assert second.returncode == ExitCode.TEMPFAIL, second.stdout + second.stderr
        assert f"pid {first.pid}" in second.stdout + second.stderr
        # And `status` still names the runner that holds the queue
        st = json.loads(run_cli("status", "--json", "--queue", str(queue)).stdout)
        assert st["runner"] is not None and st["runner"]["pid"] == first.pid, st
        # And the first runner's job was left alone: it finishes, once
        os.kill(job_pid, 0)
        assert first.wait(60) == ExitCode.OK, (first.lines, first.stderr())
    finally:
        first.close()
    assert QueueView(queue).states_of(["slow"]) == {"slow": ["done"]}


def test_a_reader_peeking_at_the_lock_does_not_turn_a_starting_runner_away(
        tmp_path: Path, write_manifest: Any) -> None:
    import fcntl
    import threading

    # Given a reader holding the queue's lock shared (as `status` does for a moment to ask
    # whether a runner is there), for half a second
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("a", "write_pdf")])
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
    fd = os.open(queue, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    release = threading.Timer(0.5, os.close, (fd,))
    release.start()

    # When a runner starts meanwhile (a cron run)
    res = run_cli("run", *cli_args(queue, out, "--workers", "1"))
    release.join()

    # Then it waited for the reader instead of exiting 75
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert QueueView(queue).states_of(["a"]) == {"a": ["done"]}


def test_the_lock_moves_with_the_queue_folder(tmp_path: Path) -> None:
    from renderctl.errors import QueueBusy
    from renderctl.store import Holder, Queue

    # Given a runner's lock held on a queue
    queue, moved = tmp_path / "q", tmp_path / "q-moved"
    q = Queue(queue)
    with q.runner_lock(Holder.current()):
        assert q.runner_lock_intact()

        # When the whole folder is renamed away (`mv QUEUE elsewhere`)
        os.rename(queue, moved)

        # Then a runner started on it where it is now is refused, naming the holder
        moved_q = Queue(moved, create=False)
        with pytest.raises(QueueBusy, match=f"pid {os.getpid()}"), \
                moved_q.runner_lock(Holder.current()):
            pass
        moved_q.close()
        # And a new queue made at the old path is another queue: the holder can tell that
        # its path no longer leads to the folder it locked
        fresh = Queue(queue)
        assert fresh.runner_info() is None
        assert not q.runner_lock_intact()
        fresh.close()
    q.close()


def test_a_runner_whose_queue_folder_is_moved_away_and_replaced_stops_with_74(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner in the middle of a job
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    pidfile = tmp_path / "job.pid"
    manifest = write_manifest([py_job("slow", "sleep_then_write", s=30, pidfile=str(pidfile))])
    first = Runner(manifest, *cli_args(queue, out, "--workers", "1"))
    try:
        wait_for_pid(pidfile)

        # When its queue folder is moved away and a new one made at its path (where a
        # second runner could start, and where the first one's paths now lead)
        queue.rename(tmp_path / "q.moved")
        queue.mkdir()

        # Then it stops with 74 within a second or two, saying why; the job stays in the
        # folder it was moved with, for that folder's next runner
        assert first.wait(10) == ExitCode.IO_ERROR, (first.lines, first.stderr())
        assert "no longer the queue folder this runner locked" in first.stderr()
    finally:
        first.close()
    assert QueueView(tmp_path / "q.moved").states_of(["slow"]) == {"slow": ["running"]}
