"""renderctl run by an ordinary user (a user's crontab, a CI job not running as root).

The suite runs as root; these tests drop to ``nobody`` for the renderctl processes they start
(``subprocess.Popen(user=, group=, extra_groups=[], umask=)``), in a folder under /tmp that
nobody owns. What root may do and nobody may not (cgroups, lowering ``oom_score_adj``,
signalling or reading other users' processes) must degrade quietly: no warning per job, no
traceback, the promise kept.

nobody must be able to run this interpreter and import renderctl's dependencies. An
interpreter under a folder only root can enter (pyenv in /root) cannot be used:
``RENDERCTL_TEST_NOBODY_PYTHON`` then names one that nobody can run with them installed,
else these tests are skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest
from jobfns import (
    QueueView,
    Runner,
    assert_pdf,
    json_lines,
    kill_mid_job,
    py_job,
    run_cli,
    stage,
    stray_temporaries,
    wait_for_pid,
    wait_until,
)

from renderctl import proctree

PYTHON_ENV = "RENDERCTL_TEST_NOBODY_PYTHON"
CHECKOUT = Path(__file__).resolve().parents[2]
INVOICE = CHECKOUT / "sample-inputs" / "invoices" / "0001.json"
Manifests = Callable[..., Path]


class Nobody:
    """Runs renderctl as ``nobody`` (no supplementary groups) with ``home`` as its folder."""

    def __init__(self, python: str, uid: int, gid: int, home: Path) -> None:
        self.python, self.uid, self.gid, self.home = python, uid, gid, home
        self.tmpdir = home / "tmp"  # the runner's work folders land here: checkable

    def popen_args(self, umask: int, extra_env: Mapping[str, str] | None) -> dict[str, Any]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("RENDERCTL_") and k != "HOME"}
        env.update({"NO_COLOR": "1", "PYTHONPATH": str(CHECKOUT), "TMPDIR": str(self.tmpdir),
                    "HOME": str(self.home)})
        env.update(extra_env or {})
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "umask": umask,
                "env": env, "cwd": self.home}

    def argv(self, *args: str | os.PathLike[str]) -> list[str]:
        return [self.python, "-m", "renderctl.cli.app", *map(str, args)]

    def run(self, *args: str | os.PathLike[str], umask: int = 0o022, timeout: float = 60,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), capture_output=True, text=True,
                              timeout=timeout, **self.popen_args(umask, env))

    def runner(self, *args: str | os.PathLike[str], umask: int = 0o022) -> Runner:
        """A background ``renderctl run ARGS`` as nobody (jobfns.Runner reads its output)."""
        return Runner.of(subprocess.Popen(self.argv("run", *args), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE,
                                          **self.popen_args(umask, None)))

    def chown(self, *paths: Path) -> None:
        for p in paths:
            os.chown(p, self.uid, self.gid, follow_symlinks=False)


@pytest.fixture(scope="module")
def nobody_ids() -> tuple[str, int, int]:
    if os.geteuid() != 0:
        pytest.skip("needs root, to run renderctl as nobody")
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody here")
    python = os.environ.get(PYTHON_ENV) or sys.executable
    try:
        probe = subprocess.run(
            [python, "-c", "import renderctl.cli.app, reportlab, pypdf, psutil"],
            user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], cwd="/", capture_output=True,
            text=True, env={**os.environ, "PYTHONPATH": str(CHECKOUT)})
        why = (probe.stderr.strip().splitlines() or ["?"])[-1] if probe.returncode else ""
    except OSError as exc:  # not even executable by nobody
        why = str(exc)
    if why:
        pytest.skip(f"nobody cannot run {python} with renderctl's dependencies ({why}); set "
                    f"{PYTHON_ENV} to an interpreter nobody can run with them installed")
    return python, pw.pw_uid, pw.pw_gid


@pytest.fixture
def nobody(nobody_ids: tuple[str, int, int]) -> Iterator[Nobody]:
    # Not under tmp_path: pytest keeps /tmp/pytest-of-root at 0700, where nobody cannot go.
    home = Path(tempfile.mkdtemp(prefix="rctl-nobody-", dir="/tmp"))
    user = Nobody(*nobody_ids, home)
    user.tmpdir.mkdir()
    user.chown(home, user.tmpdir)
    try:
        yield user
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def manifest(nobody: Nobody, write_manifest: Callable[..., Path]) -> Manifests:
    """``manifest(jobs, name=, defaults=)``: a manifest (with jobfns.py beside it) in
    nobody's folder, nobody's."""

    def write(jobs: list[dict[str, Any]], name: str = "jobs.toml",
              defaults: Mapping[str, Any] | None = None) -> Path:
        folder = stage(nobody.home / "m")
        path = write_manifest(jobs, defaults=defaults, name=name, folder=folder)
        nobody.chown(folder, folder / "jobfns.py", path)
        return path

    return write


def assert_quiet(stderr: str) -> None:
    """Nothing on stderr but what a plain run prints: no warning, no traceback."""
    assert "Traceback" not in stderr, stderr
    assert "warning" not in stderr.lower(), stderr


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int,
                          *mentions: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("renderctl: "), proc.stderr
    for m in mentions:
        assert m in lines[0], (m, lines[0])


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- running a batch ---------------------------------------------------------------------


@pytest.mark.parametrize("method", ["forkserver", "fork", "spawn"])
def test_a_batch_runs_as_nobody(nobody: Nobody, manifest: Manifests, method: str) -> None:
    # Given a small batch of python and built-in jobs in nobody's folder
    jobs = [py_job("p1", "write_pdf"), py_job("p2", "write_pdf", "sub/p2.pdf"),
            {"id": "inv", "kind": "invoice", "input": str(INVOICE), "output": "inv/inv.pdf"}]
    m = manifest(jobs)
    q, out = nobody.home / "q", nobody.home / "out"
    # When nobody runs it
    proc = nobody.run("run", m, "--queue", q, "--out", out, "--workers", "2",
                      "--start-method", method, "--json")
    # Then every job completes, quietly, with a guard nobody can use
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert_quiet(proc.stderr)
    events = json_lines(proc.stdout)
    started = next(e for e in events if e["event"] == "runner_started")
    assert started["guard"] != "cgroup-v1"  # root-only here: sampling instead
    assert {e["job"] for e in events if e["event"] == "completed"} == {"p1", "p2", "inv"}
    for jid, rel in (("p1", "p1.pdf"), ("p2", "sub/p2.pdf")):
        assert_pdf(out / rel, jid)
    assert (out / "inv/inv.pdf").stat().st_uid == nobody.uid
    assert stray_temporaries(out) == [] and QueueView(q).tmp_entries() == []
    assert os.listdir(nobody.tmpdir) == []  # the runner's work folders went with it


def test_cgroup_v1_guard_asked_as_nobody_is_refused_before_enqueuing(
        nobody: Nobody, manifest: Manifests) -> None:
    m = manifest([py_job("p1", "write_pdf")])
    q = nobody.home / "q"
    proc = nobody.run("run", m, "--queue", q, "--out", nobody.home / "out",
                      "--memory-guard", "cgroup-v1")
    assert_one_line_error(proc, 2, "--memory-guard", "cgroup-v1")
    assert not q.exists()


def test_ceiling_and_timeout_still_enforced_as_nobody(nobody: Nobody, manifest: Manifests) -> None:
    # Given a job that allocates past its ceiling, and a command whose child outlives it
    pidfile = nobody.home / "child.pid"
    jobs = [
        py_job("hog", "allocate", mb=300, hold_s=10) | {"memory_mb": 100},
        {"id": "hang", "kind": "command", "output": "hang.pdf", "timeout_s": 1,
         "argv": ["sh", "-c", 'sleep 300 & echo $! > "$1"; sleep 300; : "$2"', "sh",
                  str(pidfile), "{output}"]},
    ]
    m = manifest(jobs, defaults={"max_attempts": 1})
    # When nobody runs them
    proc = nobody.run("run", m, "--queue", nobody.home / "q", "--out", nobody.home / "out",
                      "--kill-grace", "1", "--json")
    # Then the hog is killed as `memory`, the hang as `timeout`, its whole tree with it
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert_quiet(proc.stderr)
    dead = {e["job"]: e["outcome"] for e in json_lines(proc.stdout) if e["event"] == "dead"}
    assert dead == {"hog": "memory", "hang": "timeout"}
    assert not proctree.pid_alive(int(pidfile.read_text()))


# -- the other commands ---------------------------------------------------------------------


def test_commands_of_a_running_queue_as_nobody(nobody: Nobody, manifest: Manifests) -> None:
    # Given a --follow runner of nobody's with a long job running and a job dead-lettered
    pidfile = nobody.home / "c1.pid"
    m = manifest([py_job("c1", "sleep_then_write", s=120, pidfile=str(pidfile)),
                          py_job("f1", "fail") | {"max_attempts": 1}])
    q = nobody.home / "q"
    runner = nobody.runner(m, "--queue", q, "--out", nobody.home / "out", "--follow",
                           "--json")
    try:
        wait_for_pid(pidfile)
        runner.until(lambda line: '"dead"' in line and '"f1"' in line)

        def in_snapshot() -> bool:  # (top shows the runner's, written once a second)
            with contextlib.suppress(OSError, ValueError):
                state = json.loads((q / "runner.state.json").read_text())
                return any(j["id"] == "c1" for j in state["running"])
            return False

        wait_until(in_snapshot, timeout_s=10, what="the runner's snapshot to list c1")
        # When nobody looks at it and acts on it, then each command does its work, quietly
        for args, code, expect in (
                (("status",), 0, "running c1"),
                (("show", "c1"), 0, "running"),
                (("top", "--once"), 0, "running c1"),
                (("metrics",), 0, 'renderctl_jobs{state="running"} 1'),
                (("dead", "list"), 0, "f1"),
                (("cancel", "c1"), 0, "c1"),
                (("wait", "c1", "--timeout", "20"), 1, "c1: cancelled"),
                (("prune", "--older-than", "0s"), 0, "pruned 1"),
                (("dead", "retry", "f1"), 0, "retried 1")):
            proc = nobody.run(*args, "--queue", q)
            assert proc.returncode == code, (args, proc.stdout, proc.stderr)
            assert expect in proc.stdout, (args, proc.stdout)
            assert_quiet(proc.stderr)
        assert not proctree.pid_alive(int(pidfile.read_text()))
        runner.until(lambda line: '"dead"' in line and '"attempt": 2' in line)
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == 143
        assert_quiet(runner.stderr())
    finally:
        runner.close()


def test_runner_killed_mid_job_then_restarted_as_nobody(
        nobody: Nobody, manifest: Manifests) -> None:
    # Given nobody's runner SIGKILLed while a job runs, its worker and the job's child too
    log = nobody.home / "log"
    pidfile = nobody.home / "s.pid"
    jobs = [py_job(f"w{i}", "logged_write", log=str(log)) for i in range(3)]
    jobs.append(py_job("slow", "sleep_then_write", s=60, sleep_attempts=1,
                       pidfile=str(pidfile)))
    m = manifest(jobs)
    q, out = nobody.home / "q", nobody.home / "out"
    runner = nobody.runner(m, "--queue", q, "--out", out, "--workers", "2", "--json")
    try:
        for jid in ("w0", "w1", "w2"):  # recorded: a restart must not run them again
            runner.until(lambda line, jid=jid: '"completed"' in line and f'"{jid}"' in line)
    except BaseException:
        runner.close()
        raise
    kill_mid_job(runner, pidfile)
    # When nobody runs the queue again
    proc = nobody.run("run", "--queue", q, "--json")
    # Then every job completed once, nothing left behind
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert_quiet(proc.stderr)
    qv = QueueView(q)
    assert qv.ids("done") == {"w0", "w1", "w2", "slow"} and qv.ids("running") == set()
    runs = [line.split()[0] for line in log.read_text().splitlines()]
    assert sorted(runs) == ["w0", "w1", "w2"]
    assert_pdf(out / "slow.pdf", "slow")
    outcomes = [a["outcome"] for a in qv.record("done", "slow")["attempts"]]
    assert outcomes == ["crashed", "completed"]
    assert stray_temporaries(out) == [] and qv.tmp_entries() == []
    assert os.listdir(nobody.tmpdir) == []


def test_a_dead_runners_worker_group_now_another_users_is_left_alone(
        nobody: Nobody, manifest: Manifests) -> None:
    """A runner killed long ago left control/workers.*.json; one of its workers' process
    group ids now belongs to someone else's group (pids are reused). nobody may not signal
    it, and it is not renderctl's: the next runner goes on without it."""
    m = manifest([py_job("p1", "write_pdf")])
    q = nobody.home / "q"
    assert nobody.run("submit", m, "--queue", q, "--out", nobody.home / "out").returncode == 0
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)  # root's group
    try:
        stale = q / "control" / "workers.1.json"
        stale.write_text(json.dumps([{"pid": other.pid, "pgid": other.pid}]))
        nobody.chown(stale)
        proc = nobody.run("run", "--queue", q)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert_quiet(proc.stderr)
        assert other.poll() is None, "root's process was killed"
        assert QueueView(q).ids("done") == {"p1"}
    finally:
        other.kill()
        other.wait()


def test_a_dead_runners_deaf_worker_is_killed_by_the_next_command(
        nobody: Nobody, manifest: Manifests) -> None:
    """What kill_stale_workers is for: a worker deaf to its parent-death signal (every
    signal blocked) that outlived its runner and the reaper (stopped, then killed) is
    killed by the next command that takes the queue over: here `cancel` of its job."""
    pidfile = nobody.home / "deaf.pid"
    m = manifest([py_job("deaf", "deaf_then_write", pidfile=str(pidfile), how="blocked")])
    q = nobody.home / "q"
    runner = nobody.runner(m, "--queue", q, "--out", nobody.home / "out")
    try:
        worker = wait_for_pid(pidfile)
        reaper = next(p for p in psutil.Process(runner.pid).children()
                      if "reaper.py" in " ".join(p.cmdline()))
        parent = psutil.Process(worker).ppid()
        reaper.send_signal(signal.SIGSTOP)
        runner.kill()
    finally:
        runner.close()
    # Once its parent (the fork server) is gone, its parent-death signal is pending
    wait_until(lambda: not proctree.pid_alive(parent), what="the worker's parent to die")
    reaper.kill()
    assert proctree.pid_alive(worker), "precondition: the deaf worker outlived its runner"
    proc = nobody.run("cancel", "deaf", "--queue", q)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert_quiet(proc.stderr)
    assert not proctree.pid_alive(worker)
    assert QueueView(q).ids("cancelled") == {"deaf"}


def test_a_dead_runners_worker_group_id_now_the_users_own_other_group_is_left_alone(
        nobody: Nobody, manifest: Manifests) -> None:
    """The same user's own process group (a shell, another program) got the id a dead
    runner's worker had led: it is not renderctl's, and is not killed."""
    m = manifest([py_job("p1", "write_pdf")])
    q = nobody.home / "q"
    pidfile = nobody.home / "slow.pid"
    m2 = manifest([py_job("slow", "sleep_then_write", s=60, sleep_attempts=1,
                          pidfile=str(pidfile))],
                  name="slow.toml")
    # Given a runner of nobody's killed mid-job: its worker list stays in control/
    kill_mid_job(nobody.runner(m2, "--queue", q, "--out", nobody.home / "out"), pidfile)
    (stale,) = (q / "control").glob("workers.*.json")
    # And, since, its worker's group id went to another process group of nobody's
    mine = subprocess.Popen(["sleep", "300"], start_new_session=True, user=nobody.uid,
                            group=nobody.gid, extra_groups=[])
    try:
        entries = json.loads(stale.read_text())
        assert entries
        stale.write_text(json.dumps([e | {"pid": mine.pid, "pgid": mine.pid}
                                     for e in entries]))
        # When nobody's next runner starts
        assert nobody.run("submit", m, "--queue", q).returncode == 0
        proc = nobody.run("run", "--queue", q)
        # Then it runs the jobs, and leaves that group alone
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert mine.poll() is None, "nobody's unrelated process was killed"
        assert QueueView(q).ids("done") == {"p1", "slow"}
    finally:
        mine.kill()
        mine.wait()


# -- permissions ---------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o077, 0o022, 0o002])
def test_published_outputs_follow_the_umask(nobody: Nobody, manifest: Manifests,
                                            umask: int) -> None:
    """A published PDF gets the mode any file the user makes gets (its temporary is made
    by the job, and renamed into place as it is), and the folders renderctl makes for
    outputs those mkdir -p makes: 0777 less the umask (they were 0755 less it: a team's
    umask 002 could not share them). nobody's group (nogroup) is not a private one, so
    under 002 they are shared folders, where jobs write through a descriptor (README)."""
    jobs = [py_job("p1", "write_pdf", "sub/deeper/p1.pdf"),
            {"id": "inv", "kind": "invoice", "input": str(INVOICE), "output": "inv.pdf"}]
    m = manifest(jobs)
    out = nobody.home / "out"
    proc = nobody.run("run", m, "--queue", nobody.home / "q", "--out", out, umask=umask)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    for f in (out / "sub/deeper/p1.pdf", out / "inv.pdf"):
        assert oct(mode(f)) == oct(0o666 & ~umask), f
        assert f.stat().st_uid == nobody.uid
    for d in (out, out / "sub", out / "sub/deeper"):
        assert oct(mode(d)) == oct(0o777 & ~umask), d


def test_a_queue_of_roots_is_refused_cleanly_as_nobody(nobody: Nobody, manifest: Manifests) -> None:
    # Given a queue root made (0700) in nobody's folder
    m = manifest([py_job("p1", "write_pdf")])
    m2 = manifest([py_job("n1", "write_pdf")], name="more.toml")
    q, out = nobody.home / "q", nobody.home / "out"
    assert run_cli("submit", m, "--queue", q, "--out", out).returncode == 0
    # When nobody uses it, then each command exits 74 naming the queue, no traceback
    for args in (("status",), ("show", "p1"), ("submit", m2), ("run",), ("cancel", "p1"),
                 ("dead", "list"), ("top", "--once")):
        assert_one_line_error(nobody.run(*args, "--queue", q), 74, str(q.name),
                              "Permission denied")
    # And with the queue readable but not writable, reading works and writing is refused
    # before anything is accepted
    for d, _, files in os.walk(q):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(Path(d, f), 0o644)
    before = sorted(str(p.relative_to(q)) for p in q.rglob("*"))
    assert nobody.run("status", "--queue", q).returncode == 0
    for args in (("submit", m2), ("run", m2), ("cancel", "p1")):
        assert_one_line_error(nobody.run(*args, "--queue", q), 74, str(q), "Permission denied")
    assert sorted(str(p.relative_to(q)) for p in q.rglob("*")) == before
    with contextlib.suppress(FileNotFoundError):
        assert not (out / "n1.pdf").exists()
