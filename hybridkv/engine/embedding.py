"""Worked example: the scheduler-facing API an external engine calls, one request, no Engine.

    import hybridkv as hk
    from hybridkv.engine import CheckpointStore
    from hybridkv.engine.embedding import serve_one
    model = hk.V4Mini(seed=0)
    cache = hk.CacheManager(hk.ModelLayout.v4_mini(), num_blocks=64)
    store = CheckpointStore(cache)                  # model state keyed like the prefix index
    toks, sched, H = serve_one(model, cache, store, prompt, b"tenant", max_new_tokens=4)

Per step the external engine (1) looks up the prompt and resumes only at plan.reuse_tokens,
from the model state it stored under that prefix's key (or recomputes [0, H) if it has none);
(2) allocates the chunk (AdmissionRefused: preempt someone, or wait); (3) re-checks its pinned
objects with begin_read right before the first launch; (4) runs the model; (5) commits the
chunk's token ids and stores its model state where the manager recorded a checkpoint; (6) frees
the request at the end (its last aligned checkpoint stays for the next turn).
"""
from hybridkv.model.cache import SeqState


def serve_one(model, cache, store, prompt, salt, max_new_tokens, chunk=8, rid="embed"):
    """Greedy generation of one request; returns (generated tokens, chunk schedule, the
    position it resumed at: the plan's H if the model state was stored, else 0)."""
    seq = list(prompt)
    plan = cache.lookup(rid, seq, salt)                           # (1)
    H = plan.reuse_tokens
    e = store.get(seq, salt, H) if H else None
    mc = model.new_cache(256)
    st = SeqState.restore(mc, e.ckpt) if e else SeqState(mc)
    sched = list(e.schedule) if e else []
    resumed = H if e else 0
    begun, out = False, []
    try:
        while len(out) < max_new_tokens:
            L = st.length
            n = min(len(seq) - L, chunk - L % chunk)
            if L + n < len(seq) and n > 1 and (L + n) % cache.layout.granule:
                n -= (L + n) % cache.layout.granule
            if L >= H:
                cache.allocate(rid, n)                            # (2)
                if not begun:
                    cache.begin_read(rid)                         # (3)
                    begun = True
            logits = model.forward(seq[L:L + n], st)              # (4)
            sched.append((L, L + n))
            if L >= H:
                cache.commit(rid, n, seq[L:L + n])                # (5)
                store.put(seq, salt, st, sched)
            if st.length == len(seq):
                out.append(int(logits[-1].argmax()))
                seq.append(out[-1])
    finally:
        cache.free(rid)                                           # (6)
        st.free()
    return out, sched, resumed
