"""The ``renderctl`` script (and ``python -m renderctl``): stop signals first, then the
command line.

Importing the command line (typer, rich, the queue's modules) takes 0.2-0.4 s here. A
Ctrl-C in that time printed a KeyboardInterrupt traceback and a SIGTERM (``systemctl stop``
of a service just started) killed the process by the signal, where DESIGN.md promises exit
130 / 143. Nothing has started then, so such a signal ends the process at once, quietly,
with 128 + its number; once the commands are imported, their own handling takes over
(`run`'s drains; Ctrl-C's KeyboardInterrupt)."""

from __future__ import annotations

import signal
from types import FrameType

_EARLY = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _exit_early(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _fill_closed_standard_fds() -> None:
    """Open /dev/null on whichever of descriptors 0, 1 and 2 the caller left closed (`>&-`,
    `2>&-`, some daemons and cron setups).

    A closed 1 made every command end in a traceback (Python sets ``sys.stdout`` to None; a
    `run` died after its submit, its jobs left pending). A closed 2 is worse, quietly: the
    next file opened takes number 2 (a queue record, the runner's lock), and whatever a C
    library or the interpreter writes to "stderr" lands in it. As OpenSSH's
    sanitise_stdfd() does, before anything else is opened."""
    import os
    import sys

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd itself
            except OSError:
                return
            if null != fd:  # (something opened meanwhile took it; move ours there)
                os.dup2(null, fd)
                os.close(null)
            os.set_inheritable(fd, True)  # as a standard descriptor is: the fork server,
            # workers and commands are started with it (os.open's are close-on-exec)
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 - for the process


def main() -> None:
    _fill_closed_standard_fds()
    prior = signal.getsignal(signal.SIGINT)
    for sig in _EARLY:
        # A stop signal the parent left ignored stays ignored, here and in every later
        # layer (`run`'s early handling, the runner), as coreutils' sort keeps it: `nohup`
        # ignores SIGHUP so that a logout does not stop the run, a script's `cmd &` SIGINT
        # so that a Ctrl-C meant for the script does not.
        if signal.getsignal(sig) != signal.SIG_IGN:
            # Kept past the imports: until a command sets its own (`run` soon does, to
            # drain), a SIGTERM or SIGHUP ends it like this, not by the signal (an exit
            # status of "killed by SIGTERM" rather than 143 to systemd or a Python caller).
            signal.signal(sig, _exit_early)
    from renderctl.cli.app import main as cli_main

    # Python's own again (or still ignored): a KeyboardInterrupt, which each command turns
    # into 130 its way (a submit says whether anything was enqueued).
    signal.signal(signal.SIGINT, prior)
    cli_main()
