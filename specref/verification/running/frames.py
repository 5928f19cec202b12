"""Where an implementation failed: the innermost frame of an exception, as ``file:line in function``.

A crash reported as ``RuntimeError: `` says nothing; with the frame that raised it
(``.../decoder.py:42 in accept``) it points at the line to read.  Used by
:func:`specref.verification.running.calling.describe`.
"""

from __future__ import annotations

import os

__all__ = ["innermost_frame", "shown_path"]


def innermost_frame(e: BaseException) -> str:
    """``"path/to/file.py:123 in name"`` of the innermost frame of ``e``'s traceback, or ``""``;
    the path as :func:`shown_path` shows it (never absolute).

    Never raises: an exception without a traceback (never raised), or one whose
    traceback cannot be read, gives ``""``.
    """
    try:
        tb = e.__traceback__
        if tb is None:
            return ""
        while tb.tb_next is not None:
            tb = tb.tb_next
        code = tb.tb_frame.f_code
        return f"{shown_path(code.co_filename, tb.tb_frame.f_globals.get('__name__'))}:{tb.tb_lineno} in {code.co_name}"
    except BaseException:  # noqa: BLE001 - nothing about a hostile exception is trusted
        return ""


def shown_path(filename: str, module: str | None = None) -> str:
    """``filename`` relative to the working directory when it lies there, else relative to the
    directory its top-level package was imported from (``module``, a dotted name: ``pkg/sub/mod.py``),
    else its last part: a report never carries a machine's absolute paths."""
    if not os.path.isabs(filename):
        return filename
    here = os.getcwd()
    if os.path.commonpath([here, filename]) == here:
        return os.path.relpath(filename, here)
    parts = module.split(".") if isinstance(module, str) and module not in ("__main__", "") else []
    depth = len(parts) + (os.path.basename(filename) == "__init__.py")
    root = filename
    for _ in range(depth):
        root = os.path.dirname(root)
    if depth and os.path.relpath(filename, root).replace(os.sep, ".").removesuffix(".py").removesuffix(
            ".__init__") == module:
        return os.path.relpath(filename, root)
    return os.path.basename(filename)
