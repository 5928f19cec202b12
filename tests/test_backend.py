"""specref.core.backend: the host copies, each checked against a second route (Python lists, Fractions)."""

from fractions import Fraction as F

import array_api_strict as xps
import numpy as np

from specref.core.backend import host_rows, namespace, to_host, to_numpy

try:
    import torch  # optional (the hf extra): its cases run when it is installed
except ImportError:
    torch = None

ROWS = np.array([[[0.25, 0.5, 0.25], [0.1, 0.7, 0.2]]])  # [B=1, R=2, V=3]


class _DeviceTensor:
    """Stands in for a CUDA tensor: no host buffer to export, only ``cpu()``."""

    def __init__(self, host):
        self.host, self.moved = host, 0

    def cpu(self):
        self.moved += 1
        return self.host


def test_to_host_copies_every_backend_unchanged():
    assert to_host(ROWS) is ROWS  # a NumPy array is not copied
    for x in [xps.asarray(ROWS), ROWS.tolist()] + ([torch.from_numpy(ROWS.copy())] if torch else []):
        got = to_host(x)
        assert isinstance(got, np.ndarray) and got.dtype == np.float64
        assert got.tolist() == ROWS.tolist()
    assert to_host(np.float32(0.5)) == np.float32(0.5)


def test_to_host_moves_device_tensors_through_cpu():
    fake = _DeviceTensor(ROWS.copy())
    assert to_host(fake).tolist() == ROWS.tolist() and fake.moved == 1


def test_host_rows_renormalise_float_rows_and_keep_fractions():
    rng = np.random.default_rng(0)
    rows32 = rng.dirichlet(np.ones(5), size=(2, 3)).astype(np.float32)  # sums off by float32 rounding
    for x in [rows32, xps.asarray(rows32)] + ([torch.from_numpy(rows32.copy())] if torch else []):
        got = host_rows(x)
        assert got.dtype == np.float64 and got.shape == rows32.shape
        for b, i in np.ndindex(2, 3):  # second route: the same division in rationals
            want = [F(float(v)) / sum(F(float(w)) for w in rows32[b, i]) for v in rows32[b, i]]
            assert all(abs(F(float(g)) - w) <= F(1, 2**52) for g, w in zip(got[b, i], want))
        assert np.abs(got.sum(axis=-1) - 1).max() <= 4e-16
    exact = np.array([[F(1, 3), F(2, 3)]], dtype=object)
    assert host_rows(exact) is exact  # exact rows already sum to 1


def test_namespace_and_to_numpy_are_unchanged():
    assert namespace(xps.asarray(ROWS)) is xps
    assert to_numpy(ROWS) is ROWS and to_numpy([1, 2]).tolist() == [1, 2]
