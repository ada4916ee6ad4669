"""`status` names the guard a runner would use, without creating a probe cgroup."""

from __future__ import annotations

from renderctl.guards import available_memory_guard, detect_memory_guard


def test_status_guess_matches_what_a_runner_detects() -> None:
    guard = detect_memory_guard()
    try:
        assert available_memory_guard() == guard.name
    finally:
        guard.close()
