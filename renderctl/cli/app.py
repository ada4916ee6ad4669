"""The command line: typer options in, one core call, rich or plain or JSON out.

Each command builds its settings, calls one function of the core, and renders what comes
back. Errors from the core are ``RenderctlError`` subclasses carrying their exit code; they
are printed as one clear message, never as a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import signal
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from renderctl.cli import console as out
from renderctl.cli.launch import (
    fill_closed_standard_fds,
    keep_owner_bits,
    start_fork_server_early,
    stops_end_quietly,
    workers_need_no_main,
)
from renderctl.errors import (
    ExitCode,
    Interrupted,
    ManifestError,
    Problem,
    QueueBusy,
    RenderctlError,
    Saturated,
    SubmitIncomplete,
    os_error_message,
    signal_exit_code,
)
from renderctl.limits import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    MAX_ATTEMPTS,
    MAX_MEMORY_MB,
    MAX_TIMEOUT_S,
    MAX_WORKERS,
)
from renderctl.localecoercion import undo_locale_coercion
from renderctl.settings import RunnerSettings  # stdlib only: defaults without the runner
from renderctl.signalexit import SignalExit

if TYPE_CHECKING:
    from renderctl.render.base import ParamSpec
    from renderctl.store import Queue, SubmitResult

app = typer.Typer(
    name="renderctl",
    help="Crash-safe batch runner for PDF renders: a durable directory queue and a supervised "
    "worker pool with per-job memory ceilings.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
dead_app = typer.Typer(help="The dead-letter folder: list, retry, purge.", no_args_is_help=True)
app.add_typer(dead_app, name="dead")

F = TypeVar("F", bound=Callable[..., Any])


def non_empty_path(option: str, *, folder: bool = True) -> Callable[[str], Path]:
    """A parser for a path option that refuses ``""``: ``Path("")`` is ``.``, so an unset
    shell variable (``--queue "$Q"``) would make the current folder the queue or output
    root (and a report file's error would name ``.``, a path nobody gave). Only the command
    line can give ``""`` (click reads an empty variable as unset, a configuration file
    refuses it), so the option is the culprit to name."""

    def parse(text: str) -> Path:
        if text == "":
            out.err(f"{option}: must not be empty"
                    + (" (use . for the current folder)" if folder else ""))
            raise typer.Exit(ExitCode.USAGE)
        return Path(text)

    return parse


def checked_out(ctx: typer.Context, param: typer.CallbackParam,
                value: Path | None) -> Path | None:
    """``--out`` (or its defaults) must be a folder or missing (then it is created): a file
    there would pass every manifest check and then dead-letter each job at run time with
    ``invalid_output``. Exit 2 naming the option, variable or key, before anything else."""
    from renderctl.fsutil import not_a_folder

    config_gate(ctx)
    path = value if value is not None else out_root(None)
    what = not_a_folder(path)
    if what is not None:
        label = _source_label(ctx, param) if value is not None else None
        out.err(f"{label or '--out (default)'}: {path} is {what}, not a folder (the output root; "
                "a missing folder is created)")
        raise typer.Exit(ExitCode.USAGE)
    return value


OutOpt = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="output root [default ./out]", envvar="RENDERCTL_OUT",
                 show_default=False, callback=checked_out, parser=non_empty_path("--out"),
                 metavar="<path>"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
# readable=False: click's own check would print its usage message instead of our problem
# report, and hide the other manifests' problems (and --json's document) behind it.
ManifestsArg = Annotated[list[Path], typer.Argument(help="manifest files (TOML or JSON)",
                                                    readable=False)]
STDIN = "-"


def load_all(manifests: list[Path], **kwargs: Any) -> list[Any]:
    """``load_manifests``, with ``-`` refused by name: a program would expect it to read
    standard input, and would be told that a file named ``-`` does not exist. (A file of
    that name, if there is one, is read as before.)"""
    from renderctl.manifest import load_manifests

    stdin = [p for p in manifests if str(p) == STDIN and not os.path.lexists(p)]
    problems = [Problem(STDIN, None, None, "reading a manifest from standard input is not "
                        "supported; name the file")] if stdin else []
    jobs: list[Any] = []
    try:
        jobs = load_manifests([p for p in manifests if p not in stdin], **kwargs)
    except ManifestError as exc:
        problems += exc.problems
        jobs = exc.valid
    if problems:
        raise ManifestError(problems, valid=jobs)
    return jobs


def queue_path(opt: Path | None) -> Path:
    """The queue folder named by ``--queue`` (or its defaults); checked by its callback."""
    return opt if opt is not None else Path(os.environ.get("RENDERCTL_QUEUE") or ".renderctl")


def queue_problem(path: Path, *, creating: bool) -> str | None:
    """What is wrong with ``path`` as a command's queue (None: nothing). A command that
    creates queues takes a missing or empty folder; any other folder that is not a queue is
    the user's (a project folder, the wrong cwd), and laying the queue's folders out among
    its files would be hard to undo."""
    from renderctl.fsutil import holds_users_files, is_queue, not_a_folder

    what = not_a_folder(path)
    if what is not None:
        return f"is {what}, not a queue folder"
    if is_queue(path):
        return None
    if not creating:
        makes_it = ("no queue there yet (`renderctl submit MANIFEST` or `renderctl run "
                    "MANIFEST` makes it; --queue names another)")
        if not os.path.lexists(path):
            # (A first-hour user in the wrong folder, or before any submit: audit BE.)
            return f"does not exist: {makes_it}"
        if not holds_users_files(path):
            # Made by hand, or by a submit killed as it began to lay the queue out (audit
            # DK: "not a renderctl queue", as if it were someone else's folder).
            return f"is empty: {makes_it}"
        return "is not a renderctl queue (no pending/ folder)"
    if not holds_users_files(path):
        return None
    return "is not a renderctl queue and not empty (a new queue needs a missing or empty folder)"


def foreign_owner(path: Path) -> int | None:
    """The uid of ``path``'s owner if we run as root and it is another user's (None: it
    is root's, is not there yet, or we are not root)."""
    if os.geteuid() != 0:
        return None
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return None  # (made now, by root, for root)
    return uid or None


def foreign_queue_problem(path: Path) -> str | None:
    """Why root must not write in ``path`` (None: it may): the queue belongs to another
    user, whose renderctl could not read what root would leave there. Root's submit,
    `dead retry` or run into a user's queue left records only root could read: the user's
    runner stopped (exit 74) with its running job charged as a crash, and the jobs root
    added ran nowhere (audit FV)."""
    uid = foreign_owner(path)
    if uid is None:
        return None
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid {uid}"
    return (f"belongs to {name} (uid {uid}), and this command runs as root: what it would "
            f"write there {name}'s renderctl could not read (its runner would stop, exit "
            f"74); run it as {name} (`sudo -u {name} renderctl ...`)")


def check_queue(ctx: typer.Context, param: typer.CallbackParam, value: Path | None, *,
                creating: bool, writes: bool = False) -> Path | None:
    """``--queue`` (or its defaults) must name a queue, or for ``creating`` commands a
    folder that can become one: exit 2 naming the option, variable or key, as ``--out``
    does, before the command does anything. A folder that is not a queue is the user's
    mistake (a typo, the wrong cwd), not the store's 74, which scripts must be able to read
    as "the disk failed"."""
    config_gate(ctx)
    path = queue_path(value)
    try:
        problem = queue_problem(path, creating=creating)
        if problem is None and (creating or writes):
            problem = foreign_queue_problem(path)
    except OSError as exc:
        out.err(os_error_message(exc))
        raise typer.Exit(ExitCode.IO_ERROR) from None
    if problem is not None:
        label = _source_label(ctx, param) if value is not None else None
        out.err(f"{label or '--queue (default)'}: {path} {problem}")
        raise typer.Exit(ExitCode.USAGE)
    return value


# Two callbacks, not one with a keyword: typer passes the value to a callback's last
# parameter without a click type.
def checked_queue(ctx: typer.Context, param: typer.CallbackParam,
                  value: Path | None) -> Path | None:
    return check_queue(ctx, param, value, creating=False)


def checked_new_queue(ctx: typer.Context, param: typer.CallbackParam,
                      value: Path | None) -> Path | None:
    return check_queue(ctx, param, value, creating=True)


def checked_own_queue(ctx: typer.Context, param: typer.CallbackParam,
                      value: Path | None) -> Path | None:
    return check_queue(ctx, param, value, creating=False, writes=True)


def queue_option(callback: Callable[..., Path | None]) -> Any:
    return typer.Option("--queue", "-q", help="queue folder [default ./.renderctl]",
                        envvar="RENDERCTL_QUEUE", show_default=False,
                        parser=non_empty_path("--queue"), metavar="<path>", callback=callback)


QueueOpt = Annotated[Path | None, queue_option(checked_queue)]
# `submit` and `run`: the queue may be missing or an empty folder (they create it).
NewQueueOpt = Annotated[Path | None, queue_option(checked_new_queue)]
# `dead retry`, `cancel`, `dead purge`, `prune`: a queue that must be there, whose records
# they write.
OwnQueueOpt = Annotated[Path | None, queue_option(checked_own_queue)]


def existing_queue(opt: Path | None, *, report_corrupt: bool = True,
                   whole: bool = False) -> Queue:
    """The queue named by ``--queue`` (or its defaults), which ``checked_queue`` found to
    be one, for a command that only uses queues. A record it moves to corrupt/ while
    reading is reported on stderr (DESIGN: "quarantined and reported"), unless the command
    owns the screen (`top`). Accepted jobs a full disk keeps out of pending/ are warned
    about (the command may be what frees the room: `prune`, `dead purge`), or refused
    (74) if the command must see every job (``whole``: `cancel --all` said "nothing to
    cancel" of 40 jobs that would run once there was room; `show`, `wait`: no such job)."""
    from renderctl.store import Queue

    # As root in a queue another user owns, an open that only reads: what it would settle
    # (a killed submit's batch, a killed cancel) written as root, only root could read it,
    # and the owner's runner stopped at it, exit 74 (review FX). The owner's next command
    # settles it.
    settle = foreign_owner(queue_path(opt)) is None
    q = watch_locks(Queue(queue_path(opt), create=False, settle=settle))
    if report_corrupt:
        report_quarantines(q)
        unplaced = q.unplaced_error()
        if unplaced is not None:
            if whole and settle:
                raise unplaced
            # (Not settled: root reading a user's queue, which cannot place the batch, and
            # must not fail for it: `show` and `wait` of a job placed already were 74.)
            out.err(f"warning: {unplaced}")
    return q


# What ends a wait for a queue lock early (`run`'s stop signals; see _EarlyStop): the
# signal's number once one came. One command per process: set by the command, read by
# watch_locks for every Queue it opens.
_stop_requested: Callable[[], int | None] | None = None


def watch_locks(q: Queue) -> Queue:
    """``q`` telling the user whom a wait for one of its locks is for (lockwait), and
    giving up that wait on a stop signal of `run`'s."""
    q.on_lock_wait = out.err
    q.stop_requested = _stop_requested
    return q


def report_quarantines(q: Queue) -> None:
    """Say on stderr what ``q`` moves to corrupt/ from now on, and what it moved already
    while it opened (a damaged journal entry): DESIGN's "quarantined and reported". A
    runner reports its own with its other events (it replaces this)."""
    def warn(ev: dict[str, Any]) -> None:
        out.err(f"warning: {ev['file']} could not be read ({ev['reason']}); moved to "
                f"corrupt/{ev['moved_to']} (kept, not run)")

    for ev in q.quarantined:
        warn(ev)
    q.on_quarantine = warn


def out_root(opt: Path | None) -> Path:
    if opt is not None:
        return opt
    return Path(os.environ.get("RENDERCTL_OUT") or "out")


def unique(job_ids: list[str]) -> list[str]:
    """Ids in the order given, each once: a job named twice is still one job, and the
    second mention would otherwise report what the first just did (`cancel x x`: "already
    cancelled")."""
    return list(dict.fromkeys(job_ids))


def report_unfound(q: Queue, job_ids: list[str], then: str = "") -> None:
    """Say on stderr that ``job_ids`` were not found: each whose record was quarantined in
    corrupt/ by name and place, as `show` says it (a job accepted earlier is not "no such
    job"), the rest on one "no such job" line; ``then`` ends each line."""
    from renderctl.errors import JobNotFound

    unknown = []
    for jid in job_ids:
        try:
            q.get(jid)
        except JobNotFound as exc:
            if exc.quarantined:
                out.err(f"{exc}{then}")
                continue
        unknown.append(jid)
    if unknown:
        out.err("no such job: " + ", ".join(unknown) + then)


def unfound_answer(q: Queue, job_id: str) -> str:
    """What `--json` answers for an id in no folder: `corrupt` if its record was found
    damaged and moved to corrupt/ (as `wait` says it: the job was accepted, a script must
    not take it for never submitted), else `not found`. The queue's own verdict (its
    JobNotFound), as `show` and `wait` read it."""
    from renderctl.errors import JobNotFound

    try:
        q.get(job_id)
    except JobNotFound as exc:
        return "corrupt" if exc.quarantined else "not found"
    return "not found"  # (back meanwhile: a caller found it in no folder a moment ago)


# The stops a command that changes the queue (`submit`, `cancel`, `prune`, `dead purge`)
# defers: not SIGQUIT, whose core dump is for debugging.
DEFERRED_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def restores_stops(fn: F) -> F:
    """Put back, as the command returns, the stop handlers and the lock waits' stop check
    that ``defer_stops`` set: in a process that goes on (a test's CliRunner, a program that
    calls the command line in-process) Ctrl-C and SIGTERM were only recorded from then on,
    for good, and every later lock wait ended at once (review DE)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _stop_requested
        handlers = {sig: signal.getsignal(sig) for sig in DEFERRED_STOPS}
        requested = _stop_requested
        try:
            return fn(*args, **kwargs)
        finally:
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
            _stop_requested = requested

    return wrapper  # type: ignore[return-value]


def handle_errors(fn: F) -> F:
    """Turn core errors into one message and the contract's exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ManifestError as exc:
            for p in exc.problems:
                out.err(str(p))
            out.err(f"{len(exc.problems)} problem(s); nothing was enqueued")
            raise typer.Exit(ExitCode.USAGE) from None
        except (Saturated, QueueBusy) as exc:
            out.err(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except RenderctlError as exc:
            out.err(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except BrokenPipeError:
            # The reader went away (`renderctl status | head -1`) after we had succeeded far
            # enough to print: not an error (click would exit 1, we said 74 before).
            out.silence_stdout()
            raise typer.Exit(ExitCode.OK) from None
        except OSError as exc:
            out.err(os_error_message(exc))
            raise typer.Exit(ExitCode.IO_ERROR) from None

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def stdout_result(done: str = "") -> Iterator[None]:
    """Print a command's result; a stdout that cannot take it (`> file` on a full disk, over
    quota) is one line saying so, exit 74, and ``done`` says what the command did all the
    same. A command that changes the queue has changed it before it prints: a bare "I/O
    error" read as a failed submit (a script would give up on jobs that are queued, or
    submit them again). An error naming a file is not stdout's, and a reader gone (a closed
    pipe) is handled as everywhere (handle_errors, console.write_out)."""
    try:
        yield
        sys.stdout.flush()  # what print() kept in its buffer (a file): its error is ours too
    except OSError as exc:
        if exc.filename is not None or out.reader_gone(exc):
            raise
        out.silence_stdout()  # (the interpreter's last flush would fail again: status 120)
        out.err(f"cannot write stdout: {exc.strerror or exc}" + (f"; {done}" if done else ""))
        raise typer.Exit(ExitCode.IO_ERROR) from None


def _limits(memory_mb: int | None, timeout: float | None, max_attempts: int | None) -> Any:
    from renderctl.manifest import Limits

    base = Limits()
    return Limits(
        memory_mb=memory_mb if memory_mb is not None else base.memory_mb,
        timeout_s=timeout if timeout is not None else base.timeout_s,
        max_attempts=max_attempts if max_attempts is not None else base.max_attempts,
    )


def _source_label(ctx: typer.Context, param: typer.CallbackParam) -> str | None:
    """What set this option, as the user would name it; None for the built-in default."""
    from renderctl.settings import env_name

    key = _config_key(param)
    # click's ParameterSource, by name: typer vendors click, so its enum is not importable.
    source = getattr(ctx.get_parameter_source(param.name or ""), "name", "COMMANDLINE")
    if source == "DEFAULT":
        return None
    if source == "ENVIRONMENT":
        return env_name(key)
    if source == "DEFAULT_MAP":
        return f"{ctx.meta.get(CONFIG_FILE_META, 'configuration')}: key {key!r}"
    return "--" + key.replace("_", "-")


def _config_key(param: typer.CallbackParam) -> str:
    """The configuration key of an option: its long name with ``_`` (``memory_mb``)."""
    longs = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    return longs[0][2:].replace("-", "_") if longs else str(param.name)


def checked(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """An option's value held to its configuration key's check, from whichever source.

    click knows only types; the ranges live in ``settings.KEYS``, which a configuration file
    already meets. A bad value is one line naming the option, variable or key: exit 2 before
    the command does anything."""
    from renderctl.settings import ConfigError, check_setting

    config_gate(ctx)
    label = _source_label(ctx, param)
    if value is None or label is None:
        return value
    try:
        return check_setting(_config_key(param), value, label=label)
    except ConfigError as exc:
        out.err(str(exc))
        raise typer.Exit(ExitCode.USAGE) from None


def lenient(convert: Callable[[str], Any]) -> Callable[[Any], Any]:
    """A parser for a numeric option that hands on text it cannot convert, for ``checked``
    to refuse in one line naming where it came from. click's own refusal was its usage
    block, which names the option's variable even when the value was typed on the command
    line. (A configuration file's value comes typed, checked by settings already.)"""

    def parse(value: Any) -> Any:
        if not isinstance(value, str) or "_" in value:
            # (Python's int() and float() read "1_0" as 10, a typo no user means as that)
            return value
        try:
            return convert(value)
        except ValueError:
            return value

    return parse


AS_INT = lenient(int)
AS_FLOAT = lenient(float)


def checked_guard(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """``checked``, and a cgroup guard asked for by name must work on this machine."""
    from renderctl.guards import GuardUnavailable, require_memory_guard

    value = checked(ctx, param, value)
    try:
        require_memory_guard(value)
    except GuardUnavailable as exc:
        out.err(f"{_source_label(ctx, param) or '--memory-guard'}: {exc}")
        raise typer.Exit(ExitCode.USAGE) from None
    return value


def report_file_problem(path: Path) -> str | None:
    """Why `run` could not write a report file at ``path`` (None: it can, as far as one can
    tell before trying): its folder must exist and take new files, and the path must not be
    a folder. The report is written beside it and renamed over it, so anything but a regular
    file there (a FIFO, /dev/null) would be replaced, not written to."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        pass  # a new file; its folder is judged below
    except OSError as exc:
        return exc.strerror or str(exc)
    else:
        if stat.S_ISDIR(mode):
            return "is a folder, not a file"
        if not stat.S_ISREG(mode):
            return "is not a regular file (the report would replace it)"
    folder = path.parent
    try:
        folder_mode = folder.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return f"folder {folder} does not exist"
    except OSError as exc:
        return f"folder {folder}: {exc.strerror or exc}"
    if not stat.S_ISDIR(folder_mode):
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"folder {folder} is not writable"
    return None


def checked_report_file(ctx: typer.Context, param: typer.CallbackParam,
                        value: Path | None) -> Path | None:
    """``--junit``/``--metrics-textfile``: a path `run` can write, or exit 2 naming the
    option, variable or key. Checked before anything is enqueued: found only at the end, a
    typo would lose the report of a whole run, silently."""
    config_gate(ctx)
    if value is None:
        return None
    problem = report_file_problem(value)
    if problem is not None:
        label = _source_label(ctx, param) or "--" + _config_key(param).replace("_", "-")
        out.err(f"{label}: {value}: {problem}")
        raise typer.Exit(ExitCode.USAGE)
    return value


# Ranges are not click's min=: `checked` holds each option to its configuration key's check
# (for job limits, the manifest's own), whichever of option, variable or file set it.
MemOpt = Annotated[int | None, typer.Option("--memory-mb",
                                            help="default memory ceiling (MB, 1-"
                                            f"{MAX_MEMORY_MB}) [default {DEFAULT_MEMORY_MB}]",
                                            show_default=False, callback=checked,
                                            parser=AS_INT, metavar="<int>",
                                            envvar="RENDERCTL_MEMORY_MB")]
TimeoutOpt = Annotated[float | None, typer.Option("--timeout",
                                                  help="default timeout of one attempt (s, "
                                                  f"> 0, <= {MAX_TIMEOUT_S:g}) "
                                                  f"[default {DEFAULT_TIMEOUT_S:g}]",
                                                  show_default=False, callback=checked,
                                                  parser=AS_FLOAT, metavar="<float>",
                                                  envvar="RENDERCTL_TIMEOUT")]
AttemptsOpt = Annotated[int | None, typer.Option("--max-attempts",
                                                 help=f"default attempts (1-{MAX_ATTEMPTS}) "
                                                 f"[default {DEFAULT_MAX_ATTEMPTS}]",
                                                 show_default=False, callback=checked,
                                                 parser=AS_INT, metavar="<int>",
                                                 envvar="RENDERCTL_MAX_ATTEMPTS")]
MaxPendingOpt = Annotated[int | None, typer.Option("--max-pending", callback=checked,
                                                   parser=AS_INT, metavar="<int>",
                                                   envvar="RENDERCTL_MAX_PENDING",
                                                   help="reject the whole submit if pending "
                                                   "would exceed this")]


def _env(name: str) -> str:
    """The environment variable that sets option ``--name`` (``RENDERCTL_NAME``)."""
    from renderctl.settings import env_name

    return env_name(name.replace("-", "_"))


def config_default_map(group: Any, config: dict[str, Any]) -> dict[str, Any]:
    """click's ``default_map`` for every (sub)command from the configuration file's keys.

    Duck-typed on ``commands`` (a group) rather than importing click: recent typer vendors
    click, so a plain ``import click`` fails on a fresh install."""
    dm: dict[str, Any] = {}
    for name, cmd in getattr(group, "commands", {}).items():
        if hasattr(cmd, "commands"):
            sub = config_default_map(cmd, config)
            if sub:
                dm[name] = sub
            continue
        own: dict[str, Any] = {}
        for p in cmd.params:
            for opt in getattr(p, "opts", ()):
                key = opt[2:].replace("-", "_") if opt.startswith("--") else None
                # Only the option that RENDERCTL_<KEY> also sets: a name can mean something
                # else elsewhere (`wait --timeout` is how long to wait, not the jobs' limit).
                if (key in config and p.name is not None
                        and getattr(p, "envvar", None) == _env(key)):
                    own[p.name] = config[key]
        if own:
            dm[name] = own
    return dm


CONFIG_FILE_META = "renderctl.config_file"  # ctx.meta: the file the defaults came from
CONFIG_ERROR_META = "renderctl.config_error"  # ctx.meta: why that file could not be used


def config_gate(ctx: typer.Context) -> None:
    """Exit 2 with the configuration file's problems, if it has any. Called first by the
    callback of every option a file can set (each command has one: --queue or --out), so a
    bad file stops a command before anything, yet `--help` (eager, so handled before any
    of them) and commands without such options still work."""
    problems = ctx.meta.get(CONFIG_ERROR_META)
    if problems:
        for line in problems.splitlines():  # every problem of the file, one line each
            out.err(line)
        raise typer.Exit(ExitCode.USAGE)


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"renderctl {version('renderctl')}")
        raise typer.Exit()


@app.callback()
def configure(
    ctx: typer.Context,
    _version: Annotated[bool, typer.Option(
        "--version", callback=_show_version, is_eager=True,
        help="Print the version and exit.")] = False,
) -> None:
    """Defaults from renderctl.toml (or [tool.renderctl] in pyproject.toml) in the cwd."""
    from renderctl.crashpoints import BadCrashPoint, check_env
    from renderctl.settings import ConfigError, load_config_file

    try:
        check_env()
    except BadCrashPoint as exc:
        out.err(str(exc))
        raise typer.Exit(ExitCode.USAGE) from None

    try:
        cwd = Path.cwd()
    except OSError as exc:
        # A cron job or a shell left in a folder that was deleted (a redeploy): every
        # command ended in a FileNotFoundError traceback from os.getcwd(). Relative paths
        # (the default queue and output root, manifests) mean nothing there.
        out.err(f"the current folder is gone ({exc.strerror or exc}): deleted or moved "
                "away since this process entered it; cd to one that exists")
        raise typer.Exit(ExitCode.USAGE) from None
    try:
        path, config = load_config_file(cwd)
    except ConfigError as exc:
        # Reported by the first option that could take a default from the file (see
        # config_gate), not here: `--help`, `schema` and `kinds` read no option from it.
        ctx.meta[CONFIG_ERROR_META] = str(exc)
        return
    if config:
        ctx.meta[CONFIG_FILE_META] = str(path)
        # click resolves: command line > envvar > default_map > the option's default.
        ctx.default_map = {**(ctx.default_map or {}), **config_default_map(ctx.command, config)}


@app.command()
@handle_errors
def validate(manifests: ManifestsArg, out_dir: OutOpt = None, as_json: JsonOpt = False) -> None:
    """Check manifests only; exit 0 if valid, 2 with every problem listed if not."""
    try:
        origins: dict[str, str] = {}
        jobs = load_all(manifests, out_root=out_root(out_dir), origins=origins)
        warn_doomed(jobs, origins)
    except ManifestError as exc:
        if as_json:
            with stdout_result():
                out.print_json({"valid": False, "problems": [p.__dict__ for p in exc.problems]})
            raise typer.Exit(ExitCode.USAGE) from None
        # Not handle_errors' "nothing was enqueued": validate never enqueues anything.
        for p in exc.problems:
            out.err(str(p))
        out.err(f"{len(exc.problems)} problem(s); invalid")
        raise typer.Exit(ExitCode.USAGE) from None
    with stdout_result():
        if as_json:
            out.print_json({"valid": True, "jobs": len(jobs)})
        else:
            print(f"ok: {len(jobs)} job(s) in {len(manifests)} manifest(s)")


def warn_doomed(jobs: list[Any], origins: dict[str, str]) -> None:
    """Say which valid jobs look doomed here (renderctl.advice): a deadline past, a program
    or module not found, a kind two plugins register."""
    from renderctl import advice

    for line in advice.said([*advice.past_deadlines(jobs, origins),
                             *advice.unfound_programs(jobs, origins)]):
        out.err(f"warning: {line}")


def do_submit(
    manifests: list[Path], *, queue: Path | None, out_dir: Path | None, replace: bool,
    max_pending: int | None, limits: Any, before: Callable[[Queue], None] | None = None,
) -> tuple[Any, Any]:
    """Validate ``manifests``, then open the queue (creating its folder only now: a command
    with a manifest error leaves no trace), call ``before`` (which may refuse by raising)
    and submit. Returns (SubmitResult, Queue)."""
    from dataclasses import replace as with_file

    from renderctl.advice import existing_outputs
    from renderctl.crashpoints import CrashPoints
    from renderctl.manifest import outputs_in_queue
    from renderctl.store import Queue

    origins: dict[str, str] = {}
    try:
        jobs = load_all(manifests, out_root=out_root(out_dir), limits=limits, origins=origins)
    except ManifestError as exc:
        # Every problem in one round: the queue's too, for the jobs that validated (a user
        # fixed one batch and was shown the next).
        found = outputs_in_queue(exc.valid, queue_path(queue), origins)
        found += queue_conflicts(exc.valid, queue_path(queue), replace, origins)
        raise ManifestError(exc.problems + found) from None
    if problems := outputs_in_queue(jobs, queue_path(queue), origins):
        raise ManifestError(problems)
    crash_hook = CrashPoints.from_env()
    crash_hook("submit:parsed")
    q = watch_locks(Queue(queue_path(queue)))
    report_quarantines(q)
    if before is not None:
        before(q)
    # Looked at before the jobs are accepted: after, a following runner may have published
    # some already, and their own outputs were reported as in the way ("remove that file").
    existed = existing_outputs(jobs)
    try:
        # (advise=False: said above, before the queue was opened, and below)
        res = q.submit(jobs, replace=replace, max_pending=max_pending, crash_hook=crash_hook,
                       advise=False)
    except ManifestError as exc:
        # The queue knows jobs, not files ("<queue>"): the user has to edit a manifest, so
        # name it.
        problems = [with_file(p, file=origins[p.job]) if p.job in origins else p
                    for p in exc.problems]
        raise ManifestError(problems) from None
    # Of the jobs this submit accepted only: a manifest submitted again (cron, or `run` of
    # a finished batch) warned that a job long expired "will expire without running"
    # (audit DM), once per job per submit.
    taken = {*res.accepted, *res.replaced}
    warn_doomed([j for j in jobs if j.id in taken], origins)
    warn_existing_outputs(jobs, taken & existed, origins)
    return res, q


def queue_conflicts(jobs: list[Any], queue: Path, replace: bool,
                    origins: dict[str, str]) -> list[Problem]:
    """What the queue at ``queue`` would refuse of ``jobs`` (a changed spec; a running job
    to replace), for a command refused already: said with its other problems. Advice only:
    nothing is created (a missing queue has nothing to refuse), and a queue that cannot be
    read adds nothing here (the command's own problems are the answer)."""
    from dataclasses import replace as with_file

    from renderctl.fsutil import is_queue
    from renderctl.store import Queue

    try:
        if not jobs or not is_queue(queue):
            return []
        q = Queue(queue)
        try:
            problems = q.conflicts(jobs, replace=replace)
            problems = [with_file(p, file=origins[p.job]) if p.job in origins else p
                        for p in problems]
            return problems
        finally:
            q.close()
    except (OSError, RenderctlError):
        return []


ENDED = ("done", "dead", "cancelled", "expired")


def ended_earlier(res: SubmitResult) -> dict[str, int]:
    """How many of the jobs a submit found already accepted have ended, per terminal state
    (the submit saw where each was)."""
    return {state: res.already_ended.get(state, 0) for state in ENDED}


def holds_no_job(q: Queue) -> bool:
    """Whether ``q`` has no pending or running job (stops at the first one found)."""
    for state in ("pending", "running"):
        with os.scandir(q.dir(state)) as entries:
            if any(e.name.endswith(".json") for e in entries):
                return False
    return True


def note_ended(counts: dict[str, int], q: Queue, res: SubmitResult) -> None:
    """Say that jobs "already accepted" ended earlier: a cron job re-running its manifest
    after they were dead-lettered exits 0 (nothing it handled failed, as GNU parallel
    --resume would) and would otherwise never hear that they will not run again. The
    command it suggests names the queue, and the dead jobs (up to five): `dead retry
    --all`, copied from here, acted on ./.renderctl, and on every dead job there, not this
    manifest's (audit DB)."""
    import itertools
    import shlex

    from renderctl.lifecycle import State

    total = sum(counts.values())
    if not total:
        return
    detail = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
    hint = ""
    if counts["dead"]:
        queue = f"-q {shlex.quote(str(q.path))}"
        dead = list(itertools.islice((j for j in res.already
                                      if q.has_record(State.DEAD, j)), 6))
        if 0 < len(dead) <= 5:
            # (After "--": an id may start with "-", and one named "--all" is an id.)
            ids = " ".join(map(shlex.quote, dead))
            hint = f" (renderctl dead retry {queue} -- {ids} to run them again)"
        else:
            hint = (f" (renderctl dead list {queue}; renderctl dead retry {queue} ID... to "
                    "run them again)")
    out.err(f"note: {total} of these jobs ended earlier: {detail}{hint}")


def warn_existing_outputs(jobs: list[Any], hit: set[str], origins: dict[str, str]) -> None:
    """Valid, the file may go before the job runs, but say so now rather than after the
    render (renderctl.advice.outputs_in_the_way); the first five, then how many more."""
    from renderctl.advice import outputs_in_the_way, said

    for line in said(outputs_in_the_way(jobs, hit, origins)):
        out.err(f"warning: {line}")


def print_refusal(doc: dict[str, Any]) -> None:
    """Print a refusal's JSON for a script; a stdout that cannot take it (a full disk, a
    reader gone) is said on stderr, and the refusal itself (raised next by the caller) still
    decides the exit code and prints its message: a bare "I/O error", exit 74, hid "already
    in the queue with a different spec" (2) or "saturated" (75)."""
    try:
        out.print_json(doc)
        sys.stdout.flush()
    except OSError as exc:
        if exc.filename is not None:
            raise
        out.silence_stdout()
        if not out.reader_gone(exc):
            out.err(f"cannot write stdout: {exc.strerror or exc}")


def refused_json(exc: RenderctlError, *, accepted: Any = None) -> dict[str, Any]:
    """What `submit --json` (and `run --json`, before it runs anything) prints when it
    enqueued nothing: ``problems`` for a manifest error (the shape of `validate --json`),
    else ``error`` (``saturated``, ``busy``, ``interrupted``) with the message and the
    numbers behind it. ``accepted`` is a SubmitResult when the jobs were enqueued after all
    (a runner that started between `run`'s check and its submit)."""
    doc: dict[str, Any] = {"accepted": list(accepted.accepted) if accepted else []}
    if accepted:
        doc["already_accepted"] = list(accepted.already)
    if isinstance(exc, ManifestError):
        doc["problems"] = [p.__dict__ for p in exc.problems]
        return doc
    doc["message"] = str(exc)
    if isinstance(exc, Saturated):
        doc.update(error="saturated", requested=exc.requested, pending=exc.pending,
                   max_pending=exc.max_pending, would_fit=exc.would_fit)
    elif isinstance(exc, QueueBusy):
        doc.update(error="busy", holder_pid=exc.holder_pid)
    elif isinstance(exc, Interrupted):
        doc["error"] = "interrupted"
    elif isinstance(exc, SubmitIncomplete):
        # Accepted after all (committed), some not yet in pending/: never "nothing".
        doc.update(error="incomplete", accepted=list(exc.accepted), unplaced=list(exc.unplaced))
    else:
        doc["error"] = type(exc).__name__
    return doc


@app.command()
@handle_errors
@restores_stops
def submit(
    manifests: ManifestsArg,
    queue: NewQueueOpt = None,
    out_dir: OutOpt = None,
    replace: Annotated[bool, typer.Option("--replace", help="replace jobs whose spec changed")
                       ] = False,
    max_pending: MaxPendingOpt = None,
    memory_mb: MemOpt = None,
    timeout: TimeoutOpt = None,
    max_attempts: AttemptsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Validate manifests, then enqueue all their jobs atomically (all or nothing)."""
    early = defer_stops()
    try:
        res, q = do_submit(manifests, queue=queue, out_dir=out_dir, replace=replace,
                           max_pending=max_pending,
                           limits=_limits(memory_mb, timeout, max_attempts),
                           before=early.then(lambda q: None))
    except (ManifestError, Saturated, SubmitIncomplete, Interrupted) as exc:
        if as_json:  # a script reads stdout: say what happened there too
            print_refusal(refused_json(exc))
        raise
    ended = ended_earlier(res)
    try:
        with stdout_result(submitted_anyway(res)):
            if as_json:
                doc: dict[str, Any] = {"accepted": list(res.accepted),
                                       "already_accepted": list(res.already),
                                       "replaced": list(res.replaced)}
                if any(ended.values()):  # only then: the document keeps its documented shape
                    doc["already_ended"] = ended
                out.print_json(doc)
            else:
                print(f"accepted {len(res.accepted)} job(s)"
                      + (f", replaced {len(res.replaced)}" if res.replaced else "")
                      + (f", {len(res.already)} already accepted" if res.already else "")
                      # (escaped: a queue path may hold ESC and undecodable bytes; audit DV)
                      + f" into {out.one_line(str(queue_path(queue)))}")
    finally:
        note_ended(ended, q, res)
    end_if_stopped(early, "once the submit was made: its jobs are enqueued")


def submitted_anyway(res: SubmitResult) -> str:
    """What a submit did, for when stdout could not say it (see stdout_result)."""
    others = ", ".join(([f"{len(res.replaced)} replaced"] if res.replaced else [])
                       + ([f"{len(res.already)} already accepted"] if res.already else []))
    if not res.accepted:
        return f"the submit was made all the same ({others})"
    return (f"the {len(res.accepted)} job(s) were accepted all the same"
            + (f" (and {others})" if others else ""))


@app.command()
@handle_errors
def run(
    ctx: typer.Context,
    manifests: Annotated[list[Path] | None, typer.Argument(help="manifests to submit first",
                                                           readable=False)
                         ] = None,
    queue: NewQueueOpt = None,
    out_dir: OutOpt = None,
    workers: Annotated[int | None, typer.Option("--workers", "-j",
                                                envvar=_env("workers"), callback=checked,
                                                parser=AS_INT, metavar="<int>",
                                                help=f"worker processes (1-{MAX_WORKERS}) "
                                                "[default: from cores and memory budget]")
                         ] = None,
    memory_mb: MemOpt = None,
    timeout: TimeoutOpt = None,
    max_attempts: AttemptsOpt = None,
    follow: Annotated[bool, typer.Option(
        "--follow", envvar=_env("follow"),
        help="keep serving new jobs until a stop signal: SIGTERM, SIGINT, SIGHUP (drain) "
        "or SIGQUIT (release running jobs at once)")] = False,
    start_method: Annotated[str, typer.Option(
        "--start-method", envvar=_env("start-method"), callback=checked,
        help="forkserver | fork | spawn")] = RunnerSettings.start_method,
    max_jobs_per_worker: Annotated[int, typer.Option(
        "--max-jobs-per-worker", envvar=_env("max-jobs-per-worker"), callback=checked,
        parser=AS_INT, metavar="<int>",
        help="recycle a worker after N jobs")] = RunnerSettings.max_jobs_per_worker,
    backoff_base: Annotated[float, typer.Option(
        "--backoff-base", envvar=_env("backoff-base"), callback=checked,
        parser=AS_FLOAT, metavar="<float>",
        help="first retry delay (s), doubling")] = RunnerSettings.backoff_base_s,
    backoff_max: Annotated[float, typer.Option(
        "--backoff-max", envvar=_env("backoff-max"), callback=checked,
        parser=AS_FLOAT, metavar="<float>",
        help="longest retry delay (s)")] = RunnerSettings.backoff_max_s,
    kill_grace: Annotated[float, typer.Option(
        "--kill-grace", envvar=_env("kill-grace"), callback=checked,
        parser=AS_FLOAT, metavar="<float>",
        help="SIGTERM -> SIGKILL grace on timeout (s)")] = RunnerSettings.kill_grace_s,
    grace: Annotated[float, typer.Option(
        "--grace", envvar=_env("grace"), callback=checked,
        parser=AS_FLOAT, metavar="<float>",
        help="on SIGTERM, SIGINT or SIGHUP: time running jobs get to finish (s); SIGQUIT "
        "gives none")] = RunnerSettings.grace_s,
    memory_budget: Annotated[int | None, typer.Option(
        "--memory-budget", envvar=_env("memory-budget"), callback=checked,
        parser=AS_INT, metavar="<int>",
        help="MB the running jobs' ceilings may add up to [default: 80% of available memory, "
             "or what a container's memory limit leaves if less]")
    ] = None,
    memory_guard: Annotated[str, typer.Option(
        "--memory-guard", envvar=_env("memory-guard"), callback=checked_guard,
        help="auto | cgroup-v1 | cgroup-v2 | sampling")] = RunnerSettings.memory_guard,
    max_failures: Annotated[int | None, typer.Option(
        "--max-failures", envvar=_env("max-failures"), callback=checked,
        parser=AS_INT, metavar="<int>",
        help="stop claiming after N dead-lettered jobs")] = None,
    max_pending: MaxPendingOpt = None,
    prefetch: Annotated[int | None, typer.Option(
        "--prefetch", envvar=_env("prefetch"), callback=checked,
        parser=AS_INT, metavar="<int>",
        help="jobs a worker may hold, the running one included [default: adaptive, 1 for "
        "long jobs and with --max-failures]")] = None,
    poll_interval: Annotated[float, typer.Option(
        "--poll-interval", envvar=_env("poll-interval"), callback=checked,
        parser=AS_FLOAT, metavar="<float>",
        help="rescan the queue this often (s) for work no wake-up announced (a submit, "
        "cancel or dead retry wakes the runner at once)")] = RunnerSettings.poll_interval_s,
    quiet: Annotated[bool, typer.Option(
        "--quiet", envvar=_env("quiet"), help="print only failures and the summary")] = False,
    metrics_textfile: Annotated[Path | None, typer.Option(
        "--metrics-textfile", envvar=_env("metrics-textfile"), show_default=False,
        parser=non_empty_path("--metrics-textfile", folder=False), metavar="<path>",
        callback=checked_report_file,
        help="rewrite this Prometheus textfile (node_exporter) every ~5 s and at the end "
        "(its folder must exist)")
    ] = None,
    junit: Annotated[Path | None, typer.Option(
        "--junit", envvar=_env("junit"), show_default=False, callback=checked_report_file,
        parser=non_empty_path("--junit", folder=False), metavar="<path>",
        help="write a JUnit XML report of the jobs this run handled at the end (its folder "
        "must exist)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit these manifests (if any), then supervise workers until nothing is left."""
    from renderctl.cli.reporters import (
        JsonReporter,
        Lines,
        PlainReporter,
        summary_json,
        summary_line,
    )
    from renderctl.errors import UserError
    from renderctl.runner import (
        STOP_SIGNALS,
        Runner,
        default_budget_mb,
        default_workers,
        ensure_fd_room,
        prestart,
    )
    from renderctl.store import Queue

    if follow and junit is not None:
        params: dict[str | None, Any] = {p.name: p for p in ctx.command.params}
        raise UserError(
            f"{_source_label(ctx, params['junit'])} cannot go with "
            f"{_source_label(ctx, params['follow'])}: a JUnit report is of one run, written "
            "as it ends, and a --follow runner's run never does (it would keep every job it "
            "ran in memory, ~640 bytes each, for weeks); use --metrics-textfile")
    # Before anything is enqueued: a --workers the open-files limit cannot carry is this
    # command's error (audit FI: "Too many open files" at the third worker's start, exit 74,
    # its claimed jobs left to recovery).
    ensure_fd_room(workers or default_workers(memory_budget or default_budget_mb()))
    early = _EarlyStop(STOP_SIGNALS)
    lines = Lines()  # what `run` says on stdout, plain or JSON (a dashboard draws instead)
    # The fork server imports the renderers (~0.25 s) in its own process, on the other core,
    # while this one validates and submits the manifests and recovers the queue.
    prestart(start_method)
    limits = _limits(memory_mb, timeout, max_attempts)
    res = None
    ended: dict[str, int] | None = None  # of the manifests' jobs already accepted
    if manifests:
        # One Queue object for the submit and the run: it knows what it put in pending/, so
        # the runner's start need not read those records back.
        try:
            res, q = do_submit(manifests, queue=queue, out_dir=out_dir, replace=False,
                               max_pending=max_pending, limits=limits,
                               before=early.then(refuse_if_runner))
        except ManifestError as exc:
            exc = for_run(exc)
            if as_json:  # as `submit --json` says it: stdout is what a script reads
                print_refusal(refused_json(exc))
            raise exc from None
        except (Saturated, QueueBusy, Interrupted) as exc:
            if as_json:
                print_refusal(refused_json(exc))
            if isinstance(exc, Saturated) and exc.pending \
                    and 0 < exc.requested <= exc.max_pending:
                # No runner holds the queue (refuse_if_runner): an hourly `run today.toml`
                # refused so kept the queue full for good, nothing draining it (audit EA).
                # (Not where it can never fit: its message says so; review EE.)
                out.err(str(exc))
                out.err("note: no runner is running the jobs pending here; `renderctl run` "
                        "(without manifests) runs them, so that these can fit afterwards")
                raise typer.Exit(ExitCode.TEMPFAIL) from None
            raise
        if not as_json and not quiet:
            lines.write(f"accepted {len(res.accepted)} job(s)"
                        + (f", {len(res.already)} already accepted" if res.already else "")
                        + "\n")
        ended = ended_earlier(res)
        note_ended(ended, q, res)
    else:
        q = watch_locks(Queue(queue_path(queue)))
        report_quarantines(q)
        warn_submit_only(ctx, {"out_dir": "--out", "memory_mb": "--memory-mb",
                               "timeout": "--timeout", "max_attempts": "--max-attempts"})
        if not follow and holds_no_job(q):
            # A first `renderctl run` with no manifest made an empty queue and said only
            # "done 0", exit 0 (audit BE).
            out.err(f"note: no manifest given, and the queue {q.path} holds no job to run "
                    "(`renderctl run MANIFEST` submits one and runs it)")
    settings = RunnerSettings(
        workers=workers, start_method=start_method, max_jobs_per_worker=max_jobs_per_worker,
        backoff_base_s=backoff_base, backoff_max_s=backoff_max, kill_grace_s=kill_grace,
        grace_s=grace, memory_budget_mb=memory_budget, follow=follow,
        max_failures=max_failures, memory_guard=memory_guard, prefetch=prefetch,
        poll_interval_s=poll_interval,
    )
    dashboard = None
    main: Any
    if as_json:
        main = JsonReporter(lines)
    elif quiet or out.plain():
        main = PlainReporter(lines, quiet=quiet)
    else:
        from renderctl.cli.dashboard import DashboardReporter

        main = dashboard = DashboardReporter(out.console(file=lines.out),
                                             out_root=str(out_root(out_dir).absolute()),
                                             lines=lines)
    extras: list[Any] = []
    textfile = collector = None
    if metrics_textfile is not None:
        from renderctl.metrics import MetricsTextfile

        textfile = MetricsTextfile(q, metrics_textfile)
        extras.append(textfile)
    if junit is not None:
        from renderctl.junit import JUnitCollector

        collector = JUnitCollector()
        extras.append(collector)
    runner = Runner(q, settings, reporter=Tee(main, *extras) if extras else main)
    early.hand_over(runner)
    ran = True
    try:
        summary = runner.run()
    except QueueBusy as exc:
        ran = False
        if res is None:
            if as_json:
                print_refusal(refused_json(exc))
            raise
        # A runner started between refuse_if_runner and our submit: the jobs are in
        # pending/ all the same, and that runner (or the next) will run them. Say so: "try
        # again later" alone would have the user submit them twice.
        busy = QueueBusy(f"{exc}; the {len(res.accepted)} job(s) accepted above stay queued "
                         "and that runner (or the next) will run them",
                         holder_pid=exc.holder_pid)
        if as_json:
            print_refusal(refused_json(busy, accepted=res))
        raise busy from None
    finally:
        if dashboard is not None:
            dashboard.close(runner)
        early.flush_or_stop(lines)  # what stdout could not take yet (see reporters.Lines)
        # Not for a run refused as busy, which ran nothing: its empty report replaced the
        # last real one (a green CI of 0 tests), and its textfile the live runner's (audit
        # EA).
        if textfile is not None and ran:
            report_written("metrics textfile", metrics_textfile, textfile.close)
        if collector is not None and junit is not None and ran:
            report_written("JUnit report", junit, lambda: collector.write(junit, q))
    if as_json:
        # Through the reporter that wrote the events, so the last line is shaped like them
        # (its `ts` and all), as README promises of every line.
        doc = summary_json(summary)
        if ended is not None and any(ended.values()):  # as `submit --json` has it
            doc["already_ended"] = ended
        main.event(doc)
    else:
        lines.write(summary_line(summary) + "\n")
    early.flush_or_stop(lines)
    if runner.queue_io_error is not None:
        released = runner.queue_io_released
        out.err(f"{runner.queue_io_error}; stopped (the queue's own file system), " + (
            "no job was in flight" if released is None else
            f"the {released} job(s) in flight go back to pending uncharged at the next run"
            if released else "the jobs in flight could not be marked released: the next "
            "run charges them as after a crash"))
    elif runner.output_io_error is not None:
        # Like every other exit 74, the reason on stderr (the halted line said it too).
        out.err(f"cannot write outputs: {runner.output_io_error}; stopped, the jobs not "
                "run stay pending (nothing was charged for this)")
    elif runner.worker_start_error is not None:
        out.err(f"{runner.worker_start_error}; stopped, the jobs not run stay pending "
                "(nothing was charged for this)")
    if lines.lost is not None:
        # The jobs ran; what the run said of them did not reach stdout (see Lines).
        out.err(f"stdout could not be written ({os_error_message(lines.lost)}); the "
                "run's lines from then on are lost: `renderctl status` and `show` have "
                "every outcome")
        raise typer.Exit(ExitCode.IO_ERROR)
    if early.cut_short is not None:
        raise typer.Exit(128 + early.cut_short)  # (the jobs' outcomes are in the queue)
    raise typer.Exit(summary.exit_code)


def report_written(what: str, path: Path | None, write: Callable[[], None]) -> None:
    """Write a report at the end of a run; a failure is a warning naming the file. The jobs
    ran and their outcomes are recorded: the run's exit code says how they went, not whether
    an aid to reading them could be written (the folder was checked before the run)."""
    try:
        write()
    except (OSError, ValueError) as exc:
        why = os_error_message(exc) if isinstance(exc, OSError) else str(exc)
        out.err(f"warning: {what} {path} not written: {why}")


def warn_submit_only(ctx: typer.Context, options: dict[str, str]) -> None:
    """Warn of options given on the command line that only shape jobs being submitted, to a
    command that submits none: a job keeps the output root and limits it was submitted with,
    and `run --timeout 60` on a queue a web tier filled would otherwise do nothing, silently.
    (From the environment or a configuration file they are meant for every command: quiet.)"""
    given = [flag for name, flag in options.items()
             if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"]
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        out.err(f"warning: {', '.join(given)} only {verb} to jobs this command submits (none "
                "here); queued jobs keep the output root and limits they were submitted with")


class _StopWaiting(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _EarlyStop:
    """`run`'s stop signals until its runner installs its own handlers, and those of a
    command that changes the queue while it does (``defer_stops``): recorded, not obeyed.

    Dying of one mid-start printed nothing (even "accepted N job(s)" was lost in stdout's
    buffer) though the jobs may have been enqueued, and left multiprocessing's temporary
    folder behind. Before the submit's commit point a signal means nothing is enqueued;
    after it, the runner starts and drains at once, printing its summary like any stop."""

    def __init__(self, signals: tuple[int, ...]) -> None:
        self.signum: int | None = None
        self.runner: Any = None
        self.flushing = False  # waiting for stdout's reader after the run (flush_or_stop)
        self.cut_short: int | None = None  # the signal that ended that wait
        for sig in signals:
            # One the parent left ignored stays so, as in the launcher and the runner (`nohup`)
            if signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, self._on_signal)
        global _stop_requested
        _stop_requested = self.requested

    def requested(self) -> int | None:
        """The stop signal that came, if one did (a wait for a lock ends on it)."""
        if self.runner is not None:
            return self.runner.stop_signal  # type: ignore[no-any-return]
        return self.signum

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGQUIT:
            signal.signal(signum, signal.SIG_DFL)  # a second Ctrl-\ quits at once (runner)
        if self.flushing:
            raise _StopWaiting(signum)
        if self.runner is not None:
            self.runner.stop(signum)
        elif self.signum is None:
            self.signum = signum

    def flush_or_stop(self, lines: Any) -> None:
        """Write what stdout's reader has not taken yet, waiting for it; a stop signal
        meanwhile drops the rest (the run is over: its stop had nothing left to stop, and a
        stalled reader, `run | consumer` hung, made `run` unstoppable but by SIGKILL)."""
        if self.cut_short is not None:
            return
        self.flushing = True
        try:
            lines.flush(wait=True)
        except _StopWaiting as stop:
            self.cut_short = stop.signum
            lines.discard()
            out.err(f"stopped by {signal.Signals(stop.signum).name} while stdout's reader "
                    "had not taken the run's last lines: they were dropped (`renderctl "
                    "status`, `show` and events.jsonl have every outcome)")
        finally:
            self.flushing = False

    def refuse(self) -> None:
        if self.signum is not None:
            raise Interrupted(f"stopped by {signal.Signals(self.signum).name} before "
                              "submitting; nothing was enqueued", self.signum)

    def then(self, check: Callable[[Queue], None]) -> Callable[[Queue], None]:
        """``check``, after refusing if a signal has come (a ``do_submit`` ``before``)."""
        def both(q: Queue) -> None:
            self.refuse()
            check(q)
        return both

    def hand_over(self, runner: Any) -> None:
        self.runner = runner
        if self.signum is not None:
            runner.stop(self.signum)


def defer_stops() -> _EarlyStop:
    """For a command that changes the queue: a stop signal is recorded, not obeyed in the
    middle of a change. Before the change begins it refuses (nothing done), a wait for a
    lock ends on it, and a cancel or prune stops at its next job; then the command says
    what it did and exits 128+n (end_if_stopped). Obeyed at once, it exited 130 saying
    nothing, having enqueued 20,000 jobs, cancelled 3,840 of 20,000 or pruned 1,580
    records (audit DB)."""
    return _EarlyStop(DEFERRED_STOPS)


def end_if_stopped(early: _EarlyStop, did: str) -> None:
    """Exit 128+n saying ``did``, if a stop signal came while the command changed the queue
    (its output so far printed)."""
    if early.signum is not None:
        out.err(f"stopped by {signal.Signals(early.signum).name} {did}")
        raise typer.Exit(signal_exit_code(early.signum))


def refuse_if_runner(q: Queue) -> None:
    """``run MANIFEST`` on a queue another live runner holds: refuse (75) before enqueuing,
    so that "try again later" does not leave the jobs behind to be submitted twice.

    Judged as ``Queue.runner_lock`` judges it: a lock whose recorded holder is not a live
    runner (``status`` peeking, ``cancel`` settling a dead runner's orphan) is not busy.
    """
    info = q.busy_runner()
    if info is not None:
        pid = info.get("pid")
        raise QueueBusy(f"another runner (pid {pid}) holds queue {q.path}; nothing was "
                        "enqueued (`renderctl submit` the manifests for that runner to run "
                        "them, or try again later)", holder_pid=pid)


def for_run(exc: ManifestError) -> ManifestError:
    """The queue's problems in `run`'s words: `run` has no --replace, `submit` has."""
    from dataclasses import replace as with_message

    def reword(message: str) -> str:
        if "--replace" in message and "renderctl submit --replace" not in message:
            return message.replace("--replace", "`renderctl submit --replace`") + (
                ", then `renderctl run`")
        return message

    return ManifestError([with_message(p, message=reword(p.message)) for p in exc.problems])


class Tee:
    """Hands each event and tick to several reporters (the display, metrics, JUnit)."""

    def __init__(self, *reporters: Any) -> None:
        self.reporters = reporters

    def event(self, ev: Any) -> None:
        for r in self.reporters:
            r.event(ev)

    def tick(self, runner: Any) -> None:
        for r in self.reporters:
            r.tick(runner)


@app.command()
@handle_errors
def status(queue: QueueOpt = None, as_json: JsonOpt = False) -> None:
    """Counts per state, oldest pending age, running jobs, and the runner (if any)."""
    from renderctl.cli.views import render_status, status_json

    q = existing_queue(queue)
    st = q.status()
    with stdout_result():
        if as_json:
            out.print_json(status_json(q, st))
        else:
            render_status(out.console(), q, st)


@app.command()
@handle_errors
def show(job_id: Annotated[str, typer.Argument(help="job id")], queue: QueueOpt = None,
         as_json: JsonOpt = False) -> None:
    """One job: state, attempts, errors, output."""
    from renderctl.cli.views import render_job, show_json
    from renderctl.errors import JobNotFound

    q = existing_queue(queue, whole=True)
    try:
        view = q.get(job_id)
    except JobNotFound as exc:
        if as_json:  # the shape of `cancel --json` refusing: the id, `not found`
            with stdout_result():
                out.print_json({job_id: "corrupt" if exc.quarantined else "not found"})
        raise
    with stdout_result():
        if as_json:
            out.print_json(show_json(view))
        else:
            render_job(out.console(), view)


@app.command()
@handle_errors
def schema(as_json: Annotated[bool, typer.Option(
        "--json", help="(the schema is JSON already: accepted, as every command that prints "
        "JSON takes it)")] = False) -> None:
    """Print the manifest's JSON Schema."""
    from renderctl.manifest import json_schema
    from renderctl.render.registry import broken_plugins

    schema = json_schema()  # (its kinds' params are the plugins' too: say which are missing)
    for why in broken_plugins():
        out.err(f"warning: renderer plugin {why}")
    # write_out, not print: `renderctl schema | head` exits 0, as `status | head` does.
    with stdout_result():
        out.write_out(json.dumps(schema, indent=2) + "\n")


@app.command()
@handle_errors
def kinds(as_json: JsonOpt = False) -> None:
    """List every renderer (built-in and from plugins) with its params."""
    from renderctl.render.registry import all_specs, broken_plugins

    specs = all_specs()
    # A plugin that could not be loaded is not silently missing from the list (stderr: the
    # list on stdout stays what scripts read)
    for why in broken_plugins():
        out.err(f"warning: renderer plugin {why}")
    if as_json:
        from renderctl.manifest import MAX_INPUTS

        with stdout_result():
            # (A renderer's own limit, else a job's: null said "no limit" where a job takes
            # at most MAX_INPUTS; audit CE.)
            out.print_json({k: {"description": s.description,
                                "inputs": [s.min_inputs, MAX_INPUTS if s.max_inputs is None
                                           else min(s.max_inputs, MAX_INPUTS)],
                                "output": s.output,
                                "params": [{"name": p.name, "type": p.type,
                                            "required": p.required,
                                            "description": p.description,
                                            "schema": p.json_schema()} for p in s.params]}
                            for k, s in specs.items()})
        return
    lines = []
    for kind, spec in specs.items():
        # A plugin's text, shown, not obeyed (audit EY: an escape sequence and a newline in
        # a description went to the terminal raw)
        lines.append(out.one_line(f"{kind}: {spec.description}"))
        for p in spec.params:
            req = "required" if p.required else "optional"
            rule = _param_rule(p)
            what = out.one_line(p.description) + rule if p.description else rule.lstrip("; ")
            lines.append("    " + out.one_line(f"{p.name} ({p.type}, {req})") + (
                f": {what}" if what else ""))
    with stdout_result():
        out.write_out("".join(line + "\n" for line in lines))


def _param_rule(p: ParamSpec) -> str:
    """What a param's value must be beyond its type, as `kinds` says it."""
    if p.choices:
        return f"; one of {', '.join(p.choices)}"
    if p.low is not None and p.high is not None:
        return f"; {p.low:g} to {p.high:g}"
    if p.low is not None:
        return f"; at least {p.low:g}"
    if p.high is not None:
        return f"; at most {p.high:g}"
    return ""


@app.command()
@handle_errors
@restores_stops
def cancel(
    job_ids: Annotated[list[str] | None, typer.Argument(help="job ids")] = None,
    all_: Annotated[bool, typer.Option(
        "--all", help="cancel every job pending or running now")] = False,
    group: Annotated[str | None, typer.Option(
        "--group", metavar="NAME", show_default=False,
        help="cancel every job of this group (the manifest's `group`) pending or running "
        "now")] = None,
    queue: OwnQueueOpt = None, as_json: JsonOpt = False,
) -> None:
    """Cancel jobs: pending ones at once; running ones are killed by the runner."""
    from renderctl.control import cancel_jobs
    from renderctl.crashpoints import CrashPoints
    from renderctl.errors import UserError
    from renderctl.manifest import GROUP_RE

    if sum((bool(job_ids), all_, group is not None)) != 1:
        raise UserError("name job ids, --all or --group NAME (one of them)")
    if group is not None and not GROUP_RE.fullmatch(group):
        raise UserError(f"--group {group!r}: not a group name (it must match "
                        f"{GROUP_RE.pattern}): no job has it")
    early = defer_stops()
    q = existing_queue(queue, whole=True)
    if job_ids:
        job_ids = unique(job_ids)
        # All or none, like `dead retry`: exit 2 promises nothing changed, and cancel_jobs
        # acts on each id it finds, so every id is looked up first. A job in any folder
        # counts (cancelling a finished one is a harmless "already <state>"); only an id in
        # none is a mistake.
        missing = sorted({j for j in job_ids if q.find(j) is None})
        if missing:
            if as_json:
                with stdout_result():
                    out.print_json({j: unfound_answer(q, j) for j in missing})
            report_unfound(q, missing, "; nothing was cancelled")
            raise typer.Exit(ExitCode.USAGE)
    else:
        # What is pending or running as we look: a job submitted after this is not taken
        # back, one that ends meanwhile is reported as `cancel ID` reports it.
        job_ids = q.live_ids(group)
        if not job_ids:
            # Nothing to do is not an error (as `dead retry --all` of an empty dead/): exit 0.
            if as_json:
                with stdout_result():
                    out.print_json({})
            whose = "no job" if group is None else f"no job of group {group!r}"
            out.err(f"nothing to cancel: {whose} is pending or running")
            return
    results = cancel_jobs(q, job_ids, crash_hook=CrashPoints.from_env())
    told: dict[str, int] = {}
    for r in results:
        told[r.outcome] = told.get(r.outcome, 0) + 1
    with stdout_result("the cancel was made all the same: "
                       + ", ".join(f"{n} {outcome}" for outcome, n in told.items())):
        if as_json:
            out.print_json({r.job_id: r.outcome for r in results})
        else:
            out.write_out("".join(f"{r.job_id}: {r.outcome}\n" for r in results))
    end_if_stopped(early, f"after {len(results)} of the {len(job_ids)} job(s); the rest "
                          "were left as they were" if results else
                          "before cancelling any job; nothing was cancelled")
    gone = [r.job_id for r in results if r.outcome == "not found"]
    if gone:
        # Found above, gone now (its record archived or purged meanwhile): the others were
        # cancelled, so this is not exit 2's "nothing changed".
        out.err("vanished while cancelling: " + ", ".join(gone))
        raise typer.Exit(ExitCode.JOBS_FAILED)


@dead_app.command("list")
@handle_errors
def dead_list(queue: QueueOpt = None, as_json: JsonOpt = False) -> None:
    """Dead-lettered jobs with their last outcome."""
    from renderctl.lifecycle import State

    q = existing_queue(queue)
    rows = []
    for view in q.records(State.DEAD):
        last = view.record.attempts[-1] if view.record.attempts else {}
        rows.append({"id": view.record.spec.id, "attempts": len(view.record.attempts),
                     "outcome": last.get("outcome"), "error": last.get("error"),
                     "reason": view.record.reason})
    with stdout_result():
        if as_json:
            out.print_json(rows)
            return
        for r in rows:
            # One row per job, four tab-separated columns: a multi-line error is escaped. A
            # job dead-lettered before any attempt (it can never fit the memory budget) has
            # no outcome: a dash, as elsewhere in plain output, not Python's "None".
            print(f"{r['id']}\t{r['outcome'] or '-'}\tattempts={r['attempts']}\t"
                  f"{out.one_line(r['error'] or r['reason'] or '-')}")
    if not rows:
        # On stderr: stdout holds rows only, so `dead list | cut -f1` reads no ids here.
        out.err("no dead-lettered jobs")


# `dead retry`'s limits: the retried jobs' own, replaced. No variable or configuration key
# sets them (those are submit's defaults; a job's own limits are changed only when asked).
RetryMemOpt = Annotated[Any, typer.Option(
    "--memory-mb", show_default=False, parser=AS_INT, metavar="<int>",
    help=f"give the jobs this memory ceiling (MB, 1-{MAX_MEMORY_MB}) in place of their own")]
RetryTimeoutOpt = Annotated[Any, typer.Option(
    "--timeout", show_default=False, parser=AS_FLOAT, metavar="<float>",
    help=f"give the jobs this timeout (s, > 0, <= {MAX_TIMEOUT_S:g}) in place of their own")]
RetryAttemptsOpt = Annotated[Any, typer.Option(
    "--max-attempts", show_default=False, parser=AS_INT, metavar="<int>",
    help=f"give the jobs this many attempts (1-{MAX_ATTEMPTS}) in place of their own")]


def retry_changes(memory_mb: Any, timeout: Any, max_attempts: Any) -> dict[str, Any]:
    """The spec fields `dead retry` replaces, each held to the manifest's own check."""
    from renderctl.errors import UserError
    from renderctl.limits import check_max_attempts, check_memory_mb, check_timeout

    changes: dict[str, Any] = {}
    for option, field, value, check, convert in (
            ("--memory-mb", "memory_mb", memory_mb, check_memory_mb, int),
            ("--timeout", "timeout_s", timeout, check_timeout, float),
            ("--max-attempts", "max_attempts", max_attempts, check_max_attempts, int)):
        if value is None:
            continue
        problem = check(value)
        if problem is not None:
            raise UserError(f"{option}: {problem}; nothing was retried")
        changes[field] = convert(value)
    return changes


@dead_app.command("retry")
@handle_errors
@restores_stops
def dead_retry(
    job_ids: Annotated[list[str] | None, typer.Argument(help="job ids")] = None,
    all_: Annotated[bool, typer.Option("--all", help="retry every dead job")] = False,
    memory_mb: RetryMemOpt = None,
    timeout: RetryTimeoutOpt = None,
    max_attempts: RetryAttemptsOpt = None,
    queue: OwnQueueOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Return dead jobs to pending with a fresh attempt budget (history is kept), with new
    limits if given (a job that ran out of memory or time)."""
    from renderctl.crashpoints import CrashPoints
    from renderctl.errors import UserError
    from renderctl.lifecycle import State

    early = defer_stops()
    changes = retry_changes(memory_mb, timeout, max_attempts)
    q = existing_queue(queue, whole=True)
    if all_ and job_ids:
        raise UserError("name job ids or use --all, not both")
    if all_:
        ids = q.job_ids(State.DEAD)
    elif job_ids:
        ids = unique(job_ids)
    else:
        raise UserError("name job ids or use --all")
    # Exit 2 promises nothing changed, and the store retries each id it finds: so every id
    # is looked up first. (A job leaving dead/ meanwhile, by a concurrent retry or purge, is
    # still skipped by the store and reported below.)
    missing = sorted({j for j in ids if not q.has_record(State.DEAD, j)})
    if missing:
        if as_json:
            # As `wait --json` and `cancel --json` refuse: only the ids at fault, each with
            # where it is instead (its state, or `not found`).
            views = {j: q.find(j) for j in missing}
            with stdout_result():
                out.print_json({j: v.state.value if v is not None else unfound_answer(q, j)
                                for j, v in views.items()})
        # One quarantined earlier (by `dead list`) is named with where it went, as `cancel`
        # and `wait` name it, rather than as simply missing.
        said = [f"{j} (its record could not be read and was moved to {kept})"
                if q.find(j) is None and (kept := q.corrupt_copy(j)) is not None else j
                for j in missing]
        raise UserError("not in dead/: " + ", ".join(said) + "; nothing was retried")
    revived = q.dead_retry(ids, crash_hook=CrashPoints.from_env(), changes=changes)
    gone = sorted(set(ids) - set(revived))
    if early.signum is not None:
        # Stopped: most were not reached, and are still dead (said below); vanished are only
        # those that left dead/ meanwhile. `--json` listed every one not reached as vanished,
        # and a script took them as dealt with (audit DV).
        gone = [j for j in gone if not q.has_record(State.DEAD, j)]
    with stdout_result(f"the {len(revived)} job(s) were retried all the same"):
        if as_json:
            out.print_json({"retried": list(revived), "vanished": gone})
        else:
            print(f"retried {len(revived)} job(s)")
    if early.signum is not None:
        gone = []  # (exit 130: the stop is the news)
    end_if_stopped(early, f"after retrying {len(revived)} of the {len(ids)} job(s); the "
                          "rest stay dead")
    if gone:
        out.err("left dead/ while retrying: " + ", ".join(gone))
        raise typer.Exit(ExitCode.JOBS_FAILED)


@dead_app.command("purge")
@handle_errors
@restores_stops
def dead_purge(queue: OwnQueueOpt = None, as_json: JsonOpt = False) -> None:
    """Delete every dead-lettered record."""
    early = defer_stops()
    from renderctl.crashpoints import CrashPoints
    n = existing_queue(queue).dead_purge(crash_hook=CrashPoints.from_env())
    with stdout_result(f"the {n} job(s) were purged all the same"):
        if as_json:
            out.print_json({"purged": n})
        else:
            print(f"purged {n} job(s)")
    end_if_stopped(early, f"after purging {n} job(s); the rest stay dead")


_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_AGE_S = 1000 * 365.25 * 86400
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")
PRUNE_DEFAULT = ("done", "cancelled", "expired")


def parse_age(text: str, option: str) -> float:
    """``90``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` in seconds; UserError otherwise."""
    from renderctl.errors import UserError

    m = _DURATION.fullmatch(text.strip().lower())
    if m is None:
        raise UserError(f"{option}: {text!r} is not an age (examples: 90s, 30m, 12h, 7d, 2w)")
    age = float(m.group(1)) * _UNITS[m.group(2)]
    if age > MAX_AGE_S:  # (and inf, from 400 nines: not a number JSON can print)
        raise UserError(f"{option}: {text.strip()!r} is more than 1000 years")
    return age


@app.command()
@handle_errors
@restores_stops
def prune(
    older_than: Annotated[str, typer.Option(
        "--older-than", help="age at which a finished record goes: 90s, 30m, 12h, 7d, 2w "
                             "(a bare number is seconds)",
        metavar="<age>", show_default=False)],
    states: Annotated[list[str] | None, typer.Option(
        "--state", help="a terminal state to prune (repeatable) [default: done, cancelled, "
                        "expired; dead-lettered jobs only when named]", metavar="<state>",
        show_default=False)
    ] = None,
    job_ids: Annotated[list[str] | None, typer.Argument(
        help="only these jobs (e.g. to render one done job afresh)", show_default=False)
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="count, delete nothing")] = False,
    queue: OwnQueueOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete finished jobs' records older than an age (the queue's history; outputs stay)."""
    from renderctl.errors import UserError
    from renderctl.lifecycle import TERMINAL, State

    age = parse_age(older_than, "--older-than")
    names = list(dict.fromkeys(s.strip().lower() for s in (states or PRUNE_DEFAULT)))
    allowed = sorted(s.value for s in TERMINAL)
    bad = [s for s in names if s not in allowed]
    if bad:
        what = "is not a finished state" if len(bad) == 1 else "are not finished states"
        raise UserError(f"--state: {', '.join(map(repr, bad))} {what} "
                        f"(one of {', '.join(allowed)})")
    early = defer_stops()  # (first: the queue's lock waits end on a stop it records)
    q = existing_queue(queue)
    ids = unique(job_ids) if job_ids else None
    if ids is not None:
        # As `dead retry ID`: an id in none of the folders named is a usage error, and
        # nothing is pruned (exit 2 promises nothing changed).
        elsewhere = {}
        for j in ids:
            if not any(q.has_record(State(s), j) for s in names):
                view = q.find(j)
                elsewhere[j] = view.state.value if view is not None else unfound_answer(q, j)
        if elsewhere:
            if as_json:
                with stdout_result():
                    out.print_json(elsewhere)
            where = "/, ".join(names) + "/"
            raise UserError(f"not in {where}: " + ", ".join(
                f"{j} ({state})" for j, state in sorted(elsewhere.items()))
                + "; nothing was pruned")
    pruned: set[str] = set()
    from renderctl.crashpoints import CrashPoints

    counts = q.prune([State(s) for s in names], age, dry_run=dry_run, only=ids,
                     pruned_ids=pruned if ids is not None else None,  # (not a million)
                     crash_hook=CrashPoints.from_env())
    total = sum(counts.values())
    # Named and left (or, in a dry run, that would be): it finished less than the age ago,
    # a runner killed mid-commit left a running copy of it for recovery, or it left the
    # folder meanwhile (a `dead retry` between the look above and the prune; review CM).
    kept = [] if ids is None or early.signum is not None else [j for j in ids
                                                                  if j not in pruned]
    with stdout_result("" if dry_run else f"the {total} record(s) were pruned all the same"):
        if as_json:
            out.print_json({"pruned": counts, "total": total, "dry_run": dry_run,
                            "older_than_s": age, **({"kept": kept} if ids else {})})
        else:
            detail = ", ".join(f"{s} {n}" for s, n in counts.items())
            verb = "would prune" if dry_run else "pruned"
            print(f"{verb} {total} record(s) older than {older_than.strip()}: {detail}")
    end_if_stopped(early, f"after {'counting' if dry_run else 'pruning'} {total} "
                   "record(s); the rest stay")
    if kept:
        out.err(f"{'would not prune' if dry_run else 'not pruned'} (finished less than "
                f"{older_than.strip()} ago, left for recovery by a runner that died, or "
                "gone from the folder meanwhile): " + ", ".join(kept))
        raise typer.Exit(ExitCode.JOBS_FAILED)


@app.command()
@handle_errors
def top(queue: QueueOpt = None,
        once: Annotated[bool, typer.Option("--once", help="render one frame and exit")] = False,
        ) -> None:
    """Live dashboard of a queue that another process runs (Ctrl-C to leave)."""
    from rich.console import Console

    from renderctl.cli.top import run_top

    q = existing_queue(queue, report_corrupt=False)  # its frames count corrupt/
    # A terminal gets the live view; NO_COLOR keeps it, without colour.
    console = (Console(highlight=False, emoji=False, no_color=out.no_color()) if out.is_tty()
               else out.console())
    with stdout_result():
        run_top(q, console, once=once)


@app.command()
@handle_errors
def metrics(queue: QueueOpt = None) -> None:
    """Print the queue's metrics in Prometheus text format (0.0.4)."""
    from renderctl.metrics import collect, exposition, load_totals, save_totals

    q = existing_queue(queue)
    totals = load_totals(q)
    text = exposition(collect(q, totals))
    if q.settled:  # (root in a user's queue writes nothing there: not even this cache)
        save_totals(q, totals)
    with stdout_result():
        sys.stdout.write(text)


def wait_timeout(value: Any) -> float | None:
    """`wait --timeout`, refused in renderctl's one line as every other option's bad value
    is (click's range check answered in its own words, and `--json` got only "see stderr":
    audit DB). NaN passes a range check and compares false with every deadline: it would
    never give up, which is not what anyone typing a timeout asked for. (A callback, as the
    queue's check is: the first culprit on the command line is named.)"""
    if value is None:
        return None
    if not isinstance(value, float) or value != value or value < 0:
        out.err(f"--timeout: must be a number of seconds >= 0, got {value!r}")
        raise typer.Exit(ExitCode.USAGE)
    return value


WAIT_POLL_S = 0.05  # how often the event log is read for what it gained
WAIT_RECHECK_S = 1.0  # folders re-read even if the log did not grow (it is not fsynced)
WAIT_SWEEP_SHARE = 0.1  # of the wait's time the full rechecks may take, at most
@app.command()
@handle_errors
def wait(
    job_ids: Annotated[list[str], typer.Argument(help="job ids")],
    queue: QueueOpt = None,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", show_default=False, callback=wait_timeout, parser=AS_FLOAT,
        metavar="<seconds>",
        help="give up after S seconds (exit 75) [default: wait as long as it takes]; not "
        "the jobs' timeout: `timeout` in renderctl.toml and RENDERCTL_TIMEOUT do not set "
        "it")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Block until these jobs are terminal; exit 0 if all completed, 1 if any did not.

    An unknown id exits 2 at once; a timeout exits 75 (try again later). A job whose
    record is quarantined, before or during the wait, ends the wait for it as `corrupt`
    (one deleted meanwhile: `not found`): it did not complete.
    """
    import time

    from renderctl.errors import JobNotFound
    from renderctl.lifecycle import TERMINAL, State

    # From the start: the ids' look-up below is not free (20,000 ids: ~2 s), and a
    # --timeout 5 that began after it ended 2 s late.
    deadline = None if timeout is None else time.monotonic() + timeout
    job_ids = unique(job_ids)
    q = existing_queue(queue, whole=True)
    unknown: list[tuple[str, JobNotFound]] = []
    damaged: list[tuple[str, JobNotFound]] = []
    for jid in job_ids:
        try:
            q.get(jid)
        except JobNotFound as exc:
            (damaged if exc.quarantined else unknown).append((jid, exc))
    if unknown:
        if as_json:  # the shape of `cancel --json` refusing: only the ids not found
            with stdout_result():
                out.print_json({j: "not found" for j, _ in unknown})
        report_unfound(q, [j for j, _ in unknown])
        raise typer.Exit(ExitCode.USAGE)
    # Accepted, and its record is damaged (found so now, or earlier): it will never finish,
    # as one quarantined while waited for. Not an unknown id.
    final: dict[str, str] = {}
    for jid, why in damaged:
        final[jid] = "corrupt"
        out.err(f"{why}; it will not finish")
    unseen: set[str] = set()  # found in no folder at the last recheck
    # In the order jobs move (see Queue._locate_many): a job moving on while we look is
    # still seen; one moved back (a retry) may be missed once, hence two rechecks.
    folders = (State.PENDING, State.RUNNING, *TERMINAL)

    def settle(ids: Iterable[str], *, recheck: bool) -> None:
        for jid in ids:
            if jid in final:
                continue
            for s in TERMINAL:
                if q.record_path(s, jid).exists():
                    final[jid] = s.value
                    break
            else:
                if recheck:
                    vanished(jid)

    def vanished(jid: str) -> None:
        """A job whose record left every folder (moved to corrupt/ when found damaged, or
        deleted by hand) never reaches a terminal one: waiting for it hung for good."""
        if any(q.record_path(s, jid).exists() for s in folders):
            unseen.discard(jid)
        elif jid not in unseen:
            unseen.add(jid)
        else:
            try:
                q.get(jid)
            except JobNotFound as exc:
                final[jid] = "corrupt" if exc.quarantined else "not found"
                out.err(f"{exc}; it will not finish")

    # A terminal event is appended after its rename: a job named by a new line of the log
    # is looked at. Every job is looked at only on the recheck, once a second, or less
    # often when that look is long: every job on every line the log gained made waiting
    # for a batch quadratic (40,000 ids under a live runner: a core, 160,000 stats a poll).
    from renderctl.events import LogTail

    tail = LogTail(q.events.path)  # (before the first look: nothing falls between)
    wanted = set(job_ids)
    next_check = 0.0
    looked_for_runner = False

    def synced() -> None:
        """Protects against: answering for a state its runner has not synced yet (it places
        the record, then syncs): a power loss after our answer would undo it, and a job
        reported done would run again and publish anew. Its output's folder too, on
        another disk."""
        from renderctl.fsutil import sync_filesystems

        out_folders: set[Path] = set()
        for jid, state in final.items():
            if state == State.DONE.value:
                # Read where it was found (find() would look through the folders again).
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    rec = q.read_record(q.record_path(State.DONE, jid))
                    out_folders.add(rec.spec.output_path.parent)
        sync_filesystems([q.path, *out_folders])

    def answer_now() -> None:
        """`--json`: every id with the state it is in now (terminal ones as on success, the
        rest `pending` or `running`), for a wait that gives up."""
        if final:
            try:
                synced()  # (review DZ: a timeout's or a stop's answer was not)
            except OSError as exc:
                # Said, and the answer given all the same (review EB: a failing sync on the
                # stop path printed nothing, the symptom that answer was made for).
                out.err(f"warning: could not sync the states below: {os_error_message(exc)}")
        now_in = {j: getattr(q.find(j), "state", None) for j in job_ids if j not in final}
        with stdout_result():
            out.print_json({j: final.get(j) or getattr(now_in[j], "value", "not found")
                            for j in job_ids})

    try:
        while True:
            now = time.monotonic()
            news = tail.news()
            if news is None or now >= next_check:
                settle(job_ids, recheck=now >= next_check)
                cost = time.monotonic() - now
                next_check = now + max(WAIT_RECHECK_S, cost / WAIT_SWEEP_SHARE)
            elif news:
                settle([jid for jid in news if jid in wanted], recheck=False)
            if len(final) == len(job_ids):
                break
            if not looked_for_runner:
                # Once: a wait on a queue nobody serves blocked without a word (audit DM). It
                # waits on all the same (a runner may be started next, by cron or by hand).
                looked_for_runner = True
                if q.runner_info() is None:
                    out.err(f"note: no runner serves {q.path} now; waiting for one "
                            "(`renderctl run` starts one)")
            if deadline is not None and now >= deadline:
                left = [j for j in job_ids if j not in final]
                if as_json:
                    answer_now()  # (exit 75 says the wait gave up)
                out.err(f"timed out after {timeout:g}s; not terminal yet: {', '.join(left)}")
                raise typer.Exit(ExitCode.TEMPFAIL)
            time.sleep(WAIT_POLL_S)
    except (KeyboardInterrupt, SignalExit):
        # Stopped (Ctrl-C, SIGTERM): answered as a timeout answers, then exit 128 + n: a
        # `wait --json | jq` read nothing at all (audit DV).
        if as_json:
            with contextlib.suppress(Exception):
                answer_now()
        raise
    synced()
    with stdout_result():
        if as_json:
            out.print_json({jid: final[jid] for jid in job_ids})  # as given, as lines are
        else:
            for jid in job_ids:
                print(f"{jid}: {final[jid]}")
    failed = any(v != State.DONE.value for v in final.values())
    raise typer.Exit(ExitCode.JOBS_FAILED if failed else ExitCode.OK)


def main() -> None:
    # (Done already when this runs from the script's entry point, which does both before
    # importing this module; `python -m renderctl.cli.app` does them here.)
    fill_closed_standard_fds()
    keep_owner_bits()
    undo_locale_coercion()
    workers_need_no_main()
    # (SIGINT is Python's KeyboardInterrupt here, which each command turns into 130.)
    stops_end_quietly(sys.argv, (signal.SIGTERM, signal.SIGHUP))
    start_fork_server_early(sys.argv)
    if isinstance(sys.stdout, io.TextIOWrapper):
        # A stdout that is not UTF-8 (an ISO-8859 locale, PYTHONIOENCODING) cannot take a
        # job's CJK error text or an emoji id: escaped, as `run` escapes its lines, where
        # `show`, `dead list` and `top` ended in a UnicodeEncodeError traceback (audit AZ).
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        # One name however started (`python -m renderctl` included): the completion a
        # user installs is for the `renderctl` command ("python -m renderctl" made a
        # script bash rejects), and messages and usage lines read the same.
        app(prog_name="renderctl")
    except KeyboardInterrupt:
        sys.exit(ExitCode.SIGINT)
    except BrokenPipeError:
        # A closed pipe outside handle_errors. (Not SIGPIPE=SIG_DFL: the runner writes to
        # worker pipes that may close under it.)
        out.silence_stdout()
        sys.exit(0)
    except SystemExit as exc:
        # Click's own EPIPE handling (its `--help` output, say) exits 1 after wrapping
        # stdout: a `set -o pipefail` script's `renderctl --help | grep -q x` would fail.
        # (By name: typer vendors its own copy of click.)
        if exc.code == 1 and type(sys.stdout).__name__ == "PacifyFlushWrapper":
            sys.exit(0)
        if exc.code in out.REFUSALS and (command := json_command(sys.argv[1:])):
            with contextlib.suppress(OSError):
                out.json_refusal(exc.code, command)
        exit_without_teardown(exc.code)
        raise


def json_command(args: list[str]) -> str | None:
    """The command (``dead retry`` as ``dead``) if ``args`` ask it for ``--json`` and it
    has that option; None otherwise (a typo's `--json` gets no document it never had)."""
    options = args[:args.index("--")] if "--" in args else args
    if "--json" not in options:
        return None
    words = [a for a in options if not a.startswith("-")]
    cmd: Any = typer.main.get_command(app)
    for word in words[:2]:
        sub = getattr(cmd, "commands", {}).get(word)
        if sub is None:
            break
        cmd = sub
    if not any("--json" in getattr(p, "opts", ()) for p in getattr(cmd, "params", ())):
        return None
    return words[0]


def exit_without_teardown(code: object) -> None:
    """End the process with ``code`` now, skipping the interpreter's teardown, when nothing
    is left that the teardown would do for us; else return (the caller exits normally).

    The teardown frees every imported module one object at a time: 15-50 ms here for a
    command (more after `run`, which has the runner and the store loaded), on every
    `status` in a watch loop and every `submit` in a script's loop, and after the summary
    a script waiting for `run` to exit. What it would do that matters is done first: the
    exit hooks (multiprocessing's removes the fork server's socket folder) and the flush of
    stdout and stderr. Not taken with another thread still running (the normal exit waits
    for it), for an exit status that is not a number (the interpreter prints it), or when
    the flush fails (the normal exit reports that as it always has, status 120).
    """
    if not (code is None or isinstance(code, int)):
        return
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        return
    import atexit

    try:
        _flush_std()
        atexit._run_exitfuncs()
        _flush_std()  # what an exit hook printed
    except Exception:
        return
    os._exit(code or 0)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # (started with the descriptor closed, not through launch)
            stream.flush()


if __name__ == "__main__":
    main()
