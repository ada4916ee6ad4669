"""Two DESIGN.md promises no other test covered: `--follow` (including a job whose submit
died before telling the runner), and outputs confined to the output root even when a
folder inside it is a symlink pointing out."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobfns import QueueView, Runner, assert_pdf, cli_args, py_job, run_cli, stage

from renderctl.errors import ExitCode
from renderctl.runner import RESCAN_FULL_S


@contextlib.contextmanager
def following_runner(tmp_path: Path) -> Iterator[tuple[Runner, Path, Path]]:
    """(runner, queue, out): a started `run --follow --json` on an empty queue."""
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(*cli_args(queue, out, "--workers", "1", "--follow", "--json"))
    try:
        runner.until(lambda ln: '"runner_started"' in ln)
        yield runner, queue, out
    finally:
        runner.close()


def completed(runner: Runner, job_id: str, *, timeout_s: float = 30) -> None:
    line = runner.until(lambda ln: '"completed"' in ln and f'"{job_id}"' in ln,
                        timeout_s=timeout_s)
    assert json.loads(line)["job"] == job_id


def test_follow_serves_jobs_submitted_later_until_sigterm(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner following an empty queue
    with following_runner(tmp_path) as (runner, queue, out):
        # When jobs are submitted from another process, one batch after the other
        for batch in ("first", "second"):
            manifest = write_manifest([py_job(batch, "write_pdf")], name=f"{batch}.toml")
            assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0

            # Then the running runner picks each up and completes it
            completed(runner, batch)
            assert_pdf(out / f"{batch}.pdf", batch)

        # And it keeps going until it is told to stop, then exits 143 with nothing lost
        assert runner.proc.poll() is None
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM
    assert QueueView(queue).ids("done") == {"first", "second"}


def test_follow_finds_a_job_whose_submit_was_killed_before_its_doorbell(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner following an empty queue
    with following_runner(tmp_path) as (runner, queue, out):
        # When a submit is SIGKILLed once its job is durable in pending/ but before it rings
        # the doorbell that tells a running runner about new jobs
        manifest = write_manifest([py_job("stranded", "write_pdf")])
        killed = run_cli("submit", manifest, *cli_args(queue, out),
                         env={"RENDERCTL_CRASH_AT": "submit:before_doorbell"})
        assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
        assert QueueView(queue).all_ids() == {"stranded"}  # accepted, durably

        # Then the running runner still finds the job (its idle rescan of pending/) and
        # completes it, well before its slow full rescan would
        completed(runner, "stranded", timeout_s=RESCAN_FULL_S / 4)
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM
    assert QueueView(queue).ids("done") == {"stranded"}
    assert_pdf(out / "stranded.pdf", "stranded")


def test_an_output_folder_symlinked_out_of_the_root_is_refused(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given an output root whose folder "evil" is a symlink to a folder outside it
    stage(tmp_path)
    queue, out, outside = tmp_path / "q", tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (out / "evil").symlink_to(outside, target_is_directory=True)
    manifest = write_manifest([py_job("escape", "write_pdf", "evil/x.pdf"),
                               py_job("fine", "write_pdf", "ok/y.pdf")])

    # When it runs
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then the escaping job is dead-lettered (invalid_output) before it ever runs, so nothing
    # is written outside the root, not even a temporary, and the other job completes
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    rec = QueueView(queue).record("dead", "escape")
    assert rec["attempts"][-1]["outcome"] == "invalid_output"
    assert "outside the output root" in rec["attempts"][-1]["error"]
    assert rec["attempts"][-1].get("started_at") is None, "it ran with its output outside"
    assert list(outside.iterdir()) == []
    assert_pdf(out / "ok" / "y.pdf", "fine")


def test_a_runner_whose_lease_was_taken_over_does_not_publish(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner running a job that takes a moment
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("slow", "sleep_then_write", s=1.5)])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--json"))
    try:
        runner.until(lambda ln: '"started"' in ln and '"slow"' in ln)

        # When another holder takes the job's lease over while it runs (as a runner on
        # another host would after the lease expired)
        from renderctl.store import LEASE_XATTR

        running = queue / "running" / "slow.json"
        # "<token prefix> <attempt> <claimed_at> <expires_at>": the same attempt, another holder
        _, rest = os.getxattr(running, LEASE_XATTR).split(b" ", 1)
        os.setxattr(running, LEASE_XATTR, b"another-holder " + rest)

        # Then the fenced runner reports it and never publishes the output
        runner.until(lambda ln: '"fenced"' in ln and '"slow"' in ln)
        runner.proc.send_signal(signal.SIGTERM)
        runner.wait()
    finally:
        runner.close()
    assert not (out / "slow.pdf").exists()
    assert not list(out.glob(".rctl-*"))  # its temporary output is gone too
