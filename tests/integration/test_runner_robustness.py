"""The runner gives up cleanly when its workers cannot even start, and loses nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from renderctl.errors import ExitCode
from renderctl.lifecycle import State
from renderctl.store import Queue

SCRIPT = textwrap.dedent('''
    import sys
    if __name__ == "__mp_main__":
        # A spawned worker re-imports the main module: make that fail, as a broken
        # environment would (a missing module, a bad PYTHONPATH).
        raise SystemExit(3)
    from renderctl.cli.app import main
    if __name__ == "__main__":
        main()
''')


def test_workers_dying_before_ready_stop_the_runner_with_a_clear_error(tmp_path: Path) -> None:
    # Given a queue with jobs, and a runner whose spawned workers die while starting
    manifest = tmp_path / "m.toml"
    manifest.write_text('[defaults]\nkind = "python"\ncallable = "m:f"\n'
                        '[[jobs]]\nid = "a"\noutput = "a.bin"\n')
    script = tmp_path / "broken_main.py"
    script.write_text(SCRIPT)
    queue = tmp_path / "q"

    # When it runs
    res = subprocess.run([sys.executable, str(script), "run", str(manifest), "--queue",
                          str(queue), "--out", str(tmp_path / "out"), "--start-method",
                          "spawn", "--workers", "1"], capture_output=True, text=True,
                         timeout=120)

    # Then it stops (no endless respawning) with exit 74 and a message saying why
    assert res.returncode == ExitCode.IO_ERROR, res.stdout + res.stderr
    assert "died before they were ready" in res.stderr
    assert "Traceback" not in res.stderr.split("renderctl:")[-1]
    # And the job is still there, pending or claimed-and-recoverable, never lost
    q = Queue(queue)
    view = q.get("a")
    assert view.state in (State.PENDING, State.RUNNING)
