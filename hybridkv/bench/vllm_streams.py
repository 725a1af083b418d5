"""Request streams for the vLLM side of the side-by-side benchmark, and the runner that feeds one
to `vllm_side.py` under the separate vLLM environment (`scripts/vllm_venv`).

A stream is the JSON object `vllm_side.py` reads: the manager config plus
`requests: [{"id", "prompt": [token ids], "decode_steps"}]`. Streams:
  tiny_stream      a few requests sharing prefixes, plus an exact repeat (tests)
  mooncake_stream  the first N requests of a Mooncake-format trace, each hash id expanded to the
                   same token ids the hybridkv replay uses (`traces.request_token_ids`)
  decode_stream    N random prompts, half of them sharing one prefix, each decoding S steps

CLI: python -m hybridkv.bench.vllm_streams {tiny,mooncake,decode} -o STREAM.json [options]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys

from hybridkv.bench.shipped import DEFAULT_TRACE, trace_path
from hybridkv.bench.traces import DEFAULT_VOCAB, read_mooncake, request_token_ids

VLLM_PYTHON_ENV = "HYBRIDKV_VLLM_PYTHON"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "hybridkv", "bench", "vllm_side.py")


def manager_config(attention: str = "full", mode: str = "serial", block_size: int = 16,
                   sliding_window: int = 128, retention_interval: int | None = 512,
                   num_blocks: int = 20000, max_model_len: int = 200_000,
                   num_kv_heads: int = 8, head_size: int = 128, dtype: str = "bfloat16",
                   warmup: int = 0) -> dict:
    """The non-request part of a stream. `retention_interval` only applies to full+swa (vLLM
    rejects it without a sliding-window group; the driver then uses 0)."""
    if attention not in ("full", "full+swa"):
        raise ValueError(f"attention must be 'full' or 'full+swa': {attention!r}")
    if mode not in ("serial", "decode"):
        raise ValueError(f"mode must be 'serial' or 'decode': {mode!r}")
    return {"attention": attention, "block_size": block_size, "sliding_window": sliding_window,
            "retention_interval": retention_interval, "num_kv_heads": num_kv_heads,
            "head_size": head_size, "dtype": dtype, "num_blocks": num_blocks,
            "max_model_len": max_model_len, "mode": mode, "warmup": warmup}


def _random_tokens(rng: random.Random, n: int, vocab: int = DEFAULT_VOCAB) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def tiny_stream(attention: str = "full", mode: str = "serial", seed: int = 0,
                decode_steps: int = 20, **config) -> dict:
    """Five requests: r0..r3 share a 64-token prefix (then 40 own tokens each), r4 repeats r0's
    prompt exactly. Block size 16, window 32, retention 32 unless overridden."""
    rng = random.Random(seed)
    shared = _random_tokens(rng, 64)
    requests = [{"id": f"r{i}", "prompt": shared + _random_tokens(rng, 40),
                 "decode_steps": decode_steps} for i in range(4)]
    requests.append({"id": "r4", "prompt": list(requests[0]["prompt"]),
                     "decode_steps": decode_steps})
    config = {"sliding_window": 32, "retention_interval": 32, "num_blocks": 400,
              "max_model_len": 4096, **config}
    return {**manager_config(attention, mode, **config), "requests": requests}


def mooncake_stream(trace_spec: str, limit: int = 300, decode_steps: int = 4,
                    attention: str = "full", mode: str = "serial", **config) -> dict:
    """The first `limit` requests of a Mooncake-format trace (512-token hash blocks; a shipped
    trace's name or a path, shipped.trace_path), expanded to token ids as the hybridkv replay
    does, each decoding `decode_steps` steps."""
    trace = read_mooncake(trace_path(trace_spec), limit=limit)
    requests = [{"id": f"m{i}", "prompt": request_token_ids(trace, req),
                 "decode_steps": decode_steps} for i, req in enumerate(trace.requests)]
    return {**manager_config(attention, mode, **config), "requests": requests}


def decode_stream(num_requests: int = 32, decode_steps: int = 256, prompt_len: int = 2000,
                  shared_prefix_len: int = 1024, shared_fraction: float = 0.5, seed: int = 0,
                  attention: str = "full", **config) -> dict:
    """`num_requests` random `prompt_len`-token prompts; every other request (shared_fraction of
    them, evenly spread) starts with one common `shared_prefix_len`-token prefix. Mode decode."""
    rng = random.Random(seed)
    shared = _random_tokens(rng, shared_prefix_len)
    num_shared = round(num_requests * shared_fraction)
    stride = num_requests / num_shared if num_shared else 0
    sharing = {int(k * stride) for k in range(num_shared)}
    requests = []
    for i in range(num_requests):
        prefix = shared if i in sharing else []
        requests.append({"id": f"d{i}",
                         "prompt": prefix + _random_tokens(rng, prompt_len - len(prefix)),
                         "decode_steps": decode_steps})
    return {**manager_config(attention, "decode", **config), "requests": requests}


def write_stream(path: str, stream: dict) -> None:
    with open(path, "w") as f:
        json.dump(stream, f, separators=(",", ":"))


def find_vllm_python() -> str | None:
    """$HYBRIDKV_VLLM_PYTHON, else ../vllm-venv/bin/python beside the repo; None if neither is an
    executable file."""
    candidate = os.environ.get(VLLM_PYTHON_ENV) or os.path.join(
        os.path.dirname(REPO_ROOT), "vllm-venv", "bin", "python")
    return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None


def vllm_import_failure(python: str, timeout_s: float = 300) -> str | None:
    """None when `python` imports vllm (isolated, as run_vllm_side runs it); else why not: the
    exit status and the last line of stderr (e.g. "ModuleNotFoundError: No module named
    'vllm'"), or the timeout."""
    try:
        proc = subprocess.run([python, "-I", "-c", "import vllm"], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"{python} -I -c 'import vllm' did not finish in {timeout_s} s"
    except OSError as e:
        return f"{python} cannot run: {e}"
    if proc.returncode == 0:
        return None
    last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
    return f"{python} cannot import vllm (exit {proc.returncode}): {last}"


def run_vllm_side(python: str, stream_path: str, timeout_s: float = 600,
                  footprint: bool = False) -> dict:
    """Run vllm_side.py on a stream under `python` (isolated: no PYTHONPATH, no script folder on
    sys.path) and return its JSON; `footprint`: its bookkeeping-bytes pass instead of the timed
    replay. Raises RuntimeError with stderr's tail on failure."""
    proc = subprocess.run([python, "-I", SCRIPT, *(["--footprint"] if footprint else []),
                           stream_path], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm_side.py exited {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridkv.bench.vllm_streams",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("tiny", "mooncake", "decode"))
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--attention", choices=("full", "full+swa"), default="full")
    parser.add_argument("--mode", choices=("serial", "decode"), default=None,
                        help="tiny/mooncake: default serial; decode streams are always decode")
    parser.add_argument("--num-blocks", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--sliding-window", type=int, default=128)
    parser.add_argument("--retention-interval", type=int, default=512)
    parser.add_argument("--max-model-len", type=int, default=200_000)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--trace", default=DEFAULT_TRACE,
                        help="a shipped trace's name or a Mooncake JSONL file")
    parser.add_argument("--limit", type=int, default=300, help="mooncake: first N requests")
    parser.add_argument("--decode-steps", type=int, default=None,
                        help="default 4 (mooncake), 256 (decode), 20 (tiny)")
    parser.add_argument("--num-requests", type=int, default=32, help="decode stream")
    parser.add_argument("--prompt-len", type=int, default=2000, help="decode stream")
    parser.add_argument("--shared-prefix-len", type=int, default=1024, help="decode stream")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = {"block_size": args.block_size, "sliding_window": args.sliding_window,
              "retention_interval": args.retention_interval,
              "max_model_len": args.max_model_len, "warmup": args.warmup}
    if args.num_blocks is not None:
        config["num_blocks"] = args.num_blocks
    if args.kind == "tiny":
        stream = tiny_stream(args.attention, args.mode or "serial", args.seed,
                             args.decode_steps or 20, **config)
    elif args.kind == "mooncake":
        stream = mooncake_stream(args.trace, args.limit,
                                 4 if args.decode_steps is None else args.decode_steps,
                                 args.attention, args.mode or "serial", **config)
    else:
        stream = decode_stream(args.num_requests,
                               256 if args.decode_steps is None else args.decode_steps,
                               args.prompt_len, args.shared_prefix_len, seed=args.seed,
                               attention=args.attention, **config)
    write_stream(args.output, stream)
    print(f"{args.output}: {len(stream['requests'])} requests, "
          f"{sum(len(r['prompt']) for r in stream['requests'])} prompt tokens", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
