"""`cancel --all` and `cancel --group NAME`: a wrong batch taken back in one command, its
pending jobs cancelled in batches (one sync per batch, not three per job), its running jobs
through the runner, as `cancel ID...` does. Real runner, real files, real crash points."""

from __future__ import annotations

import json
import signal
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
    wait_for_pid,
    wait_until,
)

from renderctl.errors import ExitCode
from renderctl.store import SMALL_BATCH

MANY = SMALL_BATCH * 3  # more than a small batch: the batched path, with its one sync


def _held_runner(tmp_path: Path, write_manifest: Any,
                 pending: list[dict[str, Any]]) -> tuple[Path, Path, Runner, Path]:
    """d done; r running (held until ``go`` exists) in group "a"; ``pending`` behind it.
    One worker, no prefetch: exactly r is in running/."""
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    first = write_manifest([{**py_job("d", "write_pdf"), "group": "a"}], name="d.toml")
    assert run_cli("run", first, *cli_args(queue, out)).returncode == 0
    pidfile, go = tmp_path / "r.pid", tmp_path / "go"
    manifest = write_manifest(
        [{**py_job("r", "wait_for_go", pidfile=str(pidfile), go=str(go)), "priority": 9,
          "group": "a"}, *pending])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--prefetch", "1",
                                        "--json"))
    wait_for_pid(pidfile)
    return queue, out, runner, go


def test_cancel_all_cancels_every_pending_and_running_job_and_no_finished_one(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a finished job, a running one, and many pending ones (more than a small batch)
    pending = [f"p{i:03d}" for i in range(MANY)]
    queue, out, runner, go = _held_runner(
        tmp_path, write_manifest, [py_job(j, "write_pdf") for j in pending])
    try:
        view = QueueView(queue)
        assert view.ids("running") == {"r"}

        # When the user cancels everything
        res = run_cli("cancel", "--all", "--json", "--queue", queue)

        # Then each pending job is cancelled at once, the running one by its runner, the
        # finished one is not named; one request, for the one running job
        assert res.returncode == 0, res.stdout + res.stderr
        assert json.loads(res.stdout) == {**{j: "cancelled" for j in pending},
                                          "r": "cancel requested"}
        assert runner.wait(60) == ExitCode.JOBS_FAILED, runner.lines
    finally:
        go.touch()
        runner.close()
    states = view.states_of(["d", "r", *pending])
    assert states == {"d": ["done"], "r": ["cancelled"], **{j: ["cancelled"] for j in pending}}
    assert not (out / "r.pdf").exists()
    assert not list((queue / "control").glob("cancel.*"))
    assert view.tmp_entries() == []
    for j in pending:
        assert view.record("cancelled", j)["reason"] == "cancelled while pending"
    logged = [e["job"] for e in json_lines((queue / "events.jsonl").read_text())
              if e["event"] == "cancelled" and e["job"] in pending]
    assert sorted(logged) == pending  # each once

    # And a second --all finds nothing to do: said so, exit 0, nothing printed on stdout
    again = run_cli("cancel", "--all", "--queue", queue)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout == ""
    assert again.stderr.strip() == "renderctl: nothing to cancel: no job is pending or running"
    again_json = run_cli("cancel", "--all", "--json", "--queue", queue)
    assert (again_json.returncode, json.loads(again_json.stdout)) == (0, {})


def test_cancel_group_cancels_only_that_groups_live_jobs(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given r running and d done in group "a"; pending jobs of groups "a" and "b"
    in_a = [f"a{i:03d}" for i in range(MANY)]
    in_b = ["b1", "b2"]
    queue, out, runner, go = _held_runner(
        tmp_path, write_manifest,
        [{**py_job(j, "write_pdf"), "group": "a"} for j in in_a]
        + [{**py_job(j, "write_pdf"), "group": "b"} for j in in_b])
    try:
        # When the user cancels group "a" (plain output)
        res = run_cli("cancel", "--group", "a", "--queue", queue)

        # Then a's pending and running jobs are cancelled, one line each as `cancel ID`
        # prints them; b's jobs run on
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stdout.splitlines() == [f"{j}: cancelled" for j in in_a] \
            + ["r: cancel requested"]
        assert runner.wait(60) == ExitCode.JOBS_FAILED, runner.lines
    finally:
        go.touch()
        runner.close()
    view = QueueView(queue)
    assert view.states_of(["d", "r", *in_a, *in_b]) == {
        "d": ["done"], "r": ["cancelled"], **{j: ["cancelled"] for j in in_a},
        **{j: ["done"] for j in in_b}}

    # And a group with no live job: said so, exit 0
    none = run_cli("cancel", "--group", "b", "--queue", queue)
    assert none.returncode == 0, none.stdout + none.stderr
    assert none.stderr.strip() == \
        "renderctl: nothing to cancel: no job of group 'b' is pending or running"


def test_cancel_all_killed_mid_batch_leaves_each_job_in_one_folder(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given many pending jobs, and `cancel --all` SIGKILLed once a batch is out of
    # pending/ and synced, before its records are rewritten and anything is reported
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    ids = [f"p{i:03d}" for i in range(MANY)]
    manifest = write_manifest([py_job(j, "write_pdf") for j in ids])
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
    killed = run_cli("cancel", "--all", "--queue", queue,
                     env={"RENDERCTL_CRASH_AT": "cancel:moved"})
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert killed.stdout == ""  # nothing was reported

    # When a runner starts on the queue
    res = run_cli("run", *cli_args(queue, out))

    # Then no job runs: each is cancelled, in exactly one folder, none ever published, and
    # the cut batch's temporaries are swept
    assert res.returncode == 0, res.stdout + res.stderr
    view = QueueView(queue)
    assert view.states_of(ids) == {j: ["cancelled"] for j in ids}
    assert not out.exists() or list(out.iterdir()) == []
    wait_until(lambda: view.tmp_entries() == [], what="the cut cancel's temporaries to go")
    again = run_cli("cancel", "--all", "--queue", queue)
    assert again.returncode == 0 and again.stdout == "", again.stdout + again.stderr


def test_a_replace_of_a_job_taken_but_not_yet_settled_leaves_one_copy(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given x and y pending (x as v1); `cancel x y` frozen before y: x is out of pending/,
    # its batch not yet settled (record not rewritten, nothing synced or reported)
    from test_races_cancel import _finish, _frozen

    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    v1 = write_manifest([py_job("x", "write_pdf", output="x1.pdf"), py_job("y", "write_pdf")],
                        name="v1.toml")
    v2 = write_manifest([py_job("x", "write_pdf", output="x2.pdf")], name="v2.toml")
    assert run_cli("submit", v1, *cli_args(queue, out)).returncode == 0
    cancel = _frozen(["cancel", "x", "y", "--json", "--queue", str(queue)], "cancel:before:n=2")
    try:
        view = QueueView(queue)
        assert view.states_of(["x", "y"]) == {"x": ["cancelled"], "y": ["pending"]}

        # When x is replaced meanwhile (v2), then the cancel goes on
        rep = run_cli("submit", v2, "--replace", *cli_args(queue, out))
        assert rep.returncode == 0, rep.stdout + rep.stderr
        code, stdout, stderr = _finish(cancel)
    finally:
        if cancel.poll() is None:
            cancel.kill()

    # Then the cancel reports what it did (x as it was, v1, and y cancelled), and the
    # settling brings no cancelled copy of v1 back beside v2: x is pending as v2, once,
    # nothing quarantined; a run completes it as v2
    assert code == 0, stdout + stderr
    assert json.loads(stdout) == {"x": "cancelled", "y": "cancelled"}
    assert view.states_of(["x", "y"]) == {"x": ["pending"], "y": ["cancelled"]}
    assert not (queue / "corrupt").exists() or list((queue / "corrupt").iterdir()) == []
    assert run_cli("run", *cli_args(queue, out)).returncode == 0
    assert view.states_of(["x"]) == {"x": ["done"]}
    assert view.record("done", "x")["spec"]["output"].endswith("x2.pdf")


def test_a_cancel_killed_before_it_settled_what_it_took_is_settled_by_the_next_command(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given four pending jobs, and a cancel of all four killed as it comes to the third: the
    # first two taken from pending/ (the rename is the cancel), not yet settled
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    ids = ["p0", "p1", "p2", "p3"]
    assert run_cli("submit", write_manifest([py_job(j, "write_pdf") for j in ids]),
                   *cli_args(queue, out)).returncode == 0
    killed = run_cli("cancel", *ids, "--queue", queue,
                     env={"RENDERCTL_CRASH_AT": "cancel:before:n=3"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    view = QueueView(queue)
    assert view.ids("cancelled") == {"p0", "p1"}

    # When any command opens the queue next (here `status`)
    assert run_cli("status", "--queue", queue).returncode == 0

    # Then those two are settled as any cancel of a pending job is (its reason, its event),
    # and the next run completes the other two
    for jid in ("p0", "p1"):
        assert view.record("cancelled", jid)["reason"] == "cancelled while pending", jid
    events = [json.loads(line) for line in (queue / "events.jsonl").read_text().splitlines()]
    assert sorted(e["job"] for e in events if e["event"] == "cancelled") == ["p0", "p1"]
    assert [n for n in (queue / "journal").iterdir() if n.suffix == ".cancel"] == []
    ran = run_cli("run", *cli_args(queue, out))
    assert ran.returncode == ExitCode.OK, ran.stdout + ran.stderr
    assert view.ids("done") == {"p2", "p3"} and view.ids("cancelled") == {"p0", "p1"}
