import os
import subprocess
import sys
import threading

import pytest
import torch

from hybridkv.disk import (BadInput, BadKey, Choice, CostModel, DiskAdmissionRefused,
                           DiskMeta, DiskTier, FlopsModel, HookedBackend, LoadStatus,
                           LocalBackend)
from hybridkv.disk.loader import load_verdict
from hybridkv.disk.tier import STATE_NAMES, IllegalTransition
from hybridkv.testing.faults.hooks import gate
from spec.disk import DiskPrefixMachine
from tests.disk.blobs import k, x

M = DiskMeta("compressed_kv", abi=3, tok_lo=0, tok_hi=64)



def files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".hkv"))


def gated(d, **kw):
    ev = threading.Event()
    return DiskTier(d, backend=HookedBackend(LocalBackend(d), gate("read", ev)), **kw), ev


@pytest.mark.parametrize("kind,dtype,shape", [
    ("compressed_kv", torch.float32, (4, 2, 64)), ("tail", torch.float32, (3, 128)),
    ("swa", torch.bfloat16, (128, 64)), ("indexer", torch.float16, (16, 32)),
    ("swa", torch.int8, (7,)), ("tail", torch.float32, (0, 8))])
def test_roundtrip_every_kind_into_static_destination(tmp_path, kind, dtype, shape):
    t = DiskTier(tmp_path, 1 << 24)
    src = (torch.randn(shape) * 20).to(dtype)
    meta = DiskMeta(kind, 9, 4, 4 + 128)
    assert t.spill(k(1), src, meta).ok
    dst = torch.zeros(shape, dtype=dtype)
    ptr = dst.data_ptr()
    r = t.load(k(1), dst, meta)
    assert r.status is LoadStatus.VERIFIED and torch.equal(dst, src) and dst.data_ptr() == ptr
    assert t.state(k(1)) == "verified" and t.in_flight == 0


def test_restart_rebuilds_index_from_headers_and_sweeps_dead_temps(tmp_path):
    t = DiskTier(tmp_path, 1 << 24)
    for i in range(3):
        assert t.spill(k(i), x(i), M).ok
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (tmp_path / f".tmp-{dead}-1-deadbeef").write_bytes(b"partial")
    (tmp_path / f".tmp-{os.getpid()}-1-cafecafe").write_bytes(b"live writer")
    (tmp_path / "README").write_text("not ours")
    t2 = DiskTier(tmp_path, 1 << 24)
    assert sorted(t2.keys()) == [k(0), k(1), k(2)] and t2.stats["temp_swept"] == 1
    assert not (tmp_path / f".tmp-{dead}-1-deadbeef").exists()
    assert (tmp_path / f".tmp-{os.getpid()}-1-cafecafe").exists()
    assert (tmp_path / "README").exists() and t2.used_bytes == t.used_bytes
    dst = torch.zeros(1024)
    assert t2.load(k(1), dst, M).ok and torch.equal(dst, x(1))


def test_capacity_evicts_least_recently_used(tmp_path):
    t = DiskTier(tmp_path, 1 << 24)
    size = t.spill(k(0), x(0), M).nbytes
    t = DiskTier(tmp_path, 3 * size)
    for i in (1, 2):
        assert t.spill(k(i), x(i), M).ok
    assert t.load(k(0), torch.zeros(1024), M).ok        # touch 0: now 1 is the oldest
    assert t.spill(k(3), x(3), M).ok
    assert sorted(t.keys()) == [k(0), k(2), k(3)] and t.used_bytes <= 3 * size
    assert files(tmp_path) == [k(0) + ".hkv", k(2) + ".hkv", k(3) + ".hkv"]


def test_object_larger_than_capacity_is_refused_without_change(tmp_path):
    t = DiskTier(tmp_path, 8192)
    assert t.spill(k(0), x(0, 16), M).ok
    r = t.spill(k(1), x(1, 8192), M)
    assert not r.ok and r.reason == "no room" and t.keys() == [k(0)]


def test_loading_entry_is_never_evicted_and_admission_cap_refuses(tmp_path):
    t, ev = gated(tmp_path, capacity_bytes=1 << 24, max_in_flight=1)
    assert t.spill(k(0), x(0), M).ok
    t.spill(k(1), x(1), M)
    h = t.load_async(k(0), torch.zeros(1024), M)
    assert t.state(k(0)) == "loading" and t.in_flight == 1
    before = (t.keys(), t.used_bytes, t.state(k(1)))
    with pytest.raises(DiskAdmissionRefused) as e:
        t.load_async(k(1), torch.zeros(1024), M)
    assert (e.value.in_flight, e.value.cap) == (1, 1)
    with pytest.raises(DiskAdmissionRefused):
        t.spill(k(2), x(2), M)
    assert (t.keys(), t.used_bytes, t.state(k(1))) == before
    assert t.load_async(k(0), torch.zeros(1024), M).result(1).status is LoadStatus.BUSY
    ev.set()
    assert h.result(10).ok and t.in_flight == 0


def test_eviction_skips_an_entry_whose_load_is_in_flight(tmp_path):
    t, ev = gated(tmp_path, capacity_bytes=1 << 24, max_in_flight=2)
    size = t.spill(k(0), x(0), M).nbytes
    t.spill(k(1), x(1), M)
    h = t.load_async(k(0), torch.zeros(1024), M)     # k(0) is the LRU entry, and loading
    t.capacity = 2 * size
    assert t.spill(k(2), x(2), M).ok
    assert sorted(t.keys()) == [k(0), k(2)] and t.state(k(0)) == "loading"
    t.capacity = size                                  # only the loading entry would fit
    r = t.spill(k(3), x(3), M)
    assert not r.ok and r.reason == "no room" and sorted(t.keys()) == [k(0), k(2)]
    ev.set()
    assert h.result(10).ok


def test_probe_reports_wait_or_recompute_for_inflight_load(tmp_path):
    cm = CostModel(1e9, 1e12, FlopsModel(n_params=1_000_000, n_layers=4, attn_dim=256))
    t, ev = gated(tmp_path, capacity_bytes=1 << 24, cost_model=cm)
    t.spill(k(0), x(0), M)
    assert t.probe(k(0), 0, 4096).decision.choice is Choice.LOAD
    assert t.probe(k(0), 0, 1).decision.choice is Choice.RECOMPUTE
    h = t.load_async(k(0), torch.zeros(1024), M)
    p = t.probe(k(0), 0, 4096)
    assert p.state == "loading" and p.decision.choice is Choice.WAIT
    assert t.probe(k(5)).state == "absent"
    ev.set()
    assert h.result(10).ok


def test_abi_mismatch_is_a_miss_that_keeps_the_file(tmp_path):
    t = DiskTier(tmp_path, 1 << 24)
    t.spill(k(0), x(0), M)
    dst = torch.full((1024,), 7.0)
    r = t.load(k(0), dst, M._replace(abi=4))
    assert r.status is LoadStatus.MISS and r.reason.startswith("mismatch")
    assert bool((dst == 7.0).all()) and files(tmp_path) == [k(0) + ".hkv"]
    assert t.load(k(0), dst, M).ok and torch.equal(dst, x(0))   # the entry was kept


def test_missing_file_is_a_miss_not_an_exception(tmp_path):
    t = DiskTier(tmp_path, 1 << 24)
    t.spill(k(0), x(0), M)
    os.unlink(tmp_path / (k(0) + ".hkv"))
    r = t.load(k(0), torch.zeros(1024), M)
    assert r.status is LoadStatus.MISS and t.state(k(0)) == "absent"
    assert t.load(k(9), torch.zeros(1024), M).reason == "absent"


def test_bad_input_raises_named_errors_and_changes_nothing(tmp_path):
    t = DiskTier(tmp_path, 1 << 24)
    t.spill(k(0), x(0), M)
    with pytest.raises(BadKey):
        t.spill("../evil", x(1), M)
    with pytest.raises(BadInput):
        t.spill(k(1), x(1), DiskMeta("weights", 1))
    with pytest.raises(BadInput):
        t.load_async(k(0), torch.zeros(2048)[::2], M)
    with pytest.raises(BadInput):
        DiskTier(tmp_path, 0)
    assert files(tmp_path) == [k(0) + ".hkv"] and t.state(k(0)) == "on_disk"


def test_existing_key_is_not_rewritten(tmp_path):
    t = DiskTier(tmp_path, 1 << 24)
    t.spill(k(0), x(0), M)
    ino = os.stat(tmp_path / (k(0) + ".hkv")).st_ino
    assert t.spill(k(0), x(0), M).reason == "exists"
    assert os.stat(tmp_path / (k(0) + ".hkv")).st_ino == ino


def test_other_tier_on_same_directory_sees_new_objects_after_refresh(tmp_path):
    a, b = DiskTier(tmp_path, 1 << 24), DiskTier(tmp_path, 1 << 24)
    a.spill(k(0), x(0), M)
    dst = torch.zeros(1024)
    assert b.load(k(0), dst, M).reason == "absent"        # queries never adopt
    assert b.refresh() == 1 and b.stats["adopted"] == 1
    assert b.load(k(0), dst, M).ok and torch.equal(dst, x(0))


def test_many_concurrent_loads_return_their_own_data(tmp_path):
    t = DiskTier(tmp_path, 1 << 26, max_in_flight=32, workers=4)
    for i in range(24):
        t.spill(k(i), x(i, 4096), M)
    dsts = [torch.zeros(4096) for _ in range(24)]
    hs = [t.load_async(k(i), dsts[i], M) for i in range(24)]
    assert all(h.result(20).ok for h in hs)
    assert all(torch.equal(dsts[i], x(i, 4096)) for i in range(24)) and t.in_flight == 0


def test_states_are_the_spec_machine_states_and_illegal_moves_raise(tmp_path):
    assert STATE_NAMES == {s.value: s.id for s in DiskPrefixMachine.states}
    t = DiskTier(tmp_path, 1 << 24)
    t.spill(k(0), x(0), M)
    e = t._index.get(k(0))
    with pytest.raises(IllegalTransition):
        t._index.go(e, "load_ok")
    assert t.state(k(0)) == "on_disk"


@pytest.mark.parametrize("hdr,abi,off,ck,want", [
    (1, 3, 4096, 1, True), (0, 3, 4096, 1, False), (1, 4, 4096, 1, False),
    (1, 3, 4100, 1, False), (1, 3, 4096, 0, False), (1, 3, 8192, 1, True)])
def test_load_verdict_adapter_follows_spec_guard(hdr, abi, off, ck, want):
    assert load_verdict(hdr, abi, off, ck, 3) is want
