"""What a --follow runner remembers per job stays bounded: it runs for days under systemd.

Read off the runner's own state (no processes): the real-process soak figures are in the
README (Housekeeping)."""

from __future__ import annotations

from pathlib import Path

from renderctl.runner import CONFINED_CACHE_MAX, Runner
from renderctl.settings import RunnerSettings
from renderctl.store import Queue


def test_output_folders_checked_are_remembered_up_to_a_bound(tmp_path: Path) -> None:
    # Given a runner, and jobs that each publish into a folder of their own (out/<id>/)
    runner = Runner(Queue(tmp_path / "q"), RunnerSettings(workers=1))
    out = tmp_path / "out"
    out.mkdir()

    # When more such folders are checked than the cache holds
    for n in range(CONFINED_CACHE_MAX + 100):
        runner._check_confined(str(out), out / f"job-{n}" / "x.pdf")

    # Then it remembers at most that many (and still the latest)
    assert len(runner._confined) <= CONFINED_CACHE_MAX
    assert (str(out), str(out / f"job-{CONFINED_CACHE_MAX + 99}")) in runner._confined
