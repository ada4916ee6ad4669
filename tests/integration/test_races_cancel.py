"""`cancel`, `submit --replace`, `dead purge` and expiry racing each other and the runner:
whatever the interleaving, a job is in exactly one folder, and what each command reported
holds. Each race is arranged with RENDERCTL_STOP_AT (a real process frozen at a named point)
or RENDERCTL_CRASH_AT (SIGKILL there), never hoped for with sleeps."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from jobfns import (
    RENDERCTL,
    QueueView,
    Runner,
    _env,
    assert_pdf,
    cli_args,
    held_job,
    json_lines,
    py_job,
    run_cli,
    stage,
    stopped,
    wait_for_pid,
    wait_until,
    waiting_for_a_lock,
)

from renderctl.errors import ExitCode

PAST = "2020-01-01T00:00:00Z"


def _frozen(args: list[str], point: str) -> subprocess.Popen[str]:
    """``renderctl ARGS`` started and frozen (SIGSTOP) at ``point``."""
    proc = subprocess.Popen([*RENDERCTL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env({"RENDERCTL_STOP_AT": point}))
    wait_until(lambda: proc.poll() is not None or stopped(proc.pid),
               what=f"{args[0]} to freeze at {point}")
    assert proc.poll() is None, proc.communicate()
    return proc


def _exited_or_waiting_for_a_lock(proc: subprocess.Popen[str]) -> bool:
    if proc.poll() is not None:
        return True
    return waiting_for_a_lock(proc.pid)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_a_job_expiring_as_it_is_claimed_and_cancelled_ends_in_one_folder(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given x, past its deadline and first in line, and y; the runner frozen right after it
    # claimed y, x's expiry already decided but not yet written
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([{**py_job("x", "write_pdf"), "priority": 10, "deadline": PAST},
                               py_job("y", "write_pdf")])
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
    runner = Runner(*cli_args(queue, out, "--workers", "1", "--json"),
                    env={"RENDERCTL_STOP_AT": "claim"})
    try:
        wait_until(lambda: stopped(runner.pid), what="the runner to freeze in its claim")

        # When the user cancels x meanwhile, and the runner goes on
        res = run_cli("cancel", "x", "--json", "--queue", queue)
        assert res.returncode == 0, res.stdout + res.stderr
        os.kill(runner.pid, signal.SIGCONT)
        assert runner.wait() == ExitCode.JOBS_FAILED, runner.lines
    finally:
        runner.close()

    # Then x is expired (it was claimed first) and nowhere else; no request is left over
    view = QueueView(queue)
    assert view.states_of(["x", "y"]) == {"x": ["expired"], "y": ["done"]}
    assert view.record("expired", "x")["reason"] == "deadline passed before it started"
    assert not list((queue / "control").glob("cancel.*"))
    assert not (out / "x.pdf").exists()
    assert_pdf(out / "y.pdf", "y")


def test_a_runner_killed_while_expiring_a_job_expires_it_after_a_restart(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job past its deadline, and a runner SIGKILLed once it took the job out of
    # pending/ to expire it, before it wrote the expired record
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([{**py_job("x", "write_pdf"), "deadline": PAST}])
    killed = run_cli("run", manifest, *cli_args(queue, out),
                     env={"RENDERCTL_CRASH_AT": "claim:expiring"})
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert QueueView(queue).states_of(["x"]) == {"x": ["running"]}

    # When a runner starts again
    res = run_cli("run", *cli_args(queue, out))

    # Then the job is expired, once, never run
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    view = QueueView(queue)
    assert view.states_of(["x"]) == {"x": ["expired"]}
    assert view.record("expired", "x")["attempts"] == []
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("before", ["pending", "cancelled"])
def test_a_cancel_racing_a_replace_cancels_the_new_job_in_one_folder(
        tmp_path: Path, write_manifest: Any, before: str) -> None:
    # Given x pending or already cancelled (v1); `cancel x` that has opened the queue,
    # frozen just before it acts; and `submit --replace x` (v2) frozen once it has checked
    # x and written v2's record, before placing it
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    v1 = write_manifest([py_job("x", "write_pdf", output="x1.pdf")], name="v1.toml")
    v2 = write_manifest([py_job("x", "write_pdf", output="x2.pdf")], name="v2.toml")
    assert run_cli("submit", v1, *cli_args(queue, out)).returncode == 0
    if before == "cancelled":
        assert run_cli("cancel", "x", "--queue", queue).returncode == 0
    cancel = _frozen(["cancel", "x", "--json", "--queue", str(queue)], "cancel:before")
    replace = _frozen(["submit", str(v2), "--replace", *cli_args(queue, out)], "submit:staged")
    try:
        # When the cancel goes on in the middle of the replace (it waits for the replace,
        # or it is done), then the replace
        os.kill(cancel.pid, signal.SIGCONT)
        wait_until(lambda: _exited_or_waiting_for_a_lock(cancel),
                   what="the cancel to finish or wait")
        rc_r, _, err_r = _finish(replace)
        rc_c, out_c, err_c = _finish(cancel)
    finally:
        for p in (cancel, replace):
            if p.poll() is None:
                p.kill()

    # Then both succeed, the cancel never finds x missing and what it reports holds: it
    # cancelled x as replaced (v2), which is in one folder
    assert rc_r == 0, err_r
    assert rc_c == 0, out_c + err_c
    assert '"cancelled"' in out_c, out_c
    view = QueueView(queue)
    assert view.states_of(["x"]) == {"x": ["cancelled"]}
    assert view.record("cancelled", "x")["spec"]["output"].endswith("x2.pdf")


def test_a_replace_killed_after_placing_the_new_job_leaves_one_copy(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given x completed (v1), and `submit --replace x` (v2) SIGKILLed after it placed v2 in
    # pending/ but before it dropped the old done record
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    v1 = write_manifest([py_job("x", "write_pdf", output="x1.pdf")], name="v1.toml")
    v2 = write_manifest([py_job("x", "write_pdf", output="x2.pdf")], name="v2.toml")
    assert run_cli("run", v1, *cli_args(queue, out)).returncode == 0
    killed = run_cli("submit", v2, "--replace", *cli_args(queue, out),
                     env={"RENDERCTL_CRASH_AT": "submit:placed"})
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr

    # When the queue is next opened (by anything: here `status`), and then run
    assert run_cli("status", "--queue", queue).returncode == 0
    view = QueueView(queue)
    assert view.states_of(["x"]) == {"x": ["pending"]}
    res = run_cli("run", *cli_args(queue, out))

    # Then v2 runs, once, and x is done as v2
    assert res.returncode == 0, res.stdout + res.stderr
    assert view.states_of(["x"]) == {"x": ["done"]}
    assert view.record("done", "x")["spec"]["output"].endswith("x2.pdf")
    assert_pdf(out / "x2.pdf", "x")


def test_a_cancel_during_the_grace_stops_the_running_job(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner draining after SIGTERM, with a long grace, its one job still running
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    pidfile = tmp_path / "x.pid"
    manifest = write_manifest([py_job("x", "sleep_then_write", s=600, pidfile=str(pidfile))])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--grace", "600",
                                        "--json"))
    try:
        wait_for_pid(pidfile)
        runner.proc.send_signal(signal.SIGTERM)
        runner.until(lambda ln: '"stopping"' in ln)

        # When the user cancels the job
        res = run_cli("cancel", "x", "--queue", queue)
        assert res.returncode == 0, res.stdout + res.stderr

        # Then the runner kills it now (not 10 minutes later) and exits
        assert runner.wait(60) == ExitCode.SIGTERM, runner.lines
    finally:
        runner.close()
    view = QueueView(queue)
    assert view.states_of(["x"]) == {"x": ["cancelled"]}
    assert [a["outcome"] for a in view.record("cancelled", "x")["attempts"]] == ["cancelled"]
    assert not list((queue / "control").glob("cancel.*"))
    assert not (out / "x.pdf").exists()


@pytest.mark.parametrize("purge_argv", [
    ["dead", "purge"],
    ["prune", "--older-than", "0s", "--state", "dead"],
], ids=["dead-purge", "prune"])
def test_a_purge_racing_a_retry_never_drops_the_job_the_retry_reported(
        tmp_path: Path, write_manifest: Any, purge_argv: list[str]) -> None:
    # Given dead x, and `dead retry x` frozen after rewriting its record, before moving it
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([{**py_job("x", "fail"), "max_attempts": 1}])
    assert run_cli("run", manifest, *cli_args(queue, out)).returncode == ExitCode.JOBS_FAILED
    retry = _frozen(["dead", "retry", "x", "--queue", str(queue)],
                    "dead_retry:rewritten")
    try:
        # When `dead purge` (or a prune of dead records) runs meanwhile (it waits for the
        # retry, or it is done)
        purge = subprocess.Popen([*RENDERCTL, *purge_argv, "--queue", str(queue)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=_env(None))
        wait_until(lambda: _exited_or_waiting_for_a_lock(purge),  # type: ignore[arg-type]
                   what="the purge to finish or wait")
        rc, out_r, err = _finish(retry)
        _, purge_err = purge.communicate(timeout=60)
    finally:
        for p in (retry, purge):
            if p.poll() is None:
                p.kill()

    # Then the retry's report holds: x is pending, and nothing else happened to it
    assert rc == 0, err
    assert "retried 1 job(s)" in out_r
    assert purge.returncode == 0, purge_err
    assert QueueView(queue).states_of(["x"]) == {"x": ["pending"]}


def test_a_cancel_arriving_as_max_failures_halts_the_run_is_kept(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a run with --max-failures 1 where `big` is claimed but held back (the memory
    # budget is taken by the two running jobs), frozen as it records the first dead job
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([
        {**py_job("bad", "fail"), "memory_mb": 100, "max_attempts": 1, "priority": 10},
        {**py_job("slow", "sleep_then_write", s=2), "memory_mb": 400, "priority": 9},
        {**py_job("big", "write_pdf"), "memory_mb": 400, "priority": 8},
    ])
    runner = _frozen(["run", manifest, *cli_args(queue, out, "--workers", "2",
                                                  "--memory-budget", "600",
                                                  "--max-failures", "1")], "dead")
    try:
        # When `big` is cancelled meanwhile (the request waits for the runner), and the run
        # goes on: it handles the request, then halts
        res = run_cli("cancel", "big", "--queue", queue)
        assert res.returncode == 0, res.stdout + res.stderr
        rc, _, err = _finish(runner)
    finally:
        if runner.poll() is None:
            runner.kill()

    # Then big is cancelled, not returned to pending to run later, and no request is left
    assert rc == 1, err
    assert QueueView(queue).states_of(["bad", "big"]) == {"bad": ["dead"], "big": ["cancelled"]}
    assert not list((queue / "control").glob("cancel.*"))


def test_a_job_whose_cancel_was_requested_before_it_started_never_publishes(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given one worker running a job the test holds, with b queued behind it, and c pending
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    pidfile, go = tmp_path / "a.pid", tmp_path / "go"
    manifest = write_manifest([
        {**py_job("a", "wait_for_go", pidfile=str(pidfile), go=str(go)), "priority": 3},
        {**py_job("b", "write_pdf"), "priority": 2},
        {**py_job("c", "write_pdf"), "priority": 1},
    ])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--prefetch", "2",
                                        "--json"))
    try:
        wait_for_pid(pidfile)
        view = QueueView(queue)
        wait_until(lambda: "b" in view.ids("running"), what="b to be claimed")

        # When `cancel b c` has asked for b (a runner's job) and is frozen before c, and the
        # job ahead of b ends at once (the runner may not have acted on the request yet)
        cancel = _frozen(["cancel", "b", "c", "--queue", str(queue)], "cancel:before:n=2")
        go.touch()
        wait_until(lambda: "a" in view.ids("done"), what="a to complete")
        code, stdout, stderr = _finish(cancel)
        assert code == 0, stdout + stderr

        # Then b ends cancelled and is never published, and the rest of the run goes on
        assert runner.wait(60) == ExitCode.JOBS_FAILED, runner.lines
    finally:
        runner.close()
    states = view.states_of(["a", "b", "c"])
    assert states.pop("c") in (["done"], ["cancelled"])  # c raced its own cancel: either
    assert states == {"a": ["done"], "b": ["cancelled"]}
    assert not (out / "b.pdf").exists()
    assert [a["outcome"] for a in view.record("cancelled", "b")["attempts"]] in ([], ["cancelled"])
    assert not any('"completed"' in ln and '"b"' in ln for ln in runner.lines)


def test_a_cancel_meeting_a_job_its_worker_just_started_records_the_attempt(
        tmp_path: Path, write_manifest: Any) -> None:
    import psutil

    # Given a --follow runner whose worker has started b (its gate passed, its start
    # logged) and is frozen before telling the runner
    queue, out = tmp_path / "q", tmp_path / "out"
    b, go = held_job(tmp_path, "b")
    runner = Runner(write_manifest([b]), *cli_args(queue, out, "--workers", "1", "--follow",
                                                   "--json"),
                    env={"RENDERCTL_STOP_AT": "worker:starting"})
    worker: list[psutil.Process] = []
    try:
        def frozen_worker() -> bool:
            worker[:] = [p for p in psutil.Process(runner.pid).children(recursive=True)
                         if stopped(p.pid)]
            return bool(worker)

        wait_until(frozen_worker, what="the worker to freeze as b starts")

        # When b is cancelled, the runner acts on it, and the worker goes on
        res = run_cli("cancel", "b", "--queue", queue)
        assert res.returncode == 0, res.stdout + res.stderr
        wait_until(lambda: not list((queue / "control").glob("cancel*")),
                   what="the runner to take the request")
        worker[0].resume()
        view = QueueView(queue)
        wait_until(lambda: "b" in view.ids("cancelled"), what="b to be cancelled")
        wait_until(lambda: not list(out.glob(".rctl-*")), what="b's temporary to go")
    finally:
        go.touch()
        for p in worker:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()
        runner.close()

    # Then b's record has the attempt its worker started, cancelled as it ran (it said
    # "cancelled before it started", no attempt, and the job ran on: audit DM)
    attempts = view.record("cancelled", "b")["attempts"]
    assert [a["outcome"] for a in attempts] == ["cancelled"], attempts
    assert not (out / "b.pdf").exists()


@pytest.mark.parametrize("listing", range(1, 9))
def test_a_resubmit_finds_the_jobs_a_runner_finishes_while_it_looks(
        tmp_path: Path, write_manifest: Any, listing: int) -> None:
    # Given 65 jobs accepted, pending (more than a submit looks up one by one: it lists the
    # queue's folders instead)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    ids = [f"j{n:02d}" for n in range(65)]
    manifest = write_manifest([py_job(j, "write_one_byte", f"{j}.bin") for j in ids])
    res = run_cli("submit", manifest, *cli_args(queue, out))
    assert res.returncode == 0, res.stdout + res.stderr

    # When the manifest is submitted again (cron, say), and a runner claims and finishes
    # every job while that submit is frozen after one of its folder listings
    resubmit = _frozen(["submit", str(manifest), *cli_args(queue, out), "--json"],
                       f"submit:listed:n={listing}")
    res = run_cli("run", *cli_args(queue, out))
    assert res.returncode == 0, res.stdout + res.stderr
    code, stdout, stderr = _finish(resubmit)

    # Then it accepts none of them anew (it accepted jobs it had just missed in both
    # pending/ and running/, to run twice beside their done records): each is already
    # accepted, done once
    assert code == 0, stdout + stderr
    doc = json.loads(stdout)
    assert (doc["accepted"], sorted(doc["already_accepted"])) == ([], ids), doc
    view = QueueView(queue)
    assert view.ids("done") == set(ids) and view.ids("pending") == set()


def test_a_cancel_left_unapplied_when_a_job_was_dead_lettered_does_not_cancel_its_retry(
        tmp_path: Path, write_manifest: Any) -> None:
    from renderctl.store import Queue

    # Given x dead-lettered (its cause since fixed), and a cancel asked of it while it ran
    # that its runner never applied (it recorded x dead, then stopped, first): the request
    # `renderctl cancel` writes, left in the queue
    stage(tmp_path)
    queue, out, fixed = tmp_path / "q", tmp_path / "out", tmp_path / "fixed"
    manifest = write_manifest([{**py_job("x", "fail_until_marker", marker=str(fixed)),
                                "max_attempts": 1}])
    res = run_cli("run", manifest, *cli_args(queue, out))
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    Queue(queue).request_cancel("x")
    fixed.touch()

    # When it is retried from dead/ and the queue run again
    res = run_cli("dead", "retry", "x", "--queue", queue)
    assert res.returncode == 0, res.stdout + res.stderr
    res = run_cli("run", *cli_args(queue, out))

    # Then it runs and completes (the old request cancelled it as the runner started)
    assert res.returncode == 0, res.stdout + res.stderr
    assert QueueView(queue).states_of(["x"]) == {"x": ["done"]}
    assert_pdf(out / "x.pdf", "x")


def test_a_job_replaced_after_its_cancel_in_the_same_worker_runs_once_supervised(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given one worker holding two jobs (--prefetch 2): a running, held by the test, and x
    # queued behind it. Three 1.5 s jobs run first, so that a is not overdue for the next
    # few seconds (4x the recent job time) and a new job may still be queued behind it.
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    a, go = held_job(tmp_path, "a", priority=5)
    manifest = write_manifest(
        [{**py_job(f"w{n}", "sleep_then_write", s=1.5), "priority": 10} for n in range(3)]
        + [a, {**py_job("x", "logged_write", output="x1.pdf", log=str(tmp_path / "x1.log")),
               "priority": 1}], name="v1.toml")
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--prefetch", "2",
                                        "--json"))
    view = QueueView(queue)
    try:
        wait_for_pid(tmp_path / "a.pid", what="a to start")
        wait_until(lambda: "x" in view.ids("running"), what="x to be claimed behind a")

        # When x is cancelled (the runner records it and tells the worker to skip it, which
        # the worker reads only once a ends), then replaced by x v2, which the runner queues
        # in the same worker behind a, and a ends: the worker answers the skip of v1 and
        # starts v2 in one breath
        res = run_cli("cancel", "x", "--queue", queue)
        assert res.returncode == 0, res.stdout + res.stderr
        wait_until(lambda: "x" in view.ids("cancelled"), what="x v1 to be cancelled")
        v2 = write_manifest([py_job("x", "logged_write", output="x2.pdf",
                                    log=str(tmp_path / "x2.log"))], name="v2.toml")
        res = run_cli("submit", v2, "--replace", *cli_args(queue, out))
        assert res.returncode == 0, res.stdout + res.stderr
        wait_until(lambda: "x" in view.ids("running"), what="x v2 to be claimed behind a")
        go.touch()

        # Then the run ends (1: a job was cancelled) with x v2 done, executed exactly once:
        # the worker's late answer about v1 did not take v2 back (v2 used to be sent again
        # and run twice, its first run unsupervised), and v1 never ran
        assert runner.wait(60) == ExitCode.JOBS_FAILED, runner.lines
    finally:
        go.touch()
        runner.close()
    assert view.states_of(["a", "x"]) == {"a": ["done"], "x": ["done"]}
    assert [ln.split()[0] for ln in (tmp_path / "x2.log").read_text().splitlines()] == ["x"]
    assert not (tmp_path / "x1.log").exists()
    assert [t["outcome"] for t in view.record("done", "x")["attempts"]] == ["completed"]
    assert_pdf(out / "x2.pdf", "x")
    assert not (out / "x1.pdf").exists()
    events = json_lines("\n".join(runner.lines))
    assert [e["event"] for e in events if e.get("job") == "x"] == \
        ["cancelled", "started", "completed"], events


def test_a_runner_stopped_mid_claim_holds_no_command_for_good(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner frozen inside a claim (Ctrl-Z at the wrong moment: it holds the claim
    # lock), and a batch committed by a submit killed before it could place it
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    assert run_cli("submit", write_manifest([py_job("a", "write_pdf")]),
                   *cli_args(queue, out)).returncode == 0
    runner = Runner(*cli_args(queue, out, "--workers", "1"),
                    env={"RENDERCTL_STOP_AT": "claim"})
    try:
        wait_until(lambda: stopped(runner.pid), what="the runner to freeze in its claim")
        batch = write_manifest([py_job("b1", "write_pdf"), py_job("b2", "write_pdf")],
                               name="b.toml")
        killed = run_cli("submit", batch, *cli_args(queue, out),
                         env={"RENDERCTL_CRASH_AT": "submit:staged"})
        assert killed.returncode == -signal.SIGKILL, killed.stderr

        # When a script asks for the status, and another replaces a's spec
        status = run_cli("status", "--json", "--queue", queue, timeout=30)
        replace = run_cli("submit", write_manifest([py_job("a", "write_pdf", v=2)],
                                                   name="a2.toml"),
                          *cli_args(queue, out), "--replace", timeout=30)

        # Then the status comes (the batch left for later), and the replace is refused as
        # busy (75), saying what holds it, instead of both waiting as long as the runner
        # stays stopped
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert doc["pending"] + doc["running"] == 1, doc
        assert replace.returncode == 75, (replace.stdout, replace.stderr)
        assert "kill -CONT" in replace.stderr and "nothing of this submit was enqueued" \
            in replace.stderr, replace.stderr
        assert "Traceback" not in status.stderr + replace.stderr

        # When the runner is let go, and the queue run again
        os.kill(runner.pid, signal.SIGCONT)
        assert runner.wait() == 0
    finally:
        runner.close()
    again = run_cli("run", *cli_args(queue, out))

    # Then every job, the batch's too, is done once, a as first submitted
    assert again.returncode == 0, again.stdout + again.stderr
    view = QueueView(queue)
    assert view.states_of({"a", "b1", "b2"}) == {"a": ["done"], "b1": ["done"],
                                                 "b2": ["done"]}
    assert view.record("done", "a")["spec"].get("params") in (None, {})


def test_a_run_waits_for_a_batch_its_open_left_behind_a_held_lock(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a batch committed by a submit killed before it placed it, and submit's lock held
    # by another process (a long `dead retry --all`, say) while a runner starts
    import fcntl

    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    killed = run_cli("submit", write_manifest([py_job("a", "write_pdf"),
                                               py_job("b", "write_pdf")]),
                     *cli_args(queue, out), env={"RENDERCTL_CRASH_AT": "submit:staged"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    fd = os.open(queue / ".submit.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        runner = subprocess.Popen([*RENDERCTL, "run", *cli_args(queue, out)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=_env(None))

        # When the runner, past its open (which gives up on the lock after a second), waits
        # for the lock, and gets it
        wait_until(lambda: _exited_or_waiting_for_a_lock(runner),
                   what="the runner to wait for submit's lock")
    finally:
        os.close(fd)
    stdout, stderr = runner.communicate(timeout=60)

    # Then it places the batch and runs both jobs, rather than finish "all done" without them
    assert runner.returncode == 0, stdout + stderr
    view = QueueView(queue)
    assert view.states_of({"a", "b"}) == {"a": ["done"], "b": ["done"]}
    assert [n for n in os.listdir(queue / "journal") if n.endswith(".txn")] == []


def test_the_jobs_queued_beside_a_cancelled_one_are_handed_back_and_said(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given one worker running a job the test holds, with b then c queued behind it
    queue, out = tmp_path / "q", tmp_path / "out"
    a, go = held_job(tmp_path, "a", priority=3)
    manifest = write_manifest([a, {**py_job("b", "write_pdf"), "priority": 2},
                               {**py_job("c", "write_pdf"), "priority": 1}])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--prefetch", "3",
                                        "--json"))
    view = QueueView(queue)
    try:
        wait_for_pid(tmp_path / "a.pid")
        wait_until(lambda: {"b", "c"} <= view.ids("running"), what="b and c to be queued")

        # When b is cancelled, and a then ends
        res = run_cli("cancel", "b", "--queue", queue)
        assert res.returncode == 0, res.stdout + res.stderr
        wait_until(lambda: "b" in view.ids("cancelled"), what="b to be cancelled")
        go.touch()
        assert runner.wait(60) == ExitCode.JOBS_FAILED, runner.lines
    finally:
        go.touch()
        runner.close()

    # Then c, taken back with it unstarted, is said to be, and runs once
    events = json_lines("\n".join(runner.lines))
    assert [(e["job"], e["reason"]) for e in events if e["event"] == "requeued"] == \
        [("c", "taken back with a cancelled job")], events
    assert view.states_of(["a", "b", "c"]) == {"a": ["done"], "b": ["cancelled"],
                                               "c": ["done"]}
    assert [e["event"] for e in events if e.get("job") == "c"].count("started") == 1
