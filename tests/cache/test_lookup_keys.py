"""A looked-up request asked again (an engine re-asks a waiting request every step) reuses the
chain keys of the prefix it already hashed: the plan and the keys are those a fresh lookup
computes, and nothing is reused across a changed token or another tenant's salt."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.cache.funnel import candidate_positions
from hybridkv.cache.index import extend_chain, root_key
from hybridkv.errors import BadTokens, UnknownRequest
from hybridkv.layout import ModelLayout
from tests.cache.helpers import LAY, P40, commit_all, commit_tokens, mk, run


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
    # only the granules past the 33 tokens hashed before (the tenant's root key is the one
    # the looked-up request holds: same salt)
    assert len(hashed) == len(longer) // LAY.granule - n_before
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


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), max_size=40), st.integers(0, 45), st.sets(st.integers(-2, 50)))
def test_candidates_are_every_recorded_or_disk_granule_longest_first(recorded, limit, on_disk):
    """candidate_positions (the C-speed scan, an iterator the funnel takes from until a
    position passes) yields exactly the granules i <= limit whose key has a record or that the
    disk names, longest first: the funnel's definition by hand."""
    keys = [bytes([i]) for i in range(len(recorded))]
    ckpts = {k: None for k, r in zip(keys, recorded) if r}
    limit = min(limit, len(keys))
    want = [i * 16 for i in range(limit, 0, -1) if keys[i - 1] in ckpts or i in on_disk]
    assert list(candidate_positions(keys, limit, 16, ckpts, frozenset(on_disk))) == want


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 255), max_size=20), min_size=1, max_size=5),
       st.lists(st.integers(1, 100), min_size=1, max_size=5))
def test_a_checked_tokens_prefix_looks_up_as_its_list(chunks, ends):
    """Looking a growing CheckedTokens up again and again (an engine re-asking a waiting
    request) gives the plan and keys a plain list gives, looked up afresh each time."""
    from hybridkv.cache import CheckedTokens
    m, ref = mk(), mk()
    run(m, "a", P40)
    run(ref, "a", P40)
    source = CheckedTokens(m.vocab, P40[:20])
    for chunk, end in zip(chunks, ends):
        source.extend(chunk)
        end = min(end, len(source))
        plan = m.lookup("b", source.prefix(end))
        ref.requests.pop("b", None)
        want = ref.lookup("b", source.ids(end))
        assert m.requests["b"].token_ids == source.ids(end)
        assert list(plan.chain_keys) == list(want.chain_keys) == fresh_keys(source.ids(end))
        assert (plan.reuse_tokens, plan.candidates) == (want.reuse_tokens, want.candidates)


def test_checked_tokens_refuse_bad_ids_and_a_foreign_vocabulary_is_checked_again():
    """extend checks what it appends (BadTokens, nothing appended); a prefix checked against
    another vocabulary, or a hand-made one, goes through the lookup's own check."""
    import pytest
    from hybridkv.cache import CheckedTokens
    from hybridkv.cache.request import TokenPrefix
    from hybridkv.errors import BadArgument, BadTokens
    source = CheckedTokens(256, [1, 2, 3])
    for bad in ([4, 256], [4, -1], [4, True], [4, 1.0]):
        with pytest.raises(BadTokens):
            source.extend(bad)
        assert len(source) == 3
    with pytest.raises(BadArgument):
        source.prefix(4)
    m = mk()
    wide = CheckedTokens(None, [7, 300])           # no vocabulary: 300 passes here
    with pytest.raises(BadTokens) as e:
        m.lookup("w", wide.prefix(2))
    assert e.value.value == (1, 300) and "w" not in m.requests
    with pytest.raises(BadTokens):
        m.lookup("f", TokenPrefix([7, 300], 2))     # not a CheckedTokens: checked as given


ODD = st.sampled_from([True, False, 1.0, -1, 256, 1 << 63, None, "7", 2 ** 70])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 255), ODD), max_size=40), st.sampled_from([256, None]))
def test_check_tokens_accepts_exactly_plain_ints_in_range_short_or_long(tokens, vocab):
    """check_tokens (a plain loop up to SHORT_TOKENS ids, numpy past it) against its
    definition: plain ints in [0, vocab) (below 2**63 without one); else BadTokens naming
    the first bad id."""
    import pytest
    from hybridkv.cache.request import check_tokens
    from hybridkv.errors import BadTokens
    top = (1 << 63) if vocab is None else vocab
    bad = [(i, t) for i, t in enumerate(tokens) if type(t) is not int or not 0 <= t < top]
    if bad:
        with pytest.raises(BadTokens) as e:
            check_tokens(tokens, vocab)
        assert e.value.value == bad[0]
    else:
        assert check_tokens(tokens, vocab) == tokens


def test_the_same_prefix_asked_again_keeps_its_ids_and_never_aliases_the_source():
    """A waiting request asked again for the same prefix keeps the ids list its last lookup
    copied (no copy of a long prompt per step); the source is never that list: generated
    tokens the request commits later extend the request's ids, not the engine's source."""
    from hybridkv.cache import CheckedTokens
    m = mk()
    run(m, "a", P40)
    source = CheckedTokens(m.vocab, P40)
    m.lookup("b", source.prefix(33))
    ids = m.requests["b"].token_ids
    plan = m.lookup("b", source.prefix(33))
    assert m.requests["b"].token_ids is ids and ids == P40[:33]
    shorter = m.lookup("b", source.prefix(20))                 # another length: its own list
    assert m.requests["b"].token_ids == P40[:20] and shorter.prompt_tokens == 20
    m.lookup("b", source.prefix(33))
    assert m.requests["b"].token_ids == P40[:33] and m.requests["b"].token_ids is not ids
    m.lookup("b", source.prefix(33))
    a = m.allocate("b", 33 - plan.reuse_tokens + 4)
    m.commit("b", 33 - plan.reuse_tokens)
    m.commit("b", 4, [7, 8, 9, 10])                            # generated after the prompt
    assert m.requests["b"].token_ids == P40[:33] + [7, 8, 9, 10] and a.end == 37
    assert len(source) == 40 and source.ids(40) == P40         # the source is untouched


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.lists(st.integers(0, 255), max_size=16),      # loop
                                   st.lists(st.integers(0, 255), min_size=17, max_size=40)),
                          st.booleans()), min_size=1, max_size=6), st.integers(1, 8))
def test_checked_tokens_words_are_its_ids_packed_and_hash_as_the_ids(chunks, granule):
    """CheckedTokens packs its ids once as they arrive (short chunks in a loop, long ones
    through the bulk check's own packing): after every extend, refused ones included, its words
    are its ids as int64, and extend_chain over them gives the keys of the plain ids."""
    from array import array

    import pytest

    from hybridkv.cache import CheckedTokens
    from hybridkv.errors import BadTokens
    source = CheckedTokens(256)
    root = root_key(LAY, b"")
    for chunk, refused in chunks:
        before = (source.ids(len(source)), source.words.tobytes())
        if refused:                       # one id past the vocabulary, at the chunk's end
            with pytest.raises(BadTokens):
                source.extend(chunk + [256])
            assert (source.ids(len(source)), source.words.tobytes()) == before
            continue
        source.extend(chunk)
        ids = source.ids(len(source))
        assert source.words == array("q", ids)
        for end in {0, len(ids) // 2, len(ids)}:
            assert extend_chain([], root, ids[:end], granule, source.words) == \
                extend_chain([], root, ids[:end], granule)
        half = extend_chain([], root, ids[:len(ids) // 2], granule)
        assert extend_chain(list(half), root, ids, granule, source.words) == \
            extend_chain([], root, ids, granule)


def test_known_tokens_are_the_looked_up_prompt_then_the_ids_commits_add():
    """``known_tokens``: a commit inside them needs no ids (the vLLM adapter passes none
    there); past them it must bring the ids, and they extend the count."""
    m = mk()
    m.lookup("a", P40)
    assert m.known_tokens("a") == len(P40)
    commit_all(m, "a", m.allocate("a", len(P40)))          # the prompt: no ids passed
    assert m.known_tokens("a") == len(P40)
    m.allocate("a", 2)
    with pytest.raises(BadTokens):                          # past them: ids needed
        m.commit("a", 2)
    assert m.known_tokens("a") == len(P40)
    m.commit("a", 2, [5, 6])
    assert m.known_tokens("a") == len(P40) + 2
    commit_tokens(m, "a", [9])
    assert m.known_tokens("a") == len(P40) + 3
    with pytest.raises(UnknownRequest):
        m.known_tokens("nobody")


def test_root_key_names_the_layout_its_tenant_and_its_model():
    """The root key every chain hangs from differs with the layout's name, a group, the
    kernel version, the model version and the salt, and is the same for the same layout built
    again (the layout's bytes are fixed at construction, so the key never drifts)."""
    g = LAY.groups[0]
    def build(name=LAY.name, groups=LAY.groups, kv=LAY.kernel_version, mv=LAY.model_version):
        return ModelLayout(groups, name=name, kernel_version=kv, model_version=mv)
    same = root_key(build(), b"")
    assert same == root_key(LAY, b"") == root_key(build(), b"")
    others = [root_key(build(name="other"), b""), root_key(build(kv=LAY.kernel_version + 1), b""),
              root_key(build(mv="other"), b""), root_key(LAY, b"tenant"),
              root_key(build(groups=(g._replace(window=g.window + 1), *LAY.groups[1:])), b"")]
    assert same not in others and len(set(others)) == len(others)
