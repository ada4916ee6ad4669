"""First module the fork server imports (``PRELOAD``): it shields the server from a SIGINT,
SIGTERM, SIGHUP, SIGQUIT or SIGTSTP aimed at the runner's whole process group.

The fork server shares the runner's process group, and ``timeout``, systemd's stop,
Slurm and ``kill -TERM -PGID`` signal the whole group, as a closing terminal does with
SIGHUP and its quit key with SIGQUIT. Dying on that signal, the server would fire every
worker's parent-death signal, killing the running jobs at once and charging them an
attempt, while the runner was about to release them uncharged (after their grace period).
CPython's server ignores SIGINT for the same reason, but only once it has imported every
preloaded module: `run` starts it early, and a Ctrl-C in its first ~0.5 s (reportlab and
pypdf loading) printed a KeyboardInterrupt traceback from the server. It is ignored here,
as the preload begins. The server still exits when the runner does (its "alive" pipe).
Workers set these back to their defaults at start (``worker_main``).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import importlib
import os
import signal
import sys
from types import TracebackType


def _exit_without_teardown(server_pid: int) -> None:
    """At the fork server's orderly exit (the runner closed its "alive" pipe), end the
    process here instead of tearing down the interpreter.

    The teardown frees every preloaded module (reportlab, pypdf: ~80-90 ms of CPU here) and
    the server holds the runner's stdout and stderr until it ends, so `renderctl run | jq`,
    `$(renderctl run --json)` and a CI step capturing output waited that long after the
    runner had exited. Nothing is left to finish: the server owns no files and buffers no
    output, and its children (the workers) are not waited for here either way.
    Only in the server itself (its forked workers, and a job's own forks, inherit this
    hook, and their exit must stay theirs), and not after an uncaught exception (the
    interpreter sets ``sys.last_type`` for one, not for the SystemExit of the orderly exit):
    that exit keeps its status 1 and its traceback.
    """
    if os.getpid() != server_pid or getattr(sys, "last_type", None) is not None:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _quiet_abandoned_start(exc_type: type[BaseException], exc: BaseException,
                           tb: TracebackType | None) -> None:
    """The excepthook of the fork server and of each process it forks, until a worker
    takes over (``worker_main`` puts the default back).

    A runner that dies (SIGKILL, OOM) after asking the server for a worker but before
    sending it its start data leaves that child reading EOF, and CPython's server printed
    its EOFError traceback on the runner's stderr, after the runner was gone: in a
    terminal, or in the log of a cron job that had otherwise said nothing. Nobody is left
    to read it and nothing was started; that one case stays quiet. The server's own fork
    failing for want of processes or memory (EAGAIN, ENOMEM: a pids limit) is one line,
    not a traceback at each of the runner's tries (audit FI): the runner then says why,
    naming the limit where it can tell, and the line keeps the clue where it cannot."""
    if issubclass(exc_type, OSError) and getattr(exc, "errno", None) in (
            errno.EAGAIN, errno.ENOMEM) and tb is not None:
        last = tb
        while last.tb_next is not None:
            last = last.tb_next
        if last.tb_frame.f_code.co_filename.endswith(os.path.join("multiprocessing",
                                                                  "forkserver.py")):
            with contextlib.suppress(Exception):
                sys.stderr.write(f"renderctl: the fork server could not fork a worker: "
                                 f"{exc}\n")
                sys.stderr.flush()
            return
    if issubclass(exc_type, EOFError) and tb is not None:
        last = tb
        while last.tb_next is not None:
            last = last.tb_next
        if last.tb_frame.f_code.co_name == "_main" and \
                last.tb_frame.f_code.co_filename.endswith(os.path.join("multiprocessing",
                                                                         "spawn.py")):
            return
    sys.__excepthook__(exc_type, exc, tb)


def _preload_the_rest() -> None:
    """Import the rest of PRELOAD in the server, skipping each that fails, whatever it
    raises (a reportlab too old, a broken Pillow): the server keeps forking workers, and a
    worker, finding a module missing, imports it itself and reports why it cannot (the
    run halts, 74, naming the error) instead of the server dying with it unsaid."""
    from renderctl.mpstate import PRELOAD

    for name in PRELOAD:
        if name != __name__:
            with contextlib.suppress(Exception):
                importlib.import_module(name)


def _in_fork_server() -> bool:
    # The server runs as `python -c "from multiprocessing.forkserver import main; ..."`;
    # importing this module anywhere else (a test, a tool) must change nothing.
    return sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules


if _in_fork_server():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    # And Ctrl-Z: the terminal stops its whole foreground group, and a runner starting a
    # worker waits on this server; stopped, the server held the runner where it could not
    # reach its own orderly pause (it stops itself once its jobs are paused), and the run
    # hung, neither running nor stopped for the shell to continue.
    signal.signal(signal.SIGTSTP, signal.SIG_IGN)
    sys.excepthook = _quiet_abandoned_start
    # Registered after multiprocessing's own exit hook, so it runs first (atexit is LIFO):
    # that hook only runs finalizers the server has none of.
    atexit.register(_exit_without_teardown, os.getpid())
    _preload_the_rest()
