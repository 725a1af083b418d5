"""Checks of the stream tier (hybridkv/integrations/vllm/stream*.py) and of DeepSeek-V4 through
the adapter, on vLLM's real Scheduler and specs: run under the vLLM venv by
tests/integrations/test_vllm_stream.py (this file imports vllm, so it is not named test_*)."""
import pytest

from hybridkv import ModelLayout
from hybridkv.bench.traces import DEFAULT_VOCAB
from hybridkv.integrations.vllm import UnsupportedSpec
from hybridkv.integrations.vllm.stream import mooncake_requests, run_shape
from hybridkv.integrations.vllm.stream_run import StreamRequest, StreamRun
from hybridkv.integrations.vllm.stream_setup import (build_scheduler, kv_cache_config,
                                                     v4_layer_specs, vllm_config)

MAX_LEN = 16384


def test_v4_layout_maps_vllms_packed_groups():
    config = kv_cache_config("v4", vllm_config("v4", 3000, MAX_LEN, 8, 2048), 3000)
    layout = ModelLayout.from_vllm(config)
    got = sorted((g.kind, g.block_size, g.window) for g in layout.groups)
    assert got == [("full", 256, 0), ("swa", 4, 8), ("swa", 8, 128), ("swa", 64, 128),
                   ("swa", 64, 128)]
    assert layout.granule == 4                      # hits on any 4-token boundary


def test_a_bounded_replay_window_is_refused_by_name():
    from dataclasses import replace
    config = kv_cache_config("v4", vllm_config("v4", 3000, MAX_LEN, 8, 2048), 3000)
    group = config.kv_cache_groups[0]
    group.kv_cache_spec = replace(group.kv_cache_spec, bounded_replay=True)
    with pytest.raises(UnsupportedSpec, match="SlidingWindowMLASpec"):
        ModelLayout.from_vllm(config)


def turns(n_turns, first_len, grow, seed=0):
    """A conversation: each turn's prompt is the previous one plus ``grow`` new tokens."""
    import random
    rng = random.Random(seed)
    prompt, out = [rng.randrange(DEFAULT_VOCAB) for _ in range(first_len)], []
    for t in range(n_turns):
        out.append(StreamRequest(f"t{t}", 1000.0 * t, list(prompt), 3))
        prompt += [rng.randrange(DEFAULT_VOCAB) for _ in range(grow)]
    return out


def hits(side, shape, requests, num_blocks=4000):
    scheduler, hasher = build_scheduler(side, shape, num_blocks, MAX_LEN, 8, 2048)
    result = StreamRun(scheduler, hasher, requests).run()
    assert result.finished == len(requests)
    return {a.request_id: a.hit_tokens for a in result.admissions}, scheduler


def test_v4_multi_turn_resumes_past_vllms_256_token_boundary():
    # 1000-token first turn, +300 each turn: vLLM resumes at the previous prompt's end
    # rounded down to 256 (its replay boundary), hybridkv at the previous prompt's last
    # granule boundary before its last token (its ``repeat`` point: 996, 1296).  An
    # allocation's provisional end rounds down to the engine's block (``end_every``, 256 in
    # the adapter since 3e258bb), so the prompt end itself (1000, 1300) is no checkpoint.
    requests = turns(3, 1000, 300)
    stock, _ = hits("stock", "v4", requests)
    ours, scheduler = hits("ours", "v4", requests)
    assert stock == {"t0": 0, "t1": 768, "t2": 1280}
    assert ours == {"t0": 0, "t1": 996, "t2": 1296}
    kv = scheduler.kv_cache_manager
    # ids index vLLM's one pool: one arena page per vLLM block id, id 0 is vLLM's null block
    assert kv.num_pages <= kv.kv_cache_config.num_blocks - 1


@pytest.mark.parametrize("shape", ["full", "full+swa", "v4"])
def test_short_mooncake_stream_is_consistent(shape):
    requests = mooncake_requests(12)
    report = run_shape(shape, requests, 40000, 50.0, 8)
    for side in ("stock", "ours"):
        assert report[side]["finished"] == 12 and report[side]["admissions"] >= 12
    assert report["stock_incomplete"] == []          # vLLM sound on this stream
    diffs = report["differences"]
    if shape == "full":                              # room for every block: the same hits
        assert diffs == [] and report["ours"]["hit_tokens"] == report["stock"]["hit_tokens"]
    if shape == "v4":                                # never shorter than vLLM's
        assert all(d["shorter"] == "stock" for d in diffs)
    for d in diffs:
        assert d["groups_below_longer_hit"]          # the shorter side names its groups
        if d["shorter"] == "ours":   # full+SWA: vLLM keeps every window block, hybridkv
            # checkpoints; and it resumes on an in-flight writer's blocks, hybridkv never
            if d["ours_short_because"].startswith("in flight"):
                assert {r["check"] for r in d["ours_rejections"]
                        if r["H"] == d["stock_hit"]} == {"readable"}
            else:
                assert d["ours_chain_tokens"] >= d["stock_hit"]
                assert d["ours_short_because"].startswith("no hybridkv checkpoint")


def test_v4_specs_cover_every_layer_kind():
    specs = v4_layer_specs((0, 4, 128))
    suffixes = sorted(name.split("attn")[1] for name in specs)
    assert suffixes == ["", "", ".compressor.state_cache", ".compressor.state_cache",
                        ".indexer.compressor.state_cache", ".indexer.k_cache",
                        ".swa_cache", ".swa_cache", ".swa_cache"]


@pytest.mark.parametrize("side", ["stock", "ours"])
def test_a_prompt_past_max_model_len_is_refused_on_arrival(side):
    """A prompt of max_model_len tokens or more never reaches the Scheduler (vLLM's input
    processor refuses it): the stream goes on without stalling and reports it refused."""
    requests = turns(3, 900, 300)
    too_long = StreamRequest("long", 1500.0, list(range(MAX_LEN)), 3)
    scheduler, hasher = build_scheduler(side, "full", 4000, MAX_LEN, 8, 2048)
    result = StreamRun(scheduler, hasher, [*requests, too_long]).run()
    assert result.refused == ["long"] and result.finished == len(requests)
    assert {a.request_id for a in result.admissions} == {r.request_id for r in requests}


def _arrived(scheduler, hasher, spec):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request
    request = Request(spec.request_id, list(spec.prompt), SamplingParams(max_tokens=3), None,
                      block_hasher=hasher)
    scheduler.add_request(request)
    return request


@pytest.mark.parametrize("shape", ["full", "full+swa", "v4"])
def test_arrival_hashes_the_prompt_so_the_steps_hash_nothing_again(shape, monkeypatch):
    """hybridkv's Scheduler prepares a new request on arrival (its ids translated, its chain
    keys hashed): the lookups its steps make hash no granule again."""
    import hybridkv.cache.manager as core
    scheduler, hasher = build_scheduler("ours", shape, 4000, MAX_LEN, 8, 2048)
    kv = scheduler.kv_cache_manager
    spec = turns(1, 1500, 0)[0]
    _arrived(scheduler, hasher, spec)
    rid = spec.request_id
    keys = kv.cache.requests[rid].chain_keys
    assert rid in kv.prompt_ids and len(keys) >= 1000 // kv.layout.granule
    hashed = []
    extend = core.extend_chain

    def counted(keys, *args, **kw):
        before = len(keys)
        out = extend(keys, *args, **kw)
        hashed.append(len(out) - before)
        return out
    monkeypatch.setattr(core, "extend_chain", counted)
    scheduler.schedule()
    assert hashed and sum(hashed) == 0                  # looked up in the step, nothing hashed
    assert kv.tracked[rid].started


def test_arrival_preparation_changes_no_hit():
    """The same stream with and without the preparation on arrival: the same admissions and
    hits (the step's lookup makes the plan, against the cache as it is then)."""
    from hybridkv.integrations.vllm import KVCacheManager
    requests = turns(4, 700, 200) + mooncake_requests(6)
    with_arrival, _ = hits("ours", "full+swa", requests)
    prepare = KVCacheManager.prepare
    try:
        KVCacheManager.prepare = lambda self, request: None
        without, _ = hits("ours", "full+swa", requests)
    finally:
        KVCacheManager.prepare = prepare
    assert with_arrival == without and any(with_arrival.values())


def test_a_request_aborted_before_its_first_step_leaves_nothing_behind():
    from vllm.v1.request import RequestStatus
    scheduler, hasher = build_scheduler("ours", "full", 4000, MAX_LEN, 8, 2048)
    kv = scheduler.kv_cache_manager
    spec = turns(1, 600, 0)[0]
    _arrived(scheduler, hasher, spec)
    assert spec.request_id in kv.cache.requests            # looked up on arrival
    scheduler.finish_requests(spec.request_id, RequestStatus.FINISHED_ABORTED)
    assert spec.request_id not in kv.cache.requests
    assert spec.request_id not in kv.tracked and spec.request_id not in kv.prompt_ids


def test_at_most_max_prepared_tokens_wait_prepared(monkeypatch):
    """A deep queue holds at most MAX_PREPARED_TOKENS prompt tokens' ids and keys from
    arrival; later arrivals are prepared by the step that first looks them up, and every one
    is admitted with the hit an unbounded preparation gives."""
    import hybridkv.integrations.vllm.manager as adapter
    requests = turns(5, 600, 150)                 # prompts of 600, 750, 900, ... tokens
    unbounded, _ = hits("ours", "full", requests)
    monkeypatch.setattr(adapter, "MAX_PREPARED_TOKENS", 1400)
    scheduler, hasher = build_scheduler("ours", "full", 4000, MAX_LEN, 8, 2048)
    kv = scheduler.kv_cache_manager
    for spec in requests:
        _arrived(scheduler, hasher, spec)
    assert sorted(kv.prepared) == ["t0", "t1"] and sorted(kv.prompt_ids) == ["t0", "t1"]
    assert kv.prepared_tokens == sum(kv.prepared.values()) <= 1400
    assert "t4" not in kv.cache.requests
    bounded, _ = hits("ours", "full", requests)
    assert bounded == unbounded and any(unbounded.values())
    scheduler.schedule()
    started = {rid for rid, t in kv.tracked.items() if t.started}
    assert started and not kv.prepared.keys() & started     # started ones leave the set
    assert kv.prepared_tokens == sum(kv.prepared.values())


@pytest.mark.parametrize("side", ["stock", "ours"])
def test_each_allocate_slots_call_is_timed_under_what_it_does(side):
    # one request alone: a 40-token prompt in one chunk, then 20 output tokens -- the first
    # sampled from the prefill, each other one a decode step at positions 40 .. 58
    scheduler, hasher = build_scheduler(side, "full", 4000, MAX_LEN, 8, 2048)
    result = StreamRun(scheduler, hasher, [StreamRequest("a", 0.0, list(range(1, 41)), 20)]).run()
    assert result.finished == 1
    bs = scheduler.block_size
    decode = {"decode opening a block": [p for p in range(40, 59) if p % bs == 0],
              "decode completing a block": [p for p in range(40, 59) if p % bs == bs - 1]}
    decode["decode within a block"] = [p for p in range(40, 59) if p % bs not in (0, bs - 1)]
    counts = {kind: len(ns) for kind, ns in result.call_ns.items()}
    assert counts == {"prefill": 1, **{kind: len(at) for kind, at in decode.items()}}
    assert counts["decode opening a block"] and counts["decode completing a block"]
    assert all(t > 0 for ns in result.call_ns.values() for t in ns)
    assert sum(map(sum, result.call_ns.values())) <= sum(result.step_ns)


def test_call_kind_follows_the_position_in_the_block():
    from hybridkv.integrations.vllm.stream_run import call_kind
    cases = {(0, 40): "prefill", (32, 2): "prefill", (48, 1): "decode opening a block",
             (0, 1): "decode opening a block", (47, 1): "decode completing a block",
             (15, 1): "decode completing a block", (49, 1): "decode within a block",
             (46, 1): "decode within a block"}
    assert {case: call_kind(*case, 16) for case in cases} == cases
