"""Valid jobs that look doomed where they are submitted: said, never refused.

A deadline already past, a command's program or a python job's module not found, a kind two
plugins register, an output path that holds something already: each is valid (the runner's
host, PATH or sys.path may differ; the file may go before the job runs), but here the job
would expire unrun, fail every attempt, or be dead-lettered. `validate`, `submit` and `run`
print them as warnings; the Python API returns them in ``SubmitResult.advice``, so that a
web tier learns of them too (audit CX: only the command line said them).

Each finding is a ``Problem`` (file, job, field, message), as validation's are.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import time
from collections.abc import Iterable, Sequence

from renderctl.errors import Problem
from renderctl.manifest import JobSpec


def past_deadlines(jobs: Iterable[JobSpec], origin: dict[str, str],
                   now: float | None = None) -> list[Problem]:
    """A deadline already past: almost always a typo or a stale manifest."""
    now = time.time() if now is None else now
    return [Problem(origin.get(j.id, "?"), j.id, "deadline",
                    "already past; the job will expire without running")
            for j in jobs if j.deadline is not None and j.deadline < now]


def unfound_programs(jobs: Sequence[JobSpec], origin: dict[str, str]) -> list[Problem]:
    """A command's program not on PATH, a python job's module not importable (looked up
    without running any of its code), once per program; a kind two plugins register, once
    per kind."""
    from renderctl.render.registry import clashes

    found: list[Problem] = []
    firsts: dict[str, JobSpec] = {}
    for job in jobs:
        firsts.setdefault(job.kind, job)
    for kind, what in clashes(set(firsts)).items():
        job = firsts[kind]
        found.append(Problem(origin.get(job.id, "?"), job.id, "kind", what))
    missing: dict[tuple[str, str, str], list[JobSpec]] = {}
    present: set[tuple[str, str, str]] = set()
    for job in jobs:
        if job.kind == "command" and job.argv:
            if "{output}" in job.argv[0]:
                # (The temporary the command is to write: not there when it starts.)
                found.append(Problem(origin.get(job.id, "?"), job.id, "argv[0]",
                                     "'{output}' as the program: the job's output does not "
                                     "exist when its command starts; each attempt would "
                                     "fail"))
                continue
            program = _program_of(job)
            if program is None:
                continue
            key = ("argv[0]", "", program)
        elif job.kind == "python" and job.callable:
            # Only the top-level name: finding a submodule would import (run) its package.
            key = ("callable", job.pythonpath or "",
                   job.callable.partition(":")[0].split(".")[0])
        else:
            continue
        if key in present:
            continue
        if key not in missing and _program_found(*key):
            present.add(key)
            continue
        missing.setdefault(key, []).append(job)
    for (fld, _, name), hit in missing.items():
        if fld != "argv[0]":
            what = f"module '{name}' not found here"
        elif "/" not in name:
            what = f"'{name}' not found on PATH here"
        elif not os.path.isabs(name):
            what = (f"'{name}' is a relative path: a command starts in a fresh, empty "
                    "working folder, where it cannot be (give it absolute, or put its "
                    "folder on PATH)")
        else:
            what = f"'{name}' " + ("is a folder" if os.path.isdir(name)
                                   else "is not executable" if os.path.exists(name)
                                   else "does not exist") + " here"
        more = len(hit) - 1
        also = f" (and {more} more job{'' if more == 1 else 's'})" if more else ""
        found.append(Problem(origin.get(hit[0].id, "?"), hit[0].id, fld,
                             f"{what}{also}; each attempt would fail"))
    return found


def _program_of(job: JobSpec) -> str | None:
    """The program a command job's argv names, as its placeholders will have it: an input
    (a script the job ships) is looked for as that input, which was warned about as "not
    found on PATH" (audit FU); None where there is nothing to look for."""
    assert job.argv
    program = job.argv[0]
    if program == "{inputs}" or "{input}" in program:
        if not job.inputs:
            return None  # (validate says so itself)
        first = job.inputs[0]
        return first if program == "{inputs}" else program.replace("{input}", first)
    return program


def _program_found(field: str, pythonpath: str, name: str) -> bool:
    if field == "argv[0]":
        import shutil

        if "/" in name:
            # A relative path is to the job's working folder, empty when the command starts:
            # never there (audit CK: validated quietly, failed at every attempt).
            # A folder is "executable" to access(2) too: it failed "not executable" at every
            # attempt, unwarned (audit DT).
            return os.path.isabs(name) and os.path.isfile(name) and os.access(name, os.X_OK)
        return shutil.which(name) is not None
    try:
        # The worker imports with the manifest's folder first on sys.path. That folder is
        # looked in by name, as its path entry's finder would: sys.path is left alone (a
        # web tier's other threads import meanwhile), and so is sys.path_importer_cache
        # (one finder kept per upload folder for the life of the process; review CY). A few
        # stats, not a finder's listing of the folder: 4 ms a submit from one of 10,000
        # uploads.
        if pythonpath and _in_folder(pythonpath, name):
            return True
        return importlib.util.find_spec(name) is not None  # (built-ins, editable installs)
    except (ImportError, ValueError):
        return False


def _in_folder(folder: str, name: str) -> bool:
    """Whether ``folder`` on sys.path would give module ``name``: a folder of that name (a
    package, or a namespace package's portion) or a file of a suffix import loads."""
    path = os.path.join(folder, name)
    return os.path.isdir(path) or any(os.path.isfile(path + suffix) for suffix in _SUFFIXES)


_SUFFIXES = (*importlib.machinery.EXTENSION_SUFFIXES, *importlib.machinery.SOURCE_SUFFIXES,
             *importlib.machinery.BYTECODE_SUFFIXES)


_SAID = 5  # of each kind of per-job warning, then how many more


def said(found: Sequence[Problem]) -> list[str]:
    """``found`` as warning lines, bounded: a past deadline or an output in the way is said
    of the first five jobs, then how many more (5,000 stale jobs made 5,000 lines: review
    CY); programs not found are said once per program already."""
    lines: list[str] = []
    more = {"deadline": 0, "output": 0}
    for p in found:
        if p.field in more:
            more[p.field] += 1
            if more[p.field] > _SAID:
                continue
        lines.append(str(p))
    if (n := more["deadline"] - _SAID) > 0:
        lines.append(f"{n} more accepted job(s) whose deadline is already past")
    if (n := more["output"] - _SAID) > 0:
        lines.append(f"{n} more accepted job(s) whose output exists")
    return lines


def existing_outputs(jobs: Iterable[JobSpec]) -> set[str]:
    """The ids of the jobs whose output path holds something now, or cannot (a file where
    one of its folders should be). Looked at before the jobs are accepted: after, a
    following runner may have published some already, and their own outputs would be
    reported as in the way."""
    hit = set()
    for j in jobs:
        try:
            # A string join, not j.output_path: a Path per job cost more than the lstat.
            os.lstat(os.path.join(j.out_root, j.output))
        except NotADirectoryError:
            hit.add(j.id)
        except OSError:
            continue
        else:
            hit.add(j.id)
    return hit


def outputs_in_the_way(jobs: Iterable[JobSpec], hit: set[str],
                       origin: dict[str, str]) -> list[Problem]:
    """An output path that held a file before its job was accepted makes the job
    dead-letter (output_exists: renderctl never overwrites), a replaced job's own earlier
    output included. ``hit``: the accepted jobs whose output existed before the submit."""
    found = []
    for job in jobs:
        if job.id not in hit:
            continue
        path = job.output_path
        if not os.path.lexists(path):
            # (A file where one of its folders should be: audit CF, said only at run.)
            fate = "cannot be made: a file is where one of its folders should be, so the " \
                   "job will be dead-lettered (invalid_output) unless that file is removed " \
                   "first"
        elif os.path.islink(path):
            # Never published through (publish refuses a symlink): the job's own outcome.
            fate = "is a symlink; renderctl never publishes through one, so the job will " \
                   "be dead-lettered (invalid_output) unless that symlink is removed first"
        else:
            what = "folder" if os.path.isdir(path) else "file"
            fate = "exists already; renderctl never overwrites, so the job will be " \
                   f"dead-lettered (output_exists) unless that {what} is removed first"
        found.append(Problem(origin.get(job.id, "?"), job.id, "output", f"{path} {fate}"))
    return found
