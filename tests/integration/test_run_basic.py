"""`renderctl run` end to end, no crashes: outputs, records, outcomes, exit codes.

Every test starts real `renderctl` processes on a queue and an output root under tmp_path,
with python-kind jobs from ``jobfns.py`` (copied next to the manifest) and ``command`` jobs.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import resource
import signal
import subprocess
import sys
from collections import Counter
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
    py_job,
    run_cli,
    sha256_of,
    stage,
    stray_temporaries,
    wait_for_pid,
)

FAST = ("--workers", "2", "--backoff-base", "0.01")


def make_input_pdf(path: Path, text: str) -> Path:
    from reportlab.pdfgen import canvas

    c = canvas.Canvas(str(path))
    c.drawString(72, 720, text)
    c.showPage()
    c.save()
    return path


def test_twenty_python_jobs_publish_real_pdfs_with_honest_records(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given twenty python jobs that each render a one-page PDF naming the job
    stage(tmp_path)
    ids = [f"pdf-{n:02d}" for n in range(20)]
    manifest = write_manifest([py_job(j, "write_pdf", f"sub/{j}.pdf") for j in ids])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When they are run with JSON Lines output
    res = run_cli("run", manifest, *cli_args(queue, out, *FAST, "--json"))

    # Then the run succeeds and its story is one `completed` per job, then a summary
    assert res.returncode == 0, res.stderr
    events = json_lines(res.stdout)
    completed = Counter(e["job"] for e in events if e.get("event") == "completed")
    assert completed == Counter(ids)
    summary = events[-1]
    assert summary["event"] == "summary"
    assert summary["counts"] == {"done": 20, "dead": 0, "cancelled": 0, "expired": 0}
    assert summary["exit_code"] == 0

    # And every job is in done/ only, with a record that matches its published file
    qv = QueueView(queue)
    assert qv.states_of(ids) == {j: ["done"] for j in ids}
    for j in ids:
        final = out / "sub" / f"{j}.pdf"
        assert_pdf(final, j)
        result = qv.record("done", j)["result"]
        assert result["path"] == str(final)
        assert result["sha256"] == sha256_of(final)
        assert result["bytes"] == final.stat().st_size
        assert result["pages"] == 1
        assert result["attempts"] == 1
    assert stray_temporaries(out) == []
    assert qv.tmp_entries() == []
    # And a runner that left cleanly leaves no holder file behind (no lease names it)
    assert sorted(p.name for p in (queue / "control").glob("holder.*")) == []

    # And `show --json` tells the same story
    show = run_cli("show", ids[0], "--queue", queue, "--json")
    assert show.returncode == 0, show.stderr
    shown = json.loads(show.stdout)
    assert shown["state"] == "done"
    assert shown["result"]["sha256"] == sha256_of(out / "sub" / f"{ids[0]}.pdf")
    assert [a["outcome"] for a in shown["attempts"]] == ["completed"]


def test_a_retry_due_behind_busy_workers_does_not_spin_the_runner(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given one worker, a job failing at once (its retry due 0.2 s later) and a 4 s job
    stage(tmp_path)
    manifest = write_manifest([
        {**py_job("fails", "fail", "fails.pdf"), "max_attempts": 2, "priority": 10},
        py_job("slow", "sleep_then_write", "slow.pdf", s=4)])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When they run
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1", "--backoff-base",
                                             "0.2", "--json"))

    # Then the runner waits for the worker while the retry is due, rather than loop: its
    # CPU was 3 s of a 6 s run (audit CH); ~0.2 s is its start, submit and supervision
    assert res.returncode == 1, res.stderr
    summary = json_lines(res.stdout)[-1]
    assert summary["counts"]["done"] == 1 and summary["counts"]["dead"] == 1, summary
    assert summary["runner_cpu_s"] < 0.25 * summary["wall_s"], summary


def test_the_summary_counts_the_runners_own_cpu_not_the_jobs(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given four jobs that each spend 0.4 s of CPU in the worker
    stage(tmp_path)
    manifest = write_manifest([py_job(f"burn-{n}", "burn_cpu_then_write", f"{n}.pdf",
                                      cpu_s=0.4) for n in range(4)])
    queue, out = tmp_path / "q", tmp_path / "out"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)

    res = run_cli("run", manifest, *cli_args(queue, out, *FAST, "--json"))

    assert res.returncode == 0, res.stderr
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = json_lines(res.stdout)[-1]
    assert summary["event"] == "summary"
    # The runner's CPU is its own: more than nothing, less than the 1.6 s its jobs burnt,
    # and no more than the CPU of the process this test waited for.
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert 0 < summary["runner_cpu_s"] < 1.2, summary
    assert summary["runner_cpu_s"] <= spent + 0.01, (summary, spent)

    plain = run_cli("run", "--queue", queue, "--out", out, "--quiet")
    assert plain.returncode == 0, plain.stderr
    assert re.search(r"; runner CPU \d+\.\d\ds; exit 0$", plain.stdout.splitlines()[-1]), \
        plain.stdout  # nothing ran: no per-job figure


def test_show_describes_a_published_file_that_is_not_a_pdf_without_a_page_count(
        tmp_path: Path, write_manifest: Any) -> None:
    stage(tmp_path)
    manifest = write_manifest([py_job("one", "write_one_byte", "one.bin"),
                               py_job("doc", "write_pdf", "doc.pdf")])
    queue, out = tmp_path / "q", tmp_path / "out"
    assert run_cli("run", manifest, *cli_args(queue, out, *FAST)).returncode == 0

    one = run_cli("show", "one", "--queue", queue).stdout
    assert f"published {out / 'one.bin'} (1B, sha256 " in one, one
    assert "pages" not in one
    doc = run_cli("show", "doc", "--queue", queue).stdout
    assert f"published {out / 'doc.pdf'} (" in doc and ", 1 page, sha256 " in doc, doc


def test_a_queue_and_an_output_root_a_thousand_folders_deep_are_made_and_the_job_completes(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a queue and an output root, each 1,100 missing folders deep (2.2 KB: within
    # PATH_MAX), the output root made only as the runner claims the job
    stage(tmp_path)
    manifest = write_manifest([py_job("doc", "write_pdf", "doc.pdf")])
    deep = Path(*["d"] * 1100)
    queue, out = tmp_path / "q" / deep, tmp_path / "out" / deep
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0

    try:
        # When a runner runs it
        res = run_cli("run", *cli_args(queue, out)[:2], *FAST)

        # Then it completes (before: makedirs recursed once a folder, RecursionError, for
        # the queue in submit and run, and for the root in the runner's claim: every runner
        # died with a traceback, the job back to pending for the next one to die on: audit
        # ES)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stdout + res.stderr
        assert_pdf(out / "doc.pdf", "doc")
    finally:
        # (pytest's own removal of old temporary folders is rmtree: RecursionError here)
        from renderctl.fsutil import remove_tree

        remove_tree(tmp_path / "q")
        remove_tree(tmp_path / "out")


def test_show_of_a_released_job_names_no_wait(tmp_path: Path, write_manifest: Any) -> None:
    import signal

    # Given a job released uncharged by its runner's stop as it ran
    stage(tmp_path)
    job, go = held_job(tmp_path, "held")
    manifest = write_manifest([job])
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--json", "--grace", "0"))
    try:
        runner.until(lambda ln: '"started"' in ln)
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == 128 + signal.SIGTERM
    finally:
        runner.close()
    assert QueueView(queue).ids("pending") == {"held"}

    # Then `show` does not say it waits for the moment it was released (audit FU: "next
    # attempt not before" a time already past)
    shown = run_cli("show", "held", "--queue", queue).stdout
    assert "not before" not in shown, shown


def test_show_names_a_jobs_deadline_and_when_its_retry_may_start(
        tmp_path: Path, write_manifest: Any) -> None:
    import signal

    # Given a job with a deadline that fails once and then waits out a ten-minute backoff,
    # when its runner is stopped meanwhile
    stage(tmp_path)
    manifest = write_manifest([{**py_job("late", "fail"), "deadline": "2099-01-02T03:04:05Z"}])
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(manifest, *cli_args(queue, out, "--backoff-base", "600", "--json"))
    try:
        retry = json.loads(runner.until(lambda ln: '"failed"' in ln))
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == 128 + signal.SIGTERM
    finally:
        runner.close()
    record = QueueView(queue).record("pending", "late")

    # Then `show` says when it may run again (it said only "pending"), and its deadline
    shown = run_cli("show", "late", "--queue", queue).stdout
    assert "deadline 2099-01-02T03:04:05.000Z" in shown, shown
    not_before = record["not_before"]
    assert not_before > retry["ts"] + 60
    when = datetime.datetime.fromtimestamp(not_before, datetime.UTC)
    assert f"next attempt not before {when:%Y-%m-%dT%H:%M:%S}" in shown, shown


def test_a_reader_that_went_away_neither_stops_a_run_nor_makes_an_error(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given stdout is a pipe whose reader has already gone (`renderctl run ... | head -0`)
    stage(tmp_path)
    ids = [f"j{i}" for i in range(30)]
    manifest = write_manifest([py_job(j, "write_one_byte", f"{j}.bin") for j in ids])
    queue, out = tmp_path / "q", tmp_path / "out"

    def with_closed_stdout(*args: str | Path) -> subprocess.CompletedProcess[str]:
        r, w = os.pipe()
        os.close(r)
        try:
            return subprocess.run([*RENDERCTL, *map(str, args)], stdout=w,
                                  stderr=subprocess.PIPE, text=True, timeout=60)
        finally:
            os.close(w)

    # When a run and then `status` print to it
    run = with_closed_stdout("run", manifest, *cli_args(queue, out, *FAST, "--json"))
    status = with_closed_stdout("status", "--queue", queue, "--json")

    # Then the run still ran every job and exits as they earned; neither says a word
    assert (run.returncode, run.stderr) == (0, "")
    assert QueueView(queue).ids("done") == set(ids)
    assert (status.returncode, status.stderr) == (0, "")


def test_a_job_whose_done_record_was_deleted_runs_again_but_never_overwrites_its_output(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job that completed, whose done record was then deleted by hand (housekeeping)
    stage(tmp_path)
    manifest = write_manifest([py_job("once", "write_pdf")])
    queue, out = tmp_path / "q", tmp_path / "out"
    assert run_cli("run", manifest, *cli_args(queue, out, *FAST)).returncode == 0
    published = (out / "once.pdf").read_bytes()
    (queue / "done" / "once.json").unlink()

    # When the same manifest is run again
    res = run_cli("run", manifest, *cli_args(queue, out, *FAST))

    # Then the job is new to the queue and runs, but its output is left as it was, and the
    # dead letter says why and what to do
    assert res.returncode == 1
    assert (out / "once.pdf").read_bytes() == published
    rec = QueueView(queue).record("dead", "once")
    error = rec["attempts"][-1]["error"]
    assert rec["attempts"][-1]["outcome"] == "output_exists"
    assert "renderctl published it for an earlier life of this job id" in error
    assert "move it away" in error


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of jobs that end badly (and two that succeed), shared by the tests below."""
    folder = stage(tmp_path_factory.mktemp("failing"))
    out = folder / "out"
    out.mkdir()
    (out / "taken.pdf").write_bytes(b"a file renderctl did not make")
    make_input_pdf(folder / "in.pdf", "copied input")
    jobs = [
        py_job("always-fails", "fail", message="the renderer broke"),
        py_job("bad-input", "invalid", message="row 3 has no amount"),
        py_job("taken", "write_pdf", "taken.pdf"),
        {"id": "cmd-copy", "kind": "command", "argv": ["cp", "{input}", "{output}"],
         "input": "in.pdf", "output": "copied.pdf"},
        {"id": "cmd-exit3", "kind": "command",
         "argv": ["sh", "-c", "echo first line >&2; echo 'disk quota exceeded' >&2; exit 3",
                  "sh", "{output}"],
         "output": "never.pdf"},
        {"id": "cmd-notpdf", "kind": "command",
         "argv": ["sh", "-c", 'echo hello > "$1"; echo "wrote a greeting" >&2', "sh",
                  "{output}"], "output": "notpdf.pdf",
         "max_attempts": 1},
        py_job("fine", "write_pdf"),
    ]
    manifest = folder / "jobs.json"
    manifest.write_text(json.dumps({"jobs": jobs}))
    res = run_cli("run", manifest, *cli_args(folder / "q", out, *FAST))
    return {"res": res, "queue": QueueView(folder / "q"), "out": out, "folder": folder,
            "manifest": manifest}


def test_a_run_with_dead_jobs_exits_1_and_says_so(failing_run: dict[str, Any]) -> None:
    res = failing_run["res"]
    assert res.returncode == 1, res.stderr
    assert "summary: done 2, dead 5" in res.stdout
    assert res.stdout.count("\ndead ") + res.stdout.startswith("dead ") == 5


def test_a_failing_job_is_retried_max_attempts_times_then_dead_with_every_attempt(
        failing_run: dict[str, Any]) -> None:
    rec = failing_run["queue"].record("dead", "always-fails")
    attempts = rec["attempts"]
    assert [a["n"] for a in attempts] == [1, 2, 3]
    assert {a["outcome"] for a in attempts} == {"failed"}
    assert all("RuntimeError: the renderer broke" in a["error"] for a in attempts)
    assert all("traceback_tail" in a for a in attempts)
    assert failing_run["queue"].states_of(["always-fails"]) == {"always-fails": ["dead"]}


def test_invalid_input_is_dead_after_one_attempt(failing_run: dict[str, Any]) -> None:
    attempts = failing_run["queue"].record("dead", "bad-input")["attempts"]
    assert len(attempts) == 1
    assert attempts[0]["outcome"] == "invalid_input"
    # (its text alone: "InvalidInput: " said again what the outcome says)
    assert attempts[0]["error"] == "row 3 has no amount"


def test_an_invalid_input_subclass_keeps_its_name_in_the_error() -> None:
    from renderctl.errors import InvalidInput, InvalidOutput
    from renderctl.worker import _message

    class MissingColumn(InvalidInput):
        pass

    assert _message(InvalidInput("x.csv: no header"), InvalidInput) == "x.csv: no header"
    assert _message(MissingColumn("amount"), InvalidInput) == "MissingColumn: amount"
    assert _message(InvalidOutput(""), InvalidOutput) == "InvalidOutput"  # (no text)
    assert _message(ValueError("bad")) == "ValueError: bad"


def test_a_command_job_copies_its_input(failing_run: dict[str, Any]) -> None:
    out, folder = failing_run["out"], failing_run["folder"]
    result = failing_run["queue"].record("done", "cmd-copy")["result"]
    assert (out / "copied.pdf").read_bytes() == (folder / "in.pdf").read_bytes()
    assert result["sha256"] == sha256_of(out / "copied.pdf")
    assert result["pages"] == 1


def failed_script_attempt(tmp_path: Path, script: str) -> dict[str, Any]:
    """The one attempt of a command job running ``script`` in sh, which must fail it."""
    return failed_command_attempt(tmp_path, ["sh", "-c", script, "sh", "{output}"])


def failed_command_attempt(tmp_path: Path, argv: list[str]) -> dict[str, Any]:
    """The one attempt of a command job of ``argv``, which must fail it."""
    folder = stage(tmp_path)
    manifest = folder / "jobs.json"
    manifest.write_text(json.dumps({"jobs": [
        {"id": "cmd", "kind": "command", "argv": argv, "output": "never.pdf",
         "max_attempts": 1}]}))
    res = run_cli("run", manifest, *cli_args(folder / "q", folder / "out", *FAST))
    assert res.returncode == 1, res.stderr
    [attempt] = QueueView(folder / "q").record("dead", "cmd")["attempts"]
    return attempt


def test_a_long_last_line_keeps_its_end_in_the_error(tmp_path: Path) -> None:
    # Given a tool whose last line is a long path, then what went wrong with it
    path = "/data/" + "x" * 400 + ".pdf"
    attempt = failed_script_attempt(
        tmp_path, f"echo 'cannot open {path}: No such file or directory' >&2; exit 2")

    # Then the error keeps both its start and its end, cut in the middle (cut at the end,
    # the reason was gone: audit FU)
    error = attempt["error"]
    assert error.startswith("command exited with status 2: cannot open /data/xxx"), error
    assert error.endswith("xxx.pdf: No such file or directory"), error
    assert "..." in error and len(error) < 260, error


def test_a_command_that_cannot_start_says_why(tmp_path: Path) -> None:
    # Given a script whose #! interpreter is not there, a folder, and a name not on PATH
    script = tmp_path / "tool.sh"
    script.write_text("#!/nonexistent/interp -x\nexit 0\n")
    script.chmod(0o755)

    # Then each attempt's error says which (the script was "command not found", the folder
    # "not executable": audit FU)
    said = {name: failed_command_attempt(tmp_path / name, [program, "{output}"])["error"]
            for name, program in (("script", str(script)), ("folder", str(tmp_path)),
                                  ("name", "no-such-renderctl-tool"))}
    assert said == {
        "script": f"command: {script}: its interpreter /nonexistent/interp (its #! line) "
                  "was not found",
        "folder": f"command: {tmp_path} is a folder, not a program",
        "name": "command not found: no-such-renderctl-tool"}


def test_a_stderr_tail_is_the_last_20_lines_as_a_terminal_ends_them(tmp_path: Path) -> None:
    # Given a command writing 25 lines to stderr, each with a form feed, a VT and a NEL
    attempt = failed_script_attempt(
        tmp_path,
        'for i in $(seq 0 24); do printf "line %d\\f\\v\\302\\205 end\\n" $i >&2; done; exit 3')
    # Then the attempt keeps its last 20 lines whole (before: each control character ended
    # a line, and the last 20 "lines" were its last 5: audit BJ)
    assert attempt["stderr_tail"].split("\n") == [
        f"line {i}\f\v\x85 end" for i in range(5, 25)], attempt


def test_a_progress_counter_redrawn_after_an_error_leaves_the_error_in_the_tail(
        tmp_path: Path) -> None:
    # Given a command that says its error, then redraws a progress counter 30 times with
    # carriage returns (wget, curl, pv, ffmpeg), then exits 3
    attempt = failed_script_attempt(
        tmp_path, "echo 'Error: bad page 3' >&2; i=0; while [ $i -lt 30 ]; do "
        "printf '\\rprogress %d%%' $i >&2; i=$((i+1)); done; exit 3")

    # Then the tail is what a terminal showed: the error, and the counter's last state (each
    # redraw was a line of its own, and the 20 kept were all progress: audit FU)
    assert attempt["stderr_tail"].split("\n") == ["Error: bad page 3", "progress 29%"], attempt


def test_a_command_exiting_3_fails_with_its_exit_code_and_stderr_tail(
        failing_run: dict[str, Any]) -> None:
    attempts = failing_run["queue"].record("dead", "cmd-exit3")["attempts"]
    assert len(attempts) == 3
    for a in attempts:
        assert a["outcome"] == "failed"
        assert a["exit_code"] == 3
        assert a["stderr_tail"].splitlines() == ["first line", "disk quota exceeded"]
        # its last words are in the error every report shows, the run's own lines included
        assert a["error"] == "command exited with status 3: disk quota exceeded"
    assert "command exited with status 3: disk quota exceeded" in failing_run["res"].stdout
    assert not (failing_run["out"] / "never.pdf").exists()


def test_an_output_that_is_not_a_pdf_is_named_as_the_user_named_it(
        failing_run: dict[str, Any]) -> None:
    [attempt] = failing_run["queue"].record("dead", "cmd-notpdf")["attempts"]
    assert attempt["outcome"] == "invalid_output"
    assert "notpdf.pdf: not a PDF (no %PDF- header)" in attempt["error"], attempt
    assert ".rctl" not in attempt["error"]
    # and what the tool said, which explains a bad output, is kept though it exited 0
    assert attempt["stderr_tail"] == "wrote a greeting", attempt


def test_an_output_path_holding_a_foreign_file_dead_letters_and_leaves_it(
        failing_run: dict[str, Any]) -> None:
    attempts = failing_run["queue"].record("dead", "taken")["attempts"]
    assert [a["outcome"] for a in attempts] == ["output_exists"]
    assert (failing_run["out"] / "taken.pdf").read_bytes() == b"a file renderctl did not make"
    assert stray_temporaries(failing_run["out"]) == []


def test_dead_retry_then_run_completes_the_job_keeping_its_history(
        failing_run: dict[str, Any]) -> None:
    # Given the dead `taken` job, once the foreign file is moved away
    # (runs after the tests above: pytest keeps file order)
    q, out = failing_run["queue"], failing_run["out"]
    (out / "taken.pdf").rename(failing_run["folder"] / "moved-away.pdf")

    # When it is retried from dead/ and the queue is run again
    retry = run_cli("dead", "retry", "taken", "--queue", q.path)
    assert retry.returncode == 0, retry.stderr
    assert q.states_of(["taken"])["taken"] == ["pending"]
    res = run_cli("run", *cli_args(q.path, out, *FAST))

    # Then it completes; the earlier attempt stays in its history
    assert res.returncode == 0, res.stdout + res.stderr
    assert q.states_of(["taken"])["taken"] == ["done"]
    rec = q.record("done", "taken")
    assert [a["outcome"] for a in rec["attempts"]] == ["output_exists", "completed"]
    assert_pdf(out / "taken.pdf", "taken")
    assert rec["result"]["sha256"] == sha256_of(out / "taken.pdf")


def test_dead_retry_with_new_limits_runs_the_job_under_them(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job dead of its timeout: 1 s for a job that takes 2 s
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([{**py_job("slow", "sleep_then_write", s=2), "timeout_s": 1,
                                "max_attempts": 1}])
    res = run_cli("run", manifest, *cli_args(queue, out))
    assert res.returncode == 1, res.stdout + res.stderr

    # When a retry is asked with limits out of range, nothing is retried; with a longer
    # timeout and two attempts (audit DM: only `submit --replace` could change them, and
    # that wiped the job's history)
    bad = run_cli("dead", "retry", "slow", "--timeout", "0", "--queue", queue)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "--timeout: must be > 0" in bad.stderr and "nothing was retried" in bad.stderr
    assert QueueView(queue).ids("dead") == {"slow"}
    retry = run_cli("dead", "retry", "slow", "--timeout", "30", "--max-attempts", "2",
                    "--queue", queue)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    res = run_cli("run", *cli_args(queue, out))

    # Then it completes under them, its first attempt kept in its history
    assert res.returncode == 0, res.stdout + res.stderr
    rec = QueueView(queue).record("done", "slow")
    assert (rec["spec"]["timeout_s"], rec["spec"]["max_attempts"]) == (30.0, 2)
    assert [a["outcome"] for a in rec["attempts"]] == ["timeout", "completed"]
    assert_pdf(out / "slow.pdf", "slow")
    revived = [e for e in json_lines((queue / "events.jsonl").read_text())
               if e["event"] == "revived"]
    assert revived == [{"ts": revived[0]["ts"], "event": "revived", "job": "slow",
                        "timeout_s": 30.0, "max_attempts": 2}]

    # And the manifest submitted again as it was (cron) finds the job already there, ended,
    # not one "with a different spec" (review DO: refused, the whole submit with it)
    again = run_cli("run", manifest, *cli_args(queue, out))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 of these jobs ended earlier: 1 done" in again.stderr, again.stderr
    # even with --replace, which would run it again (into output_exists: review DR)
    replaced = run_cli("submit", manifest, "--replace", *cli_args(queue, out))
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert "1 already accepted" in replaced.stdout, replaced.stdout
    assert QueueView(queue).ids("done") == {"slow"}


def test_a_replace_gives_a_retried_job_still_waiting_its_manifests_limits_back(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job dead after its one attempt, retried with three, not run yet
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([{**py_job("d", "invalid"), "max_attempts": 1}])
    assert run_cli("run", manifest, *cli_args(queue, out)).returncode == 1
    retry = run_cli("dead", "retry", "d", "--max-attempts", "3", "--queue", queue)
    assert retry.returncode == 0, retry.stdout + retry.stderr

    # When its manifest is submitted again, then with --replace
    again = run_cli("submit", manifest, *cli_args(queue, out))
    replaced = run_cli("submit", manifest, "--replace", *cli_args(queue, out))

    # Then it is the same job, already accepted; replaced, it has the manifest's limits
    # (review DP: --replace said "already accepted" and kept the retry's)
    assert "1 already accepted" in again.stdout, again.stdout + again.stderr
    assert "replaced 1" in replaced.stdout, replaced.stdout + replaced.stderr
    assert QueueView(queue).record("pending", "d")["spec"]["max_attempts"] == 1


def test_max_failures_stops_claiming_after_the_first_dead_job(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given one job that dead-letters at once, claimed first, and many that would succeed
    stage(tmp_path)
    ok = [f"ok-{n:02d}" for n in range(12)]
    jobs = [{**py_job("bad", "invalid"), "priority": 10},
            *(py_job(j, "write_one_byte", f"{j}.bin") for j in ok)]
    manifest = write_manifest(jobs)
    queue, out = tmp_path / "q", tmp_path / "out"

    # When run with --max-failures 1 and one worker
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1",
                                             "--max-failures", "1", "--json"))

    # Then the run exits 1 with the bad job dead; most others were never claimed; nothing
    # is left running (jobs claimed ahead before the failure may have finished)
    assert res.returncode == 1, res.stdout + res.stderr
    qv = QueueView(queue)
    assert qv.ids("dead") == {"bad"}
    assert qv.ids("running") == set()
    pending, done = qv.ids("pending"), qv.ids("done")
    assert pending | done == set(ok)
    assert len(pending) >= len(ok) - 3, f"claimed on after the failure: done {sorted(done)}"
    # And it said why it stopped early, once
    halted = [e for e in json_lines(res.stdout) if e["event"] == "halted"]
    assert [(e["dead"], e["max_failures"]) for e in halted] == [(1, 1)], res.stdout


def test_max_failures_holds_when_quick_failures_follow_quick_successes(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given quick jobs that succeed, then quick ones that dead-letter at once: the workers
    # hold deep queues of claimed jobs by the time the failures come
    stage(tmp_path)
    jobs = [*({**py_job(f"ok-{n:02d}", "write_one_byte", f"ok-{n:02d}.bin"), "priority": 1}
              for n in range(60)),
            *(py_job(f"bad-{n:02d}", "invalid") for n in range(30))]
    queue, out = tmp_path / "q", tmp_path / "out"

    # When run with --max-failures 3 and two workers
    res = run_cli("run", write_manifest(jobs),
                  *cli_args(queue, out, "--workers", "2", "--max-failures", "3", "--json"))

    # Then at most one more job per worker (started before the runner learnt of the third
    # failure) dead-letters, the halt comes right after the dead job that reached it, and at
    # most one job per worker is seen starting after it (it counted failures only as their
    # group commit landed: 18-20 dead by the halt, 40-51 by the end, 20-33 started after it)
    assert res.returncode == 1, res.stdout + res.stderr
    names = [(e["event"], e.get("job")) for e in json_lines(res.stdout)
             if e["event"] in ("dead", "halted", "started")]
    halt = names.index(("halted", None))
    assert names[halt - 1][0] == "dead", names
    assert len([n for n in names[halt:] if n[0] == "started"]) <= 2, names
    dead = QueueView(queue).ids("dead")
    assert 3 <= len(dead) <= 3 + 2, sorted(dead)


def test_max_failures_starts_nothing_more_of_what_was_queued_in_workers(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given, queued together in one worker: a job that dead-letters at once, a slow one
    # (running when the runner learns of the failure), and quick ones behind them
    stage(tmp_path)
    quick = [f"q{n}" for n in range(4)]
    jobs = [{**py_job("bad", "invalid"), "priority": 10},
            {**py_job("slow", "sleep_then_write", s=0.5), "priority": 9},
            *(py_job(j, "write_one_byte", f"{j}.bin") for j in quick)]
    queue, out = tmp_path / "q", tmp_path / "out"

    # When run with --max-failures 1
    res = run_cli("run", write_manifest(jobs),
                  *cli_args(queue, out, "--workers", "1", "--prefetch", "6",
                            "--max-failures", "1", "--json"))

    # Then the halt comes right after the dead job that caused it, and no queued job starts
    # after it: the quick ones are back in pending, uncharged; the running one finished
    assert res.returncode == 1, res.stdout + res.stderr
    events = [e for e in json_lines(res.stdout) if e["event"] in ("dead", "halted", "started")]
    names = [(e["event"], e.get("job")) for e in events]
    halt = names.index(("halted", None))
    assert names[halt - 1] == ("dead", "bad"), names
    assert not [n for n in names[halt:] if n[0] == "started"], names
    qv = QueueView(queue)
    assert qv.ids("dead") == {"bad"} and qv.ids("done") <= {"slow"}
    assert qv.ids("pending") >= set(quick) and qv.ids("running") == set()
    assert all(qv.record("pending", j)["attempts"] == [] for j in quick)


def test_a_second_runner_on_a_held_queue_exits_75_naming_the_holder(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner busy with a long job
    stage(tmp_path)
    manifest = write_manifest([py_job("long", "sleep_then_write", s=60)])
    queue, out = tmp_path / "q", tmp_path / "out"
    first = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--json"))
    try:
        first.until(lambda line: '"event": "started"' in line)

        # When a second runner starts on the same queue
        second = run_cli("run", *cli_args(queue, out, "--workers", "1"))

        # Then it exits 75 at once and names the pid that holds the queue
        assert second.returncode == 75, second.stdout + second.stderr
        assert f"pid {first.pid}" in second.stderr
        assert first.proc.poll() is None  # the first runner is undisturbed
    finally:
        first.close()


def test_recycled_workers_are_replaced_and_the_batch_finishes(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given more jobs than two workers may run before they are recycled
    stage(tmp_path)
    ids = [f"r-{n:02d}" for n in range(15)]
    manifest = write_manifest([py_job(j, "write_one_byte", f"r/{j}.bin") for j in ids])
    queue, out = tmp_path / "q", tmp_path / "out"

    # When each worker retires after 3 jobs
    res = run_cli("run", manifest, *cli_args(queue, out, *FAST, "--json",
                                              "--max-jobs-per-worker", "3"), timeout=60)

    # Then every job completes on a succession of fresh workers
    assert res.returncode == 0, res.stderr
    events = json_lines(res.stdout)
    assert Counter(e["job"] for e in events if e.get("event") == "completed") == Counter(ids)
    workers = {e["worker"] for e in events if e.get("event") == "started"}
    assert len(workers) >= 5, workers


def test_a_second_job_naming_a_published_output_dead_letters_naming_its_owner(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given job g1 completed, and then g2, submitted separately, naming the same output
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    first = write_manifest([py_job("g1", "write_pdf", output="same.pdf")], name="one.toml")
    assert run_cli("run", first, *cli_args(queue, out)).returncode == 0
    second = write_manifest([py_job("g2", "write_pdf", output="same.pdf")], name="two.toml")

    # When g2 runs
    res = run_cli("run", second, *cli_args(queue, out))

    # Then it is dead with output_exists, the error names g1, and g1's file is untouched
    assert res.returncode == 1, res.stdout + res.stderr
    attempt = QueueView(queue).record("dead", "g2")["attempts"][-1]
    assert attempt["outcome"] == "output_exists"
    assert "for job g1 (attempt 1)" in attempt["error"], attempt["error"]
    assert_pdf(out / "same.pdf", "g1")


def test_a_corrupt_record_is_reported_by_run_and_by_show_and_kept(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a queue with two good jobs and two unreadable records
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("a1", "write_pdf"), py_job("a2", "write_pdf")])
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
    (queue / "pending" / "zz.json").write_text("not json")
    (queue / "pending" / "a2.json").write_bytes(b"\xff\xfe")

    # When `show` meets one, and `run` the other
    show = run_cli("show", "a2", "--queue", queue)
    res = run_cli("run", *cli_args(queue, out, "--workers", "1"))

    # Then each says which record could not be read and where it was kept; nothing is lost
    assert show.returncode == 2
    assert "pending/a2.json could not be read" in show.stderr, show.stderr
    assert "corrupt" in show.stderr and "Traceback" not in show.stderr
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("corrupt"))
    assert "pending/zz.json" in line and "moved to corrupt/" in line, line
    kept = sorted(p.read_bytes() for p in (queue / "corrupt").iterdir())
    assert kept == sorted([b"not json", b"\xff\xfe"])


def test_prune_forgets_old_finished_jobs_and_keeps_their_outputs(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a completed job, a dead-lettered one, a cancelled one and one still pending
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    ran = write_manifest([py_job("ok", "write_pdf"), {**py_job("bad", "fail"), "max_attempts": 1}],
                         name="ran.toml")
    assert run_cli("run", ran, *cli_args(queue, out)).returncode == 1
    later = write_manifest([py_job("c", "write_pdf"), py_job("p", "write_pdf")],
                           name="later.toml")
    assert run_cli("submit", later, "--queue", queue).returncode == 0
    assert run_cli("cancel", "c", "--queue", queue).returncode == 0
    view = QueueView(queue)
    before = view.states_of(["ok", "bad", "c", "p"])

    # When pruning at an age none has reached, then as a dry run at age 0
    res = run_cli("prune", "--older-than", "1h", "--queue", queue)
    assert res.returncode == 0 and res.stdout.startswith("pruned 0 record(s)"), res.stdout
    res = run_cli("prune", "--older-than", "0s", "--dry-run", "--json", "--queue", queue)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"pruned": {"done": 1, "cancelled": 1, "expired": 0},
                                      "total": 2, "dry_run": True, "older_than_s": 0.0}
    # or with an age that is not one
    for age in ("soon", "9" * 400 + "s"):  # (400 nines: inf, which JSON cannot print)
        res = run_cli("prune", "--older-than", age, "--json", "--queue", queue)
        assert res.returncode == 2 and "--older-than" in res.stderr, res.stderr

    # Then nothing was deleted
    assert view.states_of(["ok", "bad", "c", "p"]) == before

    # When pruning at age 0
    res = run_cli("prune", "--older-than", "0s", "--queue", queue)

    # Then the completed and cancelled records are gone, the dead letter and the pending job
    # stay, and so does the published output
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == \
        "pruned 2 record(s) older than 0s: done 1, cancelled 1, expired 0"
    assert view.states_of(["ok", "bad", "c", "p"]) == \
        {"ok": [], "bad": ["dead"], "c": [], "p": ["pending"]}
    assert run_cli("show", "ok", "--queue", queue).returncode == 2
    assert_pdf(out / "ok.pdf", "ok")


def test_prune_of_one_done_job_lets_the_manifest_render_it_afresh(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a batch of three that completed
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job(j, "write_pdf") for j in ("a", "b", "c")])
    assert run_cli("run", manifest, *cli_args(queue, out)).returncode == 0
    view = QueueView(queue)

    # When a job no folder named holds is named, or one newer than the age
    missing = run_cli("prune", "--older-than", "0", "--state", "done", "b", "nope", "--json",
                      "--queue", queue)
    young = run_cli("prune", "--older-than", "1h", "b", "--json", "--queue", queue)
    dry = run_cli("prune", "--older-than", "1h", "b", "--dry-run", "--queue", queue)

    # Then the first is refused whole (nothing pruned), the second prunes nothing, saying so
    assert missing.returncode == 2, missing.stderr
    assert json.loads(missing.stdout) == {"nope": "not found"}
    assert "not in done/: nope (not found); nothing was pruned" in missing.stderr
    assert young.returncode == 1, young.stderr
    assert json.loads(young.stdout)["kept"] == ["b"]
    # (a dry run says so too: it said nothing, exit 0; review CM)
    assert dry.returncode == 1 and "would not prune" in dry.stderr and "b" in dry.stderr
    assert view.states_of(["a", "b", "c"]) == {"a": ["done"], "b": ["done"], "c": ["done"]}

    # When README's recipe renders b afresh: its output removed, b alone forgotten (the
    # recipe's `prune --older-than 0 --state done` forgot every done job, and the rerun
    # dead-lettered all the others as output_exists; audit CK), the manifest run again
    (out / "b.pdf").unlink()
    res = run_cli("prune", "--older-than", "0", "--state", "done", "b", "--queue", queue)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "pruned 1 record(s) older than 0: done 1"
    again = run_cli("run", manifest, *cli_args(queue, out))

    # Then b alone ran again; a and c keep their records (one attempt each)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [ln.split()[1] for ln in again.stdout.splitlines()
            if ln.startswith("completed")] == ["b"]
    for j in ("a", "b", "c"):
        assert len(view.record("done", j)["attempts"]) == 1
        assert_pdf(out / f"{j}.pdf", j)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_long_tmpdir_does_not_stop_the_pool_from_starting(
        tmp_path: Path, write_manifest: Any, method: str) -> None:
    # Given a TMPDIR as long as a CI runner's or a nested build's (here 90 characters): the
    # fork server's socket would be TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX, past the 107
    # bytes a unix socket's path may hold
    stage(tmp_path)
    manifest = write_manifest([py_job("one", "write_pdf")])
    tmpdir = tmp_path / "t"
    tmpdir = tmpdir / ("x" * (90 - len(str(tmpdir)) - 1))
    tmpdir.mkdir(parents=True)
    assert len(str(tmpdir)) == 90

    # When a batch runs with each start method
    res = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out",
                                             "--start-method", method),
                  env={"TMPDIR": str(tmpdir)})

    # Then it runs (it exited 74, "I/O error: AF_UNIX path too long"), and what it made
    # in TMPDIR went with its clean exit
    assert res.returncode == 0, res.stderr
    assert_pdf(tmp_path / "out" / "one.pdf", "one")
    assert list(tmpdir.iterdir()) == []


def test_a_run_ends_with_its_exit_hooks_run_leaving_nothing_in_tmpdir(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a TMPDIR short enough for the fork server's socket folder to be made in it
    stage(tmp_path)
    manifest = write_manifest([py_job("one", "write_pdf")])
    tmpdir = tmp_path / "t"
    tmpdir.mkdir()
    # When a batch runs (and the CLI ends without the interpreter's teardown)
    res = run_cli("run", manifest, *cli_args(tmp_path / "q", tmp_path / "out"),
                  env={"TMPDIR": str(tmpdir)})
    # Then multiprocessing's exit hook still removed that folder: the hooks ran
    assert res.returncode == 0, res.stderr
    assert_pdf(tmp_path / "out" / "one.pdf", "one")
    assert list(tmpdir.iterdir()) == []
    assert res.stdout.rstrip().split("\n")[-1].startswith("summary: done 1,"), res.stdout


@pytest.mark.parametrize("as_json", [False, True], ids=["lines", "json"])
def test_a_job_cancelled_while_it_waits_for_its_retry_counts_as_the_runs_cancelled(
        tmp_path: Path, write_manifest: Any, as_json: bool) -> None:
    import xml.etree.ElementTree as ET

    # Given a run whose job failed once and waits about a minute for its retry, beside a
    # good job
    stage(tmp_path)
    queue, out, report = tmp_path / "q", tmp_path / "out", tmp_path / "junit.xml"
    manifest = write_manifest([py_job("flaky", "fail"), py_job("ok", "write_pdf")])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--backoff-base", "60",
                                        "--junit", str(report), *(["--json"] * as_json)))
    try:
        if as_json:
            runner.until(lambda ln: '"event": "retry"' in ln and '"job": "flaky"' in ln)
        else:
            runner.until(lambda ln: ln.startswith("retry") and " flaky " in f"{ln} ")
        # When another command cancels it meanwhile (a pending job: cancel settles it itself)
        res = run_cli("cancel", "flaky", "--queue", queue)
        assert res.returncode == 0 and "flaky: cancelled" in res.stdout, res.stderr
        # (the cancel wakes the run, waiting for nothing else: it used to wait out the
        # backoff it no longer had a job for)
        code = runner.wait(timeout_s=20)
    finally:
        runner.close()
    # Then the run, which tried it, counts it cancelled: exit 1, the summary and the JUnit
    # report say so (it exited 0, the job `skipped` as if unfinished)
    assert code == 1, runner.lines
    if as_json:
        events = json_lines("\n".join(runner.lines))
        [ev] = [e for e in events if e["event"] == "cancelled"]
        # as the README's table has a job cancelled before it started: no attempt fields
        assert ev["job"] == "flaky" and ev["state"] == "cancelled", ev
        assert ev["kind"] == "python" and "attempt" not in ev, ev
        assert ev["reason"] == "cancelled while pending" and "error" not in ev, ev
        assert events[-1]["event"] == "summary", events[-1]
        assert events[-1]["counts"] == {"done": 1, "dead": 0, "cancelled": 1,
                                        "expired": 0}, events[-1]
        assert events[-1]["exit_code"] == 1, events[-1]
    else:
        assert runner.lines[-1].startswith("summary: done 1, dead 0, cancelled 1,"), \
            runner.lines
        # its line tells the cancel, not the failure already told by its `retry` line
        assert "cancelled flaky (cancelled while pending)" in runner.lines, runner.lines
    [case] = [c for c in ET.parse(report).getroot().iter("testcase")
              if c.get("name") == "flaky"]
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "cancelled", ET.tostring(case)


def test_a_following_run_reports_a_job_cancelled_during_its_backoff_at_once(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a --follow run (a service: its end may be weeks away) whose job failed once and
    # waits about a minute for its retry
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("flaky", "fail")])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--backoff-base", "60",
                                        "--follow", "--json"))
    try:
        runner.until(lambda ln: '"event": "retry"' in ln and '"job": "flaky"' in ln)
        # When another command cancels it meanwhile
        res = run_cli("cancel", "flaky", "--queue", queue)
        assert res.returncode == 0 and "flaky: cancelled" in res.stdout, res.stderr
        # Then the run reports it cancelled while it goes on (within its once-a-second
        # look; it was kept, in memory, with every other such job, till the run ended)
        line = runner.until(lambda ln: '"event": "cancelled"' in ln, timeout_s=10)
        assert runner.proc.poll() is None
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == 128 + signal.SIGTERM
    finally:
        runner.close()
    ev = json.loads(line)
    assert ev["job"] == "flaky" and ev["reason"] == "cancelled while pending", ev
    # ... once: the summary counts it once, and no second event came at the end
    events = json_lines("\n".join(runner.lines))
    assert [e["job"] for e in events if e["event"] == "cancelled"] == ["flaky"], events
    assert events[-1]["counts"] == {"done": 0, "dead": 0, "cancelled": 1, "expired": 0}, \
        events[-1]


def test_a_busy_following_run_reports_a_job_cancelled_during_its_backoff_at_once(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a --follow run of one worker whose first job failed once and waits about a
    # minute for its retry, while its worker runs a job that holds and another job waits,
    # claimable, for the worker (the run is busy: a look only at jobs nothing could claim
    # missed the cancel, reported when the retry would have come)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    hold, go = held_job(tmp_path, "hold", timeout_s=60)
    manifest = write_manifest([{**py_job("flaky", "fail"), "priority": 10}, hold,
                               py_job("waiting", "write_pdf")])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--backoff-base", "60",
                                        "--prefetch", "1", "--follow", "--json"))
    try:
        runner.until(lambda ln: '"event": "retry"' in ln and '"job": "flaky"' in ln)
        wait_for_pid(tmp_path / "hold.pid")
        # When another command cancels it meanwhile
        res = run_cli("cancel", "flaky", "--queue", queue)
        assert res.returncode == 0 and "flaky: cancelled" in res.stdout, res.stderr
        # Then the run reports it within its once-a-second look, busy as it is
        line = runner.until(lambda ln: '"event": "cancelled"' in ln, timeout_s=10)
        assert QueueView(queue).states_of(["waiting"]) == {"waiting": ["pending"]}
        go.touch()
        runner.until(lambda ln: '"event": "completed"' in ln and '"job": "waiting"' in ln)
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == 128 + signal.SIGTERM
    finally:
        go.touch()
        runner.close()
    assert json.loads(line)["job"] == "flaky", line


def test_a_retry_scheduled_past_the_calendar_reads_in_days_and_epoch_seconds(
        tmp_path: Path, write_manifest: Any) -> None:
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    # Given a job that fails, retried after the longest backoff the options take
    manifest = write_manifest([py_job("late", "fail")])
    runner = Runner(manifest, *cli_args(queue, out, "--backoff-base", "1e300",
                                        "--backoff-max", "1e300"))
    try:
        # When its first attempt fails
        line = runner.until(lambda line: line.startswith("retry"))
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == 143, runner.lines
    finally:
        runner.close()
    # Then the run says when in days, and `show` when in epoch seconds (past the year 9999,
    # where a date cannot go: it ended in an OverflowError traceback)
    # (less its jitter: 3 significant digits, "1e+295d" when they are 1.00)
    assert re.search(r" retry in \d(\.\d+)?e\+29[45]d ", line), line
    res = run_cli("show", "late", "--queue", queue)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert re.search(r"next attempt not before \d(\.\d+)?e\+(299|300) \(epoch seconds\)",
                     res.stdout), res.stdout


def test_a_commands_error_is_its_last_word_on_stderr_not_stdout(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a tool that says why it failed on stderr, then prints progress on stdout, and
    # one that says nothing on stderr
    manifest = write_manifest([
        {"id": "both", "kind": "command", "output": "b.pdf", "argv": [
            "sh", "-c", "echo 'error: disk quota exceeded' >&2; echo 'Processed 3 pages'; "
            "exit 3", "sh", "{output}"]},
        {"id": "quiet", "kind": "command", "output": "q.pdf", "argv": [
            "sh", "-c", "echo 'only here'; exit 4", "sh", "{output}"]}],
        defaults={"max_attempts": 1})
    queue, out = tmp_path / "q", tmp_path / "out"
    res = run_cli("run", manifest, *cli_args(queue, out))
    # Then the error and the tail are stderr's (before: the last stdout line, audit CB),
    # and stdout's only where stderr had nothing
    assert res.returncode == 1, res.stdout + res.stderr
    view = QueueView(queue)
    both = view.record("dead", "both")["attempts"][-1]
    assert both["error"] == "command exited with status 3: error: disk quota exceeded"
    assert "Processed" not in both["stderr_tail"], both
    quiet = view.record("dead", "quiet")["attempts"][-1]
    assert quiet["error"] == "command exited with status 4: only here"


def test_a_command_the_system_cannot_start_is_invalid_input_at_once(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a script without a #! line, and arguments past the kernel's limit in all (each
    # under its limit for one: validation refuses a single one past it)
    script = tmp_path / "noshebang.sh"
    script.write_text("echo hi > \"$1\"\n")
    script.chmod(0o755)
    half = tmp_path / "halfcp"  # a binary cut short: perhaps whole at the next attempt
    half.write_bytes(Path("/bin/cp").read_bytes()[:100])
    half.chmod(0o755)
    manifest = write_manifest([
        {"id": "script", "kind": "command", "output": "s.pdf", "argv": [str(script), "{output}"]},
        {"id": "long", "kind": "command", "output": "l.pdf",
         "argv": ["cp", *["x" * 120_000] * 20, "{output}"]},
        {"id": "half", "kind": "command", "output": "h.pdf", "argv": [str(half), "{output}"],
         "max_attempts": 2}])
    queue, out = tmp_path / "q", tmp_path / "out"
    res = run_cli("run", manifest, *cli_args(queue, out, "--backoff-base", "0.01"))
    # Then each is invalid_input at its first attempt, saying why (before: a bare OSError,
    # retried until dead: audit CB)
    assert res.returncode == 1, res.stdout + res.stderr
    view = QueueView(queue)
    [script_attempt] = view.record("dead", "script")["attempts"]
    assert script_attempt["outcome"] == "invalid_input"
    assert "is a script without a #! line" in script_attempt["error"]
    [long_attempt] = view.record("dead", "long")["attempts"]
    assert long_attempt["outcome"] == "invalid_input"
    assert "arguments are too long for the system" in long_attempt["error"]
    # (review CC: a binary the system cannot run is no script: failed, retried)
    half_attempts = view.record("dead", "half")["attempts"]
    assert [a["outcome"] for a in half_attempts] == ["failed", "failed"]
    assert "is not a format this system can run" in half_attempts[-1]["error"]


def test_files_a_failed_command_named_after_its_output_are_removed(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a tool that writes files named after its output ({output}.log, {output}-1.png,
    # a folder {output}.d) and fails
    script = 'echo log > "$1.log"; echo png > "$1-1.png"; mkdir "$1.d"; echo x > "$1.d/x"; exit 1'
    manifest = write_manifest([{"id": "tool", "kind": "command", "output": "sub/t.pdf",
                                "argv": ["sh", "-c", script, "sh", "{output}"]}],
                              defaults={"max_attempts": 1})
    queue, out = tmp_path / "q", tmp_path / "out"
    res = run_cli("run", manifest, *cli_args(queue, out))
    # Then nothing of it is left in the output folder (before: hidden .rctl-... files, for
    # good: audit CB)
    assert res.returncode == 1, res.stdout + res.stderr
    assert os.listdir(out / "sub") == []


def test_an_attempts_end_is_when_it_ended_not_when_it_was_recorded(
        tmp_path: Path, write_manifest: Any) -> None:
    import signal
    import time

    from jobfns import stopped, wait_until

    # Given a runner frozen at its group commit of a job that ended, for a second
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    runner = Runner(write_manifest([py_job("a", "write_pdf")]), *cli_args(queue, out),
                    env={"RENDERCTL_STOP_AT": "commit"})
    try:
        wait_until(lambda: stopped(runner.pid), what="the runner to freeze at its commit")
        time.sleep(1.0)  # (the recording's delay: not a race hoped for)
        os.kill(runner.pid, signal.SIGCONT)
        assert runner.wait(60) == 0, runner.lines
    finally:
        runner.close()

    # Then the attempt's end is its start plus its time, not the commit's time (audit DQ:
    # attempts recorded by one commit all "ended" together)
    (att,) = QueueView(queue).record("done", "a")["attempts"]
    assert att["ended_at"] - att["started_at"] - att["elapsed_s"] < 0.5, att


@pytest.mark.parametrize("given", [{}, {"LC_CTYPE": "C.UTF-8"}, {"LC_CTYPE": "C"}],
                         ids=["cron", "set-by-caller", "set-to-C-and-coerced"])
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_command_job_gets_the_callers_locale_not_pythons_coercion(
        tmp_path: Path, write_manifest: Any, given: dict[str, str], method: str) -> None:
    # Given cron's environment (LANG=C, a short PATH), under which Python coerces its locale
    # and puts LC_CTYPE=C.UTF-8 in its own environment
    manifest = write_manifest([{"id": "e", "kind": "command", "output": "env.txt",
                                "argv": ["sh", "-c", 'env > "$1"', "sh", "{output}"]}])
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "LANG": "C", **given}

    # When a command job runs under it
    res = subprocess.run([sys.executable, "-m", "renderctl.cli.app", "run", str(manifest),
                          *map(str, cli_args(tmp_path / "q", out, "--start-method", method))],
                         env=env, capture_output=True, text=True, timeout=120)

    # Then the job sees the caller's environment: no LC_CTYPE cron never set (every job got
    # one, and sort or pdftotext ran otherwise than under cron: audit EA), one it did set kept
    assert res.returncode == 0, res.stdout + res.stderr
    seen = dict(ln.split("=", 1) for ln in (out / "env.txt").read_text().splitlines()
                if "=" in ln)
    assert seen.get("LC_CTYPE") == given.get("LC_CTYPE") and seen["LANG"] == "C", seen
