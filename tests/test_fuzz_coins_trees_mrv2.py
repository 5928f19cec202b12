"""Fuzzing 0.3's surfaces: the coin levels (``batched_coins``, ``tree_coins``, ``vllm_coins``), ``mrv2``,
the greedy levels (``greedy_tree``, ``greedy_tree_step``), user-built trees, the case classes, the new
arguments of ``check`` and ``plan``, and the CLI.

The outcome classes are those of ``tests/test_fuzz.py`` and ``tests/test_fuzz_surfaces.py``:

1. **Bad input, by property** (hypothesis, each surface with its own ``@seed``, no shrinking: a
   failing input is reported as drawn): every field of ``CoinCase``, ``TreeCoinCase``,
   ``MRV2Case``, ``GreedyTreeCase`` and ``UserTreeCase``, and every new argument of ``check`` and
   ``plan`` (``settings``, ``cases``, ``file``, ``executor``, ``batch``, ``rules``), is set to a drawn
   bad value (wrong types, NaN, infinities, negatives, ``10**400``, strings, None, floats where ints
   belong).  The value is refused with a ``SpecrefError`` that names the field or argument, or it
   is taken and the check runs with no internal error; nothing else escapes, and an int field
   never holds a float, a bool or a string it was given.  Each surface tries one value of each
   kind first (:data:`tests.fuzz_kinds_03.EXPLICIT`), then drawn ones.  ``declare_ties`` and the
   batched parser's counts (NaN, 1.5, inf) likewise; trees thousands deep are judged, or
   ``over budget``, at once.
2. **A misbehaviour suite** (:mod:`tests.fuzz_kinds_03`): at least 60 kinds of implementation at
   each 0.3 level (46 at the tree level on user-built trees) that raise, exit, crash, hang, return garbage, misuse their coins or the rng, write into
   their inputs, keep state, or are simply wrong, and correct ones written otherwise than the
   reference (another coin order, a recovered token read off the rejected coin, entries past
   ``num_sampled``, declared split ties, outputs in other containers).  Each wrong kind must not be
   ``ok`` (0 false ok), each correct kind must be ``ok`` (0 false alarms), nothing may escape
   ``check`` (0 escapes), no check may run past its limits (0 hangs) and no status may be
   ``internal error`` (0 crashes) -- in exact mode in-process and isolated, in statistical mode
   where the level has one, and through the CLI (exit 0 only when every case is ok, 1 on any
   other status of the implementation, 2 on a usage error).

The cases are the smallest that show every wrong kind (B = 2, K = 1, V = 2 at the batched_coins and
mrv2 levels; the level's own first case at vllm_coins, whose residuals hold two tokens so that the
exponential race is judged), and every call runs under ``time_limit = 0.2`` s: the module runs in
about 30 s on one core.  ``benchmarks/fuzz_record.py`` runs the same kinds and inputs and writes the
counts to ``benchmarks/out/fuzz_record.json``.
"""

import io
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path

import pytest

from specref import verify
from specref.core.errors import SpecrefError
from specref.verification.levels import LEVELS
from specref.verification.oracle import check
from specref.verification.running.calling import can_isolate
from tests import fuzz_kinds_03 as K

ROOT = Path(__file__).resolve().parents[1]
needs_fork = pytest.mark.skipif(not can_isolate(), reason="isolation needs the fork start method")


# ---------------------------------------------------------------- 1. bad input, by property


def _holds(surface, **drawn):
    """The property of ``surface`` on one drawn input: refused by name or accepted, and in seconds."""
    started = time.monotonic()
    outcome, detail = K.PROPERTIES[surface].probe(**drawn)
    assert outcome in ("refused", "accepted"), (surface, outcome, detail)
    assert time.monotonic() - started < K.SLACK, (surface, "ran past the slack: a hang")


def _fuzzed(surface):
    """Every input of ``surface``: its explicit ones, then those hypothesis draws (the record's too)."""
    K.fuzzed(surface, lambda **drawn: _holds(surface, **drawn))()


def _surfaces(prefix):
    return [name for name in K.PROPERTIES if name.startswith(prefix)]


@pytest.mark.parametrize("surface", _surfaces("case field: "))
def test_case_fields_are_refused_by_name_or_judged(surface):
    """A drawn bad value in one field of a case: a SpecrefError naming the field (at construction or
    before any case runs), or a case that is judged with no internal error -- never a bare
    TypeError, ValueError, OverflowError or IndexError, and never an int field cast from a float."""
    _fuzzed(surface)


@pytest.mark.parametrize("surface", _surfaces("check argument: "))
def test_check_arguments_are_refused_by_name_or_work(surface):
    """check(level, reference, **{name: value}) -- settings=, cases=, executor=, batch=, rules= and the
    Settings fields: a SpecrefError naming the argument, or a report with no internal error; never
    AttributeError, OverflowError, or a TypeError that is not specref's."""
    _fuzzed(surface)


@pytest.mark.parametrize("surface", _surfaces("plan argument: "))
def test_plan_arguments_are_refused_by_name_or_work(surface):
    """plan(level, reference, mode="exact", **{name: value}) -- settings=, cases=, file=, executor=, batch=,
    rules=, calls=: a SpecrefError naming the argument (a ``file`` that cannot be written to
    included), or rows."""
    _fuzzed(surface)


def test_declare_ties_refuses_by_name_or_declares():
    """declare_ties(fn, ties): a SpecrefError naming ``fn`` (not callable) or ``ties`` (not a convention),
    else a declared implementation the greedy_tree_step level judges."""
    _fuzzed("declare_ties")


def test_parse_output_refuses_or_reads_the_counts_as_they_are():
    """The batched levels' parser (batched_coins, vllm_coins) on drawn outputs with drawn counts: invalid
    output, or tokens whose counts are the ones given -- never NaN, 1.5 or inf read as a count."""
    _fuzzed("parse_output counts")


def test_greedy_trees_thousands_deep_are_judged():
    """A chain up to 6,000 deep whose argmax path runs to its leaf: ok, TV 0, in seconds (no recursion)."""
    _fuzzed("deep greedy trees")


def test_user_chains_of_any_depth_are_ok_or_over_budget_at_once():
    """A user-built chain up to 20,000 deep over V = 2 at ``max_paths = 500``: ok where its law fits the
    budget, ``over budget`` at once where it does not -- never an internal error or a long enumeration."""
    _fuzzed("deep user chains")


def test_malformed_deep_user_trees_name_the_slot():
    """A chain up to 20,000 deep, malformed at its last slot: a SpecrefError naming the field and the slot."""
    _fuzzed("malformed deep user trees")


def test_batch_at_a_level_without_batches_names_it_and_its_value():
    """SPEC §13.1: ``batch`` is refused at the levels that take no batches, naming it and its value."""
    messages = {}
    for level in K.API_LEVELS:
        with pytest.raises(SpecrefError) as e:
            check(level, K.reference(level), cases=K._api_cases(level), batch=7, **K.SETTINGS)
        messages[level] = str(e.value)
    assert {lv: m for lv, m in messages.items() if "batch" not in m or "7" not in m} == {}


@pytest.mark.parametrize("level", ["batched_coins", "tree_coins", "vllm_coins"])
def test_the_coin_levels_refuse_statistical_mode_by_name(level):
    with pytest.raises(SpecrefError, match="mode"):
        check(level, K.reference(level), cases=K._api_cases(level), mode="statistical", samples=100)


# ---------------------------------------------------------------- 2. the misbehaviour suite


def test_the_suite_has_at_least_60_kinds_per_level():
    """Each 0.3 level: at least 60 kinds (its wrong kinds, the isolated-only ones, its correct ones)."""
    counts = K.kind_count()
    total = {lv: c["wrong"] + c["correct"] + len(K.ISOLATED_ONLY) for lv, c in counts.items()}
    assert all(total[lv] >= 60 for lv in K.API_LEVELS) and total["tree"] >= 40, total
    assert all(counts[lv]["correct"] >= 2 for lv in K.LEVELS_03), counts
    own = {lv: counts[lv]["wrong"] - len(K.EXCEPTIONS) for lv in K.LEVELS_03}  # beyond the shared exceptions
    assert sum(own.values()) >= 200, own


# the status the spec gives a kind (SPEC §11.9-§11.12, §12.4, §12.5, §13.3), where it names one
STATUSES = {
    "batched_coins": {"raises SystemExit(0)": "raised", "returns SystemExit in .cpu()": "invalid output",
                      "returns hanging __array__": "timeout", "returns NaN counts": "invalid output",
                      "returns counts 1.5": "invalid output", "swapped rows": "invalid output",
                      "residual from p": "differs"},
    "vllm_coins": {"raises KeyboardInterrupt()": "raised", "returns SystemExit in .cpu()": "invalid output",
                   "returns hanging __array__": "timeout", "inclusive p / q >= u (vllm_inclusive_kernel)": "boundary",
                   "races on p (vllm_race_on_p_kernel)": "differs", "races on p above u = 0.9": "differs",
                   "exponentials clamped at 8": "not an exponential race"},
    "tree_coins": {"float ids (2.75)": "invalid output", "-1 before an accepted node": "invalid output",
                   "root entry 5": "invalid output", "bool root entry": "invalid output",
                   "returns endless rows": "invalid output", "returns hanging iteration": "timeout",
                   "returns object iterating to SystemExit": "invalid output"},
    "mrv2": {"writes target_logits": "writes into its inputs", "writes temperature": "writes into its inputs",
             "returns SystemExit in __array__": "invalid output", "returns hanging __array__": "timeout",
             "returns object iterating to SystemExit": "invalid output", "NaN num_sampled": "invalid output"},
    "greedy_tree": {"writes candidates": "writes into its inputs", "str outputs": "invalid output",
                    "ids + 0.5": "invalid output", "returns SystemExit in __array__": "invalid output",
                    "returns KeyboardInterrupt in __array__": "invalid output", "returns hanging __array__": "timeout"},
    "greedy_tree_step": {"rewrites its tree": "writes into its inputs", "writes its rows": "writes into its inputs",
                         "endless path": "invalid output", "returns object whose iteration hangs": "timeout",
                         "returns object iterating to SystemExit": "invalid output",
                         "returns token whose __index__ exits": "invalid output", "float token": "invalid output"},
    "tree": {"writes its q rows": "writes into its inputs", "returns object iterating to SystemExit": "invalid output"},
}


def _clean(t: K.Tally) -> dict:
    assert t.clean(), {k: v for k, v in t.failures().items() if v}
    return t.statuses


def _statuses_as_specified(level, statuses):
    wrong = {kind: (want, statuses[kind]) for kind, want in STATUSES[level].items()
             if any(s != want for s in statuses[kind] if s != "ok")}
    assert wrong == {}, wrong


@pytest.mark.parametrize("level", K.LEVELS_03)
def test_misbehaviour_exact_in_process(level):
    """Every kind at the level, in this process: 0 false ok, 0 false alarms, 0 escapes, 0 hangs, 0
    internal errors; and where the spec names a kind's status, that status."""
    t = K.tally(level, K.bad_kinds(level), K.CORRECT[level], isolate=False)
    _statuses_as_specified(level, {k: v for k, v in t.statuses.items()})
    _clean(t)


ISOLATED_HANGS = dict(zip(K.LEVELS_03, ["C-level hang", "busy loop", "blocks SIGALRM", "retries on BaseException",
                                        "ignores SIGALRM", "sleeps", "C-level hang"]))


@needs_fork
@pytest.mark.parametrize("level", K.LEVELS_03)
def test_misbehaviour_isolated(level):
    """Kinds that end or hang a process, each case in a forked worker: crashed or timeout, never an
    escape; one hang kind per level (every one of them somewhere), on the level's first case."""
    kinds = {k: K.ISOLATED_ONLY[k] for k in ("os._exit(0)", "os._exit(3)", "abort", "segfault", "SIGKILL itself")}
    kinds["raises SystemExit(0)"] = K.EXCEPTIONS["raises SystemExit(0)"]
    kinds[ISOLATED_HANGS[level]] = K.ISOLATED_ONLY[ISOLATED_HANGS[level]]
    correct = dict(list(K.CORRECT[level].items())[:1])
    statuses = _clean(K.tally(level, kinds, correct, cases=K.cases_of(level)[:1], isolate=True))
    assert statuses["segfault"] == ["crashed"] and statuses["os._exit(0)"] == ["crashed"], statuses
    assert statuses[ISOLATED_HANGS[level]] == ["timeout"], statuses


@needs_fork
@pytest.mark.parametrize("level, wrong", [("mrv2", "ignores q"), ("greedy_tree_step", "ties to the highest id"),
                                          ("greedy_tree", "last matching child")])
def test_misbehaviour_statistical_isolated_by_default(level, wrong):
    """Statistical mode (isolated by default) on the case that shows the wrong kind: N = 2000."""
    case = {"mrv2": K.mrv2_cases()[0], "greedy_tree_step": K.greedy_cases()[1], "greedy_tree": K.greedy_cases()[2]}[level]
    kinds = {wrong: K.WRONG[level][wrong], "os._exit(0)": K.ISOLATED_ONLY["os._exit(0)"],
             "raises SystemExit(0)": K.EXCEPTIONS["raises SystemExit(0)"]}
    correct = dict(list(K.CORRECT[level].items())[:1])
    statuses = _clean(K.tally(level, kinds, correct, cases=[case], mode="statistical", samples=2000, progress=False,
                              calls=2))
    assert statuses["os._exit(0)"] == ["crashed"] and statuses[wrong] == ["differs"], statuses


def test_a_narrow_wrong_piece_is_ok_only_to_its_stated_resolution():
    """SPEC §11.9: a kernel wrong only on a piece of 2^-10 of the final coin, away from the thresholds, is
    ok at 16 probes per coin *with that resolution stated*, and differs at 2^10 probes -- at both coin
    levels that take a TreeCase or a CoinCase.  The default time rule (limits from the measured calls): no
    kernel here hangs, and the suite's fixed 0.2 s per call read a loaded machine's slow call as a time-out."""
    coarse = check("batched_coins", K.coins_window_kernel, cases=[K.coin_case()]).results[0]
    assert coarse.status == "ok" and "ok to resolution 2^-4" in coarse.detail, coarse
    fine = check("batched_coins", K.coins_window_kernel, cases=[K.fine_coin_case()]).results[0]
    assert fine.status == "differs" and fine.tv >= 2.0 ** -11, fine
    tree = K.C.default_tree_coin_cases()[2]
    coarse = check("tree_coins", K.tree_window_kernel, cases=[tree]).results[0]
    assert coarse.status == "ok" and "ok to resolution 2^-4" in coarse.detail, coarse
    fine = check("tree_coins", K.tree_window_kernel, cases=[replace(tree, probes=2**10)]).results[0]
    assert fine.status == "differs", fine


# ---------------------------------------------------------------- the CLI


def _main(*args):
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        try:
            code = verify.main(list(args))
        except SystemExit as e:  # argparse's usage errors only
            code = e.code
    return code, out.getvalue()


@needs_fork
@pytest.mark.parametrize("level", K.LEVELS_03)
def test_cli_exit_codes_for_kinds_of_every_level(level, monkeypatch):
    """``--impl tests.fuzz_kinds_03:<kind> --level L`` in this process (isolated, the level's small cases):
    exit 0 for each correct kind, its outcome's status for each wrong one (SPEC §13.3: 1 a wrong law, 3 a
    write, an output that misbehaves, SystemExit, os._exit; 6 a hang), 2 for ``--batch`` and ``--rules`` at
    a level that takes neither."""
    monkeypatch.setitem(LEVELS, level, replace(LEVELS[level], cases=lambda: K.cases_of(level)))
    # the stale-buffer kind fresh, as a user's process has it: a buffer left by an earlier test in this worker
    # makes its first case differ already (exit 1), not the state check's second run (stateful, exit 3)
    monkeypatch.setattr(K, "_MRV2_BUFFERS", {})
    codes, escaped, want = {}, [], {}
    # A call's limit from this machine's measure: the whole level's run of a correct kind (every call of it,
    # its workers' forks and its state checks) times 4, at least 5 s -- so only the hanging kind times out,
    # on a loaded machine too (a fixed 0.2 s read a loaded machine's slow call of a stateful kind as a time-out)
    reference = next(attr for attr, (lv, _, code, _) in K.CLI_KINDS.items() if lv == level and code == 0)
    t0 = time.monotonic()
    assert _main("--impl", f"tests.fuzz_kinds_03:{reference}", "--level", level, "--no-progress")[0] == 0
    limit = max(5.0, 4 * (time.monotonic() - t0))
    for attr, (lv, kind, code, _) in K.CLI_KINDS.items():
        if lv != level:
            continue
        want[kind] = code
        try:
            codes[kind], text = _main("--impl", f"tests.fuzz_kinds_03:{attr}", "--level", level,
                                      "--time-limit", f"{limit:.1f}", "--no-progress")
        except BaseException as e:  # noqa: BLE001
            escaped.append(f"{kind}: {type(e).__name__}: {e}")
    assert escaped == []
    assert {k: c for k, c in codes.items() if c != want[k]} == {}, (codes, want)
    some = next(attr for attr, (lv, *_) in K.CLI_KINDS.items() if lv == level)
    for extra in (["--batch", "2"], ["--rules", "order=top_k,top_p,min_p,temperature"]):
        code, text = _main("--impl", f"tests.fuzz_kinds_03:{some}", "--level", level, *extra)
        assert code == 2 and extra[0].strip("-") in text, (extra, text[-500:])


@needs_fork
@pytest.mark.parametrize("impl, level, code", [
    ("cli_greedy_reference", "greedy_tree", 0),
    ("cli_vllm_race_above_09", "vllm_coins", 1),
    ("cli_greedy_reference", "mrv2 --batch 2", 2),
])
def test_cli_in_a_real_process(impl, level, code):
    """Three real processes, the levels' default cases: the reference exits 0, a recovered token raced
    on p above u = 0.9 exits 1, ``--batch`` at the mrv2 level exits 2 (before the module is imported)."""
    level, *extra = level.split()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "specref.verify", "--no-progress", "--impl",
                          f"tests.fuzz_kinds_03:{impl}", "--level", level, *extra],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert run.returncode == code, (run.stdout[-1500:], run.stderr[-1500:])
