"""QUEUE/tmp/ is swept of renderctl's own dead temporaries only: a read-only command never
deletes what someone else put there. Real files, a real `renderctl status` process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from jobfns import _env, run_cli, wait_until

from renderctl.store import TMP_GRACE_S, Queue


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_status_removes_only_renderctl_temporaries_of_dead_writers(tmp_path: Path) -> None:
    # Given a queue whose tmp/ holds what dead renderctl processes left (a submit's journal
    # and job temporaries, a finish's record, a holder file's atomic write, a runner's state
    # snapshot) and a runner's spare record file
    queue = tmp_path / "q"
    Queue(queue).close()
    tmp = queue / "tmp"
    dead = _dead_pid()
    ours = [f"{dead}.1.txn", f"{dead}.2.job", f"{dead}.7.finish", f"{dead}.state",
            f"{dead}.holder.{dead}-123.json.0a1b2c3d"]
    for name in ours:
        (tmp / name).write_bytes(b"partial")
    spare = f"free.{dead}.0badcafe.3"
    (tmp / spare).write_bytes(b"")
    # And things a person put there: files, one named like a pid, and a folder with content
    theirs = ["notes.txt", f"{dead}", f"{dead}.backup", "12.tar.gz"]
    for name in theirs:
        (tmp / name).write_text("mine")
    (tmp / "keep").mkdir()
    (tmp / "keep" / "data.txt").write_text("mine too")

    # When a read-only command opens the queue
    res = run_cli("status", "--queue", str(queue))

    # Then renderctl's dead temporaries are gone, its spare is kept, and nothing else is
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(os.listdir(tmp)) == sorted([*theirs, "keep", spare])
    assert (tmp / "keep" / "data.txt").read_text() == "mine too"


# A writer's step between a temporary's write and its rename (a one-job submit's record, a
# finish's, a cancel's), held there by SIGSTOP.
IN_FLIGHT = """
import os, signal, sys
from renderctl.fsutil import write_file
from renderctl.store import Queue
q = Queue(sys.argv[1])
tmp = q._tmp_name("job")
write_file(tmp, b"{}", fsync=False)
os.kill(os.getpid(), signal.SIGSTOP)
os.rename(tmp, q.path / "placed")
"""


def test_a_writer_in_another_pid_namespace_keeps_its_temporary_through_a_host_status(
        tmp_path: Path) -> None:
    # Given a writer in a pid namespace of its own (a container sharing the queue), under a
    # pid that no live process has out here, frozen between a temporary's write and rename
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a pid namespace")
    queue = tmp_path / "q"
    Queue(queue).close()
    pid = _dead_pid()
    # The shell forks the writer as the namespace's next pid: the one chosen.
    script = f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid && " \
        f"{sys.executable} -c '{IN_FLIGHT}' {queue}; exit $?"
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(None))
    try:
        def frozen() -> bool:
            if proc.poll() is not None:
                return True
            return any(p.status() == psutil.STATUS_STOPPED
                       for p in psutil.Process(proc.pid).children(recursive=True))

        wait_until(frozen, what="the writer to freeze")
        assert proc.poll() is None, proc.communicate()
        [written] = os.listdir(queue / "tmp")
        assert written.startswith(f"{pid}"), written

        # When a `status` on the host opens the queue (and sweeps tmp/)
        res = run_cli("status", "--queue", str(queue))
        assert res.returncode == 0, res.stdout + res.stderr

        # Then the writer's temporary is still there, and its rename succeeds
        assert os.listdir(queue / "tmp") == [written]
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            os.kill(p.pid, signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stdout + stderr
    assert (queue / "placed").read_bytes() == b"{}"


def test_a_foreign_temporary_is_swept_once_it_is_older_than_the_grace(tmp_path: Path) -> None:
    # Given temporaries named by writers on another host or in another pid namespace (a tag
    # not ours), of a pid dead here: one just written, one older than the grace period
    queue = tmp_path / "q"
    Queue(queue).close()
    tmp = queue / "tmp"
    dead = _dead_pid()
    fresh, old = f"{dead}-0badf00d.1.job", f"{dead}-0badf00d.2.job"
    for name in (fresh, old):
        (tmp / name).write_bytes(b"partial")
    stale = time.time() - TMP_GRACE_S - 60
    os.utime(tmp / old, (stale, stale))

    # When the queue is opened
    Queue(queue).close()

    # Then only the old one is gone: nothing here can tell whether the other's writer lives
    assert os.listdir(tmp) == [fresh]
