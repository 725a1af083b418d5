"""The adapter's per-request id cache (``TranslatedIds``) gives exactly ``token_ids`` of the
request as it grows (tokens appended, block hashes computed later, multimodal placeholders),
and is rebuilt for another request object or hash block size.  No vLLM needed: the
translation reads only a request's ``all_token_ids`` / ``block_hashes`` / ``num_tokens``."""
import pytest
from hypothesis import given, settings, strategies as st

from hybridkv.integrations.vllm.translate import TranslatedIds, known_positions, token_ids


class FakeRequest:
    def __init__(self):
        self.all_token_ids, self.block_hashes = [], []

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([0, 4, 16]), st.lists(st.tuples(
    st.lists(st.integers(-3, 300), max_size=40), st.integers(0, 60)), min_size=1, max_size=8))
def test_cached_ids_equal_a_fresh_translation_as_the_request_grows(bs, steps):
    req = FakeRequest()
    ids = TranslatedIds(req, bs)
    for new_tokens, ask in steps:
        req.all_token_ids += new_tokens
        if bs:
            while len(req.block_hashes) < req.num_tokens // bs:
                req.block_hashes.append(len(req.block_hashes).to_bytes(8, "big") * 4)
        end = min(ask, known_positions(req, bs))
        prefix = ids.upto(end)
        assert prefix.source.ids(prefix.end) == token_ids(req, 0, end, bs)
    assert ids.fits(req, bs) and not ids.fits(FakeRequest(), bs) and not ids.fits(req, bs + 1)


def _reference_ids(req, start, end, bs):
    """token_ids position by position, as its rule reads: a placeholder -t -> 2**62 + t, the
    last position of hash block j -> the low 62 bits of the first 8 bytes of hash j."""
    out = []
    for p in range(start, end):
        t = req.all_token_ids[p]
        if bs and (p + 1) % bs == 0:
            h = req.block_hashes[(p + 1) // bs - 1]
            h = h if isinstance(h, int) else int.from_bytes(bytes(h)[:8], "big")
            out.append(h & ((1 << 62) - 1))
        else:
            out.append(t if t >= 0 else (1 << 62) - t)
    return out


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([0, 1, 4, 16]), st.lists(st.integers(-5, 300), max_size=70),
       st.data(), st.booleans())
def test_token_ids_match_the_per_position_rule(bs, tokens, data, int_hashes):
    req = FakeRequest()
    req.all_token_ids = tokens
    for j in range(len(tokens) // bs if bs else 0):
        req.block_hashes.append(j * 7919 + (1 << 63) if int_hashes else
                                (j * 7919).to_bytes(8, "big") * 4)
    start = data.draw(st.integers(0, len(tokens)))
    end = data.draw(st.integers(start, len(tokens)))
    assert token_ids(req, start, end, bs) == _reference_ids(req, start, end, bs)


def test_token_ids_refuse_a_block_end_whose_hash_is_not_computed():
    req = FakeRequest()
    req.all_token_ids, req.block_hashes = list(range(40)), [b"\x01" * 32]
    assert token_ids(req, 0, 31, 16)[15] == int.from_bytes(b"\x01" * 8, "big") & ((1 << 62) - 1)
    with pytest.raises(IndexError, match="block hash not computed"):
        token_ids(req, 0, 32, 16)
