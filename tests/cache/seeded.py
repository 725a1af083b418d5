"""Old defects of issue 20, seeded back from outside the product (monkeypatch seams): the tests
that must find them import these."""
from hybridkv.cache.admission import Admission
from hybridkv.cache.eviction import Evictor


def old_counting(monkeypatch):
    """Admission counts every cached block (a blocked one too), as before the fix."""
    monkeypatch.setattr(Evictor, "available",
                        lambda self, pk: self.pools[pk].n_free + len(self.cached[pk]))
    monkeypatch.setattr(Evictor, "takeable",
                        lambda self, ref: ref.block in self.cached[(ref.kind, ref.group)])


def unreserved_spills(monkeypatch):
    """Eviction makes room without reserving the allocation: spills enter transit beside
    nothing, the allocation's blocks go on top (the old order)."""
    def make_room(self, need, subs=None):
        for pk, k in need.items():
            self.evictor.make_room(pk, k)
    monkeypatch.setattr(Admission, "make_room", make_room)
