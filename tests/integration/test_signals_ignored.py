"""A stop signal the parent left ignored stays ignored, as coreutils keep it: `nohup renderctl
run` goes on through a logout's SIGHUP, and a script's `renderctl run &` through a Ctrl-C
meant for the script. Real `nohup` and `sh`, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from jobfns import (
    RENDERCTL,
    QueueView,
    Runner,
    _env,
    assert_pdf,
    cli_args,
    held_job,
    wait_for_pid,
)


def test_nohup_run_goes_on_through_the_hangup(tmp_path: Path, write_manifest: Any) -> None:
    queue, out = tmp_path / "q", tmp_path / "out"
    job, go = held_job(tmp_path, "held")
    # Given `nohup renderctl run` (the script's entry point: `python -m renderctl`) in a
    # session of its own, running a job
    runner = Runner.of(subprocess.Popen(
        ["nohup", sys.executable, "-m", "renderctl", "run", *cli_args(queue, out, "--workers", "1"),
         str(write_manifest([job]))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        env=_env(None), start_new_session=True))
    try:
        wait_for_pid(tmp_path / "held.pid")
        # When its session hangs up (SIGHUP to its whole process group, as a terminal's; an
        # ignored signal is dropped as it is sent, so none is left pending after this), and
        # then the job ends
        os.killpg(runner.pid, signal.SIGHUP)
        go.touch()
        # Then the run goes on to the end, exit 0: no drain, the job completed
        assert runner.wait() == 0, (runner.lines, runner.stderr())
    finally:
        go.touch()
        runner.kill()
    assert not any(line.startswith("stopping") for line in runner.lines), runner.lines
    assert QueueView(queue).ids("done") == {"held"}
    assert_pdf(out / "held.pdf", "held")


def test_a_scripts_background_run_ignores_sigint_and_still_stops_on_sigterm(
        tmp_path: Path, write_manifest: Any) -> None:
    queue, out = tmp_path / "q", tmp_path / "out"
    job, go = held_job(tmp_path, "held")
    # Given `renderctl run ... &` in a shell script (which starts it with SIGINT ignored),
    # running a job
    script = '"$@" & wait $!'
    runner = Runner.of(subprocess.Popen(
        ["sh", "-c", script, "sh", *RENDERCTL, "run", *cli_args(queue, out, "--workers", "1"),
         str(write_manifest([job]))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(None)))
    try:
        wait_for_pid(tmp_path / "held.pid")
        started = runner.until(lambda line: line.startswith("runner started: pid "))
        pid = int(started.split("pid ")[1].split(",")[0])

        # When it gets SIGINT (a Ctrl-C meant for the script), then SIGTERM
        os.kill(pid, signal.SIGINT)
        os.kill(pid, signal.SIGTERM)

        # Then only SIGTERM stops it: it drains on SIGTERM (exit 143, as the shell passes on)
        runner.until(lambda line: line.startswith("stopping"))
        go.touch()
        assert runner.wait() == 143, (runner.lines, runner.stderr())
    finally:
        go.touch()
        runner.kill()
    stopping = [line for line in runner.lines if line.startswith("stopping")]
    assert stopping == [stopping[0]] and "SIGTERM" in stopping[0], runner.lines
