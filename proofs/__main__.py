"""``python -m proofs [-v] [claim ...]``: print each claim and its verdict (SPEC §3, §8, §10).

Exits 0 when every claim is proved (and the cross-check agrees), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from proofs import selected
from proofs.core import Result


def _verdict(result: Result) -> str:
    if result.ok:
        return result.status.upper()
    example = result.counterexample
    if example is None:
        return f"{result.status.upper()}: " + next(c.detail for c in result.cases if not c.ok)
    lines = [f"{result.status.upper()} in case: {example.pop('case')}"]
    lines += [f"      {key}: {_fmt(value)}" for key, value in example.items()]
    return "\n".join(lines)


def _fmt(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def show(number: str, result: Result, seconds: float, verbose: bool) -> None:
    print(f"[{number}] {result.title}  ({result.spec})")
    print(f"  claim: {result.statement}")
    if result.table:
        print("    " + result.table.replace("\n", "\n    "))
    print("  assumptions:")
    for assumption in result.assumptions:
        print(f"    - {assumption}")
    counts = Counter(case.status for case in result.cases)
    print(f"  cases: {len(result.cases)} (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")")
    for case in result.cases:
        if verbose or not case.ok:
            detail = f" -- {case.detail}" if case.detail else ""
            print(f"    {case.status:<14} {case.name}{detail}")
    print(f"  => {_verdict(result)}  [{seconds:.1f} s]")
    print()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proofs", description=__doc__.splitlines()[0])
    parser.add_argument("claims", nargs="*", help="claim numbers to run (e.g. 1 4 5d); default all")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every case, not only failures")
    args = parser.parse_args(argv)
    chosen = selected(args.claims)
    if not chosen:
        parser.error(f"no claim numbered {' or '.join(args.claims)}")
    failed, start = [], time.perf_counter()
    for number, prove in chosen:
        t0 = time.perf_counter()
        result = prove()
        show(number, result, time.perf_counter() - t0, args.verbose)
        if not result.ok:
            failed.append(number)
    total = time.perf_counter() - start
    if failed:
        print(f"FAILED: claim {', '.join(failed)}  [{total:.1f} s]")
        return 1
    print(f"All {len(chosen)} claims hold.  [{total:.1f} s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
