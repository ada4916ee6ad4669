"""What every command does with a damaged queue folder: something that is not a record file
where a record should be (a folder, a FIFO), put there by hand.

DESIGN: corrupt/ holds "queue files that could not be parsed, quarantined and reported, never
lost"; the other jobs go on. Real files and real `renderctl` processes."""

from __future__ import annotations

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
    kill_mid_job,
    py_job,
    run_cli,
    stage,
)

from renderctl.errors import ExitCode
from renderctl.store import Queue


def _misplaced(folder: Path, kind: str) -> None:
    """Put a ``kind`` ("folder", "fifo", "socket", "symlink-to-socket" or
    "dangling-symlink") named like a record, zz.json, into ``folder``."""
    path = folder / "zz.json"
    if kind == "folder":
        path.mkdir()
        (path / "inside").write_text("kept\n")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind in ("socket", "symlink-to-socket"):
        # (review FA: opening it is ENXIO, which stopped every runner with 74; review FB:
        # through a symlink it was left in place, counted pending for good)
        import socket

        bound = path if kind == "socket" else folder.parent / "sock"
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(bound))
        if kind != "socket":
            os.symlink(bound, path)
    else:
        os.symlink(folder / "nowhere.json", path)


@pytest.mark.parametrize("kind", ["folder", "fifo", "socket", "symlink-to-socket",
                                  "dangling-symlink"])
@pytest.mark.parametrize("state", ["pending", "running"])
def test_a_non_file_named_like_a_record_is_quarantined_and_the_queue_goes_on(
        tmp_path: Path, write_manifest: Any, state: str, kind: str) -> None:
    # Given a queue with a job, and a folder or a FIFO named like a record beside it
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("good", "write_pdf")])
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == ExitCode.OK
    _misplaced(queue / state, kind)

    # When `status` looks and a runner runs (a FIFO hung both: open(2) waits for a writer,
    # deaf to SIGTERM; a folder made them exit 74, every time; a dangling symlink was
    # counted by `status` as a job forever, and never run)
    st = run_cli("status", "--json", "--queue", str(queue), timeout=30)
    res = run_cli("run", *cli_args(queue, out, "--workers", "1"), timeout=30)

    # Then the other job completed, and the intruder is kept in corrupt/, reported by name
    assert st.returncode == ExitCode.OK, st.stdout + st.stderr
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert QueueView(queue).states_of(["good"]) == {"good": ["done"]}
    assert not os.path.lexists(queue / state / "zz.json")
    [kept] = os.listdir(queue / "corrupt")
    assert kept.startswith(f"{state}.zz.json.")
    if kind == "folder":
        assert (queue / "corrupt" / kept / "inside").read_text() == "kept\n"
    events = [json.loads(ln) for ln in (queue / "events.jsonl").read_text().splitlines()]
    [ev] = [e for e in events if e["event"] == "corrupt"]
    assert ev["file"] == f"{state}/zz.json" and "not a regular file" in ev["reason"]
    assert "Traceback" not in res.stderr + st.stderr


@pytest.mark.parametrize("state", ["running", "dead"])
def test_a_record_quarantined_by_a_reader_is_named_by_it_and_by_show_afterwards(
        tmp_path: Path, state: str) -> None:
    # Given a queue whose record of zz in running/ (or dead/) was cut to nothing
    queue = tmp_path / "q"
    Queue(queue).close()
    (queue / state / "zz.json").write_bytes(b"")

    # When `status` (which reads running/) or `dead list` (dead/) comes across it
    reader = ["status"] if state == "running" else ["dead", "list"]
    res = run_cli(*reader, "--queue", str(queue))

    # Then it says which file it moved where (it moved it without a word before)
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    [kept] = os.listdir(queue / "corrupt")
    assert f"{state}/zz.json" in res.stderr and f"corrupt/{kept}" in res.stderr, res.stderr
    # And `show zz` later names it too, rather than "no job 'zz'"
    shown = run_cli("show", "zz", "--queue", str(queue))
    assert shown.returncode == ExitCode.USAGE
    assert kept in shown.stderr and "no job" not in shown.stderr, shown.stderr


@pytest.mark.parametrize("command", [["cancel"], ["wait", "--timeout", "5"]])
def test_cancel_and_wait_of_a_job_whose_record_was_quarantined_say_where_it_went(
        tmp_path: Path, write_manifest: Any, command: list[str]) -> None:
    # Given a pending job whose record was then cut to nothing
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("zz", "write_pdf")])
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == ExitCode.OK
    (queue / "pending" / "zz.json").write_bytes(b"")

    # When `cancel zz` or `wait zz` looks it up (and quarantines it)
    res = run_cli(*command, "zz", "--queue", queue)

    # Then it says where the record went, as `show` does, rather than that the job it
    # accepted is no job at all ("no such job: zz"): `cancel` changes nothing (exit 2);
    # `wait` ends the wait for it as `corrupt`, not completed (exit 1), as when the record
    # is found damaged while it waits (it said "not found", exit 2: an unknown id's answer)
    if command[0] == "cancel":
        assert res.returncode == ExitCode.USAGE, res.stdout + res.stderr
    else:
        assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
        assert res.stdout == "zz: corrupt\n", res.stdout
    [kept] = os.listdir(queue / "corrupt")
    assert "no such job" not in res.stderr, res.stderr
    assert "job 'zz': its record " in res.stderr, res.stderr
    assert f"moved to {queue}/corrupt/{kept}" in res.stderr, res.stderr


@pytest.mark.parametrize("damage", ["quarantined", "deleted"])
def test_a_wait_for_a_job_whose_record_goes_away_meanwhile_ends(
        tmp_path: Path, write_manifest: Any, damage: str) -> None:
    import subprocess

    from jobfns import RENDERCTL, _env, wait_until

    # Given `wait zz ok` on two pending jobs (no runner yet), waiting in its poll loop
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("zz", "write_pdf"), py_job("ok", "write_pdf")])
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == ExitCode.OK
    waiting = subprocess.Popen([*RENDERCTL, "wait", "zz", "ok", "--json", "--queue", queue],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=_env(None))
    try:
        wait_until(lambda: waiting.poll() is not None or Path(
            f"/proc/{waiting.pid}/wchan").read_text() == "hrtimer_nanosleep",
            what="wait to poll")

        # When zz's record goes away: found damaged and moved to corrupt/ (by `show`, as
        # by a runner), or deleted by hand; and ok then runs
        record = queue / "pending" / "zz.json"
        if damage == "quarantined":
            record.write_bytes(b"")
            assert run_cli("show", "zz", "--queue", queue).returncode == ExitCode.USAGE
        else:
            record.unlink()
        assert run_cli("run", *cli_args(queue, out)).returncode == ExitCode.OK

        # Then the wait ends (it waited for good for a job that can never finish), zz
        # counted as not completed (exit 1) and named for what happened to it
        res_out, res_err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
        waiting.wait()
    assert waiting.returncode == ExitCode.JOBS_FAILED, res_err
    state = "corrupt" if damage == "quarantined" else "not found"
    assert json.loads(res_out) == {"zz": state, "ok": "done"}
    assert ("its record could not be read and was moved to" if damage == "quarantined"
            else "no job 'zz'") in res_err, res_err


def test_a_hand_edited_record_with_odd_values_inside_is_shown_not_a_traceback(
        tmp_path: Path) -> None:
    # Given a completed job and a dead one, whose records a person then edited: numbers
    # turned into text, lists and objects where numbers belong
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = tmp_path / "jobs.json"
    manifest.write_text(json.dumps({"jobs": [
        py_job("ok", "write_pdf"), {**py_job("bad", "fail"), "max_attempts": 1}]}))
    assert run_cli("run", manifest, *cli_args(queue, out), cwd=tmp_path).returncode == 1
    for state, jid in (("done", "ok"), ("dead", "bad")):
        path = queue / state / f"{jid}.json"
        rec = json.loads(path.read_text())
        rec["attempts"][0].update(elapsed_s="slow", peak_memory_bytes={"a": 1}, n="one",
                                  exit_code=[1], error=5, started_at="then")
        if rec.get("result"):
            rec["result"].update(bytes="x", pages=[1], elapsed_s=None, queued_s="q")
        path.write_text(json.dumps(rec))

    # When every command that reads them runs
    for args in (["show", "ok"], ["show", "bad"], ["show", "ok", "--json"], ["dead", "list"],
                 ["dead", "list", "--json"], ["status"], ["status", "--json"], ["metrics"],
                 ["wait", "ok", "bad"]):
        res = run_cli(*args, "--queue", queue, cwd=tmp_path)
        # Then each shows what is there, and none dies with a traceback
        assert "Traceback" not in res.stderr, (args, res.stderr)
        assert res.returncode in (0, 1), (args, res.stdout, res.stderr)


def test_a_damaged_record_whose_name_is_not_utf8_is_reported_in_valid_utf8(
        tmp_path: Path) -> None:
    # Given a queue whose pending/ holds a damaged file whose name is not UTF-8 (bytes from
    # another system's encoding)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = tmp_path / "jobs.json"
    manifest.write_text(json.dumps({"jobs": [py_job("ok", "write_pdf")]}))
    assert run_cli("submit", manifest, *cli_args(queue, out), cwd=tmp_path).returncode == 0
    with open(os.fsencode(queue / "pending") + b"/bad\xff.json", "wb") as fh:
        fh.write(b"garbage")

    # When a run reports it (a plain line each), and the job beside it runs
    res = subprocess.run([*RENDERCTL, "run", *cli_args(queue, out)], capture_output=True,
                         env=_env(None), cwd=tmp_path, timeout=60)

    # Then what it prints is valid UTF-8 (the byte shown as an escape), not a raw 0xff
    text = (res.stdout + res.stderr).decode("utf-8")
    assert res.returncode == 0, text
    assert "bad\\xff.json" in text, text


@pytest.mark.parametrize("command", [["dead", "list"], ["dead", "retry", "--all"]])
def test_a_copy_of_a_dead_record_under_a_name_no_job_has_is_quarantined_not_a_blocker(
        tmp_path: Path, command: list[str]) -> None:
    # Given a dead-lettered job, and a copy of its record that a person made beside it
    # under a name no job can have (a file manager's "bad (copy).json")
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = tmp_path / "jobs.json"
    manifest.write_text(json.dumps({"jobs": [{**py_job("bad", "fail"), "max_attempts": 1}]}))
    assert run_cli("run", manifest, *cli_args(queue, out), cwd=tmp_path).returncode == 1
    (queue / "dead" / "bad (copy).json").write_bytes((queue / "dead" / "bad.json").read_bytes())

    # When `dead list` or `dead retry --all` looks at dead/
    res = run_cli(*command, "--json", "--queue", queue)

    # Then the copy is quarantined and reported, as a runner does with one in pending/, and
    # the job is listed or retried (`--all` refused everything with exit 2, saying the file
    # it had just listed in dead/ was "not found"; `dead list` skipped it without a word,
    # while `status` counted it as a dead job)
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert "dead/bad (copy).json" in res.stderr, res.stderr
    [kept] = os.listdir(queue / "corrupt")
    assert kept.startswith("dead.bad (copy).json.")
    if command[1] == "list":
        assert [r["id"] for r in json.loads(res.stdout)] == ["bad"]
        assert QueueView(queue).states_of(["bad"]) == {"bad": ["dead"]}
    else:
        assert json.loads(res.stdout) == {"retried": ["bad"], "vanished": []}
        assert QueueView(queue).states_of(["bad"]) == {"bad": ["pending"]}


@pytest.mark.parametrize(("suffix", "bell"), [
    ("new", b"[1, 2]"), ("new", b'{"records": [{"spec": 5}]}'), ("new", b'{"records": 7}'),
    ("new", b'{"entries": 7}'), ("new", b'{"entries": [["s", 5, 0, "g", 0, 0, null]]}'),
    ("new", b'{"entries": [["s", "x"]]}'), ("revive", b"7")])
def test_a_hand_made_doorbell_that_is_json_but_not_a_batch_does_not_stop_a_runner(
        tmp_path: Path, write_manifest: Any, suffix: str, bell: bytes) -> None:
    # Given a runner following a queue, and in journal/ a doorbell (`<seq>.new`: "these ids
    # are new"; `.revive`: "these dead ids are pending again") that parses as JSON but is
    # not what it should be (hand-made, or another tool's)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(*cli_args(queue, out, "--workers", "1", "--follow", "--json"))
    try:
        runner.until(lambda ln: '"runner_started"' in ln)
        (queue / "journal" / f"{1:020d}.{suffix}").write_bytes(bell)

        # When a job is submitted (its doorbell is read after that one)
        manifest = write_manifest([py_job("after", "write_pdf")])
        assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == ExitCode.OK

        # Then the runner goes on and runs it (it died with a traceback, exit 70, before)
        line = runner.until(lambda ln: '"completed"' in ln or '"runner_stopped"' in ln,
                            timeout_s=30)
        assert json.loads(line)["event"] == "completed", runner.stderr()
        assert_pdf(out / "after.pdf", "after")
        assert not (queue / "journal" / f"{1:020d}.{suffix}").exists()
        os.kill(runner.pid, signal.SIGTERM)
        assert runner.wait(30) == 128 + signal.SIGTERM
        assert "Traceback" not in runner.stderr()
    finally:
        runner.close()


@pytest.mark.parametrize("note", [b'{"pgid": 5}', b"[1]", b'[{"pgid": "x"}]', b"7"])
def test_a_damaged_worker_list_of_a_dead_runner_does_not_stop_the_next(
        tmp_path: Path, write_manifest: Any, note: bytes) -> None:
    # Given a queue whose control/ holds a dead runner's worker list that is JSON but not a
    # list of process groups
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    Queue(queue).close()
    (queue / "control" / "workers.deadbeef.json").write_bytes(note)

    # When a runner starts (it kills what a dead runner's workers left)
    manifest = write_manifest([py_job("ok", "write_pdf")])
    res = run_cli("run", manifest, *cli_args(queue, out), cwd=tmp_path, timeout=60)

    # Then it runs the job (it died with a traceback before), and the note is gone
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert_pdf(out / "ok.pdf", "ok")
    assert not (queue / "control" / "workers.deadbeef.json").exists()


def test_a_dead_runners_worker_group_id_reused_since_is_left_alone(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner killed mid-job, whose worker list stays in control/ once its workers
    # are gone
    stage(tmp_path)
    queue, out, pidfile = tmp_path / "q", tmp_path / "out", tmp_path / "slow.pid"
    manifest = write_manifest([py_job("slow", "sleep_then_write", s=60, sleep_attempts=1,
                                      pidfile=str(pidfile))])
    kill_mid_job(Runner(manifest, *cli_args(queue, out, "--workers", "1")), pidfile)
    (stale,) = (queue / "control").glob("workers.*.json")

    # And its worker's group id has since gone to an unrelated process group (pids are
    # reused: a reboot, a container restart, or time), made here by naming a new one's id
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        entries = json.loads(stale.read_text())
        assert entries
        stale.write_text(json.dumps([e | {"pid": other.pid, "pgid": other.pid}
                                     for e in entries]))

        # When the next runner starts (it kills what a dead runner's workers left)
        res = run_cli("run", *cli_args(queue, out, "--workers", "1"), cwd=tmp_path,
                      timeout=60)

        # Then it runs the job again, and leaves that group alone (it SIGKILLed it before)
        assert res.returncode == ExitCode.OK, res.stdout + res.stderr
        assert other.poll() is None, "an unrelated process group was SIGKILLed"
        assert_pdf(out / "slow.pdf", "slow")
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("command", ["submit", "run"])
def test_a_record_a_submit_quarantines_is_reported_and_its_id_accepted_anew(
        tmp_path: Path, write_manifest: Any, command: str) -> None:
    # Given a queue whose done record of `a` was cut short (a disk fault, a hand edit)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("a", "write_pdf")])
    assert run_cli("run", manifest, *cli_args(queue, out)).returncode == 0
    (queue / "done" / "a.json").write_bytes(b'{"truncated')
    (out / "a.pdf").unlink()

    # When the same manifest is submitted again (or run)
    res = run_cli(command, manifest, *cli_args(queue, out))

    # Then the command says which record it moved where (it moved it without a word, then
    # accepted `a` as a new job), and `a` runs again
    assert res.returncode == 0, res.stdout + res.stderr
    [kept] = os.listdir(queue / "corrupt")
    assert "done/a.json" in res.stderr and f"corrupt/{kept}" in res.stderr, res.stderr
    if command == "run":
        assert_pdf(out / "a.pdf", "a")


def test_a_damaged_journal_entry_found_as_the_queue_opens_is_reported(tmp_path: Path) -> None:
    # Given a queue holding a committed-looking journal entry that cannot be read
    queue = tmp_path / "q"
    Queue(queue).close()
    (queue / "journal" / "0001.txn").write_bytes(b"\x00garbage")

    # When `status` opens the queue (which rolls committed entries forward first)
    res = run_cli("status", "--queue", str(queue))

    # Then it says what it moved to corrupt/, as it does for records it reads
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    [kept] = os.listdir(queue / "corrupt")
    assert "journal/0001.txn" in res.stderr and f"corrupt/{kept}" in res.stderr, res.stderr


def test_a_journal_entry_name_a_power_cut_left_on_a_reused_file_is_dropped_not_reported(
        tmp_path: Path) -> None:
    # Given a queue whose journal/ holds an entry's name that a power cut brought back
    # after its file was reused by another (the runner's holder record): one file, two names
    queue = tmp_path / "q"
    Queue(queue).close()
    other = queue / "control" / "holder.1-2.json"
    other.write_text('{"host": "vm", "pid": 1}')
    os.link(other, queue / "journal" / "0001.txn")

    # When `status` opens the queue
    res = run_cli("status", "--queue", str(queue))

    # Then the stale name is gone, nothing is reported or moved to corrupt/, and the
    # other file is as it was
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert "corrupt" not in res.stderr, res.stderr
    assert os.listdir(queue / "corrupt") == []
    assert not (queue / "journal" / "0001.txn").exists()
    assert other.read_text() == '{"host": "vm", "pid": 1}'


def test_control_characters_from_ids_names_and_records_are_shown_not_obeyed(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a dead job whose record a person edited to hold terminal escapes, and a
    # manifest whose file name holds ESC and a newline
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([{**py_job("bad", "fail"), "max_attempts": 1}])
    assert run_cli("run", manifest, *cli_args(queue, out)).returncode == 1
    path = queue / "dead" / "bad.json"
    rec = json.loads(path.read_text())
    rec["attempts"][0]["outcome"] = "failed\x1b[31m\x07"
    path.write_text(json.dumps(rec))
    odd = tmp_path / "evil\x1b[31m\nname.toml"
    odd.write_text('[[jobs]]\nid = "x"\n')
    weird = "a\x1b[31mb\x07"

    # When commands name them (an unknown id, the record, a manifest's problems)
    results = [run_cli("cancel", weird, "--queue", queue),
               run_cli("wait", weird, "--queue", queue),
               run_cli("dead", "retry", weird, "--queue", queue),
               run_cli("show", "bad", "--queue", queue),
               run_cli("validate", odd, "--out", out)]

    # Then no ESC or BEL reaches the terminal, and each problem stays on one line
    for res in results:
        for text in (res.stdout, res.stderr):
            assert "\x1b" not in text and "\x07" not in text, (res.args, text)
    problems = results[-1].stderr.splitlines()
    assert problems and all(line.startswith("renderctl: ") for line in problems), problems
    assert "\\x1b[31m" in results[0].stderr and "\\x1b[31m" in results[3].stdout


def test_prune_moves_a_record_it_cannot_read_to_corrupt_and_says_so(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given two completed jobs, one of whose done records was cut short, both old
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("a", "write_pdf"), py_job("b", "write_pdf")])
    assert run_cli("run", manifest, *cli_args(queue, out)).returncode == 0
    (queue / "done" / "a.json").write_bytes(b'{"cut')
    past = 1_000_000_000
    rec = json.loads((queue / "done" / "b.json").read_text())
    (queue / "done" / "b.json").write_text(json.dumps({**rec, "changed_at": past}))
    for name in ("a", "b"):
        os.utime(queue / "done" / f"{name}.json", (past, past))

    # When old records are pruned
    res = run_cli("prune", "--older-than", "1d", "--queue", queue)

    # Then the readable one is forgotten and the damaged one is moved to corrupt/ and
    # named (it was left in done/ for good, without a word)
    assert res.returncode == 0, res.stdout + res.stderr
    assert os.listdir(queue / "done") == []
    [kept] = os.listdir(queue / "corrupt")
    assert "done/a.json" in res.stderr and f"corrupt/{kept}" in res.stderr, res.stderr


def test_dead_retry_of_a_job_whose_record_was_quarantined_says_where_it_went(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a dead job whose record was cut short, then quarantined by `dead list`
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([{**py_job("zz", "fail"), "max_attempts": 1}])
    assert run_cli("run", manifest, *cli_args(queue, out)).returncode == ExitCode.JOBS_FAILED
    (queue / "dead" / "zz.json").write_bytes(b"{")
    assert run_cli("dead", "list", "--queue", queue).returncode == ExitCode.OK
    [kept] = os.listdir(queue / "corrupt")

    # When `dead retry zz` asks for it
    res = run_cli("dead", "retry", "zz", "--queue", queue)

    # Then it is refused as not in dead/, saying where its record went (as `cancel` does;
    # it read as if no such job had ever died)
    assert res.returncode == ExitCode.USAGE, res.stdout + res.stderr
    assert "not in dead/: zz (its record could not be read" in res.stderr, res.stderr
    assert f"{queue}/corrupt/{kept}" in res.stderr, res.stderr


@pytest.mark.parametrize("command", ["submit", "run"])
def test_a_queue_folder_replaced_by_a_file_is_named_by_submit_and_run(
        tmp_path: Path, write_manifest: Any, command: str) -> None:
    # Given a queue whose done/ folder was replaced by a file
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    Queue(queue).close()
    (queue / "done").rmdir()
    (queue / "done").write_text("")

    # When a manifest is submitted (or run) into it
    res = run_cli(command, write_manifest([py_job("a", "write_pdf")]), *cli_args(queue, out))

    # Then the I/O error names that folder (it said "cannot create queue ...: File exists",
    # as if the queue itself were in the way), and nothing is enqueued
    assert res.returncode == ExitCode.IO_ERROR, res.stdout + res.stderr
    assert f"{queue}/done: not a folder" in res.stderr, res.stderr
    assert os.listdir(queue / "pending") == []


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_cancel_request_named_for_no_job_is_removed_not_a_stop(tmp_path: Path,
                                                                  what: str) -> None:
    # Given a queue whose control/ holds a cancel request named for no job id (a file made
    # by hand, or by an API call of a version that took any id)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = tmp_path / "jobs.json"
    manifest.write_text(json.dumps({"jobs": [py_job("a", "write_pdf")]}))
    assert run_cli("submit", manifest, *cli_args(queue, out), cwd=tmp_path).returncode == 0
    stray = queue / "control" / "cancel.x y"
    if what == "file":
        stray.write_bytes(b"")
    else:
        stray.mkdir()  # (not removable by unlink: skipped, and left; review CZ)

    # When a runner runs the queue
    res = run_cli("run", *cli_args(queue, out), cwd=tmp_path)

    # Then the job runs and the request is gone (before: every run exited 2, "no job
    # 'x y': not a job id", the job left where it was; review CY)
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert QueueView(queue).states_of(["a"]) == {"a": ["done"]}
    assert stray.exists() == (what == "folder")


def test_a_retry_and_a_cancel_made_stand_when_the_event_log_cannot_be_written(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a dead job, and an event log that cannot be written (a folder in its place: a
    # full disk's failure, without filling one)
    stage(tmp_path)
    manifest = write_manifest([{**py_job("d", "invalid"), "max_attempts": 1}])
    queue, out = tmp_path / "q", tmp_path / "out"
    assert run_cli("run", manifest, *cli_args(queue, out)).returncode == ExitCode.JOBS_FAILED
    (queue / "events.jsonl").rename(tmp_path / "events.old")
    (queue / "events.jsonl").mkdir()

    # When it is retried, then cancelled
    retry = run_cli("dead", "retry", "d", "--queue", queue)
    retried = QueueView(queue).ids("pending")
    cancel = run_cli("cancel", "d", "--queue", queue)

    # Then each change is made and said, with the log's failure beside it, not as the
    # command's (audit DN: exit 74 for a retry or a cancel it had made durable)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    assert retried == {"d"}
    assert "jobs retried, but logging to the event log failed" in retry.stderr, retry.stderr
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert cancel.stdout.strip() == "d: cancelled"
    assert "jobs cancelled, but logging to the event log failed" in cancel.stderr
    assert QueueView(queue).ids("cancelled") == {"d"}


def test_a_cancel_of_a_job_its_dead_runner_left_stands_when_the_event_log_fails(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import orphan_a_job

    # Given a job left in running/ by a SIGKILLed runner, and an event log that cannot be
    # written (a folder in its place)
    queue, _ = orphan_a_job(tmp_path, write_manifest)
    (queue / "events.jsonl").rename(tmp_path / "events.old")
    (queue / "events.jsonl").mkdir()

    # When it is cancelled
    cancel = run_cli("cancel", "a", "--queue", queue)

    # Then it is, and says so, the log's failure beside it (review DP: exit 74, no answer,
    # for a cancel made)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert cancel.stdout.strip() == "a: cancelled"
    assert "jobs cancelled, but logging to the event log failed" in cancel.stderr
    assert QueueView(queue).ids("cancelled") == {"a"}
