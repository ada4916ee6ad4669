"""QUEUE/tmp/ is swept of renderctl's own dead temporaries only: a read-only command never
deletes what someone else put there. Real files, a real `renderctl status` process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from jobfns import run_cli

from renderctl.store import Queue


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
