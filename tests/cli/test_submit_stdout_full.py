"""A stdout that cannot be written (`> file` on a full disk) after a command changed the
queue: exit 74 all the same, but the message says it was stdout, and what was done.

/dev/full stands for the full disk: every write to it fails with ENOSPC. Python's stdout
fails at the write when unbuffered (PYTHONUNBUFFERED, as on this machine) and at the flush
otherwise (before: status 120 and "Exception ignored"); both are run.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from clihelp import RENDERCTL, cli, env, job, write_jobs

from renderctl.errors import ExitCode

BUFFERING = {"unbuffered": {"PYTHONUNBUFFERED": "1"}, "buffered": {"PYTHONUNBUFFERED": ""}}


def to_full_disk(*args: object, cwd: Path, buffering: str) -> subprocess.CompletedProcess[str]:
    """Run renderctl with its stdout on /dev/full."""
    e = env(BUFFERING[buffering])
    if not e["PYTHONUNBUFFERED"]:
        del e["PYTHONUNBUFFERED"]
    with open("/dev/full", "w") as full:
        return subprocess.run([*RENDERCTL, *map(str, args)], stdout=full,
                              stderr=subprocess.PIPE, text=True, cwd=cwd, env=e, timeout=60)


def said_only(res: subprocess.CompletedProcess[str], line: str) -> None:
    assert res.returncode == ExitCode.IO_ERROR, res.stderr
    assert res.stderr == f"renderctl: {line}\n", res.stderr


@pytest.mark.parametrize("buffering", sorted(BUFFERING))
@pytest.mark.parametrize("as_json", [False, True])
def test_a_submit_whose_stdout_is_full_says_its_jobs_were_accepted(
        tmp_path: Path, as_json: bool, buffering: str) -> None:
    # Given a manifest of three jobs
    manifest = write_jobs(tmp_path / "m", [job(j, "write") for j in ("a", "b", "c")])
    queue = tmp_path / "q"

    # When it is submitted with stdout on a full disk
    res = to_full_disk("submit", manifest, "--queue", queue, "--out", tmp_path / "out",
                       *(["--json"] if as_json else []), cwd=tmp_path, buffering=buffering)

    # Then it exits 74 saying stdout could not be written and that the jobs were accepted
    # (before: "I/O error: No space left on device", read by a script as a failed submit),
    # and they are in pending/, where a runner finds them
    said_only(res, "cannot write stdout: No space left on device; the 3 job(s) were "
                   "accepted all the same")
    assert sorted(p.name for p in (queue / "pending").iterdir()) == \
        ["a.json", "b.json", "c.json"]

    # And the same submit again, with stdout working, finds them all already accepted
    again = cli("submit", manifest, "--queue", queue, "--out", tmp_path / "out", "--json",
                cwd=tmp_path)
    assert again.returncode == ExitCode.OK, again.stderr
    assert json.loads(again.stdout)["already_accepted"] == ["a", "b", "c"]


@pytest.mark.parametrize("buffering", sorted(BUFFERING))
def test_a_cancel_whose_stdout_is_full_says_the_jobs_were_cancelled(
        tmp_path: Path, buffering: str) -> None:
    # Given a queue holding two pending jobs
    manifest = write_jobs(tmp_path / "m", [job(j, "write") for j in ("a", "b")])
    queue = tmp_path / "q"
    assert cli("submit", manifest, "--queue", queue, cwd=tmp_path).returncode == 0

    # When both are cancelled with stdout on a full disk
    res = to_full_disk("cancel", "--all", "--queue", queue, cwd=tmp_path, buffering=buffering)

    # Then it exits 74 saying the cancel was made, and it was
    said_only(res, "cannot write stdout: No space left on device; the cancel was made all "
                   "the same: 2 cancelled")
    assert sorted(p.name for p in (queue / "cancelled").iterdir()) == ["a.json", "b.json"]
    assert list((queue / "pending").iterdir()) == []


@pytest.mark.parametrize("buffering", sorted(BUFFERING))
def test_a_status_whose_stdout_is_full_names_stdout(tmp_path: Path, buffering: str) -> None:
    # Given a queue
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    queue = tmp_path / "q"
    assert cli("submit", manifest, "--queue", queue, cwd=tmp_path).returncode == 0

    # When its status is asked for with stdout on a full disk
    res = to_full_disk("status", "--queue", queue, cwd=tmp_path, buffering=buffering)

    # Then the one line says it was stdout that failed, not the queue
    said_only(res, "cannot write stdout: No space left on device")


@pytest.mark.parametrize("buffering", sorted(BUFFERING))
def test_top_whose_stdout_is_full_names_stdout(tmp_path: Path, buffering: str) -> None:
    # Given a queue
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    queue = tmp_path / "q"
    assert cli("submit", manifest, "--queue", queue, cwd=tmp_path).returncode == 0

    # When one frame of top is asked for with stdout on a full disk
    res = to_full_disk("top", "--once", "--queue", queue, cwd=tmp_path, buffering=buffering)

    # Then it says it was stdout, as status does (before: "I/O error: No space left on
    # device", read as the queue's)
    said_only(res, "cannot write stdout: No space left on device")


@pytest.mark.parametrize("buffering", sorted(BUFFERING))
def test_a_refused_submit_whose_stdout_is_full_keeps_its_refusal_and_exit_code(
        tmp_path: Path, buffering: str) -> None:
    # Given a job in the queue, and a manifest giving the same id another spec
    queue, out = tmp_path / "q", tmp_path / "out"
    first = write_jobs(tmp_path / "m1", [job("a", "write")])
    assert cli("submit", first, "--queue", queue, "--out", out, cwd=tmp_path).returncode == 0
    other = write_jobs(tmp_path / "m2", [{**job("a", "write"), "priority": 5}])

    # When a script submits it with --json and stdout on a full disk
    res = to_full_disk("submit", other, "--queue", queue, "--out", out, "--json",
                       cwd=tmp_path, buffering=buffering)

    # Then the refusal still decides: exit 2 with its message, stdout's failure said too
    # (before: a bare "I/O error: No space left on device", exit 74)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert "cannot write stdout: No space left on device" in res.stderr, res.stderr
    assert "different spec" in res.stderr and "Traceback" not in res.stderr, res.stderr


# -- stderr that cannot be written: a message lost, never the work --------------------------


@pytest.mark.parametrize("stderr", ["full", "read-only", "closed"])
def test_a_stderr_that_cannot_be_written_costs_the_messages_not_the_work(
        tmp_path: Path, stderr: str) -> None:
    # Given a manifest of two jobs, one with a deadline long past (a warning on stderr, which
    # then failed the run: exit 1, the jobs left pending; audit CE), and a usage error's
    # command
    m = write_jobs(tmp_path / "m", [job("a", "write"), job("b", "write")])
    m.write_text(m.read_text() + 'deadline = "2001-01-01T00:00:00Z"\n')
    queue = tmp_path / "q"
    files = {"full": ("/dev/full", "w"), "read-only": ("/dev/null", "r")}

    def run(*args: object) -> subprocess.CompletedProcess[str]:
        cmd = [*RENDERCTL, *map(str, args)]
        if stderr == "closed":
            return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True, cwd=tmp_path, env=env(), timeout=60,
                                  preexec_fn=lambda: __import__("os").close(2))
        name, mode = files[stderr]
        with open(name, mode) as fh:
            return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=fh, text=True,
                                  cwd=tmp_path, env=env(), timeout=60)

    # When `run --json` runs it with stderr unwritable
    res = run("run", m, "--queue", queue, "--out", tmp_path / "out", "--json")

    # Then every job ran (one expired, as its deadline says) and the exit code is the run's
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout
    summary = json.loads(res.stdout.splitlines()[-1])
    assert summary["counts"] == {"done": 1, "dead": 0, "cancelled": 0, "expired": 1}
    assert (tmp_path / "out" / "a.bin").read_text() == "x"

    # And a refusal keeps its exit code and its JSON object
    bad = run("status", "--queue", tmp_path / "nowhere", "--json")
    assert bad.returncode == ExitCode.USAGE, bad.stdout
    assert json.loads(bad.stdout)["error"] == "usage"
