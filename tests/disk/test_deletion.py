"""Only a copy verified damaged in our own format is deleted, and only while it is still the
damaged copy: a blob republished under the same name meanwhile (by another process) is
kept and adopted by the next refresh.  Locally and on Redis."""
import os

import torch

from hybridkv.disk import DiskMeta, DiskTier, HookedBackend, LoadStatus, LocalBackend
from hybridkv.disk.blobs import remove_if_unchanged
from tests.disk.redis_server import redis_server

M = DiskMeta("swa", abi=7, tok_lo=0, tok_hi=64)


def k(i):
    return f"{i:032x}"


def x(i):
    return torch.randn(64, 64, generator=torch.Generator().manual_seed(i))


class OnPayloadRead:
    """Runs ``action`` once, when a load reads its payload (the second read)."""

    def __init__(self):
        self.reads, self.action = 0, None

    def __call__(self, op, name):
        if op == "read" and self.action is not None:
            self.reads += 1
            if self.reads == 2:
                self.action()
                self.action = None


def blob_bytes(tmp, i, seed):
    """A valid blob of key k(i) holding x(seed), written by a separate tier."""
    t = DiskTier(tmp, 1 << 24)
    assert t.spill(k(i), x(seed), M).ok
    return (tmp / (k(i) + ".hkv")).read_bytes()


def test_remove_if_unchanged_keeps_a_changed_blob(tmp_path):
    b = LocalBackend(tmp_path)
    b.put(k(1) + ".hkv", [b"A" * 100])
    assert not remove_if_unchanged(b, k(1) + ".hkv", b"B" * 100)
    assert remove_if_unchanged(b, k(1) + ".hkv", b"A" * 100)
    assert not remove_if_unchanged(b, k(1) + ".hkv", b"A" * 100)     # already gone


def test_local_copy_republished_mid_load_is_not_deleted(tmp_path):
    d, fresh = tmp_path / "tier", blob_bytes(tmp_path / "other", 1, 1)
    hook = OnPayloadRead()
    t = DiskTier(d, 1 << 24, backend=HookedBackend(LocalBackend(d), hook))
    assert t.spill(k(1), x(1), M).ok
    path = d / (k(1) + ".hkv")

    def damage_then_republish():
        with open(path, "r+b") as f:            # the loader's open inode is damaged ...
            f.seek(5000)
            b = f.read(1)
            f.seek(5000)
            f.write(bytes([b[0] ^ 1]))
        tmp = d / "republish"
        tmp.write_bytes(fresh)
        os.replace(tmp, path)                   # ... and a valid copy replaces the name
    hook.action = damage_then_republish
    dst = torch.full((64, 64), 2.0)
    r = t.load(k(1), dst, M, timeout=10)
    assert r.status is LoadStatus.MISS and "checksum" in r.reason and bool((dst == 2.0).all())
    assert path.read_bytes() == fresh and t.state(k(1)) == "absent"
    assert t.refresh() == 1 and t.load(k(1), dst, M, timeout=10).ok and torch.equal(dst, x(1))


def test_redis_value_replaced_mid_read_is_a_miss_that_keeps_the_new_value(tmp_path):
    other = blob_bytes(tmp_path, 1, 2)                 # same key, other content
    with redis_server() as srv:
        hook = OnPayloadRead()
        t = DiskTier(capacity_bytes=1 << 24, backend=HookedBackend(srv.backend(), hook))
        assert t.spill(k(1), x(1), M).ok
        c, name = srv.backend().client, b"hkv:" + (k(1) + ".hkv").encode()
        hook.action = lambda: c.set(name, other)
        dst = torch.full((64, 64), 2.0)
        r = t.load(k(1), dst, M, timeout=10)
        assert r.status is LoadStatus.MISS and "checksum" in r.reason, r
        assert bool((dst == 2.0).all()) and c.get(name) == other
        assert t.refresh() == 1 and t.load(k(1), dst, M, timeout=10).ok
        assert torch.equal(dst, x(2))
