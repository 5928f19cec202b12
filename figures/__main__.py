"""``python -m figures``: regenerate every figure into ``figures/out/`` (PNG + JSON).

    python -m figures                     # all seven figures
    python -m figures --out DIR           # somewhere else
    python -m figures --only fig3         # one figure (repeatable; fig3, 3 or mass_balance)

Prints each file written.  Figures 4 and 6 read ``figures/data/bench.json`` and
``figures/data/verify.json``; without them they draw a panel that says how to make
them.  The output is deterministic (fixed inputs, seeded generators).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from figures._common import DEFAULT_OUT_DIR

FIGURES = (
    "fig1_speed_ratio",
    "fig2_draft_length",
    "fig3_mass_balance",
    "fig4_measured",
    "fig5_monte_carlo",
    "fig6_verify",
    "fig7_methods",
)


def resolve(name: str) -> str:
    """``fig3_mass_balance``, ``fig3``, ``3`` or ``mass_balance`` -> ``fig3_mass_balance``."""
    for module in FIGURES:
        number, _, title = module.partition("_")
        if name in (module, number, number[3:], title):
            return module
    raise SystemExit(f"unknown figure {name!r}; choose from {', '.join(FIGURES)}")


def main(argv=None) -> list[Path]:
    parser = argparse.ArgumentParser(prog="python -m figures", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR, help=f"output folder (default {DEFAULT_OUT_DIR})")
    parser.add_argument("--only", action="append", metavar="NAME", help="draw only this figure (repeatable)")
    args = parser.parse_args(argv)
    chosen = FIGURES if not args.only else tuple(dict.fromkeys(resolve(n) for n in args.only))
    written = []
    for module in chosen:
        for path in importlib.import_module(f"figures.{module}").main(args.out):
            print(path, flush=True)
            written.append(path)
    return written


if __name__ == "__main__":
    main(sys.argv[1:])
