"""A looked-up request asked again (an engine re-asks a waiting request every step) reuses the
chain keys of the prefix it already hashed: the plan and the keys are those a fresh lookup
computes, and nothing is reused across a changed token or another tenant's salt."""
from hybridkv.cache.index import extend_chain, root_key
from tests.cache.helpers import LAY, P40, mk, run


def fresh_keys(tokens, salt=b""):
    return extend_chain([], root_key(LAY, salt), tokens, LAY.granule)


def test_a_repeated_lookup_hashes_only_the_new_granules(monkeypatch):
    m = mk()
    run(m, "a", P40)                                    # something to hit
    longer = P40 + [5, 6, 7, 8, 9, 10, 11, 12, 13]
    m.lookup("b", P40[:33])
    from hybridkv.cache import index
    hashed = []
    real = index.hashlib.blake2b
    monkeypatch.setattr(index.hashlib, "blake2b", lambda *a, **k: hashed.append(1) or
                        real(*a, **k))
    plan = m.lookup("b", longer)
    n_before = 33 // LAY.granule
    # the tenant's root key, then only the granules past the 33 tokens hashed before
    assert len(hashed) == 1 + len(longer) // LAY.granule - n_before
    monkeypatch.undo()
    again = mk()
    run(again, "a", P40)
    want = again.lookup("b", longer)
    assert list(plan.chain_keys) == fresh_keys(longer)
    assert plan.reuse_tokens == want.reuse_tokens and plan.candidates == want.candidates


def test_a_changed_token_or_salt_is_hashed_afresh():
    m = mk()
    m.lookup("b", P40)
    changed = list(P40)
    changed[3] = (changed[3] + 1) % 250
    assert list(m.lookup("b", changed).chain_keys) == fresh_keys(changed)
    assert list(m.lookup("b", changed, salt=b"t2").chain_keys) == fresh_keys(changed, b"t2")
    assert fresh_keys(changed, b"t2")[0] != fresh_keys(changed)[0]
