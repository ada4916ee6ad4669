"""The runner gives up cleanly when its workers cannot even start, and loses nothing."""

from __future__ import annotations

from pathlib import Path

from jobfns import cli_args, hold_spawned_workers, run_cli

from renderctl.errors import ExitCode
from renderctl.lifecycle import State
from renderctl.store import Queue


def test_workers_dying_before_ready_stop_the_runner_with_a_clear_error(tmp_path: Path) -> None:
    # Given a queue with jobs, and a runner whose spawned workers die while starting (exit 3
    # before multiprocessing reads their start data, as a broken environment would: a
    # missing module, a bad PYTHONPATH)
    manifest = tmp_path / "m.toml"
    manifest.write_text('[defaults]\nkind = "python"\ncallable = "m:f"\n'
                        '[[jobs]]\nid = "a"\noutput = "a.bin"\n')
    queue = tmp_path / "q"
    env, hold = hold_spawned_workers(tmp_path, die=True)
    (hold / "armed").touch()

    # When it runs
    res = run_cli("run", manifest, *cli_args(queue, tmp_path / "out", "--start-method",
                                             "spawn", "--workers", "1"), env=env, timeout=120)

    # Then it stops (no endless respawning) with exit 74 and a message saying why
    assert res.returncode == ExitCode.IO_ERROR, res.stdout + res.stderr
    assert "died before they were ready" in res.stderr
    assert "Traceback" not in res.stderr.split("renderctl:")[-1]
    # And the job is still there, pending or claimed-and-recoverable, never lost
    q = Queue(queue)
    view = q.get("a")
    assert view.state in (State.PENDING, State.RUNNING)
