"""The checks the engine fuzzer (hybridkv.engine.fuzz) runs, apart from the rules that drive
the engine: every output against a cold recompute with the same chunking, the cache and model
store invariants with draft isolation (every checkpoint held is a prefix of a sequence really
committed), and the per-generation effect counts the fuzzer reports.

A failed check raises ``AssertionError`` whose message starts with what broke ("output
mismatch", "draft isolation", ...); nothing here changes the engine's state."""


def committed_keys(layout, outs):
    """Chain keys of every committed prefix (prompt + generated tokens) of ``outs``."""
    from hybridkv.index import extend_chain, root_key
    keys = set()
    for o in outs:
        root = root_key(layout, o.salt)
        keys.update(extend_chain([], root, list(o.prompt) + list(o.tokens), layout.granule))
    return keys


def check_outputs(model, outs):
    """Each output equals the cold run of ``model`` with the same chunking, and resumed no
    more tokens than its HitPlans offered."""
    from hybridkv.engine import cold_mismatches
    for o in outs:
        bad = cold_mismatches(model, o)
        assert bad == 0, (f"output mismatch: {bad} of {len(o.tokens)} tokens differ "
                          f"from the cold run with the same chunking (prompt "
                          f"{len(o.prompt)} tokens, resumed at "
                          f"{[h.reuse_tokens for h in o.hits]})")
        planned = sum(h.reuse_tokens for h in o.hits)
        assert o.reused_tokens <= planned, \
            f"resumed {o.reused_tokens} tokens past the HitPlans' {planned}"


def effect_counts(before, after, outs):
    """Effect name -> how often it happened between the engine stats ``before`` and
    ``after``, in the generation that returned ``outs``."""
    d = {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int)}
    return {"disk_hit": d["disk_hits"], "disk_spill": d["disk_obj_spills"] +
            d["ckpt_spills"], "ckpt_disk_load": d["ckpt_loads"],
            "load_failure": d["disk_obj_load_failures"] + d["ckpt_load_failures"],
            "recompute_fallback": d["recompute_fallbacks"],
            "recapture_after_relocation": d.get("graph_refused", 0),
            "draft_accepted": sum(o.accepted for o in outs),
            "draft_rejected": sum(o.drafted - o.accepted for o in outs),
            "preemption": sum(o.preemptions for o in outs),
            "prefix_hit": sum(o.reused_tokens > 0 for o in outs)}


def check_state(cache, store, legit):
    """``cache.check_invariants()``; every model checkpoint in ``store`` ends exactly at its
    H; every checkpoint in the prefix index or ``store`` has its chain key in ``legit``."""
    cache.check_invariants()
    for e in store.entries.values():     # nothing past committed tokens
        assert e.schedule[-1][1] == e.H and e.ckpt.H == e.H, \
            f"model checkpoint at H={e.H} ends at {e.schedule[-1][1]}"
    for key, ck in cache.index.ckpts.items():
        assert key in legit, (f"draft isolation: the prefix index holds a "
                              f"checkpoint at H={ck.H} for tokens never committed")
    for (key, _), e in store.entries.items():
        assert key in legit, (f"draft isolation: a model checkpoint at H={e.H} "
                              f"for tokens never committed")
