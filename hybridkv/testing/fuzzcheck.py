"""The checks the engine fuzzer (hybridkv.testing.fuzz) runs, apart from the rules that drive
the engine: every output against a cold recompute (a fresh cache: the model's products are
row-invariant, so any chunking gives the same bits), the cache invariants with draft isolation
(every checkpoint held is a prefix of a sequence really committed), and the per-generation
effect counts the fuzzer reports.

A failed check raises ``AssertionError`` whose message starts with what broke ("output
mismatch", "draft isolation", ...); nothing here changes the engine's state."""


def committed_keys(layout, outs):
    """Chain keys of every committed prefix (prompt + generated tokens) of ``outs``."""
    from hybridkv.cache.index import extend_chain, root_key
    keys = set()
    for o in outs:
        root = root_key(layout, o.salt)
        keys.update(extend_chain([], root, list(o.prompt) + list(o.tokens), layout.granule))
    return keys


def check_outputs(model, outs):
    """Each output equals the cold run of ``model``, and resumed no more tokens than its
    HitPlans offered (a request the cache refused for good carries its error instead)."""
    from hybridkv.engine import cold_mismatches
    for o in outs:
        if o.error is not None:
            continue
        bad = cold_mismatches(model, o)
        assert bad == 0, (f"output mismatch: {bad} of {len(o.tokens)} tokens differ "
                          f"from the cold run (prompt "
                          f"{len(o.prompt)} tokens, resumed at "
                          f"{[h.reuse_tokens for h in o.hits]})")
        planned = sum(h.reuse_tokens for h in o.hits)
        assert o.reused_tokens <= planned, \
            f"resumed {o.reused_tokens} tokens past the HitPlans' {planned}"


def effect_counts(before, after, outs, disk_before=None, disk_after=None):
    """Effect name -> how often it happened between the engine stats ``before`` and
    ``after`` (and the disk link's counts), in the generation that returned ``outs``."""
    d = {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int)}
    dk = {k: (disk_after or {}).get(k, 0) - (disk_before or {}).get(k, 0)
          for k in ("spilled", "load_verified", "load_miss")}
    return {"disk_hit": d["disk_hits"], "disk_spill": dk["spilled"],
            "disk_load": dk["load_verified"], "load_failure": dk["load_miss"],
            "recapture_after_relocation": d.get("graph_refused", 0),
            "replan": d.get("replans", 0) + d.get("launch_refused", 0),
            "draft_accepted": sum(o.accepted for o in outs),
            "draft_rejected": sum(o.drafted - o.accepted for o in outs),
            "preemption": sum(o.preemptions for o in outs),
            "refused_request": sum(o.error is not None for o in outs),
            "prefix_hit": sum(o.reused_tokens > 0 for o in outs)}


def check_state(cache, legit):
    """``cache.check_invariants()``; every checkpoint and object in the prefix index has its
    chain key in ``legit`` (draft isolation, end to end); no request is left registered."""
    cache.check_invariants()
    for key, ck in cache.index.ckpts.items():
        assert key in legit, (f"draft isolation: the prefix index holds a "
                              f"checkpoint at H={ck.H} for tokens never committed")
    for pk, m in list(cache.index.chain.items()) + list(cache.index.exact.items()):
        bad = [k for k in m if k not in legit]
        assert not bad, (f"draft isolation: the prefix index holds {len(bad)} {pk} objects "
                         f"for tokens never committed")
    assert not cache.requests, f"requests left registered: {sorted(cache.requests)}"
