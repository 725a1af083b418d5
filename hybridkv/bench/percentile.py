"""The one percentile convention of the benchmarks: nearest rank (the smallest sample with at
least q% of the samples at or below it).  Stdlib only: ``vllm_side.py`` runs it as a sibling
module under vLLM's interpreter, ``hybridkv_side`` and ``replay`` import it from the package."""


def nearest_rank(sorted_vals, q):
    """The q-th percentile (0 < q <= 100) of an ascending list; None when it is empty."""
    n = len(sorted_vals)
    if not n:
        return None
    return sorted_vals[min(n - 1, max(0, -(-q * n // 100) - 1))]


def summarize(samples_ns):
    """count, p50, p99, mean, max in microseconds of samples in nanoseconds."""
    if not samples_ns:
        return {"count": 0, "p50": None, "p99": None, "mean": None, "max": None}
    s = sorted(samples_ns)
    n = len(s)
    return {"count": n, "p50": round(nearest_rank(s, 50) / 1000, 3),
            "p99": round(nearest_rank(s, 99) / 1000, 3),
            "mean": round(sum(s) / n / 1000, 3), "max": round(s[-1] / 1000, 3)}
