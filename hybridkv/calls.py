"""The one lock discipline: every public CacheManager call runs under the manager's
re-entrant lock; in checked mode the outermost call asserts the invariants before releasing
it (hybridkv.checked.check_call: the state the call touched, plus a periodic full sweep)."""
import functools

from hybridkv.checked import check_call


def locked(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        with self.lock:
            if not self.checked:
                return fn(self, *args, **kwargs)
            depth = getattr(self, "call_depth", 0)
            self.call_depth = depth + 1
            try:
                out = fn(self, *args, **kwargs)
            finally:
                self.call_depth = depth
            if args and isinstance(args[0], (str, int)):
                self.touched_reqs = getattr(self, "touched_reqs", set()) | {args[0]}
            if not depth:
                check_call(self)
            return out
    return wrapper
