"""Transient backend errors (I/O error, timeout, lost connection, out of memory) are a miss
that never costs the tier an intact entry: loading -> on_disk (spec load_cancel)."""
import errno

import pytest
import torch

from hybridkv.disk import DiskMeta, DiskTier, HookedBackend, LoadStatus, LocalBackend

M = DiskMeta("swa", abi=4, tok_lo=0, tok_hi=64)


def k(i):
    return f"{i:032x}"


def x(i, n=2048):
    return torch.randn(n, generator=torch.Generator().manual_seed(i))


class OneShot:
    """A hook that fails the next ``op`` with ``err`` once it is armed."""

    def __init__(self, op, err):
        self.op, self.err, self.armed = op, err, False

    def __call__(self, op, name):
        if op == self.op and self.armed:
            self.armed = False
            raise OSError(self.err, "injected", name)


@pytest.mark.parametrize("err", [errno.EIO, errno.ETIMEDOUT, errno.ECONNRESET, errno.ENOMEM])
@pytest.mark.parametrize("op", ["open", "read"])
def test_transient_read_error_is_a_miss_that_keeps_the_entry(tmp_path, err, op):
    hook = OneShot(op, err)
    t = DiskTier(tmp_path, 1 << 24, backend=HookedBackend(LocalBackend(tmp_path), hook))
    assert t.spill(k(1), x(1), M).ok
    hook.armed = True
    dst = torch.full((2048,), 5.0)
    r = t.load(k(1), dst, M, timeout=10)
    assert not hook.armed and r.status is LoadStatus.MISS and r.reason.startswith("io:"), r
    assert bool((dst == 5.0).all())
    assert t.state(k(1)) == "on_disk" and t.keys() == [k(1)] and t.in_flight == 0
    assert (tmp_path / (k(1) + ".hkv")).exists()
    r = t.load(k(1), dst, M, timeout=10)                 # the fault is gone: a verified hit
    assert r.ok and torch.equal(dst, x(1))


def test_a_raising_still_valid_cancels_the_load_and_keeps_the_entry(tmp_path):
    t = DiskTier(tmp_path, 1 << 24)
    assert t.spill(k(2), x(2), M).ok
    dst = torch.full((2048,), 5.0)

    def broken():
        raise KeyError("block table gone")
    r = t.load_async(k(2), dst, M, still_valid=broken).result(10)
    assert r.status is LoadStatus.CANCELLED and r.reason.startswith("internal"), r
    assert bool((dst == 5.0).all()) and t.state(k(2)) == "on_disk" and t.in_flight == 0


def test_a_backend_bug_during_a_spill_is_a_refusal_not_a_stuck_entry(tmp_path):
    def hook(op, name):
        if op == "put":
            raise RuntimeError("backend bug")
    t = DiskTier(tmp_path, 1 << 24, backend=HookedBackend(LocalBackend(tmp_path), hook))
    r = t.spill_async(k(3), x(3), M).result(10)
    assert r is not None and not r.ok and r.reason.startswith("internal"), r
    assert t.state(k(3)) == "absent" and t.in_flight == 0 and t.used_bytes == 0
