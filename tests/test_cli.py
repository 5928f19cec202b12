"""The ``specref`` command (specref.cli), the public face (``from specref import ...``) and the version.

Each subcommand runs and maps its result to 0 (ok), 1 (differs or misbehaves) or 2 (usage error);
an unknown subcommand or flag exits 2 with the usage; ``python -m specref.verify`` and the
command run the same functions; ``import specref`` stays light; pyproject.toml,
``specref.__version__`` and CHANGELOG.md name one version.
"""

import io
import json
import subprocess
import sys
import tomllib
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import specref
from specref import bench, cli, verify

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
STEP = "specref.core.step:speculative_step"  # specref's own step: preserves
WRONG = "tests.implementations:resample_from_p"  # SPEC §7 bug 1: differs
SEEDED = "tests.implementations:reference_with_seed"  # the step in statistical mode's call (an int seed)


def raises(p_target, q_draft, draft_tokens, seed):
    """A step that misbehaves on every call."""
    raise RuntimeError("always")


def run(*args):
    """``specref ARGS`` in this process: (exit status, stdout, stderr); argparse's exits caught."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def python(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


# ---------------------------------------------------------------- the command and the version


def test_the_console_script_is_declared_and_names_cli_main():
    assert PYPROJECT["project"]["scripts"] == {"specref": "specref.cli:main"}
    module, _, attr = PYPROJECT["project"]["scripts"]["specref"].partition(":")
    assert getattr(__import__(module, fromlist=[attr]), attr) is cli.main


def test_python_m_specref_is_the_command():
    version = python("-m", "specref", "--version")
    assert version.returncode == 0 and version.stdout == f"specref {specref.__version__}\n", version.stderr
    unknown = python("-m", "specref", "frobnicate")
    assert unknown.returncode == 2 and "usage: specref" in unknown.stderr and "'frobnicate'" in unknown.stderr


def test_pyproject_the_package_and_the_changelog_name_one_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    top = next(line for line in changelog.splitlines() if line.startswith("## "))
    assert PYPROJECT["project"]["version"] == specref.__version__ == "0.3.0"
    assert top == f"## {specref.__version__}"


@pytest.mark.parametrize("args, usage, message", [
    ([], "usage: specref ", "required: COMMAND"),
    (["frobnicate"], "usage: specref ", "invalid choice: 'frobnicate'"),
    (["--frobnicate", "selftest"], "usage: specref selftest", "unrecognized arguments: --frobnicate"),
    (["selftest", "--frobnicate"], "usage: specref selftest", "unrecognized arguments: --frobnicate"),
    (["check", "--impl", STEP, "--frobnicate"], "usage: specref check", "unrecognized arguments: --frobnicate"),
    (["check", "--level", "step"], "usage: specref check", "required: --impl"),
    (["check", "--impl", STEP, "--samples", "0"], "usage: specref check", "must be a positive integer, got '0'"),
    (["check", "--impl", STEP, "--mode", "approximate"], "usage: specref check", "invalid choice: 'approximate'"),
    (["plan", "--impl", STEP, "--calls", "x"], "usage: specref plan", "must be a positive integer, got 'x'"),
    (["sweep"], "usage: specref sweep", "required: FILE"),
    (["selftest", "--workers", "0"], "usage: specref selftest", "must be a positive integer, got '0'"),
    (["bench", "--frobnicate"], "usage: specref bench", "unrecognized arguments: --frobnicate"),
    (["bench", "--ks", "0"], "usage: specref bench", "argument --ks"),
])
def test_an_unknown_subcommand_or_flag_exits_2_with_the_usage(args, usage, message):
    code, out, err = run(*args)
    assert code == 2 and usage in err and message in err, (code, out, err)


def test_help_exits_0_and_lists_the_subcommands_and_the_levels():
    code, out, _ = run("--help")
    assert code == 0 and all(f"    {name}" in out for name in ("selftest", "check", "plan", "sweep", "bench"))
    code, out, _ = run("check", "--help")
    assert code == 0 and "levels (--level):" in out and "  step: step_fn(p_target [K+1, V]" in out


# ---------------------------------------------------------------- the public face


def test_the_public_names_are_the_library_s_own_objects():
    from specref.core.errors import SpecrefError
    from specref.verification import levels, oracle
    from specref.verification.campaigns import planning
    from specref.verification.cases import strategies
    from specref.verification.running import level, report

    want = {"check": oracle.check, "plan": planning.plan, "register": levels.register, "LEVELS": levels.LEVELS,
            "Level": level.Level, "Settings": report.Settings, "Report": report.Report, "SpecrefError": SpecrefError,
            "strategies": strategies, "__version__": "0.3.0"}
    assert sorted(specref.__all__) == sorted(want)
    assert all(getattr(specref, name) is value or getattr(specref, name) == value for name, value in want.items())
    assert set(specref.__all__) <= set(dir(specref))
    with pytest.raises(AttributeError, match="no attribute 'check_step'"):
        specref.check_step  # noqa: B018 - no per-level shorthands in the public face


def test_import_specref_and_the_command_s_parser_stay_light():
    """``import specref`` loads nothing of the package beyond its __init__, and ``specref -h`` not the oracle."""
    script = ("import sys; import specref; first = sorted(m for m in sys.modules if m.startswith(('specref', 'numpy')));"
              "from specref import cli; cli.parser().format_help();"
              "print(first, 'specref.verification' in sys.modules, 'numpy' in sys.modules)")
    run_ = python("-c", script)
    assert run_.returncode == 0 and run_.stdout.strip() == "['specref'] False False", run_.stdout + run_.stderr


# ---------------------------------------------------------------- each subcommand


def test_check_exit_statuses():
    code, out, err = run("check", "--impl", STEP, "--level", "step", "--no-isolate")
    assert code == 0 and "preserves the target distribution" in out, out + err
    code, out, err = run("check", "--impl", WRONG, "--level", "step", "--no-isolate")
    assert code == 1 and "counterexample" in out, out + err
    code, out, err = run("check", "--impl", "no_such_module:f", "--no-isolate")
    assert code == 2 and "cannot load" in err
    code, out, err = run("check", "--impl", STEP, "--level", "no_such_level", "--no-isolate")
    assert code == 2 and "'no_such_level'" in err and "'step'" in err and "'decoder'" in err, err  # lists the levels


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    """A module outside specref that registers a level of its own (the step level's parts, another name)
    when it is imported, and holds two implementations for it; unregistered afterwards."""
    (tmp_path / "third_party_cli.py").write_text(
        "from dataclasses import replace\n"
        "from specref import LEVELS, register\n"
        "from specref.core.step import speculative_step\n"
        "from tests.implementations import resample_from_p\n"
        "register(replace(LEVELS['step'], name='third_party_step'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "third_party_cli"
    specref.LEVELS.pop("third_party_step", None)
    sys.modules.pop("third_party_cli", None)


def test_check_and_plan_run_a_level_that_the_implementation_s_module_registers(third_party):
    assert "third_party_step" not in specref.LEVELS  # known only once the module is imported
    code, out, err = run("check", "--impl", f"{third_party}:speculative_step", "--level", "third_party_step",
                         "--no-isolate")
    assert code == 0 and "preserves the target distribution" in out, out + err
    code, out, err = run("check", "--impl", f"{third_party}:resample_from_p", "--level", "third_party_step",
                         "--no-isolate")
    assert code == 1 and "counterexample" in out, out + err
    code, out, err = run("plan", "--impl", f"{third_party}:speculative_step", "--level", "third_party_step",
                         "--mode", "exact", "--calls", "1", "--no-isolate")
    assert code == 0 and "total ETA" in out, out + err
    # --no-isolate ran each command in a supervised child (SPEC 13.3): the registration stayed there
    assert "third_party_step" not in specref.LEVELS
    __import__(third_party)  # once imported here, the help lists the level it registers
    assert "  third_party_step: step_fn(" in run("check", "--help")[1]


def test_selftest_passes_fails_and_records(tmp_path, monkeypatch):
    path = tmp_path / "selftest.json"
    code, out, err = run("selftest", "--quick", "--scenario", "edge p=q", "--no-progress", "--json", str(path))
    assert code == 0 and "PASS" in out, out + err
    record = json.loads(path.read_text())
    assert record["ok"] and record["command"].startswith("specref selftest --quick --scenario")
    assert run("selftest", "--scenario", "no such scenario")[0] == 2
    # the status logic can fail: the reference's law run as a control is MISSED
    ref = next(s for s in verify.matrix() if s.name.startswith("edge p=q"))
    monkeypatch.setattr(verify, "matrix", lambda: [verify.Scenario("ref as control", "control", ref.run, quick=True)])
    monkeypatch.setattr(verify, "controls", lambda: [])
    code, out, err = run("selftest", "--quick", "--no-progress")
    assert code == 1 and "0/1 negative controls detected" in out and out.rstrip().endswith("FAIL"), out + err


def test_selftest_and_python_m_specref_verify_run_the_same_function(monkeypatch):
    calls = []
    monkeypatch.setattr(verify, "selftest", lambda **kw: calls.append(kw) or 7)
    assert verify.main(["--quick", "--no-progress", "--scenario", "edge"]) == 7
    assert run("selftest", "--quick", "--no-progress", "--scenario", "edge")[0] == 7
    old, new = calls
    assert old.pop("command").startswith("python -m specref.verify") and new.pop("command").startswith("specref selftest")
    assert old == new and new["quick"] and new["scenario"] == "edge" and not new["progress"]


def test_plan_prints_the_table_and_flags_a_misbehaving_implementation():
    code, out, err = run("plan", "--impl", SEEDED, "--level", "step", "--samples", "100", "--calls", "1",
                         "--no-isolate")
    assert code == 0 and "total ETA" in out and "worked-example-rows" in out, out + err
    code, out, err = run("plan", "--impl", "tests.test_cli:raises", "--samples", "100", "--calls", "1", "--no-isolate")
    assert code == 3 and "raised" in out, out + err  # misbehaved on a timed call (SPEC §13.3)
    assert run("plan", "--impl", SEEDED, "--level", "no_such_level", "--no-isolate")[0] == 2


def test_sweep_runs_a_file_and_a_bad_file_is_a_usage_error(tmp_path):
    def sweep_file(impl):
        path = tmp_path / f"{impl.rpartition(':')[2]}.json"
        path.write_text(json.dumps({"impl": impl, "level": "step", "settings": {"isolate": False},
                                    "grid": {"case": ["worked-example-rows"]}}))
        return str(path)

    code, out, err = run("sweep", sweep_file(STEP), "--no-progress", "--out", str(tmp_path / "record.json"))
    assert code == 0 and (tmp_path / "record.json").exists(), out + err
    code, out, err = run("sweep", sweep_file(WRONG), "--no-progress")
    assert code == 1, out + err
    code, _, err = run("sweep", str(tmp_path / "missing.toml"))
    assert code == 2 and "does not exist" in err


def test_bench_forwards_its_flags_to_specref_bench(monkeypatch):
    seen = []
    monkeypatch.setattr(bench, "_main", lambda args, argv, prog: seen.append((args, argv, prog)) or 0)
    assert run("bench", "--target", "small", "--ks", "1,4", "--quick")[0] == 0
    (args, argv, prog), = seen
    assert (args.target, args.quick, prog) == ("small", True, "specref bench") and argv == ["--target", "small", "--ks",
                                                                                           "1,4", "--quick"]
    code, out, _ = run("bench", "--help")
    assert code == 0 and out.startswith("usage: specref bench")
