"""What a python job can change in the worker process it runs in, and how it is put back.

A ``python`` job is called inside its worker, so whatever process-wide state it changes
would reach the next job in that worker. The worker resets the obvious (cwd, environment,
reportlab/pypdf settings, sys.path, the job's own modules: see worker.py); this module
covers the rest of what a job, or a library it calls, plausibly changes: signal
dispositions and the signal mask, interval timers, the umask, resource limits, the time
zone, the locale, the thread switch interval, ``sys.stdin/stdout/stderr`` and variables set
below ``os.environ`` with ``os.putenv``. A job that leaves a thread running cannot be undone:
the worker retires instead. Monkeypatched library functions are not detected (that would
mean comparing every module's namespace per job); a job that needs that isolation is a
``command`` job, or runs with ``--max-jobs-per-worker 1``.

Cost on the common path (nothing changed): ~3 us per job (only after jobs that run the
user's code in the worker: python callables, plugin renderers). Signal handlers, resource limits
and the C environment are compared only after a job called ``signal.signal``,
``resource.setrlimit``/``prlimit`` or ``os.putenv``/``unsetenv`` (the functions are wrapped
to say so): comparing 60 handlers and 16 limits every time cost ~40 us, nearly 1% of an
invoice render. Changes made below Python (ctypes, C extensions) are not seen.
"""

from __future__ import annotations

import contextlib
import ctypes
import locale
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

_RLIMITS = tuple(getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_"))
_TIMERS = (signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)  # ITIMER_REAL: signal.alarm(0)


def _tz() -> tuple[Any, ...]:
    return time.tzname, time.timezone, time.altzone, time.daylight


class Baseline:
    """The worker's state as every job must find it, captured once at worker start."""

    def __init__(self) -> None:
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
        self.touched: set[str] = set()  # which of the watched kinds a job changed
        for name in ("putenv", "unsetenv"):
            # os.environ calls these too (keeping its own mapping in step): only a call from
            # anywhere else changes the C environment alone, which subprocesses inherit.
            self._watch(os, name, "environ", unless_from="os")
        self._watch(signal, "signal", "signals")
        for name in ("setrlimit", "prlimit"):
            self._watch(resource, name, "rlimits")

    def _watch(self, module: Any, name: str, kind: str, unless_from: str = "") -> None:
        real: Callable[..., Any] = getattr(module, name)

        def watched(*args: Any, **kwargs: Any) -> Any:
            if not unless_from or sys._getframe(1).f_globals.get("__name__") != unless_from:
                self.touched.add(kind)
            return real(*args, **kwargs)

        setattr(module, name, watched)

    def restore(self) -> list[str]:
        """Put everything back (call once os.environ is the job's); returns what could not be."""
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
        if "rlimits" in self.touched:
            for res, limits in self.rlimits.items():
                if resource.getrlimit(res) != limits:
                    try:
                        resource.setrlimit(res, limits)
                    except (OSError, ValueError) as exc:  # a hard limit lowered, not root
                        problems.append(f"resource limit {res}: {exc}")
        if _tz() != self.tz:
            time.tzset()
        if locale.setlocale(locale.LC_ALL) != self.locale:
            locale.setlocale(locale.LC_ALL, self.locale)
        if sys.getswitchinterval() != self.switch:
            sys.setswitchinterval(self.switch)
        if (sys.stdin, sys.stdout, sys.stderr) != self.stdio:
            sys.stdin, sys.stdout, sys.stderr = self.stdio
        if "environ" in self.touched:
            _c_environ_match(os.environ)
        self.touched.clear()
        return problems


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
