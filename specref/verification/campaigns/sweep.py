"""Sweeps: one implementation checked over a grid of cases and settings, with one JSON
record and one table as the result, resumable after an interruption.

A sweep file (JSON or TOML) names the implementation, the level and the grid::

    impl = "specref.verification.zoo.chain:reference"   # module:function
    level = "step"
    [settings]                                      # Settings fields shared by every cell
    mode = "statistical"
    samples = 20000
    [grid]                                          # every combination is one cell
    case = ["worked-example-rows", "p-equals-q"]    # names from default_cases(level); ["*"]: all
    seed = [0, 1]                                   # any Settings field may vary

The record (``out``) is rewritten after every finished shard and cell, so an
interrupted sweep resumes from it: finished cells are not run again, and a
statistical cell keeps its finished shards (:func:`specref.verification.statistics.shards.tally`).

A sweep runs an implementation nobody has vetted yet, so its cells are isolated by default
(``Settings.isolate``: each case in a forked worker with a hard deadline): one that exits,
crashes or hangs is a status of its cell, not the end of the sweep.  ``isolate=False``, or
``isolate = false`` in the file's settings, runs the cells in this process.  The
implementation's module is imported first in a forked worker
(:func:`~specref.verification.running.calling.load_implementation`).
"""

from __future__ import annotations

import itertools
import json
import os
import tomllib
from dataclasses import fields
from pathlib import Path

from specref.core.errors import SpecrefError
from specref.verification.levels import LEVELS
from specref.verification.oracle import check
from specref.verification.running.calling import load_implementation
from specref.verification.running.report import TIMEOUT, Settings

__all__ = ["load_sweep", "run_sweep", "cells", "sweep_table"]

_SETTING_NAMES = {f.name for f in fields(Settings)} - {"executor", "shard_store", "progress"}


def load_sweep(path) -> dict:
    """Read and validate a sweep file (``.json`` or ``.toml``)."""
    path = Path(path)
    if not path.is_file():
        raise SpecrefError(f"sweep file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        spec = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise SpecrefError(f"sweep file {str(path)!r} is not valid {path.suffix[1:] or 'JSON'}: {e}") from None
    return validate(spec)


def validate(spec) -> dict:
    if not isinstance(spec, dict):
        raise SpecrefError(f"a sweep must be a table (dict), got {type(spec).__name__}")
    unknown = set(spec) - {"impl", "level", "settings", "grid"}
    if unknown:
        raise SpecrefError(f"unknown sweep key(s) {sorted(unknown)}; a sweep has impl, level, settings, grid")
    impl = spec.get("impl")
    if not isinstance(impl, str) or ":" not in impl:
        raise SpecrefError(f"sweep impl must look like 'module:function', got {impl!r}")
    level = spec.get("level", "step")
    if level not in LEVELS:
        raise SpecrefError(f"sweep level must be one of {', '.join(map(repr, LEVELS))}, got {level!r}")
    settings = spec.get("settings", {})
    grid = spec.get("grid", {})
    for name, table in (("settings", settings), ("grid", grid)):
        if not isinstance(table, dict):
            raise SpecrefError(f"sweep {name} must be a table, got {table!r}")
        bad = set(table) - _SETTING_NAMES - ({"case"} if name == "grid" else set())
        if bad:
            raise SpecrefError(f"sweep {name} has unknown field(s) {sorted(bad)}; allowed: {sorted(_SETTING_NAMES)}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SpecrefError(f"sweep grid.{key} must be a non-empty list, got {values!r}")
    Settings(**settings)  # validates the shared settings
    return {"impl": impl, "level": level, "settings": settings, "grid": grid}


def cells(spec: dict) -> list[dict]:
    """Every combination of the grid, with ``case`` resolved to the level's default cases."""
    level = spec["level"]
    by_name = {c.name: c for c in LEVELS[level].cases()}
    grid = dict(spec["grid"])
    names = grid.pop("case", ["*"])
    if names == ["*"]:
        names = list(by_name)
    missing = [n for n in names if n not in by_name]
    if missing:
        raise SpecrefError(f"sweep grid.case names no {level}-level case {missing}; known: {sorted(by_name)}")
    keys = sorted(grid)
    out = []
    for name in names:
        for values in itertools.product(*(grid[k] for k in keys)):
            params = dict(zip(keys, values))
            cell_id = json.dumps({"case": name, **params}, sort_keys=True)
            out.append({"id": cell_id, "case": name, "params": params})
    return out


def _load_impl(spec, *, probe: bool = True):
    """The sweep's implementation; any failure of its import (``sys.exit`` included) a SpecrefError."""
    try:
        return load_implementation(spec, probe=probe)
    except SpecrefError as e:
        raise SpecrefError(f"the sweep's impl: {e}") from None


class _Record:
    """The sweep's JSON record, written atomically after every change."""

    def __init__(self, path, spec):
        self.path = Path(path) if path else None
        self.data = {"sweep": spec, "cells": {}}
        if self.path and self.path.exists():
            old = json.loads(self.path.read_text())
            if old.get("sweep") != spec:
                raise SpecrefError(f"{str(self.path)!r} holds another sweep; remove it or choose another --out")
            self.data = old

    def cell(self, cell_id):
        return self.data["cells"].setdefault(cell_id, {"shards": {}, "result": None})

    def save(self):
        if self.path:
            tmp = self.path.with_suffix(self.path.suffix + ".tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=str))
            os.replace(tmp, self.path)


class _SavingStore(dict):
    """A shard store that writes the record whenever a shard finishes."""

    def __init__(self, initial, record):
        super().__init__(initial)
        self.record, self.target = record, initial

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.target[key] = value
        self.record.save()


def run_sweep(spec: dict, *, out=None, executor=None, progress: bool = True, on_cell=None,
              isolate: bool = True) -> dict:
    """Run every cell not yet in the record at ``out``; returns the record (``{"sweep", "cells"}``).

    ``isolate``: each cell's case in a forked worker (the default; an ``isolate`` in the sweep's
    settings or grid wins).  Under the default time rule (``time_limit`` None) the first time-out
    ends the sweep: the cells after it are not run, nor recorded, so a run on the same ``out``
    runs them (SPEC §15)."""
    if not isinstance(isolate, bool):
        raise SpecrefError(f"isolate must be True or False, got {isolate!r}")
    spec = validate(spec)
    fn = _load_impl(spec["impl"], probe=isolate)
    level = spec["level"]
    by_name = {c.name: c for c in LEVELS[level].cases()}
    record = _Record(out, spec)
    for cell in cells(spec):
        entry = record.cell(cell["id"])
        if entry["result"] is not None:
            continue
        store = _SavingStore(entry["shards"], record)
        fields_ = {"isolate": isolate, **spec["settings"], **cell["params"]}
        settings = Settings(**fields_, executor=executor, progress=progress, shard_store=store)
        report = check(level, fn, cases=[by_name[cell["case"]]], settings=settings)
        r = report.results[0]
        entry["result"] = {
            "case": cell["case"], **cell["params"], "status": r.status, "ok": r.ok,
            "tv": None if r.tv is None else float(r.tv), "n_samples": r.n_samples, "p_value": r.p_value,
            "tv_interval": None if r.tv_interval is None else [float(x) for x in r.tv_interval], "detail": r.detail,
        }
        record.save()
        if on_cell:
            on_cell(entry["result"])
        if r.status == TIMEOUT and settings.time_limit is None:
            break
    return record.data


def sweep_table(record: dict) -> str:
    """One row per cell: case, the grid's parameters, status, TV, N, p."""
    rows = [c["result"] for c in record["cells"].values() if c["result"] is not None]
    keys = sorted(record["sweep"]["grid"].keys() - {"case"})
    head = f"{'case':<24} " + " ".join(f"{k:>10}" for k in keys) + f" {'status':<16} {'TV':>10} {'N':>9} {'p':>9}"
    lines = [head]
    for r in rows:
        tv = "-" if r["tv"] is None else f"{r['tv']:.3g}"
        p = "-" if r["p_value"] is None else f"{r['p_value']:.2g}"
        lines.append(f"{r['case']:<24} " + " ".join(f"{str(r[k]):>10}" for k in keys)
                     + f" {r['status']:<16} {tv:>10} {str(r['n_samples'] or '-'):>9} {p:>9}")
    missing = len(cells(record["sweep"])) - len(rows)
    if missing:
        lines.append(f"{missing} cell(s) not run: the sweep ended at its first time-out (time_limit None, SPEC 15); "
                     f"run it again on the same record to run them")
    return "\n".join(lines)
