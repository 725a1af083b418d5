"""Cold recompute with the same chunking: the reference every engine output is checked against.

A fresh NaN-filled cache (physical blocks handed out in the opposite order), the request's
whole recorded schedule from position 0; every generated token must be the argmax of the cold
logits at the position before it.  Returns the number of mismatching tokens (0 = equal)."""
from hybridkv.model.cache import SeqState


def cold_mismatches(model, output, num_blocks=1024):
    seq = list(output.prompt) + list(output.tokens)
    sched = list(output.schedule)
    if not output.tokens:
        return 0
    if not sched or sched[0][0] != 0 or sched[-1][1] != len(seq) - 1 or \
            any(b0 != a1 for (_, b0), (a1, _) in zip(sched, sched[1:])):
        return len(output.tokens)               # the schedule does not tile the sequence
    cache = model.new_cache(num_blocks)
    for free in cache.free_blocks.values():
        free.reverse()
    st = SeqState(cache)
    bad, P = 0, len(output.prompt)
    for a, b in sched:
        logits = model.forward(seq[a:b], st)
        for i in range(a, b):
            if i + 1 >= P and int(logits[i - a].argmax()) != seq[i + 1]:
                bad += 1
    st.free()
    return bad
