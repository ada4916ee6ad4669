"""`run` under scarce operating-system limits: said up front, or raised within what is allowed.

Audit FI: under `ulimit -n 32`, `run --workers 4` failed at a worker's start with "I/O error:
Too many open files" (exit 74, naming neither the limit nor a file), its claimed jobs left
for the next run's recovery.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobfns import RENDERCTL, QueueView, child_cgroup, py_job, run_in_cgroup, stage

from renderctl.errors import os_error_message


def run_limited(tmp_path: Path, soft: int, hard: int,
                *args: str) -> subprocess.CompletedProcess[str]:
    stage(tmp_path)
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"jobs": [py_job(f"j{i}", "write_pdf") for i in range(6)]}))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return subprocess.run([*RENDERCTL, "run", str(manifest), "--queue", str(tmp_path / "q"),
                           "--out", str(tmp_path / "out"), "--quiet", *args],
                          preexec_fn=limit, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_workers_the_hard_open_files_limit_cannot_carry_are_a_usage_error(
        tmp_path: Path) -> None:
    # When `run --workers 4` starts where at most 48 files may be open
    res = run_limited(tmp_path, 48, 48, "--workers", "4")

    # Then it exits 2 before enqueuing anything, naming the limit and what fits
    assert res.returncode == 2, res.stderr
    assert "64 open files" in res.stderr and "hard limit 48" in res.stderr
    assert "at most 2 worker(s)" in res.stderr, res.stderr
    assert QueueView(tmp_path / "q").all_ids() == set()


def test_a_low_soft_open_files_limit_is_raised_within_the_hard_one(tmp_path: Path) -> None:
    # When `run --workers 4` starts under a soft limit of 24, the hard one higher
    res = run_limited(tmp_path, 24, 4096, "--workers", "4")

    # Then the run raises its own soft limit and completes every job
    assert res.returncode == 0, res.stderr
    assert QueueView(tmp_path / "q").ids("done") == {f"j{i}" for i in range(6)}


def test_too_many_open_files_names_the_limit() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    msg = os_error_message(OSError(errno.EMFILE, "Too many open files", "q/pending/x.json"))
    assert msg.startswith("I/O error (q/pending/x.json): Too many open files")
    assert f"may have {soft} open at once" in msg and "ulimit -n" in msg


def _pids_root() -> Path | None:
    from renderctl import guards

    own = guards._own_cgroup_dir(True, "pids")
    return own if own is not None and os.access(own, os.W_OK) else None


@pytest.fixture
def pids_group() -> Iterator[Path]:
    """A v1 pids cgroup beside the test's own, for a runner to be started in."""
    root = _pids_root()
    if root is None:
        pytest.skip("needs a writable cgroup v1 pids hierarchy")
    with child_cgroup(root, "rctl-test-pids") as group:
        yield group


def run_in_pids(group: Path, tmp_path: Path, jobs: list[dict[str, Any]],
                *args: str) -> subprocess.CompletedProcess[str]:
    return run_in_cgroup(group, tmp_path, jobs, "--quiet", *args)


def test_a_command_that_cannot_be_forked_names_the_pids_limit(
        tmp_path: Path, pids_group: Path) -> None:
    # Given a pids limit that holds the runner, its fork server, its reaper and one worker,
    # and nothing more
    (pids_group / "pids.max").write_text("4")

    # When a command job is run there
    res = run_in_pids(pids_group, tmp_path,
                      [{"id": "c", "kind": "command", "argv": ["true", "{output}"],
                        "output": "c.bin", "max_attempts": 1}], "--workers", "1")

    # Then its attempt failed saying no process could be created, naming the limit (it was
    # renderctl's own traceback through subprocess.Popen)
    assert res.returncode == 1, res.stderr
    error = QueueView(tmp_path / "q").record("dead", "c")["attempts"][-1]["error"]
    assert error.startswith("could not start its command: no process could be created"), error
    assert f"cgroup {pids_group}: pids.current" in error and "pids.max 4" in error, error


def test_workers_that_cannot_be_forked_name_the_pids_limit_without_tracebacks(
        tmp_path: Path, pids_group: Path) -> None:
    # Given a pids limit that holds the runner, its fork server and its reaper only
    (pids_group / "pids.max").write_text("3")

    # When a run there cannot start its worker
    res = run_in_pids(pids_group, tmp_path, [py_job("j", "write_pdf")], "--workers", "1")

    # Then it halts (74), the job still pending and uncharged, saying which limit is
    # reached; no traceback of the fork server's failed forks reaches stderr
    assert res.returncode == 74, res.stderr
    assert f"no process could be created: cgroup {pids_group}" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    assert "the fork server could not fork a worker: [Errno 11]" in res.stderr, res.stderr
    assert QueueView(tmp_path / "q").ids("pending") == {"j"}


@pytest.mark.parametrize("state_file", ["old", "a character device"])
def test_jobs_of_a_dead_runner_of_another_container_here_are_recovered_at_once(
        tmp_path: Path, state_file: str) -> None:
    # Given a runner in another "container" of this machine (its own host name: a UTS
    # namespace; the same kernel) that died with a job running
    stage(tmp_path)
    (tmp_path / "m.json").write_text(json.dumps({"jobs": [py_job("j", "write_pdf")]}))
    q, out = str(tmp_path / "q"), str(tmp_path / "out")
    dead = subprocess.run(
        ["unshare", "--uts", "sh", "-c", 'hostname other-container && exec "$@"', "sh",
         *RENDERCTL, "run", str(tmp_path / "m.json"), "--queue", q, "--out", out,
         "--quiet"], env={**os.environ, "RENDERCTL_CRASH_AT": "start"},
        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert dead.returncode == -9, dead.stderr
    shown = json.loads(subprocess.run([*RENDERCTL, "show", "j", "--json", "--queue", q],
                                      capture_output=True, text=True, timeout=60).stdout)
    assert shown["lease"]["holder"]["host"] == "other-container", shown
    # (dead a while: its state file, which a live runner rewrites each second, is old; or
    # a job put a character device there, whose mtime is always new: it was read until
    # memory ran out, review FM)
    state = tmp_path / "q" / "runner.state.json"
    if state_file == "old":
        old = time.time() - 30
        os.utime(state, (old, old))
    else:
        state.unlink()
        os.mknod(state, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # (/dev/zero's)

    # When a runner here takes the queue (it holds the runner lock, which that runner,
    # alive, would hold)
    res = subprocess.run([*RENDERCTL, "run", "--queue", q, "--quiet"], capture_output=True,
                         text=True, timeout=30, cwd=tmp_path)

    # Then the job is returned at once, its attempt charged to a runner that ended (it
    # waited out the lease, a minute, as if on another machine: audit FK), and completes
    assert res.returncode == 0, res.stderr
    record = QueueView(tmp_path / "q").record("done", "j")
    first = record["attempts"][0]
    assert first["outcome"] == "crashed" and "other-container) ended" in first["error"], first


def test_a_runner_of_another_container_that_still_writes_the_state_file_is_not_taken_over(
        tmp_path: Path) -> None:
    # Given a job held by a runner of another "container" here (another host name, this
    # kernel), which to all signs still runs: the queue's state file, which only a live
    # runner writes, is rewritten each half second in its name (as where two FUSE mounts
    # of the queue let two runners past the lock)
    stage(tmp_path)
    (tmp_path / "m.json").write_text(json.dumps({"jobs": [py_job("j", "write_pdf")]}))
    q, out = str(tmp_path / "q"), str(tmp_path / "out")
    subprocess.run(
        ["unshare", "--uts", "sh", "-c", 'hostname other-container && exec "$@"', "sh",
         *RENDERCTL, "run", str(tmp_path / "m.json"), "--queue", q, "--out", out,
         "--quiet"], env={**os.environ, "RENDERCTL_CRASH_AT": "start"},
        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    shown = json.loads(subprocess.run([*RENDERCTL, "show", "j", "--json", "--queue", q],
                                      capture_output=True, text=True, timeout=60).stdout)
    holder_pid = shown["lease"]["holder"]["pid"]
    state = tmp_path / "q" / "runner.state.json"
    stop = threading.Event()

    def write_state() -> None:
        while not stop.is_set():
            state.write_text(json.dumps({"schema": 1, "pid": holder_pid}))
            stop.wait(0.5)

    writer = threading.Thread(target=write_state)
    writer.start()
    runner = subprocess.Popen([*RENDERCTL, "run", "--queue", q, "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              cwd=tmp_path, text=True)
    try:
        # When a runner here takes the queue (its recovery done), then for as long as that
        # goes on the job is left to its holder's lease, not returned at once
        assert runner.stdout is not None
        assert json.loads(runner.stdout.readline())["event"] == "runner_started"
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            assert QueueView(tmp_path / "q").ids("running") == {"j"}
            assert runner.poll() is None
            stop.wait(0.2)
    finally:
        stop.set()
        writer.join()
        runner.terminate()
        runner.communicate(timeout=60)
