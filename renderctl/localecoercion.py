"""Undoing Python's locale coercion in the environment renderctl hands to jobs.

Alone in its module, standard library only: the script's entry point calls it before its
imports, and every worker before it takes its environment as the jobs' base.
"""

from __future__ import annotations

import os


def undo_locale_coercion() -> None:
    """Give our environment back the LC_CTYPE it was started with: Python's locale coercion
    (PEP 538) sets LC_CTYPE=C.UTF-8 under a C locale, as cron's, and every command job
    inherited it, so `sort`
    and `pdftotext` ran otherwise than under cron itself (audit EA). It is told from one the
    caller set by the environment the process was started with (/proc/self/environ, which
    setenv() does not change). Python's own locale stays as it chose."""
    now = os.environ.get("LC_CTYPE")
    if now is None:
        return
    try:
        with open("/proc/self/environ", "rb") as f:
            given = f.read().split(b"\0")
    except OSError:
        return
    was = next((v[len(b"LC_CTYPE="):] for v in given if v.startswith(b"LC_CTYPE=")), None)
    if was is None:
        del os.environ["LC_CTYPE"]
    elif os.fsencode(now) != was:
        # Coerced over the caller's own (LC_CTYPE=C, or a locale not installed here): the
        # caller's it is (review EB).
        os.environ["LC_CTYPE"] = os.fsdecode(was)
