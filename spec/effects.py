"""Which effect each memory-machine event applies to the object's record: one map, used by
``step`` and by the runtime's pools alike."""
from spec import common, swa


def unchanged(o, c):
    return o


EFFECTS = {
    "write": common.write,        # (p, draft=0)
    "draft": common.write,        # (p, 1)
    "fill": common.fill,
    "accept": common.accept,
    "publish": common.publish,
    "reject": common.discard,
    "seal": unchanged,
    "pin": common.pin,
    "unpin": common.unpin,
    "relocate": common.relocate,
    "evict": common.evict,        # retiring published content re-versions the block
    "load_start": common.discard,
    "load_ok": common.load_ok,    # (payload,)
    "load_bad": common.discard,
    "slide": swa.slide,
    "mark_stale": unchanged,
    "drop_stale": common.evict,
}
