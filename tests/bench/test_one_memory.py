"""bench one-memory: requests sharing a cached prefix hold one copy of it (their own bytes do
not grow with the prefix); a hit copies only the snapshots (constant in H)."""
from hybridkv.bench import one_memory as O


def test_sharing_holds_the_prefix_once():
    rows = O.sharing(P=256, counts=(1, 4), blocks=256)
    one, four = rows
    assert one["cached_prefix_bytes"] == four["cached_prefix_bytes"] > 0
    assert one["per_request_bytes"] == four["per_request_bytes"]
    assert four["kv_bytes_held"] - one["kv_bytes_held"] == 3 * one["per_request_bytes"]
    assert O.sharing(P=512, counts=(1,), blocks=256)[0]["per_request_bytes"] == \
        one["per_request_bytes"]                       # own bytes independent of P


def test_a_hit_copies_only_the_snapshots():
    a, b = O.per_hit(lengths=(64, 256), blocks=256)
    assert a["bytes_copied"] == b["bytes_copied"] > 0
    assert b["before_bytes_copied"] > a["before_bytes_copied"]
