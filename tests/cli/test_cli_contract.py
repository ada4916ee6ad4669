"""What the command line promises around its edges: all-or-none commands, JSON on every
outcome of a --json command, honest exit codes, one line per event."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clihelp import RENDERCTL, cli, env, job, poll, stopped, write_jobs


class BackgroundRunner:
    """A `renderctl run --follow` holding ``queue``, busy with one long job (``long``)."""

    def __init__(self, folder: Path, queue: Path, out: Path) -> None:
        manifest = write_jobs(folder / "bg", [job("long", "sleep", params={"s": "60"})])
        self.proc = subprocess.Popen(
            [*RENDERCTL, "run", str(manifest), "--queue", str(queue), "--out", str(out),
             "--workers", "1", "--follow", "--grace", "0", "--json"],
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


# -- --json says what happened, whatever happened ---------------------------------------------


def bad_manifest(folder: Path) -> Path:
    path = write_jobs(folder, [job("x", "write")])
    path.write_text(path.read_text() + 'memroy_mb = 1\n')
    return path


def test_run_json_reports_manifest_problems_as_submit_json_does(tmp_path: Path) -> None:
    # Given a manifest with an unknown field
    manifest = bad_manifest(tmp_path / "m")
    q = tmp_path / "q"

    # When it is given to `submit --json` and to `run --json`
    submitted = cli("submit", manifest, "--json", "--queue", q, cwd=tmp_path)
    ran = cli("run", manifest, "--json", "--queue", q, cwd=tmp_path)

    # Then both exit 2 and print the same JSON object naming the problem on stdout
    assert (submitted.returncode, ran.returncode) == (2, 2), ran.stderr
    doc = json.loads(ran.stdout)
    assert doc == json.loads(submitted.stdout)
    assert doc["accepted"] == []
    assert [(p["job"], p["field"]) for p in doc["problems"]] == [("x", "memroy_mb")]


def test_run_tells_to_replace_with_submit(tmp_path: Path) -> None:
    # Given a job in the queue, and a manifest that changes its spec
    folder = tmp_path / "m"
    q = tmp_path / "q"
    assert cli("submit", write_jobs(folder, [job("a", "write")]), "--queue", q,
               cwd=tmp_path).returncode == 0
    changed = write_jobs(folder, [job("a", "write", max_attempts=2)])

    # When `run` is given it (run has no --replace)
    res = cli("run", changed, "--queue", q, cwd=tmp_path)
    as_json = cli("run", changed, "--json", "--queue", q, cwd=tmp_path)

    # Then it refuses (exit 2) and points at the command that can replace it
    assert res.returncode == 2, res.stderr
    assert "renderctl submit --replace" in res.stderr, res.stderr
    assert "nothing was enqueued" in res.stderr
    assert as_json.returncode == 2
    [problem] = json.loads(as_json.stdout)["problems"]
    assert problem["job"] == "a" and "renderctl submit --replace" in problem["message"]
    # And `submit` itself still says --replace, which it has
    sub = cli("submit", changed, "--queue", q, cwd=tmp_path)
    assert sub.returncode == 2 and "use --replace" in sub.stderr


def test_submit_json_when_saturated(tmp_path: Path) -> None:
    # Given an empty queue that admits one pending job
    manifest = write_jobs(tmp_path / "m", [job("a", "write"), job("b", "write")])
    q = tmp_path / "q"

    # When two jobs are submitted with --json
    res = cli("submit", manifest, "--json", "--max-pending", "1", "--queue", q, cwd=tmp_path)

    # Then it exits 75 and says on stdout that it was saturated, and how many would fit
    assert res.returncode == 75, res.stderr
    doc = json.loads(res.stdout)
    assert {k: doc[k] for k in ("accepted", "error", "requested", "pending", "max_pending",
                                "would_fit")} == {
        "accepted": [], "error": "saturated", "requested": 2, "pending": 0,
        "max_pending": 1, "would_fit": 1}
    assert "nothing was enqueued" in doc["message"]


def test_wait_json_on_timeout_and_unknown_ids(tmp_path: Path) -> None:
    # Given a pending job and nothing running the queue
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    q = tmp_path / "q"
    assert cli("submit", manifest, "--queue", q, cwd=tmp_path).returncode == 0

    # When `wait --json` gives up
    timed_out = cli("wait", "a", "--json", "--timeout", "0.2", "--queue", q, cwd=tmp_path)

    # Then it exits 75 and says where the job is
    assert timed_out.returncode == 75
    assert json.loads(timed_out.stdout) == {"a": "pending"}

    # And an unknown id: exit 2, and stdout names it
    unknown = cli("wait", "a", "nope", "--json", "--queue", q, cwd=tmp_path)
    assert unknown.returncode == 2
    assert json.loads(unknown.stdout) == {"nope": "not found"}


def test_dead_retry_purge_and_show_answer_json_on_every_outcome(tmp_path: Path) -> None:
    # Given two dead-lettered jobs and a completed one
    manifest = write_jobs(tmp_path / "m", [job("d1", "fail", max_attempts=1),
                                           job("d2", "fail", max_attempts=1),
                                           job("ok", "write")])
    q = tmp_path / "q"
    run = cli("run", manifest, "--queue", q, "--out", tmp_path / "out", "-j", "1",
              cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr

    # When `dead retry --json` names a done job and an unknown one among the dead
    refused = cli("dead", "retry", "d1", "ok", "nope", "--json", "--queue", q, cwd=tmp_path)

    # Then it retries nothing (exit 2) and stdout maps only those ids to where they are
    assert refused.returncode == 2, refused.stderr
    assert json.loads(refused.stdout) == {"ok": "done", "nope": "not found"}
    assert state_of(q, "d1", tmp_path) == "dead"

    # And `show --json` of an unknown id answers as `cancel --json` does
    shown = cli("show", "nope", "--json", "--queue", q, cwd=tmp_path)
    assert shown.returncode == 2 and "nope" in shown.stderr
    assert json.loads(shown.stdout) == {"nope": "not found"}

    # And a retry that goes through lists what it retried
    retried = cli("dead", "retry", "d1", "--json", "--queue", q, cwd=tmp_path)
    assert retried.returncode == 0, retried.stderr
    assert json.loads(retried.stdout) == {"retried": ["d1"], "vanished": []}
    assert state_of(q, "d1", tmp_path) == "pending"

    # And a purge counts what it deleted
    purged = cli("dead", "purge", "--json", "--queue", q, cwd=tmp_path)
    assert purged.returncode == 0, purged.stderr
    assert json.loads(purged.stdout) == {"purged": 1}
    assert not list((q / "dead").glob("*.json"))


# -- run MANIFEST on a queue another runner holds ---------------------------------------------


def test_run_with_a_manifest_on_a_held_queue_enqueues_nothing(
        tmp_path: Path, busy_queue: BackgroundRunner) -> None:
    # Given a live runner holding the queue
    manifest = write_jobs(tmp_path / "m", [job("mine", "write")])

    # When `run MANIFEST` is pointed at it, plain and with --json
    res = cli("run", manifest, "--queue", busy_queue.queue, cwd=tmp_path)
    as_json = cli("run", manifest, "--json", "--queue", busy_queue.queue, cwd=tmp_path)

    # Then it exits 75 naming the holder, and nothing of the manifest was enqueued
    assert res.returncode == 75, res.stderr
    assert f"pid {busy_queue.proc.pid}" in res.stderr
    assert "nothing was enqueued" in res.stderr
    assert as_json.returncode == 75
    doc = json.loads(as_json.stdout)
    assert (doc["accepted"], doc["error"], doc["holder_pid"]) == ([], "busy",
                                                                  busy_queue.proc.pid)
    assert cli("show", "mine", "--queue", busy_queue.queue, cwd=tmp_path).returncode == 2


def test_a_runner_that_starts_during_run_manifest_gets_its_jobs(tmp_path: Path) -> None:
    # Given `run MANIFEST` frozen after its busy check, inside its submit
    q, out = tmp_path / "q", tmp_path / "out"
    manifest = write_jobs(tmp_path / "m", [job("mine", "write")])
    late = subprocess.Popen([*RENDERCTL, "run", str(manifest), "--queue", str(q), "--out",
                             str(out), "--json"], cwd=tmp_path,
                            env=env({"RENDERCTL_STOP_AT": "submit:checked"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    other = None
    try:
        poll(lambda: stopped(late.pid), timeout_s=30, what="run to stop at submit:checked")
        # And another runner taking the queue meanwhile
        other = subprocess.Popen([*RENDERCTL, "run", "--queue", str(q), "--out", str(out),
                                  "--follow", "--workers", "1"], cwd=tmp_path, env=env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        poll(lambda: (q / "runner.state.json").exists(), timeout_s=30,
             what="the other runner to hold the queue")

        # When the frozen one goes on
        late.send_signal(signal.SIGCONT)
        stdout, stderr = late.communicate(timeout=30)

        # Then it exits 75, saying its jobs were accepted and the other runner will run them
        assert late.returncode == 75, stderr
        assert "1 job(s) accepted above stay queued" in stderr, stderr
        doc = json.loads(stdout.splitlines()[-1])
        assert (doc["accepted"], doc["error"]) == (["mine"], "busy")
        poll(lambda: (q / "done" / "mine.json").exists(), timeout_s=30,
             what="the other runner to run the job")
    finally:
        for proc in (late, other):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()


# -- plain text: one event, one line -----------------------------------------------------------

WHY = "first line\\n\\tsecond line [red]"  # TOML escapes: a newline and a tab


def test_a_multi_line_error_stays_on_one_line_in_plain_text(tmp_path: Path) -> None:
    # Given a job whose exception message spans two lines and holds a tab
    manifest = write_jobs(tmp_path / "m", [job("boom", "fail", max_attempts=1,
                                               params={"why": WHY})])
    q, out = tmp_path / "q", tmp_path / "out"

    # When it runs to dead-letter, printing plain lines, and the dead folder is listed
    run = cli("run", manifest, "--queue", q, "--out", out, "-j", "1", cwd=tmp_path)
    dead = cli("dead", "list", "--queue", q, cwd=tmp_path)

    # Then the dead event is one line with the message escaped, and nothing else starts
    # with the message's second line
    assert run.returncode == 1, run.stderr
    [line] = [ln for ln in run.stdout.splitlines() if ln.startswith("dead ")]
    assert "first line\\n\\tsecond line [red]" in line, run.stdout
    assert not any(ln.lstrip().startswith("second line") for ln in run.stdout.splitlines())
    # And `dead list` is one row of four tab-separated columns
    assert dead.returncode == 0, dead.stderr
    [row] = dead.stdout.splitlines()
    cols = row.split("\t")
    assert cols[:3] == ["boom", "failed", "attempts=1"] and len(cols) == 4, row
    assert "first line\\n\\tsecond line" in cols[3]

    # And `show` prints it as one line too (shown, not obeyed)
    shown = cli("show", "boom", "--queue", q, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "    error: " in shown.stdout and "first line\\n\\tsecond line" in shown.stdout
    assert not any(ln.lstrip().startswith("second line") for ln in shown.stdout.splitlines())

    # And JSON keeps the message as it was
    as_json = json.loads(cli("dead", "list", "--json", "--queue", q, cwd=tmp_path).stdout)
    assert "first line\n\tsecond line [red]" in as_json[0]["error"]
    events = [json.loads(ln) for ln in (q / "events.jsonl").read_text().splitlines()]
    assert any("first line\n\tsecond line" in str(e.get("error")) for e in events)


def test_a_job_dead_before_any_attempt_lists_its_outcome_as_a_dash(tmp_path: Path) -> None:
    # Given a job whose ceiling can never fit the run's memory budget
    manifest = write_jobs(tmp_path / "m", [job("big", "write", memory_mb=400)])
    q = tmp_path / "q"
    run = cli("run", manifest, "--queue", q, "--out", tmp_path / "out", "--memory-budget", "1",
              cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr

    # When the dead folder is listed
    dead = cli("dead", "list", "--queue", q, cwd=tmp_path)

    # Then the row says it has no outcome with a dash, not Python's None
    assert dead.returncode == 0, dead.stderr
    [row] = dead.stdout.splitlines()
    cols = row.split("\t")
    assert cols[:3] == ["big", "-", "attempts=0"], row
    assert "can never fit" in cols[3], row
    # (and what to do about it: audit DM)
    assert cols[3].endswith("or with `dead retry --memory-mb` at most 1"), row
    # And its dead event has no attempt or outcome, as README's events table says
    [ev] = [json.loads(ln) for ln in (q / "events.jsonl").read_text().splitlines()
            if json.loads(ln)["event"] == "dead"]
    assert "attempt" not in ev and "outcome" not in ev and "never fit" in ev["reason"], ev


def test_a_stray_file_in_pending_has_no_age(tmp_path: Path) -> None:
    # Given a queue with nothing pending, and an old file there that is no job's record
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    q = tmp_path / "q"
    assert cli("submit", manifest, "--queue", q, cwd=tmp_path).returncode == 0
    assert cli("cancel", "a", "--queue", q, cwd=tmp_path).returncode == 0
    stray = q / "pending" / "notjson.txt"
    stray.write_text("left by hand")
    an_hour_ago = stray.stat().st_mtime - 3600
    os.utime(stray, (an_hour_ago, an_hour_ago))

    # When status and metrics look at the queue
    st = json.loads(cli("status", "--json", "--queue", q, cwd=tmp_path).stdout)
    plain = cli("status", "--queue", q, cwd=tmp_path).stdout
    metrics = cli("metrics", "--queue", q, cwd=tmp_path).stdout

    # Then the age comes from the same files as the count: none pending, no age
    assert (st["pending"], st["oldest_pending_age_s"]) == (0, None), st
    assert "oldest pending: -;" in plain, plain
    assert "renderctl_oldest_pending_age_seconds 0\n" in metrics, metrics


# -- words ----------------------------------------------------------------------------------

ONE_PAGE = '''

def one_page(inputs, output, params):
    from pypdf import PdfWriter

    w = PdfWriter()
    w.add_blank_page(width=72, height=72)
    w.write(output)
'''


def test_show_says_1_page_not_1_pages(tmp_path: Path) -> None:
    # Given a job that published a one-page PDF
    manifest = write_jobs(tmp_path / "m", [job("p", "one_page", output="p.pdf")])
    with open(tmp_path / "m" / "jobsmod.py", "a") as fh:
        fh.write(ONE_PAGE)
    q = tmp_path / "q"
    run = cli("run", manifest, "--queue", q, "--out", tmp_path / "out", "-j", "1",
              cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr

    # When it is shown
    res = cli("show", "p", "--queue", q, cwd=tmp_path)

    # Then its page count reads as English
    assert res.returncode == 0, res.stderr
    assert "1 page," in res.stdout and "1 pages" not in res.stdout, res.stdout


def test_a_duplicate_id_across_manifests_names_the_file_to_edit(tmp_path: Path) -> None:
    # Given the id `a` in two manifests
    first = write_jobs(tmp_path / "one", [job("a", "write"), job("b", "write")])
    second = write_jobs(tmp_path / "two", [job("c", "write"), job("a", "write")])

    # When both are submitted in one command
    res = cli("submit", first, second, "--json", "--queue", tmp_path / "q", cwd=tmp_path)

    # Then the problem is in the second file, and names the first
    assert res.returncode == 2
    [problem] = json.loads(res.stdout)["problems"]
    assert (problem["file"], problem["job"], problem["field"]) == (str(second), "a", "id")
    assert problem["message"] == f"duplicate job id (also in {first})"


def test_an_empty_dead_list_prints_no_row(tmp_path: Path) -> None:
    # Given a queue with nothing dead-lettered
    manifest = write_jobs(tmp_path / "m", [job("fine", "write")])
    q = tmp_path / "q"
    assert cli("submit", manifest, "--queue", q, "--out", tmp_path / "out",
               cwd=tmp_path).returncode == 0

    # When the dead folder is listed for a script (`dead list | cut -f1 | xargs ...`)
    dead = cli("dead", "list", "--queue", q, cwd=tmp_path)

    # Then stdout holds no row (a sentence there would be read as ids); a person still
    # reads that there is none, on stderr
    assert dead.returncode == 0, dead.stderr
    assert dead.stdout == "", dead.stdout
    assert "no dead-lettered jobs" in dead.stderr


@pytest.mark.parametrize("command", ["submit", "run"])
def test_a_refusal_lists_the_queues_problems_with_the_manifests(tmp_path: Path,
                                                                command: str) -> None:
    # Given a queue holding job `a`, its output root around it
    folder, q = tmp_path / "m", tmp_path / "q"
    assert cli("submit", write_jobs(folder, [job("a", "write")]), "--queue", q,
               "--out", tmp_path, cwd=tmp_path).returncode == 0
    # And a manifest with a manifest problem (`b`'s unknown field) and two the queue finds:
    # `a` changed, and `c` publishing among the queue's own files
    manifest = write_jobs(folder, [job("a", "write", max_attempts=2), job("c", "write")])
    manifest.write_text(manifest.read_text().replace('output = "c.bin"',
                                                     'output = "q/pending/c.json"')
                        + '[[jobs]]\nid = "b"\nkind = "python"\ncallable = "jobsmod:write"\n'
                        'output = "b.bin"\nmemroy_mb = 1\n')

    # When it is submitted (or run)
    res = cli(command, manifest, "--json", "--queue", q, "--out", tmp_path, cwd=tmp_path)

    # Then all three are listed in the one refusal (not the queue's only once the manifest
    # is fixed), each naming the file and job, and nothing is enqueued
    assert res.returncode == 2, res.stderr
    problems = json.loads(res.stdout)["problems"]
    assert {p["job"]: p["file"] for p in problems} == {"a": str(manifest),
                                                       "b": str(manifest),
                                                       "c": str(manifest)}, problems
    by_job = {p["job"]: p["message"] for p in problems}
    assert "different spec (differs in max_attempts)" in by_job["a"]
    assert "inside the queue folder" in by_job["c"]
    assert sorted(os.listdir(q / "pending")) == ["a.json"]


def test_a_refusal_creates_no_queue_to_check_against(tmp_path: Path) -> None:
    # Given no queue yet, and a manifest with a problem
    manifest = bad_manifest(tmp_path / "m")

    # When it is submitted
    res = cli("submit", manifest, "--queue", tmp_path / "q", cwd=tmp_path)

    # Then the refusal leaves no queue folder behind (the queue's checks had nothing to ask)
    assert res.returncode == 2 and "memroy_mb" in res.stderr, res.stderr
    assert not (tmp_path / "q").exists()


def test_a_quarantined_job_is_corrupt_not_unknown_in_every_json_answer(tmp_path: Path) -> None:
    # Given two accepted jobs, the record of `b` damaged on disk
    q = tmp_path / "q"
    manifest = write_jobs(tmp_path / "m", [job("a", "write"), job("b", "write")])
    assert cli("submit", manifest, "--queue", q, cwd=tmp_path).returncode == 0
    (q / "pending" / "b.json").write_text("{garbage")

    # When scripts ask about it with show, cancel, dead retry and wait (the first quarantines)
    answers = {cmd: cli(*cmd.split(), "b", "--json", "--queue", q, cwd=tmp_path)
               for cmd in ("show", "cancel", "dead retry", "wait")}

    # Then each says `corrupt` (it was accepted: not an id never submitted), with the usual
    # exit codes (2 for the refusals, 1 for a wait that ends without completing)
    assert {cmd: (r.returncode, json.loads(r.stdout)) for cmd, r in answers.items()} == {
        "show": (2, {"b": "corrupt"}), "cancel": (2, {"b": "corrupt"}),
        "dead retry": (2, {"b": "corrupt"}), "wait": (1, {"b": "corrupt"})}
    # And an id never submitted is still `not found`
    res = cli("show", "zz", "--json", "--queue", q, cwd=tmp_path)
    assert (res.returncode, json.loads(res.stdout)) == (2, {"zz": "not found"})
    assert state_of(q, "a", tmp_path) == "pending"


@pytest.mark.parametrize(("args", "shape", "said"), [
    (["submit", "{m}", "--out", "{file}"], {"accepted": []}, "--out: "),
    (["run", "{m}", "--queue", "{file}"], {"accepted": []}, "--queue: "),
    (["submit", "{m}", "--memory-mb", "0"], {"accepted": []}, "--memory-mb: "),
    (["validate", "{m}", "--out", "{file}"], {"valid": False}, "--out: "),
    (["status", "--queue", "{none}"], {}, "--queue: "),
    (["dead", "retry", "x", "--queue", "{none}"], {}, "--queue: "),
])
def test_a_json_command_refused_before_it_printed_says_so_in_json(
        tmp_path: Path, args: list[str], shape: dict[str, Any], said: str) -> None:
    # Given a refusal that comes before the command printed anything (an option, a path)
    (tmp_path / "file").write_text("")
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    names = {"{m}": str(manifest), "{file}": str(tmp_path / "file"),
             "{none}": str(tmp_path / "none")}

    # When it is asked for --json
    res = cli(*[names.get(a, a) for a in args], "--json", cwd=tmp_path)

    # Then stdout holds one JSON object saying so (what stderr says, as `message`), in the
    # shape of that command's other refusals, and the exit code is the usage error's
    assert res.returncode == 2, res.stderr
    doc = json.loads(res.stdout)
    assert doc == {**shape, "error": "usage", "message": doc["message"]}
    assert doc["message"].startswith(said) and doc["message"] in res.stderr
    assert not (tmp_path / "none").exists() and not (tmp_path / ".renderctl").exists()


def test_a_json_command_that_cannot_read_its_queue_says_io_error_in_json(
        tmp_path: Path) -> None:
    # Given a queue whose done/ folder is a file (damage outside renderctl)
    q = tmp_path / "q"
    assert cli("submit", str(write_jobs(tmp_path / "m", [job("a", "write")])), "--queue", q,
               cwd=tmp_path).returncode == 0
    shutil.rmtree(q / "done")
    (q / "done").write_text("")

    # When status is asked for --json
    res = cli("status", "--json", "--queue", q, cwd=tmp_path)

    # Then stdout holds one JSON object naming the I/O error, with the exit code 74
    assert res.returncode == 74, res.stderr
    doc = json.loads(res.stdout)
    assert doc == {"error": "io_error", "message": doc["message"]}
    assert "done" in doc["message"] and doc["message"] in res.stderr


def test_an_option_a_command_lacks_gets_no_json(tmp_path: Path) -> None:
    # `top` has no --json: click's usage error, and nothing on stdout for a script to misread
    res = cli("top", "--json", cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == "" and "--json" in res.stderr
