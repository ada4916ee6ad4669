"""First module the fork server imports (``PRELOAD``): it shields the server from a SIGTERM,
SIGHUP, SIGQUIT or SIGTSTP aimed at the runner's whole process group.

The fork server shares the runner's process group, and ``timeout``, systemd's stop,
Slurm and ``kill -TERM -PGID`` signal the whole group, as a closing terminal does with
SIGHUP and its quit key with SIGQUIT. Dying on that signal, the server would fire every
worker's parent-death signal, killing the running jobs at once and charging them an
attempt, while the runner was about to release them uncharged (after their grace period).
CPython's server already ignores SIGINT for the same reason; it still exits when the
runner does (its "alive" pipe).
Workers set these back to their defaults at start (``worker_main``).
"""

from __future__ import annotations

import signal
import sys


def _in_fork_server() -> bool:
    # The server runs as `python -c "from multiprocessing.forkserver import main; ..."`;
    # importing this module anywhere else (a test, a tool) must change nothing.
    return sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules


if _in_fork_server():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    # And Ctrl-Z: the terminal stops its whole foreground group, and a runner starting a
    # worker waits on this server; stopped, the server held the runner where it could not
    # reach its own orderly pause (it stops itself once its jobs are paused), and the run
    # hung, neither running nor stopped for the shell to continue.
    signal.signal(signal.SIGTSTP, signal.SIG_IGN)
