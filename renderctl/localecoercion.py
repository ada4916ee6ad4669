"""Undoing Python's locale coercion in the environment renderctl hands to jobs.

Alone in its module, standard library only: the script's entry point calls it before its
imports, and every worker before it takes its environment as the jobs' base.
"""

from __future__ import annotations

import os


def undo_locale_coercion() -> None:
    """Take out of our environment the LC_CTYPE=C.UTF-8 that Python's locale coercion (PEP
    538) put there under a C locale, as cron's: every command job inherited it, so `sort`
    and `pdftotext` ran otherwise than under cron itself (audit EA). It is told from one the
    caller set by the environment the process was started with (/proc/self/environ, which
    setenv() does not change). Python's own locale stays as it chose."""
    if os.environ.get("LC_CTYPE") is None:
        return
    try:
        with open("/proc/self/environ", "rb") as f:
            given = f.read().split(b"\0")
    except OSError:
        return
    if not any(v.startswith(b"LC_CTYPE=") for v in given):
        del os.environ["LC_CTYPE"]
