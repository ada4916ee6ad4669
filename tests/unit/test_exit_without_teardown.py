"""Ending a process without the interpreter's teardown (the CLI's exit and the fork server's),
and only where that changes nothing but the time: exit hooks run, output is flushed, exit
statuses stay, and whatever else is still running gets the normal exit.

Real interpreters in subprocesses: the teardown being skipped is seen as a module-level
object's finalizer that never runs (it does in a normal exit)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# A module-level object whose finalizer says so when the interpreter tears down its
# modules, an exit hook, and buffered output: what each exit is seen to do.
PRELUDE = textwrap.dedent('''
    import atexit, os, sys

    class Witness:
        def __del__(self):
            os.write(1, b"torn down\\n")

    witness = Witness()
    atexit.register(lambda: print("exit hook ran"))
    print("buffered", end=" ")  # still in sys.stdout's buffer, not yet written
''')


def python(*code: str) -> subprocess.CompletedProcess[str]:
    script = PRELUDE + "".join(textwrap.dedent(part) for part in code)
    # Buffered stdout, as outside this machine's environment: the flush must be seen to run
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=env)


def test_the_cli_exit_runs_the_exit_hooks_flushes_and_keeps_its_status() -> None:
    res = python('''
        from renderctl.cli.app import exit_without_teardown
        exit_without_teardown(3)
        print("returned")
    ''')
    assert res.returncode == 3, res.stderr
    assert res.stdout == "buffered exit hook ran\n", res.stdout  # no teardown, no return
    res = python('''
        from renderctl.cli.app import exit_without_teardown
        exit_without_teardown(None)
    ''')
    assert (res.returncode, res.stdout) == (0, "buffered exit hook ran\n")


def test_a_normal_exit_tears_down_which_is_what_the_witness_shows() -> None:
    # (The control: without the fast exit the same script shows the teardown.)
    res = python("sys.exit(3)")
    assert res.returncode == 3
    assert "torn down" in res.stdout and "exit hook ran" in res.stdout


@pytest.mark.parametrize("code", ["'a message'", "3.5"])
def test_an_exit_status_that_is_not_a_number_takes_the_normal_exit(code: str) -> None:
    res = python(f'''
        from renderctl.cli.app import exit_without_teardown
        exit_without_teardown({code})
        print("returned")
    ''')
    assert res.returncode == 0 and "returned" in res.stdout and "torn down" in res.stdout


def test_another_thread_still_running_gets_the_normal_exit_which_waits_for_it() -> None:
    res = python('''
        import threading
        from renderctl.cli.app import exit_without_teardown
        go = threading.Event()
        worker = threading.Thread(target=lambda: (go.wait(), print("thread finished")))
        worker.start()
        exit_without_teardown(0)
        print("returned")
        go.set()
    ''')
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:2] == ["buffered returned", "thread finished"], res.stdout
    assert "torn down" in res.stdout


def test_a_flush_that_fails_gets_the_normal_exit_and_its_report() -> None:
    # Given stdout moved to a pipe whose reader is gone, with output still buffered for it
    res = python('''
        import signal
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        sys.stdout.flush()
        r, w = os.pipe()
        os.dup2(w, 1)
        os.close(r)
        print("lost", end="")
        from renderctl.cli.app import exit_without_teardown
        exit_without_teardown(0)
        os.write(2, b"returned\\n")
    ''')
    # Then the flush fails (EPIPE), and the interpreter's own exit reports it as it always
    # has: status 120
    assert res.stderr.startswith("returned\n"), res.stderr
    assert res.returncode == 120 and "BrokenPipeError" in res.stderr, res.stderr


SERVER = '''
    from renderctl import forkserver_init
    atexit.register(forkserver_init._exit_without_teardown, os.getpid())
'''


def test_the_fork_server_ends_without_teardown_at_its_orderly_exit() -> None:
    res = python(SERVER, "raise SystemExit")
    assert res.returncode == 0, res.stderr
    assert "torn down" not in res.stdout and "buffered" in res.stdout


def test_the_fork_server_keeps_the_status_and_teardown_of_an_uncaught_exception() -> None:
    res = python(SERVER, "raise RuntimeError('server broke')")
    assert res.returncode == 1 and "RuntimeError: server broke" in res.stderr
    assert "torn down" in res.stdout


def test_a_process_forked_from_the_fork_server_exits_as_its_own() -> None:
    # A worker, or a job's own fork, inherits the server's exit hook: its exit stays its own
    res = python(SERVER, '''
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            print("child", end=" ")
            sys.exit(7)
        _, status = os.waitpid(pid, 0)
        print("child status", os.waitstatus_to_exitcode(status))
    ''')
    assert res.returncode == 0, res.stderr
    child, _, parent = res.stdout.removeprefix("buffered ").partition("torn down\n")
    assert child == "child exit hook ran\n", res.stdout  # the child's teardown ran
    assert parent.startswith("child status 7"), res.stdout
    assert parent.count("torn down") == 0  # and the server's did not
