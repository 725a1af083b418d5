"""Shared by the runtime tests: the V4-mini layout, a 40-token prompt, and one request served
start to finish (no begin_read, no decode)."""
from hybridkv.layout import ModelLayout

LAY = ModelLayout.v4_mini()
P40 = [(7 * i + 3) % 250 for i in range(40)]


def run(m, rid, tokens, salt=b""):
    """lookup + allocate + commit + free; returns the plan."""
    plan = m.lookup(rid, tokens, salt=salt)
    m.allocate(rid, len(tokens) - plan.reuse_tokens)
    m.commit(rid, len(tokens) - plan.reuse_tokens)
    m.free(rid)
    return plan
