"""The reaper: a small process that kills the runner's workers when the runner dies.

A worker dies with its parent through a parent-death signal whose *Python* handler kills the
job's whole tree (worker.py: a plain SIGKILL would leave a command's grandchildren running).
CPython runs that handler between bytecodes of the main thread, so a job inside one long C
call (a compression, an image operation, ``hashlib.pbkdf2_hmac``) or one that blocked the
signal would run on unsupervised for as long as it likes after the runner is SIGKILLed.
The reaper closes that gap without a thread in any process that forks: a separate process,
started by the runner with one pipe, reading the pid of every worker the runner starts.
When the runner is gone, by any death, the kernel closes the pipe's write end and the read
returns EOF; the reaper then kills what is left of each worker's tree, children first (the
worker is a child subreaper: everything its job started, ``setsid`` daemons included, is
its descendant while it lives), then the worker, and exits. A runner that stops normally
closes the pipe after its workers have gone, so the reaper finds nothing to kill.

The process side (``main``) imports only the standard library and runs as
``python -I -S reaper.py FD``: no site-packages, no renderctl import, ~10 ms to start, and
it shares no state with the runner (it is not a fork of it: no inherited locks or fds).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import struct
import subprocess
import sys
import time

_PID = struct.Struct("=i")
# How long the reaper keeps killing one worker's descendants (they may fork while it does)
# before it gives up on stragglers and kills the worker itself.
TREE_KILL_BOUND_S = 1.0


class Reaper:
    """The runner's end: start the reaper, tell it each worker, close it at the end."""

    def __init__(self, proc: subprocess.Popen[bytes], fd: int) -> None:
        self.proc = proc
        self.fd = fd
        st = os.fstat(fd)
        # What a worker forked from the runner (start method "fork") needs to find and
        # close its inherited copy of our write end: while any copy is open, no EOF.
        self.identity = (fd, st.st_dev, st.st_ino)

    @classmethod
    def start(cls, cgroup_dir: str = "", pids_dir: str = "", work_root: str = "",
              watch: tuple[int, ...] = ()) -> Reaper:
        """``cgroup_dir``: the runner's parent cgroup of its slots, if it has one;
        ``pids_dir``: its parent cgroup in the v1 pids hierarchy, if it has one;
        ``work_root``: the folder of its jobs' working folders; ``watch``: workers already
        running (a replacement's), told before it starts: no moment when it runs and
        knows none of them (a runner dying then left their trees to run on: review FH)."""
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            if watch:  # (a pipe holds 16,384 pids before a write would block)
                os.write(w, b"".join(_PID.pack(pid) for pid in watch))
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(r),
                 cgroup_dir, pids_dir, work_root],
                pass_fds=(r,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                # Not the runner's stderr: a reader of it would wait for the reaper too.
                stderr=subprocess.DEVNULL,
                # Not holding the runner's working folder (an unmount must not find it busy).
                cwd="/",
                # Its own session: a Ctrl-C or hang-up meant for the runner's terminal must
                # not take the reaper first; a kill of the runner's group leaves it too.
                start_new_session=True)
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        # A reaper that stops reading (stopped, traced) must not hang the runner once the
        # pipe is full: a write that would block fails, and watch() shrugs it off.
        os.set_blocking(w, False)
        return cls(proc, w)

    def watch(self, pid: int) -> None:
        """Tell the reaper about a new worker (one atomic pipe write)."""
        # A reaper someone killed costs only this safety net until the runner replaces
        # it (within a second: Runner._check_reaper); the run goes on meanwhile.
        with contextlib.suppress(OSError):
            os.write(self.fd, _PID.pack(pid))

    def gone(self) -> bool:
        """Whether the reaper has exited (and reaped: no zombie stays beside a live runner).
        One waitpid, no block."""
        return self.proc.poll() is not None

    def drop(self) -> None:
        """Forget a reaper that is gone: our end of its pipe closed."""
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def close(self) -> None:
        """Let the reaper go (after our workers have): it sees EOF and exits. Said first
        (pid 0): a runner that stops removes its cgroups itself; one that dies does not."""
        with contextlib.suppress(OSError):
            os.write(self.fd, _PID.pack(0))
        with contextlib.suppress(OSError):
            os.close(self.fd)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def close_inherited(identity: tuple[int, int, int] | None) -> None:
    """In a worker: close the runner's write end if this process inherited it (fork).

    Checked by device and inode: under forkserver or spawn the number means nothing here
    and may be one of our own descriptors."""
    if identity is None:
        return
    fd, dev, ino = identity
    try:
        st = os.fstat(fd)
    except OSError:
        return
    if (st.st_dev, st.st_ino) == (dev, ino):
        os.close(fd)


# -- the reaper process ------------------------------------------------------------------


def proc_stat(pid: int) -> list[bytes] | None:
    """Fields 3.. of /proc/PID/stat: state, ppid, ... (None if gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2:].split()


def children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                kids.extend(int(k) for k in fh.read().split())
        except OSError:
            continue
    return kids


def _live_descendants(pid: int) -> dict[int, int]:
    """Living (not zombie) descendants of ``pid``, each with its parent's pid."""
    found: dict[int, int] = {}
    stack = [pid]
    while stack:
        parent = stack.pop()
        for kid in children(parent):
            if kid in found:
                continue
            fields = proc_stat(kid)
            if fields is None:
                continue
            stack.append(kid)
            if fields[0] not in (b"Z", b"X"):
                found[kid] = parent
    return found


def _stop(pid: int, parent: int) -> int | None:
    """SIGSTOP ``pid`` if it is still ``parent``'s child; its pidfd (kept: the process is
    then killed through it, whoever its parent is by then), or None."""
    try:
        pfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        # With the pidfd held the pid cannot be recycled: check it is the one we saw.
        fields = proc_stat(pid)
        if fields is not None and int(fields[1]) == parent:
            signal.pidfd_send_signal(pfd, signal.SIGSTOP)
            return pfd
    except OSError:
        pass
    os.close(pfd)
    return None


def kill_tree(pid: int, pidfd: int) -> None:
    """Freeze the worker and its descendants (SIGSTOP cannot be blocked, and a stopped
    process cannot fork), then SIGKILL them all: a tree that forks faster than it can be
    killed one by one is caught whole. Each is killed through the pidfd taken when it was
    stopped: once a parent dies its children are the worker's (a subreaper), so who their
    parent is cannot be checked again.

    The runner's own kills of a worker take its tree this way too (Runner._kill_now);
    standard library only, as everything this process runs."""
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(pidfd, signal.SIGSTOP)
    stopped: dict[int, int] = {}  # pid -> pidfd
    deadline = time.monotonic() + TREE_KILL_BOUND_S
    try:
        while time.monotonic() < deadline:
            new = {k: p for k, p in _live_descendants(pid).items() if k not in stopped}
            if not new:
                break  # nothing appeared since the last round: the tree is frozen whole
            for kid, parent in new.items():
                pfd = _stop(kid, parent)
                if pfd is not None:
                    stopped[kid] = pfd
        for pfd in stopped.values():
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pfd, signal.SIGKILL)
    finally:
        for pfd in stopped.values():
            os.close(pfd)
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def kill_cgroup_members(cgroup_dir: str) -> None:
    """SIGKILL every process in ``cgroup_dir`` and the cgroups below it (the runner's
    slots): what a job started outside its worker's tree (clone(CLONE_PARENT)) and so
    outside every kill_tree. Each is pinned by a pidfd and killed only if still a member."""
    name = os.path.basename(cgroup_dir.rstrip("/"))
    for folder, _, files in os.walk(cgroup_dir):
        if "cgroup.procs" not in files:
            continue
        try:
            with open(os.path.join(folder, "cgroup.procs"), "rb") as fh:
                pids = [int(p) for p in fh.read().split()]
        except OSError:
            continue
        for pid in pids:
            try:
                pfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                with open(f"/proc/{pid}/cgroup", "rb") as fh:
                    if f"/{name}/".encode() in fh.read():
                        signal.pidfd_send_signal(pfd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(pfd)


def remove_cgroups(cgroup_dir: str, bound_s: float = 2.0) -> None:
    """Remove ``cgroup_dir`` and the cgroups below it once their processes are gone (killed
    just before: a cgroup with a dying member is busy), trying for ``bound_s`` at most.
    What a SIGKILLed runner leaves, which only the next runner started in the same parent
    cgroup would remove: for good, if none ever is."""
    deadline = time.monotonic() + bound_s
    while os.path.isdir(cgroup_dir):
        for folder, _, _ in os.walk(cgroup_dir, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # (cgroupfs: rmdir of a cgroup whatever its files)
        if not os.path.isdir(cgroup_dir) or time.monotonic() >= deadline:
            return
        time.sleep(0.02)


def remove_work_root(work_root: str) -> None:
    """Remove a dead runner's work root, its jobs' working folders (their scratch files:
    hundreds of MB a job, on TMPDIR's file system), once its workers are dead. The next
    runner of the queue removed it (control/work.*), but a queue never run again (a CI
    job's, a test's) left it in /tmp for good. Only a folder named as the runner makes
    them (runner.WORK_ROOT_PREFIX: nothing of renderctl is imported here), never a link."""
    import shutil

    if os.path.basename(work_root).startswith("renderctl-work-") \
            and os.path.isdir(work_root) and not os.path.islink(work_root):
        with contextlib.suppress(RecursionError):
            shutil.rmtree(work_root, ignore_errors=True)
        if os.path.lexists(work_root):
            # What rmtree's recursion cannot reach (a job's tree thousands of folders deep:
            # fsutil.remove_tree, which is renderctl's and not imported here)
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["rm", "-rf", "--", work_root], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               check=False)


def main(fd: int, cgroup_dir: str = "", pids_dir: str = "", work_root: str = "") -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    workers: dict[int, int] = {}  # worker pid -> its pidfd
    pending = b""
    stopped = False
    while True:
        ready = select.select([fd, *workers.values()], [], [])[0]
        for pid, pfd in list(workers.items()):
            if pfd in ready:  # that worker exited: forget it
                os.close(pfd)
                del workers[pid]
        if fd not in ready:
            continue
        data = os.read(fd, 4096)
        if not data:
            break  # the runner is gone, or done
        pending += data
        whole = len(pending) - len(pending) % _PID.size
        for (pid,) in _PID.iter_unpack(pending[:whole]):
            if pid == 0:
                stopped = True  # the runner's goodbye (Reaper.close)
                continue
            with contextlib.suppress(OSError):
                workers[pid] = os.pidfd_open(pid)
        pending = pending[whole:]
    for pid, pfd in workers.items():
        kill_tree(pid, pfd)
    if cgroup_dir:
        kill_cgroup_members(cgroup_dir)
    if not stopped:
        for folder in (cgroup_dir, pids_dir):
            if folder:
                remove_cgroups(folder)
        if work_root:
            remove_work_root(work_root)


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]), *sys.argv[2:5])
    except BaseException:  # nobody reads our output: exit, never hang
        os._exit(1)
    os._exit(0)
