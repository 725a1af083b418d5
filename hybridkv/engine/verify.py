"""Cold recompute: the reference every engine output is checked against.

A fresh CacheManager (nothing to reuse) and the model run the whole sequence from position 0
in chunks; every generated token must be the argmax of the cold logits at the position before
it.  The model's products are row-invariant (hybridkv.model.v4mini._mm), so the cold logits are
the very bits a warm run computes whatever its chunking: a mismatch is a wrong cache state,
never rounding."""
from hybridkv.model import SeqWork


def cold_logits(model, tokens, chunk=8, num_blocks=None):
    """Logits [len(tokens), vocab] of a cold run (fresh cache, chunks of ``chunk``)."""
    import torch
    from hybridkv.cache import CacheManager
    layout = model.layout()
    n = max(num_blocks or 0, 8 + 2 * len(tokens) // min(g.block_size for g in layout.groups))
    cache = CacheManager(layout, num_blocks=n, device=model.device)
    cache.lookup("cold", tokens)
    out, L = [], 0
    while L < len(tokens):
        k = min(chunk - L % chunk, len(tokens) - L)
        cache.allocate("cold", k)
        pins = {g.name: cache.launch_pins("cold", g.name) for g in layout.groups}
        w = SeqWork(tokens[L:L + k], L, cache.tables("cold"), pins, k)
        out.append(model.forward([w], cache)[0])
        cache.commit("cold", k)
        L += k
    cache.free("cold")
    return torch.cat(out)


def cold_mismatches(model, output, chunk=8):
    """Generated tokens of ``output`` (a RequestOutput) that differ from a cold run's argmax."""
    seq = list(output.prompt) + list(output.tokens)
    if not output.tokens:
        return 0
    logits = cold_logits(model, seq[:-1], chunk)
    P = len(output.prompt)
    return sum(int(logits[i].argmax()) != seq[i + 1] for i in range(P - 1, len(seq) - 1))
