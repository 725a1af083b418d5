"""A local disk tier in a temp dir with the fault hooks the engine fuzzer drives: the next n
reads fail with EIO (hybridkv.disk.backend.HookedBackend, as in the tier's fault matrix), and
published files are damaged in place (truncated, or a bit flipped in the header or payload),
like hybridkv.testing.faults does."""
import errno
import os
import shutil
import tempfile
import threading

from hybridkv.disk.backend import HookedBackend
from hybridkv.disk.format import CorruptObject, decode_header
from hybridkv.disk.local import LocalBackend
from hybridkv.disk.tier import DiskTier

DAMAGE = ("truncate", "flip_payload", "flip_header")


class FaultyTier:
    def __init__(self, small=False):
        self.dir = tempfile.mkdtemp(prefix="hybridkv-fuzz-")
        self._fail, self._lock = [0], threading.Lock()
        backend = HookedBackend(LocalBackend(self.dir), self._hook)
        self.tier = DiskTier(self.dir, capacity_bytes=(1 << 19) if small else (1 << 26),
                             backend=backend)

    def _hook(self, op, name):
        if op != "read":
            return
        with self._lock:
            if self._fail[0] <= 0:
                return
            self._fail[0] -= 1
        raise OSError(errno.EIO, "injected EIO on read", name)

    def fail_next_reads(self, n):
        with self._lock:
            self._fail[0] = n

    def _files(self):
        out = []
        for f in sorted(os.listdir(self.dir)):
            if not f.endswith(".hkv"):
                continue
            try:
                with open(os.path.join(self.dir, f), "rb") as fh:
                    h = decode_header(fh.read(16384))
            except (CorruptObject, OSError):
                continue
            out.append((os.path.join(self.dir, f), h))
        return out

    def damage(self, mode, pick, n):
        """Damage up to ``n`` object files from index ``pick``; returns how many were
        damaged."""
        files = self._files()
        done = 0
        for i in range(min(n, len(files))):
            path, h = files[(pick + i) % len(files)]
            try:
                if mode == "truncate":
                    os.truncate(path, max(0, os.path.getsize(path) - 1 - pick % 97))
                else:
                    pos = 20 if mode == "flip_header" else \
                        h.payload_off + pick % max(1, h.payload_len)
                    with open(path, "r+b") as fh:
                        fh.seek(pos)
                        b = fh.read(1)
                        fh.seek(pos)
                        fh.write(bytes([b[0] ^ 0x10]))
                done += 1
            except (OSError, IndexError):
                continue
        return done

    def close(self):
        self.tier.close()
        shutil.rmtree(self.dir, ignore_errors=True)
