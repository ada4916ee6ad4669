"""`run --json --junit --metrics-textfile` and `metrics`: every output parses and adds up."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from clihelp import cli, job, write_jobs

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A small parser of the text format 0.0.4; fails on any line it does not understand."""
    assert text.endswith("\n")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped")
            types[name] = kind
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, _, labels, value = m.groups()
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in types or family in types, f"{name} has no TYPE"
        key = (name, tuple(LABEL.findall(labels or "")))
        assert key not in samples, f"duplicate sample {key}"
        samples[key] = float(value)
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
