"""Named exceptions of the runtime.  Each carries the offending value as ``value``; an operation
that raises one of them (bad input, refused admission) has changed nothing."""


class CacheError(Exception):
    """Base of the runtime's named errors."""

    def __init__(self, message, value=None):
        super().__init__(f"{message}: {value!r}"[:500])
        self.value = value


class LayoutError(CacheError, ValueError):
    """A layer group or model layout is malformed."""


class LayoutWarning(UserWarning):
    """The layout is legal but hurts hits (e.g. a very coarse LCM of the group block sizes)."""


class BadArgument(CacheError, ValueError):
    """An argument has the wrong type or range (sizes, counts, kinds, object references)."""


class BadTokens(CacheError, ValueError):
    """A token list is not a sequence of ints in [0, vocab); ``value`` is (index, token)."""


class BadSalt(CacheError, TypeError):
    """A tenant salt is not ``bytes``."""


class UnknownRequest(CacheError, KeyError):
    """No request with this id is known to the cache."""


class RequestBusy(CacheError):
    """The request is in a phase that does not allow this call (e.g. lookup while running)."""


class CommitPastAllocation(CacheError, ValueError):
    """A commit would pass the allocated tokens; ``value`` is (requested, available)."""


class DraftsPending(CacheError):
    """The request holds unverified draft tokens; accept or reject them first."""


class AdmissionRefused(CacheError):
    """Allocation refused: the admission cap or a pool cannot take it.  ``value`` is a dict
    naming the pool (or "in_transit") with (needed, available)."""


class RequestTooLarge(AdmissionRefused):
    """Allocation refused for good: even an empty cache could not take it (a pool or the
    transit cap is smaller than what it needs).  ``value`` as for AdmissionRefused."""


class StaleRead(CacheError):
    """The TOCTOU re-check right before a read failed: an object moved or was re-versioned;
    ``value`` is (kind, group, block)."""


class Refused(CacheError):
    """An object-level action is not enabled (its spec guard is false); nothing changed."""


class InvariantViolation(AssertionError):
    """Checked mode: a spec invariant does not hold after a call; ``value`` names it."""

    def __init__(self, name, detail=""):
        super().__init__(f"invariant {name} violated {detail}"[:2000])
        self.value = name
