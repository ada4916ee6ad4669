"""The runner SIGKILLed anywhere: nothing lost, nothing published twice, nothing left over.

Two ways to kill it:

- at a named crash point (``RENDERCTL_CRASH_AT``), where the runner SIGKILLs itself, so
  every window between two durable steps of claim -> run -> publish -> record is covered
  deterministically;
- from the test, at seeded random moments of a 300-job run.

After each kill a plain ``renderctl run`` on the same queue must finish the work: every job in
exactly one terminal folder, every output published once (its inode unchanged since it
first appeared), the done record's hash matching the file, no temporaries left.

The same holds for a ``renderctl dead retry`` killed at each of its crash points.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from jobfns import (
    RENDERCTL,
    QueueView,
    Runner,
    assert_pdf,
    cli_args,
    held_job,
    json_lines,
    kill_mid_job,
    py_job,
    run_cli,
    sha256_of,
    stage,
    stopped,
    stray_temporaries,
    wait_for_pid,
    wait_until,
)

from renderctl.runner import CRASH_POINTS, LEASE_ENV
from renderctl.store import DEAD_RETRY_CRASH_POINTS, LEASE_XATTR

SIGKILLED = -signal.SIGKILL
FAST = ("--workers", "2", "--backoff-base", "0.01")


def inodes(paths: list[Path]) -> dict[Path, tuple[int, int]]:
    """(device, inode) of each path that exists now."""
    found = {}
    for p in paths:
        try:
            st = os.stat(p)
        except FileNotFoundError:
            continue
        found[p] = (st.st_dev, st.st_ino)
    return found


def assert_settled(qv: QueueView, out: Path, outputs: dict[str, Path],
                   dead: set[str]) -> None:
    """Every job terminal in exactly one folder; outputs complete, recorded, once."""
    where = qv.states_of(outputs)
    assert {j: s for j, s in where.items() if len(s) != 1} == {}, "a job in 0 or 2 folders"
    assert qv.ids("pending") == set() and qv.ids("running") == set()
    assert {j for j, s in where.items() if s == ["dead"]} == dead
    assert {j for j, s in where.items() if s == ["done"]} == set(outputs) - dead
    for jid, final in outputs.items():
        if jid in dead:
            assert not final.exists(), f"{jid} is dead but published {final}"
            continue
        assert_pdf(final, jid)
        rec = qv.record("done", jid)
        assert rec["result"]["sha256"] == sha256_of(final)
        assert rec["result"]["bytes"] == final.stat().st_size
        completed = [a for a in rec["attempts"] if a["outcome"] == "completed"]
        assert len(completed) == 1, f"{jid} completed {len(completed)} times"
    assert stray_temporaries(out) == []
    assert qv.tmp_entries() == []




def ended_in_log(queue: Path) -> dict[str, list[str]]:
    """The terminal events events.jsonl holds for each job, in order."""
    ended: dict[str, list[str]] = {}
    for line in (queue / "events.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev["event"] in ("completed", "dead", "cancelled", "expired"):
            ended.setdefault(ev["job"], []).append(ev["event"])
    return ended


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_runner_killed_at_each_crash_point_recovers_without_loss_or_double_publish(
        tmp_path: Path, write_manifest: object, point: str) -> None:
    # Given twelve PDF jobs (and, to reach the `dead` point, one job with a bad input,
    # claimed first)
    stage(tmp_path)
    ids = [f"job-{n:02d}" for n in range(12)]
    jobs = [py_job(j, "write_pdf", f"pdfs/{j}.pdf") for j in ids]
    dead: set[str] = set()
    if point == "dead":
        jobs.insert(0, {**py_job("bad-input", "invalid", "pdfs/bad-input.pdf"), "priority": 5})
        dead = {"bad-input"}
    manifest = write_manifest(jobs)  # type: ignore[operator]
    queue, out = tmp_path / "q", tmp_path / "out"
    outputs = {j["id"]: out / j["output"] for j in jobs}
    qv = QueueView(queue)

    # When the runner SIGKILLs itself at the crash point
    crashed = run_cli("run", manifest, *cli_args(queue, out, *FAST), "--json",
                      env={"RENDERCTL_CRASH_AT": point})
    assert crashed.returncode == SIGKILLED, crashed.stdout + crashed.stderr
    # (its workers die quietly: they print no traceback of the connection they lost)
    assert "Traceback" not in crashed.stderr, crashed.stderr
    at_crash = inodes(list(outputs.values()))
    running_at_crash = qv.ids("running")
    done_at_crash = qv.ids("done")

    # And a runner without the crash point runs the queue again
    again = run_cli("run", *cli_args(queue, out, *FAST), "--json")
    assert again.returncode in (0, 1), again.stdout + again.stderr

    # Then every job settled once, and nothing published before the crash was replaced
    assert_settled(qv, out, outputs, dead)
    assert inodes(list(at_crash)) == at_crash, "an output was published a second time"
    assert again.returncode == (1 if dead else 0), again.stdout

    # And a consumer of the two runs' output hears each job end: in the run that crashed,
    # or in the one that recovered it (audit DF: one a crash left dead-lettered, or done,
    # beside its running copy was in neither, its restart "dead 0", exit 0), and the
    # restart's summary counts what it reported
    ends = ("completed", "dead", "cancelled", "expired")
    heard = {e["job"] for e in json_lines(crashed.stdout) if e.get("event") in ends}
    later = [e for e in json_lines(again.stdout) if e.get("event") in ends or (
        e.get("event") == "recovered" and e.get("state") != "pending")]
    assert heard | {e["job"] for e in later} == set(outputs), (crashed.stdout, again.stdout)
    summary = json_lines(again.stdout)[-1]
    assert sum(summary["counts"].values()) == len(later), again.stdout

    # And the event log tells each job's end once, as the folder it ended in says: a crash
    # after the record was placed, before its event was logged, is logged by recovery
    assert ended_in_log(queue) == {j: [{"done": "completed"}.get(s[0], s[0])]
                                   for j, s in qv.states_of(outputs).items()}

    # And an attempt is charged (`crashed`) only if it had started when the runner died
    crashed_jobs = {j for j in set(outputs) - dead
                    if any(a["outcome"] == "crashed" for a in qv.record("done", j)["attempts"])}
    if point in ("claim", "lease"):
        assert crashed_jobs == set(), "charged an attempt that never started"
    elif point in ("start", "publish:before_link"):
        assert crashed_jobs, "the attempt cut short by the crash was not recorded"

    # And a job whose output was linked but not recorded at the crash was completed by
    # recovery, from the evidence, without running it again
    linked_unrecorded = {j for j, p in outputs.items()
                         if p in at_crash and j not in done_at_crash}
    if point == "publish:after_link":
        assert linked_unrecorded, "the crash point left no linked-but-unrecorded output"
    else:
        assert linked_unrecorded == set()
    for jid in linked_unrecorded:
        rec = qv.record("done", jid)
        assert jid in running_at_crash
        assert rec["result"].get("recovered") is True
        assert rec["attempts"][-1].get("recovered") is True
        assert [a["outcome"] for a in rec["attempts"]] == ["completed"]


def test_an_attempt_the_runner_died_in_is_recorded_from_when_it_started(
        tmp_path: Path, write_manifest: object) -> None:
    # Given two jobs claimed together by one worker, the second starting only after the
    # first's 0.5 s render
    stage(tmp_path)
    manifest = write_manifest([  # type: ignore[operator]
        {**py_job("first", "sleep_then_write", s=0.5), "priority": 2},
        {**py_job("second", "write_pdf"), "priority": 1},
    ])
    queue, out = tmp_path / "q", tmp_path / "out"
    qv = QueueView(queue)

    # When the runner dies as the second starts, and another runs the queue
    crashed = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1", "--prefetch",
                                                 "2"), env={"RENDERCTL_CRASH_AT": "start:n=2"})
    assert crashed.returncode == SIGKILLED, crashed.stdout + crashed.stderr
    again = run_cli("run", *cli_args(queue, out))
    assert again.returncode == 0, again.stdout + again.stderr

    # Then the second's crashed attempt started when its worker started it (after the first
    # ended), not when it was claimed, and names the host it ran on
    rec = qv.record("done", "second")
    cut, retried = rec["attempts"]
    assert cut["outcome"] == "crashed" and retried["outcome"] == "completed"
    first = qv.record("done", "first")["attempts"][0]
    assert cut["started_at"] >= first["started_at"] + 0.5, (cut, first)
    assert cut["host"] == retried["host"]


@pytest.mark.parametrize("purge", [["prune", "--older-than", "0s", "--state", "dead"],
                                   ["dead", "purge"]], ids=["prune", "dead-purge"])
def test_prune_leaves_a_record_whose_running_copy_a_crash_left_for_recovery(
        tmp_path: Path, write_manifest: object, purge: list[str]) -> None:
    # Given a job dead-lettered at once (it can never fit the memory budget) by a runner
    # SIGKILLed after the dead record was durable, before the running copy was removed
    stage(tmp_path)
    manifest = write_manifest([{**py_job("huge", "write_pdf"), "memory_mb": 400}])  # type: ignore[operator]
    queue, out = tmp_path / "q", tmp_path / "out"
    crashed = run_cli("run", manifest, *cli_args(queue, out, "--memory-budget", "200"),
                      env={"RENDERCTL_CRASH_AT": "dead"})
    assert crashed.returncode == SIGKILLED, crashed.stdout + crashed.stderr
    assert (queue / "dead" / "huge.json").exists() and (queue / "running" / "huge.json").exists()

    # When dead records are pruned (or purged), and a runner runs the queue again
    res = run_cli(*purge, "--queue", queue)
    assert res.returncode == 0 and ("dead 0" in res.stdout or "purged 0" in res.stdout), \
        res.stdout + res.stderr
    again = run_cli("run", *cli_args(queue, out))

    # Then the job stays dead-lettered (recovery finished the cleanup): it never ran; the
    # run that recovered it says so, and exits 1 for it (the crashed run never did)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "recovered huge -> dead" in again.stdout
    assert QueueView(queue).states_of(["huge"]) == {"huge": ["dead"]}
    assert not (out / "huge.pdf").exists()


def test_a_run_again_of_a_manifest_counts_a_job_its_crash_left_dead_once(
        tmp_path: Path, write_manifest: object) -> None:
    # Given a run of a manifest SIGKILLed as it dead-lettered one of its jobs (the dead
    # record placed, the running copy not yet removed)
    stage(tmp_path)
    manifest = write_manifest([{**py_job("bad", "invalid"), "priority": 5},  # type: ignore[operator]
                               py_job("ok", "write_pdf")])
    queue, out = tmp_path / "q", tmp_path / "out"
    crashed = run_cli("run", manifest, *cli_args(queue, out), env={"RENDERCTL_CRASH_AT": "dead"})
    assert crashed.returncode == SIGKILLED, crashed.stdout + crashed.stderr
    assert (queue / "dead" / "bad.json").exists() and (queue / "running" / "bad.json").exists()

    # When the same command runs again (cron)
    again = run_cli("run", manifest, *cli_args(queue, out), "--json")

    # Then the job is reported once, recovered dead by this run, not also "ended earlier"
    # (review DG: counted both ways in one summary)
    assert again.returncode == 1, again.stdout + again.stderr
    summary = json_lines(again.stdout)[-1]
    assert summary["counts"]["dead"] == 1, summary
    # ("ok" may have completed before the crash: that one did end earlier)
    assert summary.get("already_ended", {}).get("dead", 0) == 0, summary
    assert not [ln for ln in again.stderr.splitlines() if "ended earlier" in ln and "dead" in ln]


# -- random kills -------------------------------------------------------------------------

JOBS = 300
KILLS = 5
SEED = 20_260_417


def run_then_kill(argv: list[str], done_dir: Path, target: int) -> int:
    """Start ``argv``; SIGKILL it once ``target`` jobs are done, unless it exits first."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "NO_COLOR": "1"})
    fd = os.pidfd_open(proc.pid)
    try:
        while True:
            exited, _, _ = select.select([fd], [], [], 0.002)
            if exited:
                break
            if done_dir.is_dir() and len(os.listdir(done_dir)) >= target:
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        os.close(fd)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode in (0, SIGKILLED), err.decode()
    return proc.returncode


def test_runner_killed_at_random_moments_loses_nothing_and_publishes_once(
        tmp_path: Path) -> None:
    # Given 300 short jobs
    folder = stage(tmp_path)
    # (Attempts enough to survive every kill: each kill charges every attempt that started
    # since the last group commit, several per worker for short prefetched jobs, and after
    # a restart the same jobs are claimed first again; two kills a few jobs apart then
    # charge them twice. What is charged is the crash-point test's business.)
    jobs = [{**py_job(f"j{n:03d}", "write_pdf", f"o/{n:03d}.pdf"), "max_attempts": KILLS + 1}
            for n in range(JOBS)]
    manifest = folder / "many.json"
    manifest.write_text(json.dumps({"jobs": jobs}))
    # When a runner is SIGKILLed at KILLS seeded moments (measured in jobs done, so every
    # kill lands mid-run however fast this machine is), restarted each time (each start
    # resubmits the manifest: a no-op once accepted), then run to the end.
    queue, out = folder / "q", folder / "out"
    argv = [*RENDERCTL, "run", str(manifest), *cli_args(queue, out, *FAST, "--quiet")]
    outputs = {j["id"]: out / j["output"] for j in jobs}
    first_seen: dict[Path, tuple[int, int]] = {}
    rng = random.Random(SEED)
    targets = sorted(rng.sample(range(10, JOBS - 10), KILLS))
    kills = 0
    for target in targets:
        if run_then_kill(argv, queue / "done", target) == SIGKILLED:
            kills += 1
        for p, ino in inodes(list(outputs.values())).items():
            first_seen.setdefault(p, ino)
    final = run_cli("run", manifest, *cli_args(queue, out, *FAST, "--quiet"), timeout=120)

    # Then all 300 are done, each output published once and never replaced
    assert final.returncode == 0, final.stdout + final.stderr
    assert kills == KILLS, "a kill missed the run; the test proved little"
    qv = QueueView(queue)
    assert_settled(qv, out, outputs, dead=set())
    assert inodes(list(first_seen)) == first_seen, "an output was published a second time"


def left_by_a_runner_nobody_can_judge(tmp_path: Path, write_manifest: Any, *, holder: str,
                                      expires_in_s: float) -> tuple[Path, Path, float]:
    """Job "held" left in running/ by a runner SIGKILLed while it ran (its worker dies with
    it), whose holder file is gone (``holder="unknown"``: removed by hand) or names another
    host, so nobody can tell whether it lives; its lease, as the dead runner last renewed
    it, runs out in ``expires_in_s``. Returns (queue, out, the lease's expiry)."""
    stage(tmp_path)
    pidfile = tmp_path / "worker.pid"
    manifest = write_manifest([py_job("held", "sleep_then_write", s=60, sleep_attempts=1,
                                      pidfile=str(pidfile))])
    queue, out = tmp_path / "q", tmp_path / "out"
    kill_mid_job(Runner(manifest, *cli_args(queue, out, *FAST)), pidfile)
    for holder_file in (queue / "control").glob("holder.*.json"):
        if holder == "unknown":
            holder_file.unlink()
        else:
            # (Another machine: another kernel too. One of this kernel under another host
            # name is another container here, known dead to the lock's holder.)
            holder_file.write_text(json.dumps({**json.loads(holder_file.read_text()),
                                               "host": "elsewhere",
                                               "boot_id": "another-machines-boot-id"}))
    running = queue / "running" / "held.json"
    prefix, attempt, claimed_at, _ = os.getxattr(running, LEASE_XATTR).decode().split()
    expires_at = time.time() + expires_in_s
    os.setxattr(running, LEASE_XATTR, f"{prefix} {attempt} {claimed_at} {expires_at}".encode())
    return queue, out, expires_at


@pytest.mark.parametrize("holder", ["unknown", "on another host"])
def test_a_lease_whose_holder_is_unknown_is_taken_over_when_it_expires_not_before(
        tmp_path: Path, write_manifest: Any, holder: str) -> None:
    # Given a job left running by a dead runner whose holder nobody can judge, its lease
    # running out in 2 s
    queue, out, expires_at = left_by_a_runner_nobody_can_judge(
        tmp_path, write_manifest, holder=holder, expires_in_s=2)
    [work_note] = (queue / "control").glob("work.*")
    dead_work_root, dead_mp_dir = map(Path, work_note.read_text().split())
    # (The dead runner's job folders: its reaper may have removed them already, as it
    # removes them once a runner dies, or not yet; under load the full suite once found
    # them gone here. The fork server's folder it leaves.)
    assert dead_work_root.name.startswith("renderctl-work-")
    assert dead_mp_dir.name.startswith("pymp-") and dead_mp_dir.is_dir()  # its fork server's

    # When another runner starts on the queue (leases of 2 s: it watches one for 1 s at
    # least before it may take it over, less than the 2 s this one has left)
    second = Runner(*cli_args(queue, out, *FAST, "--json"), env={LEASE_ENV: "2"})
    try:
        code = second.wait()
    finally:
        second.close()

    # Then it waited for the lease to expire (no takeover before), took the job over,
    # charged the lost attempt as crashed, and ran it to completion
    assert code == 0, second.lines
    events = [json.loads(line) for line in second.lines if line.strip()]
    recovered = [e for e in events if e.get("event") == "recovered"]
    assert [(e["job"], e["state"]) for e in recovered] == [("held", "pending")]
    assert recovered[0]["ts"] >= expires_at
    rec = QueueView(queue).record("done", "held")
    lost, done = rec["attempts"]
    assert lost["outcome"] == "crashed"
    # (that it died is not known: only that its lease ran out)
    expected = "an unknown runner" if holder == "unknown" else "on elsewhere)"
    assert f"{expected} let its lease expire during the attempt" in lost["error"], lost
    assert done["outcome"] == "completed"
    assert_pdf(out / "held.pdf", "held")
    assert sorted(p.name for p in (queue / "control").glob("started.*.log")) == []
    # And the dead runner's job working folders are gone with it (they would pile up in
    # /tmp, crash by crash), and so is every note of where they were
    assert not dead_work_root.exists()
    assert not dead_mp_dir.exists()
    assert sorted((queue / "control").glob("work.*")) == []


def test_a_cancel_of_a_job_whose_lease_waits_to_expire_is_applied_after_the_takeover(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job left running by a dead runner on another host (as far as anyone can
    # tell), its lease running out in 3 s ...
    queue, out, _ = left_by_a_runner_nobody_can_judge(
        tmp_path, write_manifest, holder="on another host", expires_in_s=3)
    # ... and a runner following the queue, waiting for that lease
    second = Runner(*cli_args(queue, out, *FAST, "--follow", "--json"), env={LEASE_ENV: "2"})
    try:
        second.until(lambda ln: '"runner_started"' in ln)

        # When the job is cancelled before the lease runs out
        cancel = run_cli("cancel", "held", "--queue", queue)
        assert cancel.returncode == 0 and "cancel requested" in cancel.stdout, cancel

        # Then the takeover does not run it again: it ends cancelled, its output unpublished
        second.until(lambda ln: '"recovered"' in ln and '"held"' in ln)
        wait_until(lambda: QueueView(queue).states_of(["held"])["held"] != ["pending"],
                   what="the job to leave pending/")
        second.proc.send_signal(signal.SIGTERM)
        second.wait()
    finally:
        second.close()
    assert QueueView(queue).states_of(["held"]) == {"held": ["cancelled"]}, second.lines
    assert not any('"started"' in ln for ln in second.lines), second.lines
    assert not (out / "held.pdf").exists()
    assert sorted((queue / "control").glob("cancel*")) == []


def test_an_attempt_started_elsewhere_after_our_start_is_charged_when_its_lease_is_taken_over(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job held by a runner on another host, its lease running out in 3 s, whose
    # start of the attempt is not on record yet when a second runner starts ...
    queue, out, _ = left_by_a_runner_nobody_can_judge(
        tmp_path, write_manifest, holder="on another host", expires_in_s=3)
    aside = tmp_path / "started-aside"
    aside.mkdir()
    logs = sorted((queue / "control").glob("started.*.log"))
    assert logs, "the dead runner left no started log"
    for log in logs:
        log.rename(aside / log.name)
    second = Runner(*cli_args(queue, out, *FAST, "--json"), env={LEASE_ENV: "2"})
    try:
        second.until(lambda ln: '"runner_started"' in ln)
        # ... and is put on record after that (the other runner started the attempt then)
        for log in logs:
            (aside / log.name).rename(log)
        code = second.wait()
    finally:
        second.close()

    # Then the takeover charges that attempt as crashed: it was judged by the started logs
    # as they were when this runner started, and the attempt went uncharged
    assert code == 0, second.lines
    lost, done = QueueView(queue).record("done", "held")["attempts"]
    assert lost["outcome"] == "crashed" and "let its lease expire" in lost["error"], lost
    assert done["outcome"] == "completed"
    assert_pdf(out / "held.pdf", "held")


def test_a_lease_renewed_by_a_host_whose_clock_is_behind_is_not_taken_over_until_it_stops(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job held by a runner on another host whose clock is 5 minutes behind ours (or
    # ours jumped ahead: NTP, a resumed VM): each lease it writes has expired by our clock
    # when we read it, yet it renews it all the time
    queue, out, _ = left_by_a_runner_nobody_can_judge(
        tmp_path, write_manifest, holder="on another host", expires_in_s=-240)
    running = queue / "running" / "held.json"
    prefix, attempt, claimed_at, _ = os.getxattr(running, LEASE_XATTR).decode().split()
    stop_renewing = threading.Event()

    def renew_as_the_other_host() -> None:
        while not stop_renewing.wait(0.1):
            os.setxattr(running, LEASE_XATTR,
                        f"{prefix} {attempt} {claimed_at} {time.time() - 240:.3f}".encode())

    renewer = threading.Thread(target=renew_as_the_other_host)
    renewer.start()
    # When a runner (leases of 2 s, so that it can judge one in a test's time) follows the
    # queue for several of its lease lengths while the other host keeps renewing
    second = Runner(*cli_args(queue, out, *FAST, "--follow", "--json"),
                    env={LEASE_ENV: "2"})
    try:
        try:
            second.until(lambda ln: '"runner_started"' in ln)
            watched_until = time.monotonic() + 5
            while time.monotonic() < watched_until:
                # Then it never takes the job over (before: at once, at its start): the job
                # runs on its host, and would run a second time here
                assert QueueView(queue).states_of(["held"]) == {"held": ["running"]}
                assert not any('"recovered"' in ln for ln in second.lines), second.lines
                second._read_some(0.1)
        finally:
            stop_renewing.set()
            renewer.join()
        # And once the other host stops renewing, the job is taken over and run here
        second.until(lambda ln: '"completed"' in ln and '"held"' in ln, timeout_s=30)
        second.proc.send_signal(signal.SIGTERM)
        second.wait()
    finally:
        second.close()
    lost, done = QueueView(queue).record("done", "held")["attempts"]
    assert (lost["outcome"], done["outcome"]) == ("crashed", "completed")
    assert_pdf(out / "held.pdf", "held")


# -- a `dead retry` killed half-way ---------------------------------------------------------


@pytest.mark.parametrize("point", DEAD_RETRY_CRASH_POINTS)
def test_dead_retry_killed_at_each_crash_point_leaves_the_job_in_one_folder(
        tmp_path: Path, write_manifest: Any, point: str) -> None:
    # Given a job dead-lettered by a cause that is then fixed
    stage(tmp_path)
    marker = tmp_path / "fixed"
    manifest = write_manifest([{**py_job("d1", "fail_until_marker", marker=str(marker)),
                                "max_attempts": 1}])
    queue, out = tmp_path / "q", tmp_path / "out"
    qv = QueueView(queue)
    assert run_cli("run", manifest, *cli_args(queue, out, *FAST)).returncode == 1
    assert qv.states_of(["d1"]) == {"d1": ["dead"]}
    marker.touch()

    # When `dead retry` SIGKILLs itself at the crash point
    killed = run_cli("dead", "retry", "d1", "--queue", queue,
                     env={"RENDERCTL_CRASH_AT": point})
    assert killed.returncode == SIGKILLED, killed.stdout + killed.stderr

    # Then the job is in exactly one folder, dead (the retry never happened) or pending
    folders = qv.states_of(["d1"])["d1"]
    assert folders in (["dead"], ["pending"]), f"the job is in {folders}"
    where = folders[0]

    # And finishing what the user asked (a runner; the retry again if it was not made)
    # completes it once, and it is nowhere else
    if where == "dead":
        assert run_cli("dead", "retry", "d1", "--queue", queue).returncode == 0
    again = run_cli("run", *cli_args(queue, out, *FAST))
    assert again.returncode == 0, again.stdout + again.stderr
    assert_settled(qv, out, {"d1": out / "d1.pdf"}, dead=set())
    rec = qv.record("done", "d1")
    assert [a["outcome"] for a in rec["attempts"]] == ["failed", "completed"]


# -- `cancel` of a job whose runner died ----------------------------------------------------


@pytest.mark.parametrize(("point", "published"), [("publish:after_link", True),
                                                  ("publish:before_link", False)])
def test_cancel_with_no_runner_judges_the_orphan_as_recovery_does(
        tmp_path: Path, write_manifest: Any, point: str, published: bool) -> None:
    # Given a runner SIGKILLed while publishing its one job (after the output was moved into
    # place, or just before), so the job is left in running/ with nobody holding the queue
    stage(tmp_path)
    manifest = write_manifest([py_job("c1", "write_pdf")])
    queue, out = tmp_path / "q", tmp_path / "out"
    final = out / "c1.pdf"
    qv = QueueView(queue)
    crashed = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"),
                      env={"RENDERCTL_CRASH_AT": point})
    assert crashed.returncode == SIGKILLED, crashed.stdout + crashed.stderr
    assert qv.ids("running") == {"c1"}
    assert final.exists() is published
    at_crash = inodes([final])

    # When it is cancelled with no runner alive
    res = run_cli("cancel", "c1", "--queue", queue, "--json")
    assert res.returncode == 0, res.stdout + res.stderr

    if published:
        # Then, its output being published and its own, it is done (cancel came too late):
        # completed from the evidence, the output neither removed nor published again
        assert json.loads(res.stdout) == {"c1": "already done"}
        assert qv.states_of(["c1"]) == {"c1": ["done"]}
        rec = qv.record("done", "c1")
        assert [a["outcome"] for a in rec["attempts"]] == ["completed"]
        assert rec["result"]["sha256"] == sha256_of(final)
        assert_pdf(final, "c1")
        assert inodes([final]) == at_crash
    else:
        # Then it is cancelled, with the attempt its runner died in recorded, and no output:
        # neither at the final path nor as a temporary beside it
        assert json.loads(res.stdout) == {"c1": "cancelled"}
        assert qv.states_of(["c1"]) == {"c1": ["cancelled"]}
        rec = qv.record("cancelled", "c1")
        assert [a["outcome"] for a in rec["attempts"]] == ["crashed"]
        assert not final.exists()
    assert stray_temporaries(out) == []

    # And a later runner finds nothing to do and changes nothing
    again = run_cli("run", *cli_args(queue, out, "--workers", "1"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert qv.states_of(["c1"]) == {"c1": ["done" if published else "cancelled"]}
    assert inodes([final]) == at_crash


def test_recovery_never_takes_an_earlier_lifes_output_for_a_replaced_jobs_attempt(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import pdf_text

    # Given a --follow runner that completed x (v1), then x replaced by v2, which the same
    # runner claims as attempt 1 again (the same token as v1's output tag) and dies starting
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    v1 = write_manifest([py_job("x", "write_pdf")], name="v1.toml")
    runner = Runner(v1, *cli_args(queue, out, "--workers", "1", "--follow", "--json"),
                    env={"RENDERCTL_CRASH_AT": "start:n=2"})
    try:
        runner.until(lambda line: '"completed"' in line)
        v1_text = pdf_text(out / "x.pdf")
        v2 = write_manifest([py_job("x", "write_pdf", version=2)], name="v2.toml")
        assert run_cli("submit", v2, "--replace", *cli_args(queue, out)).returncode == 0
        assert runner.wait(30) == -9
    finally:
        runner.close()

    # When the next runner recovers it
    res = run_cli("run", *cli_args(queue, out, *FAST))

    # Then the v1 file is not taken for v2's: output_exists, the file untouched
    assert res.returncode == 1, res.stdout + res.stderr
    rec = QueueView(queue).record("dead", "x")
    assert rec["spec"]["params"] == {"version": 2}
    assert rec["attempts"][-1]["outcome"] == "output_exists"
    assert pdf_text(out / "x.pdf") == v1_text


def test_recovery_completes_an_output_whose_mtime_the_job_set_in_the_past(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a command job that copies a PDF keeping its timestamps (`cp -p`: the published
    # file's mtime is the input's, years before the claim), and a runner SIGKILLed after
    # publishing it, before its done record
    stage(tmp_path)
    src = tmp_path / "in.pdf"
    from jobfns import _pdf
    _pdf(src, "keep")  # the text assert_pdf expects of job `keep`
    os.utime(src, (1_000_000_000, 1_000_000_000))  # 2001
    manifest = write_manifest([{"id": "keep", "kind": "command", "inputs": ["in.pdf"],
                                "argv": ["cp", "-p", "{input}", "{output}"],
                                "output": "keep.pdf"}])
    queue, out = tmp_path / "q", tmp_path / "out"
    final = out / "keep.pdf"
    qv = QueueView(queue)
    crashed = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"),
                      env={"RENDERCTL_CRASH_AT": "publish:after_link"})
    assert crashed.returncode == SIGKILLED, crashed.stdout + crashed.stderr
    assert os.stat(final).st_mtime == 1_000_000_000
    at_crash = inodes([final])

    # When the next runner recovers it
    res = run_cli("run", *cli_args(queue, out, *FAST))

    # Then its own output is recognised by its tag, not its age: done, never republished
    assert res.returncode == 0, res.stdout + res.stderr
    assert_settled(qv, out, {"keep": final}, dead=set())
    assert qv.record("done", "keep")["result"].get("recovered") is True
    assert inodes([final]) == at_crash


def test_a_cancel_its_runner_died_before_acting_on_stands(tmp_path: Path) -> None:
    # Given a running job on its last attempt, its runner frozen, and a cancel of it that
    # returned ("cancel requested": the runner is to act on it)
    job, go = held_job(tmp_path, "x", max_attempts=1)
    manifest = tmp_path / "jobs.json"
    manifest.write_text(json.dumps({"jobs": [job]}))
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--json"))
    try:
        runner.until(lambda line: '"started"' in line)
        os.kill(runner.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(runner.pid), what="the runner to stop")
        res = run_cli("cancel", "x", "--queue", queue)
        assert res.returncode == 0 and "cancel requested" in res.stdout, res.stdout + res.stderr

        # When the runner is killed before it acted on it, and another runs the queue
        assert runner.kill() == SIGKILLED
    finally:
        runner.close()
    go.touch()  # (were the job still alive, it would finish now)
    again = run_cli("run", *cli_args(queue, out))

    # Then the cancel stands: cancelled, with the attempt the runner died in on record
    # (it went to dead/ as that attempt's failure, where `dead retry --all` would run it)
    assert again.returncode == 1, again.stdout + again.stderr
    qv = QueueView(queue)
    assert qv.states_of(["x"]) == {"x": ["cancelled"]}
    assert [a["outcome"] for a in qv.record("cancelled", "x")["attempts"]] == ["crashed"]
    assert not (out / job["output"]).exists()


def test_a_queue_sweeping_its_jobs_temporaries_leaves_another_queues_job_of_that_id_alone(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given two queues whose outputs share a folder, each with a job "daily" (writing a.pdf
    # and b.pdf): B's running, its output written (at its temporary name), A's left
    # running by a runner SIGKILLed mid-job
    out = tmp_path / "out"
    runners: dict[str, Runner] = {}
    gos: list[Path] = []
    try:
        for name in ("b", "a"):
            folder = tmp_path / name
            job, go = held_job(folder, "daily")
            if name == "b":
                job = py_job("daily", "write_then_hold_first_time", go=str(go),
                             pidfile=str(folder / "daily.pid"), marker=str(folder / "m"))
            gos.append(go)
            manifest = write_manifest([{**job, "output": f"{name}.pdf"}], folder=folder)
            runners[name] = Runner(manifest, *cli_args(folder / "q", out, "--workers", "1"))
            wait_for_pid(folder / "daily.pid", what=f"queue {name}'s job to start")
        os.kill(runners["a"].pid, signal.SIGKILL)
        runners["a"].wait(30)
        gos[1].touch()

        # When A's next runner recovers its job (its temporaries swept) and runs it again,
        # and then B's job ends
        res = run_cli("run", *cli_args(tmp_path / "a" / "q", out, "--workers", "1"),
                      timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        gos[0].touch()
        assert runners["b"].wait() == 0, runners["b"].lines
    finally:
        for go in gos:
            go.touch()
        for runner in runners.values():
            runner.close()

    # Then both complete, each with its output: A's sweep took every temporary of a job
    # "daily" in the folder, B's in flight too, and B's job was dead-lettered as having
    # written no output (audit FQ; where others may write to the folder, a job writes in
    # a private folder a sweep does not remove, and the window is shorter)
    for name in ("a", "b"):
        assert QueueView(tmp_path / name / "q").ids("done") == {"daily"}
        assert_pdf(out / f"{name}.pdf", "daily")
    assert not stray_temporaries(out)
