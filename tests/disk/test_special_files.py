"""FIFOs, device files and symlinks named like blobs: never opened in a blocking way, never
followed, never deleted; the tier opens, probes, loads and refreshes promptly and counts them.
Every call runs in a thread with a deadline so a regression fails instead of hanging CI."""
import os
import stat
import threading

import pytest
import torch

from hybridkv.disk import DiskMeta, DiskTier, LoadStatus

M = DiskMeta("tail", abi=6, tok_lo=0, tok_hi=32)
DEADLINE = 5.0


def k(i):
    return f"{i:032x}"


def x(i):
    return torch.randn(512, generator=torch.Generator().manual_seed(i))


def prompt(fn, *a):
    """fn(*a) in a daemon thread; fails the test if it does not return within DEADLINE."""
    box = {}

    def run():
        try:
            box["v"] = fn(*a)
        except BaseException as e:       # noqa: BLE001 -- re-raised below
            box["e"] = e
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(DEADLINE)
    assert not th.is_alive(), f"{getattr(fn, '__name__', fn)} hung"
    if "e" in box:
        raise box["e"]
    return box["v"]


def unblock(path):
    """Release a reader stuck on a FIFO (only matters when the test already failed)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.fixture
def odd_dir(tmp_path):
    """A tier directory with one real blob k(1), a FIFO k(2), a symlink k(3) to a valid blob
    kept elsewhere, a symlink k(4) to /dev/zero, a directory k(5) and, when mknod is
    allowed, a character device k(6); returns (dir, elsewhere-blob path, special names)."""
    d, other = tmp_path / "tier", tmp_path / "elsewhere"
    t = DiskTier(d, 1 << 24)
    assert t.spill(k(1), x(1), M).ok
    assert DiskTier(other, 1 << 24).spill(k(3), x(3), M).ok
    t.close()
    target = other / (k(3) + ".hkv")
    os.mkfifo(d / (k(2) + ".hkv"))
    os.symlink(target, d / (k(3) + ".hkv"))
    os.symlink("/dev/zero", d / (k(4) + ".hkv"))
    os.mkdir(d / (k(5) + ".hkv"))
    special = [2, 3, 4, 5]
    try:
        os.mknod(d / (k(6) + ".hkv"), stat.S_IFCHR | 0o600, os.makedev(1, 5))
        special.append(6)
    except OSError:
        pass
    yield d, target, special
    unblock(d / (k(2) + ".hkv"))


def test_open_skips_and_counts_special_files_without_touching_them(odd_dir):
    d, target, special = odd_dir
    before = {n: os.lstat(d / n) for n in os.listdir(d)}
    t = prompt(DiskTier, d, 1 << 24)
    assert t.keys() == [k(1)] and t.stats["not_regular"] == len(special)
    assert prompt(t.refresh) == 0
    after = {n: os.lstat(d / n) for n in os.listdir(d)}
    assert {n: (s.st_ino, s.st_mode) for n, s in before.items()} == \
        {n: (s.st_ino, s.st_mode) for n, s in after.items()}
    assert target.exists() and os.path.islink(d / (k(3) + ".hkv"))


def test_queries_and_loads_of_special_names_return_promptly(odd_dir):
    d, target, special = odd_dir
    t = prompt(DiskTier, d, 1 << 24)
    for i in special:
        assert prompt(t.state, k(i)) == "absent"
        assert prompt(t.probe, k(i)).state == "absent"
        dst = torch.full((512,), 9.0)
        r = prompt(t.load, k(i), dst, M, 5.0)
        assert r.status is LoadStatus.MISS and bool((dst == 9.0).all())
    dst = torch.zeros(512)
    assert prompt(t.load, k(1), dst, M, 5.0).ok and torch.equal(dst, x(1))
    assert sorted(os.listdir(d)) == sorted(k(i) + ".hkv" for i in [1] + special)


def test_a_blob_replaced_by_a_fifo_or_symlink_is_a_prompt_miss_and_stays(tmp_path):
    t = DiskTier(tmp_path, 1 << 24)
    for i in (7, 8):
        assert t.spill(k(i), x(i), M).ok
    fifo, link = tmp_path / (k(7) + ".hkv"), tmp_path / (k(8) + ".hkv")
    os.unlink(fifo)
    os.mkfifo(fifo)
    os.unlink(link)
    os.symlink("/dev/zero", link)
    try:
        for i in (7, 8):
            dst = torch.full((512,), 9.0)
            r = prompt(t.load, k(i), dst, M, 5.0)
            assert r.status is LoadStatus.MISS and bool((dst == 9.0).all()), r
            assert prompt(t.state, k(i)) == "absent"
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.path.islink(link)
        r = prompt(t.spill, k(7), x(7), M)                 # never replaces what is not ours
        assert not r.ok and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    finally:
        unblock(fifo)
