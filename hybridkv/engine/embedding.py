"""Worked example: the calls an external engine makes, one request, no Engine.

    import hybridkv as hk
    from hybridkv.engine.embedding import serve_one
    model = hk.V4Mini(seed=0)
    cache = hk.CacheManager(model.layout(), num_blocks=64)     # the model's KV memory
    tokens, schedule, H = serve_one(model, cache, prompt, b"tenant", max_new_tokens=4)

The numbered flow (docs/ARCHITECTURE.md): (1) look up the prompt; resume only at
plan.reuse_tokens; (2) allocate the next chunk -- the first allocation pins the plan's blocks
and copies the snapshots at H into the request's own blocks (AdmissionRefused: preempt someone
or wait; StaleRead: look up again); (3) right before the launch re-check the pins
(begin_read) and hand every kernel launch the block tables and pins of what it reads; (4) run
the model over the cache's pools and commit the chunk's token ids, ending a commit on every
checkpoint position of the allocation; (5) free the request at the end (its published blocks
and last aligned checkpoint stay for the next turn).
"""
from hybridkv.model import SeqWork


def serve_one(model, cache, prompt, salt, max_new_tokens, chunk=8, rid="embed"):
    """Greedy generation of one request; returns (generated tokens, chunk schedule, the
    position it resumed at)."""
    seq = list(prompt)
    plan = cache.lookup(rid, seq, salt)                              # (1)
    L = H = plan.reuse_tokens
    out, sched = [], []
    groups = [g.name for g in cache.layout.groups]
    try:
        while len(out) < max_new_tokens:
            n = min(len(seq) - L, chunk - L % chunk)
            a = cache.allocate(rid, n)                               # (2)
            cuts = [P for P in a.checkpoints if L < P < L + n] + [L + n]
            for end in cuts:
                cache.begin_read(rid)                                # (3)
                pins = {g: cache.launch_pins(rid, g) for g in groups}
                w = SeqWork(seq[L:end], L, cache.tables(rid), pins, end - L)
                logits = model.forward([w], cache)[0]                # (4)
                cache.commit(rid, end - L, seq[L:end])
                sched.append((L, end))
                L = end
            if L == len(seq):
                out.append(int(logits[-1].argmax()))
                seq.append(out[-1])
    finally:
        cache.free(rid)                                              # (5)
    return out, sched, H
