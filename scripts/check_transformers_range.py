"""The HF-like models under the lowest and the newest transformers the ``hf`` extra allows.

``python scripts/check_transformers_range.py`` (``--json PATH``, default
``benchmarks/out/transformers_range.json``; ``--versions 4.40.0 5.24.0`` to pick others;
``--keep`` keeps the environments) does, for transformers 4.40.0 (the extra's lower bound)
and the newest release below 5.25 that pip's configured index offers (pip resolves
``transformers<5.25``):

1. a throwaway virtual environment in a temporary directory, ``--system-site-packages`` and
   ``--without-pip``: the installed torch is reused, never another one, and the system's pip
   runs in it as ``python -m pip``;
2. ``pip install --no-deps transformers==X``; then each requirement of that transformers, and
   of what this step installs, that the environment does not meet (``tokenizers``,
   ``huggingface-hub``, ...) is resolved by pip (``--dry-run --report``) and installed pinned
   with ``--no-deps``; a requirement on torch stops the run;
3. in it, from this checkout: ``pytest tests/test_hf_models.py``, ``pytest
   tests/test_hf_generate.py`` (counts from pytest's junit XML) and this script's
   ``--standalone`` check (:func:`standalone`): ``HFTableModel.generate()`` greedy with and
   without an assistant against the table's argmax chain, sampled and assisted (seeded,
   reproducible, draft blocks scored in one call), and a hand-written decode loop over
   ``TableModule`` and ``HFTableModel`` that sizes its tensors by ``model.config.vocab_size``
   and passes back the cache the model returned (cropped after a rejection), whose every
   target row must equal the specref model's row over the whole context.

Every process runs with ``OMP_NUM_THREADS=1`` (torch on one thread).  The record holds, per
version: pip's resolved versions (what was installed, and the versions the environment then
imports), and per run the command, passed/failed/errors/skipped counts, seconds and the
failures' names.  Exit status 0 when every run passed under every version, 1 otherwise.
The environments are deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOWEST = "4.40.0"  # the hf extra's lower bound (pyproject.toml)
BELOW = "5.25"  # the hf extra's upper bound, exclusive
TEST_FILES = ("tests/test_hf_models.py", "tests/test_hf_generate.py")
REPORTED = ("transformers", "tokenizers", "huggingface-hub", "safetensors", "torch", "numpy")


# ---------------------------------------------------------------- environments and pip


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT),
               TOKENIZERS_PARALLELISM="false", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONHOME", None)
    return env


def _run(cmd, *, check=True):
    done = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=_env(), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stdout[-3000:]}"
                           f"\n{done.stderr[-3000:]}")
    return done


def _resolve(python, specs):
    """pip's choice for each requirement string in ``specs``: ``{name: version}`` (nothing installed)."""
    report = _run([python, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
                   "--report", "-", *specs]).stdout
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report)["install"]}


_UNMET = r"""
import json, sys
from importlib import metadata
from packaging.requirements import Requirement
unmet = []
for dist in sys.argv[1:]:
    for text in metadata.requires(dist) or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement, or another platform's
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            unmet.append([req.name, str(req.specifier), have])
print(json.dumps(unmet))
"""


def _unmet(python, dists):
    """The requirements of ``dists`` that ``python``'s environment does not meet: ``[name, specifier, have]``."""
    return json.loads(_run([python, "-c", _UNMET, *dists]).stdout)


def _install(python, version):
    """transformers ``version`` and the missing requirements, all pinned and ``--no-deps``; what was installed."""
    installed = _resolve(python, [f"transformers=={version}"])
    _run([python, "-m", "pip", "install", "--no-deps", "--quiet", *[f"{n}=={v}" for n, v in installed.items()]])
    todo = list(installed)
    for _ in range(6):  # each round installs the requirements the last round's packages do not find
        unmet = _unmet(python, todo)
        if not unmet:
            return installed
        if any(name.lower() == "torch" for name, _, _ in unmet):
            raise RuntimeError(f"transformers {version} needs another torch: {unmet} (never installed here)")
        chosen = _resolve(python, [f"{name}{spec}" for name, spec, _ in unmet])
        _run([python, "-m", "pip", "install", "--no-deps", "--quiet", *[f"{n}=={v}" for n, v in chosen.items()]])
        installed.update(chosen)
        todo = list(chosen)
    raise RuntimeError(f"requirements still unmet after six rounds: {unmet}")


_VERSIONS = r"""
import json, sys
from importlib import metadata
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def newest_allowed(python=sys.executable):
    """The newest transformers below 5.25 that pip's configured index offers."""
    return _resolve(python, [f"transformers<{BELOW}"])["transformers"]


# ---------------------------------------------------------------- the runs


def _pytest(python, test_file, tmp):
    xml = Path(tmp) / (Path(test_file).stem + ".xml")
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file, f"--junitxml={xml}"]
    start = time.perf_counter()
    done = _run(cmd, check=False)
    seconds = time.perf_counter() - start
    counts = dict(passed=0, failed=0, errors=0, skipped=0)
    failures = []
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), None)
            counts[{"failure": "failed", "error": "errors", "skipped": "skipped", None: "passed"}[kind]] += 1
            if kind in ("failure", "error"):
                failures.append(case.get("name"))
    ok = done.returncode == 0 and counts["failed"] == counts["errors"] == 0 and counts["passed"] > 0
    return dict(what=f"python -m pytest -q -p no:cacheprovider {test_file}", ok=ok, rc=done.returncode,
                **counts, seconds=round(seconds, 2), failures=failures,
                tail=None if ok else (done.stdout + done.stderr)[-2000:])


def _standalone(python):
    start = time.perf_counter()
    done = _run([python, str(Path(__file__).resolve()), "--standalone"], check=False)
    seconds = time.perf_counter() - start
    try:
        checks = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        checks = []
    passed = sum(c["ok"] for c in checks)
    ok = done.returncode == 0 and bool(checks) and passed == len(checks)
    return dict(what="python scripts/check_transformers_range.py --standalone", ok=ok, rc=done.returncode,
                passed=passed, failed=len(checks) - passed, errors=0 if checks else 1, skipped=0,
                seconds=round(seconds, 2), failures=[c["name"] for c in checks if not c["ok"]], checks=checks,
                tail=None if ok else (done.stdout + done.stderr)[-2000:])


def check_version(version, *, keep=False):
    """One transformers version in its own environment: the record's entry for it."""
    tmp = tempfile.mkdtemp(prefix=f"specref-transformers-{version}-")
    python = Path(tmp) / "venv" / "bin" / "python"
    start = time.perf_counter()
    entry = dict(transformers=version, environment="venv --system-site-packages --without-pip")
    try:
        _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", Path(tmp) / "venv"])
        entry["installed"] = _install(python, version)
        entry["imported"] = json.loads(_run([python, "-c", _VERSIONS, *REPORTED]).stdout)
        entry["setup_seconds"] = round(time.perf_counter() - start, 2)
        entry["runs"] = [_pytest(python, f, tmp) for f in TEST_FILES] + [_standalone(python)]
    except RuntimeError as e:  # the environment could not be built: a failed entry, not a crash
        entry["runs"], entry["setup_error"] = [], str(e)[-3000:]
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    entry["ok"] = bool(entry["runs"]) and all(r["ok"] for r in entry["runs"])
    entry["seconds"] = round(time.perf_counter() - start, 2)
    return entry


# ---------------------------------------------------------------- the standalone check (inside an environment)


def _crop(cache, drop):
    """``cache`` without its last ``drop >= 1`` tokens: ``Cache.crop(-drop)`` where transformers has it
    (4.42 on); a 4.40 ``DynamicCache`` has none and iterates as ``(keys, values)`` layers: sliced into a new one."""
    if hasattr(cache, "crop"):
        cache.crop(-drop)
        return cache
    keep = cache.get_seq_length() - drop
    return type(cache).from_legacy_cache(tuple((k[:, :, :keep], v[:, :, :keep]) for k, v in cache))


def _returned_cache(out):
    """The cache a forward call returned, under whichever name this transformers' output uses."""
    for name in ("past_key_values", "cache"):
        value = out.get(name) if hasattr(out, "get") else getattr(out, name, None)
        if value is not None:
            return value
    return None


def greedy_loop(target, draft, prompt, *, gamma, max_new_tokens, on_rows=None):
    """Greedy speculative decoding as written against HF-style models: ``V`` from ``config.vocab_size``,
    the target's cache as its first call returns it, passed back, cropped after a rejection.
    ``on_rows(context, rows [gamma + 1, V])`` sees every target call's last rows.  Returns
    ``(the new tokens, the number of rejections, each followed by a crop)``."""
    import torch

    V = target.config.vocab_size
    seq, past, rejections = list(prompt), None, 0
    while len(seq) - len(prompt) < max_new_tokens:
        drafted = []
        for _ in range(gamma):  # 1. draft (no cache)
            logits = draft(torch.tensor([seq + drafted]), use_cache=False).logits[0, -1]  # [V]
            drafted.append(int(torch.argmax(logits[:V])))
        seen = 0 if past is None else past.get_seq_length()
        out = target(torch.tensor([seq[seen:] + drafted]), past_key_values=past)  # 2. one target call
        past = _returned_cache(out)
        rows = out.logits[0, -(gamma + 1):]  # [gamma + 1, V]
        if on_rows is not None:
            on_rows(seq + drafted, rows)
        best = [int(i) for i in torch.argmax(rows, dim=-1)]
        n = 0  # 3. accept while the draft is the target's argmax
        while n < gamma and drafted[n] == best[n]:
            n += 1
        if n < gamma:
            past, rejections = _crop(past, gamma - n), rejections + 1  # drop the rejected draft tokens
        seq += drafted[:n] + [best[n]]  # 4. the correction or the bonus token
    return seq[len(prompt):len(prompt) + max_new_tokens], rejections


def _argmax_chain(model, prompt, n):
    """The target's greedy chain from the specref model itself (its own rows, no torch, no cache):
    argmax of the last row of ``model.probs`` (a probability table) or ``model(...)`` (a logit table)."""
    import numpy as np

    rows = getattr(model, "probs", model)
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(np.asarray(rows(seq)[-1], dtype=float))))
    return seq[len(prompt):]


def _check_generate(cases):
    """``HFTableModel.generate()``: greedy plain and assisted on the table's argmax chain; sampled assisted."""
    import torch

    from specref.adapters.hf_models import case_hf_models, hf_model
    from specref.core.sampling import SamplingConfig

    checks = []
    case = cases["greedy-logits"]
    target, draft = case_hf_models(case)
    chain = _argmax_chain(case.models()[0], case.prompt, 4)
    plain = target.generate(torch.tensor([list(case.prompt)]), max_new_tokens=4)[0, 1:].tolist()
    checks.append(dict(name="generate greedy, no assistant", ok=plain == chain, got=plain, expected=chain))
    target.calls.clear()
    assisted = target.generate(torch.tensor([list(case.prompt)]), assistant_model=draft,
                               max_new_tokens=4)[0, 1:].tolist()
    block = max(n for _, n in target.calls)
    checks.append(dict(name="generate greedy, assistant", ok=assisted == chain and block >= 2, got=assisted,
                       expected=chain, largest_block=block))
    table = cases["p-equals-q"].models()[0]
    t, d = (hf_model(table, config=SamplingConfig(), max_new_tokens=6, k=2) for _ in range(2))
    runs = []
    for _ in range(2):
        t.calls.clear()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(7)
            runs.append(t.generate(torch.tensor([[0]]), assistant_model=d)[0, 1:].tolist())
    block = max(n for _, n in t.calls)
    ok = runs[0] == runs[1] and len(runs[0]) == 6 and set(runs[0]) <= set(range(3)) and block >= 2
    checks.append(dict(name="generate sampled, assistant = target (seeded twice)", ok=ok, got=runs,
                       largest_block=block, target_calls=len(t.calls)))
    return checks


def _check_loop(case):
    """The hand-written loop over both classes: the greedy chain, every row equal to the exact one (float32
    logits: within 1e-6), fewer tokens fed than the contexts hold (the cache used), at least one crop."""
    import numpy as np
    import torch

    from specref.adapters.hf_models import case_hf_models, case_torch_models

    model = case.models()[0]
    chain = _argmax_chain(model, case.prompt, 4)
    checks = []
    for name, build in (("TableModule", case_torch_models), ("HFTableModel", case_hf_models)):
        target, draft = build(case)
        worst = []

        def compare(context, rows):
            exact = np.asarray(model.probs(context)[-rows.shape[0]:], dtype=float)  # [gamma + 1, V]
            worst.append(float(np.abs(torch.softmax(rows.double(), -1).numpy() - exact).max()))

        got, rejections = greedy_loop(target, draft, case.prompt, gamma=case.k, max_new_tokens=4, on_rows=compare)
        fed = sum(n for _, n in target.calls)
        held = sum(len(c) for c, _ in target.calls)
        ok = got == chain and max(worst) < 1e-6 and fed < held and rejections >= 1  # the crop path ran
        checks.append(dict(name=f"hand-written loop, {name}", ok=ok, got=got, expected=chain, rejections=rejections,
                           largest_row_error=max(worst), tokens_fed=fed, context_tokens=held))
    return checks


def standalone():
    """The checks run inside one environment; one JSON line: ``[{name, ok, ...}]``."""
    import torch

    import specref
    from specref.verification.cases.chain import default_cases, extra_cases

    torch.set_num_threads(1)
    cases = {c.name: c for c in [*default_cases("decoder"), *extra_cases("decoder")]}
    checks = []
    for part in (lambda: _check_generate(cases), lambda: _check_loop(cases["position-aware"])):
        try:
            checks += part()
        except Exception as e:  # a crash is a failed check with its message
            checks.append(dict(name=f"raised: {type(e).__name__}", ok=False, detail=str(e)[-1500:]))
    import transformers

    where = Path(specref.__file__).resolve().parents[1]
    checks.append(dict(name="specref from this checkout", ok=where == ROOT, transformers=transformers.__version__,
                       **({} if where == ROOT else {"imported_from": str(where)})))
    print(json.dumps(checks))
    return 0 if all(c["ok"] for c in checks) else 1


# ---------------------------------------------------------------- main


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "out" / "transformers_range.json")
    parser.add_argument("--versions", nargs="+", help=f"default: {LOWEST} and the newest below {BELOW}")
    parser.add_argument("--keep", action="store_true", help="keep the temporary environments")
    parser.add_argument("--standalone", action="store_true", help="run the standalone check here and exit")
    args = parser.parse_args(argv)
    if args.standalone:
        return standalone()
    versions = args.versions or [LOWEST, newest_allowed()]
    start = time.perf_counter()
    entries = []
    for version in versions:
        entries.append(check_version(version, keep=args.keep))
        e = entries[-1]
        print(f"transformers {version}: {'ok' if e['ok'] else 'FAILED'} in {e['seconds']} s; " + "; ".join(
            f"{r['what'].split()[-1]} {r['passed']} passed {r['failed']} failed {r['errors']} errors"
            for r in e["runs"]) + (f"; setup: {e['setup_error'][:300]}" if "setup_error" in e else ""))
    record = dict(command="python scripts/check_transformers_range.py", bounds=f">={LOWEST},<{BELOW}",
                  python=platform.python_version(), machine=platform.machine(), threads="OMP_NUM_THREADS=1",
                  date=time.strftime("%Y-%m-%d"), ok=all(e["ok"] for e in entries), versions=entries,
                  seconds=round(time.perf_counter() - start, 2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.json}; {'all passed' if record['ok'] else 'something FAILED'}")
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
