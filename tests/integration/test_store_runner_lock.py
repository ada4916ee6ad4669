"""One runner per queue, even when its lock files are removed or replaced while it runs,
and even against a runner that only the lock file can show (another host, an older version).

Two locks (renderctl/store.py, "the runner lock"): a flock on the queue folder, which no
`rm` or `mv` inside it can swap, and one on the regular file runner.lock, the one a runner
on another host sharing the queue over NFS can see (a flock on an NFS folder is local to
one host) and the one versions before the folder lock took. The holder's record is
runner.json. Real `renderctl run` processes, real files; nothing is mocked."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from jobfns import (
    QueueView,
    Runner,
    assert_pdf,
    cli_args,
    py_job,
    run_cli,
    stage,
    wait_for_pid,
    wait_until,
    waiting_for_a_lock,
)

from renderctl.errors import ExitCode


def _tamper(queue: Path, how: str) -> None:
    lock = queue / "runner.lock"
    if how == "removed":
        os.unlink(lock)  # `rm QUEUE/runner.lock`
    elif how == "record removed":
        # `rm QUEUE/runner.json`: the holder's pid then comes from the kernel (/proc/locks)
        os.unlink(queue / "runner.json")
    else:
        # `mv newfile QUEUE/runner.lock`: a new inode under the old name
        new = queue / "newfile"
        new.write_text("not a lock\n")
        os.replace(new, lock)


def runner_mid_job(tmp_path: Path, write_manifest: Any,
                   **fields: Any) -> tuple[Path, Path, Runner, int]:
    """A runner (one worker) running job `slow` (more job ``fields``), which runs until
    ``tmp_path/go`` exists: queue, output root, the runner, and the job's pid once it has
    started."""
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    pidfile = tmp_path / "job.pid"
    manifest = write_manifest([{**py_job("slow", "wait_for_go", pidfile=str(pidfile),
                                         go=str(tmp_path / "go")), **fields}])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1"))
    try:
        return queue, out, runner, wait_for_pid(pidfile)
    except BaseException:
        runner.close()
        raise


@pytest.mark.parametrize("how", ["removed", "replaced", "record removed"])
def test_a_second_runner_is_refused_after_runner_lock_is_tampered_with(
        tmp_path: Path, write_manifest: Any, how: str) -> None:
    # Given a runner in the middle of a job
    queue, out, first, job_pid = runner_mid_job(tmp_path, write_manifest)
    try:

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
        (tmp_path / "go").touch()
        assert first.wait(60) == ExitCode.OK, (first.lines, first.stderr())
    finally:
        first.close()
    assert QueueView(queue).states_of(["slow"]) == {"slow": ["done"]}


def _queue_with_a_job(tmp_path: Path, write_manifest: Any) -> tuple[Path, Path]:
    """A queue (and output root) with one quick job "a" submitted, no runner yet."""
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("a", "write_pdf")])
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
    return queue, out


# What a reader such as `status` holds shared for a moment to ask whether a runner is there:
# runner.lock and then the folder; only the folder while no runner has made runner.lock yet.
# A starting runner takes runner.lock and then the folder, so it waits at the first of them.
PEEKS = {"runner.lock and folder": ["runner.lock", "."], "folder (no runner.lock yet)": ["."]}


@pytest.mark.parametrize("peek", PEEKS)
def test_a_reader_peeking_at_the_lock_does_not_turn_a_starting_runner_away(
        tmp_path: Path, write_manifest: Any, peek: str) -> None:
    # Given a reader holding the queue's locks shared
    queue, out = _queue_with_a_job(tmp_path, write_manifest)
    held = PEEKS[peek]
    if "runner.lock" in held:
        (queue / "runner.lock").touch()  # as any earlier runner leaves it
    fds = [os.open(queue / name, os.O_RDONLY) for name in held]
    for fd in fds:
        fcntl.flock(fd, fcntl.LOCK_SH)

    # When a runner starts meanwhile (a cron run)
    runner = Runner(*cli_args(queue, out, "--workers", "1"))
    try:
        # Then it is seen blocked, waiting for the lock the reader holds (not gone with 75)
        wait_until(lambda: waiting_for_a_lock(runner.pid, queue / held[0])
                   or runner.proc.poll() is not None,
                   what="the runner to wait for the reader's lock")
        assert runner.proc.poll() is None, (runner.wait(), runner.lines, runner.stderr())

        # And once the reader lets go, it runs the queue
        for fd in fds:
            os.close(fd)
        assert runner.wait(60) == ExitCode.OK, (runner.lines, runner.stderr())
    finally:
        runner.close()
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
    queue, out, first, _ = runner_mid_job(tmp_path, write_manifest)
    try:

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
    moved = tmp_path / "q.moved"
    assert QueueView(moved).states_of(["slow"]) == {"slow": ["running"]}

    # And that folder's next runner runs it again uncharged: its attempt was released by a
    # stop, not crashed (charged `crashed`, a job of max_attempts = 1 was dead-lettered for
    # what its operator did; audit DY)
    (tmp_path / "go").touch()
    res = run_cli("run", "--queue", moved)
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    attempts = QueueView(moved).record("done", "slow")["attempts"]
    assert [a["outcome"] for a in attempts] == ["released", "completed"], attempts
    assert "queue folder was moved or replaced" in attempts[0]["error"]
    assert not list((moved / "control").glob("started.*"))  # (its evidence went after use)


def _runs_again_uncharged(moved: Path, out: Path, job_id: str) -> None:
    """The moved queue's next runner runs ``job_id`` again and completes it: its first
    attempt was released by the stop, not charged (`crashed`, a job of max_attempts = 1
    went to dead/ for what its operator did)."""
    res = run_cli("run", "--queue", moved, "--out", out, timeout=60)
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    attempts = QueueView(moved).record("done", job_id)["attempts"]
    assert [a["outcome"] for a in attempts] == ["released", "completed"], attempts
    assert_pdf(out / f"{job_id}.pdf", job_id)


@pytest.mark.parametrize("replaced", [False, True])
def test_a_queue_moved_as_a_job_ends_has_that_job_released_not_crashed(
        tmp_path: Path, write_manifest: Any, replaced: bool) -> None:
    # Given a job of one attempt that moves the queue folder away as it ends (and makes a
    # new one at its path), so that the runner meets the move while it commits the job's
    # result: its lease gone from the path, as if another runner had taken the job over
    stage(tmp_path)
    queue, out, moved = tmp_path / "q", tmp_path / "out", tmp_path / "q.moved"
    manifest = write_manifest([{**py_job("mover", "move_queue_first_time", queue=str(queue),
                                         to=str(moved), replace=replaced),
                                "max_attempts": 1}])

    # When it runs, and the moved folder's next runner runs what it holds
    first = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"), timeout=60)
    assert first.returncode == ExitCode.IO_ERROR, first.stdout + first.stderr

    # Then the job completes on its second attempt, the first released by the stop (review
    # EF; and with a folder in its place, it was fenced and its output withdrawn first:
    # review EI)
    _runs_again_uncharged(moved, out, "mover")


def test_a_queue_moved_and_replaced_during_a_stop_has_its_jobs_released(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner draining on SIGTERM, its one job of one attempt still running
    queue, out, runner, _ = runner_mid_job(tmp_path, write_manifest, max_attempts=1)
    try:
        runner.proc.send_signal(signal.SIGTERM)
        runner.until(lambda line: line.startswith("stopping"))

        # When its queue folder is moved away and a new one made at its path, and the job
        # then ends
        queue.rename(tmp_path / "q.moved")
        queue.mkdir()
        (tmp_path / "go").touch()

        # Then the runner stops with 74, saying why (it took the lease gone from the path
        # for a takeover: the job fenced, its output withdrawn, no release written: review
        # EI)
        assert runner.wait(30) == ExitCode.IO_ERROR, (runner.lines, runner.stderr())
        assert "no longer the queue folder this runner locked" in runner.stderr()
    finally:
        runner.close()

    # And the moved folder's next runner runs it again, uncharged
    _runs_again_uncharged(tmp_path / "q.moved", out, "slow")


def test_a_queue_whose_parent_becomes_a_file_has_its_job_released_not_crashed(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner of a queue in folder p, running a job of one attempt
    stage(tmp_path)
    parent, out, go, pidfile = (tmp_path / "p", tmp_path / "out", tmp_path / "go",
                                tmp_path / "job.pid")
    manifest = write_manifest([{**py_job("slow", "wait_for_go", pidfile=str(pidfile),
                                         go=str(go)), "max_attempts": 1}])
    runner = Runner(manifest, *cli_args(parent / "q", out, "--workers", "1"))
    try:
        wait_for_pid(pidfile)

        # When p is moved away and a file put at its name (the queue's path now fails with
        # ENOTDIR, not ENOENT), and the job ends
        parent.rename(tmp_path / "p.moved")
        parent.write_text("not a folder")
        go.touch()

        # Then the runner stops with 74
        assert runner.wait(30) == ExitCode.IO_ERROR, (runner.lines, runner.stderr())
    finally:
        runner.close()

    # And the moved queue's next runner runs the job again, uncharged (only ENOENT counted
    # as the folder moved: review EK)
    _runs_again_uncharged(tmp_path / "p.moved" / "q", out, "slow")


def _exchange(a: Path, b: Path) -> None:
    """Swap two names at once (renameat2 RENAME_EXCHANGE): every path through either keeps
    leading somewhere throughout."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


def test_a_queue_whose_real_path_changes_under_its_runner_still_publishes(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner of a queue reached through a symlink (`current` -> data-v1), running a
    # job of one attempt
    stage(tmp_path)
    (tmp_path / "data-v1").mkdir()
    current = tmp_path / "current"
    current.symlink_to("data-v1")
    go, pidfile = tmp_path / "go", tmp_path / "job.pid"
    manifest = write_manifest([{**py_job("slow", "wait_for_go", pidfile=str(pidfile),
                                         go=str(go)), "max_attempts": 1}])
    runner = Runner(manifest, *cli_args(current / "q", current / "out", "--workers", "1"))
    try:
        wait_for_pid(pidfile)

        # When the folder takes the symlink's place (the same folder under the path the
        # runner was given; its real path at the start leads nowhere now), and the job ends
        _exchange(current, tmp_path / "data-v1")
        (tmp_path / "data-v1").unlink()
        go.touch()

        # Then the job is published and done: the old real path was taken for its output's
        # absence, and every job finishing after the change was failed (review EF)
        assert runner.wait(60) == ExitCode.OK, (runner.lines, runner.stderr())
    finally:
        runner.close()
    attempts = QueueView(current / "q").record("done", "slow")["attempts"]
    assert [a["outcome"] for a in attempts] == ["completed"], attempts
    assert_pdf(current / "out" / "slow.pdf", "slow")


# A runner holding runner.lock and not the queue folder, as this queue sees it: one of a
# version before the folder lock (it flocked runner.lock and kept its record inside), or one
# on another host sharing the queue over NFS (its folder lock is local to its host; its lock
# on runner.lock reaches the server), whose record is runner.json. It prints its record.
HOLDER = r"""
import fcntl, json, os, sys, time
from renderctl.store import Holder
lock, record, host = sys.argv[1:4]
fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
info = {**Holder.current().to_json(), "started_at": time.time()}
info["host"] = host or info["host"]
data = json.dumps(info).encode()
if record == lock:
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
else:
    with open(record + ".tmp", "wb") as fh:
        fh.write(data)
    os.replace(record + ".tmp", record)
print(json.dumps(info), flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("holder", ["older version", "another host"])
def test_a_runner_holding_only_the_lock_file_turns_a_new_runner_away(
        tmp_path: Path, write_manifest: Any, holder: str) -> None:
    # Given a queue with a job, and a runner that holds runner.lock but not the folder
    queue, out = _queue_with_a_job(tmp_path, write_manifest)
    lock = queue / "runner.lock"
    record, host = ((lock, "") if holder == "older version"
                    else (queue / "runner.json", "build-2.example"))
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(record), host],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None
        info = json.loads(other.stdout.readline())

        # When a new runner starts
        res = run_cli("run", *cli_args(queue, out, "--workers", "1"), timeout=30)

        # Then it is turned away with 75, naming the holder's pid
        assert res.returncode == ExitCode.TEMPFAIL, res.stdout + res.stderr
        assert f"pid {other.pid}" in res.stdout + res.stderr
        # And `status` shows that runner, from its own record
        st = json.loads(run_cli("status", "--json", "--queue", str(queue)).stdout)
        assert st["runner"] is not None, st
        assert (st["runner"]["pid"], st["runner"]["host"], st["runner"]["started_at"]) == (
            other.pid, info["host"], info["started_at"]), st
    finally:
        assert other.stdin is not None
        other.stdin.close()
        other.wait(10)
        assert other.stdout is not None
        other.stdout.close()
    # And the job was left for that runner
    assert QueueView(queue).states_of(["a"]) == {"a": ["pending"]}


def test_an_older_version_starting_beside_a_runner_is_refused(tmp_path: Path) -> None:
    from renderctl.store import Holder, Queue

    # Given a runner's lock held on a queue
    q = Queue(tmp_path / "q")
    with q.runner_lock(Holder.current()):
        # When a runner of a version before the folder lock starts: it flocks runner.lock
        fd = os.open(q.path / "runner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # Then it finds it held
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    q.close()


def test_a_runner_that_gave_up_waiting_leaves_the_lock_free(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from renderctl import store
    from renderctl.errors import QueueBusy
    from renderctl.store import Holder, Queue

    # Given a reader that holds the queue folder shared for longer than a runner waits
    monkeypatch.setattr(store, "LOCK_PATIENCE_S", 0.2)
    q = Queue(tmp_path / "q")
    reader = os.open(q.path, os.O_RDONLY)
    fcntl.flock(reader, fcntl.LOCK_SH)

    # When a runner gives up waiting for it
    with pytest.raises(QueueBusy), q.runner_lock(Holder.current()):
        pass
    waiting = [t for t in threading.enumerate() if t.name == store.LOCK_WAITER]
    assert len(waiting) == 1, waiting  # blocked in flock still: the reader holds on

    # Then, once the reader lets go, the wait it gave up on ends (its thread, blocked in
    # flock, takes the lock and lets go of it at once), and leaves the queue free
    os.close(reader)
    for thread in waiting:
        thread.join(20)
        assert not thread.is_alive()
    with q.try_runner_lock() as free:
        assert free
    with q.runner_lock(Holder.current()):
        assert q.runner_info() is not None
    q.close()



def test_a_submit_that_may_not_signal_the_runner_still_reports_its_jobs_accepted(
        tmp_path: Path, write_manifest: Any) -> None:
    import shutil

    from jobfns import RENDERCTL

    from renderctl import proctree
    from renderctl.store import Holder, Queue

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv: a runner of another user, a submitter without "
                    "CAP_KILL")
    # Given a queue whose live runner is a process of another user (a service account; the
    # web tier that submits may write the queue, but not signal that process)
    queue, out = tmp_path / "q", tmp_path / "out"
    Queue(queue)
    other = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              "sleep", "60"])
    try:
        wait_until(lambda: os.stat(f"/proc/{other.pid}").st_uid == 65534,
                   what="the other user's process")
        (queue / "runner.json").write_text(json.dumps({
            **Holder.current().to_json(), "pid": other.pid,
            "start_time": proctree.process_start_time(other.pid)}))
        fd = os.open(queue / "runner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for it: the record above names it

            # When a submitter without the right to signal it enqueues a job
            manifest = write_manifest([py_job("w1", "write_pdf")])
            res = subprocess.run(["setpriv", "--bounding-set=-kill", "--", *RENDERCTL,
                                  "submit", str(manifest), *cli_args(queue, out)],
                                 capture_output=True, text=True, timeout=60)
        finally:
            os.close(fd)
    finally:
        other.kill()
        other.wait()

    # Then it reports the job accepted (it is: the runner finds it at its next poll), not
    # an I/O error that would have a script submit it again
    assert res.returncode == 0, res
    assert "accepted 1 job" in res.stdout, res
    assert QueueView(queue).states_of(["w1"]) == {"w1": ["pending"]}


@pytest.mark.parametrize("same_process", [True, False])
def test_only_the_process_the_runner_record_names_is_woken(
        tmp_path: Path, same_process: bool) -> None:
    import signal

    from renderctl import proctree
    from renderctl.store import Holder, Queue

    # Given a queue whose lock is held for a process named in runner.json: by its pid and
    # start time, or by its pid and an earlier start time (the runner that had that pid is
    # gone, and the number went to another process)
    queue = tmp_path / "q"
    q = Queue(queue)
    other = subprocess.Popen(["sleep", "60"])
    try:
        start = proctree.process_start_time(other.pid)
        assert start is not None
        (queue / "runner.json").write_text(json.dumps({
            **Holder.current().to_json(), "pid": other.pid,
            "start_time": start if same_process else start - 1}))
        fd = os.open(queue / "runner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)

            # When something wakes the runner (a submit does, with SIGUSR1)
            sent = q.signal_runner(signal.SIGTERM)
        finally:
            os.close(fd)

        # Then the signal reached that process only if it is the one the record names
        assert sent is same_process
        assert (other.wait(10) == -signal.SIGTERM) if same_process else other.poll() is None
    finally:
        other.kill()
        other.wait()
        q.close()
