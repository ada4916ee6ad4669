"""Job functions for the resource-guard integration tests (python-kind jobs).

The tests copy this file beside their manifests; a manifest's folder is put on ``sys.path``
for python-kind jobs, so a job names these as ``callable = "guardfns:<name>"``. Each is
called as ``fn(inputs, output, params)`` inside a renderctl worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MB = 1024 * 1024
PAGE = 4096


def write_pdf(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """A tiny one-page PDF at ``output``."""
    from reportlab.pdfgen import canvas

    c = canvas.Canvas(str(output))
    c.drawString(72, 720, str(params.get("text", os.environ.get("RENDERCTL_JOB_ID", "x"))))
    c.showPage()
    c.save()


def hog(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Allocate 10 MB bytearrays touching every page, up to ``mb`` MB, at ``rate_mb_s``
    (first removing the file ``params["remove"]``, if given, once it is there); then write
    a tiny PDF, or one of ``params["write_mb"]`` MB; with ``params["leave_thread"]``, leave
    a thread running (its worker retires); with ``params["scratch"]``, first let the
    allocation go and write ``params["scratch_mb"]`` MB to that file."""
    if "remove" in params:
        deadline = time.monotonic() + 20
        while not os.path.exists(params["remove"]):  # (published at the group commit)
            if time.monotonic() > deadline:
                raise AssertionError(f"{params['remove']} never appeared")
            time.sleep(0.01)
        os.unlink(params["remove"])
    total_mb = int(params["mb"])
    rate = float(params.get("rate_mb_s", 0) or 0)
    chunks: list[bytearray] = []
    start = time.monotonic()
    for i in range(total_mb // 10):
        b = bytearray(10 * MB)
        for j in range(0, len(b), PAGE):
            b[j] = 1
        chunks.append(b)
        if rate:
            ahead = start + (i + 1) * 10 / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
    if params.get("scratch"):
        chunks.clear()
        with open(params["scratch"], "wb") as fh:
            for _ in range(int(params["scratch_mb"])):
                fh.write(bytes(MB))
    if params.get("write_mb"):
        write_big(inputs, output, {"mb": params["write_mb"], "pdf": True})
    else:
        write_pdf(inputs, output, params)
    if params.get("leave_thread"):
        import threading

        threading.Thread(target=time.sleep, args=(3,), daemon=True).start()


def lift_then_hog(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Remove the memory ceiling of the worker's own cgroup (as root can), then ``hog``."""
    from renderctl.guards import _own_cgroup_dir

    slot = _own_cgroup_dir(True)
    assert slot is not None, "not in a cgroup v1 memory group"
    for name in ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes"):
        with contextlib.suppress(FileNotFoundError):
            (slot / name).write_text("-1")
    hog(inputs, output, params)


def ignore_term_with_grandchild(inputs: list[Path], output: Path,
                                params: Mapping[str, Any]) -> None:
    """Ignore SIGTERM, start a ``sleep 600`` that ignores it too, record its pid, hang."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # params["new_session"]: the grandchild leaves the job's process group (setsid), as a
    # daemonizing tool would; it is still a descendant of the worker.
    child = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 600"],
                             stdin=subprocess.DEVNULL,
                             start_new_session=bool(params.get("new_session", False)))
    with open(params["pidfile"], "a") as fh:
        fh.write(f"{child.pid}\n")
        fh.flush()
        os.fsync(fh.fileno())
    while True:
        time.sleep(3600)


def sleep_then_write(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Sleep ``s`` seconds, then write a tiny PDF."""
    time.sleep(float(params.get("s", 1.0)))
    write_pdf(inputs, output, params)


def record_times(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Append ``<job id> <start> <end>`` (wall clock) to ``params["file"]`` around a sleep."""
    start = time.time()
    time.sleep(float(params.get("s", 0.5)))
    end = time.time()
    line = f"{os.environ.get('RENDERCTL_JOB_ID', '?')} {start:.6f} {end:.6f}\n"
    fd = os.open(params["file"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one O_APPEND write: lines of parallel jobs never mix
    finally:
        os.close(fd)
    write_pdf(inputs, output, params)


def by_attempt(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Behave by ``RENDERCTL_ATTEMPT``: ``params["plan"][str(n)]`` is ``sleep`` (``s``
    seconds, then write), ``fail`` (raise) or absent (write at once)."""
    attempt = os.environ.get("RENDERCTL_ATTEMPT", "?")
    if params.get("log"):
        fd = os.open(params["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{os.environ.get('RENDERCTL_JOB_ID')} {attempt}\n".encode())
        finally:
            os.close(fd)
    action = dict(params.get("plan", {})).get(attempt)
    if action == "sleep":
        time.sleep(float(params.get("s", 30)))
    elif action == "fail":
        raise RuntimeError(f"planned failure on attempt {attempt}")
    write_pdf(inputs, output, params)


# A script that allocates argv[1] MB in 10 MB chunks touching every page, at most argv[2]
# MB/s (0: flat out). ALLOC_LOOP is its body, for scripts that add a handshake around it.
# Chunks start at least 10/rate s apart and a late one is never caught up on, so in any
# window of w seconds it allocates at most rate*w + 10 MB, however it was scheduled.
ALLOC_LOOP = """
chunks = []
for i in range(total_mb // 10):
    began = time.monotonic()
    b = bytearray(10 * 1024 * 1024)
    for j in range(0, len(b), 4096):
        b[j] = 1
    chunks.append(b)
    if rate:
        ahead = began + 10 / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
"""
ALLOC_ARGS = """
import sys, time
total_mb, rate = int(sys.argv[1]), float(sys.argv[2])
"""
HOG_CHILD = ALLOC_ARGS + ALLOC_LOOP


def hog_in_child(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Run the allocation in a child process, shrug off its death, then keep going for
    ``after_s`` seconds and write the output (a tool whose helper process blew up)."""
    import sys

    child = subprocess.run([sys.executable, "-c", HOG_CHILD, str(int(params["mb"])),
                            str(float(params.get("rate_mb_s", 0) or 0))], check=False)
    if params.get("marker"):
        Path(params["marker"]).write_text(f"{child.returncode} {time.time():.6f}\n")
    time.sleep(float(params.get("after_s", 5)))
    write_pdf(inputs, output, params)


def big_child_then_hang(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Start a child that ignores SIGTERM and holds ``mb`` MB, freeze it in the cgroup v1
    freezer ``params["freezer"]`` (a frozen task outlives SIGKILL until thawed: its slot
    stays occupied for as long as the test wants), record its pid in ``params["pidfile"]``
    once frozen, then hang."""
    import sys

    script = ("import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + ALLOC_ARGS
              + ALLOC_LOOP + "print('held', flush=True)\nwhile True: time.sleep(3600)\n")
    child = subprocess.Popen([sys.executable, "-c", script, str(int(params["mb"])), "0"],
                             stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert child.stdout is not None
    child.stdout.readline()
    freezer = Path(params["freezer"])
    (freezer / "cgroup.procs").write_text(f"{child.pid}\n")
    (freezer / "freezer.state").write_text("FROZEN\n")
    while (freezer / "freezer.state").read_text().strip() != "FROZEN":
        time.sleep(0.001)  # FREEZING until every task in it has stopped
    tmp = Path(params["pidfile"] + ".tmp")
    tmp.write_text(f"{child.pid}\n")
    os.replace(tmp, params["pidfile"])  # the test polls for the file: never let it see it empty
    while True:
        time.sleep(3600)


def say_then_hang(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Say something on stderr (the evidence a killed attempt's record must keep), hang."""
    import sys

    print(params.get("say", "about to hang"), file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)


def shm_then_hang(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Leave ``mb`` MB in a tmpfs file at ``params["path"]`` (memory that stays charged to
    the slot after the job's processes are gone), then hang until killed."""
    with open(params["path"], "wb") as fh:
        for _ in range(int(params["mb"])):
            fh.write(bytes(MB))
    while True:
        time.sleep(3600)


def shout_then_write(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Write ``mb`` MB to stderr (page cache of the worker's capture file), then a PDF."""
    line = b"x" * 1023 + b"\n"
    block = line * 1024
    for _ in range(int(params["mb"])):
        os.write(2, block)
    write_pdf(inputs, output, params)


def escape_then_hog(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """As root: move this worker out of its slot's cgroup into the runner's own, then hog."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            # <mount>/<runner's cgroup>/renderctl-<runner pid>/<slot>: two levels up
            runner_cgroup = Path("/sys/fs/cgroup/memory" + path).parent.parent
            (runner_cgroup / "cgroup.procs").write_text(str(os.getpid()))
    hog(inputs, output, params)


def write_big(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """``mb`` MB of output written 1 MB at a time (the job itself holds ~1 MB): a one-page
    PDF whose content stream is that many blanks if ``pdf``, else zeros."""
    size = int(params["mb"]) * MB
    chunk = b" " * MB if params.get("pdf") else bytes(MB)
    with open(output, "wb") as fh:
        if not params.get("pdf"):
            for _ in range(size // MB):
                fh.write(chunk)
            return
        offsets = []
        fh.write(b"%PDF-1.4\n")
        for obj in (b"<< /Type /Catalog /Pages 2 0 R >>",
                    b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                    b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>"):
            offsets.append(fh.tell())
            fh.write(b"%d 0 obj\n%s\nendobj\n" % (len(offsets), obj))
        offsets.append(fh.tell())
        fh.write(b"4 0 obj\n<< /Length %d >>\nstream\n" % size)
        for _ in range(size // MB):
            fh.write(chunk)
        fh.write(b"\nendstream\nendobj\n")
        xref = fh.tell()
        fh.write(b"xref\n0 5\n0000000000 65535 f \n")
        fh.write(b"".join(b"%010d 00000 n \n" % off for off in offsets))
        fh.write(b"trailer\n<< /Size 5 /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % xref)


def count_sigterms(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Wait for SIGTERM; 0.5 s after the first, write how many were delivered to
    ``params["countfile"]`` and exit 1. Counted by the wake-up fd, to which the C-level
    handler writes a byte per delivery (Python runs its handler once for several that land
    before it looks). Also a command: ``python guardfns.py count_sigterms COUNTFILE``."""
    import select

    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    select.select([r], [], [])
    time.sleep(0.5)  # (resumed after each handler: PEP 475)
    Path(params["countfile"]).write_text(str(len(os.read(r, 4096))))
    os._exit(1)


def leave_on_sigterm(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Hang until SIGTERM, then raise out of the job (its worker survives the signal)."""

    def leave(signum: int, frame: object) -> None:
        raise RuntimeError("told to stop")

    signal.signal(signal.SIGTERM, leave)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    import sys

    {"count_sigterms": count_sigterms}[sys.argv[1]]([], Path(), {"countfile": sys.argv[2]})
