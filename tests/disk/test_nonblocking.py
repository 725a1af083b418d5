"""Queries never wait on the backend: with every read and write of a backend hung, probe,
state, keys, spill_async and load_async of other keys return within 50 ms.  Objects other
processes publish are adopted only by the explicit, blocking refresh()."""
import threading
import time

import pytest
import torch

from hybridkv.disk import DiskAdmissionRefused, DiskMeta, DiskTier, HookedBackend, \
    LoadStatus, LocalBackend
from hybridkv.testing.faults.hooks import gate

M = DiskMeta("indexer", abi=8, tok_lo=0, tok_hi=64)
FAST = 0.05


def k(i):
    return f"{i:032x}"


def x(i, n=4096):
    return torch.randn(n, generator=torch.Generator().manual_seed(i))


def timed(fn, *a):
    t0 = time.perf_counter()
    v = fn(*a)
    return v, time.perf_counter() - t0


@pytest.fixture
def hung(tmp_path):
    """A tier whose backend hangs every open/read/put/size/remove/names once ``ev`` is
    cleared; k(1)..k(3) were spilled while it was healthy."""
    ev = threading.Event()
    ev.set()
    hook = gate(("open", "read", "put", "size", "remove", "names"), ev, 20.0)
    t = DiskTier(tmp_path, 1 << 24, backend=HookedBackend(LocalBackend(tmp_path), hook),
                 max_in_flight=6, workers=2)
    for i in (1, 2, 3):
        assert t.spill(k(i), x(i), M).ok
    ev.clear()
    yield t, ev, tmp_path
    ev.set()
    t.close()


def test_queries_return_fast_while_the_backend_hangs(hung):
    t, ev, _ = hung
    stuck = t.load_async(k(1), torch.zeros(4096), M)           # holds a worker on a read
    s1 = t.spill_async(k(10), x(10), M)                         # holds a worker on a put
    worst = {}
    for _ in range(3):
        for name, fn, a in [("probe", t.probe, (k(2),)), ("probe absent", t.probe, (k(99),)),
                            ("state", t.state, (k(3),)), ("keys", t.keys, ()),
                            ("in_flight", lambda: t.in_flight, ()),
                            ("used_bytes", lambda: t.used_bytes, ())]:
            _, dt = timed(fn, *a)
            worst[name] = max(worst.get(name, 0), dt)
    dst2 = torch.full((4096,), 4.0)
    h2, worst["load_async"] = timed(t.load_async, k(2), dst2, M)
    src = x(11)
    s2, worst["spill_async"] = timed(t.spill_async, k(11), src, M)
    src.fill_(0.0)                        # the caller reuses its memory at once
    h99, worst["load_async absent"] = timed(t.load_async, k(99), torch.zeros(4096), M)
    assert max(worst.values()) < FAST, worst
    assert h99.done() and h99.result(0).reason == "absent"
    assert not (stuck.done() or s1.done() or h2.done() or s2.done())
    assert t.state(k(2)) == "loading" and t.state(k(11)) == "writing" and t.in_flight == 4
    ev.set()
    assert stuck.result(10).ok and h2.result(10).ok and torch.equal(dst2, x(2))
    assert s1.result(10).ok and s2.result(10).ok and t.in_flight == 0
    dst = torch.zeros(4096)
    assert t.load(k(11), dst, M, timeout=10).ok and torch.equal(dst, x(11))   # private copy


def test_full_in_flight_budget_refuses_instead_of_blocking(hung):
    t, ev, _ = hung
    hs = [t.spill_async(k(20 + i), x(20 + i), M) for i in range(4)]
    hs += [t.load_async(k(i), torch.zeros(4096), M) for i in (1, 2)]
    assert t.in_flight == 6
    for fn, a in [(t.spill_async, (k(30), x(30), M)),
                  (t.load_async, (k(3), torch.zeros(4096), M))]:
        t0 = time.perf_counter()
        with pytest.raises(DiskAdmissionRefused):
            fn(*a)
        assert time.perf_counter() - t0 < FAST
    ev.set()
    assert all(h.result(10).ok for h in hs) and t.in_flight == 0


def test_spill_handle_contract(tmp_path):
    t = DiskTier(tmp_path, 1 << 24)
    h = t.spill_async(k(1), x(1), M)
    r = h.result(10)
    assert h.done() and r.ok and r.reason == "written" and t.state(k(1)) == "on_disk"
    assert t.spill_async(k(1), x(1), M).result(0).reason == "exists"
    assert t.spill(k(2), x(2), M).ok                           # the synchronous wrapper


def test_objects_of_other_processes_are_adopted_only_by_refresh(tmp_path):
    a, b = DiskTier(tmp_path, 1 << 24), DiskTier(tmp_path, 1 << 24)
    assert a.spill(k(0), x(0), M).ok and a.spill(k(1), x(1), M).ok
    assert b.probe(k(0)).state == "absent" and b.state(k(0)) == "absent"
    r = b.load(k(0), torch.zeros(4096), M, timeout=10)
    assert r.status is LoadStatus.MISS and r.reason == "absent"
    assert b.refresh() == 2 and b.refresh() == 0 and b.stats["adopted"] == 2
    dst = torch.zeros(4096)
    assert b.probe(k(0)).state == "on_disk" and b.load(k(0), dst, M, timeout=10).ok
    assert torch.equal(dst, x(0))


def test_probe_of_an_unknown_key_does_no_backend_io(tmp_path):
    ev = threading.Event()
    t = DiskTier(tmp_path, 1 << 24, backend=HookedBackend(LocalBackend(tmp_path),
                                                          gate("open", ev, 2.0)))
    ev.clear()
    try:
        for fn in (t.probe, t.state):
            _, dt = timed(fn, k(42))
            assert dt < FAST, (fn.__name__, dt)
    finally:
        ev.set()
