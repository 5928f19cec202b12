"""0.2's flat module paths keep working for one version, each with a DeprecationWarning naming
the new path, and give the very module at the new path (one object, one state)."""

import importlib
import sys

import pytest

from specref.verification._moved import MOVED


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_path_warns_and_gives_the_new_module(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_from_import_of_an_old_path_gives_the_same_function():
    sys.modules.pop("specref.verification.stats", None)
    with pytest.warns(DeprecationWarning, match="statistics.counts"):
        from specref.verification.stats import samples_needed
    from specref.verification.statistics.counts import samples_needed as new

    assert samples_needed is new


def test_rooms_keep_their_0_2_names_without_an_alias():
    from specref.verification import cases, laws, levels, zoo

    assert callable(laws.law) and callable(cases.default_cases) and callable(zoo.entries)
    assert {"step", "vllm", "flashinfer", "tree"} <= set(levels.LEVELS)


def test_an_unknown_old_path_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("specref.verification.no_such_module")


def test_the_aliases_live_for_one_release_the_one_their_warning_names():
    """0.3 keeps the 0.2 paths, 0.4 removes them (CHANGELOG.md): the warning names this release,
    and from 0.4 on this test fails until specref/verification/_moved.py is gone."""
    import specref

    release = ".".join(specref.__version__.split(".")[:2])
    assert release == "0.3", f"specref {specref.__version__} removes the 0.2 paths: delete verification/_moved.py"
    sys.modules.pop("specref.verification.sweep", None)
    with pytest.warns(DeprecationWarning, match=rf"in specref {release}; the old path goes in 0\.4"):
        importlib.import_module("specref.verification.sweep")
