"""The wall clock steps (an NTP correction, a VM resumed, `date -s`) while a runner works.

The step is made inside renderctl's processes only: a sitecustomize on PYTHONPATH adds the
number of seconds in a file to time.time()/time.time_ns(), read at every call, so a test
moves the clock of the runner and its workers at a moment it chooses. CLOCK_MONOTONIC is
left alone, as a real step leaves it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jobfns import (
    QueueView,
    Runner,
    cli_args,
    json_lines,
    py_job,
    run_cli,
    stage,
    term_whole_service,
    wait_for_pid,
)

from renderctl.errors import ExitCode

SHIM = '''
import os, time
_file = os.environ.get("RENDERCTL_TEST_WALL_OFFSET_FILE")
if _file:
    _time, _time_ns = time.time, time.time_ns

    def _offset():
        try:
            with open(_file) as fh:
                return float(fh.read().strip() or 0)
        except (OSError, ValueError):
            return 0.0

    time.time = lambda: _time() + _offset()
    time.time_ns = lambda: _time_ns() + int(_offset() * 1e9)
'''


def _stepped_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment that puts renderctl's processes on a clock the test steps, and the
    file that says by how much (seconds, 0 at first)."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    offset = tmp_path / "wall-offset"
    offset.write_text("0")
    path = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "RENDERCTL_TEST_WALL_OFFSET_FILE": str(offset)}, offset


def test_a_retry_waiting_in_a_live_runner_is_not_held_by_a_step_back(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a run whose one job fails its first attempt and is to be retried in ~1 s
    stage(tmp_path)
    env, offset = _stepped_env(tmp_path)
    marker = tmp_path / "fixed"
    manifest = write_manifest([py_job("r1", "fail_until_marker", "r1.pdf",
                                      marker=str(marker))])
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--backoff-base", "1",
                                        "--backoff-max", "2", "--json"), env=env)
    try:
        runner.until(lambda ln: '"event": "retry"' in ln)
        # When the wall clock steps an hour back while the retry waits
        offset.write_text("-3600")
        marker.write_text("fixed")
        # Then the retry runs after its backoff all the same, not an hour later
        assert runner.wait(30) == 0, runner.lines
    finally:
        runner.close()
    record = QueueView(queue).record("done", "r1")
    assert [a["outcome"] for a in record["attempts"]] == ["failed", "completed"]


def test_a_job_answering_the_stop_is_released_though_the_clock_stepped_back_meanwhile(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner running a job (one attempt) that exits 3 when SIGTERM reaches it
    stage(tmp_path)
    env, offset = _stepped_env(tmp_path)
    pidfile = tmp_path / "py.pid"
    manifest = write_manifest([{**py_job("py", "exit_on_sigterm", pidfile=str(pidfile)),
                                "max_attempts": 1}])
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--json"), env=env,
                    new_session=True)
    try:
        wait_for_pid(pidfile)
        # When the wall clock steps ten minutes back during the job, and then the stop
        # signal reaches every process of the service at once (KillMode=control-group)
        offset.write_text("-600")
        term_whole_service(runner.pid)
        # Then the job, stopped with the runner, goes back to pending uncharged: by wall
        # times it started "after" the stop, and was dead-lettered for its answer
        assert runner.wait(30) == ExitCode.SIGTERM, runner.lines
    finally:
        runner.close()
    view = QueueView(queue)
    assert view.states_of(["py"]) == {"py": ["pending"]}
    assert [a["outcome"] for a in view.record("pending", "py")["attempts"]] == ["released"]


def test_jobs_accepted_after_a_step_back_queue_behind_those_accepted_before(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given three jobs accepted, then the wall clock stepped an hour back, then three more
    stage(tmp_path)
    env, offset = _stepped_env(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    first = write_manifest([py_job(f"a{n}", "write_one_byte", f"a{n}.bin") for n in range(3)],
                           name="first.toml")
    then = write_manifest([py_job(f"b{n}", "write_one_byte", f"b{n}.bin") for n in range(3)],
                          name="then.toml")
    assert run_cli("submit", first, *cli_args(queue, out), env=env).returncode == 0
    offset.write_text("-3600")
    assert run_cli("submit", then, *cli_args(queue, out), env=env).returncode == 0

    # When one worker runs them, one at a time
    res = run_cli("run", *cli_args(queue, out, "--workers", "1", "--prefetch", "1",
                                   "--json"), env=env)

    # Then they run in the order they were accepted: the clock's hour again is no reason to
    # put the later ones first
    assert res.returncode == 0, res.stderr
    started = [e["job"] for e in json_lines(res.stdout) if e["event"] == "started"]
    assert started == ["a0", "a1", "a2", "b0", "b1", "b2"], started


def test_status_shows_no_negative_time_run_after_a_step_back(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job running
    stage(tmp_path)
    env, offset = _stepped_env(tmp_path)
    pidfile = tmp_path / "held.pid"
    manifest = write_manifest([py_job("held", "sleep_then_write", "held.pdf", s=600,
                                      pidfile=str(pidfile))])
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--json"))
    try:
        wait_for_pid(pidfile)
        # When `status` runs on a clock an hour behind the one the lease was taken by
        offset.write_text("-3600")
        res = run_cli("status", "--queue", queue, "--json", env=env)
    finally:
        runner.close()
    # Then the job has run for no time yet, not for minus an hour
    assert res.returncode == 0, res.stderr
    running = json.loads(res.stdout)["running_jobs"]
    assert [j["id"] for j in running] == ["held"]
    assert 0.0 <= running[0]["elapsed_s"] < 60, running
