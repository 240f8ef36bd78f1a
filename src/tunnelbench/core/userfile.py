"""Reading a file a user names (a scenario, a suite, an inventory, an SSH key): one bounded reader.

A path can name anything: /dev/zero (an endless read), a FIFO (an open that waits for a writer forever), a
directory, a 2 GB log. Only a regular file is read, at most `limit` bytes of it, and the error says what the
path is instead. The open does not wait (O_NONBLOCK: a FIFO is refused after fstat, not waited on); what
is read is the file that was checked (fstat of the open file, not a second lookup of the path)."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

TEXT_LIMIT = 1 << 20  # a scenario, a suite, an inventory: hand-written text, far below 1 MiB
KEY_LIMIT = 64 << 10  # an SSH private key or known_hosts file of a lab


class UserFileError(ValueError):
    """A file that cannot be what it is meant to be; the message names the path and what it is instead."""


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def read_bytes(path: Path | str, what: str, limit: int = TEXT_LIMIT) -> bytes:
    """The bytes of the regular file `path` (at most `limit`); UserFileError naming `what` and the path."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise UserFileError(f"cannot read {what} {path}: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UserFileError(f"{what} {path} is {_kind(mode)}, not a regular file: name the file itself")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise UserFileError(f"cannot read {what} {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise UserFileError(
            f"{what} {path} is larger than {_size(limit)}, the most read as {what}: is it the right file?"
        )
    return data


def read_text(path: Path | str, what: str, limit: int = TEXT_LIMIT) -> str:
    """The UTF-8 text of the regular file `path` (read_bytes), or UserFileError naming the first bad byte."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserFileError(
            f"{path}: not UTF-8 text (byte {e.start} is 0x{data[e.start]:02x}); save the {what} as UTF-8 text"
        ) from None


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """TOML text as data; UserFileError naming `source` for bad TOML and for nesting Python cannot follow."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserFileError(f"{source}: not valid TOML: {e}") from None
    except RecursionError:
        raise UserFileError(
            f"{source}: nested too deeply (arrays or tables inside each other beyond what a scenario needs)"
        ) from None
