"""The one lock discipline: every public CacheManager call runs under the manager's
re-entrant lock, and in checked mode asserts the invariants before releasing it."""
import functools


def locked(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        with self.lock:
            out = fn(self, *args, **kwargs)
            if self.checked:
                self.check_invariants()
            return out
    return wrapper
