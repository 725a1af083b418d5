"""hk.Engine with a disk tier: evicted prefixes spill (the manager's objects and the model
checkpoint files), a later request resumes from verified loads, damaged or unreadable files
fall back to a shorter H or a recompute; every output equals a cold run with the same chunking
and a fresh engine's output."""
import pytest
import torch

import hybridkv as hk
from hybridkv.engine import Engine, ckptdisk, cold_mismatches
from hybridkv.engine.fuzzdisk import DAMAGE, FaultyTier
from hybridkv.model.cache import SeqState

M = hk.V4Mini(seed=0)
SYS = [(7 * i + 3) % 250 for i in range(40)]
FIRST = SYS + [1, 2, 3]


def peek(cache, toks):
    plan = cache.lookup("peek", toks)
    cache.free("peek")
    return plan.reuse_tokens


def evicted(fs, bug=None):
    """An engine whose first conversation's longest checkpoint was evicted (and spilled) by
    later unrelated prompts; returns (engine, next prompt, H it had in memory)."""
    cache = hk.CacheManager(hk.ModelLayout.v4_mini(), num_blocks=12,
                            disk=fs.tier if fs is not None else None)
    e = Engine(M, cache, bug=bug)
    p2 = FIRST + e.generate([FIRST], 4)[0] + [9, 9]
    base = peek(cache, p2)
    assert base > 0
    for j in range(12):
        e.generate([[(11 * i + 13 * j + 1) % 250 for i in range(40)]], 2)
        if peek(cache, p2) < base:
            e.store.sync()          # what the next lookup does first: demote, spill the file
            return e, p2, base
    raise AssertionError("nothing was evicted")


@pytest.fixture
def fs():
    f = FaultyTier()
    yield f
    f.close()


def fresh(prompt, n=4):
    return Engine(M, hk.CacheManager(hk.ModelLayout.v4_mini(), num_blocks=64)).generate(
        [prompt], n)[0]


def test_disk_hit_restores_model_state_through_verified_loads(fs):
    e, p2, base = evicted(fs)
    assert e.stats()["ckpt_spills"] >= 1 and e.stats()["disk_obj_spills"] >= 1
    out = e.generate([p2], 4)[0]
    o, s = e.last_outputs[0], e.stats()
    assert o.disk_hits == 1 and o.hits[0].reuse_tokens == base == o.reused_tokens
    assert s["disk_hits"] == 1 and s["disk_obj_loads"] >= 1 and s["ckpt_loads"] == 1
    assert s["ckpt_load_failures"] == 0 and s["recompute_fallbacks"] == 0
    assert cold_mismatches(M, o) == 0 and out == fresh(p2)
    e.cache.check_invariants()


@pytest.mark.parametrize("mode", DAMAGE)
def test_damaged_model_file_falls_back_to_recompute(fs, mode):
    e, p2, base = evicted(fs)
    assert fs.damage(mode, True, 0, 1000) >= 1
    out = e.generate([p2], 4)[0]
    o, s = e.last_outputs[0], e.stats()
    assert o.hits[0].reuse_tokens == base          # the manager's objects loaded fine ...
    assert o.reused_tokens == 0 and s["recompute_fallbacks"] == 1      # ... the state did not
    assert s["ckpt_load_failures"] == 1 and s["ckpt_loads"] == 0 and s["disk_hits"] == 0
    assert cold_mismatches(M, o) == 0 and out == fresh(p2)


def test_damaged_object_files_and_eio_give_a_shorter_hit(fs):
    e, p2, base = evicted(fs)
    assert fs.damage("flip_payload", False, 0, 1000) >= 1
    out = e.generate([p2], 4)[0]
    o, s = e.last_outputs[0], e.stats()
    assert o.hits[0].reuse_tokens < base and s["disk_obj_load_failures"] >= 1
    assert o.disk_hits == 0 and cold_mismatches(M, o) == 0 and out == fresh(p2)
    e.cache.check_invariants()


def test_eio_on_every_read_is_a_miss_never_an_error(fs):
    e, p2, base = evicted(fs)
    fs.fail_next_reads(1000)
    out = e.generate([p2], 4)[0]
    o, s = e.last_outputs[0], e.stats()
    assert s["disk_obj_load_failures"] >= 1 and s["disk_hits"] == 0
    assert o.hits[0].reuse_tokens < base
    assert cold_mismatches(M, o) == 0 and out == fresh(p2)


def test_seeded_ignore_plan_reads_demoted_state_and_is_caught():
    e, p2, base = evicted(None, bug="ignore_plan")      # no disk: the state is gone
    assert e.store.get(p2, b"", base) is None
    lost = e.store.get(p2, b"", base, lost_ok=True)
    assert lost is not None and lost.lost
    gone = {i for g in lost.lost for i in e.cache.layout.group(g).layers}
    for i, lc in enumerate(lost.ckpt.layers):       # evicted groups' layers only are NaN
        assert torch.isnan(lc.swa_rows).all() == (i in gone)
    e.generate([p2], 4)
    o = e.last_outputs[0]
    assert o.reused_tokens > o.hits[0].reuse_tokens          # resumed past the plan
    assert cold_mismatches(M, o) > 0                          # from NaN (evicted) state


def test_ckpt_file_format_roundtrip_and_rejections():
    st = SeqState(M.new_cache(64))
    M.forward(SYS[:23], st)
    ck, sched = st.checkpoint(), ((0, 8), (8, 16), (16, 23))
    buf = ckptdisk.encode(ck, tuple(SYS[:23]), sched)
    assert buf.dtype == torch.uint8 and buf.numel() == ckptdisk.payload_bytes(M.cfg, 23)
    d = ckptdisk.decode(M.cfg, buf, 23)
    assert d.tokens == tuple(SYS[:23]) and d.schedule == sched
    for a, b in zip(ck.layers, d.ckpt.layers):
        for x, y in zip(a, b):
            if isinstance(x, torch.Tensor):
                assert torch.equal(x, y)
            elif x is not None and not isinstance(x, int):
                assert x.start == y.start and torch.equal(x.kv, y.kv) and \
                    torch.equal(x.gate, y.gate)
    with pytest.raises(ckptdisk.BadCheckpointFile):
        ckptdisk.decode(M.cfg, buf, 22)                      # another H: size differs
    bad = buf.clone()
    bad[8 * (3 + 23) + 8] = 5                                 # first chunk's end: 8 -> 5
    with pytest.raises(ckptdisk.BadCheckpointFile):
        ckptdisk.decode(M.cfg, bad, 23)
    with pytest.raises(ckptdisk.BadCheckpointFile):
        ckptdisk.encode(ck, tuple(SYS[:22]), sched)


def test_graph_replay_gathers_the_window_through_the_static_table():
    from hybridkv.engine import DecodeGraph
    mc = M.new_cache(64)
    st, g = SeqState(mc), DecodeGraph(mc)
    M.forward(SYS[:13], st)
    for t in SYS[13:16]:
        L = st.length
        g.step(M, t, st)                     # replay (gather) first, then the eager forward
        bt = g.bufs["block_table"]
        got = g.bufs["window"].reshape(-1, M.cfg.head_dim)[:L]
        want = mc.pools[("swa", 0)][bt.clamp(min=0)].reshape(-1, M.cfg.head_dim)[:L]
        held = (bt >= 0).repeat_interleave(M.cfg.swa_block)[:L]
        assert held.any() and torch.equal(got[held], want[held])
    assert not g.cuda and g.replays == 3 and g.captures == 1 and g.mismatches == 0
    g.relocate(4)                            # new pool tensors: the replay is refused first
    g.step(M, 5, st)
    assert g.refused == 1 and g.captures == 2 and g.kernel.pool is mc.pools[("swa", 0)]
