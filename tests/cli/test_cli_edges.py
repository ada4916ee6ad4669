"""Edges of the command line: paths that mean nothing or the wrong thing, files the user
cannot read, duplicate ids, closed pipes, and messages that say exactly what happened."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from clihelp import cli, job, write_jobs


def one_line_usage_error(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2 with a single stderr line holding every needle (never a traceback)."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    for needle in needles:
        assert needle in res.stderr, (needle, res.stderr)


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return write_jobs(tmp_path / "m", [job("j1", "write"), job("j2", "write")])


# -- an empty --queue or --out is not the current folder -------------------------------------


@pytest.mark.parametrize("option", ["--queue", "-q", "--out", "-o"])
@pytest.mark.parametrize("command", ["submit", "run"])
def test_an_empty_queue_or_output_root_is_a_usage_error(tmp_path: Path, manifest: Path,
                                                       command: str, option: str) -> None:
    # Given a working folder holding only a manifest
    cwd = tmp_path / "work"
    cwd.mkdir()
    others = ["--out", tmp_path / "out"] if option in ("--queue", "-q") else \
        ["--queue", tmp_path / "q"]

    # When a command is given an empty path (a variable that expanded to nothing)
    res = cli(command, manifest, option, "", *others, cwd=cwd)

    # Then it is a usage error naming the option, and neither the current folder nor any
    # queue was touched
    long = {"-q": "--queue", "-o": "--out"}.get(option, option)
    one_line_usage_error(res, f"{long}: must not be empty")
    assert list(cwd.iterdir()) == []
    assert not (tmp_path / "q").exists()


def test_an_empty_queue_is_a_usage_error_for_reading_commands_too(tmp_path: Path) -> None:
    res = cli("status", "--queue", "", cwd=tmp_path)
    one_line_usage_error(res, "--queue: must not be empty")
