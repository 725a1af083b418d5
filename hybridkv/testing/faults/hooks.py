"""Hooks for HookedBackend (hybridkv.disk.backend): inject an OSError on an operation, hold
one until an event is set, or slow one down."""
import errno
import threading
import time


def fail_on(op, err=errno.EIO, times=1 << 30, after=0):
    """A hook raising OSError(err) on the ``after``-th and following calls of ``op``."""
    seen = [0]
    lock = threading.Lock()

    def hook(o, name):
        if o != op:
            return
        with lock:
            seen[0] += 1
            n = seen[0]
        if after < n <= after + times:
            raise OSError(err, f"injected {errno.errorcode[err]} on {op}", name)
    return hook


def gate(op, event, timeout=10.0):
    """A hook that blocks ``op`` (one name or a collection of them) until ``event`` is set
    (holds a load in flight, or hangs the whole backend)."""
    ops = {op} if isinstance(op, str) else set(op)

    def hook(o, name):
        if o in ops and not event.wait(timeout):
            raise OSError(errno.ETIMEDOUT, "gate never opened", name)
    return hook


def slow(op, seconds):
    def hook(o, name):
        if o == op:
            time.sleep(seconds)
    return hook
