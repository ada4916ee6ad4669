"""Job functions for the `run` integration tests, and the test-side helpers that drive them.

Two audiences, one module:

- **Job functions** (``fn(inputs, output, params)``) run inside a renderctl worker. A test
  copies this file next to its manifest (``stage``) and names them as
  ``callable = "jobfns:write_pdf"``; the worker puts the manifest's folder on ``sys.path``.
  They import only the standard library at module level (reportlab lazily), so that
  importing them is cheap and identical under every start method.
- **Test helpers** (``stage``, ``run_cli``, ``start_runner``, ``wait_until``, ``QueueView``,
  ``assert_pdf``) run in the pytest process: they start real ``renderctl`` processes and read
  the queue folder the way a script would (DESIGN.md: the layout is inspectable).

Fault injection is plain functions (``kill_self``, ``crash_once``, ``fail``), not mocks.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

# -- job functions (run inside a worker) ---------------------------------------------------

# Set by `observe_and_pollute`; a clean worker context means every job sees it unset.
POLLUTED: str | None = None
POLLUTING_ENV = "RCTL_TEST_POLLUTED"


def _pdf(output: Path, text: str) -> None:
    from reportlab.pdfgen import canvas

    c = canvas.Canvas(str(output))
    c.drawString(72, 720, text)
    c.showPage()
    c.save()


def write_one_byte(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    Path(output).write_bytes(b"x")


def write_pdf(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """A one-page PDF whose text is the job id (so a test can tell outputs apart)."""
    _pdf(Path(output), os.environ["RENDERCTL_JOB_ID"])


def leave_deep_tree(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Leave a tree ``params["depth"]`` folders deep in the working folder (made through
    descriptors: its path is past PATH_MAX), then write a PDF."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(params["depth"]):
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(fd)
    write_pdf(inputs, output, params)


def write_pdf_noting_parent(inputs: Sequence[Path], output: Path,
                            params: Mapping[str, Any]) -> None:
    """Write the job's pid and its parent's (os.getppid(), as `$PPID`) to
    ``params["pidfile"]``, then a PDF."""
    Path(params["pidfile"]).write_text(f"{os.getpid()} {os.getppid()}")
    write_pdf(inputs, output, params)


def count_sigconts(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write our pid to ``params["pidfile"]``; until ``params["go"]`` exists, keep the
    number of SIGCONTs delivered to us so far in ``params["countfile"]``; then write a PDF.
    Counted by the wake-up fd, to which the C-level handler writes a byte per delivery
    (Python runs its handler once for several that land before it looks)."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGCONT, lambda signum, frame: None)
    # Real-time, so that we run the moment a SIGCONT wakes us, before another sent just
    # after can merge with it (the worker puts the policy back after the job).
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    got = 0
    _write_pid(params["countfile"], got)
    _write_pid(params["pidfile"], os.getpid())
    while not os.path.exists(params["go"]):
        time.sleep(0.01)
        with contextlib.suppress(BlockingIOError):
            got += len(os.read(r, 4096))
            _write_pid(params["countfile"], got)
    write_pdf(inputs, output, params)


def decode_first_page(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Decode the content of ``inputs[0]``'s first page with pypdf (as a renderer reading
    it would), then write a PDF."""
    from pypdf import PdfReader

    contents = PdfReader(inputs[0]).pages[0].get_contents()
    assert contents is not None
    contents.get_data()
    write_pdf(inputs, output, params)


def stop_parent_then_write(inputs: Sequence[Path], output: Path,
                           params: Mapping[str, Any]) -> None:
    """SIGSTOP the worker's parent (the fork server, under forkserver), then write a PDF."""
    os.kill(os.getppid(), signal.SIGSTOP)
    write_pdf(inputs, output, params)


def kill_parent_then_write(inputs: Sequence[Path], output: Path,
                           params: Mapping[str, Any]) -> None:
    """Once ``params["wait_for"]`` exists (another job has started), SIGKILL the worker's
    parent (the fork server, under forkserver), write its pid to ``params["killed"]`` once it
    is gone, then write a PDF; or, given ``params["exit"]``, exit with that status at once;
    or, given ``params["hold"]``, write our pid to ``params["pidfile"]`` and hold for good.
    Given ``params["started"]``, first write our pid there."""
    if "started" in params:
        _write_pid(params["started"], os.getpid())
    while not os.path.exists(params["wait_for"]):
        time.sleep(0.005)
    server = os.getppid()
    os.kill(server, signal.SIGKILL)
    while os.getppid() == server:  # (until it is gone: then the runner's signal is sent)
        time.sleep(0.005)
    _write_pid(params["killed"], server)
    if "exit" in params:
        os._exit(params["exit"])
    if params.get("hold"):
        _write_pid(params["pidfile"], os.getpid())
        while True:
            time.sleep(1)
    write_pdf(inputs, output, params)


def copy_via_child(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Have a child process write the output (a copy of the input), as a job driving qpdf or
    Ghostscript does: subprocess closes the worker's descriptors in it."""
    subprocess.run(["cp", str(inputs[0]), str(output)], check=True)


def write_then_leave(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write a one-page PDF naming the job, and leave ``params["argv"]`` running with this
    worker's pid and the output's path appended (its pid in ``params["pidfile"]``)."""
    write_pdf(inputs, output, params)
    proc = subprocess.Popen([*params["argv"], str(os.getpid()), str(output)])
    _write_pid(params["pidfile"], proc.pid)


def write_then_hold_open(inputs: Sequence[Path], output: Path,
                         params: Mapping[str, Any]) -> None:
    """Write a one-page PDF naming the job, and leave a thread holding the output open for
    writing (as a writer thread the job did not wait for does); this worker's pid and that
    descriptor's number go to ``params["fdfile"]``."""
    import threading

    write_pdf(inputs, output, params)
    fh = open(output, "r+b")  # noqa: SIM115 (the thread holds it for good)
    threading.Thread(target=lambda: time.sleep(600) or fh, daemon=True).start()
    Path(params["fdfile"] + ".tmp").write_text(f"{os.getpid()} {fh.fileno()}\n")
    os.replace(params["fdfile"] + ".tmp", params["fdfile"])  # (read whole or not at all)


_left_open: Any = None


def leave_a_lock_open(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Lock ``params["lock"]`` (flock) through a file kept in a module global, never
    closed, as a careless job does; note the worker's pid in ``params["report"]``; then
    write a PDF."""
    import fcntl

    global _left_open
    _left_open = open(params["lock"], "a")  # noqa: SIM115
    fcntl.flock(_left_open, fcntl.LOCK_EX)
    with open(params["report"], "a") as rep:
        rep.write(json.dumps({"pid": os.getpid()}) + "\n")
    write_pdf(inputs, output, params)


_lost: list[Any] = []


def lose_a_wrapper_of_a_worker_fd(inputs: Sequence[Path], output: Path,
                                  params: Mapping[str, Any]) -> None:
    """Keep in a module global a file object over one of the worker's descriptors
    (``params["which"]``: "stdout", as ``os.fdopen(1)`` makes a line-buffered stdout, or
    "started", the worker's started log), and a file of its own; then write a PDF. Once
    the module is forgotten, a collection closes both."""
    if params["which"] == "stdout":
        _lost.append(os.fdopen(sys.stdout.fileno(), "w", 1))  # noqa: SIM115
    else:
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if "started." in os.readlink(f"/proc/self/fd/{fd}"):
                    _lost.append(os.fdopen(int(fd), "a"))  # noqa: SIM115
        assert _lost, "no started log found: the test proves nothing"
    _lost.append(open(params["file"], "a"))  # noqa: SIM115
    write_pdf(inputs, output, params)


class _Noisy:
    """Prints as it is collected, as a careless finalizer does."""

    def __init__(self) -> None:
        self.me = self  # (a cycle: only a collection frees it)

    def __del__(self) -> None:
        print("FINALIZER-SPOKE")


def lose_a_noisy_object(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Leave, in a module global, an object whose finalizer prints and a file of its own
    (so that the worker collects after the job); then write a PDF."""
    _lost.append(_Noisy())
    _lost.append(open(params["file"], "a"))  # noqa: SIM115
    write_pdf(inputs, output, params)


def take_the_lock(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Lock ``params["lock"]`` without waiting (fails if anyone holds it), note the worker's
    pid and every file this process has open in ``params["report"]``, then write a PDF."""
    import fcntl

    with open(params["lock"], "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    seen = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            seen.append(os.readlink(f"/proc/self/fd/{fd}"))
    with open(params["report"], "a") as rep:
        rep.write(json.dumps({"pid": os.getpid(), "open": seen}) + "\n")
    write_pdf(inputs, output, params)


def write_pdf_leaving_a_thread(inputs: Sequence[Path], output: Path,
                               params: Mapping[str, Any]) -> None:
    """Write a one-page PDF naming the job, and leave a thread running (its worker
    retires, handing back the jobs it was sent ahead)."""
    import threading

    write_pdf(inputs, output, params)
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()


def move_queue_first_time(inputs: Sequence[Path], output: Path,
                          params: Mapping[str, Any]) -> None:
    """Write a PDF; the first time (no ``params["to"]`` yet), move folder ``params["queue"]``
    there as the job ends, and if ``params["replace"]``, make a new empty one in its place:
    the runner meets the move in the commit of its result, before its once-a-poll look at
    the folder."""
    write_pdf(inputs, output, params)
    if not os.path.exists(params["to"]):
        os.rename(params["queue"], params["to"])
        if params.get("replace"):
            os.mkdir(params["queue"])


def kill_self(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def crash_once(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """SIGKILL the worker the first time (leaving ``params["marker"]``), succeed after."""
    marker = Path(params["marker"])
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    write_pdf(inputs, output, params)


def fail(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    raise RuntimeError(params.get("message", "this job always fails"))


def fail_at_length(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Raise with a message of ``params["chars"]`` characters, every line of it long too."""
    raise RuntimeError("start-of-message " + "x" * int(params["chars"]) + " end-of-message")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("this exception cannot be shown")


def fail_unprintably(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    raise _Unprintable()


def fail_until_marker(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Fail while ``params["marker"]`` is missing (a cause not yet fixed), then write a PDF."""
    if not Path(params["marker"]).exists():
        raise RuntimeError("not fixed yet")
    write_pdf(inputs, output, params)


def fail_once_then_hold(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Fail the first time (leaving ``params["marker"]``); after, hold as wait_for_go does."""
    marker = Path(params["marker"])
    if not marker.exists():
        marker.write_text("failed once")
        raise RuntimeError("first attempt fails")
    wait_for_go(inputs, output, params)


def invalid(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Raise InvalidInput; with ``params["go"]``, only once it exists (see wait_for_go)."""
    from renderctl.errors import InvalidInput

    if "go" in params:
        _hold_until_go(params)
    raise InvalidInput(params.get("message", "the input is unusable"))


def sleep_then_fail(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Sleep ``params["s"]``, then fail."""
    time.sleep(float(params["s"]))
    raise RuntimeError("failed after its sleep")


def sleep_then_write(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write our pid to ``params["pidfile"]`` (if given), sleep ``params["s"]``, write a PDF.

    With ``params["sleep_attempts"] = N`` only attempts 1..N sleep (a retry is quick).
    """
    if params.get("pidfile"):
        tmp = Path(params["pidfile"] + ".tmp")
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, params["pidfile"])  # a reader never sees a half-written pid
    if int(os.environ["RENDERCTL_ATTEMPT"]) <= int(params.get("sleep_attempts", 1 << 30)):
        time.sleep(float(params["s"]))
    write_pdf(inputs, output, params)


def burn_cpu_then_write(inputs: Sequence[Path], output: Path,
                        params: Mapping[str, Any]) -> None:
    """Spend ``params["cpu_s"]`` seconds of this process's CPU, then write a PDF."""
    end = time.process_time() + float(params["cpu_s"])
    while time.process_time() < end:
        pass
    write_pdf(inputs, output, params)


def stop_the_service(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """SIGTERM every process of the runner named by ``params["queue"]``'s runner.json, our
    own worker included (what a job running `systemctl restart` on its own service does
    under KillMode=control-group), then wait to die of it."""
    import psutil

    runner = psutil.Process(json.loads((Path(params["queue"]) / "runner.json").read_text())["pid"])
    for proc in [runner, *runner.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    time.sleep(60)


def exit_on_sigterm(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Handle SIGTERM by exiting with status 3 (a job that cleans up and stops when told
    to), write our pid to ``params["pidfile"]``, then sleep until told."""
    def stop(signum: int, frame: object) -> None:
        sys.exit(3)

    signal.signal(signal.SIGTERM, stop)
    _write_pid(params["pidfile"], os.getpid())
    time.sleep(600)


def exit_on_sigterm_saying_so(inputs: Sequence[Path], output: Path,
                              params: Mapping[str, Any]) -> None:
    """exit_on_sigterm, leaving ``params["said"]`` just before it exits."""
    def stop(signum: int, frame: object) -> None:
        Path(params["said"]).write_text("stopping")
        sys.exit(3)

    signal.signal(signal.SIGTERM, stop)
    _write_pid(params["pidfile"], os.getpid())
    time.sleep(600)


def scratch_then_hang(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Fill the job's working folder (its TMPDIR) with ``params["mb"]`` MB, then hang."""
    with open("scratch.bin", "wb") as fh:
        fh.write(b"\0" * (int(params["mb"]) << 20))
    time.sleep(600)


def deaf_then_write(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Start a ``setsid`` daemon, write our pid, then be deaf to signal handlers for a minute:
    inside one C call (``params["how"] == "c_call"``: no bytecode runs, so no Python handler
    does) or with every blockable signal blocked (``"blocked"``)."""
    import hashlib

    subprocess.Popen(["sleep", "60"], start_new_session=True)
    tmp = Path(params["pidfile"] + ".tmp")
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, params["pidfile"])
    if params["how"] == "c_call":
        hashlib.pbkdf2_hmac("sha256", b"x", b"y", 10**9)
    else:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        time.sleep(60)
    write_pdf(inputs, output, params)


def observe_and_pollute(inputs: Sequence[Path], output: Path,
                        params: Mapping[str, Any]) -> None:
    """Record what this job sees of earlier jobs' changes, then change all of it."""
    from reportlab import rl_config

    seen = {
        "job": os.environ["RENDERCTL_JOB_ID"],
        "pid": os.getpid(),
        "module_global": POLLUTED,
        "env": os.environ.get(POLLUTING_ENV),
        "cwd": os.getcwd(),
        "cwd_entries": sorted(os.listdir(".")),
        "rl_invariant": rl_config.invariant,
        "rl_page_compression": rl_config.pageCompression,
    }
    with open(params["report"], "a") as fh:
        fh.write(json.dumps(seen) + "\n")
    _pdf(Path(output), seen["job"])
    left = f"left-by-{seen['job']}"
    Path(left).write_text("a file the next job must not see")
    if params.get("immutable"):
        # Even root cannot remove it now (the test clears the flag afterwards).
        subprocess.run(["chattr", "+i", left], check=True)
    globals()["POLLUTED"] = seen["job"]
    os.environ[POLLUTING_ENV] = seen["job"]
    os.chdir(params["elsewhere"])
    rl_config.invariant = 1 - int(rl_config.invariant)
    rl_config.pageCompression = 1 - int(rl_config.pageCompression)


# -- test-side helpers (run in the pytest process) -----------------------------------------

HERE = Path(__file__).resolve().parent
RENDERCTL = [sys.executable, "-m", "renderctl.cli.app"]
LAUNCHER = [sys.executable, "-m", "renderctl"]  # the `renderctl` script's own entry point
STATES = ("pending", "running", "done", "dead", "cancelled", "expired")
TERMINAL = ("done", "dead", "cancelled", "expired")
T = TypeVar("T")


def stage(folder: Path) -> Path:
    """Copy this module into ``folder`` (where the manifest will be) and return ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "jobfns.py", folder / "jobfns.py")
    return folder


def py_job(job_id: str, fn: str, output: str | None = None, **params: Any) -> dict[str, Any]:
    job: dict[str, Any] = {"id": job_id, "kind": "python", "callable": f"jobfns:{fn}",
                           "output": output or f"{job_id}.pdf"}
    if params:
        job["params"] = params
    return job


def held_job(folder: Path, job_id: str, **fields: Any) -> tuple[dict[str, Any], Path]:
    """A job (``wait_for_go``) that runs until the test creates its go file, returned with
    it: ``folder/<id>.go``; its pid in ``folder/<id>.pid``. This module is staged in
    ``folder`` for a manifest written there; ``fields`` are more job fields (timeout_s...)."""
    stage(folder)
    go = folder / f"{job_id}.go"
    job = py_job(job_id, "wait_for_go", pidfile=str(folder / f"{job_id}.pid"), go=str(go))
    return {**job, **fields}, go


def orphan_a_job(folder: Path, write_manifest: Any, job_id: str = "a") -> tuple[Path, Path]:
    """A job left in running/ by a runner SIGKILLed while it ran (its worker and job die
    with it): the queue and output root, ``folder``/q and ``folder``/out."""
    queue, out = folder / "q", folder / "out"
    job, go = held_job(folder, job_id)
    runner = Runner(write_manifest([job]), *cli_args(queue, out, "--workers", "1"))
    try:
        wait_for_pid(folder / f"{job_id}.pid")
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(30)
    finally:
        go.touch()
        runner.close()
    return queue, out


_HOLD_SPAWNED_WORKERS = '''\
"""Test hook (jobfns.hold_spawned_workers): a worker spawned (`--start-method spawn`) while
ARMED exists waits, before multiprocessing reads its start data, until RELEASE exists: a
worker held in its start, still in the runner's process group. With ONCE, only the first;
with DIE, it exits (status 3) instead. A worker that takes a pass.N file (renamed: one
worker each) starts unheld."""
import os, sys, time
hold = os.environ.get("RCTL_TEST_HOLD_SPAWN")


def passed(hold):
    for name in sorted(os.listdir(hold)):
        if name.startswith("pass."):
            try:
                os.rename(hold + "/" + name, hold + "/taken-" + name)
                return True
            except FileNotFoundError:
                pass  # another worker took it
    return False


if hold and "--multiprocessing-fork" in sys.orig_argv and os.path.exists(hold + "/armed") \
        and not passed(hold):
    if os.path.exists(hold + "/die"):
        os._exit(3)
    try:
        if os.path.exists(hold + "/once"):
            os.rename(hold + "/armed", hold + "/taken")
        with open(hold + "/starting.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(hold + "/starting.tmp", hold + "/starting.pid")
    except FileNotFoundError:
        pass  # not held: another took the one hold
    else:
        while not os.path.exists(hold + "/release"):
            time.sleep(0.01)
'''


def hold_spawned_workers(folder: Path, *, once: bool = False, die: bool = False,
                         skip: int = 0) -> tuple[dict[str, str], Path]:
    """An environment for a `renderctl run --start-method spawn` whose spawned workers (all,
    or with ``once`` the first) are held in their start once ``hold/armed`` exists, before
    they say Ready, until ``hold/release`` exists (with ``die``, they exit there instead,
    status 3); the latest held one's pid is in ``hold/starting.pid``. With ``skip``, that
    many spawned workers start unheld first (armed from the start: arming once a worker
    was seen raced a successor started meanwhile). A ``sitecustomize``
    on PYTHONPATH: it runs in every new interpreter, before multiprocessing's spawn code.
    Returns (env, hold)."""
    hold = folder / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(_HOLD_SPAWNED_WORKERS)
    if once:
        (hold / "once").touch()
    if die:
        (hold / "die").touch()
    for n in range(skip):
        (hold / f"pass.{n}").touch()
    path = os.pathsep.join(p for p in (str(hold), os.environ.get("PYTHONPATH")) if p)
    return {"RCTL_TEST_HOLD_SPAWN": str(hold), "PYTHONPATH": path}, hold


def cli_args(queue: Path, out: Path, *extra: str) -> list[str]:
    return ["--queue", str(queue), "--out", str(out), *extra]


def run_cli(*args: str | os.PathLike[str], env: Mapping[str, str] | None = None,
            timeout: float = 60, cwd: Path | None = None,
            own_group: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``renderctl ARGS`` to completion (NO_COLOR, not a terminal); with ``own_group``
    in a process group of its own (see Runner)."""
    return subprocess.run([*RENDERCTL, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=_env(env), cwd=cwd,
                          process_group=0 if own_group else None)


class Runner:
    """A background ``renderctl run``: its stdout read line by line, without blocking."""

    def __init__(self, *args: str | os.PathLike[str], env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, new_session: bool = False,
                 own_group: bool = False) -> None:
        # new_session: the runner leads its own session and process group (as under
        # `timeout` or systemd), so a test can signal that whole group. own_group: a group
        # of its own in this session, as a shell's job control gives a command: unlike a
        # new session's, that group is not orphaned, so SIGTSTP (Ctrl-Z) can stop it.
        self._attach(subprocess.Popen([*RENDERCTL, "run", *map(str, args)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=_env(env), cwd=cwd, start_new_session=new_session,
                                      process_group=0 if own_group else None))

    @classmethod
    def of(cls, proc: subprocess.Popen[bytes]) -> Runner:
        """A `renderctl run` started some other way (as another user, say), its stdout and
        stderr pipes (bytes), read as this class reads its own."""
        runner = cls.__new__(cls)
        runner._attach(proc)
        return runner

    def _attach(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.lines: list[str] = []
        self._buf = b""
        self._eof = False

    def _read_some(self, timeout_s: float) -> None:
        import select

        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout_s))
        if not ready:
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            self._eof = True
        self._buf += chunk
        *complete, self._buf = self._buf.split(b"\n")
        self.lines.extend(c.decode() for c in complete)

    def read_available(self, quiet_s: float = 0.2) -> list[str]:
        """Read what the runner (stopped or dead) has written so far, until its stdout has
        been quiet for ``quiet_s``; every line read, all along."""
        while not self._eof:
            before = len(self.lines), len(self._buf)
            self._read_some(quiet_s)
            if (len(self.lines), len(self._buf)) == before:
                break
        return self.lines

    def until(self, predicate: Callable[[str], bool], *, timeout_s: float = 30) -> str:
        """Read stdout until a line satisfies ``predicate``; return that line."""
        seen = 0
        deadline = time.monotonic() + timeout_s
        while True:
            for line in self.lines[seen:]:
                if predicate(line):
                    return line
            seen = len(self.lines)
            if self._eof:
                raise AssertionError(f"runner exited ({self.proc.wait()}) before a matching "
                                     f"line; stdout {self.lines}; stderr {self.stderr()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching line within {timeout_s}s: {self.lines}")
            self._read_some(left)

    def wait(self, timeout_s: float = 60) -> int:
        """Wait for exit (reading stdout all along so the pipe never fills)."""
        deadline = time.monotonic() + timeout_s
        while not self._eof:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"runner still running after {timeout_s}s: {self.lines}")
            self._read_some(left)
        return self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        if self.proc.poll() is None:
            return "<still running>"
        return self.proc.stderr.read().decode(errors="replace")

    def kill(self) -> int:
        """SIGKILL the runner (if still alive) and reap it; returns its exit status."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RENDERCTL_CRASH_AT"}
    env["NO_COLOR"] = "1"
    # Tests freeze processes (SIGSTOP) at named points to order them, some holding a lock
    # another process then waits for: that wait must not give up on a holder stopped for
    # 5 s (lockwait) on a busy machine. The tests of giving up set their own.
    env["RENDERCTL_TEST_LOCK_STOPPED_S"] = "3600"  # (lockwait.STOPPED_PATIENCE_ENV)
    env.update(extra or {})
    return env


def waiting_for_a_lock(pid: int, path: Path | None = None) -> bool:
    """Whether process ``pid`` is blocked waiting for an flock (on ``path``'s file, if
    given): a "->" line of /proc/locks naming it; a lock tried and given up on at once
    leaves no trace."""
    key = None
    if path is not None:
        st = os.stat(path)
        key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as fh:
        for line in fh:
            # "2: -> FLOCK  ADVISORY  WRITE 26728 fe:00:2241294 0 EOF"
            f = line.split()
            if f[1:3] == ["->", "FLOCK"] and f[5] == str(pid) \
                    and (key is None or f[6] == key):
                return True
    return False


def cgroup_v1_writable() -> bool:
    """Whether a runner here can use the cgroup v1 memory guard (probed with a child group)."""
    from renderctl import guards

    try:
        guards.detect_memory_guard(prefer="cgroup-v1")  # probes with a child group, removed
    except guards.GuardError:
        return False
    return True


@contextlib.contextmanager
def child_cgroup(parent: Path, name: str) -> Iterator[Path]:
    """A cgroup ``name`` under ``parent`` for a runner to be started in (see run_in_cgroup);
    removed once the runner's processes and slots have left it."""
    group = parent / f"{name}-{os.getpid()}"
    group.mkdir()
    try:
        yield group
    finally:
        # The runner has exited; what it started (its reaper) may take a moment more.
        wait_until(lambda: not (group / "cgroup.procs").read_text().strip()
                   and not any(p.is_dir() for p in group.iterdir()),
                   what="the runner's processes and slots to leave the group")
        group.rmdir()


def run_in_cgroup(group: Path, tmp_path: Path, jobs: list[dict[str, Any]],
                  *args: str, wrapper: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """`renderctl run MANIFEST *args` of ``jobs`` (queue and outputs in ``tmp_path``),
    started inside ``group`` (written to its cgroup.procs before the exec), through
    ``wrapper`` (a command that execs the rest: `unshare ...`) if given."""
    with start_in_cgroup(group, tmp_path, jobs, *args, wrapper=wrapper) as proc:
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def start_in_cgroup(group: Path, tmp_path: Path, jobs: list[dict[str, Any]], *args: str,
                    wrapper: Sequence[str] = (), env: Mapping[str, str] | None = None
                    ) -> subprocess.Popen[str]:
    """Start what run_in_cgroup runs, and return it running (stdout and stderr piped);
    ``env``: variables added to ours."""
    stage(tmp_path)
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"jobs": jobs}))
    procs = str(group / "cgroup.procs")

    def enter() -> None:
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))

    return subprocess.Popen([*wrapper, *RENDERCTL, "run", str(manifest), "--queue",
                             str(tmp_path / "q"), "--out", str(tmp_path / "out"), *args],
                            preexec_fn=enter, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, env={**os.environ, **(env or {})})


def term_whole_service(pid: int) -> None:
    """SIGTERM to process ``pid`` and every process under it at once, as systemd's default
    stop (KillMode=control-group) sends it to a service."""
    import psutil

    for proc in [psutil.Process(pid), *psutil.Process(pid).children(True)]:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)


def wait_until(check: Callable[[], T], *, timeout_s: float = 20,
               what: str | Callable[[], str] = "condition", interval_s: float = 0.01) -> T:
    """Poll ``check`` until it returns something truthy (returned) or the deadline passes.

    ``what`` names the condition in the failure; a callable is asked only then (it may
    gather diagnostics, e.g. a runner's output so far)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {text}")
        time.sleep(interval_s)


def kill_mid_job(runner: Runner, pidfile: Path) -> int:
    """Once the job has written its pid to ``pidfile`` (sleep_then_write), SIGKILL the
    runner and wait for that worker to die with it (a zombie counts as dead); returns the
    worker's pid. What it leaves in the queue (running/, control/) is the test's."""
    try:
        worker = wait_for_pid(pidfile)
        runner.kill()
    finally:
        runner.close()
    from renderctl import proctree

    wait_until(lambda: not proctree.pid_alive(worker), what="the worker to die with its runner")
    return worker


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, e.g. at a RENDERCTL_STOP_AT point)."""
    import psutil

    return bool(psutil.Process(pid).status() == psutil.STATUS_STOPPED)


def resume_all(procs: Iterable[Any]) -> None:
    """SIGCONT each of ``procs`` (psutil handles) still there: a test's finally, so that a
    failed test leaves nothing stopped behind."""
    import psutil

    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.resume()


def signal_mask(pid: int, field: str = "SigIgn") -> int:
    """A signal set of ``pid`` from /proc/PID/status, bit ``n - 1`` for signal n: those it
    ignores (``SigIgn``), or catches with a handler (``SigCgt``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln.split()[1] for ln in status.splitlines()
                    if ln.startswith(f"{field}:")), 16)


def wait_for_pid(pidfile: Path, *, what: str = "the job to start") -> int:
    """The pid a job wrote to ``pidfile`` (see sleep_then_write), once it is there."""
    return int(wait_until(lambda: pidfile.exists() and pidfile.read_text(), what=what))


class QueueView:
    """The queue folder as a script reads it: ids per state folder, records as JSON."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def ids(self, state: str) -> set[str]:
        d = self.path / state
        if not d.is_dir():
            return set()
        return {n[:-5] for n in os.listdir(d) if n.endswith(".json")}

    def states_of(self, job_ids: Iterable[str]) -> dict[str, list[str]]:
        """Every folder each job is in (a correct queue has exactly one per job)."""
        where: dict[str, list[str]] = {j: [] for j in job_ids}
        for state in STATES:
            for jid in self.ids(state) & where.keys():
                where[jid].append(state)
        return where

    def all_ids(self) -> set[str]:
        return set().union(*(self.ids(s) for s in STATES))

    def record(self, state: str, job_id: str) -> dict[str, Any]:
        return json.loads((self.path / state / f"{job_id}.json").read_text())

    def tmp_entries(self) -> list[str]:
        """Temporaries left behind (the runner's spare record inodes, free.*, are not)."""
        return sorted(n for n in os.listdir(self.path / "tmp") if not n.startswith("free."))


def pdf_text(path: Path) -> tuple[int, str]:
    from pypdf import PdfReader

    reader = PdfReader(path)
    return len(reader.pages), "".join(p.extract_text() or "" for p in reader.pages)


def assert_pdf(path: Path, job_id: str) -> None:
    """A complete one-page PDF that names ``job_id``."""
    pages, text = pdf_text(path)
    assert pages == 1, f"{path}: {pages} pages"
    assert job_id in text, f"{path}: text {text!r} does not name {job_id}"


def sha256_of(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def same_page_pdf(path: Path, pages: int) -> None:
    """A small PDF whose page tree lists one page object ``pages`` times: cheap to write,
    and pypdf builds a page of its own for each (hundreds of MB in a stamp of 20,000)."""
    objs = {1: "<< /Type /Catalog /Pages 2 0 R >>",
            2: f"<< /Type /Pages /Kids [{' '.join(['3 0 R'] * pages)}] /Count {pages} >>",
            3: "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>"}
    out, offsets = b"%PDF-1.4\n", []
    for n, body in objs.items():
        offsets.append(len(out))
        out += f"{n} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += b"xref\n0 4\n0000000000 65535 f \n"
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size 4 /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    path.write_bytes(out)


def stray_temporaries(out: Path) -> list[Path]:
    """Output temporaries (``.rctl-*.tmp``) anywhere under the output root."""
    return sorted(out.rglob(".rctl-*.tmp"))


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def report_version_then_edit(inputs: Sequence[Path], output: Path,
                             params: Mapping[str, Any]) -> None:
    """Record the version of the job module `versioned` this job imported, then edit the
    module on disk so that the next job must run the new code (a longer file, new version)."""
    import importlib

    mod = importlib.import_module("versioned")
    with open(params["report"], "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "version": mod.VERSION,
                             "calls": mod.bump()}) + "\n")
    path = Path(mod.__file__)
    path.write_text(path.read_text().replace(f"VERSION = {mod.VERSION}",
                                             f"VERSION = {mod.VERSION + 1}  # edited"))
    _pdf(Path(output), os.environ["RENDERCTL_JOB_ID"])


def putenv_directly(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Change the process environment below os.environ (C level only), then succeed."""
    os.putenv(POLLUTING_ENV, "leaked")
    _pdf(Path(output), os.environ["RENDERCTL_JOB_ID"])


# -- hostile jobs: a python job runs inside its worker and can fight it ---------------------

def _write_pid(pidfile: str, pid: int) -> None:
    tmp = Path(pidfile + ".tmp")
    tmp.write_text(str(pid))
    os.replace(tmp, pidfile)


def leave_group_and_hang(inputs: Sequence[Path], output: Path,
                         params: Mapping[str, Any]) -> None:
    """Move the worker itself out of its process group (into a child's), then hang: a kill
    of the worker's group alone no longer reaches it."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.setpgid(0, 0)
        os.write(w, b"x")
        time.sleep(600)
        os._exit(0)
    os.read(r, 1)
    os.setpgid(0, child)
    _write_pid(params["pidfile"], os.getpid())
    time.sleep(float(params["s"]))
    write_pdf(inputs, output, params)


def leave_a_daemon(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Double-fork a setsid() daemon that holds ``params["mb"]`` MB and sleeps, then succeed
    (after hanging ``params["hang_s"]`` seconds, if given).

    The daemon writes its pid to ``params["pidfile"]`` once it holds the memory; with
    ``params["ignore_term"]`` it ignores SIGTERM, so that only a SIGKILL ends it. With
    ``params["exit_worker"]`` the job then ends its worker (``os._exit``) instead."""
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            if params.get("ignore_term"):
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            hold = bytearray(int(params.get("mb", 1)) << 20)
            hold[::4096] = b"x" * len(hold[::4096])
            _write_pid(params["pidfile"], os.getpid())
            os.write(w, b"x")
            time.sleep(600)
        os._exit(0)
    os.read(r, 1)
    if params.get("exit_worker"):
        os._exit(3)
    time.sleep(float(params.get("hang_s", 0)))
    write_pdf(inputs, output, params)


def start_a_process_on_term(inputs: Sequence[Path], output: Path,
                            params: Mapping[str, Any]) -> None:
    """Handle SIGTERM by starting a ``sleep`` in a new session (its pid to
    ``params["pidfile"]``), and hang on: a job that starts a process in its kill grace, and
    outside its group, where a kill of the group misses it. With ``params["exit_worker"]``
    it then ends its worker (``os._exit``) at once, before the grace is over."""
    def start(signum: int, frame: object) -> None:
        child = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        _write_pid(params["pidfile"], child.pid)
        if params.get("exit_worker"):
            os._exit(3)

    signal.signal(signal.SIGTERM, start)
    while True:
        time.sleep(3600)


def fail_if_alive(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Fail if the process named in ``params["pidfile"]`` still runs (a zombie does not)."""
    pid = int(Path(params["pidfile"]).read_text())
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        state = b"gone"
    if state not in (b"gone", b"Z", b"X"):
        raise RuntimeError(f"process {pid}, left by an earlier job, still runs ({state!r})")
    write_pdf(inputs, output, params)


def allocate(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Hold ``params["mb"]`` MB (touched) while writing a PDF, and for ``params["hold_s"]``
    seconds more (long enough for a sampling guard to see it whole)."""
    hold = bytearray(int(params["mb"]) << 20)
    hold[::4096] = b"x" * len(hold[::4096])
    write_pdf(inputs, output, params)
    time.sleep(float(params.get("hold_s", 0)))
    del hold


def leak_memory(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Keep ``params["mb"]`` MB (touched) alive after the job, as a module-level cache or a
    C extension's leak would, then write a PDF."""
    import builtins

    hold = bytearray(int(params["mb"]) << 20)
    hold[::4096] = b"x" * len(hold[::4096])
    builtins.__dict__.setdefault("_rctl_test_leak", []).append(hold)
    write_pdf(inputs, output, params)


def fill_cache(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write and fsync a ``params["mb"]`` MB file at ``params["path"]`` that outlives the job:
    page cache charged to the job's slot, then write a PDF."""
    with open(params["path"], "wb") as fh:
        block = b"c" * (1 << 20)
        for _ in range(int(params["mb"])):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    write_pdf(inputs, output, params)


def leak_and_tidy(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Leak ``params["mb"]`` MB (as leak_memory) and delete the file at ``params["path"]``,
    whose page cache goes with it: the slot's usage barely moves, its held memory grows."""
    leak_memory(inputs, output, params)
    os.unlink(params["path"])


def logged_write(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Append "<job id> <pid>" to ``params["log"]`` (one line per execution), then write a
    PDF (after ``params["s"]`` seconds, if given): a test counts executions, whatever the
    queue recorded. With ``params["raw"]``, one byte instead of a PDF (a job as short as
    one can be: no reportlab, and no PDF check of its output)."""
    with open(params["log"], "a") as fh:
        fh.write(f"{os.environ['RENDERCTL_JOB_ID']} {os.getpid()}\n")
    time.sleep(float(params.get("s", 0)))
    if params.get("raw"):
        Path(output).write_bytes(b"x")
    else:
        write_pdf(inputs, output, params)


def logged_hold(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Append "<job id> <pid>" to ``params["log"]``, then run until ``params["go"]`` exists
    and at least ``params["min_s"]`` seconds have passed, then write a PDF."""
    start = time.monotonic()
    with open(params["log"], "a") as fh:
        fh.write(f"{os.environ['RENDERCTL_JOB_ID']} {os.getpid()}\n")
    while not os.path.exists(params["go"]) or time.monotonic() - start < params["min_s"]:
        time.sleep(0.005)
    write_pdf(inputs, output, params)


def stage_scratch(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Leave a ``params["mb"]`` MB intermediate file in the job's working directory (the
    worker empties it after the job), as a render staging images would, then write a PDF."""
    with open("stage.bin", "wb") as fh:
        block = b"s" * (1 << 20)
        for _ in range(int(params["mb"])):
            fh.write(block)
    write_pdf(inputs, output, params)


def _close_all_but_sockets() -> None:
    """Close every descriptor above stderr except sockets (the worker's to the runner), as
    a careless daemonizing library might."""
    import stat

    for fd in map(int, os.listdir("/proc/self/fd")):
        if fd > 2:
            with contextlib.suppress(OSError):
                if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                    os.close(fd)


def close_worker_fds(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """_close_all_but_sockets, then write a good PDF."""
    _close_all_but_sockets()
    write_pdf(inputs, output, params)


def close_worker_fds_then_sleep(inputs: Sequence[Path], output: Path,
                                params: Mapping[str, Any]) -> None:
    """_close_all_but_sockets, then sleep ``params["s"]`` before writing the PDF."""
    _close_all_but_sockets()
    time.sleep(float(params["s"]))
    write_pdf(inputs, output, params)


def unlock_every_fd_then_sleep(inputs: Sequence[Path], output: Path,
                               params: Mapping[str, Any]) -> None:
    """flock(LOCK_UN) every descriptor this process has (a lock the runner holds through a
    shared open file would be released), write our pid to ``params["pidfile"]``, sleep
    ``params["s"]``, write a PDF."""
    import fcntl

    for fd in map(int, os.listdir("/proc/self/fd")):
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
    _write_pid(params["pidfile"], os.getpid())
    time.sleep(float(params["s"]))
    write_pdf(inputs, output, params)


def close_all_fds_then_sleep(inputs: Sequence[Path], output: Path,
                             params: Mapping[str, Any]) -> None:
    """Write our pid to ``params["pidfile"]``, close every descriptor above stderr (the
    worker's connection to the runner included), then sleep ``params["s"]``."""
    _write_pid(params["pidfile"], os.getpid())
    os.closerange(3, 65536)
    time.sleep(float(params["s"]))


def exhaust_fds(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write a good PDF, then open /dev/null until the process has no descriptor left, and
    leave them all open (a library leaking a file per call, called once too often)."""
    write_pdf(inputs, output, params)
    leaked = []
    with contextlib.suppress(OSError):
        while True:
            leaked.append(os.open("/dev/null", os.O_RDONLY))


def shout_then_wait(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write ``params["mb"]`` MB to stdout (a chatty library stuck in a loop) and a last line
    to stderr, write our pid to ``params["pidfile"]``, wait for ``params["go"]``, write a PDF."""
    block = b"x" * 1023 + b"\n"
    block *= 1024
    for _ in range(int(params["mb"])):
        os.write(1, block)
    os.write(2, b"the last words\n")
    wait_for_go(inputs, output, params)


def fork_until_refused(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """A fork bomb with a bound: fork children that wait to be killed, up to
    ``params["most"]`` or until a fork is refused; the PDF says which came first, and
    ``params["pids"]`` lists the children."""
    made, refused, children = 0, "never refused", []
    try:
        while made < params["most"]:
            pid = os.fork()
            if pid == 0:
                time.sleep(300)  # the job's end kills it (its worker clears the group)
                os._exit(0)
            children.append(pid)
            made += 1
    except OSError as exc:
        refused = f"refused ({exc.strerror})"
    Path(params["pids"]).write_text(" ".join(map(str, children)))
    _pdf(output, f"forked {made}, {refused}")


def wait_for_go(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write our pid to ``params["pidfile"]``, wait until ``params["go"]`` exists, write a PDF
    (the test decides when this job ends)."""
    _hold_until_go(params)
    write_pdf(inputs, output, params)


def write_then_hold_first_time(inputs: Sequence[Path], output: Path,
                               params: Mapping[str, Any]) -> None:
    """Write a PDF; the first time (no ``params["marker"]`` yet), make the marker, then hold
    as wait_for_go does before returning."""
    write_pdf(inputs, output, params)
    if not os.path.exists(params["marker"]):
        Path(params["marker"]).write_text("held")
        _hold_until_go(params)


def _hold_until_go(params: Mapping[str, Any]) -> None:
    _write_pid(params["pidfile"], os.getpid())
    while not os.path.exists(params["go"]):
        time.sleep(0.005)


def count_runs(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Log the run's ``params["version"]`` to ``params["log"]`` (a file the test keeps off
    the disk it cuts), sleep ``params["s"]``, write a PDF."""
    with open(params["log"], "a") as log:
        log.write(params["version"] + "\n")
    time.sleep(params.get("s", 0))
    write_pdf(inputs, output, params)


def cut_power(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Bring the machine down after ``params["after_s"]``, as a job that crashes its host
    would: shut down the file system mounted at ``params["mnt"]`` (ext4's shutdown ioctl
    without a log flush, see test_power_loss.py), saying so first in ``params["flag"]``."""
    import fcntl
    import struct

    time.sleep(params["after_s"])
    Path(params["flag"]).touch()
    fd = os.open(params["mnt"], os.O_RDONLY)
    fcntl.ioctl(fd, 0x8004587D, struct.pack("I", 2))  # EXT4_IOC_SHUTDOWN, NOLOGFLUSH
    time.sleep(3600)


def fill_workdir_then_hold(inputs: Sequence[Path], output: Path,
                           params: Mapping[str, Any]) -> None:
    """Fill the file system of the job's working folder (TMPDIR), then say so in
    ``params["marker"]``, hold as wait_for_go does, and fail (its file goes with it)."""
    with contextlib.suppress(OSError), open("fill.bin", "wb", buffering=0) as f:
        while True:
            f.write(b"x" * 65536)
    Path(params["marker"]).write_text("full")
    _hold_until_go(params)
    raise RuntimeError("filled its working folder")


def grow_output_after_go(inputs: Sequence[Path], output: Path,
                         params: Mapping[str, Any]) -> None:
    """Write ``params["mb"]`` MB of the output, say so in ``params["marker"]``, hold as
    wait_for_go does, then keep writing it until the disk refuses: Python's own
    "[Errno 28] No space left on device", which names no file."""
    with open(output, "wb") as f:
        f.write(b"x" * (int(params["mb"]) << 20))
        f.flush()
        Path(params["marker"]).write_text("written")
        _hold_until_go(params)
        while True:
            f.write(b"x" * 65536)
            f.flush()


def write_until_full(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write the output until its disk refuses (an output that can never fit)."""
    with open(output, "wb") as f:
        while True:
            f.write(b"x" * 65536)
            f.flush()


def write_then_hang(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write the output, tell ``params["pidfile"]``, then hang (until killed)."""
    write_pdf(inputs, output, params)
    _write_pid(params["pidfile"], os.getpid())
    time.sleep(600)


def lift_my_ceiling(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Remove the memory ceiling of the worker's own cgroup (as root can), then hold
    ``params["mb"]`` MB while writing a PDF."""
    from renderctl.guards import _own_cgroup_dir

    slot = _own_cgroup_dir(True)
    assert slot is not None, "not in a cgroup v1 memory group"
    for name in ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes"):
        with contextlib.suppress(FileNotFoundError):
            (slot / name).write_text("-1")
    allocate(inputs, output, params)


def plant_in_spares(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Once the queue (``params["queue"]``) has spare record files (tmp/free.*), put a
    ``params["what"]`` in each one's place: a FIFO, a folder, or a symlink or hard link to
    ``params["target"]``; then write the output PDF."""
    tmp = Path(params["queue"]) / "tmp"
    deadline = time.monotonic() + 20
    while not (spares := [p for p in tmp.iterdir() if p.name.startswith("free.")]):
        if time.monotonic() > deadline:
            raise AssertionError("no spare record file appeared")
        time.sleep(0.01)
    for spare in spares:
        spare.unlink()
        if params["what"] == "fifo":
            os.mkfifo(spare)
        elif params["what"] == "folder":
            (spare / "inside").mkdir(parents=True)
        elif params["what"] == "hardlink":
            os.link(params["target"], spare)
        else:
            spare.symlink_to(params["target"])
    _pdf(Path(output), os.environ["RENDERCTL_JOB_ID"])


def fifo_for_file(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Put a FIFO in place of the file ``params["path"]``, then write the output PDF."""
    path = Path(params["path"])
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    _pdf(Path(output), os.environ["RENDERCTL_JOB_ID"])


def folder_for_file(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Put a folder (not empty) in place of the file ``params["path"]``; write the output."""
    path = Path(params["path"])
    path.unlink(missing_ok=True)
    (path / "inside").mkdir(parents=True)
    _pdf(Path(output), os.environ["RENDERCTL_JOB_ID"])


def count_collected(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write how many objects a garbage collection in this job walks (JSON)."""
    import gc

    output.write_text(json.dumps({"objects": len(gc.get_objects()), "pid": os.getpid()}))


def observe_process(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Record the process-wide state a python job could change (see cleanslate.py), as this
    job finds it, including what a subprocess inherits."""
    import builtins
    import csv
    import decimal
    import gc
    import locale
    import logging
    import random
    import resource
    import socket
    import tracemalloc
    import warnings

    child = subprocess.run(["sh", "-c", 'echo "$RCTL_TEST_PUTENV $RCTL_TEST_POSIX"; '
                            'grep -E "^Sig(Ign|Blk)" /proc/self/status'],
                           capture_output=True, text=True, check=True)
    stdin = os.fstat(0)
    seen = {
        "pid": os.getpid(),
        "threads": len(sys._current_frames()),
        "umask": os.umask(0o022),
        "handlers": {int(s): str(signal.getsignal(s)) for s in signal.valid_signals()
                     if s not in (signal.SIGKILL, signal.SIGSTOP)},
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
        "tz": [time.tzname, time.timezone],
        "locale": locale.setlocale(locale.LC_ALL),
        "switch": sys.getswitchinterval(),
        "stdout_is_real": sys.stdout is sys.__stdout__,
        "vtimer": signal.getitimer(signal.ITIMER_VIRTUAL),
        "child": child.stdout,
        "decimal": [decimal.getcontext().prec, decimal.DefaultContext.prec,
                    str(decimal.Decimal(2).sqrt())],
        "socket_timeout": socket.getdefaulttimeout(),
        "warnings": [str(f) for f in warnings.filters],
        "root_logger": [logging.root.level, len(logging.root.handlers)],
        "pypdf_logger": logging.getLogger("pypdf").level,
        "job_logger": len(logging.getLogger("renderctl-test-job").handlers),
        "logging_disable": logging.root.manager.disable,
        "argv": sys.argv,
        "gc": [gc.isenabled(), list(gc.get_threshold())],
        "int_digits": sys.get_int_max_str_digits(),
        "hooks": [str(h) for h in (sys.excepthook, sys.gettrace(), sys.getprofile())],
        "affinity": sorted(os.sched_getaffinity(0)),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "random": random.random(),  # unseeded: differs between observers (a seed leaks 0.134)
        # (the worker is the same: its builtins are the same objects, by id)
        "builtins": {name: id(value) for name, value in vars(builtins).items()},
        "csv_field_limit": csv.field_size_limit(),
        "meta_path": [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path],
        "path_hooks": [getattr(h, "__qualname__", type(h).__name__) for h in sys.path_hooks],
        "scheduler": os.sched_getscheduler(0),
        "stack_size": threading.stack_size(),
        "environ_type": type(os.environ).__name__,
        # C threads too (a faulthandler watchdog), which "threads" does not count
        "tasks": len(os.listdir("/proc/self/task")),
        # (audit BY)
        "json_module": getattr(sys.modules.get("json"), "__name__", None),
        "spy_finder": any(type(f).__name__ == "_SpyFinder"
                          or any(getattr(loader, "__name__", "") == "_SpyLoader"
                                 for _, loader in getattr(f, "_loaders", ()))
                          for f in sys.path_importer_cache.values()),
        "level_aliases": [logging.getLevelName("WARN"), logging.getLevelName("FATAL")],
        "stdout_settings": [sys.stdout.encoding, sys.stdout.errors],
        "gc_debug": [gc.get_debug(), len(gc.callbacks)],
        "tracing": tracemalloc.is_tracing(),
        "dont_write_bytecode": sys.dont_write_bytecode,
        "stdin": [stdin.st_dev, stdin.st_ino],
        "logging_globals": [logging.getLogRecordFactory().__name__,
                            logging.getLoggerClass().__name__,
                            logging.getLevelName(logging.INFO),
                            logging.raiseExceptions],
        # (audit DL)
        "stdio": [_stream_state(s) for s in (sys.stdin, sys.stdout, sys.stderr,
                                             sys.__stdin__, sys.__stdout__, sys.__stderr__)],
        "wakeup_fd": signal.set_wakeup_fd(-1),
        "event_loop": _current_event_loop(),
        # (audit EU) what only prctl() sets: the subreaper flag (cleared, a later job's
        # double-forked helper went to the runner, which killed it mid-job), dumpable, name
        "prctl": _prctl_flags(),
    }
    os.umask(seen["umask"])
    with open(params["report"], "a") as fh:
        fh.write(json.dumps(seen) + "\n")
    write_pdf(inputs, output, params)


def pollute_process(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Change all of what observe_process records, and leave it changed."""
    import builtins
    import csv
    import decimal
    import gc
    import io
    import locale
    import logging
    import random
    import resource
    import socket
    import warnings

    write_pdf(inputs, output, params)
    os.umask(0)
    for sig in (signal.SIGQUIT, signal.SIGTSTP, signal.SIGRTMIN + 3, signal.SIGWINCH):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGUSR2])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    os.environ["TZ"] = "JST-9"
    time.tzset()
    current = locale.setlocale(locale.LC_NUMERIC)
    locale.setlocale(locale.LC_NUMERIC, "C" if current != "C" else "C.UTF-8")
    sys.setswitchinterval(0.5)
    sys.stdout = io.StringIO()
    os.putenv("RCTL_TEST_PUTENV", "leaked")
    signal.setitimer(signal.ITIMER_VIRTUAL, 3600)
    decimal.getcontext().prec = 3
    decimal.DefaultContext.prec = 5
    socket.setdefaulttimeout(0.001)
    warnings.simplefilter("error")
    logging.basicConfig(level=logging.DEBUG)
    logging.getLogger("pypdf").setLevel(logging.CRITICAL)
    logging.getLogger("renderctl-test-job").addHandler(logging.StreamHandler())
    logging.disable(logging.ERROR)
    sys.argv[:] = ["polluted"]
    gc.disable()
    gc.set_threshold(1, 1, 1)
    sys.set_int_max_str_digits(640)
    sys.excepthook = lambda *a: None
    sys.settrace(lambda *a: None)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    os.nice(5)
    random.seed(1)
    # A global for every module, a builtin replaced (behaving the same: the worker's own
    # code runs with it until the job's end is cleaned up), and one deleted
    builtins.LEAKED = True  # type: ignore[attr-defined]
    real_round = round
    builtins.round = lambda *a: real_round(*a)
    del builtins.copyright
    # The import machinery, the scheduling policy, the thread stack size, a pending
    # faulthandler watchdog (with exit=True it killed the next job), os.environ rebound
    sys.meta_path.insert(0, _SpyFinder())
    sys.path_hooks.insert(0, _spy_path_hook)
    # (made by importlib, loaded before any job: a job's all the same)
    import importlib.machinery

    sys.path_hooks.insert(0, importlib.machinery.FileFinder.path_hook(
        (importlib.machinery.SourceFileLoader, [".py"])))
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    threading.stack_size(1 << 20)
    faulthandler.dump_traceback_later(30, exit=True)
    os.environ = dict(os.environ)  # type: ignore[assignment]  # noqa: B003
    csv.field_size_limit(5)
    # Past the watchers and the module table (audit BY): a finder of its own cached for a
    # sys.path entry, a module replaced, signal and environment set through their C
    # modules, stdout's settings, gc debugging, tracemalloc, bytecode writing, stdin, and
    # logging's factories and level names
    import _signal
    import posix
    import tracemalloc
    import types

    sys.path_importer_cache[os.getcwd()] = _SpyFinder()
    from importlib.machinery import FileFinder, SourceFileLoader

    spy_loader = type("_SpyLoader", (SourceFileLoader,), {})
    sys.path_importer_cache[os.path.dirname(__file__)] = FileFinder(
        os.path.dirname(__file__), (spy_loader, [".py"]))
    sys.modules["json"] = types.ModuleType("json-forged")
    _signal.signal(_signal.SIGUSR1, _signal.SIG_IGN)
    posix.putenv("RCTL_TEST_POSIX", "leaked")
    sys.__stdout__.reconfigure(encoding="ascii", errors="strict")  # type: ignore[union-attr]
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.callbacks.append(lambda *a: None)
    tracemalloc.start()
    sys.dont_write_bytecode = not sys.dont_write_bytecode
    secret = os.open(__file__, os.O_RDONLY)
    os.dup2(secret, 0)
    os.close(secret)
    logging.setLogRecordFactory(lambda *a, **k: logging.LogRecord(*a, **k))
    logging.setLoggerClass(type("JobLogger", (logging.Logger,), {}))
    logging.addLevelName(logging.INFO, "JOB-SECRET")
    logging.raiseExceptions = not logging.raiseExceptions
    # (audit DL) asyncio's current loop (none after asyncio.run, for good), a signal wakeup
    # descriptor (closed: its number is the next file opened), the standard streams closed
    # or detached (`sys.stdout = TextIOWrapper(sys.stdout.detach())`)
    import asyncio

    asyncio.run(asyncio.sleep(0))
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    os.close(r)
    os.close(w)
    sys.stdin.close()
    sys.__stdout__.detach()  # type: ignore[union-attr]
    sys.stderr.close()
    # (audit EU)
    import ctypes

    libc = ctypes.CDLL(None)
    prctl = libc.prctl
    prctl(36, 0, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER off
    prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE off
    prctl(15, ctypes.c_char_p(b"polluted"), 0, 0, 0)  # PR_SET_NAME
    # (review ET) keepcaps, THP off, machine-check kill early, a 32-bit personality, and
    # what another process can set from outside: timer slack, I/O priority, OOM score
    prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS
    prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE
    prctl(33, 1, 1, 0, 0)  # PR_MCE_KILL, PR_MCE_KILL_SET, PR_MCE_KILL_EARLY
    libc.personality(0x0008)  # PER_LINUX32
    prctl(29, 200_000_000, 0, 0, 0)  # PR_SET_TIMERSLACK: 200 ms
    _set_ioprio_idle_and_oom(os.getpid())


def _prctl_flags() -> list[Any]:
    import ctypes

    libc = ctypes.CDLL(None)
    prctl = libc.prctl
    subreaper = ctypes.c_int(-1)
    prctl(37, ctypes.byref(subreaper), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
    name = ctypes.create_string_buffer(16)
    prctl(16, name, 0, 0, 0)  # PR_GET_NAME
    # PR_GET_DUMPABLE, _KEEPCAPS, _THP_DISABLE, _MCE_KILL_GET, _TIMERSLACK; personality;
    # ioprio_get (x86_64); oom_score_adj
    return [subreaper.value, name.value.decode(),
            *(prctl(n, 0, 0, 0, 0) for n in (3, 7, 42, 34, 30)),
            libc.personality(0xFFFFFFFF), libc.syscall(252, 1, 0),
            Path("/proc/self/oom_score_adj").read_text().strip()]


def _set_ioprio_idle_and_oom(pid: int) -> None:
    """As a command job could, by pid: `ionice -c3 -p PID`, and its OOM score raised."""
    subprocess.run(["ionice", "-c", "3", "-p", str(pid)], check=True)
    Path(f"/proc/{pid}/oom_score_adj").write_text("900")


def read_stdin(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Append what this job reads from sys.stdin and from fd 0 to ``params["report"]``
    (one JSON line); with ``params["close"]``, then close sys.stdin; write a PDF."""
    seen = {"sys.stdin": sys.stdin.read(100), "fd0": os.read(0, 100).decode()}
    with open(params["report"], "a") as fh:
        fh.write(json.dumps(seen) + "\n")
    if params.get("close"):
        sys.stdin.close()
    write_pdf(inputs, output, params)


def _stream_state(stream: Any) -> str:
    try:
        return "closed" if stream.closed else "open"
    except ValueError:
        return "detached"


def _current_event_loop() -> str:
    import asyncio
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return type(asyncio.get_event_loop()).__name__
        except RuntimeError as exc:
            return str(exc)


class _SpyFinder:
    """A finder that sees every import (and could answer with its own module)."""

    def find_spec(self, *args: Any) -> None:
        return None


def _spy_path_hook(path: str) -> Any:
    raise ImportError(path)


def taint_worker(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write the output, record our pid, then change the worker in a way no job's end can
    undo (``params["what"]``): an audit hook (logging each event, with the job id, to
    ``params["log"]``), a fork handler, no_new_privs, its user (root gives itself up for
    nobody), or what the clean-up cannot even read (``unrestorable``); or import a library
    that registers a fork handler of its own; or unfreeze the worker's heap."""
    write_pdf(inputs, output, params)
    with open(params["report"], "a") as fh:
        fh.write(json.dumps({"pid": os.getpid()}) + "\n")
    what = params["what"]
    if what == "audithook":
        log = params["log"]

        busy: list[bool] = []

        def hook(event: str, args: Any) -> None:
            if event == "open" and not busy:
                busy.append(True)  # (its own open is audited too)
                try:
                    with open(log, "a") as fh:
                        fh.write(f"{os.environ.get('RENDERCTL_JOB_ID')} {event}\n")
                finally:
                    busy.clear()

        sys.addaudithook(hook)
    elif what == "atfork":
        # Every later fork of the worker: a command's child exited 7 before its exec.
        os.register_at_fork(after_in_child=lambda: os._exit(7))
    elif what == "atfork_posix":
        import posix

        posix.register_at_fork(after_in_child=lambda: os._exit(7))
    elif what == "library_atfork":
        # A library's own, as it is imported: stays, and the worker with it.
        import concurrent.futures.thread  # noqa: F401
    elif what == "unrestorable":
        # What the worker's clean-up cannot take back: a filter it cannot compare (a list)
        import warnings

        warnings.filters.insert(0, ["ignore", None, Warning, None, 0])  # type: ignore[arg-type]
    elif what == "no_new_privs":
        import ctypes

        assert ctypes.CDLL(None).prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    elif what == "setuid":
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    elif what == "seteuid":
        os.seteuid(65534)
        os.seteuid(0)
    elif what == "securebits":
        # (review ET) SECBIT_NOROOT and its lock: later jobs' children had no capabilities
        import ctypes

        assert ctypes.CDLL(None).prctl(28, 0x3, 0, 0, 0) == 0  # PR_SET_SECUREBITS
    elif what == "unfreeze":
        # (audit EU) the worker's heap, frozen, walked by every later job's collection
        import gc

        gc.unfreeze()


def hardlink_output(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Make the output a hard link to ``params["target"]`` (a file outside the output root)."""
    os.link(params["target"], output)


def escape_as_sibling(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Start a process with clone(CLONE_PARENT): a sibling of the worker, not its child, so
    outside every tree a kill of the worker takes; it leaves its session too, writes its pid
    to ``params["pidfile"]`` and sleeps. Then write the output and return (after hanging
    ``params["hang_s"]``, if given)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    clone_parent = 0x00008000
    pid = libc.syscall(56, clone_parent | signal.SIGCHLD, 0, 0, 0, 0)  # x86-64 clone
    if pid == 0:
        try:
            os.setsid()
            _write_pid(params["pidfile"], os.getpid())
            while True:
                time.sleep(1)
        finally:
            os._exit(0)
    assert pid > 0, ctypes.get_errno()
    while not os.path.exists(params["pidfile"]):
        time.sleep(0.001)
    time.sleep(float(params.get("hang_s", 0)))
    if params.get("fail"):
        raise RuntimeError("failed after making a sibling")
    write_pdf(inputs, output, params)


def report_alive(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Record whether the process in ``params["pidfile"]`` is alive as this job starts (a
    zombie counts as dead), then write the output."""
    pid = int(Path(params["pidfile"]).read_text())
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    Path(params["report"]).write_text(json.dumps({"alive": state not in ("gone", "Z", "X")}))
    write_pdf(inputs, output, params)


def join_runner_group_and_end_worker(inputs: Sequence[Path], output: Path,
                                     params: Mapping[str, Any]) -> None:
    """Fork a child that joins the runner's process group (the fork server's) and sleeps,
    writing its pid to ``params["pidfile"]``; then end the worker (os._exit)."""
    group = os.getpgid(os.getppid())
    r, w = os.pipe()
    if os.fork() == 0:
        try:
            os.setpgid(0, group)
            _write_pid(params["pidfile"], os.getpid())
            os.write(w, b"x")
            while True:
                time.sleep(1)
        finally:
            os._exit(0)
    os.read(r, 1)
    os._exit(0)


def leave_a_thread(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Start a thread that outlives the job (it would go on running in the next job)."""
    import threading

    threading.Thread(target=time.sleep, args=(600,),
                     daemon=bool(params.get("daemon", True))).start()
    _write_pid(params["pidfile"], os.getpid())
    write_pdf(inputs, output, params)


def leave_shm(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Leave a ``params["mb"]`` MB file in tmpfs (its pages stay charged to the job's memory
    cgroup after the job), then succeed."""
    with open(params["shm"], "wb") as fh:
        block = b"x" * (1 << 20)
        for _ in range(int(params["mb"])):
            fh.write(block)
    write_pdf(inputs, output, params)


def leave_shm_then_hang(inputs: Sequence[Path], output: Path,
                        params: Mapping[str, Any]) -> None:
    """leave_shm's file, then sleep until killed (for its timeout, say): its worker dies
    with the file still charged to the slot."""
    with open(params["shm"], "wb") as fh:
        block = b"x" * (1 << 20)
        for _ in range(int(params["mb"])):
            fh.write(block)
    time.sleep(600)


def _child_writes(path: str) -> None:
    Path(path).write_text("written by a child process")


def use_multiprocessing(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Run a child through multiprocessing's ``params["ctx"]`` context, as job code may."""
    import multiprocessing

    ctx = multiprocessing.get_context(params["ctx"])
    side = Path(os.environ["TMPDIR"]) / "child.txt"
    child = ctx.Process(target=_child_writes, args=(str(side),))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and side.read_text() == "written by a child process"
    write_pdf(inputs, output, params)


def call_installed(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Import the module of ``params["target"]`` (module:function) and call the function,
    as code of the job's own that uses an installed package."""
    import importlib

    module, _, fn = params["target"].partition(":")
    getattr(importlib.import_module(module), fn)(inputs, output, {"who": "uses"})


def fork_child_returns(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Fork; the child writes the output and returns (into the worker's code, not exiting),
    the parent waits for it, then returns."""
    pid = os.fork()
    if pid == 0:
        write_pdf(inputs, output, params)
        return
    os.waitpid(pid, 0)


def fork_child_fails(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Fork a child that raises (``params["how"]``: an exception, sys.exit(5) or
    sys.exit("a message")) out of
    the job's function; fail if its exit status says it failed, else write the output."""
    pid = os.fork()
    if pid == 0:
        if params["how"] == "exit":
            sys.exit(5)
        if params["how"] == "message":
            sys.exit("the child gave up")
        raise ValueError("the child failed")
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if status != 0:
        raise RuntimeError(f"child exited {status}")
    write_pdf(inputs, output, params)


def returns_a_generator(inputs: Sequence[Path], output: Path,
                        params: Mapping[str, Any]) -> Iterator[int]:
    """A plain function that does its work, then returns a generator (not one itself)."""
    write_pdf(inputs, output, params)
    return (i for i in range(3))


async def async_job(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """An async function: called plainly, it returns a coroutine and does nothing."""
    write_pdf(inputs, output, params)


def generator_job(inputs: Sequence[Path], output: Path,
                  params: Mapping[str, Any]) -> Iterator[None]:
    """A generator function: called plainly, it returns a generator and does nothing."""
    write_pdf(inputs, output, params)
    yield


def _passing_through(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator, as a job's code may wrap its function (functools.wraps)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


@_passing_through
def wrapped_generator_job(inputs: Sequence[Path], output: Path,
                          params: Mapping[str, Any]) -> Iterator[None]:
    """A generator function behind a decorator: called plainly, it does nothing."""
    write_pdf(inputs, output, params)
    yield


class _Evasive(Exception):
    """An exception that will not say where it came from."""

    def __getattribute__(self, name: str) -> Any:
        if name in ("__traceback__", "__cause__", "__context__", "__suppress_context__"):
            raise RuntimeError(f"no {name} for you")
        return object.__getattribute__(self, name)


def raise_evasive(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    raise _Evasive("evasive")


def raise_surrogates(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Raise with lone surrogates in the message: an undecodable byte of a file name (as
    Python keeps it) and a bare one."""
    undecodable = b"\xff".decode("utf-8", "surrogateescape")
    raise ValueError("bad " + undecodable + " byte \ud800 here")


def raise_deep_chain(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Raise the last of ``params["links"]`` exceptions, each the context of the next."""
    exc = ValueError("root")
    for k in range(int(params["links"])):
        nxt = ValueError(f"link {k}")
        nxt.__context__ = exc
        exc = nxt
    raise exc


def leave_a_pool(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Start a multiprocessing pool (its processes and its handler threads), use it, and
    return with it running, referenced from a global, after writing the output."""
    import multiprocessing

    global _POOL
    _POOL = multiprocessing.get_context(params["ctx"]).Pool(2)
    assert _POOL.map(abs, [-1, -2]) == [1, 2]
    write_pdf(inputs, output, params)


_POOL: Any = None


def set_decimal_precision(inputs: Sequence[Path], output: Path,
                          params: Mapping[str, Any]) -> None:
    """Set the thread's decimal precision to ``params["prec"]`` (and leave it), then write a
    PDF: a job doing its own money arithmetic the lazy way."""
    import decimal

    decimal.getcontext().prec = int(params["prec"])
    write_pdf(inputs, output, params)


def observe_library_setup(inputs: Sequence[Path], output: Path,
                          params: Mapping[str, Any]) -> None:
    """Import the library ``params["lib"]`` (which sets a logger level and a warnings filter
    when imported), then record whether both are in effect, and write a PDF."""
    import importlib
    import logging
    import warnings

    lib = importlib.import_module(params["lib"])
    seen = {"pid": os.getpid(),
            "logger_info": logging.getLogger(params["lib"]).isEnabledFor(logging.INFO),
            "filter": any(f[2] is lib.LibWarning for f in warnings.filters)}
    with open(params["report"], "a") as fh:
        fh.write(json.dumps(seen) + "\n")
    write_pdf(inputs, output, params)


def stop_mid_message(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write the start of a message to the runner on our worker's socket (a length header
    and a few of the bytes it promises, as Connection.send writes one over 16 KB in two
    writes), write our pid to ``params["pidfile"]``, then SIGSTOP the worker: a worker
    stopped between the two writes (kill -STOP, a freezer, a debugger)."""
    import struct

    os.write(_worker_socket(), struct.pack("!i", 100_000) + b"\x80" * 10)
    _write_pid(params["pidfile"], os.getpid())
    os.kill(os.getpid(), signal.SIGSTOP)
    write_pdf(inputs, output, params)


def garble_channel(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write ``params["bytes"]`` (hex) to our worker's socket to the runner, as a library
    writing to the wrong descriptor would, then write a PDF (after ``params["hang_s"]``)."""
    os.write(_worker_socket(), bytes.fromhex(params["bytes"]))
    time.sleep(float(params.get("hang_s", 0)))
    write_pdf(inputs, output, params)


def _worker_socket() -> int:
    """The worker's socket to the runner: its one socket."""
    import stat

    sockets = []
    for fd in map(int, os.listdir("/proc/self/fd")):
        with contextlib.suppress(OSError):  # (the listing's own descriptor, closed since)
            if fd > 2 and stat.S_ISSOCK(os.fstat(fd).st_mode):
                sockets.append(fd)
    if len(sockets) != 1:
        raise RuntimeError(f"expected the worker's one socket, found {sockets}")
    return sockets[0]


def register_font(inputs: Sequence[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Register reportlab's bundled Vera Bold as "Helvetica" (reportlab's public API, as a
    job wanting its own look would), then write a PDF."""
    import reportlab
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont

    vera = os.path.join(os.path.dirname(reportlab.__file__), "fonts", "VeraBd.ttf")
    pdfmetrics.registerFont(TTFont("Helvetica", vera))
    write_pdf(inputs, output, params)
