"""Runtime metrics: transition counts per kind and state pair, lookups per outcome and
funnel reason, per-group hit lengths, evictions per kind.  Counting is plain dict updates
on the hot path; ``prometheus_text()`` exposes them through prometheus_client with the
manager's own CollectorRegistry (never the global one)."""
import threading

STATES = ("free", "writing", "ready", "pinned", "loading", "stale")


class Metrics:
    def __init__(self):
        self.transitions = {}     # (kind, from, to) -> count
        self.lookups = {}         # (outcome, reason) -> count
        self.group_hit_tokens = {}
        self.group_lookups = 0
        self.evictions = {}
        self._lock = threading.Lock()
        self._registry = None

    def transition(self, kind, a, b, n=1):
        k = (kind, a, b)
        t = self.transitions
        t[k] = t.get(k, 0) + n

    def lookup(self, plan):
        k = (plan.outcome, plan.reason)
        self.lookups[k] = self.lookups.get(k, 0) + 1
        self.group_lookups += 1
        for g, h in plan.group_hits.items():
            self.group_hit_tokens[g] = self.group_hit_tokens.get(g, 0) + h

    def evicted(self, kind, n=1):
        self.evictions[kind] = self.evictions.get(kind, 0) + n

    def summary(self):
        out = {"hit": 0, "partial": 0, "miss": 0}
        for (outcome, _), n in self.lookups.items():
            out[outcome] += n
        return out

    def as_dict(self):
        return {
            "transitions": {f"{k}:{STATES[a]}->{STATES[b]}": n
                            for (k, a, b), n in sorted(self.transitions.items())},
            "lookups": {f"{o}:{r}": n for (o, r), n in sorted(self.lookups.items())},
            "group_hit_tokens": dict(self.group_hit_tokens),
            "evictions": dict(self.evictions),
            **self.summary(),
        }

    # -- Prometheus -------------------------------------------------------------------------------
    def registry(self):
        from prometheus_client import CollectorRegistry
        with self._lock:
            if self._registry is None:
                self._registry = CollectorRegistry(auto_describe=False)
                self._registry.register(_Collector(self))
        return self._registry

    def prometheus_text(self):
        from prometheus_client import generate_latest
        return generate_latest(self.registry()).decode()


class _Collector:
    def __init__(self, m):
        self.m = m

    def collect(self):
        from prometheus_client.core import CounterMetricFamily
        m = self.m
        t = CounterMetricFamily("hybridkv_transitions", "object state transitions",
                                labels=["kind", "from_state", "to_state"])
        for (k, a, b), n in sorted(m.transitions.items()):
            t.add_metric([k, STATES[a], STATES[b]], n)
        yield t
        lk = CounterMetricFamily("hybridkv_lookups", "lookups by outcome and funnel reason",
                                 labels=["outcome", "reason"])
        for (o, r), n in sorted(m.lookups.items()):
            lk.add_metric([o, r], n)
        yield lk
        g = CounterMetricFamily("hybridkv_group_hit_tokens",
                                "sum over lookups of the tokens each group alone could reuse",
                                labels=["group"])
        for name, n in sorted(m.group_hit_tokens.items()):
            g.add_metric([name], n)
        yield g
        e = CounterMetricFamily("hybridkv_evictions", "evictions per object kind",
                                labels=["kind"])
        for k, n in sorted(m.evictions.items()):
            e.add_metric([k], n)
        yield e
