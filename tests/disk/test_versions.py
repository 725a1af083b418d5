"""A rolling upgrade: processes of two format versions share a directory or a Redis prefix.
A blob whose header declares another format version is skipped (never indexed, never
deleted, counted); only a blob damaged in our own format version may be deleted."""
import multiprocessing as mp
import os
import struct

import pytest
import torch
import xxhash

from hybridkv.disk import DiskMeta, DiskTier, LoadStatus
from hybridkv.disk import format as fmt
from tests.disk.redis_server import redis_server

M = DiskMeta("compressed_kv", abi=12, tok_lo=0, tok_hi=128)


def k(i):
    return f"{i:032x}"


def x(i):
    return torch.randn(1024, generator=torch.Generator().manual_seed(i))


def bump_version(raw, delta=1):
    """The blob re-headed as format FORMAT_VERSION + delta, header checksum recomputed."""
    magic, ver, res, n = struct.unpack_from("<8sHHI", raw)
    head = struct.pack("<8sHHI", magic, ver + delta, res, n) + bytes(raw[16:16 + n])
    return head + xxhash.xxh3_128_digest(head) + bytes(raw[32 + n:])


def test_crafted_header_verifies_except_for_its_version():
    t = torch.zeros(4)
    head = fmt.encode_header(k(1), M, t, fmt.checksum(fmt.tensor_bytes(t)))
    with pytest.raises(fmt.OtherVersion) as e:
        fmt.decode_header(bump_version(head))
    assert e.value.version == fmt.FORMAT_VERSION + 1
    assert fmt.decode_header(bump_version(bump_version(head), -1)).key == k(1)


def test_other_version_file_is_skipped_at_open_and_on_load_never_deleted(tmp_path):
    t = DiskTier(tmp_path, 1 << 24)
    assert t.spill(k(1), x(1), M).ok and t.spill(k(2), x(2), M).ok
    path = tmp_path / (k(1) + ".hkv")
    path.write_bytes(bump_version(path.read_bytes()))          # another version's k(1)
    t2 = DiskTier(tmp_path, 1 << 24)
    assert t2.keys() == [k(2)] and t2.stats["scan_other_version"] == 1 and path.exists()
    assert t2.refresh() == 0 and path.exists()
    dst = torch.full((1024,), 3.0)
    r = t.load(k(1), dst, M, timeout=10)                       # t indexed it before
    assert r.status is LoadStatus.MISS and "version" in r.reason, r
    assert bool((dst == 3.0).all()) and path.exists() and t.state(k(1)) == "absent"
    assert not t.spill(k(1), x(1), M).ok                       # never overwritten either
    assert fmt.decode_header(bump_version(path.read_bytes(), -1)).key == k(1)


def test_other_version_value_on_redis_is_never_deleted():
    with redis_server() as srv:
        t = DiskTier(capacity_bytes=1 << 24, backend=srv.backend())
        assert t.spill(k(1), x(1), M).ok
        c, name = srv.backend().client, b"hkv:" + (k(1) + ".hkv").encode()
        c.set(name, bump_version(c.get(name)))
        t2 = DiskTier(capacity_bytes=1 << 24, backend=srv.backend())
        assert t2.keys() == [] and t2.stats["scan_other_version"] == 1 and c.exists(name)
        r = t.load(k(1), torch.zeros(1024), M, timeout=10)
        assert r.status is LoadStatus.MISS and c.exists(name)


def _other_version_process(d, q):
    fmt.FORMAT_VERSION += 1                   # this process writes and reads the next format
    t = DiskTier(d, 1 << 24)
    out = {"indexed": t.keys(), "skipped": t.stats["scan_other_version"]}
    out["spilled"] = t.spill(k(20), x(20), M).ok
    dst = torch.zeros(1024)
    out["own"] = t.load(k(20), dst, M, timeout=10).ok and bool(torch.equal(dst, x(20)))
    out["theirs"] = t.load(k(10), torch.zeros(1024), M, timeout=10).status.value
    out["overwrite"] = t.spill(k(10), x(10), M).ok
    t.close()
    q.put(out)


def test_two_processes_of_different_versions_keep_each_others_blobs(tmp_path):
    t = DiskTier(tmp_path, 1 << 24)
    assert t.spill(k(10), x(10), M).ok
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_other_version_process, args=(str(tmp_path), q))
    p.start()
    got = q.get(timeout=120)
    p.join(30)
    assert p.exitcode == 0 and got == {"indexed": [], "skipped": 1, "spilled": True,
                                       "own": True, "theirs": "miss", "overwrite": False}
    assert sorted(os.listdir(tmp_path)) == [k(10) + ".hkv", k(20) + ".hkv"]
    assert t.refresh() == 0 and t.stats["scan_other_version"] == 1
    dst = torch.zeros(1024)
    assert t.load(k(10), dst, M, timeout=10).ok and torch.equal(dst, x(10))
    assert DiskTier(tmp_path, 1 << 24).keys() == [k(10)]
    assert sorted(os.listdir(tmp_path)) == [k(10) + ".hkv", k(20) + ".hkv"]
