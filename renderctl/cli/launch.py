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


def main() -> None:
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
