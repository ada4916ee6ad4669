"""Waits for the queue's lock files: bounded, interruptible, naming the holder; lock files
never followed through a symlink nor emptied when they are someone else's file.

Holders are real processes: a `submit` frozen (SIGSTOP) at a named point while it holds the
submit lock (RENDERCTL_STOP_AT), or this test process holding an flock itself. "Waiting" is
seen in /proc/locks (a blocked flock's "->" line), never guessed with a sleep.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobfns import (
    RENDERCTL,
    QueueView,
    _env,
    cli_args,
    held_job,
    py_job,
    run_cli,
    stage,
    stopped,
    wait_for_pid,
    wait_until,
    waiting_for_a_lock,
)

from renderctl.errors import ExitCode

# A holder stopped this long is given up on (the default is 5 s).
GIVE_UP = {"RENDERCTL_TEST_LOCK_STOPPED_S": "1"}


def _popen(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([*RENDERCTL, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(env))


@pytest.fixture
def frozen() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test froze; each is resumed and reaped (or killed) at the end."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            try:
                p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()


def _freeze(procs: list[subprocess.Popen[str]], args: list[str],
            point: str) -> subprocess.Popen[str]:
    proc = _popen(args, {"RENDERCTL_STOP_AT": point})
    procs.append(proc)
    wait_until(lambda: proc.poll() is not None or stopped(proc.pid),
               what=f"{args[0]} to freeze at {point}")
    assert proc.poll() is None, proc.communicate()
    return proc


def _resume(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def _queue_with_dead_and_done(tmp_path: Path, write_manifest: Any) -> tuple[Path, Path]:
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("ok", "write_pdf"),
                               {**py_job("bad", "fail"), "max_attempts": 1}])
    res = run_cli("run", manifest, *cli_args(queue, out))
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    return queue, out


# Every command that takes the submit lock, and what it must say it did not do.
COMMANDS = {
    "submit": (["submit", "{manifest}", "--queue", "{queue}", "--out", "{out}"],
               "nothing was enqueued"),
    "dead retry --all": (["dead", "retry", "--all", "--queue", "{queue}"],
                         "nothing was retried"),
    "dead purge": (["dead", "purge", "--queue", "{queue}"], "the records not removed yet stay"),
    "prune": (["prune", "--older-than", "0", "--queue", "{queue}"],
              "the records not removed yet stay"),
}


def test_a_json_command_that_gives_up_on_a_lock_says_so_in_json(
        tmp_path: Path, write_manifest: Any, frozen: list[subprocess.Popen[str]]) -> None:
    # Given a submit stopped while it holds the submit lock
    queue, out = _queue_with_dead_and_done(tmp_path, write_manifest)
    held = _freeze(frozen, ["submit", write_manifest([py_job("held", "write_pdf")]),
                            *cli_args(queue, out)], "submit:checked")

    # When `dead purge --json` waits for it and gives up (75, before printing anything)
    res = run_cli("dead", "purge", "--json", "--queue", str(queue), env=GIVE_UP, timeout=60)

    # Then stdout still holds one JSON object saying so, its message what stderr said
    assert res.returncode == ExitCode.TEMPFAIL, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["error"] == "unavailable" and set(doc) == {"error", "message"}
    last = res.stderr.splitlines()[-1].removeprefix("renderctl: ")
    assert f"kill -CONT {held.pid}" in last and doc["message"].endswith(last), doc
    assert QueueView(queue).states_of(["bad"]) == {"bad": ["dead"]}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_behind_a_stopped_submit_names_it_and_gives_up_with_75(
        tmp_path: Path, write_manifest: Any, frozen: list[subprocess.Popen[str]],
        command: str) -> None:
    # Given a queue with a done and a dead job, and a submit stopped (Ctrl-Z) while it holds
    # the submit lock
    queue, out = _queue_with_dead_and_done(tmp_path, write_manifest)
    held = _freeze(frozen, ["submit", write_manifest([py_job("held", "write_pdf")]),
                            *cli_args(queue, out)], "submit:checked")

    # When the command runs meanwhile
    argv, doing = COMMANDS[command]
    manifest = write_manifest([py_job("new", "write_pdf")])
    args = [a.format(manifest=manifest, queue=queue, out=out) for a in argv]
    res = run_cli(*args, env=GIVE_UP, timeout=60)

    # Then it says whom it waits for, gives up with 75 naming the stopped submit (how to
    # resume it), and did nothing
    assert res.returncode == ExitCode.TEMPFAIL, res.stdout + res.stderr
    assert f"waiting for {queue / '.submit.lock'}, held by pid {held.pid} (renderctl " \
           "submit" in res.stderr
    assert f"pid {held.pid} (renderctl submit" in res.stderr.splitlines()[-1]
    assert "is stopped" in res.stderr and f"kill -CONT {held.pid}" in res.stderr
    assert doing in res.stderr and "Traceback" not in res.stderr
    view = QueueView(queue)
    assert view.states_of(["ok", "bad", "new"]) == {"ok": ["done"], "bad": ["dead"],
                                                    "new": []}

    # And the stopped submit, resumed, completes its own work
    rc, _, err = _resume(held)
    assert rc == 0, err
    assert QueueView(queue).states_of(["held"]) == {"held": ["pending"]}


def test_a_cancel_behind_a_stopped_replace_gives_up_with_75(
        tmp_path: Path, write_manifest: Any, frozen: list[subprocess.Popen[str]]) -> None:
    # Given pending a and b, and `submit --replace` of a stopped while it holds the replace
    # lock (exclusively)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    res = run_cli("submit", write_manifest([py_job("a", "write_pdf"), py_job("b", "write_pdf")]),
                  *cli_args(queue, out))
    assert res.returncode == 0, res.stderr
    held = _freeze(frozen, ["submit", "--replace",
                            write_manifest([py_job("a", "write_pdf", n=2)]),
                            *cli_args(queue, out)], "submit:staged")

    # When b is cancelled meanwhile
    res = run_cli("cancel", "b", "--queue", queue, env=GIVE_UP, timeout=60)

    # Then the cancel gives up with 75 naming the replace, b untouched
    assert res.returncode == ExitCode.TEMPFAIL, res.stdout + res.stderr
    assert f"pid {held.pid} (renderctl submit --replace" in res.stderr
    assert f"{queue / '.replace.lock'}" in res.stderr and "Traceback" not in res.stderr
    assert QueueView(queue).states_of(["b"]) == {"b": ["pending"]}
    rc, _, err = _resume(held)
    assert rc == 0, err


def _stderr_line(proc: subprocess.Popen[str], predicate: Any, timeout_s: float = 20) -> str:
    """The first line of ``proc``'s stderr satisfying ``predicate``, read in a thread so
    that a process that never says it fails the test rather than hangs it."""
    found: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for ln in proc.stderr:
            if predicate(ln):
                found.append(ln)
                return

    threading.Thread(target=read, daemon=True).start()
    wait_until(lambda: found, timeout_s=timeout_s, what="the line on stderr")
    return found[0]


def test_a_run_held_off_by_a_stopped_replace_says_whom_it_waits_for(
        tmp_path: Path, write_manifest: Any, frozen: list[subprocess.Popen[str]]) -> None:
    # Given a run of one worker busy with a job that holds until told, b pending behind it
    # (one job a worker: b is not claimed yet), and `submit --replace` of b stopped (Ctrl-Z)
    # while it holds the replace lock, where no claim may run
    queue, out = tmp_path / "q", tmp_path / "out"
    hold, go = held_job(tmp_path, "hold", timeout_s=60)
    manifest = write_manifest([hold, py_job("b", "write_pdf")])
    run = _popen(["run", manifest, *cli_args(queue, out), "--workers", "1", "--prefetch", "1"])
    try:
        wait_for_pid(tmp_path / "hold.pid")
        assert QueueView(queue).states_of(["b"]) == {"b": ["pending"]}
        held = _freeze(frozen, ["submit", "--replace",
                                write_manifest([py_job("b", "write_pdf", n=2)]),
                                *cli_args(queue, out)], "submit:staged")

        # When the worker is free for b
        go.touch()

        # Then the run says, on stderr, whom its claims wait for and how to resume it (it
        # claimed nothing and said nothing), and waits on: a replace takes milliseconds
        line = _stderr_line(run, lambda ln: "waiting for" in ln)
        assert f"waiting for {queue / '.replace.lock'}, held by pid {held.pid} (renderctl " \
               "submit --replace" in line, line
        assert f"is stopped (Ctrl-Z or SIGSTOP): `kill -CONT {held.pid}`" in line, line
        assert run.poll() is None
        assert QueueView(queue).states_of(["b"]) == {"b": ["pending"]}

        # And once the replace is resumed, the run does b as replaced
        rc, _, err = _resume(held)
        assert rc == 0, err
        _, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
    finally:
        go.touch()
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert QueueView(queue).states_of(["hold", "b"]) == {"hold": ["done"], "b": ["done"]}
    assert QueueView(queue).record("done", "b")["spec"]["params"]["n"] == 2


def _batch_left_behind(queue: Path, out: Path, write_manifest: Any) -> None:
    """A committed batch (a, a2) in journal/ whose submit was killed before it placed it
    (a batch of one is placed without a journal)."""
    killed = run_cli("submit", write_manifest([py_job("a", "write_pdf"),
                                               py_job("a2", "write_pdf")]),
                     *cli_args(queue, out), env={"RENDERCTL_CRASH_AT": "submit:staged"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr


def test_a_starting_runner_behind_a_stopped_holder_gives_up_with_75(
        tmp_path: Path, write_manifest: Any, frozen: list[subprocess.Popen[str]]) -> None:
    # Given a submit of a batch stopped (Ctrl-Z) past its commit point: its batch is in
    # journal/, not yet in pending/, and it holds the submit lock (a runner must place the
    # batch before it starts, or it could finish "all done" without it)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    held = _freeze(frozen, ["submit", write_manifest([py_job("a", "write_pdf"),
                                                      py_job("b", "write_pdf")]),
                            *cli_args(queue, out)], "submit:staged")
    assert [n for n in os.listdir(queue / "journal") if n.endswith(".txn")]

    # When a runner starts
    res = run_cli("run", "--queue", queue, env=GIVE_UP, timeout=60)

    # Then it gives up with 75 naming the stopped submit, having run nothing (it waited
    # forever, and SIGTERM could not stop it)
    assert res.returncode == ExitCode.TEMPFAIL, res.stdout + res.stderr
    assert f"pid {held.pid} (renderctl submit" in res.stderr
    assert "no job was run" in res.stderr and "Traceback" not in res.stderr
    assert not list((queue / "done").iterdir())

    # And once the submit is resumed, the next run runs both
    assert _resume(held)[0] == 0
    res = run_cli("run", "--queue", queue, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert QueueView(queue).states_of(["a", "b"]) == {"a": ["done"], "b": ["done"]}


@pytest.mark.parametrize("with_manifest", [False, True], ids=["run", "run MANIFEST"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_a_runs_wait_for_the_submit_lock(
        tmp_path: Path, write_manifest: Any, with_manifest: bool, signum: int) -> None:
    # Given the submit lock held by a live process (this one: a long `dead retry`, say),
    # and a batch left in journal/ for a runner to place first
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    _batch_left_behind(queue, out, write_manifest)
    fd = os.open(queue / ".submit.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        args = ["run", *([write_manifest([py_job("b", "write_pdf")])] if with_manifest
                         else []), *cli_args(queue, out)]
        run = _popen(args)
        try:
            # When a run waits for it, and is sent a stop signal
            wait_until(lambda: waiting_for_a_lock(run.pid) or run.poll() is not None,
                       what="the run to wait for the submit lock")
            assert run.poll() is None, run.communicate()
            os.kill(run.pid, signum)
            _, err = run.communicate(timeout=30)
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()
    finally:
        os.close(fd)

    # Then it stops at once with 128+n, saying it waited and did nothing (it ignored the
    # signal and waited on)
    assert run.returncode == 128 + signum, err
    assert f"stopped by {signal.Signals(signum).name} while waiting for " \
           f"{queue / '.submit.lock'}" in err
    assert ("nothing was enqueued" if with_manifest else "no job was run") in err
    assert "Traceback" not in err
    view = QueueView(queue)
    assert view.states_of(["a", "b"]) == {"a": [], "b": []}  # a: still only in journal/
    assert [n for n in os.listdir(queue / "journal") if n.endswith(".txn")]


def test_a_wait_for_a_live_holder_ends_after_the_longest_wait(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given the submit lock held by a live process that never lets go
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    assert run_cli("submit", write_manifest([py_job("a", "write_pdf")]),
                   *cli_args(queue, out)).returncode == 0
    fd = os.open(queue / ".submit.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # When a submit waits for it (the longest wait shortened from 10 minutes)
        res = run_cli("submit", write_manifest([py_job("b", "write_pdf")]),
                      *cli_args(queue, out), env={"RENDERCTL_TEST_LOCK_MAX_WAIT_S": "1.5"})
    finally:
        os.close(fd)

    # Then it gives up with 75, naming this process, and enqueued nothing
    assert res.returncode == ExitCode.TEMPFAIL, res.stdout + res.stderr
    assert f"held by pid {os.getpid()}" in res.stderr
    assert f"pid {os.getpid()}" in res.stderr.splitlines()[-1]
    assert "has held" in res.stderr and "nothing was enqueued" in res.stderr
    assert QueueView(queue).states_of(["a", "b"]) == {"a": ["pending"], "b": []}


def test_a_removed_submit_lock_does_not_let_two_submits_in(
        tmp_path: Path, write_manifest: Any, frozen: list[subprocess.Popen[str]]) -> None:
    # Given a submit of x (spec ONE) stopped while it holds the submit lock, and the lock
    # file removed meanwhile (`rm`: a lock file looks stale to many)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    first = _freeze(frozen, ["submit", write_manifest([py_job("x", "write_pdf", text="ONE")]),
                             *cli_args(queue, out)], "submit:checked")
    (queue / ".submit.lock").unlink()

    # When a submit of x with another spec (TWO) runs meanwhile
    second = _popen(["submit", write_manifest([py_job("x", "write_pdf", text="TWO")]),
                     *cli_args(queue, out)])
    try:
        # Then it waits for the first (it went in beside it, and both said "accepted")
        wait_until(lambda: waiting_for_a_lock(second.pid) or second.poll() is not None,
                   what="the second submit to wait")
        assert second.poll() is None, second.communicate()
        rc, _, err = _resume(first)
        assert rc == 0, err
        _, err2 = second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            second.kill()
            second.communicate()

    # And, the first's x accepted, it refuses its different x, as DESIGN.md says
    assert second.returncode == ExitCode.USAGE, err2
    assert "accepted" not in err2.lower() or "already accepted" in err2.lower()
    rec = QueueView(queue).record("pending", "x")
    assert rec["spec"]["params"] == {"text": "ONE"}


def _user_file(tmp_path: Path) -> Path:
    user = tmp_path / "user.txt"
    user.write_text("the user's own data\n")
    return user


@pytest.mark.parametrize("how", ["symlink", "dangling symlink", "hard link"])
def test_the_runner_never_empties_or_creates_a_file_through_its_lock_file(
        tmp_path: Path, write_manifest: Any, how: str) -> None:
    # Given a queue whose runner.lock is a link to a user's file (or a symlink to a path
    # that does not exist yet)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    assert run_cli("submit", write_manifest([py_job("a", "write_pdf")]),
                   *cli_args(queue, out)).returncode == 0
    user = _user_file(tmp_path)
    lock = queue / "runner.lock"
    lock.unlink(missing_ok=True)
    if how == "symlink":
        lock.symlink_to(user)
    elif how == "dangling symlink":
        lock.symlink_to(tmp_path / "elsewhere" / "made.txt")
        (tmp_path / "elsewhere").mkdir()
    else:
        os.link(user, lock)

    # When a runner starts
    res = run_cli("run", "--queue", queue, timeout=120)

    # Then it refuses (74) naming the lock file, and the user's file is as it was; nothing
    # was created where the symlink points (it emptied the file, or made one there)
    assert res.returncode == ExitCode.IO_ERROR, res.stdout + res.stderr
    assert str(lock) in res.stderr and "Traceback" not in res.stderr
    assert user.read_text() == "the user's own data\n"
    assert not (tmp_path / "elsewhere" / "made.txt").exists()
    assert QueueView(queue).states_of(["a"]) == {"a": ["pending"]}

    # And with the link removed, the next run runs the job
    lock.unlink()
    res = run_cli("run", "--queue", queue, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_busy_names_who_really_holds_the_runner_lock(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a queue whose last runner died (its record names a dead pid), and its runner
    # lock now held by a process that is no runner (this one), shared
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    assert run_cli("submit", write_manifest([py_job("a", "write_pdf")]),
                   *cli_args(queue, out)).returncode == 0
    dead = subprocess.Popen(["true"])
    dead.wait()
    (queue / "runner.json").write_text(
        f'{{"pid": {dead.pid}, "host": "{os.uname().nodename}", "boot_id": "x", '
        '"start_time": 1}')
    fd = os.open(queue / "runner.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        res = run_cli("run", "--queue", queue, timeout=60)
    finally:
        os.close(fd)

    # Then the 75 names this process (the holder), not the dead runner of the record
    assert res.returncode == ExitCode.TEMPFAIL, res.stdout + res.stderr
    assert f"pid {os.getpid()}" in res.stderr and f"pid {dead.pid}" not in res.stderr
