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
