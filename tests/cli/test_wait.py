"""`renderctl wait`: blocks until the jobs are terminal; exit codes as `run`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from clihelp import RENDERCTL, cli, env, job, poll, write_jobs


def test_wait_exit_codes(tmp_path: Path) -> None:
    manifest = write_jobs(tmp_path / "m", [
        job("ok", "write"), job("bad", "fail", max_attempts=1),
    ])
    q, out = tmp_path / "q", tmp_path / "out"
    assert cli("submit", manifest, "--queue", q, "--out", out, cwd=tmp_path).returncode == 0
    # An unknown id is a usage error, at once
    unknown = cli("wait", "ok", "nope", "--queue", q, cwd=tmp_path)
    assert unknown.returncode == 2 and "nope" in unknown.stderr
    # Nothing runs the queue yet: the wait says so (audit DM: it blocked without a word),
    # and a timeout says "try again later"
    early = cli("wait", "ok", "--queue", q, "--timeout", "0.3", cwd=tmp_path)
    assert early.returncode == 75 and "ok" in early.stderr
    assert f"note: no runner serves {q} now; waiting for one" in early.stderr, early.stderr
    # Waiters started before the runner return when their jobs finish
    waiters = {ids: subprocess.Popen([*RENDERCTL, "wait", *ids, "--queue", str(q),
                                      "--timeout", "60"], cwd=tmp_path, env=env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
               for ids in (("ok",), ("ok", "bad"))}
    run = cli("run", "--queue", q, "--out", out, "-j", "2", cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    ok_out, _ = waiters[("ok",)].communicate(timeout=30)
    assert waiters[("ok",)].returncode == 0 and ok_out.strip() == "ok: done"
    both_out, _ = waiters[("ok", "bad")].communicate(timeout=30)
    assert waiters[("ok", "bad")].returncode == 1
    assert both_out.splitlines() == ["ok: done", "bad: dead"]
    # Already terminal: immediate
    assert cli("wait", "ok", "--queue", q, cwd=tmp_path).returncode == 0
    assert sys.executable  # the children ran under this interpreter


def _sleeping(pid: int) -> bool:
    """Whether ``pid`` sleeps between its polls (past its first look at the queue)."""
    try:
        return "nanosleep" in Path(f"/proc/{pid}/wchan").read_text()
    except FileNotFoundError:
        return False


def test_wait_json_lists_the_ids_in_the_order_given_not_as_they_finished(
        tmp_path: Path) -> None:
    import json

    # Given a finished job, and a pending one, and `wait --json` for both, the pending one
    # named first, polling (it has looked once: the first was not terminal then)
    manifest = write_jobs(tmp_path / "m", [job("early", "write"), job("later", "write")])
    q, out = tmp_path / "q", tmp_path / "out"
    assert cli("submit", manifest, "--queue", q, "--out", out, cwd=tmp_path).returncode == 0
    assert cli("cancel", "early", "--queue", q, cwd=tmp_path).returncode == 0
    waiter = subprocess.Popen([*RENDERCTL, "wait", "later", "early", "--json", "--queue",
                               str(q), "--timeout", "60"], cwd=tmp_path, env=env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        poll(lambda: _sleeping(waiter.pid) or None, what="wait polling")

        # When the second one finishes
        assert cli("run", "--queue", q, cwd=tmp_path).returncode == 0
        shown, err = waiter.communicate(timeout=30)
    finally:
        waiter.kill()
        waiter.wait()

    # Then the object lists them as given (it listed them as they finished: early first)
    assert waiter.returncode == 1, err
    assert list(json.loads(shown)) == ["later", "early"], shown
    assert json.loads(shown) == {"later": "done", "early": "cancelled"}
