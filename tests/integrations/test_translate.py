"""The adapter's per-request id cache (``TranslatedIds``) gives exactly ``token_ids`` of the
request as it grows (tokens appended, block hashes computed later, multimodal placeholders),
and is rebuilt for another request object or hash block size.  No vLLM needed: the
translation reads only a request's ``all_token_ids`` / ``block_hashes`` / ``num_tokens``."""
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
