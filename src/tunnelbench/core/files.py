"""The product's own files: how they are written, and which folders and files it refuses.

Every file written into a run folder or a results root (reports, exports, the NAT matrix, the mesh-scale
sweep, a suite's matrix) goes through `write_atomic`: a new file beside the target, fsynced, then renamed
over it. A kill mid-write leaves the previous file whole, and a symbolic link at the target is never
followed: a target that is a link or not a regular file is refused, naming it (someone else put it there;
replacing it silently would hide that). `check_destination` says so before any work is done, and
`check_private_folder` refuses a results root or run folder another user could write into, as
lab/ssh_host.py's make_workdir does for the SSH work folder: another user could plant a link there or
replace what the product reads."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path


class FileRefused(OSError):
    """A file or folder the product will not read or write; the message is one line naming it, what is
    wrong and the fix. An OSError, so that code which reports a failed write reports this one too; the
    command line turns it into exit 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _mode(st: os.stat_result) -> str:
    return stat.filemode(st.st_mode)


def check_target(path: Path) -> None:
    """Refuse a target that exists as a symbolic link or anything but a regular file (never followed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise FileRefused(
            f"{path} is a symbolic link (to {os.readlink(path)}): refused, tunnelbench never writes through a "
            f"link; remove it (rm {path}) or name another file"
        )
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(
            f"{path} is not a regular file ({_mode(st)}): refused, tunnelbench writes only regular files; "
            "name another file"
        )


def check_destination(path: Path) -> None:
    """Before the work: the file's folder exists, is a folder and is writable here, and the file itself, if
    present, is a regular file (check_target). Raises FileRefused naming what is wrong."""
    folder = path.parent
    if not folder.exists():
        raise FileRefused(f"the folder {str(folder)!r} does not exist: create it first or name another file")
    if not folder.is_dir():
        raise FileRefused(f"{str(folder)!r} is not a folder: name a file in a folder")
    if not os.access(
        folder, os.W_OK | os.X_OK
    ):  # also refused for an immutable folder (chattr +i), even as root
        raise FileRefused(
            f"the folder {str(folder)!r} is not writable: name a file in a folder you can write"
        )
    check_target(path)


def check_private_folder(folder: Path, sticky_ok: bool = False) -> None:
    """Refuse a results root or run folder that another user could write into: writable by group or others,
    or, when running as root, owned by another user (who could plant links there for root to write
    through, or replace what root reads). `sticky_ok`: the folder only holds the one named entry we use (a
    run folder's parent), and a root-owned sticky folder (/tmp) lets no other user rename or replace it."""
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        raise FileRefused(f"the folder {folder} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise FileRefused(f"{folder} is not a folder ({_mode(st)})")
    if sticky_ok and st.st_mode & stat.S_ISVTX and st.st_uid == 0:
        return
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(
            w for w, bit in (("its group", stat.S_IWGRP), ("other users", stat.S_IWOTH)) if st.st_mode & bit
        )
        raise FileRefused(
            f"the folder {folder} is writable by {who} ({_mode(st)}): another user could replace what "
            f"tunnelbench reads or writes there; make it yours alone: chmod go-w {folder}"
        )
    if os.geteuid() == 0 and st.st_uid != 0:
        raise FileRefused(
            f"the folder {folder} is owned by uid {st.st_uid}, not root, and this runs as root: its owner "
            f"could plant links there for root to write through; chown root {folder}, or run this as "
            f"uid {st.st_uid}"
        )


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` as one step: a new file in the same folder (O_EXCL|O_NOFOLLOW,
    a random name), fsynced, renamed over the target (a rename replaces a link itself, never what it points
    to), the folder fsynced. A target that is a link or not a regular file is refused (check_target); on any
    failure the target is as it was and no temporary file is left."""
    raw = data.encode() if isinstance(data, str) else data
    check_target(path)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tmp = f".{path.name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=folder
        )
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
        os.fsync(folder)  # the rename itself survives a crash
    finally:
        os.close(folder)
    return path
