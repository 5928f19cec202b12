"""What every figure script shares: the output folder, the style, the caption, and
writing one figure as a PNG together with the JSON it was drawn from.

matplotlib is imported inside the functions that draw, never at module level, so
``import figures`` (and everything in specref) needs only NumPy.  Figures are built
on ``matplotlib.figure.Figure`` with the Agg renderer -- no pyplot, no global state,
no display -- under matplotlib's default style, whatever the user's matplotlibrc says.

Determinism: each figure's numbers come from fixed inputs and seeded generators,
the JSON is written with a fixed key order, and the PNG is written without its
"Software" and date metadata, so two runs give identical files (same library versions).
"""

from __future__ import annotations

import contextlib
import json
import math
import textwrap
from fractions import Fraction
from pathlib import Path

__all__ = [
    "DATA_DIR",
    "DEFAULT_OUT_DIR",
    "style",
    "add_caption",
    "placeholder",
    "save",
    "exact",
    "num",
    "read_json",
    "display_path",
    "new_figure",
    "run_as_script",
]

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_OUT_DIR = PACKAGE_DIR / "out"  # git-ignored
DATA_DIR = PACKAGE_DIR / "data"  # committed measurement files (bench.json, verify.json)

_DPI = 110
_CAPTION_CHARS_PER_INCH = 15  # caption line length at font size 8


@contextlib.contextmanager
def style():
    """matplotlib's default style plus a few fixed settings, for reproducible output."""
    import matplotlib
    import matplotlib.style

    with matplotlib.style.context("default"), matplotlib.rc_context(
        {"font.size": 9, "axes.titlesize": 10, "legend.fontsize": 8}
    ):
        yield


def new_figure(nrows: int, ncols: int, *, width: float, height: float):
    """A Figure with a grid of axes (constrained layout).  -> (fig, axes [nrows, ncols])"""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def add_caption(fig, caption: str) -> None:
    """The caption as text under the axes (``save`` crops the PNG around it)."""
    width = int(fig.get_figwidth() * _CAPTION_CHARS_PER_INCH)
    wrapped = "\n".join(textwrap.wrap(caption, width))
    fig.text(0.0, -0.01, wrapped, ha="left", va="top", fontsize=8, wrap=False)


def placeholder(ax, message: str, *, xlabel: str, ylabel: str) -> None:
    """An empty panel that says why it is empty (missing input data)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(
        0.5, 0.5, "\n".join(textwrap.wrap(message, 48)), ha="center", va="center",
        transform=ax.transAxes, fontsize=9, color="tab:red",
        bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "tab:red"},
    )
    # a legend entry, so that even the empty panel says what it would show
    ax.plot([], [], color="tab:red", label="no data")
    ax.legend(loc="upper right")


def save(fig, data: dict, out_dir, name: str) -> list[Path]:
    """Write ``name.png`` and ``name.json`` (``data``) into ``out_dir``.  -> the two paths"""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png, js = out_dir / f"{name}.png", out_dir / f"{name}.json"
    add_caption(fig, data["caption"])
    # no "Software" (matplotlib version) chunk and no date: the bytes depend on the drawing only
    fig.savefig(png, dpi=_DPI, bbox_inches="tight", pad_inches=0.15, metadata={"Software": None})
    js.write_text(json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    return [png, js]


def render(name: str, compute, draw, out_dir, *args) -> list[Path]:
    """Compute the figure's data, draw it in the house style and save PNG + JSON."""
    data = compute(*args)
    with style():
        return save(draw(data), data, out_dir, name)


def exact(x) -> str:
    """A rational as ``"n/d"`` (``"n"`` when whole), the JSON form of exact values."""
    return str(Fraction(x))


def num(x, digits: int = 12) -> float:
    """A float for the JSON, rounded so that last-bit noise does not show."""
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"non-finite value {x!r} cannot go into the figure JSON")
    return round(x, digits)


def read_json(path: Path):
    """The parsed file, or None when it does not exist.  A file that is not JSON is an error."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def display_path(path) -> str:
    """``path`` relative to the repository when inside it, else its file name.

    Keeps the JSON free of machine-specific absolute paths.
    """
    try:
        return Path(path).resolve().relative_to(PACKAGE_DIR.parent).as_posix()
    except ValueError:
        return Path(path).name


def run_as_script(main) -> None:
    """``python -m figures.<module>``: draw into the default folder, print each file."""
    for path in main():
        print(path)
