"""The documentation people read: the README is a front door, and the Sphinx site builds.

- The site under ``docs/`` builds with warnings as errors and its doctests pass (each in a
  subprocess, into ``tmp_path``); a copy of it with a broken reference, or with a failing
  doctest, fails -- so the check can fail.
- The README stays short (at most 200 lines), keeps the two set-up commands at the very top,
  has one row per registered level with the level's call as the registry states it, and every
  number in its results table is read from the committed JSON record its row names.
- The results pages hold exactly the tables the committed records print.
- ``docs/testing.md`` maps every source module to the test modules that import it, as the
  tree has it, and the README's sentence about the tests stays true.
- ``docs/layout.md`` lists every module; no page points at a 0.2 path that moved.

``python tests/test_docs.py --write`` brings ``docs/testing.md``'s generated parts up to date
with the tree (``python tests/test_docs.py`` prints the map).
"""

from __future__ import annotations

import ast
import io
import json
import re
import runpy
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
OUT = ROOT / "benchmarks" / "out"
SETUP = "pip install -e . && python -m specref.verify\npip install -e '.[test,hf,engines]' && python -m pytest"


def sphinx(builder: str, src: Path, out: Path, doctrees: Path, *, strict: bool = True):
    """One ``python -m sphinx`` run in a subprocess: (return code, output)."""
    args = [sys.executable, "-m", "sphinx", "-b", builder, "-d", str(doctrees), "-q", str(src), str(out)]
    if strict:
        args.insert(3, "-W")
    run = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    return run.returncode, run.stdout + run.stderr


# --- the site builds, and its doctests pass --------------------------------------------


def test_the_site_builds_with_warnings_as_errors_and_its_doctests_pass(tmp_path):
    doctrees = tmp_path / "doctrees"
    rc, out = sphinx("html", DOCS, tmp_path / "html", doctrees)
    assert rc == 0, out
    pages = {p.relative_to(tmp_path / "html").as_posix() for p in (tmp_path / "html").rglob("*.html")}
    for page in ("index.html", "spec.html", "guide/oracle.html", "results/records.html", "layout.html",
                 "testing.html", "api/generated/specref.verification.oracle.html"):
        assert page in pages, sorted(pages)
    oracle = (tmp_path / "html" / "api" / "generated" / "specref.verification.oracle.html").read_text()
    assert "check_step" in oracle  # autodoc ran: the docstrings are on the page
    # the doctest builder reuses the environment the html build pickled: no second read
    rc, out = sphinx("doctest", DOCS, tmp_path / "doctest", doctrees, strict=False)
    assert rc == 0, out
    summary = (tmp_path / "doctest" / "output.txt").read_text()
    tests = int(re.search(r"^\s*(\d+) tests", summary, flags=re.MULTILINE).group(1))
    assert tests >= 10 and re.search(r"^\s*0 failures in tests", summary, flags=re.MULTILINE), summary


def _copy_of_the_site(tmp_path: Path) -> Path:
    """The guides, results and reference pages, with a stub in place of the generated API
    reference (the expensive part), beside links to the records and figures they show."""
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("_build", "generated"))
    (tmp_path / "docs" / "api" / "index.md").write_text("# API reference\n")
    for name in ("benchmarks", "figures"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path / "docs"


def test_a_broken_reference_fails_the_build(tmp_path):
    docs = _copy_of_the_site(tmp_path)
    page = docs / "guide" / "oracle.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md) and "
                    "{py:func}`specref.verification.oracle.no_such_check`.\n")
    rc, out = sphinx("html", docs, tmp_path / "html", tmp_path / "doctrees")
    assert rc != 0
    assert "no-such-page" in out and "no_such_check" in out, out


def test_a_failing_doctest_fails_the_doctest_build(tmp_path):
    docs = _copy_of_the_site(tmp_path)
    page = docs / "guide" / "algorithm.md"
    page.write_text(page.read_text() + "\n```{doctest}\n>>> 1 + 1\n3\n```\n")
    rc, out = sphinx("doctest", docs, tmp_path / "doctest", tmp_path / "doctrees", strict=False)
    assert rc != 0
    assert "1 failure" in (tmp_path / "doctest" / "output.txt").read_text()


def _broken_rest(doc: str) -> bool:
    """Whether a docstring, parsed as reST (Sphinx's roles as plain literals), has errors."""
    from docutils.core import publish_doctree
    from docutils.nodes import literal, system_message
    from docutils.parsers.rst import roles

    for role in set(re.findall(r":([\w:.+-]+):`", doc)):
        roles.register_generic_role(role, literal)
    tree = publish_doctree(doc, settings_overrides={"report_level": 5, "halt_level": 5,
                                                     "warning_stream": io.StringIO()})
    return any(m["level"] >= 2 for m in tree.findall(system_message))


def test_no_docstring_is_shown_as_plain_text():
    """conf.py may show a docstring as written when parsed as reST it would break the build;
    none needs it now, and each of the six that did is valid reST (the -W build parses all)."""
    import importlib
    import inspect

    assert runpy.run_path(str(DOCS / "conf.py"))["PLAIN_TEXT_DOCSTRINGS"] == set()
    for name in ("specref.adapters.hf.hf_speculative_step", "specref.core.step.speculative_step",
                 "specref.decoding.chain", "specref.decoding.tree", "specref.verification.zoo.chain",
                 "toy_models.train"):
        module, _, attr = name.rpartition(".")
        try:
            obj = importlib.import_module(name)
        except ImportError:
            obj = getattr(importlib.import_module(module), attr)
        assert not _broken_rest(inspect.cleandoc(obj.__doc__ or "")), name
    assert _broken_rest("A list\n- right after a line\n  with a hanging indent\n\n    and more")  # can fail


def test_the_docstring_examples_pass_in_their_modules():
    """The examples in docstrings run as Python's doctest runs them: in their module."""
    import doctest
    import importlib

    modules = [m for m in source_modules() if ">>> " in (ROOT / (m.replace(".", "/") + ".py")).read_text()]
    assert modules
    for name in modules:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # hypothesis's .example() outside a test, as the examples show it
            result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, name


# --- the README is a front door -------------------------------------------------------


def test_the_readme_is_a_front_door_with_the_set_up_commands_at_the_top():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    first = re.search(r"```bash\n(.*?)\n```", text, flags=re.DOTALL)
    assert first.group(1) == SETUP and text.index(first.group(0)) < 20
    ci = (ROOT / ".ci" / "run").read_text()
    assert SETUP.splitlines()[1] in ci  # .ci/run runs the second command verbatim


def levels_table(text: str) -> dict[str, tuple[str, list[str]]]:
    """The README's table of levels: name -> (call, guide links), ``\\|`` read as ``|``."""
    table = _between(text, "levels-table")
    rows = [r for r in table.splitlines() if r.startswith("| `")]
    found: dict[str, tuple[str, list[str]]] = {}
    for row in rows:
        name, call, guide = re.fullmatch(r"\| `(\w+)` \| `(.*)` \| (.*) \|", row).groups()
        assert name not in found, f"level {name} has two rows"
        found[name] = (call.replace("\\|", "|"), _links(guide))
    return found


def test_the_readme_has_one_row_per_level_with_its_call():
    from specref import LEVELS

    rows = levels_table(README.read_text())
    assert sorted(rows) == sorted(LEVELS), (f"levels without a row: {sorted(set(LEVELS) - set(rows))}; "
                                            f"rows without a level: {sorted(set(rows) - set(LEVELS))}")
    wrong = [name for name, (call, _) in rows.items() if call != LEVELS[name].signature]
    assert not wrong, f"rows whose call is not the level's signature: {wrong}"
    assert all(guides and all(g.startswith("docs/guide/") for g in guides) for _, guides in rows.values())


def test_the_levels_table_check_can_fail():
    from specref import LEVELS

    text = README.read_text()
    name = next(iter(LEVELS))
    row = next(r for r in _between(text, "levels-table").splitlines() if r.startswith(f"| `{name}` |"))
    assert name not in levels_table(text.replace(row + "\n", ""))  # a level without a row is seen
    changed = levels_table(text.replace(row, row.replace(" -> ", " => ", 1)))
    assert changed[name][0] != LEVELS[name].signature  # a call that is not the signature is seen


def _links(markdown: str):
    return re.findall(r"\]\(([^)\s]+)\)", markdown)


def _slug(heading: str) -> str:
    """GitHub's (and myst's) anchor of a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", path.read_text(), flags=re.MULTILINE)}


def test_the_readme_links_resolve():
    bad = []
    for link in _links(README.read_text()):
        if re.match(r"\w+://", link):
            continue
        target, _, anchor = link.partition("#")
        path = ROOT / target if target else README  # "#anchor": a heading of the README itself
        if not path.exists():
            bad.append(link)
        elif anchor and anchor not in _anchors(path):
            bad.append(link)
    assert not bad, bad


def _numbers(value, found: list[float]):
    """Every number of a JSON record: its values, the lengths of its lists, and the numbers
    written inside its strings and keys ("pool-2", a command's "--samples 2000")."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        found.append(float(value))
    elif isinstance(value, str):
        found.extend(float(t) for t in re.findall(r"\d+(?:\.\d+)?", value))
    elif isinstance(value, dict):
        for k, v in value.items():
            _numbers(k, found)
            _numbers(v, found)
    elif isinstance(value, list):
        found.append(float(len(value)))
        for v in value:
            _numbers(v, found)


def unsourced_numbers(row_text: str, records: list[Path]) -> list[str]:
    """Numbers in ``row_text`` that no value of ``records`` rounds to (nor a list length)."""
    values: list[float] = []
    for record in records:
        _numbers(json.loads(record.read_text()), values)
    missing = []
    for token in re.findall(r"(?<![\w.])\d[\d,]*(?:\.\d+)?", row_text):
        number = token.replace(",", "")
        decimals = len(number.partition(".")[2])
        if not any(f"{v:.{decimals}f}" == number for v in values):
            missing.append(token)
    return missing


def _results_rows():
    text = README.read_text()
    table = text[text.index("## Results"):]
    table = table[:table.index("\n### ")] if "\n### " in table else table  # the sections below hold generated tables
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith("| what ")]
    assert len(rows) >= 6
    for row in rows:
        what, result, record, details = [c.strip() for c in row.strip("|").split(" | ")]
        records = [ROOT / link for link in _links(record)]
        yield what, result, records


def test_every_number_in_the_readme_results_comes_from_its_record():
    for what, result, records in _results_rows():
        assert records and all(r.parent == OUT and r.exists() for r in records), what
        assert not unsourced_numbers(what + " " + result, records), (what, unsourced_numbers(what + " " + result, records))


def test_the_number_check_can_fail():
    assert unsourced_numbers("1.98x from 1 to 2 workers", [OUT / "distributed.json"]) == []
    assert unsourced_numbers("1.99x from 1 to 2 workers", [OUT / "distributed.json"]) == ["1.99"]


# --- the results pages hold what the records say ----------------------------------------


def test_the_performance_page_holds_the_committed_benchmark_tables():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_tables import REPEATS, RUNS, reproduction, tables

    page = (DOCS / "results" / "performance.md").read_text()
    for run in RUNS:
        assert tables(json.loads((OUT / run).read_text())) in page, f"run: python benchmarks/bench_tables.py {run}"
    assert reproduction([json.loads((OUT / r).read_text()) for r in REPEATS],
                        json.loads((OUT / RUNS[0]).read_text())) in page
    changed = json.loads((OUT / RUNS[0]).read_text())
    changed["cells"][0]["best_speedup"] += 0.01
    assert tables(changed) not in page


def test_the_hugging_face_page_holds_the_committed_planned_table():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from hf_generate import planned_table

    record = json.loads((OUT / "hf_generate_planned.json").read_text())
    page = (DOCS / "guide" / "huggingface.md").read_text()
    assert planned_table(record) in page, "run: python benchmarks/hf_generate.py --table benchmarks/out/hf_generate_planned.json"


def guard_cost_numbers(record: dict) -> list[str]:
    """The numbers the performance page's guard-cost table shows, formatted from ``guard_cost.json``."""
    v = record["verify"]
    out = [f"{v[w]['median']:.2f} s ({v[w]['min']:.2f}-{v[w]['max']:.2f})" for w in ("before", "after")]
    r = v["paired_ratio"]
    out.append(f"{r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f}), paired")
    quiet = [s for s in record["suites"] if s["burners"] == 0]
    out += [f"{s['seconds']:.0f} s, {int(s['summary'].split()[0]):,} passed" for s in quiet]
    out.append(f"{quiet[1]['seconds'] / quiet[0]['seconds']:.3f}")
    loaded = [s for s in record["suites"] if s["burners"] > 0]
    out += [f"{s['seconds']:.0f} s, {int(s['summary'].split()[0]):,} passed, 0 failed" for s in loaded
            if s["exit"] == 0]
    return out


def test_the_performance_page_shows_the_guard_cost_record():
    record = json.loads((OUT / "guard_cost.json").read_text())
    page = (DOCS / "results" / "performance.md").read_text()
    numbers = guard_cost_numbers(record)
    assert len(numbers) == 7 and all(n in page for n in numbers), [n for n in numbers if n not in page]
    record["verify"]["after"]["median"] += 0.01
    assert not all(n in page for n in guard_cost_numbers(record))


def test_the_records_page_names_every_committed_record():
    page = (DOCS / "results" / "records.md").read_text()
    missing = [p.name for p in sorted(OUT.glob("*.json")) if f"benchmarks/out/{p.name}>" not in page]
    assert not missing, missing


# --- layout and the map of tests ---------------------------------------------------------


def source_modules() -> list[str]:
    """Every module of specref and toy_models but the packages' ``__init__`` and ``__main__``."""
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for pkg in ("specref", "toy_models")
                  for p in (ROOT / pkg).rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def _imports(path: Path, known: set[str], moved: dict[str, str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports by name -- an import statement, or
    ``pytest.importorskip`` / ``importlib.import_module`` of a literal name (a 0.2 path
    counts as its new one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("importorskip", "import_module") and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                found.add(full if moved.get(full, full) in known else node.module)
    return {moved.get(m, m) for m in found} & known


def map_of_tests() -> dict[str, list[str]]:
    """Source module -> the test modules that import it."""
    moved = runpy.run_path(str(ROOT / "specref" / "verification" / "_moved.py"))["MOVED"]
    modules = source_modules()
    known = set(modules)
    found: dict[str, list[str]] = {m: [] for m in modules}
    for test in sorted((ROOT / "tests").glob("test_*.py")):
        for module in _imports(test, known, moved):
            found[module].append(test.name)
    return found


def render_map_of_tests() -> str:
    rows = ["| source module | named after it | other test modules that import it |", "|---|---|---|"]
    for module, tests in map_of_tests().items():
        named = f"test_{module.rpartition('.')[2]}.py"
        own = [t for t in tests if t == named]
        rest = [t for t in tests if t != named]
        rows.append(f"| `{module}` | {', '.join(f'`{t}`' for t in own) or '-'} | "
                    f"{', '.join(f'`{t}`' for t in rest) or ('-' if own else '**none**')} |")
    return "\n".join(rows)


def _between(text: str, marker: str) -> str:
    return text.split(f"<!-- {marker} -->\n", 1)[1].split(f"\n<!-- /{marker} -->", 1)[0]


COUNTS = re.compile(r"Of the (\d+) source modules, (\d+) have a test module named after them, and (\d+) are\s+"
                    r"imported by no test module")


def parts_of_the_testing_page() -> dict[str, str]:
    """What docs/testing.md must say, by marker, as the tree is now."""
    found = map_of_tests()
    named = [m for m, tests in found.items() if f"test_{m.rpartition('.')[2]}.py" in tests]
    untested = [m for m, tests in found.items() if not tests]
    tests = sorted((ROOT / "tests").glob("test_*.py"))
    cross = [f"- `{test.name}` imports `{module}`" for test in tests
             for module in sorted(_imports(test, {f"tests.{t.stem}" for t in tests}, {}))]
    return {"counts": f"Of the {len(found)} source modules, {len(named)} have a test module named after them, "
                      f"and {len(untested)} are\nimported by no test module.",
            "untested": "\n".join(f"- `{m}`" for m in untested) or "- none",
            "cross": "\n".join(cross) or "- none",
            "test-map": render_map_of_tests()}


def write_testing_page() -> None:
    page = DOCS / "testing.md"
    text = page.read_text()
    for marker, part in parts_of_the_testing_page().items():
        text = text.replace(_between(text, marker), part, 1)
    page.write_text(text)


def test_the_map_of_tests_is_the_tree():
    page = (DOCS / "testing.md").read_text()
    stale = [marker for marker, part in parts_of_the_testing_page().items() if _between(page, marker) != part]
    assert not stale, f"docs/testing.md is out of date ({stale}): run python tests/test_docs.py --write"


def test_the_readme_says_what_is_true_of_the_tests():
    text = README.read_text()
    assert "one test module per source module;" not in text
    section = text[text.index("## Tests"):text.index("## Results")]
    assert "docs/testing.md" in section and "tests/test_docs.py" in section
    found = map_of_tests()
    assert any(f"test_{m.rpartition('.')[2]}.py" in t for m, t in found.items())  # "some ... named after them"
    assert any(not t for t in found.values())  # "a few are imported by no test module"
    for name in re.findall(r"`(test_\w+\.py)`", section):  # "modules named after what they do"
        assert (ROOT / "tests" / name).exists() and not any(f"test_{m.rpartition('.')[2]}.py" == name for m in found)


def test_the_layout_page_lists_every_module_and_every_moved_path():
    page = (DOCS / "layout.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+\.py)` \|", page, flags=re.MULTILINE))
    files = {m.replace(".", "/") + ".py" for m in source_modules()}
    assert files <= listed, sorted(files - listed)
    assert all((ROOT / f).exists() for f in listed), sorted(f for f in listed if not (ROOT / f).exists())
    moved = runpy.run_path(str(ROOT / "specref" / "verification" / "_moved.py"))["MOVED"]
    rows = dict(re.findall(r"^\| `([\w.]+)` \| \{py:mod\}`([\w.]+)` \|", page, flags=re.MULTILINE))
    assert rows == moved


def test_no_page_points_at_a_moved_path():
    moved = runpy.run_path(str(ROOT / "specref" / "verification" / "_moved.py"))["MOVED"]
    pages = [README, *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts and p.name != "layout.md")]
    bad = []
    for page in pages:
        text = page.read_text()
        for old in moved:
            use = rf"{re.escape(old)}(?:\.\w|:\w|\s+import\b)|{re.escape(old.replace('.', '/'))}\.py"
            bad += [f"{page.relative_to(ROOT)}: {m.group(0)}" for m in re.finditer(use, text)]
    assert not bad, bad


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_testing_page()  # docs/testing.md's generated parts, from the tree as it is now
    else:
        print(render_map_of_tests())
