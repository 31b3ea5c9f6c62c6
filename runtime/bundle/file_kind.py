"""What a path is, told before anything opens it: a FIFO or a device must never be read (it can
block forever or never end), and a folder, a symlink loop or a missing file each get their own
words in the error, so the user knows what to fix.

Every reader of an input file (checkpoint, catalog, bundle) calls ``require_file`` first.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Callable

from toolcall.common.errors import EngineError


def path_kind(path: str | os.PathLike) -> str:
    """One of "file", "missing", "broken symlink", "folder", "fifo", "device", "socket",
    "symlink loop", "unreadable" (stat itself failed); follows symlinks, never opens."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # ENOTDIR: a parent is a file, so this is not there
        return "broken symlink" if os.path.islink(path) else "missing"
    except OSError as e:
        return "symlink loop" if e.errno == errno.ELOOP else "unreadable"
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "unreadable"


def require_file(path: str | os.PathLike, error: Callable[..., EngineError], what: str) -> Path:
    """``path`` if it is a regular file; else raises ``error(message, kind=...)`` saying what it is.

    ``error(message, **details)`` builds the caller's typed error (its code: checkpoint_invalid for
    a checkpoint, bundle_invalid / file_missing for a bundle); ``what`` names the file's role."""
    path = Path(path)
    kind = path_kind(path)
    if kind == "file":
        return path
    if kind in ("missing", "broken symlink"):
        found = "missing" if kind == "missing" else "a symlink to a missing file"
    elif kind == "symlink loop":
        found = "a symlink loop (too many levels of links)"
    elif kind == "unreadable":
        found = "not accessible (stat failed: permissions?)"
    else:
        found = {"folder": "a folder", "fifo": "a FIFO (named pipe)", "device": "a device file",
                 "socket": "a socket"}[kind]
    raise error(f"{path}: expected {what} (a regular file), found {found}; replace it with the real file",
                file=str(path), kind=kind)
