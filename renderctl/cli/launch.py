"""The ``renderctl`` script (and ``python -m renderctl``): stop signals first, then the
command line.

Importing the command line (typer, rich, the queue's modules) takes 0.2-0.4 s here. A
Ctrl-C in that time printed a KeyboardInterrupt traceback and a SIGTERM (``systemctl stop``
of a service just started) killed the process by the signal, where DESIGN.md promises exit
130 / 143. Nothing has started then, so such a signal ends the process at once, quietly,
with 128 + its number; once the commands are imported, their own handling takes over
(`run`'s drains; Ctrl-C's KeyboardInterrupt)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

# (Imported before any handler is set, and cheap: see there.)
from renderctl.localecoercion import undo_locale_coercion
from renderctl.signalexit import SignalExit

_EARLY = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _exit_early(signum: int, frame: FrameType | None) -> None:
    raise SignalExit(128 + signum)


def fill_closed_standard_fds() -> None:
    """Open /dev/null on whichever of descriptors 0, 1 and 2 the caller left closed (`>&-`,
    `2>&-`, some daemons and cron setups).

    A closed 1 made every command end in a traceback (Python sets ``sys.stdout`` to None; a
    `run` died after its submit, its jobs left pending). A closed 2 is worse, quietly: the
    next file opened takes number 2 (a queue record, the runner's lock), and whatever a C
    library or the interpreter writes to "stderr" lands in it. As OpenSSH's
    sanitise_stdfd() does, before anything else is opened."""
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


def keep_owner_bits() -> None:
    """Clear the owner's bits from the umask (a umask of 0277 or 0222), keeping the rest.

    DESIGN.md makes the queue 0700: under umask 0277 it was made 0500, and the command
    failed in it with "Permission denied", as did every later one until the user fixed the
    folder by hand (and `run` said only "I/O error: Permission denied", of the fork server's
    socket folder): audit FV. What the umask takes from the group and others is kept."""
    os.umask(os.umask(0) & 0o077)


def start_fork_server_early(argv: Sequence[str]) -> None:
    """For `run`, start the fork server now, before the command line is imported.

    The server imports the renderers (reportlab, pypdf) before it forks the first worker:
    ~0.45 s here, the first job's wait. Started from `run` itself, it began only after
    typer, the command line and the runner were imported (~0.15-0.2 s); from here it
    overlaps them too. Only when the run will use it: the start method is resolved as the
    command resolves it (option, environment, configuration file in the cwd, default). Any
    doubt (`--help`, a value or a file the command will refuse) leaves it to `run`, which
    starts the server when it should; starting it twice is a no-op.
    """
    args = list(argv[1:])
    if not args or args[0] != "run" or "--help" in args:
        return
    given = None
    for i, arg in enumerate(args):
        if arg == "--":  # what follows is manifests, whatever their names
            break
        if arg == "--start-method" and i + 1 < len(args):
            given = args[i + 1]
        elif arg.startswith("--start-method="):
            given = arg.partition("=")[2]
    try:
        from renderctl.settings import load_config_file, resolve

        _, config = load_config_file(os.getcwd())
        method = resolve("start_method", cli=given, config=config, default="forkserver")
        if method == "forkserver":
            from renderctl import mpstate

            mpstate.prestart(method)
    except Exception:  # noqa: BLE001 - `run` meets it again, and reports it its way
        return


def workers_need_no_main() -> None:
    """Have multiprocessing start workers without running our ``__main__`` again in each.

    Under forkserver and spawn it re-runs the parent's main module in every new worker (by
    name, `python -m renderctl.cli.app`: typer and the command line imported anew; by path,
    the console script): read from disk each time, so a renderctl upgraded in place under a
    running runner mixed new files with the old modules the fork server holds, and every
    worker started after it died of an ImportError, the run halting 74 after pages of
    tracebacks (audit EC). A worker needs nothing of it: its target is
    ``renderctl.worker.worker_main``, found by name. (Only from the command line: a program
    embedding the runner keeps multiprocessing's usual behaviour for its own main.)"""
    main_module = sys.modules.get("__main__")
    if main_module is not None:
        main_module.__spec__ = None
        main_module.__dict__.pop("__file__", None)


def stops_end_quietly(argv: Sequence[str], signals: Sequence[int] = _EARLY) -> None:
    """Have ``signals`` end the process with 128 + their number until a command sets its
    own handling. Idempotent: `python -m renderctl.cli.app` calls it again, after its
    imports (without it a `wait` there died of SIGTERM with nothing printed: review EF)."""
    # `run` takes SIGQUIT as a stop too (exit 131, jobs released); its default action in
    # the first ~0.2 s killed it with a core file instead. Other commands keep Ctrl-\'s
    # usual quit-with-core. (First: once the others are caught, so is this one.)
    quit_too = (signal.SIGQUIT,) if list(argv[1:2]) == ["run"] else ()
    for sig in (*quit_too, *signals):
        # A stop signal the parent left ignored stays ignored, here and in every later
        # layer (`run`'s early handling, the runner), as coreutils' sort keeps it: `nohup`
        # ignores SIGHUP so that a logout does not stop the run, a script's `cmd &` SIGINT
        # so that a Ctrl-C meant for the script does not.
        if signal.getsignal(sig) == signal.SIG_DFL or (sig == signal.SIGINT and signal.getsignal(
                sig) == signal.default_int_handler):
            # Kept past the imports: until a command sets its own (`run` soon does, to
            # drain), a SIGTERM or SIGHUP ends it like this, not by the signal (an exit
            # status of "killed by SIGTERM" rather than 143 to systemd or a Python caller).
            signal.signal(sig, _exit_early)


def main() -> None:
    fill_closed_standard_fds()
    keep_owner_bits()
    undo_locale_coercion()
    workers_need_no_main()
    prior = signal.getsignal(signal.SIGINT)
    stops_end_quietly(sys.argv)
    start_fork_server_early(sys.argv)
    from renderctl.cli.app import main as cli_main

    if sys.argv[1:2] != ["run"]:
        # Python's own again (or still ignored): a KeyboardInterrupt, which each command
        # turns into 130 its way (a submit says whether anything was enqueued). Not for
        # `run`, whose own handling comes first thing (before it submits): a Ctrl-C in
        # between raised KeyboardInterrupt inside click or a lazy import, and ended with
        # a traceback, "Aborted!" or death by the signal instead of a quiet 130.
        signal.signal(signal.SIGINT, prior)
    cli_main()
