"""hk.Engine on one memory: continuous batching (one forward per step), prefix reuse only at
the HitPlan's H, salts, preemption, speculative drafts, the graph guard; every output equals
a cold run."""
import pytest

import hybridkv as hk
from hybridkv.engine import Engine, NgramDrafter, cold_mismatches
from hybridkv.errors import BadArgument, BadSalt

M = hk.V4Mini(seed=0)
SYS = [(7 * i + 3) % 250 for i in range(30)]


def mk(blocks=64, **kw):
    return Engine(M, hk.CacheManager(M.layout(), num_blocks=blocks, checked=True), **kw)


def cold_ok(e):
    return [cold_mismatches(M, o) for o in e.last_outputs]


def test_reuse_at_plan_H_and_cold_equal():
    e = mk()
    out = e.generate([SYS], 6)[0]
    p2 = SYS + out + [1, 2, 3]
    e.generate([p2], 5)
    o = e.last_outputs[0]
    assert o.reused_tokens == o.hits[0].reuse_tokens > 0
    assert cold_ok(e) == [0]
    e.cache.check_invariants()


def test_salts_isolate_tenants():
    e = mk()
    e.generate([SYS], 3, salts=[b"a"])
    e.generate([SYS + [1]], 3, salts=[b"b"])
    assert e.last_outputs[0].reused_tokens == 0
    e.generate([SYS + [1]], 3, salts=[b"a"])
    assert e.last_outputs[0].reused_tokens > 0


def test_batch_is_one_forward_per_step_and_matches_cold_runs():
    e = mk(max_running=8)
    calls, fwd = [], M.forward

    def counting(batch, cache):
        calls.append(len(batch))
        return fwd(batch, cache)
    e.model = type("Counted", (), {"forward": staticmethod(counting), "layout": M.layout})()
    prompts = [SYS[:10 + i] for i in range(5)]
    e.generate(prompts, 4)
    e.model = M
    assert max(calls) == 5                    # five requests in one launch set
    assert cold_ok(e) == [0] * 5


def test_batch_with_preemption_matches_cold_runs():
    e = mk(blocks=8, max_running=4)      # short on the requests' own blocks: snapshots give way
    outs = e.generate([SYS[:12], SYS[:16] + [9] * 8, SYS[:20], [3] * 14], 5)
    assert all(len(o) == 5 for o in outs)
    assert sum(o.preemptions for o in e.last_outputs) > 0
    assert cold_ok(e) == [0] * 4
    e.cache.check_invariants()


def test_speculative_equals_greedy_and_drafts_counted():
    prompts = [[5, 6, 7, 8] * 6, SYS * 2]
    spec = mk(num_draft_tokens=3)
    got = spec.generate(prompts, 16)
    assert got == mk().generate(prompts, 16)
    assert sum(o.drafted for o in spec.last_outputs) > 0
    assert sum(o.accepted for o in spec.last_outputs) > 0
    assert cold_ok(spec) == [0, 0]


def test_rejected_drafts_never_published():
    from hybridkv.cache.index import extend_chain, root_key
    e = mk(num_draft_tokens=3)
    e.generate([[5, 6, 7, 8] * 6, SYS * 2], 12)
    legit = set()
    for o in e.last_outputs:
        legit.update(extend_chain([], root_key(e.cache.layout, o.salt),
                                  list(o.prompt) + list(o.tokens), e.cache.layout.granule))
    for m in list(e.cache.index.chain.values()) + list(e.cache.index.exact.values()):
        assert set(m) <= legit


def test_graph_guard_recaptures_after_relocation():
    e = mk()
    e.generate([SYS[:10]], 4)
    caps = e.graph.captures
    e.graph.relocate()
    out = e.generate([SYS[:12]], 4)
    assert e.graph.refused >= 1 and e.graph.captures == caps + 1
    assert cold_ok(e) == [0] and out == mk().generate([SYS[:12]], 4)


def test_graph_reads_the_managers_window_pages():
    """The captured gather reads the cache's own pool through the request's page table."""
    from hybridkv.engine.graph import DecodeGraph
    from hybridkv.model import SeqWork
    cache = hk.CacheManager(M.layout(), num_blocks=32)
    cache.lookup("g", SYS[:12])
    cache.allocate("g", 12)
    g = DecodeGraph(cache)
    tab = cache.tables("g")
    w = SeqWork([1], 12, tab, {}, 1)
    got = g.step(w)
    pool = cache.layer_pools(0)["swa"]["kv"]
    slots = [s for s in tab["swa"].swa if s >= 0]
    assert got.shape[0] == len(slots) and all(
        got[i].data_ptr() != pool[s].data_ptr() for i, s in enumerate(slots))
    import torch
    assert all(torch.equal(got[i].nan_to_num(7), pool[s].nan_to_num(7))
               for i, s in enumerate(slots))


def test_drafter_and_bad_input():
    assert NgramDrafter(2).propose([1, 2, 3, 1, 2]) == [3, 1]
    assert NgramDrafter(2).propose([1, 2, 3]) == []
    e = mk()
    with pytest.raises(BadSalt):
        e.generate([[1, 2]], 2, salts=["x"])
    with pytest.raises(BadArgument):
        e.generate([[1, 2]], -1)
    with pytest.raises(BadArgument):
        Engine(M, hk.CacheManager(hk.ModelLayout.v4_mini(block_size=32)))   # not its layout


def test_demo_json_reports_reuse_and_no_mismatch(capsys):
    import argparse
    import json

    from hybridkv.commands import demo
    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    rc = demo.run(p.parse_args(["--json", "--tenants", "2", "--conversations", "1",
                                "--turns", "2", "--new-tokens", "4", "--no-proof"]))
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["mismatches"] == 0 and d["requests"] == 2 * 1 * (2 + 1)
    assert d["reuse_tokens"] > 0 and d["reuse_tokens"] == d["plan_reuse_tokens"]
    assert d["snapshot_bytes_restored"] > 0
    # the turn after the restart resumed from verified disk loads into pool blocks
    assert d["disk"]["disk_hits"] == 2 and d["disk"]["object_loads_verified"] > 0
    assert [r["from_disk"] for r in d["requests_detail"]] == [0, 0, 0, 0, 1, 1]


def test_worked_embedding_example_matches_engine():
    from hybridkv.engine.embedding import serve_one
    cache = hk.CacheManager(M.layout(), num_blocks=64, checked=True)
    out1, _, h1 = serve_one(M, cache, SYS, b"t", 5)
    p2 = SYS + out1 + [3, 4, 5]
    out2, sched, h2 = serve_one(M, cache, p2, b"t", 5)
    assert h1 == 0 and h2 > 0 and sched[0][0] == h2
    assert out1 == mk().generate([SYS], 5)[0] and out2 == mk().generate([p2], 5)[0]
    cache.check_invariants()
