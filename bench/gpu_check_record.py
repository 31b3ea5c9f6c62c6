"""What bench/gpu_check.py's stages keep when something breaks: a result file rewritten after
every job, a hard exit when a stage outlives its time or the device is stuck, and the checks
run before anything else.

A stage process writes its result through a ``Recorder``: each ``put`` rewrites the JSON file
atomically (temporary file + rename), so when the process is killed, crashes or exits non-zero
the parent still reads every record gathered until then (``read_result``). ``arm_deadline``
uses faulthandler's watchdog thread, which needs no GIL: a stage blocked inside a driver call
(a copy waiting on a WHILE graph that never ends) still exits, with every thread's traceback
in its log.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path

# The carried wheels the device machine installs first (jsonschema and its three dependencies;
# rpds-py is compiled, so its wheel must be the cp312 one the device's Python 3.12 loads).
WHEELS = {"jsonschema": "jsonschema-*-py3-none-any.whl",
          "jsonschema_specifications": "jsonschema_specifications-*-py3-none-any.whl",
          "referencing": "referencing-*-py3-none-any.whl",
          "rpds": "rpds_py-*-cp312-*manylinux*.whl"}
STUCK_EXIT = 3  # a stage's exit code after it stopped because the device is stuck


class Recorder:
    """A stage's result dict, rewritten to ``path`` after every ``put``."""

    def __init__(self, path: str | Path | None):
        self.path, self.data = (Path(path) if path else None), {}

    def put(self, key: str, value) -> None:
        self.data[key] = value
        self.flush()

    def flush(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, default=str))
        os.replace(tmp, self.path)


def read_result(path: Path) -> dict | None:
    """The stage's last written result, or None (never written, or unreadable)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def arm_deadline(seconds: float) -> None:
    """Ends this process (exit code 1, tracebacks of every thread to stderr) after ``seconds``,
    even if the main thread is blocked in C code."""
    faulthandler.dump_traceback_later(max(1.0, seconds), exit=True, file=sys.stderr)


def is_stuck(error) -> bool:
    """Whether an exception (or its recorded text) says a WHILE graph never ended."""
    code = getattr(error, "code", None)
    text = str(error)
    return code == "graph_stuck" or "graph_stuck" in text or "still runs" in text or "still running" in text


def exit_stuck(rec: Recorder, where: str) -> None:
    """Records that the device is stuck and ends the process at once (no interpreter teardown:
    freeing device memory would wait on the loop forever)."""
    rec.put("stuck", f"{where}: a WHILE graph never ended; the device is unusable, the stage stopped here")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(STUCK_EXIT)


def close_all(closers) -> str | None:
    """Calls every closer (best effort); returns the first error as text, or None."""
    first = None
    for close in closers:
        try:
            close()
        except Exception as e:
            first = first or f"{type(e).__name__}: {e}"[:800]
    return first


def missing_wheels(folder: Path) -> list[str]:
    """The carried wheels absent from ``folder`` for modules that do not import already."""
    import importlib.util
    out = []
    for module, pattern in WHEELS.items():
        if importlib.util.find_spec(module) is None and not list(folder.glob(pattern)):
            out.append(pattern)
    return out
