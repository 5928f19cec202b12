"""The order the suite's modules are handed out in: the longest first.

The suite runs on three pytest-xdist workers, each module whole on one (``--dist loadfile``), and
modules go to the workers in collection order.  In alphabetical order the longest modules (the
real engines, an interpreter, a server) come last, and one of them ran alone at the end while the
other workers idled.  :data:`FIRST` names them, longest first; every other module keeps its place
after them.  Nothing is skipped, marked or shortened here: only the order changes.

It also holds the one fixture several modules share: ``one_thread`` (torch on one intra-op thread
for a module that runs the real engines' kernels).
"""

import os

import pytest

# One OpenMP thread in every test process (and the engines' subprocesses): the oracle forks a worker per
# case, and a fork after torch's OpenMP pool has run in the forking process can hang or abort the worker
# (GNU OpenMP is not fork-safe); modules that call torch in-process and then check isolated ran into it.
os.environ.setdefault("OMP_NUM_THREADS", "1")


FIRST = ("test_vllm_e2e.py", "test_real_engines.py", "test_mrv2_level.py", "test_vllm_sampler.py",
         "test_openai_server.py", "test_fuzz_surfaces.py", "test_docs.py", "test_fuzz.py", "test_fuzz_coins_trees_mrv2.py", "test_mutants.py",
         "test_coin_route.py", "test_distributed.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: the rest keep their order


@pytest.fixture(scope="module")
def one_thread():
    """torch on one intra-op thread for the module (the engines' kernels run row by row in
    Triton's interpreter or in small C++ loops: more threads only contend); yields torch."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(before)
