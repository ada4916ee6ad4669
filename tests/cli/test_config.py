"""Configuration: CLI > RENDERCTL_<NAME> > renderctl.toml / [tool.renderctl] > built-in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from clihelp import cli

from renderctl.settings import ConfigError, load_config, resolve


def workers_used(tmp_path: Path, *args: str, extra_env: dict[str, str] | None = None) -> int:
    """Run an empty queue with --json; the runner_started event says how many workers."""
    res = cli("run", "--queue", tmp_path / "q", "--json", "--memory-budget", "4000", *args,
              cwd=tmp_path, extra_env=extra_env)
    assert res.returncode == 0, res.stderr
    started = json.loads(res.stdout.splitlines()[0])
    assert started["event"] == "runner_started"
    return int(started["workers"])


def test_precedence_cli_env_file_builtin(tmp_path: Path) -> None:
    builtin = workers_used(tmp_path)  # min(cores, 4000 MB // 400) with nothing set
    (tmp_path / "renderctl.toml").write_text("workers = 3\nmemory-mb = 300\n")
    assert workers_used(tmp_path) == 3
    assert workers_used(tmp_path, extra_env={"RENDERCTL_WORKERS": "5"}) == 5
    assert workers_used(tmp_path, "--workers", "2",
                        extra_env={"RENDERCTL_WORKERS": "5"}) == 2
    (tmp_path / "renderctl.toml").unlink()
    assert workers_used(tmp_path) == builtin


def test_pyproject_table_and_queue_default(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[tool.renderctl]\nqueue = "from-config"\n')
    res = cli("status", "--json", cwd=tmp_path)
    assert res.returncode == 2  # not a queue yet: proves the configured path was used
    assert "from-config" in res.stderr
    env_wins = cli("status", "--json", cwd=tmp_path,
                   extra_env={"RENDERCTL_QUEUE": str(tmp_path / "envq")})
    assert "envq" in env_wins.stderr


@pytest.mark.parametrize("text, needle", [
    ("wrokers = 2\n", "unknown key 'wrokers' (did you mean 'workers'?"),
    ("workers = 0\n", "key 'workers': expected an integer >= 1, got 0"),
    ("workers = \"two\"\n", "key 'workers'"),
    ("memory_guard = \"magic\"\n", "key 'memory_guard'"),
    ("workers = [\n", "not valid TOML"),
    # (found by an audit: each was a traceback and exit 1, in every command)
    ("\udcff", "not UTF-8 (byte 0)"),
    ("x = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("workers = " + "9" * 5000 + "\n", "a number of more than 4300 digits"),
    ("a" + ".a" * 40_000 + " = 1\n", "a key of more than 64 dotted parts"),  # (was 43 s)
    ("workers = 2\0\n", "contains a NUL character"),
    (".".join(['"\\""'] * 20_000) + " = 1\n", "a key of more than 64 dotted parts"),
    # (audit BN: which one applied hung on the order of the lines)
    ("memory_mb = 111\nmemory-mb = 222\n",
     "'memory-mb' and 'memory_mb' are the same setting; keep one"),
], ids=["unknown", "zero", "string", "guard", "syntax", "not-utf8", "deep", "huge-int",
        "long-dotted-key", "nul", "long-key-of-escaped-quotes", "both-spellings"])
def test_bad_config_exits_2_naming_file_and_key(tmp_path: Path, text: str,
                                                needle: str) -> None:
    path = tmp_path / "renderctl.toml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    res = cli("status", cwd=tmp_path)
    assert res.returncode == 2
    assert str(path) in res.stderr and needle in res.stderr
    assert "Traceback" not in res.stderr
    # and the commands that read nothing from it are unaffected
    assert cli("kinds", cwd=tmp_path).returncode == 0


def test_every_problem_of_a_config_file_is_reported_at_once(tmp_path: Path) -> None:
    (tmp_path / "renderctl.toml").write_text('workers = "many"\nbogus = 1\ntimeout = -1\n')
    res = cli("status", cwd=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    assert len(lines) == 3 and all(line.startswith("renderctl: ") for line in lines), lines
    for needle in ("key 'workers'", "unknown key 'bogus'", "key 'timeout'"):
        assert any(needle in line for line in lines), (needle, lines)


def test_resolver_rule() -> None:
    cfg = {"workers": 3}
    assert resolve("workers", cli=1, env={"RENDERCTL_WORKERS": "2"}, config=cfg) == 1
    assert resolve("workers", env={"RENDERCTL_WORKERS": "2"}, config=cfg) == 2
    assert resolve("workers", env={}, config=cfg) == 3
    assert resolve("workers", env={}, config={}, default=4) == 4
    with pytest.raises(ConfigError, match="RENDERCTL_WORKERS"):
        resolve("workers", env={"RENDERCTL_WORKERS": "-1"})


def test_load_config_prefers_renderctl_toml(tmp_path: Path) -> None:
    assert load_config(tmp_path) == {}
    (tmp_path / "pyproject.toml").write_text("[tool.renderctl]\ntimeout = 5\n")
    assert load_config(tmp_path) == {"timeout": 5.0}
    (tmp_path / "renderctl.toml").write_text("timeout = 7\n")
    assert load_config(tmp_path) == {"timeout": 7.0}
    # The whole file wins, as README says: pyproject's other keys are not merged in
    (tmp_path / "pyproject.toml").write_text("[tool.renderctl]\ntimeout = 5\nworkers = 3\n")
    assert load_config(tmp_path) == {"timeout": 7.0}


@pytest.mark.parametrize("make, needle", [
    (lambda p: p.mkdir(), "a folder"),
    (lambda p: __import__("os").mkfifo(p), "not a regular file"),
    (lambda p: p.symlink_to(p.with_name("nowhere")), "a symlink to nothing"),
], ids=["folder", "fifo", "dangling-link"])
def test_a_renderctl_toml_that_is_no_file_is_an_error_not_a_fall_back_to_pyproject(
        tmp_path: Path, make: Any, needle: str) -> None:
    # Given a pyproject.toml with settings, and something named renderctl.toml beside it
    (tmp_path / "pyproject.toml").write_text("[tool.renderctl]\nworkers = 3\n")
    make(tmp_path / "renderctl.toml")

    # When a command reads its configuration, then it is an error naming renderctl.toml
    # (before: pyproject.toml's settings applied, silently; a FIFO is not opened: audit ES)
    res = cli("status", cwd=tmp_path, timeout=20)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert str(tmp_path / "renderctl.toml") in res.stderr and needle in res.stderr


def test_run_without_manifests_warns_that_job_options_reach_no_queued_job(
        tmp_path: Path) -> None:
    from clihelp import job, write_jobs

    # Given a job submitted with the default output root and limits
    manifest = write_jobs(tmp_path / "m", [job("a", "write")])
    q = tmp_path / "q"
    assert cli("submit", manifest, "--queue", q, cwd=tmp_path).returncode == 0

    # When a later `run` is given another output root and timeout on its command line
    res = cli("run", "--queue", q, "--out", tmp_path / "elsewhere", "--timeout", "5",
              cwd=tmp_path)

    # Then it says those reach no queued job, and the job keeps what it was submitted with
    assert res.returncode == 0, res.stderr
    assert "warning: --out, --timeout only apply to jobs this command submits" in res.stderr
    assert (tmp_path / "out" / "a.bin").exists()
    assert not (tmp_path / "elsewhere").exists()

    # And from the environment (meant for every command) they pass without a word
    assert cli("submit", manifest, "--queue", q, cwd=tmp_path).returncode == 0
    quiet = cli("run", "--queue", q, cwd=tmp_path, extra_env={"RENDERCTL_TIMEOUT": "5"})
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
