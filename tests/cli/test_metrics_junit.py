"""`run --json --junit --metrics-textfile` and `metrics`: every output parses and adds up."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from clihelp import cli, job, write_jobs

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'  # only \\, \" and \n may be escaped
PAIR = rf"[a-zA-Z_][a-zA-Z0-9_]*={LABEL_VALUE}"
LABELS = rf"\{{(?:{PAIR}(?:,{PAIR})*,?)?\}}"
VALUE = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|Inf|NaN)"
SAMPLE = re.compile(rf"^({NAME})({LABELS})? ({VALUE})( -?[0-9]+)?$")
HELP = re.compile(rf"^# HELP ({NAME}) ((?:[^\\\n]|\\[\\n])*)$")
TYPE = re.compile(rf"^# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_prometheus(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A strict parser of the text format 0.0.4: it fails on any line a Prometheus server
    would reject (a bad name, an unescaped label value, a sample of no declared family, a
    family split in two, a histogram whose buckets do not add up)."""
    assert text.endswith("\n")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    types: dict[str, str] = {}
    helped: set[str] = set()
    done_families: set[str] = set()
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            m = HELP.match(line) or TYPE.match(line)
            assert m, f"not a HELP or TYPE line: {line!r}"
            name = m.group(1)
            assert name not in done_families, f"{name} declared again: {line!r}"
            if line.startswith("# HELP "):
                assert name not in helped, f"two HELP lines for {name}"
                helped.add(name)
            else:
                assert name not in types, f"two TYPE lines for {name}"
                types[name] = m.group(2)
            if current not in (None, name):
                done_families.add(current)
            current = name
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.group(1), m.group(2), m.group(3)
        family = name
        if types.get(current or "") == "histogram":
            family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert family == current and family in types, f"{name} is not in its family's block"
        pairs = tuple((k, re.sub(r'\\[\\"n]', lambda e: UNESCAPE[e[0]], v))
                      for k, v in LABEL.findall(labels or ""))
        key = (name, pairs)
        assert key not in samples, f"duplicate sample {key}"
        samples[key] = float(value)
    for name, kind in types.items():  # histograms: cumulative buckets, +Inf last = count
        if kind != "histogram":
            continue
        buckets = [(k[1], v) for k, v in samples.items() if k[0] == f"{name}_bucket"]
        bounds = [float(dict(labels)["le"]) for labels, _ in buckets]
        counts = [v for _, v in buckets]
        assert bounds == sorted(bounds) and bounds[-1] == float("inf"), name
        assert counts == sorted(counts), f"{name}: buckets not cumulative"
        assert counts[-1] == samples[(f"{name}_count", ())], name
    return samples


def test_run_json_junit_and_metrics(tmp_path: Path) -> None:
    # Given two good jobs and one that always fails (one attempt allowed)
    manifest = write_jobs(tmp_path / "m", [
        job("ok-1", "write"), job("ok-2", "write"),
        job("bad", "fail", max_attempts=1, params={"why": "kaboom"}),
    ])
    q, out = tmp_path / "q", tmp_path / "out"
    junit, prom = tmp_path / "report" / "junit.xml", tmp_path / "metrics.prom"
    junit.parent.mkdir()
    # When they run with JSON output, a JUnit report and a metrics textfile
    res = cli("run", manifest, "--queue", q, "--out", out, "-j", "2", "--json",
              "--junit", junit, "--metrics-textfile", prom, cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    # Then every stdout line is one JSON object, ending with the summary
    events = [json.loads(line) for line in res.stdout.splitlines()]
    assert all(isinstance(e, dict) and "event" in e for e in events)
    assert events[0]["event"] == "runner_started" and events[-1]["event"] == "summary"
    assert events[-1]["counts"] == {"done": 2, "dead": 1, "cancelled": 0, "expired": 0}
    dead = [e for e in events if e["event"] == "dead"]
    assert [(e["job"], e["outcome"], e["attempt"]) for e in dead] == [("bad", "failed", 1)]
    # The JUnit file has a testcase per job and one failure with its cause and stderr
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures")) == ("3", "1")
    cases = {tc.get("name"): tc for tc in suite.iter("testcase")}
    assert set(cases) == {"ok-1", "ok-2", "bad"}
    assert {tc.get("classname") for tc in cases.values()} == {"python"}
    failure = cases["bad"].find("failure")
    assert failure is not None and "kaboom" in (failure.get("message") or "")
    assert "about to fail: kaboom" in (failure.text or "")
    assert cases["ok-1"].find("failure") is None
    # The textfile (written at the end) and `renderctl metrics` agree and add up
    for text in (prom.read_text(), cli("metrics", "--queue", q, cwd=tmp_path).stdout):
        s = parse_prometheus(text)
        assert s[("renderctl_jobs", (("state", "done"),))] == 2
        assert s[("renderctl_jobs", (("state", "dead"),))] == 1
        assert s[("renderctl_dead_letter_depth", ())] == 1
        assert s[("renderctl_attempts_total", (("outcome", "completed"),))] == 2
        assert s[("renderctl_attempts_total", (("outcome", "failed"),))] == 1
        assert s[("renderctl_publish_collisions_total", ())] == 0
        assert s[("renderctl_redeliveries_total", ())] == 0
        assert s[("renderctl_execution_seconds_count", ())] == 3
        assert s[("renderctl_execution_seconds_bucket", (("le", "+Inf"),))] == 3
        assert s[("renderctl_time_to_first_attempt_seconds_count", ())] == 3
        assert s[("renderctl_workers_alive", ())] == 0  # no runner holds the queue now
        assert s[("renderctl_runner_up", ())] == 0
    assert not list(prom.parent.glob(".metrics.prom.*"))  # no temporary left behind


def test_publish_collision_and_retry_are_counted(tmp_path: Path) -> None:
    # Given a job whose output path already holds a file renderctl did not publish
    manifest = write_jobs(tmp_path / "m", [job("clash", "write")])
    out = tmp_path / "out"
    out.mkdir()
    (out / "clash.bin").write_bytes(b"theirs")
    q = tmp_path / "q"
    res = cli("run", manifest, "--queue", q, "--out", out, "--quiet", cwd=tmp_path)
    # Then it dead-letters (quiet mode prints it and the summary only) ...
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    assert lines[-1].startswith("summary:") and "dead" in lines[0] and len(lines) == 2
    # ... and metrics count one publish collision
    s = parse_prometheus(cli("metrics", "--queue", q, cwd=tmp_path).stdout)
    assert s[("renderctl_publish_collisions_total", ())] == 1
    assert s[("renderctl_attempts_total", (("outcome", "output_exists"),))] == 1


def completed_total(q: Path, cwd: Path) -> float:
    s = parse_prometheus(cli("metrics", "--queue", q, cwd=cwd).stdout)
    return s[("renderctl_attempts_total", (("outcome", "completed"),))]


def test_metrics_reads_only_what_the_log_gained_since_its_last_call(tmp_path: Path) -> None:
    # Given a queue that ran 5 jobs, and `metrics` called once
    q, out = tmp_path / "q", tmp_path / "out"
    first = write_jobs(tmp_path / "m1", [job(f"a{i}", "write") for i in range(5)])
    assert cli("run", first, "--queue", q, "--out", out, cwd=tmp_path).returncode == 0
    assert completed_total(q, tmp_path) == 5
    # ... after which everything the log said so far is blanked out, but for its last bytes
    log = q / "events.jsonl"
    data = log.read_bytes()
    log.write_bytes(b" " * (len(data) - 64) + data[-64:])

    # When 3 more jobs run and `metrics` is called again
    second = write_jobs(tmp_path / "m2", [job(f"b{i}", "write") for i in range(3)])
    assert cli("run", second, "--queue", q, "--out", out, cwd=tmp_path).returncode == 0

    # Then it counts all 8: it read only the new lines, and kept the first 5 from last time
    assert completed_total(q, tmp_path) == 8


def test_metrics_starts_over_on_a_log_that_is_not_the_one_it_read(tmp_path: Path) -> None:
    q, out = tmp_path / "q", tmp_path / "out"
    first = write_jobs(tmp_path / "m1", [job(f"a{i}", "write") for i in range(5)])
    assert cli("run", first, "--queue", q, "--out", out, cwd=tmp_path).returncode == 0
    assert completed_total(q, tmp_path) == 5
    # A log rotated away (the next run starts a new one) ...
    (q / "events.jsonl").rename(tmp_path / "events.old")
    second = write_jobs(tmp_path / "m2", [job(f"b{i}", "write") for i in range(3)])
    assert cli("run", second, "--queue", q, "--out", out, cwd=tmp_path).returncode == 0
    assert completed_total(q, tmp_path) == 3  # a counter reset, as Prometheus expects
    # ... and a log removed and written anew at least as long (its inode number may well be
    # the old one's): here the same lines in another order, none of them a completion
    log = q / "events.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.unlink()
    log.write_bytes(b"".join(reversed(lines)).replace(b'"completed"', b'"completes"'))
    assert completed_total(q, tmp_path) == 0


# -- report files: checked before the run, a warning if they still fail at the end -----------

REPORT_OPTIONS = [("--junit", "RENDERCTL_JUNIT"),
                  ("--metrics-textfile", "RENDERCTL_METRICS_TEXTFILE")]


def unwritable_report_path(tmp_path: Path, case: str) -> Path:
    if case == "missing folder":
        return tmp_path / "no-such-folder" / "report"
    if case == "a folder":
        (tmp_path / "reports").mkdir()
        return tmp_path / "reports"
    (tmp_path / "afile").write_text("x")
    return tmp_path / "afile" / "report"  # a path through a regular file


@pytest.mark.parametrize("how", ["option", "env", "file"])
@pytest.mark.parametrize("case", ["missing folder", "a folder", "through a file"])
@pytest.mark.parametrize("option, variable", REPORT_OPTIONS)
def test_a_report_path_run_cannot_write_is_a_usage_error(tmp_path: Path, option: str,
                                                         variable: str, case: str,
                                                         how: str) -> None:
    # Given a report path that cannot take a file
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    q, path = tmp_path / "q", unwritable_report_path(tmp_path, case)

    # When `run` is asked to write its report there
    args: list[object] = ["run", manifest, "--queue", q, "--out", tmp_path / "out"]
    extra_env = {variable: str(path)} if how == "env" else None
    key = option[2:].replace("-", "_")
    if how == "option":
        args += [option, path]
    elif how == "file":
        (tmp_path / "renderctl.toml").write_text(f'{key} = "{path}"\n')
    res = cli(*args, cwd=tmp_path, extra_env=extra_env)

    # Then it refuses at once, naming the option (or variable, or file and key) and the
    # path, and nothing was enqueued: the queue was not even created
    assert res.returncode == 2, res.stdout + res.stderr
    named = {"option": option, "env": variable,
             "file": f"{tmp_path / 'renderctl.toml'}: key {key!r}"}[how]
    assert f"renderctl: {named}: {path}: " in res.stderr, res.stderr
    assert not q.exists()


@pytest.mark.parametrize("option, variable", REPORT_OPTIONS)
def test_an_empty_report_path_is_a_usage_error_saying_so(tmp_path: Path, option: str,
                                                         variable: str) -> None:
    # Given a report path that is empty (a shell variable that expanded to nothing)
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    q = tmp_path / "q"

    # When `run` is asked to write its report there
    res = cli("run", manifest, "--queue", q, "--out", tmp_path / "out", option, "",
              cwd=tmp_path)

    # Then the one line says the option is empty (it said "--junit: .: is a folder", a
    # path the user never gave), and nothing was enqueued
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr == f"renderctl: {option}: must not be empty\n", res.stderr
    assert not q.exists()


@pytest.mark.parametrize("how", ["option", "file"])
def test_a_junit_report_of_a_follow_runner_is_refused(tmp_path: Path, how: str) -> None:
    # Given `run --follow` asked for a JUnit report (on its command line, or its
    # configuration file setting both), a report written when a run ends, of every job it
    # ran: a --follow runner's run ends after weeks, its report's cases all in memory
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    q, junit = tmp_path / "q", tmp_path / "junit.xml"
    args: list[object] = ["run", manifest, "--queue", q, "--out", tmp_path / "out"]
    if how == "option":
        args += ["--follow", "--junit", junit]
    else:
        (tmp_path / "renderctl.toml").write_text(f'follow = true\njunit = "{junit}"\n')

    # When it starts
    res = cli(*args, cwd=tmp_path, timeout=30)

    # Then it refuses at once, naming both settings where they came from, and enqueues
    # nothing (it ran for ever before, the report growing ~640 bytes a job)
    assert res.returncode == 2, res.stdout + res.stderr
    conf = tmp_path / "renderctl.toml"
    named = ("--junit", "--follow") if how == "option" else (
        f"{conf}: key 'junit'", f"{conf}: key 'follow'")
    assert f"{named[0]} cannot go with {named[1]}" in res.stderr, res.stderr
    assert "--metrics-textfile" in res.stderr and len(res.stderr.splitlines()) == 1
    assert not q.exists()


def test_reports_with_the_longest_names_the_check_accepts_are_written(tmp_path: Path) -> None:
    # Given report paths whose names are as long as a file name may be here (255 bytes):
    # `run` checks them writable before it starts, and accepts them
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    junit = tmp_path / ("j" * 251 + ".xml")
    prom = tmp_path / ("m" * 250 + ".prom")

    # When the run ends and writes its reports there
    res = cli("run", manifest, "--queue", tmp_path / "q", "--out", tmp_path / "out",
              "--junit", junit, "--metrics-textfile", prom, cwd=tmp_path)

    # Then both are written (their temporaries' names, the report's with a prefix and a
    # suffix, were too long: each report was lost with a warning at the end of the run)
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
    assert ET.parse(junit).getroot().find("testsuite") is not None
    assert parse_prometheus(prom.read_text())[("renderctl_jobs", (("state", "done"),))] == 1
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


REMOVE_FOLDER = '''

def remove_folder(inputs, output, params):
    import shutil

    shutil.rmtree(params["path"])
    Path(output).write_bytes(b"x")
'''


def test_a_report_that_cannot_be_written_at_the_end_is_a_warning(tmp_path: Path) -> None:
    # Given a job that removes the reports' folder while the run goes on (after the check)
    reports = tmp_path / "reports"
    reports.mkdir()
    manifest = write_jobs(tmp_path / "m", [job("rm", "remove_folder",
                                               params={"path": str(reports)})])
    with open(tmp_path / "m" / "jobsmod.py", "a") as fh:
        fh.write(REMOVE_FOLDER)
    junit, prom = reports / "junit.xml", reports / "metrics.prom"

    # When the run ends and writes its reports there
    res = cli("run", manifest, "--queue", tmp_path / "q", "--out", tmp_path / "out",
              "--junit", junit, "--metrics-textfile", prom, cwd=tmp_path)

    # Then each failed write is a warning naming its file and the error, and the exit code
    # is still the jobs' (0: the job completed)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"warning: JUnit report {junit} not written: " in res.stderr, res.stderr
    assert f"warning: metrics textfile {prom} not written: " in res.stderr, res.stderr
    assert "No such file or directory" in res.stderr
    assert "summary: done 1" in res.stdout


# XML 1.0 allows tab, newline and carriage return of the C0 controls, nothing else there.
CONTROLS = r"nul\u0000 bell\u0007 esc\u001b[31m vt\u000b ff\u000c us\u001f nonchar\uFFFE <&>]]>"


def test_junit_report_of_a_job_whose_error_holds_control_characters_parses(
        tmp_path: Path) -> None:
    # Given a job that fails with control characters (an ANSI colour, a NUL, a bell) in its
    # exception message and in the stderr it wrote first
    manifest = write_jobs(tmp_path / "m", [job("noisy", "fail", max_attempts=1,
                                               params={"why": CONTROLS})])
    junit = tmp_path / "junit.xml"

    # When the run writes its JUnit report
    res = cli("run", manifest, "--queue", tmp_path / "q", "--out", tmp_path / "out",
              "--junit", junit, cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "warning" not in res.stderr, res.stderr

    # Then the report is well-formed XML (an XML parser accepts it), and the failure still
    # says what happened, each control character shown as a visible escape
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    failure = suite.find("testcase/failure")
    assert failure is not None
    message, text = failure.get("message") or "", failure.text or ""
    for shown in (message, text):
        assert "nul\\x00 bell\\x07 esc\\x1b[31m" in shown, shown
        assert "<&>]]>" in shown, shown
    assert "about to fail: nul\\x00" in text, text


def test_junit_timestamp_is_when_the_run_began_not_when_the_report_was_written() -> None:
    import calendar
    import time

    from renderctl.junit import junit_xml

    # Given a run that took two hours, when its report is written at its end
    written = time.time()
    root = ET.fromstring(junit_xml([], wall_s=7200.0))

    # Then its timestamp is the run's start, as JUnit readers take it (CI shows the suite
    # as started then); it was the time of writing
    suite = root.find("testsuite")
    assert suite is not None
    began = calendar.timegm(time.strptime(suite.get("timestamp", ""), "%Y-%m-%dT%H:%M:%S"))
    assert abs(began - (written - 7200)) < 5, suite.get("timestamp")


def test_junit_xml_shows_what_xml_cannot_hold_as_escapes() -> None:
    from renderctl.junit import Case, junit_xml

    # Given cases whose texts hold what XML 1.0 has no character for: C0 controls, the
    # non-characters U+FFFE/U+FFFF, and a lone surrogate (an undecodable byte of a path)
    odd = "a\x00b\x08c\x1bd\ufffee\uffff f\udcff g\t\n\r h é ☃"
    cases = [Case(name="j", classname="python", time_s=0.1, state="dead", message=odd,
                  detail=odd)]

    # When the report is made, then it parses, and what XML can hold is kept as it was
    root = ET.fromstring(junit_xml(cases))
    failure = root.find("testsuite/testcase/failure")
    assert failure is not None
    assert failure.get("message") == "a\\x00b\\x08c\\x1bd\\ufffee\\uffff f\\udcff g\t\n\r h é ☃"
    assert (failure.text or "").startswith("a\\x00b\\x08c\\x1bd\\ufffee\\uffff f\\udcff g\t\n")


def test_metrics_parse_whatever_outcome_the_event_log_holds(tmp_path: Path) -> None:
    from renderctl.store import Queue

    # Given an event log that names an outcome this version does not know, holding what a
    # label value must escape (a quote, a backslash, a newline): a hand-edited log, or one
    # written by another version
    q = Queue(tmp_path / "q")
    odd = 'from "v9" \\ next\nline'
    q.events.append([{"ts": 1.0, "event": "dead", "job": "x", "outcome": odd,
                      "attempt": 1, "elapsed_s": 0.5}])
    # ... and times that are not numbers, or not finite (json reads NaN and Infinity)
    q.events.append([{"ts": "noon", "event": "accepted", "job": "y"},
                     {"ts": float("nan"), "event": "claimed", "job": "y", "attempt": 1},
                     {"ts": 3.0, "event": "completed", "job": "y", "outcome": "completed",
                      "attempt": 1, "elapsed_s": "abc", "paused_s": "x"},
                     {"ts": 4.0, "event": "failed", "job": "z", "outcome": "failed",
                      "attempt": 1, "elapsed_s": float("inf"), "paused_s": True}])
    q.close()

    # When `renderctl metrics` prints them
    res = cli("metrics", "--queue", tmp_path / "q", cwd=tmp_path)

    # Then the exposition is valid, and counts that outcome under its own name (and the
    # others' attempts, with no time where the log held none: `elapsed_s: "abc"` was a
    # traceback)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    s = parse_prometheus(res.stdout)
    assert s[("renderctl_attempts_total", (("outcome", odd),))] == 1
    assert s[("renderctl_attempts_total", (("outcome", "completed"),))] == 1
    assert s[("renderctl_execution_seconds_count", ())] == 1
    assert s[("renderctl_execution_seconds_sum", ())] == 0.5


def test_metrics_counts_past_what_a_power_loss_or_a_hand_edit_left_in_the_event_log(
        tmp_path: Path) -> None:
    from renderctl.store import Queue

    # Given a queue that ran 2 jobs, whose event log then gained lines that are JSON but not
    # events (a hand edit), and the run of NUL bytes that a power loss leaves where appends
    # never reached the disk (this ext4 has no journal: the size got there, the data not)
    q, out = tmp_path / "q", tmp_path / "out"
    first = write_jobs(tmp_path / "m1", [job(f"a{i}", "write") for i in range(2)])
    assert cli("run", first, "--queue", q, "--out", out, cwd=tmp_path).returncode == 0
    with open(q / "events.jsonl", "ab") as log:
        log.write(b'[1, 2]\n"text"\n7\n' + b"\x00" * 300)
    # ... and then the next event, appended after the reboot right behind the NULs
    queue = Queue(q)
    queue.events.append([{"ts": 1.0, "event": "completed", "job": "b0", "outcome": "completed",
                          "attempt": 1, "elapsed_s": 0.5}])
    queue.close()

    # When `renderctl metrics` reads the log
    res = cli("metrics", "--queue", q, cwd=tmp_path)

    # Then it prints metrics (it died with a traceback on the first non-object line), and
    # the event after the NULs is counted too
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert completed_total(q, tmp_path) == 3


@pytest.mark.parametrize("report", ["metrics", "junit"])
def test_a_symlink_planted_at_a_reports_temporary_name_is_not_written_through(
        tmp_path: Path, report: str) -> None:
    import os

    from renderctl.junit import write_junit
    from renderctl.metrics import write_textfile

    # Given a report's folder that others can write to (a shared textfile collector folder),
    # and a symlink planted there at the name the writer's temporary had (its pid is public)
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o777)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    final = folder / "renderctl.prom"
    (folder / f".{final.name}.{os.getpid()}.tmp").symlink_to(victim)

    # When the report is written (run as root: through the symlink, anything)
    old = os.umask(0o022)
    try:
        if report == "metrics":
            write_textfile(final, "renderctl_up 1\n")
        else:
            write_junit(final, b"renderctl_up 1\n")
    finally:
        os.umask(old)

    # Then the file the symlink points to is untouched, and the report is where it should
    # be, readable by the collector as before (0644 under umask 022)
    assert victim.read_text() == "precious"
    assert final.read_text() == "renderctl_up 1\n" and not final.is_symlink()
    assert final.stat().st_mode & 0o777 == 0o644


def test_execution_time_of_an_attempt_leaves_out_the_time_its_run_was_paused(
        tmp_path: Path) -> None:
    from renderctl.store import Queue

    # Given two attempts of 1.5 s of work each: one ran straight through, the other's run
    # was suspended (Ctrl-Z) for 100 s in the middle of it
    q = Queue(tmp_path / "q")
    q.events.append([
        {"ts": 1.0, "event": "completed", "job": "a", "outcome": "completed", "attempt": 1,
         "elapsed_s": 1.5},
        {"ts": 2.0, "event": "completed", "job": "b", "outcome": "completed", "attempt": 1,
         "elapsed_s": 101.5, "paused_s": 100.0}])
    q.close()

    # When `renderctl metrics` prints the execution-time histogram
    res = cli("metrics", "--queue", tmp_path / "q", cwd=tmp_path)

    # Then both fall in the same bucket (the paused one counted 101.5 s, past the 60 s
    # bucket, as if the job had taken that long), and the sum is the work: 3 s
    assert res.returncode == 0, res.stderr
    s = parse_prometheus(res.stdout)
    assert s[("renderctl_execution_seconds_bucket", (("le", "2.5"),))] == 2
    assert s[("renderctl_execution_seconds_sum", ())] == pytest.approx(3.0)


def test_junit_cases_are_the_jobs_the_run_started_or_ended() -> None:
    from renderctl.junit import JUnitCollector

    # Given a run's events: a job released before it started (claimed ahead, then SIGTERM),
    # one released while it ran, one that completed
    c = JUnitCollector()
    for ev in ({"event": "released", "job": "ahead"},
               {"event": "started", "job": "mid", "attempt": 1},
               {"event": "released", "job": "mid", "kind": "python", "attempt": 1,
                "outcome": "released", "elapsed_s": 0.5},
               {"event": "started", "job": "ok", "attempt": 1},
               {"event": "completed", "job": "ok", "kind": "invoice", "state": "done",
                "elapsed_s": 0.1}):
        c.event(ev)

    # Then the report has no case for the one that never started (it was <skipped>, which
    # says "started but not finished"), a skipped one for the other, a pass for the last
    cases = {case.name: (case.classname, case.state) for case in c.cases()}
    assert cases == {"mid": ("python", "unfinished"), "ok": ("invoice", "done")}, cases


def test_junit_message_of_a_job_cancelled_while_it_waited_to_retry_is_the_cancel() -> None:
    from renderctl.junit import JUnitCollector

    # Given a job that failed its first attempt, then was cancelled while it waited
    c = JUnitCollector()
    for ev in ({"event": "started", "job": "j", "attempt": 1},
               {"event": "retry", "job": "j", "kind": "python", "state": "pending",
                "attempt": 1, "outcome": "failed", "error": "RuntimeError: boom"},
               {"event": "cancelled", "job": "j", "state": "cancelled",
                "reason": "cancelled while pending"}):
        c.event(ev)

    # Then its failure says it was cancelled (before: the first attempt's error: audit BJ)
    [case] = c.cases()
    assert (case.state, case.message) == ("cancelled", "cancelled while pending")


def test_the_stderr_tail_ends_lines_only_where_a_terminal_would() -> None:
    from renderctl.junit import _detail

    # Given a tool's last 25 lines, each holding a form feed, a VT and a NEL (pdftotext
    # writes a form feed between pages)
    tail = "\n".join(f"line {i}\f\v\x85 end" for i in range(25))
    # When the JUnit report's detail shows the last lines, then they are lines, whole
    # (before: each control character ended a "line", and 20 showed as 5: audit BJ)
    shown = _detail({"n": 1, "outcome": "failed", "stderr_tail": tail}, "").split("\n")
    assert shown[-20:] == [f"line {i}\f\v\x85 end" for i in range(5, 25)]


def test_junit_class_of_a_job_recovered_to_done_is_its_kind(tmp_path: Path) -> None:
    # Given a runner killed after it published a job's output, before its done record
    manifest = write_jobs(tmp_path / "m", [job("j1", "write")])
    q, out = tmp_path / "q", tmp_path / "out"
    crashed = cli("run", manifest, "--queue", q, "--out", out, cwd=tmp_path,
                  extra_env={"RENDERCTL_CRASH_AT": "publish:after_link"})
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr

    # When the next run recovers it (done, from its published output) with a report
    report = tmp_path / "junit.xml"
    res = cli("run", "--queue", q, "--junit", report, cwd=tmp_path)

    # Then its testcase's class is its kind (it was "job")
    assert res.returncode == 0, res.stdout + res.stderr
    [case] = ET.parse(report).getroot().iter("testcase")
    assert (case.get("name"), case.get("classname")) == ("j1", "python"), ET.tostring(case)
