"""`run` starts its fork server before the command line is imported, and only when the run
will use one: the start method is resolved first as the command resolves it (option,
environment, configuration file, default). Real runs; the runner's children as `ps` sees
them."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from jobfns import LAUNCHER, RENDERCTL, Runner, _env, cli_args, held_job, wait_for_pid

from renderctl.errors import ExitCode


def fork_servers(pid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):
            if "multiprocessing.forkserver" in " ".join(p.cmdline()):
                found.append(p)
    return found


# How the start method is given (the option's two spellings, the environment, the
# configuration file in the cwd), and the method given
SOURCES = {
    "option": (("--start-method", "{m}"), {}, None),
    "option=": (("--start-method={m}",), {}, None),
    "environment": ((), {"RENDERCTL_START_METHOD": "{m}"}, None),
    "config file": ((), {}, 'start_method = "{m}"\n'),
}


def without_start_method(env: dict[str, str], *, keep: bool) -> dict[str, str]:
    """``env`` without a RENDERCTL_START_METHOD the suite was run with (which would win
    over the configuration file), unless it is the source under test."""
    if not keep:
        env.pop("RENDERCTL_START_METHOD", None)
    return env


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("source", list(SOURCES))
def test_a_run_has_a_fork_server_only_with_that_start_method(
        tmp_path: Path, write_manifest: Any, source: str, method: str) -> None:
    # Given a held job and the start method given one way
    job, go = held_job(tmp_path, "held")
    manifest = write_manifest([job])
    args, env, config = SOURCES[source]
    if config is not None:
        (tmp_path / "renderctl.toml").write_text(config.format(m=method))
    # (through the script's own entry point, which starts the server before importing the
    # command line, and through the command line's module, as the other tests run it)
    launcher = LAUNCHER if source == "option=" else RENDERCTL
    runner = Runner.of(subprocess.Popen(
        [*launcher, "run", str(manifest),
         *cli_args(tmp_path / "q", tmp_path / "out", "--workers", "1"),
         *(a.format(m=method) for a in args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
        env=without_start_method(_env({k: v.format(m=method) for k, v in env.items()}),
                                 keep=source == "environment")))
    try:
        # When its job runs
        wait_for_pid(tmp_path / "held.pid")
        # Then the runner has a fork server exactly when the run uses that method: none
        # started early for a fork or spawn run
        assert len(fork_servers(runner.pid)) == (method == "forkserver"), runner.lines
        go.touch()
        assert runner.wait() == ExitCode.OK, (runner.lines, runner.stderr())
    finally:
        runner.close()


@pytest.mark.parametrize("launcher", [LAUNCHER, RENDERCTL], ids=["script", "module"])
def test_a_bad_start_method_is_left_to_the_command_to_refuse(
        tmp_path: Path, write_manifest: Any, launcher: list[str]) -> None:
    # Given a start method that does not exist
    job, _ = held_job(tmp_path, "held")
    manifest = write_manifest([job])
    res = subprocess.run([*launcher, "run", str(manifest),
                          *cli_args(tmp_path / "q", tmp_path / "out"),
                          "--start-method", "vfork"],
                         capture_output=True, text=True, timeout=60, env=_env(None))
    # Then the command refuses it as before (exit 2, naming it), nothing queued
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert "vfork" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "q" / "pending").exists() or \
        not list((tmp_path / "q" / "pending").iterdir())


def ignores(pid: int, sig: int) -> bool:
    """Whether process ``pid`` ignores signal ``sig`` now (its SigIgn mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def test_ctrl_c_while_the_fork_server_preloads_leaves_no_traceback(
        tmp_path: Path, write_manifest: Any) -> None:
    import os
    import signal
    import time

    # Given a run started as a terminal starts it (a process group of its own, which Ctrl-C
    # signals whole), its fork server early in its preload (past its first module, which
    # ignores SIGTERM: reportlab and pypdf still loading, ~0.4 s)
    job, _ = held_job(tmp_path, "held")
    manifest = write_manifest([job])
    proc = subprocess.Popen([*LAUNCHER, "run", str(manifest),
                             *cli_args(tmp_path / "q", tmp_path / "out", "--workers", "1",
                                       "--start-method", "forkserver")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(None), process_group=0)
    try:
        deadline = time.monotonic() + 20
        server = None
        while server is None and time.monotonic() < deadline:
            with contextlib.suppress(psutil.Error, OSError):
                found = fork_servers(proc.pid)
                if found and ignores(found[0].pid, signal.SIGTERM):
                    server = found[0]
            time.sleep(0.002)
        assert server is not None, "no fork server seen preloading"
        # When Ctrl-C comes
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # Then the run stops as a Ctrl-C stops it, and nobody prints a traceback (the server's
    # KeyboardInterrupt in the middle of an import was)
    assert proc.returncode == ExitCode.SIGINT, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


ABANDONED_START = """
import os, signal, sys
from multiprocessing import forkserver, get_context
from renderctl.mpstate import PRELOAD

if __name__ == "__main__":
    get_context("forkserver").set_forkserver_preload(list(PRELOAD))
    forkserver.ensure_running()
    r, w = os.pipe()
    sentinel, data = forkserver.connect_to_new_process([r])  # the server forks a child
    print(forkserver.read_signed(sentinel), flush=True)
    if sys.argv[1] == "die":
        os.kill(os.getpid(), signal.SIGKILL)  # before sending the child its start data
    os.write(data, b"not a pickle")
    os.close(data)
    os.read(sentinel, 64)  # the child's exit status (it fails to unpickle that)
"""


@pytest.mark.parametrize("how", ["die", "garbage"])
def test_a_runner_that_dies_while_starting_a_worker_leaves_no_traceback(
        tmp_path: Path, how: str) -> None:
    # Given a client of renderctl's fork server (as the runner is) that has asked it for a
    # worker, then is SIGKILLed before sending the child its start data (or sends garbage)
    script = tmp_path / "client.py"
    script.write_text(ABANDONED_START)
    # When it has ended, and so have the server and its child (the run below returns at
    # EOF on the client's stderr, which they hold too)
    res = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True,
                         timeout=60, env=_env(None))
    assert int(res.stdout.split()[0]) > 0

    # Then nothing was written to the client's stderr for the abandoned start (the child
    # printed its EOFError traceback there, after the runner was gone); a start that goes
    # wrong otherwise still says why
    if how == "die":
        assert res.returncode == -signal.SIGKILL
        assert res.stderr == ""
    else:
        assert "UnpicklingError" in res.stderr or "Traceback" in res.stderr, res.stderr
