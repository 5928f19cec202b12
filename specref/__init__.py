"""specref: a reference implementation of speculative decoding and an exact verifier.

The front door::

    from specref import check
    report = check("step", my_step)                         # exact: every coin enumerated
    report = check("step", my_step, mode="statistical")     # sampled, N planned
    assert report.ok, report

- :func:`check` ``(level, fn, **settings)``: the oracle's verdict on ``fn`` at a level (a key of
  :data:`LEVELS`); settings come as keywords or as one :class:`Settings`; returns a :class:`Report`.
- :func:`plan` ``(level, fn, **settings)``: N and an ETA per case, before a long run.
- :data:`LEVELS`, :class:`Level`, :func:`register`: every level by name, what one is, and adding one.
- :mod:`strategies`: Hypothesis strategies for property-testing against specref.
- :class:`SpecrefError`: what specref raises for bad input (a ``ValueError``).

The command line is ``specref check | selftest | plan | sweep | bench`` (:mod:`specref.cli`).
Everything above is imported on first use, so ``import specref`` itself stays light.

The package is built in floors, each importing only the floors below it
(``pyproject.toml`` states the contract and the tests enforce it):

- :mod:`specref.cli` -- the ``specref`` command;
- :mod:`specref.verify`, :mod:`specref.bench` -- entry points (``python -m ...``);
- :mod:`specref.adapters` -- outside implementations under the oracle;
- :mod:`specref.verification` -- exact laws, statistics, the oracle, the zoo, strategies, in
  rooms of their own (see :mod:`specref.verification`);
- :mod:`specref.decoding` -- the decoding loops;
- :mod:`specref.core` -- pure numerics.

``toy_models`` (a separate top-level package) leans only on :mod:`specref.core`.
The specification is ``docs/spec.md``.
"""

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (type checkers read the name)

__version__ = "0.3.0"  # pyproject.toml's version and CHANGELOG.md's top entry (tests/test_cli.py)

__all__ = ["check", "plan", "register", "Level", "LEVELS", "Settings", "Report", "SpecrefError", "strategies",
           "__version__"]

_HOME = {  # public name -> the module that holds it (a module itself where the name is the module's last part)
    "check": "specref.verification.oracle",
    "plan": "specref.verification.campaigns.planning",
    "register": "specref.verification.levels",
    "LEVELS": "specref.verification.levels",
    "Level": "specref.verification.running.level",
    "Settings": "specref.verification.running.report",
    "Report": "specref.verification.running.report",
    "SpecrefError": "specref.core.errors",
    "strategies": "specref.verification.cases.strategies",
}

if TYPE_CHECKING:  # what the names are, for type checkers and editors; at run time they load on first use
    from specref.core.errors import SpecrefError
    from specref.verification.campaigns.planning import plan
    from specref.verification.cases import strategies
    from specref.verification.levels import LEVELS, register
    from specref.verification.oracle import check
    from specref.verification.running.level import Level
    from specref.verification.running.report import Report, Settings


def __getattr__(name: str):
    """A public name, imported from its home on first use (every level is registered by then)."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'specref' has no attribute {name!r}")
    import importlib  # loaded at start-up already; here, so that importing specref runs no import statement

    module = importlib.import_module(home)
    value = module if home.rpartition(".")[2] == name else getattr(module, name)
    globals()[name] = value  # found here directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
