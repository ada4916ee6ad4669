"""Durable file-system primitives: atomic writes, directory fsync, batch sync, no-replace moves.

Every durable change follows Maildir's pattern, plus the directory fsync Maildir forgets:
write under a temporary name, fsync the file, rename into place, fsync the directory.
A failed fsync is fatal (``QueueIOError``, exit 74) and never retried: after a failed fsync
the kernel may already have dropped the dirty pages, so a retry could report success for
data that is gone (the "fsyncgate" lesson from PostgreSQL).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from renderctl.errors import QueueIOError

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1

_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    global _libc  # a process-wide handle to libc, loaded on first use; never mutated after
    if _libc is None:
        # The libc this process already runs on (dlopen(NULL)): ctypes.util.find_library
        # would fork and exec `ldconfig -p` (~6 ms, more from a big runner) to name it.
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


FALLOC_FL_KEEP_SIZE = 1


def fallocate(fd: int, length: int, *, keep_size: bool = False) -> None:
    """Reserve ``length`` bytes of blocks for the file ``fd`` is open on; with
    ``keep_size``, past its end without changing its size (appends then take them, on a
    file system that has no block left to give). OSError if it cannot."""
    lib = libc()
    lib.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    if lib.fallocate(fd, FALLOC_FL_KEEP_SIZE if keep_size else 0, 0, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def fsync_fd(fd: int, *, what: str) -> None:
    """fsync a descriptor; any failure is fatal for the caller."""
    try:
        os.fsync(fd)
    except OSError as exc:
        raise QueueIOError(f"fsync failed for {what}: {exc.strerror}") from exc


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that renames/links/unlinks in it survive a power loss."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise QueueIOError(f"cannot open directory {path} to fsync it: {exc.strerror}") from exc
    try:
        fsync_fd(fd, what=f"directory {path}")
    finally:
        os.close(fd)


def syncfs(path: str | os.PathLike[str]) -> None:
    """Flush every dirty page and inode of the file system holding ``path``, in one call.

    One syncfs for a batch of N written files is cheaper than N fsyncs (MEASUREMENTS.md), and
    it also commits the directory entries of every rename made before it.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        lib = libc()
        if lib.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise QueueIOError(f"syncfs failed for {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def sync_filesystems(paths: Iterable[str | os.PathLike[str]]) -> None:
    """One syncfs per file system holding any of ``paths`` (the first always; the others
    looked up by a stat each, never remembered: an output folder may be a mount point
    inside its root, or a root re-pointed at another disk during a long run). A path that
    is gone has nothing left there to sync."""
    devs: dict[int, str | os.PathLike[str]] = {}
    for i, path in enumerate(paths):
        try:
            dev = os.stat(path).st_dev
        except OSError:
            if i == 0:
                raise
            continue
        devs.setdefault(dev, path)
    for path in devs.values():
        syncfs(path)


NOT_REGULAR = "not a regular file"


def makedirs(path: str | os.PathLike[str], mode: int = 0o777) -> None:
    """``os.makedirs(path, mode, exist_ok=True)``, without recursion: makedirs (and
    pathlib's ``mkdir(parents=True)``) recurse once per missing folder, and a path of ~1,000
    missing levels, well within PATH_MAX, raised RecursionError: an output root that deep
    killed every runner that claimed its job (audit ES). ``mode`` is the last folder's, the
    others get 0o777 (less the umask), as makedirs does."""
    missing: list[str] = []
    p = os.fspath(path)
    while p and not os.path.exists(p):
        missing.append(p)
        head = os.path.dirname(p.rstrip(os.sep)) if p.rstrip(os.sep) else ""
        if head == p:
            break
        p = head
    for i, d in enumerate(reversed(missing)):
        last = i == len(missing) - 1
        try:
            os.mkdir(d, mode if last else 0o777)
        except FileExistsError:
            # (made meanwhile by someone else, a "." component, or a dangling link: as
            # makedirs, passed over on the way, where the next mkdir names what is wrong,
            # and only a folder is fine at the end)
            if last and not os.path.isdir(d):
                raise
    if not missing and not os.path.isdir(path):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(path))


def with_name(exc: OSError, path: str | os.PathLike[str]) -> OSError:
    """``exc`` naming ``path``: an error on an fd (a full disk on write) carries no file name,
    and "I/O error: No space left on device" does not say which disk."""
    if exc.filename is not None:
        return exc
    return OSError(exc.errno, exc.strerror, os.fspath(path))  # same subclass, by errno



def open_regular(path: str | os.PathLike[str], flags: int,
                 mode: int = 0o600) -> tuple[int, os.stat_result]:
    """``os.open`` (with ``flags``; never blocking, close-on-exec) of a regular file only,
    and its stat; anything else is ``OSError(EINVAL, "not a regular file")`` naming
    ``path``. A job runs as renderctl does and may put a FIFO where renderctl keeps a
    file: opening that waited for a reader (or writer) for good."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO nobody reads; a folder
            exc = OSError(errno.EINVAL, NOT_REGULAR)
        raise with_name(exc, path) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise with_name(OSError(errno.EINVAL, NOT_REGULAR), path)
    return fd, st


def read_regular(path: str | os.PathLike[str], limit: int) -> tuple[bytes, os.stat_result]:
    """At most ``limit`` bytes of a regular file (see open_regular), and its stat: a
    character device put in its place (/dev/zero) was read until memory ran out."""
    fd, st = open_regular(path, os.O_RDONLY)
    try:
        return os.read(fd, limit), st
    finally:
        os.close(fd)


def remove_quiet(path: str | os.PathLike[str]) -> None:
    """Remove a file, or a folder and what is in it, if it can be; never raises."""
    try:
        folder = stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:  # gone, or it cannot be looked at
        folder = False
    if folder:
        remove_tree(path)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def remove_tree(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> None:
    """``shutil.rmtree(path, ignore_errors=True, dir_fd=dir_fd)``, for a tree of any depth.

    rmtree recurses, a frame and two descriptors a level: a job that left a tree 5,000
    folders deep in its working folder raised RecursionError out of its worker's clean-up,
    then out of the runner's, which died with a traceback, at every restart (audit ES);
    past ~500 levels EMFILE leaves it half removed, silently. What rmtree leaves, GNU
    ``rm -rf`` (fts: any depth, a bounded number of descriptors) removes. Never raises."""
    import shutil

    with contextlib.suppress(RecursionError):
        shutil.rmtree(path, ignore_errors=True, dir_fd=dir_fd)
    try:
        os.lstat(path, dir_fd=dir_fd)
    except OSError:
        return  # gone (or not to be looked at: rm would do no better)
    import subprocess

    where = os.fspath(path) if dir_fd is None else f"/proc/self/fd/{dir_fd}/{os.fspath(path)}"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["rm", "-rf", "--", where], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                       pass_fds=() if dir_fd is None else (dir_fd,))


def write_file(path: str | os.PathLike[str], data: bytes | Sequence[bytes], *,
               fsync: bool) -> None:
    """Create ``path`` exclusively (it must be a fresh temporary name) and write ``data``
    (or each of its parts in turn: a batch's journal entry is its records, never joined
    into one more copy of them all)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        for part in (data,) if isinstance(data, bytes) else data:
            view = memoryview(part)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        if fsync:
            # Protects against: power loss after the rename that follows, which would
            # otherwise leave a renamed but empty (or partial) file.
            fsync_fd(fd, what=str(path))
    except BaseException as exc:
        os.close(fd)
        unlink_quiet(path)  # ours (O_EXCL) and partial: nobody else will remove it
        if isinstance(exc, OSError):
            raise with_name(exc, path) from None
        raise
    os.close(fd)


# What of a report's name its temporary keeps: 255 bytes less ".", ".<pid>", ".<12 hex>.tmp".
_TMP_STEM_BYTES = 255 - 1 - 11 - 17


def replace_beside(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` atomically with ``data`` (no fsync): a temporary beside it, renamed.

    For reports written into folders renderctl does not own (a node_exporter textfile
    folder): the temporary's name is not predictable and it is created exclusively, never
    through a symlink planted there (run as root, a write through one reaches anything).
    Its mode is the usual 0666 less the umask, or the read and write bits of the report it
    replaces (a regular file): a collector running as another user reads the report, and
    cron's umask 077 turned a 0644 textfile 0600 at its first rewrite, node_exporter's
    scrape losing it silently (audit EA). Nothing is widened beyond what the path allowed,
    and no setuid or execute bit is carried (review EB)."""
    final = Path(path)
    try:
        st = os.stat(final, follow_symlinks=False)
        keep = stat.S_IMODE(st.st_mode) & 0o666 if stat.S_ISREG(st.st_mode) else None
        group = st.st_gid
    except OSError:
        keep = None
    # The report's name, cut so that the temporary's stays within a file name's 255 bytes:
    # `run` accepts any name the folder takes, and a long one lost the report at the end.
    stem = os.fsdecode(os.fsencode(final.name)[:_TMP_STEM_BYTES])
    tmp = final.with_name(f".{stem}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o666)
    try:
        try:
            if keep is not None:
                os.fchmod(fd, keep)
                with contextlib.suppress(OSError):
                    # And its group: a collector reading a root:metrics 0640 report through
                    # its group lost it as well (review EE). (EPERM for a group not ours.)
                    os.fchown(fd, -1, group)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        unlink_quiet(tmp)  # a failed write leaves no litter beside the report
        raise


def read_file(path: str | os.PathLike[str]) -> bytes:
    """A small file's bytes in three syscalls (pathlib's read_bytes makes five, plus objects).

    O_NONBLOCK: a FIFO found where a file should be reads as empty instead of hanging."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:
            chunks.append(os.read(fd, 65536))
    finally:
        os.close(fd)
    return b"".join(chunks)


def fill_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` into an existing temporary file (no create), replacing its content.

    Overwrite, then cut to length: O_TRUNC frees the file's block and the write allocates
    another (~100 us here); overwriting in place and shrinking within the block ~9 us.
    Anything but a regular file of one link is refused (OSError), without blocking: a FIFO
    put in a temporary's place held the opener (the runner) until a reader came, for good;
    a hard link to a file elsewhere would have had that file overwritten."""
    fd, st = open_regular(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        if st.st_nlink != 1:
            raise OSError(errno.EINVAL, "a hard link, not a temporary of ours")
        view = memoryview(data)
        offset = 0
        while offset < len(data):
            offset += os.pwrite(fd, view[offset:], offset)
        os.ftruncate(fd, len(data))
    except OSError as exc:
        raise with_name(exc, path) from None
    finally:
        os.close(fd)


def atomic_write(
    path: str | os.PathLike[str], data: bytes, *, tmp_dir: str | os.PathLike[str]
) -> None:
    """Durably replace ``path`` with ``data``: tmp -> fsync -> rename -> fsync the directory."""
    final = Path(path)
    # The pid first: that is how a queue's tmp cleaner (Queue.clean_tmp) tells a live
    # writer's file from a dead one's.
    tmp = Path(tmp_dir) / f"{os.getpid()}.{final.name}.{os.urandom(4).hex()}"
    try:
        write_file(tmp, data, fsync=True)
        os.replace(tmp, final)
    except BaseException:
        unlink_quiet(tmp)
        raise
    # Protects against: power loss after rename, before the directory block is written,
    # which would bring back the old file (or none) after a reboot.
    fsync_dir(final.parent)


def rename_noreplace(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
                     dir_fd: int | None = None) -> None:
    """Rename ``src`` to ``dst`` atomically, failing with FileExistsError if ``dst`` exists.

    Works for directories too (link(2) does not), which is why folder outputs use it. With
    ``dir_fd``, both names are relative to that folder.
    """
    lib = libc()
    at = _AT_FDCWD if dir_fd is None else dir_fd
    res = lib.renameat2(at, os.fsencode(src), at, os.fsencode(dst), _RENAME_NOREPLACE)
    if res != 0:
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), str(dst))
        if err == errno.ENOENT:
            raise FileNotFoundError(err, os.strerror(err), str(src))
        raise OSError(err, os.strerror(err), str(src))


def unlink_quiet(path: str | os.PathLike[str]) -> bool:
    """Remove a file; a missing file is fine (another actor got there first), and so is a
    path through a file (``out/sub/x`` where ``sub`` is a file: nothing can be there)."""
    try:
        os.unlink(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


# What a fresh file system (lost+found: a queue on its own disk) or a folder kept in version
# control (.gitkeep) holds: a folder of only these is empty of a user's files.
NOT_CONTENT = frozenset({"lost+found", ".gitkeep", ".keep", ".DS_Store"})


def is_queue(path: Path) -> bool:
    """Whether ``path`` is a queue: it has ``pending/``, the first folder a new queue gets
    (so a creation cut short leaves an empty folder or a queue, nothing in between)."""
    try:
        return stat.S_ISDIR((path / "pending").stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False  # anything else (EACCES, EIO) is a real I/O error: exit 74


def holds_users_files(path: Path) -> bool:
    """Whether the folder at ``path`` holds files of its own and is not a queue: a new queue
    takes a missing or empty folder, as laid out among a project's files (the wrong folder
    named) it would be hard to undo. What only a fresh file system or a kept-empty folder
    holds (NOT_CONTENT) is no one's. A queue another command or thread makes meanwhile
    makes pending/ first: so it is looked for again after the listing (review BH: 76 of
    1,200 opens of new queues by four threads at once were refused)."""
    try:
        if is_queue(path):
            return False
        with os.scandir(path) as entries:
            if all(e.name in NOT_CONTENT for e in entries):
                return False
    except (FileNotFoundError, NotADirectoryError):
        return False  # to be made (or what is in the way is said where it is made)
    return not is_queue(path)


def unspellable(name: str) -> str | None:
    """The first character of ``name`` this system's file name encoding cannot hold (under
    a C locale with UTF-8 mode off, an ISO-8859 one), as a phrase naming the encoding and
    the way out; None if it has none. Reached os.stat, such a name was a traceback."""
    try:
        os.fsencode(name)
    except UnicodeEncodeError as exc:
        import sys

        return (f"{name[exc.start:exc.end]!r} cannot be written in this system's file name "
                f"encoding ({sys.getfilesystemencoding()}); run renderctl under a UTF-8 "
                "locale (LANG=C.UTF-8, or PYTHONUTF8=1)")
    return None


def not_a_folder(path: Path) -> str | None:
    """What ``path`` is when it is something other than a folder and can never become one
    (``a file``, ``a path through a file (x)``, ``a symlink loop``); None when it is a
    folder or is missing (a missing folder can be created). Unreadable is left to the
    command: its I/O error (74) says more than a guess would."""
    if (why := unspellable(str(path))) is not None:
        # (A configuration file's `queue = "株q"`: a traceback from stat before.)
        return f"a name where {why}"
    try:
        mode = path.stat().st_mode
    except ValueError:
        return "a name with a NUL byte"
    except NotADirectoryError:
        for parent in path.parents:
            try:
                if not stat.S_ISDIR(parent.stat().st_mode):
                    return f"a path through a file ({parent})"
            except OSError:
                continue
        return "a path through a file"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            # Not a missing folder to create: mkdir() there fails with EEXIST, forever.
            return "a symlink loop"
        if exc.errno == errno.ENOENT:
            return _dangling(path)
        return None
    if stat.S_ISDIR(mode):
        return None
    if stat.S_ISREG(mode):
        return "a file"
    # Named: the caller's sentence goes on ", not a folder".
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return "a special file" + next((f" ({name})" for test, name in kinds if test(mode)), "")


def _dangling(path: Path) -> str | None:
    """How a missing ``path`` goes through a symlink to nothing, if it does: mkdir() fails
    there with EEXIST, and creating the symlink's target instead could write into the
    folder a file system is meant to be mounted on (the usual reason a target is gone)."""
    for p in (path, *path.parents):
        try:
            if p.is_symlink():
                if p.exists():
                    return None
                gone = f"a symlink to {os.readlink(p)}, which does not exist"
                return gone if p == path else f"a path through {p}, {gone}"
            if p.exists():
                return None
        except OSError:  # unreadable: left to the command (see not_a_folder)
            return None
    return None
