"""Crash and stop points: every point the code passes is known, and a variable naming no
point (or a bad count) is refused instead of silently never firing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from renderctl import crashpoints
from renderctl.crashpoints import KNOWN, BadCrashPoint, CrashPoints
from renderctl.runner import CRASH_POINTS
from renderctl.store import DEAD_RETRY_CRASH_POINTS

SOURCE = Path(crashpoints.__file__).parent
PASSED = re.compile(r"\b(?:crash_point|crash_hook|hook)\(\"([^\"]+)\"\)")


# What Queue.finish passes its hook: the runner's hook (its only caller with one) ignores
# the name and passes `publish:after_done` or `dead` instead, so no variable can name it.
HOOK_LABELS = {"finish:before_unlink"}


def test_every_point_the_code_passes_is_known() -> None:
    named = {m.group(1) for f in SOURCE.rglob("*.py") for m in PASSED.finditer(f.read_text())}
    assert len(named) >= 20  # the pattern still finds them
    assert named - HOOK_LABELS <= KNOWN, sorted(named - HOOK_LABELS - KNOWN)
    assert not HOOK_LABELS & KNOWN
    assert set(CRASH_POINTS) | set(DEAD_RETRY_CRASH_POINTS) <= KNOWN


@pytest.mark.parametrize("value", ["bogus", "commit:n=x", "commit:n=0", "commit:n=-1",
                                   "commit:n=1:extra", "commit:x=1", "commit:n=",
                                   "finish:before_unlink"])
def test_a_malformed_point_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(BadCrashPoint, match=r"RENDERCTL_CRASH_AT="):
        CrashPoints(value)
    with pytest.raises(BadCrashPoint, match=r"RENDERCTL_STOP_AT="):
        CrashPoints(None, value)


def test_well_formed_points_parse() -> None:
    assert CrashPoints("commit:n=3")._kill == ("commit", 3)
    assert CrashPoints("publish:after_link")._kill == ("publish:after_link", 1)
    assert CrashPoints("")._kill is None
