"""Bad arguments raise a named BadInput before anything starts; the destination and the
tier stay untouched."""
import threading
import time

import pytest
import torch

from hybridkv.disk import (BadInput, DiskMeta, DiskTier, HookedBackend, LoadStatus,
                           LocalBackend)
from hybridkv.testing.faults.hooks import gate
from tests.disk.blobs import k, x as blob

M = DiskMeta("swa", abi=4, tok_lo=0, tok_hi=64)


def x(i, n=2048):
    return blob(i, n)


def test_spill_of_a_non_tensor_raises_bad_input(tmp_path):
    t = DiskTier(tmp_path, 1 << 24)
    for bad in ([1.0, 2.0], b"bytes", None, 3.0, torch.zeros(3, device="meta")):
        with pytest.raises(BadInput) as e:
            t.spill(k(2), bad, M)
        assert e.value.value == (type(bad).__name__ if not isinstance(bad, torch.Tensor)
                                 else (torch.strided, "meta"))
    assert t.keys() == [] and list(tmp_path.iterdir()) == []


BAD_TIMEOUTS = ["x", float("inf"), float("nan"), -1, -0.5, True, [1]]


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=repr)
def test_bad_load_timeout_raises_before_the_load_starts(tmp_path, timeout):
    ev = threading.Event()
    t = DiskTier(tmp_path, 1 << 24, backend=HookedBackend(LocalBackend(tmp_path),
                                                          gate("read", ev, 5.0)))
    ev.set()
    assert t.spill(k(3), x(3), M).ok
    ev.clear()                                            # a started load would wait here
    dst = torch.full((2048,), 5.0)
    with pytest.raises(BadInput) as e:
        t.load(k(3), dst, M, timeout=timeout)
    assert e.value.value is timeout
    assert t.state(k(3)) == "on_disk" and t.in_flight == 0
    ev.set()
    time.sleep(0.3)                                       # a stray load would land now
    assert bool((dst == 5.0).all()) and t.state(k(3)) == "on_disk"


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=repr)
def test_bad_handle_timeout_raises_and_the_load_still_completes(tmp_path, timeout):
    t = DiskTier(tmp_path, 1 << 24)
    assert t.spill(k(4), x(4), M).ok
    dst = torch.zeros(2048)
    h = t.load_async(k(4), dst, M)
    with pytest.raises(BadInput):
        h.result(timeout)
    assert h.result(10).ok and torch.equal(dst, x(4))


@pytest.mark.parametrize("timeout", [None, 0, 0.0, 10, 2.5])
def test_good_timeouts_are_accepted(tmp_path, timeout):
    t = DiskTier(tmp_path, 1 << 24)
    assert t.spill(k(5), x(5), M).ok
    dst = torch.zeros(2048)
    r = t.load(k(5), dst, M, timeout=timeout)
    assert r.status in (LoadStatus.VERIFIED, LoadStatus.CANCELLED)
    assert r.ok == torch.equal(dst, x(5))
