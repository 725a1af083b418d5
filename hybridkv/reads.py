"""CacheManager methods: taking a plan (pin), giving it back (unpin), the TOCTOU re-check
right before a launch (begin_read), and kernel ABI changes."""
from hybridkv.errors import BadArgument, RequestBusy, StaleRead
from hybridkv.calls import locked
from spec.funnel import can_read_pinned
from spec.state import HELD, LOOKED, RUNNING


def _count(name, v, minimum=0):
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise BadArgument(f"{name} must be an int >= {minimum}", v)


@locked
def pin(self, request_id):
    req = self._req(request_id)
    if req.phase != LOOKED:
        raise RequestBusy("pin needs a looked-up request", request_id)
    self._take_plan(req)
    return req.plan

@locked
def unpin(self, request_id):
    req = self._req(request_id)
    if req.phase not in (HELD, RUNNING) or req.own or req.L != req.plan.reuse_tokens:
        raise RequestBusy("unpin only a pinned request that wrote nothing", request_id)
    self._release_reads(req)
    req.phase, req.L, req.A = LOOKED, 0, 0

def read_ok(self, read):
    rec = self.pools[(read.ref.kind, read.ref.group)].recs[read.ref.block]
    return can_read_pinned(rec.pins, read.ver, rec.ver, read.ep, rec.ep)

@locked
def set_kernel_version(self, kind, group, kernel_version):
    """The kernel for (kind, group) now expects another ABI; objects stored with the old
    one fail funnel layer 2 until rewritten."""
    if (kind, group) not in self.pools:
        raise BadArgument("no such pool", (kind, group))
    _count("kernel_version", kernel_version)
    self.pools[(kind, group)].abi = self.layout.abi(kind, self.layout.group(group),
                                                    kernel_version)

@locked
def begin_read(self, request_id):
    """Right before a launch: every pinned object still pinned, same version, same
    address (spec can_read_pinned); raises StaleRead and changes nothing otherwise."""
    req = self._req(request_id)
    if req.phase not in (HELD, RUNNING):
        raise RequestBusy("begin_read needs pinned objects", request_id)
    for r in req.reads:
        if not self.read_ok(r):
            raise StaleRead("pinned object changed before the read", tuple(r.ref))
    req.phase = RUNNING

