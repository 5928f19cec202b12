"""specref: a reference implementation of speculative decoding and an exact verifier.

The package is built in floors, each importing only the floors below it
(``pyproject.toml`` states the contract and the tests enforce it):

- :mod:`specref.verify`, :mod:`specref.bench` -- entry points (``python -m ...``);
- :mod:`specref.adapters` -- outside implementations under the oracle;
- :mod:`specref.verification` -- exact laws, statistics, the oracle, the zoo, strategies, in
  rooms of their own (see :mod:`specref.verification`);
- :mod:`specref.decoding` -- the decoding loops;
- :mod:`specref.core` -- pure numerics.

``toy_models`` (a separate top-level package) leans only on :mod:`specref.core`.
The specification is ``docs/spec.md``.
"""

__version__ = "0.2.0"


def __getattr__(name):
    """``specref.check`` and ``specref.LEVELS``: the oracle's front door, imported on first use
    (``import specref`` itself stays light).  Every level is registered by then."""
    if name in ("check", "LEVELS"):
        from specref.verification import oracle

        return getattr(oracle, name)
    raise AttributeError(f"module 'specref' has no attribute {name!r}")
