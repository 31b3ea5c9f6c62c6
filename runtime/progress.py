"""Progress lines for long steps (kernel compile, canary, load), on a terminal only.

The CLIs switch it on with ``enable(stderr is a tty and not --json)``; library code calls
``stage("compiling kernels")`` before a long step and ``done()`` after it (or the next
``stage`` closes the previous one). Off (the default, and whenever output is piped), every
call is a no-op, so programs reading stdout or stderr see nothing of it.
"""
from __future__ import annotations

import sys
import time

_enabled = False
_open: tuple[str, float] | None = None  # (label, start time) of the stage being shown


def enable(on: bool) -> None:
    """Show stages on stderr from now on (``on``) or never."""
    global _enabled
    _enabled = on


def wanted(as_json: bool) -> bool:
    """True when a person is watching: stderr is a terminal and the output is not JSON."""
    return not as_json and sys.stderr.isatty()


def stage(label: str) -> None:
    """Announces a long step ("label ..."); the previous one, if still open, is closed first."""
    global _open
    if not _enabled:
        return
    done()
    sys.stderr.write(f"{label} ...")
    sys.stderr.flush()
    _open = (label, time.perf_counter())


def done() -> None:
    """Closes the open step with its duration (" done, 1.2 s")."""
    global _open
    if not _enabled or _open is None:
        return
    sys.stderr.write(f" done, {time.perf_counter() - _open[1]:.1f} s\n")
    sys.stderr.flush()
    _open = None


def abandon() -> None:
    """Ends the open step's line when it failed, so an error message starts on a line of its own."""
    global _open
    if not _enabled or _open is None:
        return
    sys.stderr.write(" failed\n")
    sys.stderr.flush()
    _open = None
