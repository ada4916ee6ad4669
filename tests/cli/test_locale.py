"""A terminal or file that is not UTF-8: what renderctl prints of users' text is escaped,
never a UnicodeEncodeError traceback, and a manifest's file name this system cannot spell
is a problem named like any other."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from clihelp import RENDERCTL, cli, env, job, write_jobs

from renderctl.errors import ExitCode

# stdout in Latin-1 (an ISO-8859 locale's terminal): it has "é" but no CJK, no emoji.
LATIN1_STDOUT = {"PYTHONIOENCODING": "latin-1"}
# The C locale with Python's UTF-8 mode and locale coercion off: file names are ASCII.
ASCII_NAMES = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
TEXT = "Größe 株 🙂"


@pytest.fixture
def failed_queue(tmp_path: Path) -> Path:
    """A queue whose one job failed with TEXT as its error (one attempt: dead at once)."""
    manifest = write_jobs(tmp_path / "m", [job("u1", "fail", max_attempts=1,
                                               params={"why": TEXT})])
    queue = tmp_path / "q"
    res = cli("run", manifest, "--queue", queue, "--out", tmp_path / "out", "--quiet",
              cwd=tmp_path)
    assert res.returncode == ExitCode.JOBS_FAILED, res.stderr
    return queue


@pytest.mark.parametrize("command", [["show", "u1"], ["dead", "list"], ["top", "--once"]])
def test_users_text_on_a_latin1_stdout_is_escaped_not_a_traceback(
        tmp_path: Path, failed_queue: Path, command: list[str]) -> None:
    # When a view that prints the job's error runs with stdout in Latin-1
    res = subprocess.run([*RENDERCTL, *command, "--queue", str(failed_queue)],
                         capture_output=True, cwd=tmp_path, env=env(LATIN1_STDOUT), timeout=60)

    # Then it succeeds, with what Latin-1 cannot hold escaped and the rest as Latin-1
    # (before: exit 1 and a UnicodeEncodeError traceback from the print)
    assert res.returncode == ExitCode.OK, res.stderr
    assert b"Traceback" not in res.stderr
    stdout = res.stdout.decode("latin-1")
    assert "Größe \\u682a \\U0001f642" in stdout, stdout


@pytest.mark.parametrize("field", ["input", "output"])
def test_a_file_name_the_system_cannot_spell_is_a_named_problem(
        tmp_path: Path, field: str) -> None:
    # Given a manifest naming, in its input or its output, a file with a CJK character
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    (tmp_path / "m" / "ok.txt").write_text("x")
    lines = manifest.read_text().splitlines()
    lines.append('input = "株.txt"' if field == "input" else 'input = "ok.txt"')
    if field == "output":
        lines = [line for line in lines if not line.startswith("output")]
        lines.append('output = "株.pdf"')
    manifest.write_text("\n".join(lines) + "\n")

    # When it is validated where file names are ASCII
    res = cli("validate", manifest, "--json", cwd=tmp_path, extra_env=ASCII_NAMES)

    # Then it is refused (exit 2) naming the job and the field, with the way out (before:
    # a UnicodeEncodeError traceback from os.stat, and no JSON)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert "Traceback" not in res.stderr
    problems = json.loads(res.stdout)["problems"]
    mine = [p for p in problems if p["field"] == field]
    assert len(mine) == 1, problems
    assert mine[0]["job"] == "a"
    assert "file name encoding (ascii)" in mine[0]["message"]
    assert "UTF-8 locale" in mine[0]["message"]


def test_a_configured_queue_the_system_cannot_spell_is_a_usage_error(tmp_path: Path) -> None:
    # Given a renderctl.toml naming a queue in CJK, where file names are ASCII
    (tmp_path / "renderctl.toml").write_text('queue = "株q"\n', encoding="utf-8")
    # When status runs there
    res = subprocess.run([*RENDERCTL, "status"], capture_output=True, cwd=tmp_path,
                         env=env(ASCII_NAMES), timeout=60)
    # Then it is refused (exit 2) naming the key and the way out (before: a traceback)
    stderr = res.stderr.decode("ascii", "backslashreplace")
    assert res.returncode == ExitCode.USAGE, stderr
    assert "Traceback" not in stderr
    assert "key 'queue'" in stderr and "file name encoding (ascii)" in stderr, stderr


def test_a_command_argument_the_system_cannot_pass_is_a_named_problem(tmp_path: Path) -> None:
    # Given a command job with a CJK argument, where the system's encoding is ASCII
    manifest = tmp_path / "m.toml"
    manifest.write_text('[[jobs]]\nid = "c"\nkind = "command"\n'
                        'argv = ["echo", "株", "{output}"]\noutput = "c.txt"\n', encoding="utf-8")
    # When it is validated
    res = cli("validate", manifest, "--json", cwd=tmp_path, extra_env=ASCII_NAMES)
    # Then the argument is the problem, at once (before: accepted, and every attempt
    # failed with a UnicodeEncodeError, retried)
    assert res.returncode == ExitCode.USAGE, res.stderr
    [problem] = json.loads(res.stdout)["problems"]
    assert (problem["job"], problem["field"]) == ("c", "argv[1]")
    assert "UTF-8 locale" in problem["message"]
