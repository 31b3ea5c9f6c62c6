"""What the `builder` and `runtime` commands print besides their results: progress lines for long
steps, on a terminal only, and typed errors (text or JSON, each with its exit code), never a traceback.

Progress: the CLIs switch it on with ``enable(stderr is a tty and not --json)``; library code calls
``stage("compiling kernels")`` before a long step and ``done()`` after it (or the next ``stage``
closes the previous one). Off (the default, and whenever output is piped), every call is a no-op, so
programs reading stdout or stderr see nothing of it.
"""
from __future__ import annotations

import json
import math
import os
import sys
import textwrap
import time

import click

from toolcall.common.errors import EXIT_CODES, EngineError

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

# Set to 1 to let an unexpected exception end in its traceback instead of an "internal" error.
TRACEBACK_ENV = "TOOLCALL_TRACEBACK"


def exit_code_help(label: str, first: int, last: int, width: int = 96) -> str:
    """"label: code N, ..." for the exit codes in [first, last], wrapped for a --help epilog."""
    codes = ", ".join(f"{c} {n}" for n, c in sorted((n, c) for c, n in EXIT_CODES.items() if first <= n <= last))
    return textwrap.fill(f"{label}: {codes or 'none'}.", width, subsequent_indent="  ")


def json_safe(value):
    """``value`` with every NaN/Infinity float replaced by None (JSON has neither; e.g. the margin
    of a step with one allowed candidate is infinite)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def json_text(value) -> str:
    """Strict JSON (indent 2) of ``value`` after json_safe: what every --json output prints."""
    return json.dumps(json_safe(value), indent=2, allow_nan=False, default=str)


def fail(err: EngineError, as_json: bool) -> None:
    """Prints a typed error (JSON on stdout with --json, else a message on stderr) and exits with its code."""
    abandon()
    if as_json:
        click.echo(json_text(err.to_json()))
    else:
        click.echo(f"error: {err}", err=True)
    sys.exit(err.exit_code)


class TypedErrorGroup(click.Group):
    """A click group that never ends in a traceback: with --json anywhere on the command line,
    click's own usage errors come out as {"error": "usage", ...} too; an unexpected exception
    becomes an "internal" error naming it (set TOOLCALL_TRACEBACK=1 to see the traceback)."""

    wants_json = False

    def main(self, args=None, *rest, **kwargs):
        args = list(sys.argv[1:] if args is None else args)
        self.wants_json = "--json" in args
        return super().main(args, *rest, **kwargs)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            if not self.wants_json:
                raise
            where = f"`{e.ctx.command_path} --help`" if e.ctx is not None else f"`{self.name} --help`"
            param = getattr(e, "param", None)
            fail(EngineError("usage", f"{e.format_message()} See {where}.",
                             **({"option": param.name} if param is not None else {})), True)
        except EngineError as e:  # a command that forgot to catch its typed error
            fail(e, self.wants_json)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Exception as e:
            if os.environ.get(TRACEBACK_ENV) == "1":
                raise
            fail(EngineError("internal", f"{type(e).__name__}: {e}. This is a bug or an environment problem "
                             f"(disk, permissions); rerun with {TRACEBACK_ENV}=1 for the traceback and report it.",
                             exception=type(e).__name__), self.wants_json)
