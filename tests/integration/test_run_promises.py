"""DESIGN.md promises under races and odd states that no other file covers: `--follow`
(including a job whose submit died before telling the runner, and what a runner that lives
for days keeps: started logs, dead workers' scratch, a rotated event log, a re-pointed
output root), outputs confined to the output root, a kill racing its job's completion,
replace racing a claim, a repeated attempt token, signals aimed at the runner's group (or
at every process of the service) or landing while it starts or stops, and an output
folder that is a file. Races are arranged with RENDERCTL_STOP_AT (a process frozen
at a named point), not hoped for."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from jobfns import (
    QueueView,
    Runner,
    assert_pdf,
    cli_args,
    py_job,
    run_cli,
    stage,
    stopped,
    term_whole_service,
    wait_for_pid,
    wait_until,
)

from renderctl.errors import ExitCode
from renderctl.runner import LEASE_ENV, RESCAN_FULL_S
from renderctl.store import Queue


@contextlib.contextmanager
def following_runner(tmp_path: Path, *extra: str) -> Iterator[tuple[Runner, Path, Path]]:
    """(runner, queue, out): a started `run --follow --json` (options ``extra`` too) on an
    empty queue."""
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(*cli_args(queue, out, "--workers", "1", "--follow", "--json", *extra))
    try:
        runner.until(lambda ln: '"runner_started"' in ln)
        yield runner, queue, out
    finally:
        runner.close()


def completed(runner: Runner, job_id: str, *, timeout_s: float = 30) -> None:
    line = runner.until(lambda ln: '"completed"' in ln and f'"{job_id}"' in ln,
                        timeout_s=timeout_s)
    assert json.loads(line)["job"] == job_id


def test_a_job_enqueued_by_the_python_api_or_a_dead_retry_wakes_a_following_runner(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner following an empty queue that it rescans only every ten minutes, and a
    # job that fails (once allowed) until a marker exists
    marker = tmp_path / "fixed"
    with following_runner(tmp_path, "--poll-interval", "600") as (runner, queue, out):
        # When a program enqueues a job through the Python API (as a web tier does)
        res = Queue(queue).submit([py_job("api", "write_pdf")], base=tmp_path, out_root=out)
        assert list(res.accepted) == ["api"]

        # Then the runner starts it now, not at its next rescan
        completed(runner, "api", timeout_s=20)
        assert_pdf(out / "api.pdf", "api")

        # And when a job dead-lettered meanwhile is fixed and retried from the command line
        flaky = write_manifest([{**py_job("flaky", "fail_until_marker", marker=str(marker)),
                                 "max_attempts": 1}])
        assert run_cli("submit", flaky, *cli_args(queue, out)).returncode == 0
        runner.until(lambda ln: '"dead"' in ln and '"flaky"' in ln, timeout_s=20)
        marker.touch()
        assert run_cli("dead", "retry", "flaky", "--queue", queue).returncode == 0

        # Then it runs again at once too
        completed(runner, "flaky", timeout_s=20)
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM


def test_a_following_runner_places_a_batch_its_dead_submitter_committed(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner following an empty queue, and a submit of two jobs killed after its
    # journal commit (the jobs are accepted), before it placed them in pending/
    with following_runner(tmp_path, "--poll-interval", "0.2") as (runner, queue, out):
        batch = write_manifest([py_job("a", "write_pdf"), py_job("b", "write_pdf")])
        cut = run_cli("submit", batch, *cli_args(queue, out),
                      env={"RENDERCTL_CRASH_AT": "submit:staged"})
        assert cut.returncode == -signal.SIGKILL, cut.stderr
        assert [n for n in os.listdir(queue / "journal") if n.endswith(".txn")]

        # Then the runner places and runs them without waiting for some command to open
        # the queue (before: they waited for the next `status` or submit, for ever if none)
        completed(runner, "a", timeout_s=15)
        completed(runner, "b", timeout_s=15)
        assert_pdf(out / "b.pdf", "b")
        assert not [n for n in os.listdir(queue / "journal") if n.endswith(".txn")]
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM


def test_an_idle_runner_with_a_long_poll_interval_keeps_its_state_file_fresh(
        tmp_path: Path) -> None:
    # Given a runner following an empty queue that it rescans only every ten minutes
    with following_runner(tmp_path, "--poll-interval", "600") as (runner, queue, out):
        state = queue / "runner.state.json"
        wait_until(state.exists, what="the first state file")
        first = state.stat().st_mtime_ns

        # Then the state file `top` and metrics read is still rewritten about every second
        # (before: only at a poll or a lease renewal, 20 s and more apart)
        wait_until(lambda: state.stat().st_mtime_ns != first, timeout_s=5,
                   what="the state file to be rewritten")
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM


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


def test_a_submit_does_not_warn_of_an_output_its_own_job_published_meanwhile(
        tmp_path: Path, write_manifest: Any) -> None:
    import subprocess

    from jobfns import RENDERCTL, _env

    # Given a runner following the queue, and a submit held just after its job is accepted
    # (before it rings the doorbell, and before it says anything)
    with following_runner(tmp_path) as (runner, queue, out):
        manifest = write_manifest([py_job("quick", "write_pdf")])
        submit = subprocess.Popen([*RENDERCTL, "submit", str(manifest), *cli_args(queue, out)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=_env({"RENDERCTL_STOP_AT": "submit:before_doorbell"}))
        try:
            wait_until(lambda: stopped(submit.pid), what="the submit to stop after accepting")
            # When the runner finds the job and publishes its output meanwhile
            completed(runner, "quick", timeout_s=RESCAN_FULL_S / 4)
            os.kill(submit.pid, signal.SIGCONT)
            _, err = submit.communicate(timeout=60)
        finally:
            submit.kill()
            submit.wait()
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM
    # Then the submit does not warn that the job's own output is in its way ("will be
    # dead-lettered unless that file is removed": advice to delete a good output)
    assert submit.returncode == ExitCode.OK, err
    assert "exists already" not in err, err
    assert QueueView(queue).ids("done") == {"quick"}


def test_the_wait_for_a_first_attempt_counts_first_attempts_only(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that fails once and, retried after a 1.5-2.5 s backoff, runs until told
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    go, pidfile = tmp_path / "go", tmp_path / "held.pid"
    manifest = write_manifest([py_job("flaky", "fail_once_then_hold", marker=str(
        tmp_path / "marker"), go=str(go), pidfile=str(pidfile))])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--backoff-base", "2"))
    try:
        # When its retry is running
        wait_for_pid(pidfile, what="the retry to start")

        def state() -> dict[str, Any] | None:
            try:
                doc = json.loads((queue / "runner.state.json").read_text())
            except (OSError, ValueError):
                return None
            running = doc["running"]
            return doc if running and running[0]["attempt"] == 2 else None

        doc = wait_until(state, what="the runner's state to show the retry running")
        go.touch()
        assert runner.wait() == ExitCode.OK, runner.lines
    finally:
        runner.close()
    # Then what `top` shows as "accepted -> first attempt" is the first claim alone (the
    # retry's claim, after the backoff, was counted too: p99 ~2 s for a wait of ~0.1 s)
    assert doc["wait_s"]["n"] == 1, doc["wait_s"]
    assert doc["wait_s"]["p99"] < 1.5, doc["wait_s"]


def test_a_following_runners_evidence_of_started_attempts_stays_bounded(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import wait_until

    # Given a runner following the queue whose workers are recycled every 2 jobs
    with following_runner(tmp_path, "--max-jobs-per-worker", "2") as (runner, queue, out):
        # When it has run 20 jobs (each attempt's start is logged in control/ by its worker,
        # for recovery to tell an attempt that ran from one that never started)
        manifest = write_manifest([py_job(f"j{n}", "write_one_byte", f"j{n}.bin")
                                   for n in range(20)])
        assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
        wait_until(lambda: len(QueueView(queue).ids("done")) == 20, timeout_s=60,
                   what=lambda: f"20 jobs done: {runner.lines[-3:]}")

        # Then what is kept of those starts is what no recorded attempt has made moot: the
        # logs of its live worker and the one retiring, not one line per job it ever ran
        def lines_kept() -> int:
            kept = 0
            for log in (queue / "control").glob("started.*.log"):
                # the runner may drop a log between the listing and the read: none kept of it
                with contextlib.suppress(FileNotFoundError):
                    kept += len(log.read_text().splitlines())
            return kept

        wait_until(lambda: lines_kept() <= 4, what=lambda: f"{lines_kept()} lines kept")
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM
    assert sorted((queue / "control").glob("started.*.log")) == []


def test_a_following_runner_keeps_no_dead_workers_scratch(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import TERMINAL, wait_until

    # Given a runner following the queue whose workers are recycled every 2 jobs
    with following_runner(tmp_path, "--max-jobs-per-worker", "2") as (runner, queue, out):
        [note] = (queue / "control").glob("work.*")
        work_root = Path(note.read_text().split()[0])  # the jobs' working folders

        # When a job that filled its working folder (its TMPDIR) is killed at its timeout,
        # and ten short jobs run after it
        hog = {**py_job("hog", "scratch_then_hang", "hog.bin", mb=8),
               "timeout_s": 1, "max_attempts": 1}
        manifest = write_manifest([hog, *(py_job(f"j{n}", "write_one_byte", f"j{n}.bin")
                                          for n in range(10))])
        assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
        view = QueueView(queue)
        wait_until(lambda: sum(len(view.ids(s)) for s in TERMINAL) == 11, timeout_s=60,
                   what=lambda: f"11 jobs ended: {runner.lines[-3:]}")

        # Then what the dead workers had there is gone with them, not kept until the
        # runner exits: no scratch file, and the folders of live workers only
        def kept() -> list[str]:
            return sorted(p.name for p in work_root.iterdir() if p.name.startswith("w"))

        # (os.walk, not rglob: a recycled worker's folder removed as it is listed is no
        # error; seen in CI, FileNotFoundError from rglob's scandir)
        assert not [f for _, _, files in os.walk(work_root) for f in files
                    if f == "scratch.bin"]
        wait_until(lambda: len(kept()) <= 4, what=lambda: f"live workers' files only: {kept()}")
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM
    assert QueueView(queue).record("dead", "hog")["attempts"][-1]["outcome"] == "timeout"


def test_an_event_log_rotated_by_rename_while_following_gets_the_next_events(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner following the queue that has logged a completed job
    with following_runner(tmp_path) as (runner, queue, out):
        first = write_manifest([py_job("r1", "write_pdf")], name="r1.toml")
        assert run_cli("submit", first, *cli_args(queue, out)).returncode == 0
        completed(runner, "r1")

        # When the log is rotated as logrotate does by default: renamed away, and the
        # next writer creates events.jsonl anew (a runner under systemd lives for days)
        os.rename(queue / "events.jsonl", queue / "events.jsonl.1")
        second = write_manifest([py_job("r2", "write_pdf")], name="r2.toml")
        assert run_cli("submit", second, *cli_args(queue, out)).returncode == 0
        completed(runner, "r2")
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM

    # Then the running runner's events after the rotation are in the new log, where
    # `metrics`, `top` and `wait` read them, and none went on into the rotated one
    def events(name: str) -> list[tuple[str, str]]:
        return [(e["event"], e["job"]) for e in map(json.loads, (queue / name).open())]

    assert events("events.jsonl") == [("accepted", "r2"), ("claimed", "r2"),
                                      ("completed", "r2")]
    assert all(job == "r1" for _, job in events("events.jsonl.1"))
    metrics = run_cli("metrics", "--queue", queue)
    assert 'renderctl_attempts_total{outcome="completed"} 1' in metrics.stdout


def test_an_output_root_repointed_while_following_receives_the_next_outputs(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given an output root that is a symlink to a volume, and a runner following the queue
    # that has published a job into the root's folder x
    vol_a, vol_b = tmp_path / "vol_a", tmp_path / "vol_b"
    vol_a.mkdir()
    vol_b.mkdir()
    (tmp_path / "out").symlink_to(vol_a, target_is_directory=True)
    with following_runner(tmp_path) as (runner, queue, out):
        first = write_manifest([py_job("a1", "write_pdf", "x/a1.pdf")], name="a.toml")
        assert run_cli("submit", first, *cli_args(queue, out)).returncode == 0
        completed(runner, "a1")

        # When the root is re-pointed at another volume (a release switch, a migration),
        # atomically, and the next job for folder x is submitted
        (tmp_path / "out.new").symlink_to(vol_b, target_is_directory=True)
        os.replace(tmp_path / "out.new", out)
        second = write_manifest([py_job("b1", "write_pdf", "x/b1.pdf")], name="b.toml")
        assert run_cli("submit", second, *cli_args(queue, out)).returncode == 0

        # Then that job is published where the root now leads, on its first attempt (not
        # failed for a folder the runner remembered making there, nor refused as outside
        # the root the runner resolved when it started)
        ended = runner.until(lambda ln: '"b1"' in ln and any(
            f'"event": "{e}"' in ln for e in ("completed", "dead")))
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM
    assert json.loads(ended)["event"] == "completed", runner.lines
    rec = QueueView(queue).record("done", "b1")
    assert [a["outcome"] for a in rec["attempts"]] == ["completed"]
    assert_pdf(vol_b / "x" / "b1.pdf", "b1")
    assert_pdf(vol_a / "x" / "a1.pdf", "a1")


@pytest.mark.parametrize("immutable", [False, True], ids=["outside writable", "outside +i"])
@pytest.mark.parametrize("output", ["evil/x.pdf", "evil/sub/x.pdf"])
def test_an_output_folder_symlinked_out_of_the_root_is_refused(
        tmp_path: Path, write_manifest: Any, output: str, immutable: bool) -> None:
    import shutil
    import subprocess

    # Given an output root whose folder "evil" is a symlink to a folder outside it (one
    # nobody can write to, in the second case: its refusals are not the output folder's)
    stage(tmp_path)
    queue, out, outside = tmp_path / "q", tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    manifest = write_manifest([py_job("escape", "write_pdf", output),
                               py_job("fine", "write_pdf", "ok/y.pdf")])
    # Submitted before the symlink is made (validation refuses one that is there already):
    # the runner's own check is for a symlink made between submit and run
    sub = run_cli("submit", manifest, *cli_args(queue, out))
    assert sub.returncode == 0, sub.stderr
    (out / "evil").symlink_to(outside, target_is_directory=True)
    if immutable:
        if os.geteuid() != 0 or shutil.which("chattr") is None:
            pytest.skip("needs root and chattr")
        subprocess.run(["chattr", "+i", str(outside)], check=True)

    # When it runs
    try:
        res = run_cli("run", *cli_args(queue, out, "--workers", "1"))
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(outside)], check=True)

    # Then the escaping job is dead-lettered (invalid_output) before it ever runs, so nothing
    # is written outside the root, not even a temporary, and the other job completes
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    rec = QueueView(queue).record("dead", "escape")
    assert rec["attempts"][-1]["outcome"] == "invalid_output"
    assert "outside the output root" in rec["attempts"][-1]["error"]
    assert rec["attempts"][-1].get("started_at") is None, "it ran with its output outside"
    assert list(outside.iterdir()) == []  # not even a folder made there
    assert_pdf(out / "ok" / "y.pdf", "fine")


def test_an_output_root_made_a_symlink_loop_after_submit_dead_letters_its_job(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job accepted for an output root not made yet, which then becomes a symlink
    # loop (submit refuses one that is a loop already)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    sub = run_cli("submit", write_manifest([py_job("looped", "write_pdf")]),
                  *cli_args(queue, out))
    assert sub.returncode == 0, sub.stderr
    out.symlink_to(tmp_path / "back")
    (tmp_path / "back").symlink_to(out)

    # When a runner runs the queue (its own --out, here the default, is not the job's)
    (tmp_path / "cwd").mkdir()
    res = run_cli("run", "--queue", queue, "--workers", "1", cwd=tmp_path / "cwd")

    # Then the job is dead-lettered (invalid_output, naming the loop) before it runs, as for
    # a loop below the root; the runner no longer dies in a traceback at the claim, leaving
    # the job leased to a runner that is gone and killing every runner after it the same way
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    rec = QueueView(queue).record("dead", "looped")
    assert rec["attempts"][-1]["outcome"] == "invalid_output"
    assert "symlink loop" in rec["attempts"][-1]["error"]
    assert rec["attempts"][-1].get("started_at") is None


def _staged(tmp_path: Path, how: str, completes: str, fails: str) -> tuple[Path, Path, str]:
    """Job functions staged; the queue, the output root, and the function for ``how``."""
    stage(tmp_path)
    return tmp_path / "q", tmp_path / "out", completes if how == "completes" else fails


def _take_lease_over(queue: Path, job_id: str) -> None:
    """Put another holder's lease on the running job (as a runner on another host does once
    the lease expired): "<token prefix> <attempt> <claimed_at> <expires_at>", the same
    attempt under another prefix."""
    from renderctl.store import LEASE_XATTR

    running = queue / "running" / f"{job_id}.json"
    _, rest = os.getxattr(running, LEASE_XATTR).split(b" ", 1)
    os.setxattr(running, LEASE_XATTR, b"another-holder " + rest)


@pytest.mark.parametrize("how", ["completes", "fails"])
def test_a_runner_whose_lease_was_taken_over_does_not_publish(
        tmp_path: Path, write_manifest: Any, how: str) -> None:
    # Given a runner running a job that takes a moment (and then completes, or fails for
    # good), and another queued behind it in the same worker
    queue, out, fn = _staged(tmp_path, how, "sleep_then_write", "sleep_then_fail")
    manifest = write_manifest([{**py_job("slow", fn, s=1.5), "max_attempts": 1,
                                "priority": 1},
                               py_job("next", "write_pdf")])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--prefetch", "2",
                                        "--json"))
    try:
        runner.until(lambda ln: '"started"' in ln and '"slow"' in ln)

        # When another holder takes both jobs' leases over while the first runs (as a
        # runner on another host would after the leases expired: this one stopped, say)
        for jid in ("slow", "next"):
            _take_lease_over(queue, jid)

        # Then the fenced runner reports it and records nothing of the attempt: neither its
        # output nor its failure (a failure was recorded over the new holder's claim: the
        # job in dead/ beside the new holder's done record; audit CL); nor does the stop
        # put the queued job back in pending/ (it would run twice)
        runner.until(lambda ln: '"fenced"' in ln and '"slow"' in ln)
        runner.proc.send_signal(signal.SIGTERM)
        runner.wait()
    finally:
        runner.close()
    assert not (out / "slow.pdf").exists()
    assert not list(out.glob(".rctl-*"))  # its temporary output is gone too
    assert '"fenced"' in "".join(ln for ln in runner.lines if '"next"' in ln), runner.lines
    view = QueueView(queue)
    assert view.states_of(["slow", "next"]) == {"slow": ["running"], "next": ["running"]}


def test_a_runner_stops_a_running_job_whose_lease_was_taken_over(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import wait_for_pid, wait_until

    # Given a runner (1.5 s leases, renewed every 0.5 s) running a job that takes a minute
    queue, out, fn = _staged(tmp_path, "completes", "sleep_then_write", "")
    pidfile = tmp_path / "j.pid"
    manifest = write_manifest([py_job("j", fn, s=60, pidfile=str(pidfile))])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--json",
                                        "--kill-grace", "1"), env={LEASE_ENV: "1.5"})
    try:
        pid = wait_for_pid(pidfile)

        # When another holder takes its lease over
        t0 = time.monotonic()
        _take_lease_over(queue, "j")

        # Then the runner sees it at its next renewal and stops its copy of the job (it ran
        # on to the end, the work done twice, only to be fenced then; audit CO), and
        # records nothing of it
        runner.until(lambda ln: '"fenced"' in ln and '"j"' in ln)
        took = time.monotonic() - t0
        wait_until(lambda: not psutil.pid_exists(pid)
                   or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
                   what="the job's process to be gone")
        runner.proc.send_signal(signal.SIGTERM)
        runner.wait()
    finally:
        runner.close()
    assert took < 10, took
    assert not (out / "j.pdf").exists()
    assert QueueView(queue).states_of(["j"]) == {"j": ["running"]}  # (the new holder's)


@pytest.mark.parametrize(("how", "point"), [("completes", "commit:synced"),
                                             ("fails", "commit:synced"),
                                             ("completes", "publish:after_link")])
def test_a_runner_taken_over_during_its_commits_sync_records_nothing(
        tmp_path: Path, write_manifest: Any, how: str, point: str) -> None:
    from jobfns import stopped, wait_until

    # Given a runner (2 s leases) frozen in a group commit, after its sync (the records of
    # the job's attempt written, nothing yet placed): the attempt completed, or failed for
    # good; or after it published the output, its record not yet placed (review CP), the
    # new holder's recovery having judged the job before that (it runs it again)
    queue, out, fn = _staged(tmp_path, how, "write_pdf", "fail")
    manifest = write_manifest([{**py_job("j", fn), "max_attempts": 1}])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--json"),
                    env={"RENDERCTL_STOP_AT": point, LEASE_ENV: "2"})
    try:
        wait_until(lambda: stopped(runner.pid), what="the runner to freeze after its sync")

        # When another holder takes the job's lease over meanwhile (as a runner on another
        # host does once the lease expired), and the frozen runner goes on
        _take_lease_over(queue, "j")
        os.kill(runner.pid, signal.SIGCONT)

        # Then it records nothing of its attempt (it was fenced before the sync only: the
        # record it had staged was placed over the new holder's claim; audit CO), waits for
        # the new holder's lease, and, that holder gone silent, takes the job over and runs
        # it: one terminal state, the output published once
        code = runner.wait(60)
    finally:
        runner.close()
    events = [json.loads(ln) for ln in runner.lines if ln.startswith("{")]
    mine = [e["event"] for e in events if e.get("job") == "j"]
    assert mine[:2] == ["started", "fenced"], mine
    view = QueueView(queue)
    if how == "completes":
        assert code == 0, runner.lines
        assert view.states_of(["j"]) == {"j": ["done"]}
        assert_pdf(out / "j.pdf", "j")
    else:
        assert code == 1, runner.lines
        assert view.states_of(["j"]) == {"j": ["dead"]}
        assert not (out / "j.pdf").exists()
    assert not list(out.glob(".rctl-*"))


def test_a_runner_taken_over_after_publishing_leaves_the_output_its_successor_adopted(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import stopped, wait_until

    from renderctl.recovery import apply_verdicts, judge_orphan, started_tokens

    # Given a runner (2 s leases) frozen in a group commit after publishing the job's
    # output, its done record not yet placed
    queue, out, fn = _staged(tmp_path, "completes", "write_pdf", "fail")
    manifest = write_manifest([py_job("j", fn)])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--json"),
                    env={"RENDERCTL_STOP_AT": "publish:after_link", LEASE_ENV: "2"})
    try:
        wait_until(lambda: stopped(runner.pid), what="the runner to freeze after publishing")

        # When another runner takes the job over (its lease expired), as recovery does: it
        # finds the output published by the attempt, and completes the job from it
        q = Queue(queue)
        view = q.find("j")
        assert view is not None
        orphan = judge_orphan(view.record, started=started_tokens(q), now=time.time())
        assert orphan.done is not None
        apply_verdicts(q, [orphan.done], [orphan.published_tmp] if orphan.published_tmp
                       else [])

        # and the frozen runner goes on
        os.kill(runner.pid, signal.SIGCONT)
        code = runner.wait(60)
    finally:
        runner.close()

    # Then it records nothing (fenced), and the output the job is done with stays (taking
    # back what it had published deleted a done job's output; review CR)
    assert code == 0, runner.lines
    assert any('"fenced"' in ln for ln in runner.lines), runner.lines
    assert QueueView(queue).states_of(["j"]) == {"j": ["done"]}
    assert_pdf(out / "j.pdf", "j")


def _signal_frozen(runner: Runner, sig: int) -> tuple[int, str]:
    """Send ``sig`` to a runner frozen (SIGSTOP) at a point, let it go on, and return its exit
    code and stderr once it has ended: the signal is pending when it wakes."""
    os.kill(runner.pid, sig)
    os.kill(runner.pid, signal.SIGCONT)
    code = runner.wait(60)
    return code, runner.stderr()


def _frozen_runner(tmp_path: Path, write_manifest: Any, j2: dict[str, Any],
                   env: dict[str, str] | None = None) -> tuple[Runner, Path]:
    """One worker running j1 (held until ``tmp_path/go`` exists), ``j2`` queued behind it,
    and the runner frozen (SIGSTOP) in its first group commit, j0's: it reads nothing until
    the test SIGCONTs it. Returns the runner and the queue (outputs in ``tmp_path/out``)."""
    from jobfns import wait_for_pid, wait_until

    stage(tmp_path)
    pid1 = tmp_path / "j1.pid"
    manifest = write_manifest([
        py_job("j0", "write_pdf"),
        py_job("j1", "wait_for_go", pidfile=str(pid1), go=str(tmp_path / "go")),
        j2,
    ])
    queue = tmp_path / "q"
    runner = Runner(manifest, *cli_args(queue, tmp_path / "out", "--workers", "1",
                                        "--prefetch", "3", "--json"),
                    env={"RENDERCTL_STOP_AT": "commit", **(env or {})})
    wait_for_pid(pid1, what="j1 to start")
    wait_until(lambda: stopped(runner.pid), what="the runner to freeze in its commit")
    return runner, queue


@pytest.mark.parametrize("how", ["leased", "claiming"])
def test_a_worker_does_not_start_a_queued_job_whose_lease_a_frozen_runner_lost(
        tmp_path: Path, write_manifest: Any, how: str) -> None:
    # Given one worker with j1 running and j2 queued behind it, the runner frozen (its
    # leases 3 s long, so that the test sees a takeover in seconds)
    log = tmp_path / "runs.log"
    runner, queue = _frozen_runner(tmp_path, write_manifest,
                                   py_job("j2", "logged_write", log=str(log)),
                                   env={LEASE_ENV: "3"})
    try:
        # When another runner takes j2 over meanwhile (its lease on the record; or caught
        # in its claim: its record renamed into running/, its lease not yet set), and j1
        # ends
        if how == "leased":
            _take_lease_over(queue, "j2")
        else:
            running = queue / "running" / "j2.json"
            other = running.with_name("other.tmp")
            other.write_bytes(running.read_bytes())  # (a new file: no lease on it)
            os.replace(other, running)
        (tmp_path / "go").touch()

        # Then the worker does not start j2 (it did: run here and by its new holder, one
        # run never recorded; audits CO, CQ); the runner, let go, drops its claim (fenced)
        # and waits for the new holder's lease, takes the job over when nobody renews it,
        # and runs it once (the claim caught without a lease is the next runner's: the
        # holder, as far as this one can tell, is at work)
        os.kill(runner.pid, signal.SIGCONT)
        assert runner.wait(60) == 0, runner.lines
        if how == "claiming":
            assert not log.exists()
            again = run_cli("run", *cli_args(queue, tmp_path / "out", "--workers", "1"))
            assert again.returncode == 0, again.stdout + again.stderr
    finally:
        runner.close()
    j2 = [json.loads(ln)["event"] for ln in runner.lines
          if ln.startswith("{") and '"j2"' in ln]
    assert j2[0] == "fenced" and j2.count("started") == (how == "leased"), j2
    assert log.read_text().count("j2 ") == 1
    assert QueueView(queue).states_of(["j0", "j1", "j2"]) == \
        {"j0": ["done"], "j1": ["done"], "j2": ["done"]}


def test_a_cancel_of_a_queued_job_a_frozen_runner_lost_reaches_its_new_holder(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given one worker with j1 running and j2 queued behind it, the runner frozen (3 s
    # leases), and j2's lease taken over by another runner meanwhile
    log = tmp_path / "runs.log"
    runner, queue = _frozen_runner(tmp_path, write_manifest,
                                   py_job("j2", "logged_write", log=str(log)),
                                   env={LEASE_ENV: "3"})
    try:
        _take_lease_over(queue, "j2")

        # When the user cancels j2, and the runner goes on
        cancel = run_cli("cancel", "j2", "--queue", queue)
        assert cancel.returncode == 0 and "cancel requested" in cancel.stdout, cancel.stdout
        os.kill(runner.pid, signal.SIGCONT)
        (tmp_path / "go").touch()
        runner.wait(60)
    finally:
        runner.close()

    # Then the cancel stands for whoever holds j2 (it was consumed by the fenced runner and
    # lost: j2 ran to done; review CP): here, the runner that takes j2 over at last
    assert QueueView(queue).states_of(["j2"]) == {"j2": ["cancelled"]}, runner.lines
    assert not log.exists()


def test_a_cancel_racing_its_jobs_completion_cancels_that_job_and_no_other(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import wait_for_pid

    # Given one worker with j1 running and j2 queued behind it, and a frozen runner
    pid2, out = tmp_path / "j2.pid", tmp_path / "out"
    runner, queue = _frozen_runner(tmp_path, write_manifest, py_job(
        "j2", "sleep_then_write", s=600, sleep_attempts=1, pidfile=str(pid2)))
    try:
        # When j1 finishes and the worker starts j2, and only then (before the runner has
        # read either) the user cancels j1
        (tmp_path / "go").touch()
        wait_for_pid(pid2, what="the worker to start j2")
        cancel = run_cli("cancel", "j1", "--queue", queue)
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        os.kill(runner.pid, signal.SIGCONT)

        # Then j1 is cancelled and never published; j2, whose worker the cancel killed,
        # is not charged for it and completes; nothing is left behind
        assert runner.wait(60) == ExitCode.JOBS_FAILED, runner.lines
    finally:
        runner.close()
    view = QueueView(queue)
    assert view.states_of(["j0", "j1", "j2"]) == {"j0": ["done"], "j1": ["cancelled"],
                                                  "j2": ["done"]}
    assert not (out / "j1.pdf").exists()
    assert_pdf(out / "j2.pdf", "j2")
    outcomes = [a["outcome"] for a in view.record("done", "j2")["attempts"]]
    assert outcomes == ["released", "completed"], outcomes
    assert sorted(p.name for p in out.iterdir()) == ["j0.pdf", "j2.pdf"]
    assert view.tmp_entries() == []


def test_a_job_cancelled_while_queued_that_had_already_started_leaves_no_temporary(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import wait_for_pid

    # Given one worker with j1 running and j2 queued behind it, and a frozen runner
    pid2, out = tmp_path / "j2.pid", tmp_path / "out"
    runner, queue = _frozen_runner(tmp_path, write_manifest,
                                   py_job("j2", "write_then_hang", pidfile=str(pid2)))
    try:
        # When the worker finishes j1 and starts j2, which writes its output's temporary,
        # and j2 is cancelled before the runner has read that it started
        (tmp_path / "go").touch()
        wait_for_pid(pid2, what="j2 to write its output")
        assert run_cli("cancel", "j2", "--queue", queue).returncode == 0
        os.kill(runner.pid, signal.SIGCONT)

        # Then j2 is cancelled, never published, and its temporary is gone with its worker
        assert runner.wait(60) == ExitCode.JOBS_FAILED, runner.lines
    finally:
        runner.close()
    view = QueueView(queue)
    assert view.states_of(["j0", "j1", "j2"]) == {"j0": ["done"], "j1": ["done"],
                                                  "j2": ["cancelled"]}
    assert sorted(p.name for p in out.iterdir()) == ["j0.pdf", "j1.pdf"]
    assert view.tmp_entries() == []


def test_a_job_replaced_after_it_completed_never_claims_its_old_output(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import sha256_of, stray_temporaries

    # Given a --follow runner that has completed x (its attempt 1 published x.pdf)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    first = write_manifest([py_job("x", "write_pdf")], name="v1.toml")
    runner = Runner(first, *cli_args(queue, out, "--workers", "1", "--follow", "--json"))
    try:
        runner.until(lambda line: '"completed"' in line and '"x"' in line)
        published = sha256_of(out / "x.pdf")

        # When x is replaced by a different spec with the same output, which the same
        # runner claims as attempt 1 again
        second = write_manifest([py_job("x", "write_pdf", version=2)], name="v2.toml")
        res = run_cli("submit", second, "--replace", *cli_args(queue, out))
        assert res.returncode == 0, res.stdout + res.stderr
        line = runner.until(lambda line: '"x"' in line and '"state": "dead"' in line)
    finally:
        runner.close()

    # Then the file there is not taken for the new attempt's: output_exists, untouched,
    # and no temporary is left beside it
    assert '"output_exists"' in line, line
    assert sha256_of(out / "x.pdf") == published
    assert stray_temporaries(out) == []


def test_a_folder_output_published_before_its_done_record_was_deleted_is_not_ours(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import stray_temporaries

    # Given a split job that published its folder, whose done record is then deleted
    folder = stage(tmp_path)
    src = Path(__file__).resolve().parents[2] / "sample-inputs" / "pdf" / "b.pdf"
    (folder / "b.pdf").write_bytes(src.read_bytes())
    manifest = write_manifest([{"id": "parts", "kind": "split", "input": "b.pdf",
                                "output": "parts", "params": {"pages_per_part": 1}}])
    queue, out = tmp_path / "q", tmp_path / "out"
    assert run_cli("run", manifest, *cli_args(queue, out)).returncode == 0
    before = sorted(p.name for p in (out / "parts").iterdir())
    (queue / "done" / "parts.json").unlink()

    # When the same job is submitted and run again
    res = run_cli("run", manifest, *cli_args(queue, out))

    # Then it dead-letters with output_exists; the folder is untouched; no temporary left
    assert res.returncode == 1, res.stdout + res.stderr
    rec = QueueView(queue).record("dead", "parts")
    assert [a["outcome"] for a in rec["attempts"]] == ["output_exists"]
    assert sorted(p.name for p in (out / "parts").iterdir()) == before
    assert stray_temporaries(out) == []


def test_a_replace_that_loses_the_race_to_a_claim_enqueues_nothing(
        tmp_path: Path, write_manifest: Any) -> None:
    import subprocess

    from jobfns import RENDERCTL, _env, wait_for_pid, wait_until

    # Given a pending job u1, and `submit --replace` of it frozen just after it checked
    # that u1 is not running
    stage(tmp_path)
    go, pidfile = tmp_path / "go", tmp_path / "u1.pid"
    queue, out = tmp_path / "q", tmp_path / "out"
    v1 = write_manifest([py_job("u1", "wait_for_go", pidfile=str(pidfile), go=str(go))],
                        name="v1.toml")
    v2 = write_manifest([py_job("u1", "write_pdf")], name="v2.toml")
    assert run_cli("submit", v1, *cli_args(queue, out)).returncode == 0
    submit = subprocess.Popen([*RENDERCTL, "submit", str(v2), "--replace", *cli_args(queue, out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env({"RENDERCTL_STOP_AT": "submit:checked"}))
    runner = None
    try:
        wait_until(lambda: stopped(submit.pid), what="the submit to freeze after its check")

        # When a runner claims and starts u1 meanwhile, and then the submit goes on
        runner = Runner(*cli_args(queue, out, "--workers", "1", "--follow", "--json"))
        wait_for_pid(pidfile, what="u1 to start")
        os.kill(submit.pid, signal.SIGCONT)
        _, err = submit.communicate(timeout=30)

        # Then the replace is refused whole (u1 is running now) and nothing is enqueued
        assert submit.returncode == ExitCode.USAGE, err
        assert "u1" in err and "running" in err, err
        assert QueueView(queue).states_of(["u1"]) == {"u1": ["running"]}
        go.touch()
        runner.until(lambda line: '"completed"' in line and '"u1"' in line)
        os.kill(runner.pid, signal.SIGTERM)
        assert runner.wait(30) == ExitCode.SIGTERM
    finally:
        if submit.poll() is None:
            submit.kill()
        if runner is not None:
            runner.close()
    # and u1 ran once, as first submitted
    view = QueueView(queue)
    assert view.states_of(["u1"]) == {"u1": ["done"]}
    assert [a["outcome"] for a in view.record("done", "u1")["attempts"]] == ["completed"]
    assert view.record("done", "u1")["spec"]["callable"] == "jobfns:wait_for_go"
    assert_pdf(out / "u1.pdf", "u1")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, ExitCode.SIGTERM),
                                           (signal.SIGHUP, ExitCode.SIGHUP)], ids=["TERM", "HUP"])
def test_a_signal_to_the_runners_whole_process_group_drains_like_one_to_the_runner(
        tmp_path: Path, write_manifest: Any, sig: int, code: int) -> None:
    from jobfns import wait_for_pid

    # Given a runner leading its own process group (as under `timeout`, systemd or Slurm),
    # running a job that ends in 1 s and one that would run for 10 minutes
    stage(tmp_path)
    short_pid, long_pid = tmp_path / "short.pid", tmp_path / "long.pid"
    manifest = write_manifest([
        {**py_job("short", "sleep_then_write", s=1.0, pidfile=str(short_pid)),
         "max_attempts": 1},
        {**py_job("long", "sleep_then_write", s=600, pidfile=str(long_pid)),
         "max_attempts": 1},
    ])
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "2", "--grace", "3",
                                        "--max-jobs-per-worker", "1", "--json"),
                    new_session=True)
    try:
        wait_for_pid(short_pid, what="short to start")
        wait_for_pid(long_pid, what="long to start")

        # When the whole group gets SIGTERM (`timeout`, systemd) or SIGHUP (its terminal
        # closed)
        os.killpg(runner.pid, sig)

        # Then the short job finishes within the grace and the long one is released,
        # uncharged: the fork server did not take the workers down with it
        assert runner.wait(30) == code, runner.lines
    finally:
        runner.close()
    view = QueueView(queue)
    assert view.states_of(["short", "long"]) == {"short": ["done"], "long": ["pending"]}
    assert_pdf(out / "short.pdf", "short")
    assert [a["outcome"] for a in view.record("pending", "long")["attempts"]] == ["released"]


def test_ctrl_backslash_releases_the_running_jobs_at_once_uncharged(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import signal_mask, wait_for_pid

    # Given a run in a process group of its own, as a shell's job control starts it, with a
    # 10-minute grace, running a job of one attempt that would run for 10 minutes
    stage(tmp_path)
    pid = tmp_path / "long.pid"
    manifest = write_manifest([
        {**py_job("long", "sleep_then_write", s=600, pidfile=str(pid)), "max_attempts": 1},
        py_job("waiting", "write_pdf")])
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--grace", "600",
                                        "--json", "--start-method", "forkserver"),
                    own_group=True)
    try:
        job = wait_for_pid(pid)
        # (whose fork server ignores SIGQUIT: dying of it, it took every worker with it;
        # the job, forked from it, has the default action again)
        server = next(p for p in psutil.Process(runner.pid).children()
                      if "multiprocessing.forkserver" in " ".join(p.cmdline()))
        quit_bit = 1 << (signal.SIGQUIT - 1)
        assert quit_bit & signal_mask(server.pid) and not quit_bit & signal_mask(job)
        # When the terminal's quit key (Ctrl-backslash) sends SIGQUIT to that group, and
        # a copy follows once the runner has taken it (as coreutils' timeout passes one
        # on to its child and to the group both)
        from renderctl.runner import SAME_STOP_S

        t_first = time.monotonic()
        os.killpg(runner.pid, signal.SIGQUIT)
        runner.until(lambda ln: '"stopping"' in ln)
        if time.monotonic() - t_first > SAME_STOP_S * 0.75:
            pytest.skip("the machine took too long to report the first signal")
        os.kill(runner.pid, signal.SIGQUIT)
        # Then the run stops at once, not after the grace (it died of the signal, leaving
        # the job to be charged `crashed` at the next start: dead-lettered, at one attempt;
        # also of the copy, which is no second press: review CG)
        assert runner.wait(30) == ExitCode.SIGQUIT, (runner.lines, runner.stderr())
    finally:
        runner.close()
    events = [json.loads(line) for line in runner.lines]
    stopping = next(e for e in events if e["event"] == "stopping")
    assert (stopping["signal"], stopping["grace_s"], stopping["running"]) == ("SIGQUIT", 0, 1)
    # And the job was killed, returned to pending uncharged, as was the one not started
    assert not psutil.pid_exists(job) or psutil.Process(job).status() == psutil.STATUS_ZOMBIE
    view = QueueView(queue)
    assert view.states_of(["long", "waiting"]) == {"long": ["pending"], "waiting": ["pending"]}
    assert [a["outcome"] for a in view.record("pending", "long")["attempts"]] == ["released"]


@pytest.mark.parametrize("held_at", ["commit", "shutdown"])
def test_a_second_ctrl_backslash_quits_at_once(tmp_path: Path, write_manifest: Any,
                                               held_at: str) -> None:
    import resource

    from jobfns import signal_mask, stopped, wait_for_pid, wait_until

    # Given a run (no core files: the default action of SIGQUIT dumps one) running a job,
    # that will stop itself at its next group commit (the one releasing that job), or in
    # its shutdown, where it gives the signals back to the command line (whose own handler
    # caught the second press before)
    stage(tmp_path)
    pid = tmp_path / "long.pid"
    manifest = write_manifest([py_job("long", "sleep_then_write", s=600, pidfile=str(pid))])
    queue, out = tmp_path / "q", tmp_path / "out"
    core = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, core[1]))
    try:
        runner = Runner(manifest, *cli_args(queue, out, "--workers", "1"), own_group=True,
                        env={"RENDERCTL_STOP_AT": held_at})
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, core)
    try:
        wait_for_pid(pid)
        # When Ctrl-backslash stops the run, which is then held between the two presses
        os.killpg(runner.pid, signal.SIGQUIT)
        t_first = time.monotonic()
        wait_until(lambda: stopped(runner.pid), what=f"the runner to stop at {held_at}")
        if held_at == "shutdown":
            # Then SIGQUIT has its default action back by its shutdown (no handler:
            # SigCgt lacks it); before, a copy of the first within 0.2 s is no second press
            assert not signal_mask(runner.pid, "SigCgt") & (1 << (signal.SIGQUIT - 1))
        # And a second one, later, quits at once, by the signal (it drained again, exit 131)
        from renderctl.runner import SAME_STOP_S

        time.sleep(max(0.0, t_first + SAME_STOP_S + 0.1 - time.monotonic()))
        os.killpg(runner.pid, signal.SIGQUIT)
        os.killpg(runner.pid, signal.SIGCONT)
        assert runner.wait(30) == -signal.SIGQUIT, (runner.lines, runner.stderr())
    finally:
        runner.close()


def test_a_ctrl_backslash_before_the_runner_starts_leaves_the_next_to_quit(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    # Given a runner told to stop by a Ctrl-backslash that came before it installed its
    # signal handlers (in `run MANIFEST`'s submit, say), in a process of its own
    script = """
import signal, sys
from pathlib import Path
from renderctl.runner import Runner
from renderctl.settings import RunnerSettings
from renderctl.store import Queue

signal.signal(signal.SIGQUIT, signal.SIG_DFL)  # (as `run`'s early handler leaves it)
runner = Runner(Queue(Path(sys.argv[1])), RunnerSettings(workers=1))
runner.stop(signal.SIGQUIT)
runner._install_signals()
print(signal.getsignal(signal.SIGQUIT) is signal.SIG_DFL, signal.getsignal(signal.SIGINT))
"""
    res = subprocess.run([sys.executable, "-c", script, str(tmp_path / "q")],
                         capture_output=True, text=True, timeout=60)

    # When it installs them, then SIGQUIT keeps its default action: the next press quits
    # at once (it took a third), while its other stop signals are handled
    assert res.returncode == 0, res.stderr
    default, sigint = res.stdout.split(maxsplit=1)
    assert default == "True", res.stdout
    assert "_on_stop_signal" in sigint, res.stdout


def test_a_stop_signal_to_every_process_of_the_service_charges_no_attempt(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner following the queue, a python job and a command job running
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    pidfile, cmd_pid = tmp_path / "py.pid", tmp_path / "cmd.pid"
    manifest = write_manifest([
        {**py_job("py", "sleep_then_write", s=600, pidfile=str(pidfile)), "max_attempts": 1},
        {"id": "cmd", "kind": "command", "max_attempts": 1, "output": "cmd.bin",
         "argv": ["sh", "-c", 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; sleep 600; : > "$0"',
                  "{output}", str(cmd_pid)]},
    ])
    runner = Runner(*cli_args(queue, out, "--workers", "2", "--follow", "--json"),
                    new_session=True)
    try:
        runner.until(lambda ln: '"runner_started"' in ln)
        assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
        wait_for_pid(pidfile)
        # (its `started` event comes before its worker starts the command: a SIGTERM sent
        # then missed the command, which ran on through the 30 s grace)
        wait_for_pid(cmd_pid)

        # When SIGTERM reaches every process of the service at once, the runner's workers
        # and their jobs too (systemd's default stop, KillMode=control-group)
        term_whole_service(runner.pid)

        # Then the run stops as on SIGTERM, and the jobs go back to pending uncharged, as
        # stopping the runner promises: not dead-lettered as crashes nobody sent
        assert runner.wait(30) == ExitCode.SIGTERM, runner.lines
    finally:
        runner.close()
    view = QueueView(queue)
    assert view.states_of(["py", "cmd"]) == {"py": ["pending"], "cmd": ["pending"]}
    for job in ("py", "cmd"):
        assert [a["outcome"] for a in view.record("pending", job)["attempts"]] == ["released"]


def test_a_job_that_handles_the_services_stop_signal_and_exits_is_not_charged(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner following the queue, running a python job (one attempt) that handles
    # SIGTERM itself by exiting with status 3, as a job that cleans up when told to stop does
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    pidfile = tmp_path / "py.pid"
    manifest = write_manifest([{**py_job("py", "exit_on_sigterm", pidfile=str(pidfile)),
                                "max_attempts": 1}])
    runner = Runner(*cli_args(queue, out, "--workers", "1", "--follow", "--json"),
                    new_session=True)
    try:
        runner.until(lambda ln: '"runner_started"' in ln)
        assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
        wait_for_pid(pidfile)

        # When SIGTERM reaches every process of the service at once (KillMode=control-group)
        term_whole_service(runner.pid)

        # Then the job, stopped with the runner, goes back to pending uncharged, as it does
        # when the signal kills it: not dead-lettered for the failure the signal made it report
        assert runner.wait(30) == ExitCode.SIGTERM, runner.lines
    finally:
        runner.close()
    view = QueueView(queue)
    assert view.states_of(["py"]) == {"py": ["pending"]}
    assert [a["outcome"] for a in view.record("pending", "py")["attempts"]] == ["released"]


def test_a_jobs_answer_to_the_stop_read_after_the_runners_own_is_not_charged(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner running a python job (one attempt) that exits 3 on SIGTERM
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    pidfile, said = tmp_path / "py.pid", tmp_path / "said"
    manifest = write_manifest([{**py_job("py", "exit_on_sigterm_saying_so",
                                         pidfile=str(pidfile), said=str(said)),
                                "max_attempts": 1}])
    runner = Runner(*cli_args(queue, out, "--workers", "1", "--follow", "--json"),
                    new_session=True)
    try:
        runner.until(lambda ln: '"runner_started"' in ln)
        assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
        worker = wait_for_pid(pidfile)

        # When the service's SIGTERM reaches the runner first, but the job answers (and its
        # worker reports the failure) before the runner runs at all (a loaded machine: the
        # runner held stopped here until then)
        os.kill(runner.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(runner.pid), what="the runner to stop")
        os.kill(runner.pid, signal.SIGTERM)
        os.kill(worker, signal.SIGTERM)
        wait_until(lambda: said.exists(), what="the job to answer")
        wait_until(lambda: "unix_stream" in Path(f"/proc/{worker}/wchan").read_text(),
                   what="its worker to report and wait for more")
        os.kill(runner.pid, signal.SIGCONT)

        # Then the job is stopped with the runner, uncharged (by the worker's clock alone
        # it failed before the stop, and was dead-lettered)
        assert runner.wait(30) == ExitCode.SIGTERM, runner.lines
    finally:
        runner.close()
    view = QueueView(queue)
    assert view.states_of(["py"]) == {"py": ["pending"]}, runner.lines
    assert [a["outcome"] for a in view.record("pending", "py")["attempts"]] == ["released"]


def test_a_job_that_stops_its_own_service_every_time_is_charged_not_released_forever(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that stops the whole service it runs in (every process, its worker too,
    # as `systemctl restart` from a job does) each time it runs, allowed 2 attempts
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([{**py_job("restarter", "stop_the_service", "r.bin",
                                         queue=str(queue)), "max_attempts": 2}])
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0

    # When a supervisor restarts the runner after each stop (Restart=always), six times
    outcomes: list[str] = []
    for _ in range(6):
        runner = Runner(*cli_args(queue, out, "--workers", "1", "--backoff-base", "0.01"))
        try:
            assert runner.wait(60) == ExitCode.SIGTERM, runner.lines
        finally:
            runner.close()
        [state] = QueueView(queue).states_of(["restarter"])["restarter"]
        outcomes = [a["outcome"] for a in QueueView(queue).record(state, "restarter")["attempts"]]
        if state == "dead":
            break

    # Then the first stop is not charged (the service may have been stopped from outside),
    # but the job is not run uncharged forever either: it ends dead-lettered after its 2
    # charged attempts, every one recorded
    assert state == "dead", outcomes
    assert outcomes == ["released", "crashed", "crashed"], outcomes


def test_a_job_whose_output_folder_is_a_file_dead_letters_alone(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a file where one job's output folder must be, and a job with a good path
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    out.mkdir()
    (out / "sub").write_text("a file, not a folder")
    manifest = write_manifest([py_job("p1", "write_pdf", output="sub/p1.pdf"),
                               py_job("p2", "write_pdf", output="ok/p2.pdf")])

    # When they run
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then that job dead-letters as invalid_output, saying why; the other completes and
    # the run goes on (no I/O error stopping the queue); the file is untouched
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    view = QueueView(queue)
    assert view.states_of(["p1", "p2"]) == {"p1": ["dead"], "p2": ["done"]}
    attempt = view.record("dead", "p1")["attempts"][-1]
    assert attempt["outcome"] == "invalid_output"
    assert f"{out / 'sub'} is a file" in attempt["error"]
    assert_pdf(out / "ok" / "p2.pdf", "p2")
    assert (out / "sub").read_text() == "a file, not a folder"


@pytest.mark.parametrize("how", ["dangling symlink", "a file on its way"])
def test_an_output_root_that_cannot_be_made_halts_the_run_charging_nothing(
        tmp_path: Path, write_manifest: Any, how: str) -> None:
    # Given jobs submitted under an output root that is gone by the time they run: behind a
    # symlink to a mount that is not there, or under a folder replaced by a file
    stage(tmp_path)
    queue, mount = tmp_path / "q", tmp_path / "mnt"
    out = mount / "out"
    manifest = write_manifest([py_job("p1", "write_pdf", output="sub/p1.pdf"),
                               py_job("p2", "write_pdf")], defaults={"max_attempts": 1})
    res = run_cli("submit", manifest, *cli_args(queue, out))
    assert res.returncode == 0, res.stderr
    target = tmp_path / "not-mounted"
    if how == "dangling symlink":
        mount.symlink_to(target)
    else:
        mount.write_text("a file, not a folder")

    # When they run
    res = run_cli("run", "--queue", queue)

    # Then the run halts with 74 naming the root (every job would fail there: the root's
    # fault, as a read-only one's), and no job was charged or dead-lettered (all of them
    # were, as invalid_output, a whole batch to `dead retry`)
    assert res.returncode == ExitCode.IO_ERROR, res.stdout + res.stderr
    assert f"cannot write outputs: {out}: " in res.stderr, res.stderr
    view = QueueView(queue)
    assert view.states_of(["p1", "p2"]) == {"p1": ["pending"], "p2": ["pending"]}
    for jid in ("p1", "p2"):
        outcomes = [a["outcome"] for a in view.record("pending", jid).get("attempts", [])]
        assert set(outcomes) <= {"released"}, (jid, outcomes)

    # And once the root is there, the queue runs to completion
    if how == "dangling symlink":
        target.mkdir()
    else:
        mount.unlink()
    res = run_cli("run", "--queue", queue)
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert_pdf(out / "sub" / "p1.pdf", "p1")
    assert_pdf(out / "p2.pdf", "p2")


@pytest.mark.parametrize("into", ["elsewhere", "the queue"])
def test_a_folder_swapped_for_a_symlink_while_the_job_runs_gets_nothing(
        tmp_path: Path, write_manifest: Any, into: str) -> None:
    # Given a job running, its output folder checked and made when it was claimed (and, for
    # the second case, its queue inside the output root)
    stage(tmp_path)
    out = tmp_path / "out"
    queue = out / "q" if into == "the queue" else tmp_path / "q"
    pidfile, go = tmp_path / "job.pid", tmp_path / "go"
    manifest = write_manifest([py_job("s0", "wait_for_go", output="sub/s0.json",
                                      pidfile=str(pidfile), go=str(go))])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1"))
    target = queue / "done" if into == "the queue" else tmp_path / "elsewhere"
    try:
        wait_for_pid(pidfile, what="the job to start")
        target.mkdir(exist_ok=True)

        # When someone moves the folder away and puts in its place a symlink out of the
        # root, or to the queue's done/ folder, before the job writes its output
        (out / "sub").rename(out / "sub.old")
        (out / "sub").symlink_to(target)
        go.touch()

        # Then the output is not published through it: the job dead-letters
        # (invalid_output), and nothing of it is left there (in done/, it was published as
        # done/s0.json, then replaced by its own done record: audit DT)
        assert runner.wait(30) == ExitCode.JOBS_FAILED, runner.lines
    finally:
        runner.close()
    attempt = QueueView(queue).record("dead", "s0")["attempts"][-1]
    assert attempt["outcome"] == "invalid_output", attempt
    said = "inside the queue folder" if into == "the queue" else "outside the output root"
    assert said in attempt["error"], attempt
    assert list(target.iterdir()) == []


def test_an_output_led_into_the_queue_folder_after_submit_is_refused_before_it_runs(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a queue inside its output root, and a job whose output goes through qq/, which
    # does not exist when it is submitted (submit refuses an output in the queue folder)
    stage(tmp_path)
    out = tmp_path / "out"
    queue = out / "q"
    manifest = write_manifest([py_job("x", "write_pdf", "qq/done/x.json"),
                               py_job("fine", "write_pdf", "ok/y.pdf")])
    sub = run_cli("submit", manifest, *cli_args(queue, out))
    assert sub.returncode == 0, sub.stderr

    # When qq/ is then made a symlink to the queue folder, and the queue runs
    (out / "qq").symlink_to("q", target_is_directory=True)
    res = run_cli("run", *cli_args(queue, out, "--workers", "1"))

    # Then x is dead-lettered before it runs, and nothing of it is in the queue's folders
    # (it was published as done/x.json, then replaced by its own done record: audit DT)
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    attempt = QueueView(queue).record("dead", "x")["attempts"][-1]
    assert attempt["outcome"] == "invalid_output", attempt
    assert "inside the queue folder" in attempt["error"], attempt
    assert attempt.get("started_at") is None, attempt
    assert sorted(p.name for p in (queue / "done").iterdir()) == ["fine.json"]
    assert_pdf(out / "ok" / "y.pdf", "fine")


@pytest.mark.parametrize("mounted", ["", "done"], ids=["the-queue", "its-done-folder"])
def test_an_output_folder_that_is_the_queue_mounted_in_the_root_gets_nothing(
        tmp_path: Path, write_manifest: Any, mounted: str) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount")
    # Given a queue beside its output root, and a job whose output goes in qq/done/ (or
    # in qq/, done/ alone mounted there)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    output = "qq/x.json" if mounted else "qq/done/x.json"
    manifest = write_manifest([py_job("x", "write_pdf", output)])
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0

    # When the queue folder (or its done/) is bind-mounted at qq/ (its paths read as the
    # root's own, to realpath and /proc alike), and the queue runs
    (out / "qq").mkdir(parents=True)
    if subprocess.run(["mount", "--bind", str(queue / mounted), str(out / "qq")]
                      ).returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        res = run_cli("run", *cli_args(queue, out, "--workers", "1"))
    finally:
        subprocess.run(["umount", str(out / "qq")], check=True)

    # Then nothing is published there (x's PDF became done/x.json, then its done record
    # replaced it: review DX): x is dead, invalid_output, and no temporary stays
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    attempt = QueueView(queue).record("dead", "x")["attempts"][-1]
    assert attempt["outcome"] == "invalid_output", attempt
    assert "inside the queue folder" in attempt["error"], attempt
    assert list((queue / "done").iterdir()) == []


@pytest.mark.parametrize("point", ["locked", "shutdown", "released"])
def test_a_cancels_wake_up_while_the_runner_starts_or_stops_does_not_kill_it(
        tmp_path: Path, write_manifest: Any, point: str) -> None:
    from jobfns import wait_until

    # Given a runner frozen just after taking the queue's lock, or in its shutdown while it
    # still holds it: the moments `cancel` may find it without its SIGUSR1 handler
    stage(tmp_path)
    manifest = write_manifest([py_job("a", "write_pdf")])
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1"),
                    env={"RENDERCTL_STOP_AT": point})
    try:
        wait_until(lambda: stopped(runner.pid), what=f"the runner to freeze at {point}")

        # When the wake-up `cancel` sends arrives then
        code, stderr = _signal_frozen(runner, signal.SIGUSR1)

        # Then the run carries on and ends as it would have
        assert code == ExitCode.OK, (runner.lines, stderr)
    finally:
        runner.close()
    assert QueueView(queue).states_of(["a"]) == {"a": ["done"]}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM],
                         ids=lambda s: signal.Signals(s).name)
def test_a_stop_signal_repeated_while_the_runner_stops_still_ends_it_in_order(
        tmp_path: Path, write_manifest: Any, sig: int) -> None:
    from jobfns import wait_until

    # Given a --follow runner that has completed a job, was told to stop, has drained and
    # is frozen in its shutdown (the moment an impatient third Ctrl-C lands)
    stage(tmp_path)
    manifest = write_manifest([py_job("a", "write_pdf")])
    queue, out, prom = tmp_path / "q", tmp_path / "out", tmp_path / "metrics.prom"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--follow",
                                        "--metrics-textfile", str(prom)),
                    env={"RENDERCTL_STOP_AT": "shutdown"})
    try:
        completed_line = runner.until(lambda ln: ln.startswith("completed"))
        assert " a " in completed_line
        os.kill(runner.pid, sig)
        wait_until(lambda: stopped(runner.pid), what="the runner to freeze in its shutdown")

        # When the same signal comes again then
        code, stderr = _signal_frozen(runner, sig)

        # Then it still ends as a stopped run does: its summary, its metrics, exit 128 + n
        # (not killed by the signal halfway through saying what it did)
    finally:
        runner.close()
    assert code == 128 + sig, (runner.lines, stderr)
    assert runner.lines[-1].startswith("summary: done 1,"), runner.lines
    assert 'renderctl_jobs{state="done"} 1' in prom.read_text()  # its last write
    assert QueueView(queue).states_of(["a"]) == {"a": ["done"]}


# How `late` comes to wait, claimed, after `first` started: queued behind it in its one
# worker, or held back by the runner for want of memory (two workers, budget for one job).
WAITS = {
    "in its worker": (["--workers", "1", "--prefetch", "2"], {}),
    "for memory": (["--workers", "2", "--memory-budget", "400"], {"memory_mb": 300}),
}


@pytest.mark.parametrize("waits", list(WAITS))
def test_a_job_whose_deadline_passes_while_it_waits_to_start_expires_unrun(
        tmp_path: Path, write_manifest: Any, waits: str) -> None:
    import datetime as dt
    import time

    from jobfns import wait_for_pid, wait_until

    # Given `first` running until the test says go, and `late` submitted then, waiting to
    # start, claimed well before its deadline (4 s from its submit: not from the runner's
    # start, which a busy machine can make take seconds)
    args, limits = WAITS[waits]
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    pidfile, go = tmp_path / "first.pid", tmp_path / "go"
    manifest = write_manifest([
        {**py_job("first", "wait_for_go", pidfile=str(pidfile), go=str(go)), "priority": 10,
         **limits}])
    runner = Runner(manifest, *cli_args(queue, out, *args, "--json"))
    try:
        wait_for_pid(pidfile, what="first to start")
        deadline = time.time() + 4
        late = write_manifest([{**py_job("late", "write_pdf"), **limits, "deadline":
                                dt.datetime.fromtimestamp(deadline, dt.UTC).isoformat()}],
                              name="late.toml")
        assert run_cli("submit", late, *cli_args(queue, out)).returncode == 0
        wait_until(lambda: QueueView(queue).states_of(["late"]) == {"late": ["running"]},
                   what="late to be claimed")

        # When its deadline passes while it still waits, and only then it could start
        wait_until(lambda: time.time() > deadline + 0.1, timeout_s=10, what="the deadline")
        go.touch()

        # Then it expires without ever starting (DESIGN.md: not started by then -> expired)
        assert runner.wait() == ExitCode.JOBS_FAILED, runner.lines
    finally:
        runner.close()
    view = QueueView(queue)
    assert view.states_of(["first", "late"]) == {"first": ["done"], "late": ["expired"]}
    assert view.record("expired", "late")["reason"] == "deadline passed before it started"
    assert not any('"started"' in ln and '"late"' in ln for ln in runner.lines)
    assert any('"expired"' in ln and '"late"' in ln for ln in runner.lines)
    assert not (out / "late.pdf").exists()


def test_a_pending_job_expires_at_its_deadline_while_every_worker_is_busy(
        tmp_path: Path, write_manifest: Any) -> None:
    import datetime as dt
    import time

    from jobfns import wait_for_pid

    # Given the one worker busy with `first` until the test says go, and `late` submitted
    # then, pending behind it (not claimed: a worker holds one job of unmeasured length),
    # with a deadline 8 s away (counted from there, not from the runner's start, which a
    # busy machine can make take seconds; the submit can take over 3 s there too: at `-n 8`
    # on 2 cores the job had expired before the submit returned)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    pidfile, go = tmp_path / "first.pid", tmp_path / "go"
    manifest = write_manifest([py_job("first", "wait_for_go", pidfile=str(pidfile), go=str(go))])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--json"))
    try:
        wait_for_pid(pidfile, what="first to start")
        deadline = time.time() + 8
        late = write_manifest([{**py_job("late", "write_pdf"),
                                "deadline": dt.datetime.fromtimestamp(deadline, dt.UTC)
                                .isoformat()}], name="late.toml")
        sub = run_cli("submit", late, *cli_args(queue, out))
        assert sub.returncode == 0, sub.stderr
        assert QueueView(queue).states_of(["late"]) == {"late": ["pending"]}

        # When its deadline passes while `first` still runs
        line = runner.until(lambda ln: '"expired"' in ln and '"late"' in ln, timeout_s=20)

        # Then it is expired then, not when a worker would have come free for it (before:
        # it stayed pending, in `status` and to `wait`, until `first` ended)
        assert time.time() >= deadline and not go.exists()
        assert json.loads(line)["job"] == "late"
        assert QueueView(queue).states_of(["late"]) == {"late": ["expired"]}
        go.touch()
        assert runner.wait() == ExitCode.JOBS_FAILED, runner.lines
    finally:
        go.touch()
        runner.close()
    view = QueueView(queue)
    assert view.states_of(["first", "late"]) == {"first": ["done"], "late": ["expired"]}
    assert view.record("expired", "late")["reason"] == "deadline passed before it started"
    assert not (out / "late.pdf").exists()


def test_a_run_on_a_terminal_that_closes_drains_and_exits_129(
        tmp_path: Path, write_manifest: Any) -> None:
    import pty
    import select

    from jobfns import RENDERCTL, _env

    # Given `renderctl run` drawing its dashboard on a terminal, two jobs running
    stage(tmp_path)
    pids = [tmp_path / f"j{n}.pid" for n in range(2)]
    manifest = write_manifest([py_job(f"j{n}", "sleep_then_write", s=2.0, pidfile=str(p))
                               for n, p in enumerate(pids)])
    queue, out = tmp_path / "q", tmp_path / "out"
    env = {k: v for k, v in _env(None).items() if k != "NO_COLOR"}
    env["TERM"] = "xterm"
    stderr = tmp_path / "stderr.txt"
    pid, master = pty.fork()
    if pid == 0:  # the child: stderr to a file, so that only the dashboard is on the tty
        try:
            fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 2)
            os.execvpe(RENDERCTL[0], [*RENDERCTL, "run", str(manifest),
                                      *cli_args(queue, out, "--workers", "2")], env)
        finally:
            os._exit(127)
    try:
        drained = bytearray()
        for p in pids:  # reading the terminal meanwhile, so the dashboard never blocks
            while not p.exists():
                if select.select([master], [], [], 0.05)[0]:
                    drained += os.read(master, 65536)

        # When the terminal goes away (its window closed: SIGHUP, then EIO on every write)
        os.close(master)
        _, status = os.waitpid(pid, 0)
    finally:
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)

    # Then the runner drains like on SIGTERM and exits 129; nothing is lost or charged
    assert os.waitstatus_to_exitcode(status) == ExitCode.SIGHUP, stderr.read_text()
    assert "Traceback" not in stderr.read_text()
    view = QueueView(queue)
    assert view.states_of(["j0", "j1"]) == {"j0": ["done"], "j1": ["done"]}
    for j in ("j0", "j1"):
        assert [a["outcome"] for a in view.record("done", j)["attempts"]] == ["completed"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT],
                         ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("point", ["submit:parsed", "submit:checked"])
def test_a_stop_signal_while_run_submits_ends_it_in_order(
        tmp_path: Path, write_manifest: Any, point: str, sig: int) -> None:
    from jobfns import wait_until

    # Given `run MANIFEST` frozen before its submit's commit point, or just past it
    stage(tmp_path)
    manifest = write_manifest([py_job(f"j{n}", "write_pdf") for n in range(3)])
    queue, out, tmpdir = tmp_path / "q", tmp_path / "out", tmp_path / "tmpdir"
    tmpdir.mkdir()
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1"),
                    env={"RENDERCTL_STOP_AT": point, "TMPDIR": str(tmpdir)})
    try:
        wait_until(lambda: stopped(runner.pid), what=f"the run to freeze at {point}")

        # When a stop signal arrives then (before the runner's own handlers exist)
        code, stderr = _signal_frozen(runner, sig)

        # Then it exits as a stopped run does, saying what became of the jobs, having run
        # none of them: nothing enqueued before the commit point, all pending after it
    finally:
        runner.close()
    assert code == 128 + sig, (runner.lines, stderr)
    assert "Traceback" not in stderr
    view = QueueView(queue)
    if point == "submit:parsed":
        assert f"stopped by {signal.Signals(sig).name} before submitting; nothing was " \
               "enqueued" in stderr
        assert view.all_ids() == set()
    else:
        assert runner.lines[0] == "accepted 3 job(s)", runner.lines
        assert runner.lines[-1].startswith("summary: done 0,") and \
            runner.lines[-1].endswith(f"exit {128 + sig}"), runner.lines
        assert view.ids("pending") == {"j0", "j1", "j2"} and view.all_ids() == view.ids("pending")
        assert all(view.record("pending", j)["attempts"] == [] for j in ("j0", "j1", "j2"))
    assert not out.exists() or not any(out.iterdir())
    assert list(tmpdir.iterdir()) == []  # multiprocessing's folder went with a clean exit


@pytest.mark.parametrize("kind", ["python", "command"])
def test_a_symlink_planted_at_the_outputs_temporary_name_is_never_written_through(
        tmp_path: Path, write_manifest: Any, kind: str) -> None:
    from renderctl.publish import tmp_output_path

    # Given a job running whose output folder someone else can write to, and a file
    # outside the output root (run as root from cron: /etc/shadow)
    stage(tmp_path)
    queue, out, victim = tmp_path / "q", tmp_path / "out", tmp_path / "victim"
    victim.write_text("precious")
    pidfile, go = tmp_path / "job.pid", tmp_path / "go"
    if kind == "python":
        job = py_job("s0", "wait_for_go", output="sub/s0.pdf", pidfile=str(pidfile), go=str(go))
    else:
        pdf = tmp_path / "in.pdf"
        from jobfns import _pdf
        _pdf(pdf, "s0")
        job = {"id": "s0", "kind": "command", "output": "sub/s0.pdf", "input": str(pdf),
               "argv": ["sh", "-c", 'echo $$ > "$2"; while [ ! -e "$3" ]; do sleep 0.01; done;'
                        ' cat "$0" > "$1"', "{input}", "{output}", str(pidfile), str(go)]}
    (out / "sub").mkdir(parents=True)
    (out / "sub").chmod(0o777)  # (a shared drop folder; renderctl runs as root here)
    runner = Runner(write_manifest([job]), *cli_args(queue, out, "--workers", "1"))
    try:
        wait_for_pid(pidfile, what="the job to start")

        # When that someone plants a symlink out of the root at the name of the job's
        # temporary output, before the job writes it (the name is predictable: the hash of
        # the runner's pid and start time, the job id, the attempt and the claim's ms)
        view = Queue(queue).find("s0")
        assert view is not None and view.record.lease is not None
        tmp = tmp_output_path(out / "sub" / "s0.pdf", "s0", view.record.lease.token)
        tmp.symlink_to(victim)
        go.touch()

        # Then the file outside the root is untouched, and the job's output is published
        assert runner.wait(30) in (ExitCode.OK, ExitCode.JOBS_FAILED), runner.lines
    finally:
        runner.close()
    assert victim.read_text() == "precious"
    assert_pdf(out / "sub" / "s0.pdf", "s0")


def test_a_job_whose_child_process_writes_its_output_completes(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given jobs that hand their output path to a child process, which closes inherited
    # descriptors (subprocess's default): a python job, and a command job running a script
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    pdf = tmp_path / "in.pdf"
    from jobfns import _pdf
    _pdf(pdf, "copied")
    copy = ("import subprocess, sys; "
            "subprocess.run(['cp', sys.argv[1], sys.argv[2]], check=True)")
    jobs = [{**py_job("py", "copy_via_child"), "inputs": [str(pdf)]},
            {"id": "cmd", "kind": "command", "inputs": [str(pdf)], "output": "cmd.pdf",
             "argv": [sys.executable, "-c", copy, "{input}", "{output}"]}]
    # When they run in an output folder only the runner's user can write
    res = run_cli("run", write_manifest(jobs), *cli_args(queue, out, "--workers", "1"))
    # Then both complete (the path they were given is one any process can open)
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert_pdf(out / "py.pdf", "copied")
    assert_pdf(out / "cmd.pdf", "copied")


def test_a_child_that_cannot_write_a_shared_folders_output_is_told_what_to_do(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a python job whose child process (which closes inherited descriptors) writes its
    # output, in an output folder others can write to (the job gets /proc/self/fd/N/...)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    (out / "shared").mkdir(parents=True)
    (out / "shared").chmod(0o1777)
    pdf = tmp_path / "in.pdf"
    from jobfns import _pdf
    _pdf(pdf, "copied")
    job = {**py_job("py", "copy_via_child", output="shared/py.pdf"), "inputs": [str(pdf)],
           "max_attempts": 1}
    # (and a command, which inherits the descriptor, failing for its own reason as it
    # names the path: review FZ)
    cmd = {"id": "cmd", "kind": "command", "output": "shared/cmd.pdf", "max_attempts": 1,
           "argv": ["sh", "-c", 'echo "$0: No such file or directory" >&2; exit 3',
                    "{output}"]}

    # When they run
    res = run_cli("run", write_manifest([job, cmd]), *cli_args(queue, out, "--workers", "1"))

    # Then the python job fails as README says it must, its error saying why and what to
    # do (it said only that cp could not create /proc/self/fd/17/py.pdf: audit FV); the
    # command's error is its own
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    view = QueueView(queue)
    error = view.record("dead", "py")["attempts"][-1]["error"]
    assert "in a shared output folder: a process the job starts must inherit that " \
           "descriptor" in error and "pass_fds" in error, error
    assert "shared output folder" not in view.record("dead", "cmd")["attempts"][-1]["error"]


def test_a_folder_swapped_for_a_symlink_after_the_check_gets_no_folders_made_outside(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import wait_until

    # Given a job whose output goes to a folder not made yet, under a folder of a shared
    # output root, and a runner frozen between confining that path and making its folders
    stage(tmp_path)
    queue, out, outside = tmp_path / "q", tmp_path / "out", tmp_path / "outside"
    (out / "drop").mkdir(parents=True)
    outside.mkdir()
    runner = Runner(write_manifest([py_job("j", "write_pdf", output="drop/new/j.pdf")]),
                    *cli_args(queue, out, "--workers", "1", "--json"),
                    env={"RENDERCTL_STOP_AT": "folders"})
    try:
        wait_until(lambda: stopped(runner.pid), what="the runner to freeze")
        # When someone who can write in the root swaps that folder for a symlink out of it
        (out / "drop").rename(out / "was-drop")
        (out / "drop").symlink_to(outside)
        os.kill(runner.pid, signal.SIGCONT)

        # Then nothing is made out there (run as root: any folder, /etc/nologin say), and
        # the job fails as an output path out of the root
        assert runner.wait(60) == ExitCode.JOBS_FAILED, runner.lines
    finally:
        runner.close()
    assert list(outside.iterdir()) == []
    assert QueueView(queue).states_of(["j"]) == {"j": ["dead"]}


def test_a_run_whose_output_pipe_nobody_reads_still_supervises_its_jobs(
        tmp_path: Path, write_manifest: Any) -> None:
    import subprocess

    from jobfns import RENDERCTL, _env

    # Given a run of 800 quick jobs and one of one attempt that would take 30 s but has a
    # 2 s timeout, whose stdout is a pipe nobody reads for now (`| less` not scrolled):
    # its lines soon fill the pipe
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    quick = [py_job(f"q{i:03d}", "write_one_byte", output=f"q/{i}.bin") for i in range(800)]
    slow = {**py_job("slow", "sleep_then_write", s=30, pidfile=str(tmp_path / "slow.pid")),
            "timeout_s": 2, "max_attempts": 1}
    proc = subprocess.Popen([*RENDERCTL, "run", str(write_manifest([slow, *quick])),
                             *cli_args(queue, out, "--workers", "2")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(None))
    try:
        # Then it still runs every job, and kills the slow one at its timeout (before: its
        # loop waited in a write for the reader, and with it every job's supervision)
        view = QueueView(queue)
        wait_until(lambda: "slow" in view.ids("dead") and len(view.ids("done")) == 800,
                   timeout_s=60, what="every job to end while nobody reads the output")
        # And once the reader comes, it gets every line, in order, and the summary
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = stdout.decode().splitlines()
    assert proc.returncode == 1, lines[-3:]
    assert sum(ln.startswith("completed q") for ln in lines) == 800
    assert [ln.split()[1] for ln in lines if ln.startswith("dead ")] == ["slow"]
    assert lines[-1].startswith("summary: done 800, dead 1"), lines[-3:]
    attempts = view.record("dead", "slow")["attempts"]
    assert [a["outcome"] for a in attempts] == ["timeout"], attempts


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_run_waiting_at_its_end_for_a_stalled_reader_stops_on_a_signal(
        tmp_path: Path, write_manifest: Any, sig: signal.Signals) -> None:
    import subprocess

    from jobfns import RENDERCTL, _env

    # Given a run of 400 quick jobs whose stdout is a pipe nobody reads (a consumer hung):
    # its JSON lines fill the pipe, and once the jobs are done it waits for the reader
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    quick = [py_job(f"q{i:03d}", "write_one_byte", output=f"q/{i}.bin") for i in range(400)]
    proc = subprocess.Popen([*RENDERCTL, "run", str(write_manifest(quick)),
                             *cli_args(queue, out, "--workers", "2", "--json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(None))
    try:
        view = QueueView(queue)
        wait_until(lambda: len(view.ids("done")) == 400 and not view.ids("running"),
                   timeout_s=60, what="every job to end while nobody reads the output")
        wait_until(lambda: json.loads(run_cli("status", "--json", "--queue", queue).stdout)[
            "runner"] is None, what="the runner to let the queue go")

        # When it is sent a stop signal
        proc.send_signal(sig)

        # Then it drops the lines its reader has not taken, says so, and exits 128+signal
        # (it went on waiting: only SIGKILL ended it)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == 128 + sig, err.decode()
    assert "they were dropped" in err.decode(), err.decode()
    assert len(view.ids("done")) == 400


@pytest.mark.parametrize("fmt", ["plain", "json", "quiet"])
def test_a_run_whose_stdout_cannot_be_written_still_runs_every_job(
        tmp_path: Path, write_manifest: Any, fmt: str) -> None:
    import subprocess

    from jobfns import RENDERCTL, _env

    # Given a run whose stdout is a file on a full disk (/dev/full: every write fails
    # with ENOSPC), plain lines or JSON Lines, or --quiet (its summary is the first line)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    ids = ["a", "b", "c"]
    with open("/dev/full", "w") as full:
        res = subprocess.run([*RENDERCTL, "run", str(write_manifest([py_job(j, "write_pdf")
                                                                     for j in ids])),
                              *cli_args(queue, out, "--workers", "2"),
                              *{"json": ["--json"], "quiet": ["--quiet"]}.get(fmt, [])],
                             stdout=full, stderr=subprocess.PIPE, text=True, env=_env(None),
                             timeout=120)

    # Then every job still runs, once (before: the first line's error ended the run, the
    # jobs left pending; mid-run, the running ones were left to be charged `crashed`), and
    # the run says once that its lines are lost, and exits 74 (an I/O error)
    assert res.returncode == ExitCode.IO_ERROR, res.stderr
    assert res.stderr.count("warning: cannot write stdout (") == 1, res.stderr
    assert "stdout could not be written (" in res.stderr, res.stderr
    view = QueueView(queue)
    assert view.ids("done") == set(ids)
    for j in ids:
        assert [a["outcome"] for a in view.record("done", j)["attempts"]] == ["completed"]
        assert_pdf(out / f"{j}.pdf", j)
