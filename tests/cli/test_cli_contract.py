"""What the command line promises around its edges: all-or-none commands, JSON on every
outcome of a --json command, honest exit codes, one line per event."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from clihelp import RENDERCTL, cli, env, job, poll, write_jobs


class BackgroundRunner:
    """A `renderctl run --follow` holding ``queue``, busy with one long job (``long``)."""

    def __init__(self, folder: Path, queue: Path, out: Path) -> None:
        manifest = write_jobs(folder / "bg", [job("long", "sleep", params={"s": "60"})])
        self.proc = subprocess.Popen(
            [*RENDERCTL, "run", str(manifest), "--queue", str(queue), "--out", str(out),
             "--workers", "1", "--follow", "--json"],
            cwd=folder, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.queue = queue
        poll(lambda: (queue / "running" / "long.json").exists(), timeout_s=30,
             what="the background runner to start its job")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: released, then exit 143
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()


@pytest.fixture
def busy_queue(tmp_path: Path) -> Iterator[BackgroundRunner]:
    bg = BackgroundRunner(tmp_path, tmp_path / "q", tmp_path / "out")
    try:
        yield bg
    finally:
        bg.close()


def state_of(queue: Path, job_id: str, cwd: Path) -> str:
    res = cli("show", job_id, "--queue", queue, "--json", cwd=cwd)
    assert res.returncode == 0, res.stderr
    return str(json.loads(res.stdout)["state"])


# -- cancel: all or none ---------------------------------------------------------------------


def test_cancel_with_an_unknown_id_cancels_nothing(tmp_path: Path) -> None:
    # Given two pending jobs
    manifest = write_jobs(tmp_path / "m", [job("a", "write"), job("b", "write")])
    q = tmp_path / "q"
    assert cli("submit", manifest, "--queue", q, cwd=tmp_path).returncode == 0

    # When one command cancels one of them and an id that is nowhere
    res = cli("cancel", "a", "nope", "--queue", q, cwd=tmp_path)

    # Then it refuses whole: exit 2 naming the missing id, and `a` is still pending
    assert res.returncode == 2, res.stderr
    assert "nope" in res.stderr and "nothing was cancelled" in res.stderr
    assert res.stdout == ""
    assert state_of(q, "a", tmp_path) == "pending"

    # And with --json, stdout says which ids were not found (and only those)
    as_json = cli("cancel", "a", "nope", "--json", "--queue", q, cwd=tmp_path)
    assert as_json.returncode == 2
    assert json.loads(as_json.stdout) == {"nope": "not found"}
    assert state_of(q, "a", tmp_path) == "pending"


def test_cancel_counts_ids_in_every_state_as_found(tmp_path: Path) -> None:
    # Given a job already cancelled (terminal) and one pending
    manifest = write_jobs(tmp_path / "m", [job("a", "write"), job("b", "write")])
    q = tmp_path / "q"
    assert cli("submit", manifest, "--queue", q, cwd=tmp_path).returncode == 0
    assert cli("cancel", "a", "--queue", q, cwd=tmp_path).returncode == 0

    # When both are cancelled in one command
    res = cli("cancel", "a", "b", "--json", "--queue", q, cwd=tmp_path)

    # Then the terminal one is reported as such and the pending one is cancelled: exit 0
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"a": "already cancelled", "b": "cancelled"}


def test_cancel_of_a_running_job_is_a_request(tmp_path: Path,
                                              busy_queue: BackgroundRunner) -> None:
    # Given a runner busy with `long`
    # When it is cancelled
    res = cli("cancel", "long", "--json", "--queue", busy_queue.queue, cwd=tmp_path)

    # Then the runner is asked to kill it, and it ends cancelled
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"long": "cancel requested"}
    poll(lambda: (busy_queue.queue / "cancelled" / "long.json").exists(), timeout_s=20,
         what="the runner to cancel the running job")
