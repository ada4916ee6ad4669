"""A job whose id is in a terminal folder and also in pending/ (or running/) ends in exactly
one state folder, and is not run again unless a retry was asked for.

The two copies come from hand damage (`cp QUEUE/done/x.json QUEUE/pending/`) or from what a
power loss can leave of `dead retry` (its rename kept on both sides). Real files and real
`renderctl` processes; the terminal states are made through the store's API."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from jobfns import QueueView, cli_args, py_job, run_cli, stage

from renderctl.errors import ExitCode
from renderctl.lifecycle import State
from renderctl.policy import ClaimIndex
from renderctl.store import Holder, Queue, Transition

HOLDER = Holder("test-host", "boot-1", os.getpid(), None)


def _finished(queue: Path, tmp_path: Path, jid: str, state: State) -> None:
    """Put job ``jid`` into the terminal folder ``state`` the way a runner would."""
    q = Queue(queue)
    q.submit([py_job(jid, "write_pdf")], base=tmp_path, out_root=tmp_path / "out")
    index = ClaimIndex()
    q.load_index(index)
    [c], _ = q.claim(index, holder=HOLDER, lease_s=60, limit=1, token_prefix="t")
    attempt = {"n": 1, "outcome": "completed" if state is State.DONE else "failed"}
    rec = replace(c.record, lease=None, attempts=(attempt,), reason=f"made {state.value}")
    q.finish([Transition(rec, state)])
    q.close()


def _events(queue: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (queue / "events.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("state", [State.DONE, State.DEAD, State.CANCELLED, State.EXPIRED])
def test_a_pending_copy_of_a_finished_job_is_quarantined_not_run(
        tmp_path: Path, state: State) -> None:
    # Given a job finished in a terminal folder, and a copy of its record put in pending/
    # by hand (no renderctl operation leaves that)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    _finished(queue, tmp_path, "d1", state)
    before = (queue / state.value / "d1.json").read_bytes()
    shutil.copy(queue / state.value / "d1.json", queue / "pending" / "d1.json")

    # When a runner starts on the queue
    res = run_cli("run", *cli_args(queue, out, "--workers", "1"))

    # Then the job was not run again: it is in its terminal folder only, its record as it was
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert QueueView(queue).states_of(["d1"]) == {"d1": [state.value]}
    assert (queue / state.value / "d1.json").read_bytes() == before
    assert not (out / "d1.pdf").exists()
    # And the pending copy is kept in corrupt/, reported with a reason
    [kept] = os.listdir(queue / "corrupt")
    assert kept.startswith("pending.d1.json.")
    assert (queue / "corrupt" / kept).read_bytes() == before
    [ev] = [e for e in _events(queue) if e["event"] == "corrupt"]
    assert ev["file"] == "pending/d1.json" and ev["moved_to"] == kept
    assert f"{state.value}/d1.json" in ev["reason"]
    # And `show` and `status` agree on where it is
    shown = json.loads(run_cli("show", "d1", "--json", "--queue", str(queue)).stdout)
    assert shown["state"] == state.value
    st = json.loads(run_cli("status", "--json", "--queue", str(queue)).stdout)
    assert (st["pending"], st[state.value], st["corrupt"]) == (0, 1, 1)


def test_a_dead_retry_cut_by_power_loss_runs_the_retried_job_once(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a dead job
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    marker = tmp_path / "fixed"
    manifest = write_manifest([{**py_job("r1", "fail_until_marker", marker=str(marker)),
                                "max_attempts": 1}])
    assert run_cli("run", manifest, *cli_args(queue, out)).returncode == ExitCode.JOBS_FAILED
    assert QueueView(queue).states_of(["r1"]) == {"r1": ["dead"]}
    # And a `dead retry` of it killed once it rewrote the record for the retry
    cut = run_cli("dead", "retry", "r1", "--queue", str(queue),
                  env={"RENDERCTL_CRASH_AT": "dead_retry:rewritten"})
    assert cut.returncode < 0, cut.stdout + cut.stderr
    # And the rename into pending/ kept on both sides, as a power loss between the syncs of
    # pending/ and dead/ can leave it (store.py: "never in neither")
    shutil.copy(queue / "dead" / "r1.json", queue / "pending" / "r1.json")

    # When the cause is fixed and a runner starts
    marker.write_text("")
    res = run_cli("run", *cli_args(queue, out, "--workers", "1"))

    # Then the retry that was asked for happened, once, and the job is in one folder only
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert QueueView(queue).states_of(["r1"]) == {"r1": ["done"]}
    rec = QueueView(queue).record("done", "r1")
    assert [a["outcome"] for a in rec["attempts"]] == ["failed", "completed"]
    assert os.listdir(queue / "corrupt") == []
    shown = json.loads(run_cli("show", "r1", "--json", "--queue", str(queue)).stdout)
    assert shown["state"] == "done"


@pytest.mark.parametrize("state", [State.DONE, State.CANCELLED])
def test_a_running_copy_of_a_finished_job_is_dropped_by_recovery(
        tmp_path: Path, state: State) -> None:
    # Given a finished job whose record was also left in running/ (a runner killed after
    # its later record was durable, before it removed the running copy)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    _finished(queue, tmp_path, "f1", state)
    shutil.copy(queue / state.value / "f1.json", queue / "running" / "f1.json")

    # When a runner starts
    res = run_cli("run", *cli_args(queue, out, "--workers", "1"))

    # Then the later record wins: the job stays finished, in one folder, not run again;
    # the run reports it as recovered (a cancelled one makes it exit 1, as any cancel in a
    # run does; audit DF: it was in no run's output)
    wanted = ExitCode.OK if state is State.DONE else ExitCode.JOBS_FAILED
    assert res.returncode == wanted, res.stdout + res.stderr
    assert f"recovered f1 -> {state.value}" in res.stdout
    assert QueueView(queue).states_of(["f1"]) == {"f1": [state.value]}
    assert not (out / "f1.pdf").exists()


def test_a_pending_copy_made_while_a_runner_follows_is_quarantined_not_run(
        tmp_path: Path, write_manifest: Any) -> None:
    import signal

    from jobfns import Runner, wait_until

    from renderctl.runner import RESCAN_FULL_S

    # Given a following runner that completed a job
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(*cli_args(queue, out, "--workers", "1", "--follow", "--json"))
    try:
        runner.until(lambda ln: '"runner_started"' in ln)
        manifest = write_manifest([py_job("a", "write_pdf")])
        assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
        runner.until(lambda ln: '"completed"' in ln and '"a"' in ln)
        before = (queue / "done" / "a.json").read_bytes()

        # When a copy of its record is put into pending/ by hand (no doorbell rung: only
        # the runner's rescan of pending/ finds it)
        shutil.copy(queue / "done" / "a.json", queue / "pending" / "a.json")

        # Then the rescan quarantines the copy instead of running the job again
        wait_until(lambda: os.listdir(queue / "corrupt"), timeout_s=RESCAN_FULL_S * 2,
                   what="the pending copy to be quarantined")
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM
    finally:
        runner.close()
    assert QueueView(queue).states_of(["a"]) == {"a": ["done"]}
    assert (queue / "done" / "a.json").read_bytes() == before
    # (run once: accepted, claimed and completed once each; the copy reported, not claimed)
    assert [e["event"] for e in _events(queue) if e.get("job") == "a"] == [
        "accepted", "claimed", "completed"]
    assert [e["file"] for e in _events(queue) if e["event"] == "corrupt"] == ["pending/a.json"]


def test_a_done_record_whose_outputs_publish_a_power_loss_undid_gets_its_output_back(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import assert_pdf, sha256_of, stray_temporaries

    from renderctl.publish import tmp_output_path
    from renderctl.store import JobRecord, read_lease

    # Given a runner stopped right after publishing x's output (a rename), before its done
    # record was renamed into place: x is in running/, its new record staged under tmp/
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("x", "write_pdf")])
    cut = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"),
                  env={"RENDERCTL_CRASH_AT": "publish:after_link"})
    assert cut.returncode < 0, cut.stdout + cut.stderr
    final = out / "x.pdf"
    lease = read_lease(queue / "running" / "x.json")
    assert lease is not None and final.exists()
    # ... and a power loss in the sync that follows, which wrote done/'s new entry to disk
    # but not out/'s (no journal: each folder's block reaches the disk on its own): the
    # done record is there, and the output is back under its temporary name
    os.rename(final, tmp_output_path(final, "x", lease.token))
    [staged] = [p for p in (queue / "tmp").iterdir()
                if not p.name.startswith(".") and p.is_file()
                and JobRecord.loads(p.read_bytes()).spec.id == "x"]
    os.rename(staged, queue / "done" / "x.json")
    recorded = QueueView(queue).record("done", "x")["result"]["sha256"]

    # When a runner starts
    res = run_cli("run", *cli_args(queue, out, "--workers", "1"))

    # Then x is done once, and its output is at its path, the file the record describes
    # (recovery discarded it as a stale temporary: done, with nothing published)
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert QueueView(queue).states_of(["x"]) == {"x": ["done"]}
    assert_pdf(final, "x")
    assert sha256_of(final) == recorded
    assert stray_temporaries(out) == []


def test_a_cancel_cut_by_power_loss_between_its_two_syncs_is_settled_without_a_report(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a pending job cancelled, and the power lost between the cancel's fsync of
    # cancelled/ and its fsync of pending/ (store.cancel_pending): the rename is kept on the
    # cancelled/ side, and pending/ still holds the record as it was before the cancel
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("c1", "write_pdf")])
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == ExitCode.OK
    before = (queue / "pending" / "c1.json").read_bytes()
    assert run_cli("cancel", "c1", "--queue", str(queue)).returncode == ExitCode.OK
    (queue / "pending" / "c1.json").write_bytes(before)

    # When a runner starts
    res = run_cli("run", *cli_args(queue, out, "--workers", "1"))

    # Then the cancel stands: not run, in one folder, and nothing reported as damaged (no
    # person copied anything: it is renderctl's own leftover, not a corrupt file)
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert QueueView(queue).states_of(["c1"]) == {"c1": ["cancelled"]}
    assert not (out / "c1.pdf").exists()
    assert os.listdir(queue / "corrupt") == []
    assert [e for e in _events(queue) if e["event"] == "corrupt"] == []


@pytest.mark.parametrize("list_over_probe", [0, 10**9], ids=["probed", "listed"])
def test_a_runner_start_finds_a_pending_copy_of_a_finished_job_by_either_test(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, list_over_probe: int) -> None:
    # Given a finished job, a copy of its record in pending/, and other pending jobs
    stage(tmp_path)
    queue = tmp_path / "q"
    _finished(queue, tmp_path, "d1", State.DONE)
    shutil.copy(queue / "done" / "d1.json", queue / "pending" / "d1.json")
    q = Queue(queue)
    q.submit([py_job(f"p{i}", "write_pdf") for i in range(30)], base=tmp_path,
             out_root=tmp_path / "out")
    q.close()
    # (the start tests each pending record against the terminal folders by access(2)
    # probes, or in one listing of them when that is cheaper: both ways are taken here)
    import renderctl.store

    monkeypatch.setattr(renderctl.store, "LIST_OVER_PROBE", list_over_probe)

    # When a runner's start indexes pending/ (a Queue that did not submit those jobs itself)
    index = ClaimIndex()
    fresh = Queue(queue)
    n = fresh.load_index(index)
    fresh.close()

    # Then the copy is not indexed to run again, and is kept in corrupt/, the others indexed
    assert n == 30 and "d1" not in index
    assert QueueView(queue).states_of(["d1"]) == {"d1": ["done"]}
    [kept] = os.listdir(queue / "corrupt")
    assert kept.startswith("pending.d1.json.")
