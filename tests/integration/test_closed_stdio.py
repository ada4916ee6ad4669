"""A command started with stdin, stdout or stderr closed (`>&-`, `2>&-`, some cron and daemon
setups) works as with them on /dev/null. Real `sh` redirections, the script's entry point
(`python -m renderctl`), real descriptors read from /proc."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from jobfns import (
    LAUNCHER,
    QueueView,
    _env,
    assert_pdf,
    cli_args,
    held_job,
    py_job,
    stage,
    wait_for_pid,
)

CLOSE = {"stdin": "<&-", "stdout": ">&-", "stderr": "2>&-", "all three": "<&- >&- 2>&-"}


def closed(how: str, *args: str | os.PathLike[str]) -> list[str]:
    """``renderctl ARGS`` run by sh with the descriptors ``how`` names closed."""
    return ["sh", "-c", f'exec "$@" {CLOSE[how]}', "sh", *LAUNCHER, *map(str, args)]


@pytest.mark.parametrize("how", list(CLOSE))
def test_a_run_with_a_standard_descriptor_closed_runs_every_job(
        tmp_path: Path, write_manifest: Any, how: str) -> None:
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a python job and a command job
    manifest = write_manifest([
        py_job("py", "write_pdf"),
        {"id": "cmd", "kind": "command", "argv": ["sh", "-c", 'echo said; : > "$0"', "{output}"],
         "output": "cmd.bin"}])
    # When `renderctl run` starts with stdin, stdout, stderr or all three closed
    res = subprocess.run(closed(how, "run", manifest, *cli_args(queue, out)),
                         capture_output=True, text=True, timeout=120, env=_env(None))
    # Then it runs both, as it would with them on /dev/null (stdout closed: a traceback
    # after the submit, the jobs left pending; then, with only the runner's descriptor
    # fixed, its workers started without one and every job died)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert QueueView(queue).ids("done") == {"py", "cmd"}
    assert_pdf(out / "py.pdf", "py")
    # And `status` says so, with the same descriptors closed
    assert subprocess.run(closed(how, "status", "--queue", queue), env=_env(None),
                          timeout=60).returncode == 0


def test_a_runner_started_without_stderr_holds_dev_null_there_not_a_queue_file(
        tmp_path: Path, write_manifest: Any) -> None:
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a run started with stderr closed, running a job
    job, go = held_job(tmp_path, "held")
    proc = subprocess.Popen(closed("stderr", "run", *cli_args(queue, out, "--workers", "1"),
                                   write_manifest([job])),
                            stdout=subprocess.DEVNULL, env=_env(None))
    try:
        wait_for_pid(tmp_path / "held.pid")
        # Then descriptor 2 of the runner is /dev/null: the next file it opened used to take
        # that number (a queue record, the runner's lock), and whatever a library wrote to
        # "stderr" landed in it
        assert os.readlink(f"/proc/{proc.pid}/fd/2") == "/dev/null"
        go.touch()
        assert proc.wait(timeout=60) == 0
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert QueueView(queue).ids("done") == {"held"}
