"""Redis backend against a real redis-server started by the test (loopback, no persistence)."""
import multiprocessing as mp

import pytest
import redis
import torch

from hybridkv.disk import DiskMeta, DiskTier, LoadStatus
from hybridkv.disk.redis_backend import RedisBackend
from tests.disk.redis_server import redis_server

M = DiskMeta("swa", abi=2, tok_lo=0, tok_hi=128)


def k(i):
    return f"{i:032x}"


def x(i):
    return torch.randn(128, 64, generator=torch.Generator().manual_seed(i))


def _child_spill(port, i):
    t = DiskTier(capacity_bytes=1 << 24, backend=RedisBackend(port=port))
    assert t.spill(k(i), x(i), M).ok


def _child_load(port, i, q):
    t = DiskTier(capacity_bytes=1 << 24, backend=RedisBackend(port=port))
    dst = torch.zeros(128, 64)
    r = t.load(k(i), dst, M, timeout=10)
    q.put((r.status.value, bool(torch.equal(dst, x(i)))))


def test_roundtrip_restart_and_corruption_on_redis():
    with redis_server() as srv:
        t = DiskTier(capacity_bytes=1 << 24, backend=srv.backend())
        assert t.spill(k(1), x(1), M).ok and t.spill(k(2), x(2), M).ok
        t2 = DiskTier(capacity_bytes=1 << 24, backend=srv.backend())   # rebuilt from headers
        assert sorted(t2.keys()) == [k(1), k(2)]
        dst = torch.zeros(128, 64)
        assert t2.load(k(1), dst, M).ok and torch.equal(dst, x(1))
        raw = bytearray(srv.backend().client.get(b"hkv:" + (k(2) + ".hkv").encode()))
        raw[5000] ^= 1                                                  # payload bit flip
        srv.backend().client.set(b"hkv:" + (k(2) + ".hkv").encode(), bytes(raw))
        dst = torch.full((128, 64), 3.0)
        r = t2.load(k(2), dst, M)
        assert r.status is LoadStatus.MISS and "checksum" in r.reason
        assert bool((dst == 3.0).all()) and srv.backend().client.exists(b"hkv:" + (
            k(2) + ".hkv").encode()) == 0
        other = DiskTier(capacity_bytes=1 << 24, backend=srv.backend(prefix="other:"))
        assert other.keys() == []


def test_two_processes_share_spilled_objects():
    ctx = mp.get_context("spawn")
    with redis_server() as srv:
        p = ctx.Process(target=_child_spill, args=(srv.port, 3))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        t = DiskTier(capacity_bytes=1 << 24, backend=srv.backend())
        dst = torch.zeros(128, 64)
        assert t.load(k(3), dst, M).ok and torch.equal(dst, x(3))       # written by the child
        assert t.spill(k(4), x(4), M).ok
        q = ctx.Queue()
        p = ctx.Process(target=_child_load, args=(srv.port, 4, q))
        p.start()
        got = q.get(timeout=60)
        p.join(30)
        assert got == ("verified", True)


def fill_until_full(t, srv, headroom=1 << 20, limit=400):
    """Cap the server at its current use + ``headroom`` with noeviction, spill until a write
    is refused; returns the keys that were stored."""
    admin = srv.backend().client
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", admin.info("memory")["used_memory"] + headroom)
    stored = []
    for i in range(limit):
        r = t.spill(k(100 + i), x(100 + i), M)
        if not r.ok:
            # client buffers make used_memory drift: pin the limit below it so it stays full
            admin.config_set("maxmemory", admin.info("memory")["used_memory"] - (64 << 10))
            return stored, r
        stored.append(100 + i)
    raise AssertionError("the server never filled up")


def test_full_redis_with_noeviction_still_serves_verified_hits():
    with redis_server() as srv:
        t = DiskTier(capacity_bytes=1 << 30, backend=srv.backend())
        stored, refused = fill_until_full(t, srv)
        assert len(stored) >= 3 and refused.reason.startswith("io:"), refused
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            srv.backend().client.set(b"probe", b"x")          # really full
        for i in stored:
            dst = torch.zeros(128, 64)
            r = t.load(k(i), dst, M, timeout=10)
            assert r.ok and torch.equal(dst, x(i)), (i, r)
        assert sorted(t.keys()) == sorted(k(i) for i in stored)


def test_a_redis_key_of_another_type_is_skipped_and_never_deleted():
    with redis_server() as srv:
        t = DiskTier(capacity_bytes=1 << 24, backend=srv.backend())
        assert t.spill(k(5), x(5), M).ok
        c = srv.backend().client
        c.delete(b"hkv:" + (k(5) + ".hkv").encode())
        c.rpush(b"hkv:" + (k(5) + ".hkv").encode(), b"not a blob")       # a list, not a string
        c.hset(b"hkv:" + (k(6) + ".hkv").encode(), "f", "v")
        r = t.load(k(5), torch.zeros(128, 64), M, timeout=10)
        assert r.status is LoadStatus.MISS and "regular" in r.reason and t.state(k(5)) == "absent"
        t2 = DiskTier(capacity_bytes=1 << 24, backend=srv.backend())
        assert t2.keys() == [] and t2.stats["scan_not_regular"] == 2
        assert not t2.spill(k(6), x(6), M).ok
        assert c.type(b"hkv:" + (k(5) + ".hkv").encode()) == b"list"
        assert c.type(b"hkv:" + (k(6) + ".hkv").encode()) == b"hash"
