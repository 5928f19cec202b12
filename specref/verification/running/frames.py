"""Where an implementation failed: the innermost frame of an exception, as ``file:line in function``.

A crash reported as ``RuntimeError: `` says nothing; with the frame that raised it
(``.../decoder.py:42 in accept``) it points at the line to read.  Used by
:func:`specref.verification.running.calling.describe`.
"""

from __future__ import annotations

__all__ = ["innermost_frame"]


def innermost_frame(e: BaseException) -> str:
    """``"path/to/file.py:123 in name"`` of the innermost frame of ``e``'s traceback, or ``""``.

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
        return f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
    except BaseException:  # noqa: BLE001 - nothing about a hostile exception is trusted
        return ""
