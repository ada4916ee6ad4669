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


FINDERS = textwrap.dedent('''
    import os, sys
    from importlib import _bootstrap_external
    from importlib.machinery import FileFinder
    from renderctl.cleanslate import Baseline

    baseline = Baseline()
    std = next(e for e in sys.path if os.path.exists(os.path.join(e, "colorsys.py")))
    site = next(e for e in sys.path if e.endswith("site-packages"))
    evil = sys.argv[1]
    os.makedirs(evil, exist_ok=True)
    with open(os.path.join(evil, "colorsys.py"), "w") as fh:
        fh.write("FORGED = True\\n")
    # A job caches, for the stdlib's entry, a standard-looking finder of another folder,
    # and hides site-packages (None: "no finder here")
    loaders = _bootstrap_external._get_supported_file_loaders()
    sys.path_importer_cache[std] = FileFinder(evil, *loaders)
    sys.path_importer_cache[site] = None
    baseline.restore()
    # The next job imports from both
    sys.modules.pop("colorsys", None)
    for name in [n for n in sys.modules if n == "pypdf" or n.startswith("pypdf.")]:
        del sys.modules[name]
    import colorsys
    import pypdf
    print("forged" if getattr(colorsys, "FORGED", False) else "clean", pypdf.__name__)
''')


def test_a_finder_a_job_cached_for_a_path_entry_does_not_serve_the_next_job(
        tmp_path: Path) -> None:
    # (review CC: a FileFinder with the standard loaders but another folder served the
    # job's colorsys.py; a None for site-packages made the next `import pypdf` fail)
    res = subprocess.run([sys.executable, "-c", FINDERS, str(tmp_path / "evil")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["clean", "pypdf"]
