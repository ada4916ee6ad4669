"""What a python job can change in the worker process it runs in, and how it is put back.

A ``python`` job is called inside its worker, so whatever process-wide state it changes
would reach the next job in that worker. The worker resets the obvious (cwd, environment,
reportlab/pypdf settings, sys.path, the job's own modules: see worker.py); this module
covers the rest of what a job, or a library it calls, plausibly changes: signal dispositions
and the signal mask, interval timers, the umask, resource limits, the CPU affinity and nice
value, the time zone, the locale, the thread switch interval, ``sys.stdin/stdout/stderr``
(swapped, closed or detached), the signal wakeup descriptor, asyncio's event loop policy,
``sys.argv``, the interpreter's hooks (except, display, unraisable, breakpoint, trace,
profile), the garbage collector's settings, the int/str digit limit, the decimal context,
the socket default timeout, the warnings filters, the logging configuration (loggers a job
created go back to blank; a library's, as its import left them: it stays imported),
``random``'s seed, ``csv.field_size_limit``, variables set below ``os.environ`` with
``os.putenv``, ``os.environ`` itself (rebound), ``sys.meta_path`` and ``sys.path_hooks``,
the scheduling policy, the thread stack size, faulthandler's watchdog and handlers, and the
builtins
(a name a job added to ``builtins`` is a global of every module in every later job; one it
replaced, ``open`` or ``print``, is everyone's). A job that
leaves a thread running, or a limit or priority it cannot be given back, cannot be undone:
the worker retires instead, as it does after an audit hook (which cannot be removed),
no_new_privs, a fork handler (``os.register_at_fork``, but a library's), or a change of the
process's user or groups. Monkeypatched library
functions are not detected (that would mean comparing every module's namespace per job); a
job that needs that isolation is a
``command`` job, or runs with ``--max-jobs-per-worker 1``. Nor can a job that first imports a
library and, in the same job, sets that library's loggers or filters its warning categories
be told from the library's own set-up at import: that stays, as the library does.

Also fd 0 and the standard streams' settings, gc's debug flags and callbacks, tracemalloc,
``sys.dont_write_bytecode`` and the dlopen flags, finders cached per ``sys.path`` entry that
no standard hook made, and logging's record factory, logger class and level names (audit
BY: each reached the next job; a cached finder of a job's ran its code for the next job's
imports, which published a forged output as completed). Modules a job replaced in
``sys.modules`` are put back by the worker (``Worker._restore_modules``).

Cost on the common path (nothing changed): ~32 us per job here (27 before audit BY's
additions, ~17 before the import machinery, scheduling policy, identity and no_new_privs
were checked; only after jobs that run the user's code in the worker: python callables,
plugin renderers). Signal handlers and the C environment are compared only after a job
called ``signal.signal`` (or ``_signal.signal``), ``os.putenv``/``unsetenv`` (or
``posix``'s) or ``random.seed``/``setstate`` (the functions are wrapped to say so):
comparing 60 handlers every time cost ~30 us. Resource limits and scheduling are
compared after every job that ran the user's code, commands too (~11 us): a process the
job started can change them from outside (``prlimit --pid``, ``renice``, ``taskset``),
which no wrapper sees. Other changes made below Python (ctypes, C extensions) are not seen.
"""

from __future__ import annotations

import _signal
import builtins
import contextlib
import csv
import ctypes
import decimal
import faulthandler
import gc
import io
import locale
import logging
import operator
import os
import posix
import random
import resource
import signal
import socket
import sys
import threading
import time
import tracemalloc
import warnings
from collections.abc import Callable, Mapping
from importlib.machinery import FileFinder
from typing import Any

from renderctl.fsutil import libc

_RLIMITS = tuple(getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_"))
_TIMERS = (signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)  # ITIMER_REAL: signal.alarm(0)


def _tz() -> tuple[Any, ...]:
    return time.tzname, time.timezone, time.altzone, time.daylight


def _hooks() -> tuple[Any, ...]:
    return (sys.excepthook, sys.displayhook, sys.unraisablehook, sys.breakpointhook,
            sys.gettrace(), sys.getprofile(), threading.excepthook, threading.gettrace(),
            threading.getprofile())


def _set_hooks(hooks: tuple[Any, ...]) -> None:
    (sys.excepthook, sys.displayhook, sys.unraisablehook, sys.breakpointhook, trace, profile,
     threading.excepthook, thread_trace, thread_profile) = hooks
    sys.settrace(trace)
    sys.setprofile(profile)
    threading.settrace(thread_trace)
    threading.setprofile(thread_profile)


_DECIMAL_FIELDS = ("prec", "rounding", "Emin", "Emax", "capitals", "clamp")


def _decimal_fields(ctx: decimal.Context) -> tuple[Any, ...]:
    return (*(getattr(ctx, f) for f in _DECIMAL_FIELDS), dict(ctx.traps))


def _logger_state(lg: logging.Logger) -> tuple[Any, ...]:
    return lg.level, tuple(lg.handlers), tuple(lg.filters), lg.propagate, lg.disabled


def _loggers() -> dict[str, logging.Logger]:
    found = {name: lg for name, lg in logging.Logger.manager.loggerDict.items()
             if isinstance(lg, logging.Logger)}
    found[""] = logging.root
    return found


def restore_mapping(live: dict[Any, Any], then: Mapping[Any, Any]) -> None:
    """Make the process-wide registry ``live`` hold exactly ``then`` again (same keys, the
    very same objects), touching only what differs: entries are removed or put back one by
    one, never cleared wholesale (``live`` may be the builtins every running frame reads).
    Untouched, the check is one C-level pass over the values (~2 us for the builtins)."""
    if live.keys() == then.keys() and all(map(operator.is_, live.values(), then.values())):
        return
    for key in [k for k in live if k not in then]:
        del live[key]
    for key, value in then.items():
        if live.get(key) is not value:
            live[key] = value


class Baseline:
    """The worker's state as every job must find it, captured once at worker start."""

    def __init__(self, library_roots: tuple[str, ...] = ()) -> None:
        self.library_roots = library_roots  # where libraries' modules are (see restore)
        # Which modules are the user's code even where libraries are (the worker says).
        self.user_code: Callable[[str], bool] = lambda name: False
        self.umask = os.umask(0o022)
        os.umask(self.umask)
        self.signals: dict[int, Any] = {}
        for sig in signal.valid_signals():
            if sig in (signal.SIGKILL, signal.SIGSTOP):
                continue
            handler = signal.getsignal(sig)
            if handler is not None:  # None: installed outside Python; not ours to judge
                self.signals[sig] = handler
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        self.rlimits = {r: resource.getrlimit(r) for r in _RLIMITS}
        self.tz = _tz()
        self.locale = locale.setlocale(locale.LC_ALL)
        self.switch = sys.getswitchinterval()
        self.stdio = (sys.stdin, sys.stdout, sys.stderr)
        self.argv_list = sys.argv
        self.argv = list(sys.argv)
        self.hooks = _hooks()
        self.gc = (gc.isenabled(), gc.get_threshold())
        # A job's gc.set_debug(DEBUG_SAVEALL) kept every later job's garbage: one that ran
        # in 80 MB alone was killed at its 200 MB ceiling after it (audit BY).
        self.gc_debug = gc.get_debug()
        self.gc_callbacks = list(gc.callbacks)
        self.tracing = tracemalloc.is_tracing()  # (left on, it slowed and charged the next)
        self.flags = (sys.dont_write_bytecode, sys.getdlopenflags())
        # The standard streams' settings: a job's sys.stdout.reconfigure(encoding="ascii")
        # made the next job's print() of an accent a UnicodeEncodeError (audit BY).
        self.stream_settings = tuple(_stream_settings(s) for s in self.stdio)
        # fd 0, kept: a job that dup2()s a file over it handed that file to the next job's
        # reads of stdin (audit BY). (Made before the worker lists its own descriptors.)
        self.stdin_ident = _ident(0)
        self.stdin_copy = os.dup(0) if self.stdin_ident is not None else -1
        # Finders cached per sys.path entry: a job's own one there ran its code for every
        # later job's imports from that folder (audit BY: a forged output, completed).
        self.finders = dict(sys.path_importer_cache)
        self.standard_loaders = _standard_loaders()
        # Logging's process-wide factories and names: a job's record factory saw every
        # later job's log records (audit BY).
        self.logging_globals = _logging_globals()
        self.int_digits = sys.get_int_max_str_digits()
        self.affinity = os.sched_getaffinity(0)
        self.priority = os.getpriority(os.PRIO_PROCESS, 0)
        self.scheduler = _scheduler()
        self.stack_size = threading.stack_size()
        # Import machinery: a finder or hook a job installs would see (and could replace)
        # every later job's imports. The lists are restored in place (importlib holds them).
        self.meta_path_list, self.path_hooks_list = sys.meta_path, sys.path_hooks
        self.meta_path, self.path_hooks = list(sys.meta_path), list(sys.path_hooks)
        # What was loaded at worker start (importlib, the worker's own): a hook made from
        # these (FileFinder.path_hook's closure) is a job's, not a library's.
        self.initial_modules = frozenset(sys.modules)
        self.environ = os.environ
        self.faulthandler = faulthandler.is_enabled()
        # Who the worker is: a job that gives up root (or changes groups) leaves a worker that
        # can no longer keep its own folders; nothing can give the identity back.
        self.identity = _identity()
        self.no_new_privs = _no_new_privs()
        # Per-process flags only prctl() sets, below what Python can watch (audit EU): a job
        # that cleared the subreaper flag left its worker handing every later job's
        # double-forked helper to the runner, which killed it mid-job as an orphan; one that
        # cleared dumpable or renamed the process left that to every later job.
        self.process_flags = _process_flags()
        self.locked_in = _locked_in()
        self.outside_state = _outside_state()
        # The context a job finds is a fresh copy each time: a job's arithmetic also sets
        # the context's flags, which the next job must not inherit either.
        self.decimal = decimal.getcontext().copy()
        self.decimal_default = _decimal_fields(decimal.DefaultContext)
        self.socket_timeout = socket.getdefaulttimeout()
        self.warnings_list: list[Any] = warnings.filters  # type: ignore[assignment]
        self.warnings = (list(warnings.filters), warnings.showwarning, warnings.formatwarning)
        self.logging_disable = logging.root.manager.disable
        self.loggers = {name: (lg, _logger_state(lg)) for name, lg in _loggers().items()}
        self.builtins = dict(vars(builtins))
        # Process-wide: lowered, a later report's valid CSV was `invalid_input` ("field
        # larger than field limit"); raised, an oversized field got through.
        self.csv_field_limit = csv.field_size_limit()
        self.touched: set[str] = set()  # which of the watched kinds a job changed
        for name in ("putenv", "unsetenv"):
            # os.environ calls these too (keeping its own mapping in step): only a call from
            # anywhere else changes the C environment alone, which subprocesses inherit.
            # The same functions are posix's, where a job reaches them past os (audit BY).
            self._watch(os, name, "environ", unless_from="os")
            self._watch(posix, name, "environ", unless_from="os")
        self._watch(signal, "signal", "signals")
        self._watch(_signal, "signal", "signals")  # (signal.signal's own, reached directly)
        for name in ("seed", "setstate"):
            self._watch(random, name, "random")
        for name in ("enable", "dump_traceback_later", "register"):
            # A pending dump_traceback_later(exit=True) killed the next job in the worker
            # (its watchdog is a C thread, not one threads_left() counts).
            self._watch(faulthandler, name, "faulthandler")
        # An audit hook cannot be removed, and it sees every later job's opens and imports.
        self._watch(sys, "addaudithook", "audithook")
        # Nor can a fork handler, which ran in every later fork of the worker: a command
        # job's child (before its exec) exited 7 by a handler an earlier job left, every
        # attempt, and a later job's multiprocessing pool broke (audit CD). One a library
        # registers (concurrent.futures.thread as it is imported) stays, as the library does.
        for module in (os, posix):
            self._watch(module, "register_at_fork", "atfork", unless_library=True)
        # gc.unfreeze(): every later collection walks the worker's heap (25-40 ms), and under
        # fork copies the runner's pages into the job's slot (audit EU). Watched, not
        # counted: gc.get_freeze_count() walks the frozen list, ~1 ms here (review ET).
        self._watch(gc, "unfreeze", "unfreeze")

    def _watch(self, module: Any, name: str, kind: str, unless_from: str = "",
               unless_library: bool = False) -> None:
        real: Callable[..., Any] = getattr(module, name)

        def watched(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals
            exempt = (unless_from and caller.get("__name__") == unless_from) or (
                unless_library and str(caller.get("__file__")).startswith(self.library_roots)
                and not self.user_code(str(caller.get("__name__"))))
            if not exempt:
                self.touched.add(kind)
            return real(*args, **kwargs)

        setattr(module, name, watched)

    def restore(self, *, libraries_loaded: bool = False) -> list[str]:
        """Put everything back (call once os.environ is the job's); returns what could not be.

        What a library sets up as it is imported stays, as the library stays loaded and
        would not set it up again for a later job (review CA: undone, a later job's logger
        of pip's had no .verbose()): a logger class, record factory or gc callback defined
        in a library's module (``library_roots``), and, when the job imported a library
        (``libraries_loaded``), logging's level names. The rest is the job's, put back."""
        problems: list[str] = []
        os.umask(self.umask)
        signal.alarm(0)
        for timer in _TIMERS:
            if signal.getitimer(timer) != (0.0, 0.0):
                signal.setitimer(timer, 0)
        if "signals" in self.touched:
            for sig, handler in self.signals.items():
                if signal.getsignal(sig) is not handler:
                    with contextlib.suppress(OSError, ValueError):
                        signal.signal(sig, handler)
        # After the handlers: a signal the job blocked and left pending is delivered now to
        # the worker's handler (or default), not to the job's.
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
        # Whether or not it called setrlimit: a process it started can change ours too.
        problems.extend(self._restore_rlimits())
        if _tz() != self.tz:
            time.tzset()
        if locale.setlocale(locale.LC_ALL) != self.locale:
            locale.setlocale(locale.LC_ALL, self.locale)
        if sys.getswitchinterval() != self.switch:
            sys.setswitchinterval(self.switch)
        if (sys.stdin, sys.stdout, sys.stderr) != self.stdio:
            sys.stdin, sys.stdout, sys.stderr = self.stdio
        if not all(map(_usable, self.stdio)):
            self._reopen_stdio()
        if "environ" in self.touched:
            _c_environ_match(os.environ)
        if "random" in self.touched:
            random.seed()  # what the worker had: unpredictable, not the job's sequence
        sys.argv = self.argv_list
        if sys.argv != self.argv:
            sys.argv[:] = self.argv
        if _hooks() != self.hooks:
            _set_hooks(self.hooks)
        if (gc.isenabled(), gc.get_threshold()) != self.gc:
            gc.set_threshold(*self.gc[1])
            (gc.enable if self.gc[0] else gc.disable)()
        if gc.get_debug() != self.gc_debug:
            gc.set_debug(self.gc_debug)
            gc.garbage.clear()  # what DEBUG_SAVEALL kept of the job's
        if gc.callbacks != self.gc_callbacks:
            known = set(map(id, self.gc_callbacks))
            self.gc_callbacks += [c for c in gc.callbacks
                                  if id(c) not in known and self.from_library(c)]
            gc.callbacks[:] = self.gc_callbacks
        if tracemalloc.is_tracing() != self.tracing:
            (tracemalloc.start if self.tracing else tracemalloc.stop)()
        if (sys.dont_write_bytecode, sys.getdlopenflags()) != self.flags:
            sys.dont_write_bytecode = self.flags[0]
            sys.setdlopenflags(self.flags[1])
        for stream, settings in zip(self.stdio, self.stream_settings, strict=True):
            if settings is not None and _stream_settings(stream) != settings:
                text: Any = stream
                with contextlib.suppress(Exception):  # a stream the job closed
                    text.reconfigure(encoding=settings[0], errors=settings[1],
                                     line_buffering=settings[2], write_through=settings[3])
        if self.stdin_copy >= 0 and _ident(0) != self.stdin_ident:
            with contextlib.suppress(OSError):
                os.dup2(self.stdin_copy, 0)
        if sys.get_int_max_str_digits() != self.int_digits:
            sys.set_int_max_str_digits(self.int_digits)
        problems.extend(self._restore_scheduling())
        # (After the nice value: an I/O priority never set is read as one derived from it.)
        problems.extend(self._restore_outside())
        problems.extend(self._restore_interpreter())
        decimal.setcontext(self.decimal.copy())
        if _decimal_fields(decimal.DefaultContext) != self.decimal_default:
            *fields, traps = self.decimal_default
            for name, value in zip(_DECIMAL_FIELDS, fields, strict=True):
                setattr(decimal.DefaultContext, name, value)
            decimal.DefaultContext.traps.update(traps)
        # None, as the worker set at its start: left by a job, the descriptor's number was
        # the next job's output file, and a signal it handled wrote a byte into it (audit
        # DL: "hello \nworld" published).
        signal.set_wakeup_fd(-1)
        aio = sys.modules.get("asyncio")
        if aio is not None and aio.events._event_loop_policy is not None:
            # The current event loop is the policy's, process-wide: after a job's
            # asyncio.run() the next job's get_event_loop() raised "There is no current
            # event loop" (audit DL). A fresh policy of the same class, if it is a
            # library's (uvloop's, set at its import, stays), else the default one.
            policy = type(aio.events._event_loop_policy)
            fresh = policy.__module__.startswith("asyncio.") or self.from_library(policy)
            aio.set_event_loop_policy(policy() if fresh else None)
        if socket.getdefaulttimeout() != self.socket_timeout:
            socket.setdefaulttimeout(self.socket_timeout)
        self._restore_warnings()
        self._restore_logging(libraries_loaded)
        self._restore_builtins()
        if csv.field_size_limit() != self.csv_field_limit:
            csv.field_size_limit(self.csv_field_limit)
        self.touched.clear()
        return problems

    def _reopen_stdio(self) -> None:
        """Fresh standard streams over fds 0-2 in place of those a job closed or detached
        (``sys.stdout = TextIOWrapper(sys.stdout.detach())``, a common idiom): the next
        job's print() raised, and the worker's own flush as that job began killed it, the
        job charged with the death (audit DL). ``sys.__stdout__`` and the others too, where
        they were the same object (a job may put those back)."""
        fresh = []
        for fd, (stream, settings) in enumerate(zip(self.stdio, self.stream_settings,
                                                    strict=True)):
            if _usable(stream):
                fresh.append(stream)
                continue
            encoding, errors, line_buffering, write_through = settings or (
                None, None, False, False)
            new = io.TextIOWrapper(open(fd, "rb" if fd == 0 else "wb",  # noqa: SIM115
                                        closefd=False),
                                   encoding=encoding, errors=errors,
                                   line_buffering=line_buffering,
                                   write_through=write_through)
            for name in ("__stdin__", "__stdout__", "__stderr__"):
                if getattr(sys, name) is stream:
                    setattr(sys, name, new)
            fresh.append(new)
        self.stdio = (fresh[0], fresh[1], fresh[2])
        sys.stdin, sys.stdout, sys.stderr = self.stdio

    def restore_environ(self) -> None:
        """os.environ itself, if a job rebound it (to a plain dict, say: the worker's own
        resetting of the environment, and every later job's, would reach no subprocess).
        Called before anything sets the next job's environment."""
        if os.environ is not self.environ:
            os.environ = self.environ  # noqa: B003  (the mapping, not the C environment)
            self.touched.add("environ")  # what the job put there: the C one is compared

    def _restore_builtins(self) -> None:
        restore_mapping(vars(builtins), self.builtins)

    def _restore_interpreter(self) -> list[str]:
        problems: list[str] = []
        if threading.stack_size() != self.stack_size:
            threading.stack_size(self.stack_size)
        _restore_list(self.meta_path_list, self.meta_path, self.initial_modules)
        sys.meta_path = self.meta_path_list
        if _restore_list(self.path_hooks_list, self.path_hooks, self.initial_modules):
            sys.path_importer_cache.clear()  # finders the job's hooks made
        # A finder cached since, by a standard hook or not: kept only if it is what the
        # standard hook makes (a FileFinder with the standard loaders, or None); a job's
        # own (its class, or a FileFinder with a loader of its own: review CA) is dropped,
        # and the hooks make a fresh one when it is needed (~5 us). A library's hook's too:
        # its hook stays (path_hooks), and makes its finder again.
        cache = sys.path_importer_cache
        if cache != self.finders:  # (~3 us: the common case, nothing cached since)
            for entry, finder in list(cache.items()):
                before = self.finders.get(entry)
                if before is finder:
                    continue
                # Kept only as the standard hook makes it: a FileFinder of this very
                # entry with the standard loaders (one of another folder under the
                # stdlib's entry served a job's file for `import colorsys`: review CC),
                # or None for a new entry; a baseline entry the job replaced, even with
                # None (the next job's `import pypdf` failed), gets its finder back.
                if before is not None:
                    cache[entry] = before
                elif finder is not None and not (
                        type(finder) is FileFinder
                        and getattr(finder, "_loaders", None) == self.standard_loaders
                        and getattr(finder, "path", None) == _finder_path(entry)):
                    del cache[entry]
            self.finders = dict(cache)
        sys.path_hooks = self.path_hooks_list
        if "faulthandler" in self.touched:
            faulthandler.cancel_dump_traceback_later()
            for sig in signal.valid_signals():
                with contextlib.suppress(ValueError, OSError, RuntimeError):
                    faulthandler.unregister(sig)
            # Enabled again even if it still is: the job may have pointed it at a file it
            # then closed, whose descriptor number a later job's file would get.
            (faulthandler.enable if self.faulthandler else faulthandler.disable)()
        if "audithook" in self.touched:
            problems.append("the job added an audit hook, which cannot be removed")
        if "unfreeze" in self.touched:
            problems.append("the job unfroze its worker's heap (gc.unfreeze)")
        if "atfork" in self.touched:
            problems.append("the job registered a fork handler (os.register_at_fork), which "
                            "cannot be removed")
        if _identity() != self.identity:
            problems.append("the job changed its worker's user or groups")
        if _no_new_privs() != self.no_new_privs:
            problems.append("the job set no_new_privs on its worker, which cannot be undone")
        if _process_flags() != self.process_flags and not _set_process_flags(
                self.process_flags):
            problems.append("the job changed its worker's process flags (prctl), which "
                            "could not be put back")
        if _locked_in() != self.locked_in:
            problems.append("the job set a seccomp filter or securebits on its worker, "
                            "which cannot be undone")
        return problems

    def restore_from_outside(self) -> list[str]:
        """After a job that ran no code in this process (a command): what its processes can
        still change here from outside, by pid (``prlimit --pid $PPID``, ``renice``,
        ``taskset``): resource limits and scheduling (~15 us). A command that lowered its
        worker's open-file limit to 20 left the worker unable to set the next job's memory
        ceiling: exit 74, the run halted, at every run until that job was dead."""
        return self._restore_rlimits() + self._restore_scheduling() + self._restore_outside()

    def _restore_outside(self) -> list[str]:
        if _outside_state() != self.outside_state and not _set_outside_state(
                self.outside_state):
            return ["timer slack, I/O priority or OOM score adjustment could not be put back"]
        return []

    def _restore_rlimits(self) -> list[str]:
        problems: list[str] = []
        for res, limits in self.rlimits.items():
            if resource.getrlimit(res) != limits:
                try:
                    resource.setrlimit(res, limits)
                except (OSError, ValueError) as exc:  # a hard limit lowered, not root
                    problems.append(f"resource limit {res}: {exc}")
        return problems

    def _restore_scheduling(self) -> list[str]:
        problems: list[str] = []
        if _scheduler() != self.scheduler:
            policy, priority = self.scheduler
            try:  # a real-time policy would otherwise carry on into every later job
                os.sched_setscheduler(0, policy, os.sched_param(priority))
            except OSError as exc:
                problems.append(f"scheduling policy: {exc}")
        if os.sched_getaffinity(0) != self.affinity:
            try:
                os.sched_setaffinity(0, self.affinity)
            except OSError as exc:
                problems.append(f"CPU affinity: {exc}")
        if os.getpriority(os.PRIO_PROCESS, 0) != self.priority:
            try:  # lowering the nice value back needs privilege (CAP_SYS_NICE)
                os.setpriority(os.PRIO_PROCESS, 0, self.priority)
            except OSError as exc:
                problems.append(f"nice value: {exc}")
        return problems

    def _restore_warnings(self) -> None:
        filters, show, fmt = self.warnings
        if warnings.filters is not self.warnings_list or warnings.filters != filters:
            # A library a job imported stays imported, and the filters it added at import
            # (urllib3's for its SecurityWarning) would not be added again for the next
            # job: those join the baseline. Filters on other categories are the job's.
            known = set(filters)
            kept = [f for f in warnings.filters if f in known or _from_library(f[2])]
            filters = kept + [f for f in filters if f not in kept]
            self.warnings = (filters, show, fmt)
            self.warnings_list[:] = filters
            warnings.filters = self.warnings_list  # type: ignore[assignment]
            _filters_changed()  # invalidates the "already warned" registries the job filled
        warnings.showwarning, warnings.formatwarning = show, fmt

    def from_library(self, obj: Any) -> bool:
        """Whether ``obj`` (a class, a function) was defined in a library's module."""
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        origin = getattr(module, "__file__", None)
        return isinstance(origin, str) and origin.startswith(self.library_roots)

    def _restore_logging(self, libraries_loaded: bool = False) -> None:
        if logging.root.manager.disable != self.logging_disable:
            logging.disable(self.logging_disable)
        factory, logger_class, raise_exc, to_name, to_level = self.logging_globals
        if (logging.getLogRecordFactory() is not factory
                or logging.getLoggerClass() is not logger_class
                or logging.raiseExceptions != raise_exc or logging._levelToName != to_name
                or logging._nameToLevel != to_level):
            live = _logging_globals()
            if live[0] is not factory and self.from_library(live[0]):
                factory = live[0]
            if live[1] is not logger_class and self.from_library(live[1]):
                logger_class = live[1]
            if libraries_loaded:
                # Levels added (a library's VERBOSE): kept; a level renamed stays put back.
                to_name = {**live[3], **to_name}
                to_level = {**{n: v for n, v in live[4].items() if v not in to_name
                               or to_name[v] == n}, **to_level}
            self.logging_globals = (factory, logger_class, raise_exc, to_name, to_level)
            logging.setLogRecordFactory(factory)
            logging.setLoggerClass(logger_class)
            logging.raiseExceptions = raise_exc
            # (Each its own copy: WARN and FATAL are names of levels named otherwise, and
            # rebuilt as the inverse they were gone for every later job: review CA.)
            logging._levelToName.clear()
            logging._levelToName.update(to_name)
            logging._nameToLevel.clear()
            logging._nameToLevel.update(to_level)
        now = _loggers()
        for name, lg in now.items():
            known = self.loggers.get(name)
            if known is None or known[0] is not lg:
                # Created since: by a job (whose modules are imported afresh next time and
                # get this same logger back), or by a library it imported, which stays
                # imported and would not set its loggers up again for the next job. Named
                # after a module still loaded: the library's, kept as it is now. Else the
                # job's: blank, but for a NullHandler (libraries' convention).
                if name.partition(".")[0] in sys.modules:
                    state = _logger_state(lg)
                else:
                    nulls = tuple(h for h in lg.handlers if type(h) is logging.NullHandler)
                    state = (logging.NOTSET, nulls, (), True, False)
                known = self.loggers[name] = (lg, state)
            state = known[1]
            if _logger_state(lg) != state:
                lg.setLevel(state[0])
                lg.handlers[:] = state[1]
                lg.filters[:] = state[2]
                lg.propagate, lg.disabled = state[3], state[4]


def _stream_settings(stream: Any) -> tuple[Any, ...] | None:
    """A text stream's encoding, errors, line buffering and write-through (None: not one
    that can be reconfigured)."""
    if not hasattr(stream, "reconfigure"):
        return None
    try:
        return (stream.encoding, stream.errors, stream.line_buffering, stream.write_through)
    except (AttributeError, ValueError):
        return None


def _usable(stream: Any) -> bool:
    """False for a stream closed or detached (None, or one of another kind: as it was)."""
    try:
        return not stream.closed if hasattr(stream, "closed") else True
    except ValueError:  # "underlying buffer has been detached"
        return False


def _ident(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _finder_path(entry: str) -> str:
    """The folder a standard FileFinder made for sys.path entry ``entry`` looks in."""
    return os.getcwd() if entry in ("", ".") else os.path.abspath(entry)


def _standard_loaders() -> list[tuple[str, Any]]:
    """The (suffix, loader) pairs of a FileFinder the standard path hook makes."""
    from importlib import _bootstrap_external

    supported: Any = getattr(_bootstrap_external, "_get_supported_file_loaders")  # noqa: B009
    finder: Any = FileFinder("", *supported())
    return list(finder._loaders)


def _logging_globals() -> tuple[Any, ...]:
    return (logging.getLogRecordFactory(), logging.getLoggerClass(), logging.raiseExceptions,
            dict(logging._levelToName), dict(logging._nameToLevel))


def _scheduler() -> tuple[int, int]:
    return os.sched_getscheduler(0), os.sched_getparam(0).sched_priority


def _identity() -> tuple[Any, ...]:
    return os.getresuid(), os.getresgid(), os.getgroups()


_PR_GET_NO_NEW_PRIVS = 39
_prctl: Any = None


def _no_new_privs() -> int:
    """prctl(PR_GET_NO_NEW_PRIVS) (~1 us): set from C, below what Python can watch."""
    global _prctl
    if _prctl is None:
        try:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _prctl = False
    return int(_prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)) if _prctl else 0


_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4
_PR_GET_KEEPCAPS, _PR_SET_KEEPCAPS = 7, 8
_PR_SET_NAME, _PR_GET_NAME = 15, 16
_PR_GET_SECCOMP = 21
_PR_GET_SECUREBITS = 27
_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30
_PR_MCE_KILL, _PR_MCE_KILL_GET = 33, 34
_PR_MCE_KILL_CLEAR, _PR_MCE_KILL_SET, _PR_MCE_KILL_DEFAULT = 0, 1, 2
_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_PR_SET_THP_DISABLE, _PR_GET_THP_DISABLE = 41, 42
_PERSONALITY_QUERY = 0xFFFFFFFF
_IOPRIO_WHO_PROCESS = 1
# ioprio_get and ioprio_set (no libc wrapper) of this machine, named once at import: a
# job's personality(PER_LINUX32) makes uname() say i686, and i686's numbers are other
# calls here (eventfd2: they made descriptors).
_IOPRIO: tuple[int, int] | None = {"x86_64": (252, 251),
                                   "aarch64": (31, 30)}.get(os.uname().machine)


def _process_flags() -> tuple[Any, ...]:
    """What only prctl() or personality() sets, that a later job would find as a job left
    it (~4 us): child subreaper, dumpable, name, keepcaps, transparent huge pages off,
    machine-check kill policy, personality (review ET: PER_LINUX32 made the next job's
    uname() say i686)."""
    _no_new_privs()  # (loads _prctl)
    if not _prctl:
        return ()
    subreaper = ctypes.c_int(0)
    _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(subreaper), 0, 0, 0)
    name = ctypes.create_string_buffer(16)
    _prctl(_PR_GET_NAME, name, 0, 0, 0)
    return (subreaper.value, int(_prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)), name.value,
            int(_prctl(_PR_GET_KEEPCAPS, 0, 0, 0, 0)),
            int(_prctl(_PR_GET_THP_DISABLE, 0, 0, 0, 0)),
            int(_prctl(_PR_MCE_KILL_GET, 0, 0, 0, 0)),
            int(_libc_call("personality", _PERSONALITY_QUERY)))


def _set_process_flags(flags: tuple[Any, ...]) -> bool:
    """Set them back; whether they now are as given."""
    subreaper, dumpable, name, keepcaps, thp, mce, persona = flags
    _prctl(_PR_SET_CHILD_SUBREAPER, subreaper, 0, 0, 0)
    _prctl(_PR_SET_DUMPABLE, dumpable, 0, 0, 0)
    _prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    _prctl(_PR_SET_KEEPCAPS, keepcaps, 0, 0, 0)
    _prctl(_PR_SET_THP_DISABLE, thp, 0, 0, 0)
    if mce == _PR_MCE_KILL_DEFAULT:
        _prctl(_PR_MCE_KILL, _PR_MCE_KILL_CLEAR, 0, 0, 0)
    else:
        _prctl(_PR_MCE_KILL, _PR_MCE_KILL_SET, mce, 0, 0)
    _libc_call("personality", persona)
    return _process_flags() == flags


def _locked_in() -> tuple[int, int]:
    """(seccomp mode, securebits): a filter or locked bits a job set stay for good (review
    ET: a later job's os.uname() was EPERM; its children had no capabilities)."""
    _no_new_privs()
    if not _prctl:
        return 0, 0
    return int(_prctl(_PR_GET_SECCOMP, 0, 0, 0, 0)), int(_prctl(_PR_GET_SECUREBITS, 0, 0, 0, 0))


def _outside_state() -> tuple[int, int, bytes]:
    """What another process can change in this one by pid (a command job's `ionice -p
    $PPID`, a write to /proc/$PPID/timerslack_ns or oom_score_adj; ~3 us): timer slack
    (review ET: 300 ms, and a later job's 1 ms sleeps took 300), I/O priority, OOM score
    adjustment (README: a worker's is 500, the one to go first)."""
    _no_new_privs()
    slack = int(_prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)) if _prctl else 0
    ioprio = int(_libc_call("syscall", _IOPRIO[0], _IOPRIO_WHO_PROCESS, 0)) if _IOPRIO else 0
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_RDONLY | os.O_CLOEXEC)
        try:
            oom = os.read(fd, 16).strip()
        finally:
            os.close(fd)
    except OSError:
        oom = b""
    return slack, ioprio, oom


def _set_outside_state(state: tuple[int, int, bytes]) -> bool:
    slack, ioprio, oom = state
    if _prctl:
        _prctl(_PR_SET_TIMERSLACK, slack, 0, 0, 0)
    if _IOPRIO:
        _libc_call("syscall", _IOPRIO[1], _IOPRIO_WHO_PROCESS, 0, ioprio)
    if oom:
        with contextlib.suppress(OSError):
            fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, oom)
            finally:
                os.close(fd)
    return _outside_state() == state


def _libc_call(name: str, *args: int) -> int:
    return int(getattr(libc(), name)(*args))


def _restore_list(live: list[Any], then: list[Any], initial: frozenset[str]) -> bool:
    """Make ``live`` hold ``then`` again (what the job removed put back, in place), keeping
    what a library still loaded, and first loaded since the worker started (``initial``:
    the modules loaded then), added at its import, which it would not add again for the
    next job (as with warnings filters): those join ``then``. True if anything was removed."""
    if len(live) == len(then) and all(map(operator.is_, live, then)):
        return False
    known = {id(x) for x in then}
    first = next((i for i, x in enumerate(live) if id(x) in known), len(live))
    added = [(i, x) for i, x in enumerate(live) if id(x) not in known and _from_library(x)
             and getattr(x, "__module__", "") not in initial]
    removed = len(live) - len(added) > sum(1 for x in live if id(x) in known)
    then[:] = ([x for i, x in added if i < first] + list(then)
               + [x for i, x in added if i >= first])
    live[:] = then
    return removed


def _from_library(category: Any) -> bool:
    """A warning category defined by a module still loaded after the job's were forgotten
    (a library's), not a built-in one (which any job's filter names)."""
    module = getattr(category, "__module__", "builtins") or "builtins"
    return module != "builtins" and module.partition(".")[0] in sys.modules


def _filters_changed() -> None:
    mutated = getattr(warnings, "_filters_mutated", None)  # CPython 3.11-3.13
    if mutated is not None:
        mutated()
        return
    with warnings._lock:  # type: ignore[attr-defined]  # 3.14 renamed it, under a lock
        warnings._filters_mutated_lock_held()  # type: ignore[attr-defined]


def threads_left() -> int:
    """Python threads other than this one (a job's thread cannot be stopped from outside)."""
    return len(sys._current_frames()) - 1


def _c_environ_match(env: os._Environ[str]) -> None:
    """Make the C environment exactly ``env`` (what os.environ holds)."""
    libc = ctypes.CDLL(None)
    envp = ctypes.POINTER(ctypes.c_char_p).in_dll(libc, "environ")
    names: list[bytes] = []
    i = 0
    while envp[i] is not None:
        names.append(envp[i].split(b"=", 1)[0])  # type: ignore[union-attr]
        i += 1
    wanted = env._data  # type: ignore[attr-defined]  # encoded keys and values
    for name in names:
        if name not in wanted:
            os.unsetenv(name)
    for key, value in wanted.items():
        os.putenv(key, value)
