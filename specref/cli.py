"""``specref``: the command line, one program with a subcommand per job (``specref COMMAND -h``).

::

    specref selftest [--quick]                            the exact self-check (python -m specref.verify)
    specref check --impl MODULE:FUNCTION --level LEVEL    the oracle's verdict on an implementation
    specref plan --impl MODULE:FUNCTION --level LEVEL     N and an ETA per case, before a long check
    specref sweep FILE [--out PATH]                       implementations x levels x settings, resumable
    specref bench [...]                                   measured speedups (python -m specref.bench)

Each subcommand is one small function: it parses, calls the library, and maps the result to the
exit status (SPEC §13.3, :data:`~specref.verification.running.report.EXIT_STATUS`) -- 0 every case
ok; else the first that applies: 1 a case differs, 3 one misbehaves, 4 one deviates only on single
coin grid points (``boundary``), 5 one could not be judged, 6 one timed out (no verdict); 2 a usage
error (an unknown subcommand or flag prints the usage), an implementation that cannot be loaded, or
an internal error.  With ``--no-isolate`` the work runs in one child process that the command
supervises (:func:`specref.verify.supervised`), so that an implementation that ends its process
gets 3 (it crashed), never its own exit status.  The work is done by the same functions as ``python -m specref.verify`` and
``python -m specref.bench``, which keep working as they were.

Nothing here names a level: ``--level`` is looked up in
:data:`~specref.verification.levels.LEVELS` when the check runs, after the implementation's
module is imported, so a level that module registers (:func:`specref.register`) works like
specref's own; an unknown name is an error that lists the registered ones.  The oracle is imported
only by the subcommands that need it (and by ``-h`` of ``check`` and ``plan``, whose help lists
the levels), so ``specref -h`` and ``specref bench`` start quickly.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

from specref import __version__

EXIT_OK, EXIT_DIFFERS, EXIT_USAGE, EXIT_MISBEHAVES = 0, 1, 2, 3  # as python -m specref.verify's (SPEC §13.3)


class _Parser(argparse.ArgumentParser):
    """A parser whose help (``levels=True``) ends with the registered levels and their calls."""

    def __init__(self, *args, levels: bool = False, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)  # the epilog's lines kept
        super().__init__(*args, **kwargs)
        self.lists_levels = levels

    def format_help(self) -> str:
        if self.lists_levels:  # imported here: the registry loads with the oracle (seconds)
            from specref.verification.levels import LEVELS

            self.epilog = "levels (--level):\n" + "\n".join(f"  {name}: {lv.signature}" for name, lv in LEVELS.items())
        return super().format_help()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _add_executor(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=_positive_int, default=1, help="worker processes (default 1)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="run on an existing Dask cluster, e.g. tcp://host:8786")


def _add_implementation(p: argparse.ArgumentParser) -> None:
    """The flags that name an implementation and declare how it is called (check and plan)."""
    p.add_argument("--impl", required=True, metavar="MODULE:FUNCTION", help="the implementation")
    p.add_argument("--level", default="step", metavar="LEVEL", help="a registered level (listed below; default step)")
    p.add_argument("--samples", type=_positive_int, help="statistical mode: N per case (default: planned)")
    p.add_argument("--time-limit", type=_positive_float, default=None,
                   help="seconds per call (default: derived from the calls measured -- a case's first call 45 s, "
                        "then 4 x the slowest, at least 10 s -- and the first time-out ends the check; SPEC 13.2)")
    p.add_argument("--no-isolate", action="store_true",
                   help="run the cases in one process, not a worker each (faster; no hard deadline, and an "
                        "implementation that exits or crashes ends the run, with exit status 3: it misbehaved)")
    p.add_argument("--batch", type=int, metavar="N",
                   help="step, logits and decoder levels: the implementation takes N samples per call, rows "
                        "stacked (SPEC 13.1)")
    p.add_argument("--rules", nargs="+", metavar="NAME=VALUE",
                   help="logits and decoder levels: the implementation's declared sampler, e.g. "
                        "order=top_k,top_p,min_p,temperature top_p_ties=lowest_id (SPEC 2.1)")


def parser() -> argparse.ArgumentParser:
    """The ``specref`` command line: one subparser per subcommand, each with its function as ``run``."""
    ap = _Parser(prog="specref", description="specref: the reference implementation and exact verifier of "
                                             "speculative decoding.",
                 epilog="exit status of check and sweep (SPEC 13.3): 0 every case ok, 1 a case differs, 3 one "
                        "misbehaves, 4 one deviates only on single coin grid points (boundary), 5 one could not be "
                        "judged, 6 one timed out (no verdict), 2 usage or internal error; the first that applies. "
                        "specref COMMAND -h for each.")
    ap.add_argument("--version", action="version", version=f"specref {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("selftest", help="the exact self-check of the reference, the loops and the zoo",
                       description="The exact self-check (what python -m specref.verify runs): 0 when it passes.")
    p.add_argument("--quick", action="store_true", help="a subset of the matrix")
    p.add_argument("--scenario", metavar="NAME", help="only scenarios whose name contains NAME")
    p.add_argument("--json", metavar="PATH", help="write a machine-readable report with every number")
    p.add_argument("--no-progress", action="store_true", help="no [i/N] counters")
    _add_executor(p)
    p.set_defaults(run=selftest, parser=p)

    p = sub.add_parser("check", levels=True, help="the oracle's verdict on an implementation",
                       description="Check MODULE:FUNCTION with the oracle. Exit status, the first that applies: "
                                   "1 a case differs, 3 misbehaves, 4 boundary (only single coin grid points), 5 could "
                                   "not be judged, 6 timed out (no verdict); 0 preserves the target distribution; "
                                   "2 usage or internal error.")
    _add_implementation(p)
    p.add_argument("--mode", choices=["exact", "statistical"], default="exact")
    p.add_argument("--json", metavar="PATH", help="write the whole report as JSON")
    _add_executor(p)
    p.set_defaults(run=check, parser=p)

    p = sub.add_parser("plan", levels=True, help="N and an ETA per case, before a long check",
                       description="Plan a check of MODULE:FUNCTION: N per case and an ETA from a few timed calls. "
                                   "0 planned, 3 the implementation misbehaved on a timed call, 2 usage error.")
    _add_implementation(p)
    p.add_argument("--mode", choices=["exact", "statistical"], default="statistical")
    p.add_argument("--calls", type=_positive_int, default=5, help="warm calls timed per case (default 5)")
    p.set_defaults(run=plan, parser=p)

    p = sub.add_parser("sweep", help="run a sweep file (TOML or JSON), resumable",
                       description="Run the sweep in FILE (specref.verification.campaigns.sweep): 0 every cell ok; "
                                   "else as check's, over every cell's status: 1 differs, 3 misbehaves, 4 boundary, "
                                   "5 could not be judged, 6 timed out, 2 usage or internal error.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--out", metavar="PATH", help="the JSON record (resumed when it exists)")
    p.add_argument("--no-isolate", action="store_true", help="run the implementations in this process")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_executor(p)
    p.set_defaults(run=sweep, parser=p)

    sub.add_parser("bench", add_help=False, help="measured speedups (specref bench -h for its flags)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run ``specref ARGV``; returns the exit status (argparse's usage errors exit 2 themselves)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = parser()
    args, rest = ap.parse_known_args(argv)
    if args.command == "bench":  # its own parser takes every flag after the word
        return bench(rest)
    if rest:
        args.parser.error(f"unrecognized arguments: {' '.join(rest)}")  # exits 2 with the subcommand's usage
    args.argv = argv
    return args.run(args)


# ---------------------------------------------------------------- the subcommands


def selftest(args) -> int:
    """``specref selftest``: :func:`specref.verify.selftest`; 0 passes, 1 fails."""
    from specref import verify

    job = partial(verify.selftest, quick=args.quick, scenario=args.scenario, json_path=args.json,
                  progress=not args.no_progress, command="specref " + " ".join(args.argv))
    return verify.with_executor(job, workers=args.workers, scheduler=args.scheduler)


def check(args) -> int:
    """``specref check``: :func:`specref.verify.check_outside`; its exit status (SPEC §13.3): 0 preserves, 1 differs,
    3 misbehaves, 4 boundary, 5 could not be judged, 6 timed out, 2 usage or internal error (``--no-isolate``:
    supervised, :func:`specref.verify.supervised`)."""
    from specref import verify

    run = partial(verify.with_executor, partial(verify.check_args, args), workers=args.workers,
                  scheduler=args.scheduler)
    return verify.supervised(run) if args.no_isolate else run()


def plan(args) -> int:
    """``specref plan``: :func:`specref.verification.campaigns.planning.plan`'s table; 0 planned,
    3 a timed call misbehaved (its row's note says how), 2 usage error (``--no-isolate``: supervised)."""
    from specref import verify

    return verify.supervised(partial(_plan, args)) if args.no_isolate else _plan(args)


def _plan(args) -> int:
    from specref.core.errors import SpecrefError
    from specref.verification.campaigns import planning
    from specref.verify import load_outside

    loaded = load_outside(args.impl, args.level, rules=args.rules, batch=args.batch, isolate=not args.no_isolate)
    if loaded is None:
        return EXIT_USAGE
    fn, rules = loaded
    try:
        rows = planning.plan(args.level, fn, mode=args.mode, samples=args.samples, time_limit=args.time_limit,
                             isolate=not args.no_isolate, calls=args.calls, rules=rules, batch=args.batch)
    except SpecrefError as e:
        print(f"cannot plan {args.impl!r}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the planner's own failure: exit 2, as check's internal errors
        print(f"internal error while planning {args.impl!r}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_MISBEHAVES if any(r.seconds_per_call is None for r in rows) else EXIT_OK


def sweep(args) -> int:
    """``specref sweep FILE``: :func:`specref.verify.run_sweep_file`; 0 every cell ok, 1 one is not, 2 usage."""
    from specref import verify

    job = partial(verify.run_sweep_file, args.file, out=args.out, progress=not args.no_progress,
                  isolate=not args.no_isolate)
    run = partial(verify.with_executor, job, workers=args.workers, scheduler=args.scheduler)
    return verify.supervised(run, loaded=True) if args.no_isolate else run()


def bench(argv: list[str]) -> int:
    """``specref bench ...``: :func:`specref.bench.main` with these flags (its parser, its exit statuses)."""
    from specref import bench as bench_

    return bench_.main(argv, prog="specref bench")
