"""0.2's flat module paths, kept for one version: importing one gives the module at its new
path and a ``DeprecationWarning`` naming that path.  They import in 0.3 and are removed in 0.4
(``CHANGELOG.md``; ``tests/test_moved.py`` fails once the version reaches 0.4 with this table
still here).  This module is the whole of that decision: delete it, and its ``install()`` call in
:mod:`specref.verification`, to remove them.

The alias is a meta-path finder, so no module file stands at an old path and no module of
the package imports an old path (``tests/test_layers.py`` checks both).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "specref.verification.optimal": "specref.verification.laws.optimal",
    "specref.verification.calling": "specref.verification.running.calling",
    "specref.verification.frames": "specref.verification.running.frames",
    "specref.verification.report": "specref.verification.running.report",
    "specref.verification.progress": "specref.verification.running.progress",
    "specref.verification.tables": "specref.verification.cases.tables",
    "specref.verification.case_models": "specref.verification.cases.models",
    "specref.verification.rules": "specref.verification.cases.rules",
    "specref.verification.strategies": "specref.verification.cases.strategies",
    "specref.verification.stats": "specref.verification.statistics.counts",
    "specref.verification.shards": "specref.verification.statistics.shards",
    "specref.verification.efficiency": "specref.verification.statistics.efficiency",
    "specref.verification.batched": "specref.verification.levels.batched.steps",
    "specref.verification.trees": "specref.verification.levels.trees.sampled",
    "specref.verification.planning": "specref.verification.campaigns.planning",
    "specref.verification.sweep": "specref.verification.campaigns.sweep",
    "specref.verification.zoo_engines": "specref.verification.zoo.engines",
    "specref.verification.zoo_trees": "specref.verification.zoo.trees",
    "specref.verification.levels.engines": "specref.verification.levels.batched.engines",
    "specref.verification.levels.mrv2": "specref.verification.levels.batched.mrv2",
    "specref.verification.levels.greedy": "specref.verification.levels.trees.greedy",
    "specref.verification.levels.engine_coins": "specref.verification.levels.coins.vllm_coins",
}
"""Old path -> new path.  ``laws``, ``cases``, ``levels`` and ``zoo`` are rooms now, and each
room's package re-exports what its 0.2 module held, so those names need no alias; so do the
level kinds ``levels.chain``, ``levels.batched``, ``levels.trees`` and ``levels.coins``, packages
now that re-export the public names of the module they were (``chain.programs``,
``batched.steps``, ``trees.sampled``, ``coins.kernels``)."""


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new} in specref 0.3; the old path goes in 0.4",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)  # the module itself: one object under both names

    def exec_module(self, module):
        pass  # already executed at its new path


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
