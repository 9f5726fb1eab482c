"""Files written whole or not at all: every result, head, checkpoint, report and figure goes
through :func:`atomic_write`, so a reader — or a crash — never sees half a file.

Files get the mode a plain ``open(path, "w")`` would give them (``0666`` less the user's umask,
so ``0644`` under the usual umask 022): a colleague on a shared machine can read the results.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from probe.errors import SpmlError

__all__ = ["atomic_write", "atomic_write_text", "check_writable", "current_umask"]


def current_umask() -> int:
    """The process's umask, read without changing it where the system allows (Linux
    ``/proc/self/status``); elsewhere set and restored at once."""
    with (contextlib.suppress(OSError, ValueError, IndexError),
          open("/proc/self/status", encoding="ascii") as fh):
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(file)`` on a fresh temporary file next to ``path``, fsync it, then rename it
    over ``path`` (``os.replace`` is atomic on one file system). Creates the parent folder.
    The temporary file is hidden (``.name.XXXX.tmp``) and removed if anything fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            # mkstemp makes 0600 files; give the file the mode open() would have given it
            os.fchmod(fh.fileno(), 0o666 & ~current_umask())
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """:func:`atomic_write` of UTF-8 text."""
    return atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


_VIRTUAL = ("/proc", "/sys")  # report write permission to root, yet take no new file


def check_writable(path: str | os.PathLike, flag: str) -> None:
    """Refuse, before anything is written, a ``path`` (a file or folder to be made or
    rewritten) whose nearest existing folder cannot take it: a file where a folder must be,
    no write permission, a virtual file system. The :class:`probe.errors.SpmlError` names
    ``flag``, the path and the real cause, never a full disk."""
    target = Path(path).expanduser()
    folder = target if target.is_dir() else target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise SpmlError(f"{flag} {path}: {folder} is a file, not a folder; pass a path in a "
                        "folder (missing folders are created)")
    resolved = folder.resolve()
    if any(resolved == Path(v) or Path(v) in resolved.parents for v in _VIRTUAL):
        raise SpmlError(f"{flag} {path}: cannot write there: {resolved} is on a virtual file "
                        "system (/proc, /sys) where no file can be made; pass a folder on a "
                        "disk")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SpmlError(f"{flag} {path}: cannot write there: {folder} is not writable by this "
                        "user (permission denied); pass a folder you can write to, or change "
                        "its permissions")
