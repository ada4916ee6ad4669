"""The command line: exit codes, JSON outputs, plain output on a pipe, a light start-up."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from renderctl.cli.app import app
from renderctl.lifecycle import State
from renderctl.manifest import FIELDS

STATES = [s.value for s in State]
ANSI = re.compile(r"\x1b\[")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1", "RENDERCTL_QUEUE": "",
                          "RENDERCTL_OUT": ""})


@pytest.fixture
def good(write_manifest: Any) -> Path:
    return write_manifest([
        {"id": "a", "kind": "python", "callable": "m:f", "output": "a.pdf"},
        {"id": "b", "kind": "python", "callable": "m:f", "output": "b.pdf", "priority": 2},
    ], name="good.toml")


@pytest.fixture
def bad(write_manifest: Any) -> Path:
    return write_manifest([{"id": "x", "kind": "python", "callable": "m:f", "output": "/abs",
                            "memroy_mb": 1}], name="bad.toml")


def test_validate_exit_codes(runner: CliRunner, good: Path, bad: Path) -> None:
    ok = runner.invoke(app, ["validate", str(good)])
    assert ok.exit_code == 0 and "ok: 2 job(s) in 1 manifest(s)" in ok.stdout
    res = runner.invoke(app, ["validate", str(good), str(bad)])
    assert res.exit_code == 2
    assert f"{bad}: job x: memroy_mb: unknown field (did you mean 'memory_mb'?)" in res.stderr
    assert f"{bad}: job x: output: must be relative" in res.stderr
    assert "2 problem(s); invalid" in res.stderr and "enqueued" not in res.stderr
    as_json = runner.invoke(app, ["validate", "--json", str(bad)])
    assert as_json.exit_code == 2
    assert {p["field"] for p in json.loads(as_json.stdout)["problems"]} == {"memroy_mb",
                                                                             "output"}


def test_submit_then_status_and_show(runner: CliRunner, good: Path, queue_dir: Path,
                                     out_root: Path) -> None:
    q = ["--queue", str(queue_dir)]
    res = runner.invoke(app, ["submit", *q, "--out", str(out_root), str(good)])
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith("accepted 2 job(s)")
    again = runner.invoke(app, ["submit", *q, "--out", str(out_root), "--json", str(good)])
    assert json.loads(again.stdout) == {"accepted": [], "already_accepted": ["a", "b"],
                                        "replaced": []}
    # status --json: counts for every state at the top level
    st = json.loads(runner.invoke(app, ["status", *q, "--json"]).stdout)
    assert {k: st[k] for k in STATES} == {"pending": 2, "running": 0, "done": 0, "dead": 0,
                                          "cancelled": 0, "expired": 0}
    assert st["corrupt"] == 0 and st["running_jobs"] == [] and st["runner"] is None
    assert st["queue"] == str(queue_dir)
    # show --json: one job
    shown = runner.invoke(app, ["show", *q, "--json", "b"])
    assert shown.exit_code == 0
    job = json.loads(shown.stdout)
    assert (job["id"], job["state"], job["spec"]["priority"], job["attempts"]) == (
        "b", "pending", 2, [])
    assert job["spec"]["out_root"] == str(out_root)
    missing = runner.invoke(app, ["show", *q, "nope"])
    assert missing.exit_code == 2 and "no job 'nope'" in missing.stderr


def test_submit_saturated_exits_75(runner: CliRunner, good: Path, queue_dir: Path) -> None:
    res = runner.invoke(app, ["submit", "--queue", str(queue_dir), "--max-pending", "1",
                              str(good)])
    assert res.exit_code == 75
    assert "1 would fit" in res.stderr and "nothing was enqueued" in res.stderr
    assert list((queue_dir / "pending").iterdir()) == []


def test_bad_manifest_exits_2_and_enqueues_nothing(runner: CliRunner, good: Path, bad: Path,
                                                   queue_dir: Path) -> None:
    res = runner.invoke(app, ["submit", "--queue", str(queue_dir), str(good), str(bad)])
    assert res.exit_code == 2 and "nothing was enqueued" in res.stderr
    assert not (queue_dir / "pending").exists() or not list((queue_dir / "pending").iterdir())


def test_a_command_run_in_process_leaves_the_stop_handlers_as_it_found_them(
        runner: CliRunner, write_manifest: Any, queue_dir: Path) -> None:
    import signal

    # (submit defers stop signals while it changes the queue; in a process that goes on,
    # Ctrl-C was only recorded from then on; review DE)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    m = write_manifest([{"id": "a", "kind": "python", "callable": "json:dumps",
                         "output": "a.pdf"}])
    for args in (["submit", str(m)], ["cancel", "--all"], ["prune", "--older-than", "0"]):
        res = runner.invoke(app, [*args, "--queue", str(queue_dir)])
        assert res.exit_code == 0, res.stderr
        assert {sig: signal.getsignal(sig) for sig in before} == before, args


def test_schema_prints_json(runner: CliRunner) -> None:
    res = runner.invoke(app, ["schema"])
    assert res.exit_code == 0
    schema = json.loads(res.stdout)
    # (and takes --json, as every command that prints JSON does: it was a usage error;
    # audit DB)
    also = runner.invoke(app, ["schema", "--json"])
    assert also.exit_code == 0 and json.loads(also.stdout) == schema, also.stderr
    assert set(schema["properties"]["jobs"]["items"]["properties"]) == {
        f.name for f in FIELDS if f.in_job}
    # The validator's list limits, so that a manifest built from the schema is not refused
    # only at validation (tests/unit/test_manifest.py proves the validator enforces them).
    props = schema["properties"]["jobs"]["items"]["properties"]
    assert props["inputs"]["maxItems"] == 1000
    assert (props["argv"]["minItems"], props["argv"]["maxItems"]) == (1, 1000)


def test_kinds_lists_the_built_ins(runner: CliRunner) -> None:
    res = runner.invoke(app, ["kinds", "--json"])
    assert res.exit_code == 0
    kinds = json.loads(res.stdout)
    assert {"invoice", "report", "merge", "stamp", "split", "command", "python"} <= set(kinds)
    assert {"name": "title", "type": "str", "required": True, "description": "report title",
            "schema": {"type": "string", "description": "report title"}} \
        in kinds["report"]["params"]
    [position] = [p for p in kinds["stamp"]["params"] if p["name"] == "position"]
    assert position["schema"]["enum"][0] == "center"
    # Each kind's input limits as a job meets them (null read as "no limit": audit CE)
    assert kinds["invoice"]["inputs"] == [1, 1]
    assert kinds["merge"]["inputs"][1] == kinds["command"]["inputs"][1] == 1000


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs sysfs mounted at /sys")
def test_queue_folder_that_cannot_be_created_exits_74(runner: CliRunner, good: Path) -> None:
    # sysfs refuses mkdir even to root (EPERM): the system's refusal, not a path the user
    # got wrong (a path through a regular file is exit 2: test_usage_errors).
    queue = Path("/sys") / f"renderctl-test-{os.getpid()}" / "queue"
    res = runner.invoke(app, ["submit", "--queue", str(queue), str(good)])
    assert res.exit_code == 74, res.output
    assert "cannot create queue" in res.stderr and "Traceback" not in res.output
    assert not queue.parent.exists()


def test_status_of_a_missing_queue_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    res = runner.invoke(app, ["status", "--queue", str(tmp_path / "none")])
    assert res.exit_code == 2 and "does not exist: no queue there yet" in res.stderr  # usage
    assert not (tmp_path / "none").exists()  # status never creates a queue


def test_cancel_a_pending_job(runner: CliRunner, good: Path, queue_dir: Path) -> None:
    q = ["--queue", str(queue_dir)]
    runner.invoke(app, ["submit", *q, str(good)])
    res = runner.invoke(app, ["cancel", *q, "--json", "a"])
    assert res.exit_code == 0, res.output
    assert json.loads(runner.invoke(app, ["show", *q, "--json", "a"]).stdout)["state"] == (
        "cancelled")
    assert runner.invoke(app, ["cancel", *q, "nope"]).exit_code == 2


# -- in a child process: pipes and imports ---------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NO_COLOR", "FORCE_COLOR", "RENDERCTL_QUEUE", "RENDERCTL_OUT")}
    return {**env, "COLUMNS": "100", "TERM": "xterm-256color", **extra}


def test_status_on_a_pipe_has_no_ansi_codes(renderctl_argv: list[str], good: Path,
                                            queue_dir: Path) -> None:
    subprocess.run([*renderctl_argv, "submit", "--queue", str(queue_dir), str(good)],
                   check=True, capture_output=True, env=_env())
    for args in (["status"], ["show", "a"]):
        proc = subprocess.run([*renderctl_argv, *args, "--queue", str(queue_dir)],
                              capture_output=True, text=True, env=_env())
        assert proc.returncode == 0, proc.stderr
        assert not ANSI.search(proc.stdout) and not ANSI.search(proc.stderr)
        assert proc.stdout.strip()
    status = subprocess.run([*renderctl_argv, "status", "--queue", str(queue_dir)],
                            capture_output=True, text=True, env=_env()).stdout
    assert "pending=2 running=0 done=0 dead=0 cancelled=0 expired=0" in status


HEAVY = ("reportlab", "pypdf", "pydantic")
# What a command imported, said at its exit (an exit hook: the CLI ends the process itself)
PROBE = """
import atexit, sys
sys.argv = ["renderctl", *sys.argv[1:]]

def said():
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"reportlab", "pypdf", "pydantic"})
    sys.stderr.write("HEAVY=" + ",".join(heavy) + "\\n")
    drawing = sorted(m for m in sys.modules if m == "rich" or m == "importlib.metadata")
    sys.stderr.write("DRAWING=" + ",".join(drawing) + "\\n")

atexit.register(said)
from renderctl.cli.app import main
main()
"""


@pytest.mark.parametrize("args", [["--help"], ["status"], ["status", "--json"],
                                  ["validate", "GOOD"], ["schema"], ["kinds"]],
                         ids=lambda a: " ".join(a))
def test_light_commands_do_not_import_reportlab_pypdf_or_pydantic(
    args: list[str], good: Path, queue_dir: Path, renderctl_argv: list[str]
) -> None:
    subprocess.run([*renderctl_argv, "submit", "--queue", str(queue_dir), str(good)],
                   check=True, capture_output=True, env=_env())
    argv = [str(good) if a == "GOOD" else a for a in args]
    if args[0] == "status":
        argv += ["--queue", str(queue_dir)]
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                          text=True, env=_env())
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "HEAVY=\n" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [["submit", "GOOD"], ["status", "--json"], ["validate", "GOOD"]],
                         ids=lambda a: " ".join(a))
def test_commands_that_print_lines_do_not_import_rich_or_look_for_plugins(
    args: list[str], good: Path, queue_dir: Path
) -> None:
    # rich draws tables and the dashboard, and plugins are looked for only for a kind that
    # is not built in: neither is needed to print lines or JSON (~70 ms of a ~0.4 s submit)
    argv = [str(good) if a == "GOOD" else a for a in args]
    if args[0] in ("submit", "status"):
        argv += ["--queue", str(queue_dir)]
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                          text=True, env=_env())
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "DRAWING=\n" in proc.stderr, proc.stderr


def test_python_m_renderctl_runs_the_cli_and_starts_light(good: Path) -> None:
    # `python -m renderctl` is the command line as the `renderctl` script is; -X importtime
    # lists every module the process imported, so a heavy one cannot hide.
    helped = subprocess.run([sys.executable, "-X", "importtime", "-m", "renderctl", "--help"],
                            capture_output=True, text=True, env=_env(), timeout=30)
    assert helped.returncode == 0, helped.stderr
    assert "validate" in helped.stdout and "submit" in helped.stdout, helped.stdout
    imported = {ln.rsplit("|", 1)[-1].strip().split(".")[0]
                for ln in helped.stderr.splitlines() if ln.startswith("import time:")}
    assert "renderctl" in imported
    assert imported & set(HEAVY) == set(), sorted(imported & set(HEAVY))
    # And it exits with the command's code
    checked = subprocess.run([sys.executable, "-m", "renderctl", "validate", str(good)],
                             capture_output=True, text=True, env=_env(), timeout=30)
    assert checked.returncode == 0 and "ok: 2 job(s)" in checked.stdout, checked.stderr
    missing = subprocess.run([sys.executable, "-m", "renderctl", "validate",
                              str(good.with_name("nope.toml"))],
                             capture_output=True, text=True, env=_env(), timeout=30)
    assert missing.returncode == 2, missing.stderr


def test_version_prints_the_installed_version(renderctl_argv: list[str]) -> None:
    from importlib.metadata import version

    res = subprocess.run([*renderctl_argv, "--version"], capture_output=True, text=True,
                         timeout=30)
    assert (res.returncode, res.stdout) == (0, f"renderctl {version('renderctl')}\n")


def test_dead_retry_refuses_ids_and_all_together(runner: CliRunner, good: Path,
                                                 queue_dir: Path, out_root: Path) -> None:
    q = ["--queue", str(queue_dir)]
    assert runner.invoke(app, ["submit", *q, "--out", str(out_root), str(good)]).exit_code == 0
    res = runner.invoke(app, ["dead", "retry", "--all", "a", *q])
    assert res.exit_code == 2
    assert "not both" in res.stderr


def test_run_with_a_bad_manifest_leaves_no_queue_folder(renderctl_argv: list[str], bad: Path,
                                                        tmp_path: Path) -> None:
    queue = tmp_path / "never"
    res = subprocess.run([*renderctl_argv, "run", str(bad), "--queue", str(queue),
                          "--out", str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2, res.stderr
    assert "nothing was enqueued" in res.stderr
    assert not queue.exists()


def test_a_malformed_crash_point_variable_exits_2_before_any_work(
        renderctl_argv: list[str], good: Path, tmp_path: Path) -> None:
    queue = tmp_path / "never"
    res = subprocess.run([*renderctl_argv, "run", str(good), "--queue", str(queue)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "RENDERCTL_CRASH_AT": "commit:n=x"})
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("renderctl: RENDERCTL_CRASH_AT='commit:n=x'"), res.stderr
    assert "Traceback" not in res.stderr
    assert not queue.exists()


def test_submit_json_reports_problems_on_stdout(runner: CliRunner, bad: Path,
                                                queue_dir: Path) -> None:
    res = runner.invoke(app, ["submit", "--json", "--queue", str(queue_dir), str(bad)])
    assert res.exit_code == 2
    doc = json.loads(res.stdout)
    assert doc["accepted"] == []
    assert {p["field"] for p in doc["problems"]} == {"memroy_mb", "output"}


def test_a_deadline_already_past_is_accepted_with_a_warning(runner: CliRunner,
                                                            write_manifest: Any,
                                                            queue_dir: Path) -> None:
    past = write_manifest([{"id": "late", "kind": "python", "callable": "m:f",
                            "output": "late.pdf", "deadline": "2020-01-01T00:00:00Z"}],
                          name="past.toml")
    for cmd in (["validate"], ["submit", "--queue", str(queue_dir)]):
        res = runner.invoke(app, [*cmd, str(past)])
        assert res.exit_code == 0, res.stderr
        assert f"warning: {past}: job late: deadline: already past" in res.stderr


def test_many_past_deadlines_are_warned_of_in_bounded_form(runner: CliRunner,
                                                           write_manifest: Any,
                                                           queue_dir: Path) -> None:
    past = write_manifest([{"id": f"late{i}", "kind": "python", "callable": "m:f",
                            "output": f"late{i}.pdf", "deadline": "2020-01-01T00:00:00Z"}
                           for i in range(12)], name="past.toml")
    res = runner.invoke(app, ["submit", "--queue", str(queue_dir), str(past)])
    assert res.exit_code == 0, res.stderr
    warned = [line for line in res.stderr.splitlines()
              if ": deadline: " in line or "deadline is" in line]
    assert len(warned) == 6, res.stderr
    assert warned[-1].endswith("warning: 7 more accepted job(s) whose deadline is already past")


def test_a_job_whose_output_exists_already_is_accepted_with_a_warning(
        runner: CliRunner, write_manifest: Any, queue_dir: Path, tmp_path: Path) -> None:
    # Given an output root where r.pdf exists (an earlier life of job r published it)
    out = tmp_path / "out"
    out.mkdir()
    (out / "r.pdf").write_bytes(b"%PDF-1.4 earlier")
    first = write_manifest([{"id": "fresh", "kind": "python", "callable": "json:dumps",
                             "output": "fresh.pdf"}], name="fresh.toml")
    res = runner.invoke(app, ["submit", str(first), "--queue", str(queue_dir), "--out", str(out)])
    assert res.exit_code == 0 and "warning" not in res.stderr, res.stderr

    # When a job naming it is submitted, new or replacing another spec of the same id
    for n, extra in enumerate(({}, {"priority": 2}, {"priority": 3})):
        m = write_manifest([{"id": "r", "kind": "python", "callable": "m:f",
                             "output": "r.pdf", **extra}], name=f"r{n}.toml")
        args = ["submit", str(m), "--queue", str(queue_dir), "--out", str(out)]
        res = runner.invoke(app, args + (["--replace"] if n else []))

        # Then it is accepted, with a warning that it will dead-letter unless the file goes
        assert res.exit_code == 0, res.stderr
        assert f"warning: {m}: job r: output: {out / 'r.pdf'} exists already" in res.stderr
        assert "dead-lettered (output_exists)" in res.stderr
    assert (out / "r.pdf").read_bytes() == b"%PDF-1.4 earlier"


def test_a_job_whose_output_cannot_be_made_or_is_a_folder_is_warned(
        runner: CliRunner, write_manifest: Any, queue_dir: Path, tmp_path: Path) -> None:
    # Given an output root holding a file where a job's folder should be, and a folder
    # where another job's output should be (audit CF: the first was said only at run, the
    # second told to remove "that file")
    out = tmp_path / "out"
    out.mkdir()
    (out / "afile").write_text("x")
    (out / "isdir.pdf").mkdir()
    m = write_manifest([{"id": "a", "kind": "python", "callable": "json:dumps",
                         "output": "afile/x.pdf"},
                        {"id": "b", "kind": "python", "callable": "json:dumps",
                         "output": "isdir.pdf"}], name="m.toml")
    res = runner.invoke(app, ["submit", str(m), "--queue", str(queue_dir), "--out", str(out)])
    # Then both are accepted, each with a warning saying what is in the way
    assert res.exit_code == 0, res.stderr
    assert (f"job a: output: {out / 'afile' / 'x.pdf'} cannot be made: a file is where one "
            "of its folders should be") in res.stderr
    assert f"job b: output: {out / 'isdir.pdf'} exists already" in res.stderr
    assert "unless that folder is removed first" in res.stderr


def test_a_job_whose_output_is_a_symlink_is_warned_of_its_real_outcome(
        runner: CliRunner, write_manifest: Any, queue_dir: Path, tmp_path: Path) -> None:
    # Given an output root where the output's name is a symlink (to a folder)
    out = tmp_path / "out"
    (out / "elsewhere").mkdir(parents=True)
    (out / "lnk").symlink_to(out / "elsewhere")
    m = write_manifest([{"id": "s", "kind": "python", "callable": "m:f", "output": "lnk"}])

    # When a job naming it is submitted
    res = runner.invoke(app, ["submit", str(m), "--queue", str(queue_dir), "--out", str(out)])

    # Then the warning foretells what the runner does with a symlink (invalid_output: it
    # never publishes through one), not output_exists (audit BA)
    assert res.exit_code == 0, res.stderr
    assert (f"warning: {m}: job s: output: {out / 'lnk'} is a symlink; renderctl never "
            "publishes through one, so the job will be dead-lettered (invalid_output)") \
        in res.stderr, res.stderr


def test_shell_completion_completes_commands_and_options(tmp_path: Path) -> None:
    # What bash's completion function runs (see --show-completion): the program itself,
    # told by the environment which words are on the line.
    # (The shell named, not detected from our parent: under sh, as from a Makefile or a
    # Dockerfile's RUN, detection says "Shell sh not supported" and the test failed.)
    named = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    script = subprocess.run([sys.executable, "-m", "renderctl", "--show-completion", "bash"],
                            env=named, capture_output=True, text=True, timeout=60)
    assert script.returncode == 0, script.stderr
    assert "complete -o default -F _renderctl_completion renderctl" in script.stdout

    def complete(line: str) -> list[str]:
        words = line.split(" ")
        env = {**os.environ, "_RENDERCTL_COMPLETE": "complete_bash",
               "COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)}
        res = subprocess.run([sys.executable, "-m", "renderctl"], capture_output=True,
                             text=True, env=env, timeout=60, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        return res.stdout.split()

    assert complete("renderctl st") == ["status"]
    assert "--start-method" in complete("renderctl run --st")
    assert complete("renderctl dead re") == ["retry"]
    assert list(tmp_path.iterdir()) == []  # completing made no queue, started nothing


@pytest.mark.parametrize("command", ["submit", "run"])
def test_help_shows_the_job_limits_a_job_gets_when_nothing_sets_them(
        runner: CliRunner, command: str) -> None:
    from renderctl.manifest import Limits

    # (DESIGN names the options; --help showed no default for them)
    res = runner.invoke(app, [command, "--help"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # (wrapped to the terminal's width)
    built_in = Limits()
    for option, value in [("--memory-mb", built_in.memory_mb),
                          ("--timeout", f"{built_in.timeout_s:g}"),
                          ("--max-attempts", built_in.max_attempts)]:
        assert re.search(rf"{option} <\w+> [^[]*\[default {value}\]", text), text
