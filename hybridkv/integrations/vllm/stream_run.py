"""One request stream through vLLM's real Scheduler: ``schedule()`` then
``update_from_output()`` with a synthetic model output, step after step.

The model output samples one token for every scheduled request whose computed tokens reach its
known tokens (a finished prefill or a decode step; a partial prefill chunk samples nothing, as
vLLM's model runner discards it); requests stop at their trace output length (``max_tokens``,
EOS ignored). Requests arrive by their trace timestamps on a simulated clock that advances
``ms_per_step`` per step (and jumps to the next arrival when nothing is left to run); a prompt
of ``max_model_len`` tokens or more is refused on arrival, as vLLM's input processor refuses it
(``refused``). ``StreamRun`` records per step its time (schedule + update_from_output, ns) and
per admission (an allocation that takes a waiting or preempted request in) the hit the
Scheduler adopted; ``explain(request, hit, new_computed_blocks)``, when given, runs at each
admission before the allocation (the cache as the lookup saw it) and its answer is kept with
the admission; its time is taken out of the step's.  Every ``allocate_slots`` call's own time is
recorded too, by what the call does (``CALL_KINDS``, ``call_kind``): where the step time goes.
"""
import time
import zlib
from dataclasses import dataclass, field

from vllm.sampling_params import SamplingParams
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

VOCAB = 32_000
MAX_IDLE_STEPS = 1_000          # steps in a row that schedule nothing before StreamStalled
CALL_KINDS = ("prefill", "decode within a block", "decode completing a block",
              "decode opening a block")


class StreamStalled(RuntimeError):
    """The Scheduler scheduled nothing for MAX_IDLE_STEPS steps with requests left (the
    value: the step number and the waiting request ids)."""


@dataclass(frozen=True)
class StreamRequest:
    request_id: str
    arrival_ms: float
    prompt: list            # token ids
    output_tokens: int      # tokens to generate before it finishes
    hash_ids: tuple = ()    # the trace's block ids (for the report's traces)


@dataclass
class Admission:
    request_id: str
    step: int
    hit_tokens: int         # the local prefix hit the Scheduler adopted
    num_tokens: int         # the request's known tokens at admission
    resumed: bool           # re-admitted after a preemption
    why: object = None      # explain(...)'s answer


@dataclass
class StreamResult:
    step_ns: list = field(default_factory=list)
    arrival_ns: list = field(default_factory=list)  # per request: made (vLLM hashes its
    # blocks) and added to the Scheduler (hybridkv prepares it): outside the steps
    admissions: list = field(default_factory=list)
    preemptions: int = 0
    evictions: int = 0      # cached blocks the manager dropped to make room
    finished: int = 0
    steps: int = 0
    refused: list = field(default_factory=list)    # arrivals vLLM's input checks refuse
    wall_s: float = 0.0
    call_ns: dict = field(default_factory=lambda: {k: [] for k in CALL_KINDS})  # per
    # CALL_KINDS: each allocate_slots call's time (inside the steps' time)


def call_kind(num_computed_tokens, num_new_tokens, block_size):
    """What an ``allocate_slots`` call does, by the request's position in its block (the
    Scheduler's ``block_size``): a prefill chunk (more than one new token), or a decode step
    whose token stays inside a block, is a block's last (the block completes: the manager
    caches it) or a block's first (a new block is allocated)."""
    if num_new_tokens > 1:
        return "prefill"
    at = num_computed_tokens % block_size
    return "decode opening a block" if at == 0 else "decode completing a block" \
        if at == block_size - 1 else "decode within a block"


def decode_token(request_id, index):
    """The synthetic sampled token ``index`` of a request (deterministic)."""
    return (zlib.crc32(request_id.encode()) + index * 104729) % VOCAB


class StreamRun:
    """Drives one Scheduler over one stream (see the module docstring)."""

    def __init__(self, scheduler, block_hasher, requests, ms_per_step=50.0, explain=None):
        self.scheduler, self.block_hasher = scheduler, block_hasher
        self.requests = sorted(requests, key=lambda r: r.arrival_ms)
        self.ms_per_step, self.explain = ms_per_step, explain
        self.result = StreamResult()
        self.live = {}                  # request id -> vLLM Request (every one added)
        self.untimed_ns = 0             # explain's time inside the current step
        self._watch(scheduler.kv_cache_manager)
        self._count_evictions(scheduler.kv_cache_manager)

    def _watch(self, manager):
        """Record every admission the Scheduler makes (its allocate_slots call)."""
        allocate, result = manager.allocate_slots, self.result
        waiting = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        block_size, call_ns = self.scheduler.block_size, result.call_ns

        def allocate_slots(request, num_new_tokens, num_new_computed_tokens=0,
                           new_computed_blocks=None, **kwargs):
            admitting, why = request.status in waiting, None
            if admitting and self.explain is not None:
                t0 = time.perf_counter_ns()
                why = self.explain(request, num_new_computed_tokens, new_computed_blocks)
                self.untimed_ns += time.perf_counter_ns() - t0
            kind = call_kind(request.num_computed_tokens, num_new_tokens, block_size)
            t0 = time.perf_counter_ns()
            got = allocate(request, num_new_tokens, num_new_computed_tokens=
                           num_new_computed_tokens, new_computed_blocks=new_computed_blocks,
                           **kwargs)
            call_ns[kind].append(time.perf_counter_ns() - t0)
            if got is not None and admitting:
                result.admissions.append(Admission(
                    request.request_id, result.steps, num_new_computed_tokens,
                    request.num_tokens, request.num_preemptions > 0, why))
            return got
        manager.allocate_slots = allocate_slots

    def _count_evictions(self, manager):
        """vLLM's BlockPool: each cached block it evicts; hybridkv: its eviction metric."""
        pool, result = manager.block_pool, self.result
        evict = getattr(pool, "_maybe_evict_cached_block", None)
        if evict is None:
            return

        def counted(block):
            evicted = evict(block)
            result.evictions += bool(evicted)
            return evicted
        pool._maybe_evict_cached_block = counted

    def _add(self, spec):
        if len(spec.prompt) >= self.scheduler.max_model_len:
            self.result.refused.append(spec.request_id)     # as vLLM's input processor: no
            return                                          # room for one output token
        params = SamplingParams(max_tokens=max(1, spec.output_tokens), ignore_eos=True)
        prompt = list(spec.prompt)
        t0 = time.perf_counter_ns()
        request = Request(spec.request_id, prompt, params, None,
                          arrival_time=spec.arrival_ms / 1000, block_hasher=self.block_hasher)
        self.scheduler.add_request(request)
        self.result.arrival_ns.append(time.perf_counter_ns() - t0)
        self.live[spec.request_id] = request

    def _model_output(self, scheduler_output):
        req_ids = list(scheduler_output.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            r = self.live[rid]
            done = r.num_computed_tokens >= r.num_tokens
            sampled.append([decode_token(rid, r.num_output_tokens)] if done else [])
        return ModelRunnerOutput(req_ids=req_ids,
                                 req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                                 sampled_token_ids=sampled)

    def run(self):
        s, res, clock, nxt, idle = self.scheduler, self.result, 0.0, 0, 0
        start = time.perf_counter()
        while nxt < len(self.requests) or s.has_unfinished_requests():
            while nxt < len(self.requests) and self.requests[nxt].arrival_ms <= clock:
                self._add(self.requests[nxt])
                nxt += 1
            if not s.has_unfinished_requests():
                clock = self.requests[nxt].arrival_ms
                continue
            self.untimed_ns = 0
            t0 = time.perf_counter_ns()
            out = s.schedule()
            t1 = time.perf_counter_ns()
            model_output = self._model_output(out)
            t2 = time.perf_counter_ns()
            s.update_from_output(out, model_output)
            res.step_ns.append(t1 - t0 + time.perf_counter_ns() - t2 - self.untimed_ns)
            res.steps += 1
            clock += self.ms_per_step
            idle = 0 if out.total_num_scheduled_tokens else idle + 1
            if idle >= MAX_IDLE_STEPS:
                raise StreamStalled("the Scheduler schedules nothing", (
                    res.steps, [r.request_id for r in s.waiting][:20]))
        res.wall_s = time.perf_counter() - start
        res.preemptions = sum(r.num_preemptions for r in self.live.values())
        cache = getattr(s.kv_cache_manager, "cache", None)          # hybridkv's CacheManager
        if cache is not None:
            res.evictions = sum(cache.metrics.evictions.values())
        res.finished = sum(r.is_finished() for r in self.live.values())
        return res
