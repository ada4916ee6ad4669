"""Publishing an output: at most once, atomically, never over a file we did not make.

The worker writes to a temporary name beside the final path (same folder, so same file
system) and tags the file with its attempt's token (xattr ``user.renderctl.owner``).
Publishing is ``renameat2(RENAME_NOREPLACE)`` (fails if ``final`` exists): a crash between
the rename and the done record leaves the proof that the published file is this job's own
in the tag (for a folder, its ``.rctl-job`` marker). Where the file system has no user
xattrs, ``link(tmp, final)`` is used instead and the temporary name, removed only after the
done record is durable, is the proof (same inode). Anything else at ``final`` is someone
else's file: the job dead-letters with ``output_exists`` and the file is left untouched.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
import stat
from enum import StrEnum
from pathlib import Path

from renderctl.fsutil import makedirs, remove_quiet, remove_tree, rename_noreplace
from renderctl.manifest import RESERVED_PREFIX

DIR_MARKER = ".rctl-job"
OWNER_XATTR = "user.renderctl.owner"  # on a published file: the attempt token that made it


class Published(StrEnum):
    """What a publish attempt found."""

    PUBLISHED = "published"  # we made the output visible now
    EXISTS = "exists"  # something is there already: never touched


class OutputEscapes(Exception):
    """The output's folder resolves outside the output root (a symlink on the way)."""


class OutputRootUnusable(OSError):
    """The output root itself cannot be made or opened (a missing mount or symlink target,
    a file on its way): no job's fault, as a read-only root is not."""


def tmp_output_path(final: Path, job_id: str, token: str) -> Path:
    """The temporary name beside ``final`` for one attempt (deterministic, for recovery).

    Named by the attempt's token, unique per claim: no two attempts (another life of the job
    id, or a runner that took over an expired lease) ever write to the same temporary, and
    in link mode a leftover name hard-linked to a published file is never written into."""
    return _tmp_named(final, _job_tag(final, job_id), token)


def found_tmp_output_path(final: Path, job_id: str, token: str) -> Path:
    """tmp_output_path, or where a build before the output's name was in the tag (see
    _job_tag) put that attempt's temporary, if only that one exists: an attempt in flight
    across an upgrade, its output published perhaps, is recovered as any other."""
    tmp = tmp_output_path(final, job_id, token)
    if not os.path.lexists(tmp):
        legacy = _tmp_named(final, _legacy_tag(job_id), token)
        if os.path.lexists(legacy):
            return legacy
    return tmp


def _tmp_named(final: Path, tag: str, token: str) -> Path:
    attempt = hashlib.sha256(token.encode()).hexdigest()[:16]
    return final.parent / f"{RESERVED_PREFIX}{tag}-{attempt}.tmp"


def _job_tag(final: Path, job_id: str) -> str:
    """The part of a temporary's name that says whose it is: the job id and the output's
    name. The job id alone was shared by two queues' jobs of one id whose outputs are in
    one folder (``daily`` in each team's queue, writing to /srv/reports), and each queue's
    sweep of its job's temporaries removed the other's in flight: dead-lettered as having
    written no output (audit FQ)."""
    return hashlib.sha256(f"{job_id}\0{final.name}".encode()).hexdigest()[:16]


def _legacy_tag(job_id: str) -> str:
    return hashlib.sha256(job_id.encode()).hexdigest()[:16]


def staging_name(tmp_name: str) -> str:
    """The private folder beside the temporary ``tmp_name`` where the worker has the job
    write its output (worker._Staging); it ends in ``.tmp`` too, so tmp_outputs finds it."""
    return tmp_name.removesuffix(".tmp") + ".w.tmp"


def tmp_outputs(final: Path, job_id: str) -> list[Path]:
    """Every temporary of this job beside ``final`` (any attempt)."""
    try:
        names = os.listdir(final.parent)
    except (FileNotFoundError, NotADirectoryError):
        return []  # no folder (or a file in its place): no temporary either
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            return []  # a folder that cannot be named holds nothing we made through it
        raise
    # An attempt's temporary, and what a tool named after it (".tmp-1.png", ".tmp.log").
    # Not one an earlier build named by the job id alone (see _job_tag): that may be
    # another queue's, in flight under that build (review FR); recovery removes its
    # orphan's own (found_tmp_output_path).
    tag = _job_tag(final, job_id)
    attempt = re.compile(rf"{re.escape(RESERVED_PREFIX)}{tag}-[0-9a-f]{{16}}(\.w)?\.tmp")
    return [final.parent / n for n in names if attempt.match(n)]


def check_confined(root: Path, final: Path, queue_real: str = "") -> None:
    """OutputEscapes unless ``final``'s folder is inside the output root ``root`` (a real
    path) and outside the queue folder (real path ``queue_real``; "": not checked)."""
    try:
        real = final.parent.resolve()
    except RuntimeError:  # a symlink loop (Python 3.11 says so with RuntimeError, not ELOOP)
        raise OutputEscapes(f"{final.parent} is a symlink loop") from None
    if real != root and root not in real.parents:
        raise OutputEscapes(f"{final.parent} resolves to {real}, outside the output root {root}")
    _outside_queue(queue_real, str(real), final)
    if final.is_symlink():
        raise OutputEscapes(f"{final} is a symlink")


def _outside_queue(queue_real: str, real: str, final: Path) -> None:
    """OutputEscapes if the real folder ``real`` of ``final`` is the queue folder or inside
    it. Submit refuses such outputs, but a symlink made or re-pointed since (an output root
    that is a symlink, a folder on the way) led there all the same: a PDF published as
    done/<id>.json was then replaced by that job's own done record, and one in pending/
    quarantined as a damaged record (audit DT)."""
    if queue_real and _inside(queue_real, real):
        raise OutputEscapes(f"{final.parent} resolves to {real}, inside the queue folder "
                            f"{queue_real}: outputs must not go among the queue's files")


def _inside(root_real: str, real: str) -> bool:
    """Whether real path ``real`` is the output root (real path ``root_real``) or below it."""
    return root_real == "/" or real == root_real or real.startswith(root_real + os.sep)


def others_can_write(root_real: str, folder: Path) -> bool:
    """Whether anyone but us (or root) could create, rename or replace names in a folder on
    the way from the output root (real path ``root_real``) to ``folder``: one writable by
    others, by a group that is not our own private one, or owned by someone else. Only
    then can a symlink be planted where a job writes (see worker.execute). True too if the
    folder cannot be judged (outside the root, gone): the careful path then says why."""
    try:
        # Where the kernel says the folder is: 2 syscalls, where realpath lstats every
        # component from / (16 us against 6; this runs once per job).
        fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
    except OSError:
        return True
    if real.endswith(" (deleted)"):
        return True
    if not _inside(root_real, real):
        return True
    me = os.geteuid()
    path = root_real
    for part in ["", *(p for p in real[len(root_real):].split(os.sep) if p)]:
        path = os.path.join(path, part) if part else path
        try:
            st = os.stat(path)
        except OSError:
            return True
        if st.st_uid not in (me, 0) or st.st_mode & 0o002 \
                or (st.st_mode & 0o020 and not _private_group(st.st_gid)):
            return True
    return False


@functools.cache
def _private_group(gid: int) -> bool:
    """Whether group ``gid`` is our user's private group (named after us, nobody else in it:
    the umask 002 convention, whose folders are 0775 without being shared)."""
    import grp
    import pwd

    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return group.gr_name == me and set(group.gr_mem) <= {me}


def output_folder(root_real: str, final: Path, queue_real: str = "",
                  queue_ids: frozenset[tuple[int, int]] | None = None) -> int:
    """A descriptor (O_PATH) of ``final``'s folder, where that folder really is: inside the
    output root, whose real path is ``root_real``, and outside the queue folder (real path
    ``queue_real``; "": not checked), or OutputEscapes.

    The folder is opened first (following any symlink, as a path check would) and judged
    by where the kernel says the descriptor points, so what is done through it afterwards
    happens there, whatever is swapped on the way after the check. A symlink that stays
    inside the root is fine, as everywhere else; only one leading out is refused."""
    fd = os.open(final.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        os.close(fd)
        # No /proc: the path check, with its window
        check_confined(Path(root_real), final, queue_real)
        return os.open(final.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    if real.endswith(" (deleted)"):
        os.close(fd)
        raise FileNotFoundError(errno.ENOENT, "folder removed", str(final.parent))
    if not _inside(root_real, real):
        os.close(fd)
        raise OutputEscapes(f"{final.parent} resolves to {real}, outside the output root "
                            f"{root_real}")
    try:
        _outside_queue(queue_real, real, final)
        if queue_real:
            _not_the_queue_on_the_way(fd, root_real, queue_real, final, queue_ids)
    except (OutputEscapes, OSError):
        os.close(fd)
        raise
    return fd


def queue_identities(queue: str | int) -> frozenset[tuple[int, int]]:
    """(device, inode) of the queue folder (its real path, or a descriptor of it) and of
    each of its own (a bind mount of done/ alone led an output there: review DZ), for
    ``output_folder``: one listing serves every output folder of a commit."""
    top = os.stat(queue)
    ids = {(top.st_dev, top.st_ino)}
    with os.scandir(queue) as entries:
        for e in entries:
            with contextlib.suppress(FileNotFoundError):  # (gone meanwhile: review EB)
                if e.is_dir(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    ids.add((st.st_dev, st.st_ino))
    return frozenset(ids)


def _not_the_queue_on_the_way(fd: int, root_real: str, queue_real: str, final: Path,
                              qids: frozenset[tuple[int, int]] | None) -> None:
    """OutputEscapes if the queue folder is the folder open as ``fd`` or one on the way up
    from it to the output root, told by identity (device, inode; ``qids``, or listed now):
    a bind mount of the queue inside the root reads as a path of the root's own, to /proc
    and realpath alike, and the published PDF was replaced by its job's done record (review
    DX). ~2 syscalls a level."""
    if qids is None:
        qids = queue_identities(queue_real)
    root = os.stat(root_real)
    rid = (root.st_dev, root.st_ino)
    here, opened = fd, []
    try:
        for _ in range(4096):  # (deeper than any path a file system takes)
            st = os.fstat(here)
            if (st.st_dev, st.st_ino) in qids:
                raise OutputEscapes(f"{final.parent} is inside the queue folder {queue_real} "
                                    "(mounted there): outputs must not go among the queue's "
                                    "files")
            if (st.st_dev, st.st_ino) == rid:
                return
            up = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=here)
            opened.append(up)
            above = os.fstat(up)
            if (above.st_dev, above.st_ino) == (st.st_dev, st.st_ino):
                return  # the top: the root was not on the way (judged by path above)
            here = up
    finally:
        for d in opened:
            os.close(d)


def make_folders(out_root: str, folder: Path) -> None:
    """Make ``folder`` and those missing on the way to it from the output root, each one
    inside its parent's descriptor, judged (like ``output_folder``) to be inside the root.

    Not makedirs by path after the confinement check: a folder swapped for a symlink out of
    the root in between would have the rest made at its target (run as root, an empty
    folder named /etc/nologin stops every other login). A symlink that stays inside the
    root is followed, as everywhere else."""
    # Modes as mkdir -p's: 0o777 less the umask. 0o755 kept a team's umask 002 from
    # sharing the folders while the files in them (0o666 less the umask) were shared;
    # folders others can write make the worker take its careful path (others_can_write).
    try:
        makedirs(out_root)  # the root itself: the user's to name
        root_real = os.path.realpath(out_root)
        fd = os.open(root_real, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        # Every job under this root would fail the same way: one job's fault only below.
        raise OutputRootUnusable(exc.errno, exc.strerror, exc.filename or out_root) from None
    parts = folder.relative_to(out_root).parts
    shown = Path(out_root)
    try:
        for part in parts:
            shown /= part
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
                below = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                # Named in full, as makedirs would: "sub: Permission denied" says too little.
                raise type(exc)(exc.errno, exc.strerror, str(shown)) from None
            os.close(fd)
            fd = below
            real = os.readlink(f"/proc/self/fd/{fd}")
            if not _inside(root_real, real):
                raise OutputEscapes(f"{folder} resolves to {real}, outside the output root "
                                    f"{root_real}")
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path, *, is_dir: bool, token: str | None = None,
            dir_fd: int | None = None) -> Published:
    """Make ``tmp`` visible as ``final`` unless something is already there.

    With ``token`` (the worker tagged the file with it, see ``tag_output``), a file is moved
    into place with ``renameat2(RENAME_NOREPLACE)``: the tag is the proof of ownership, so
    no temporary link has to stay behind and be removed later (a link and an unlink fewer per
    job). Without it, ``link()`` keeps the temporary name as the proof. With ``dir_fd`` (their
    folder, from ``output_folder``) both are named relative to it: nothing on the way to
    them is looked up again, so nothing swapped in since can redirect the publish."""
    src: str | Path = tmp
    dst: str | Path = final
    if dir_fd is not None:
        src, dst = tmp.name, final.name
    try:
        if is_dir or token is not None:
            rename_noreplace(src, dst, dir_fd=dir_fd)
        else:
            os.link(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        return Published.PUBLISHED
    except FileExistsError:
        # Not ours to judge here: an attempt being committed has published nothing yet, so
        # whatever is there came from someone else. Recovery judges with is_ours.
        return Published.EXISTS


def tag_output(path: Path, token: str) -> bool:
    """Worker side: mark an output file as this attempt's own; False if xattrs are missing."""
    try:
        os.setxattr(path, OWNER_XATTR, token.encode(), follow_symlinks=False)
    except OSError:
        return False
    return True


def owner_token(path: str | os.PathLike[str]) -> str | None:
    """The attempt token a published file was tagged with (see tag_output), or None."""
    try:
        return os.getxattr(path, OWNER_XATTR, follow_symlinks=False).decode(errors="replace")
    except OSError:
        return None


def is_ours(tmp: Path, final: Path, *, is_dir: bool, job_id: str,
            token: str | None = None) -> bool:
    """Whether ``final`` is this job's own earlier publication (see module docstring)."""
    try:
        if is_dir:
            # The marker names the job and the attempt's token: a folder some earlier life of
            # this id published (before a replace, or a deleted done record) is not ours.
            marker = (final / DIR_MARKER).read_text().splitlines()
            return marker[:1] == [job_id] and (token is None or marker[1:2] == [token])
        if token is not None and owner_token(final) == token:
            return True
        a, b = os.lstat(tmp), os.lstat(final)
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
    except (FileNotFoundError, NotADirectoryError):
        return False


def discard(tmp: Path) -> None:
    """Remove an attempt's temporary (file or folder), if it can be.

    One that cannot (a folder gone read-only or unwritable: the reason its job is being
    released) is left where it is: never published, and removed when its job completes
    (the runner sweeps a job that had a released attempt) or by recovery's sweep of an
    orphaned job. Failing here would stop the runner with jobs left in running/ and no
    summary."""
    remove_quiet(tmp)
    if not tmp.name.endswith(".w.tmp"):  # and what its killed job left in its staging folder
        remove_tree(tmp.with_name(staging_name(tmp.name)))


def discard_sidecars(tmp: Path) -> None:
    """Remove the files a tool named after an attempt's temporary (pdftoppm's <output>-1.png,
    a script's <output>.log): the attempt's token is in the name, so they are its own and
    no one else's (audit CB: left in the output folder for good). It lists the folder:
    called by the worker after a failed attempt, off the runner's loop (review CC: ~70 ms
    a failure in a folder of 100,000 outputs)."""
    prefix = tmp.name
    with contextlib.suppress(OSError), os.scandir(tmp.parent) as entries:
        for entry in entries:
            if entry.name.startswith(prefix) and entry.name != prefix:
                if entry.is_dir(follow_symlinks=False):
                    remove_tree(entry.path)
                else:
                    remove_quiet(Path(entry.path))


FULL_DISK_BYTES = 1 << 20  # free space below which a failed write is blamed on the disk


def output_folder_problem(final: Path, own: Path | None = None) -> str | None:
    """Why nothing can be written beside ``final`` (None if something can): asked after a
    job failed, to tell a folder's fault (read-only, not writable to us, full) from the
    job's. A folder that does not exist is not such a fault: the next claim makes it.
    ``own``: the job's partial output, whose room counts as free (a job that filled the
    disk with an output that can never fit is not the disk's fault at every run)."""
    folder = final.parent
    try:
        if not stat.S_ISDIR(os.stat(folder).st_mode):
            return None  # a file where the folder should be: the job's path, not the disk
        st = os.statvfs(folder)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return f"{folder}: {os.strerror(errno.EROFS)}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder}: {os.strerror(errno.EACCES)}"
    # root may use the blocks reserved for it; everyone else only f_bavail
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    if own is not None:
        with contextlib.suppress(OSError):
            free += os.lstat(own).st_blocks * 512
    if free < FULL_DISK_BYTES or (st.f_files and st.f_ffree == 0):
        return f"{folder}: {os.strerror(errno.ENOSPC)}"
    return None


# What a job says when the output's file system refused its writes (C's and Python's
# wording: "cp: error writing 'x': No space left on device", "[Errno 28] ...: 'x'").
FULL_ERRORS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


def says_full(*said: str | None) -> bool:
    """Whether an attempt's error, stderr or traceback says a disk was full."""
    return any(why in text for text in said if text for why in FULL_ERRORS)
