"""cleanslate.Baseline in a real interpreter: what one job changes, the next does not find."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent('''
    import faulthandler, os, sys
    from renderctl.cleanslate import Baseline

    baseline = Baseline()  # this interpreter runs with -X faulthandler, as CI often does
    # A job points faulthandler at a file of its own, then closes that file
    with open(sys.argv[1], "w") as f:
        faulthandler.enable(file=f)
    baseline.restore()
    # The next job opens a file of its own, which gets that descriptor number again
    with open(sys.argv[2], "w") as g:
        faulthandler._sigsegv()
''')


def test_faulthandler_a_job_pointed_at_its_own_file_writes_to_stderr_again(
        tmp_path: Path) -> None:
    # When the process crashes (SIGSEGV) after the job's end was cleaned up
    res = subprocess.run([sys.executable, "-X", "faulthandler", "-c", SCRIPT,
                          str(tmp_path / "job1.log"), str(tmp_path / "job2.log")],
                         capture_output=True, text=True, timeout=60)

    # Then the crash report goes to the worker's stderr, not into the next job's file
    assert res.returncode != 0
    assert "Fatal Python error" in res.stderr, res.stderr
    assert "Fatal Python error" not in (tmp_path / "job2.log").read_text()
