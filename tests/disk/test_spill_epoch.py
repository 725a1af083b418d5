"""Failed spills against real storage (a local directory whose writes fail with ENOSPC through a
FileOps subclass, a real redis-server at maxmemory with noeviction): the tier's epoch grows
only when a failed spill might now succeed, and a donated tensor is written without a copy."""
import errno
import os

import torch

from hybridkv.disk import DiskMeta, DiskTier, FileOps, LocalBackend
from hybridkv.disk.spill import private_bytes
from tests.disk.redis_server import redis_server
from tests.disk.blobs import k, x as blob

M = DiskMeta("swa", abi=5, tok_lo=0, tok_hi=64)


def x(i, n=4096):
    return blob(i, n)


class FullDisk(FileOps):
    """Every write fails with ENOSPC while ``full``, as on a file system with no space."""

    def __init__(self):
        self.full = True

    def write(self, fd, mv):
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(fd, mv)


def test_epoch_grows_on_publish_drop_and_capacity_never_on_a_failed_spill(tmp_path):
    ops = FullDisk()
    t = DiskTier(tmp_path, 1 << 20, backend=LocalBackend(tmp_path, ops))
    e0 = t.epoch
    r = t.spill(k(1), x(1), M)
    assert not r.ok and r.reason == "io: ENOSPC" and t.epoch == e0
    ops.full = False
    assert t.spill(k(2), x(2), M).ok and t.epoch == e0 + 1        # the backend takes writes
    assert t.spill(k(2), x(2), M).reason == "exists" and t.epoch == e0 + 1
    assert t.discard(k(2)) and t.epoch == e0 + 2                  # bytes freed
    t.capacity = 1 << 21
    assert t.epoch == e0 + 3
    t.close()


def test_full_redis_fails_without_moving_the_epoch():
    with redis_server() as srv:
        t = DiskTier(capacity_bytes=1 << 26, backend=srv.backend())
        admin = srv.backend().client
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", admin.info("memory")["used_memory"] + (16 << 10))
        e0 = t.epoch
        r = t.spill(k(1), x(1), M)
        assert not r.ok and r.reason == "io: ENOSPC" and t.epoch == e0
        admin.config_set("maxmemory", 0)
        assert t.spill(k(1), x(1), M).ok and t.epoch == e0 + 1
        t.close()


def test_donated_tensor_is_kept_others_are_copied_once():
    a = torch.arange(64, dtype=torch.float32)
    assert private_bytes(a, donated=True).data_ptr() == a.data_ptr()
    copy = private_bytes(a)
    assert copy.data_ptr() != a.data_ptr() and torch.equal(copy.view(torch.float32), a)
    strided = torch.arange(128, dtype=torch.float32).view(8, 16)[:, ::2]
    got = private_bytes(strided)                       # .contiguous() was the one copy
    assert got.data_ptr() != strided.data_ptr()
    assert torch.equal(got.view(torch.float32), strided.reshape(-1))


def test_donated_spill_round_trips(tmp_path):
    t = DiskTier(tmp_path, 1 << 20)
    src = x(7)
    h = t.spill_async(k(7), src.clone(), M, donate=True)
    assert h.result(10).ok
    dst = torch.zeros_like(src)
    assert t.load(k(7), dst, M, timeout=10).ok and torch.equal(dst, src)
    t.close()
