"""A progress bar for long checks: samples done, rate and ETA (tqdm).

It appears only on a terminal and only for work that runs longer than
:data:`DELAY` seconds; ``enabled=False`` (``--no-progress``) and output that is not a
terminal stay clean.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

__all__ = ["DELAY", "progress_bar"]

#: Seconds before a bar is shown: short runs print nothing.
DELAY = 2.0


@contextmanager
def progress_bar(total: int, label: str, *, enabled: bool = True, unit: str = "sample", file=None):
    """``with progress_bar(n, "case") as advance: advance(k)`` -- ``advance`` counts ``k`` more done."""
    file = file or sys.stderr
    if not enabled or not getattr(file, "isatty", lambda: False)():
        yield lambda k: None
        return
    from tqdm import tqdm  # imported where it is used: the numerics do not need it

    with tqdm(total=total, desc=label, unit=unit, unit_scale=True, delay=DELAY, leave=False, file=file) as bar:
        yield bar.update
