"""The vLLM judge tier's gate: every vLLM test that fails with hybridkv's KVCacheManager must be
named, with why, in the expectations file; anything else failing fails the gate.

    python scripts/vllm_gate.py EXPECTED LOG [LOG...]

EXPECTED holds one node id pattern per line (``*`` matches anything, nothing else is special:
``test_x[*]`` covers every parameter),
then `` | `` and the reason (``stock fails too: ...`` for tests that fail on stock vLLM as well;
``ours: ...`` for a behaviour difference, naming which side is right).  Blank lines and lines
starting with ``#`` are ignored.  LOG is the output of vLLM's tests run with
``-rfE -p hybridkv.integrations.vllm.pytest_plugin`` (scripts/vllm_judge --ours-only writes
them): the plugin's header line must be there (else the tests ran on vLLM's own manager) and at
least one test must pass.  Exit status 0 = the gate holds; the report lists unexpected failures
and listed tests that now pass (stale entries, to remove).
"""
import re
import sys

HEADER = "hybridkv: vLLM's KVCacheManager is hybridkv.integrations.vllm.KVCacheManager"
OUTCOME = re.compile(r"^(FAILED|ERROR) (\S+)")
SUMMARY = re.compile(r"(\d+) passed")


class GateError(Exception):
    """The expectations file or a log cannot be read as the gate needs; carries the value."""

    def __init__(self, message, value):
        super().__init__(f"{message}: {value!r}")
        self.value = value


def matches(node, pattern):
    """``pattern`` with ``*`` as the only wildcard (brackets are literal, as in node ids)."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), node) is not None


def read_expected(text):
    """pattern -> reason; a line without `` | reason`` is refused (every entry says why)."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern, sep, reason = line.partition(" | ")
        if not sep or not reason.strip() or not pattern.strip():
            raise GateError(f"line {n}: expected 'NODEID | reason'", line)
        out[pattern.strip()] = reason.strip()
    return out


def read_log(text):
    """(failing node ids, passed count) of one pytest log; refuses a log without the plugin."""
    if HEADER not in text:
        raise GateError("the log does not show hybridkv's plugin active", text[:200])
    failing = {m.group(2) for m in map(OUTCOME.match, text.splitlines()) if m}
    passed = [int(m.group(1)) for m in SUMMARY.finditer(text)]
    return failing, (passed[-1] if passed else 0)


def gate(expected, logs):
    """(ok, report lines)."""
    failing, passed = set(), 0
    for text in logs:
        f, p = read_log(text)
        failing |= f
        passed += p
    unexpected = sorted(t for t in failing
                        if not any(matches(t, pat) for pat in expected))
    stale = sorted(pat for pat in expected
                   if not any(matches(t, pat) for t in failing))
    lines = [f"vLLM judge gate: {passed} passed, {len(failing)} failing with hybridkv "
             f"({len(failing) - len(unexpected)} expected, {len(unexpected)} unexpected)"]
    lines += [f"  UNEXPECTED {t}" for t in unexpected]
    lines += [f"  now passing (remove from the list): {p}" for p in stale]
    return (not unexpected and passed > 0), lines


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        expected = read_expected(f.read())
    logs = []
    for path in argv[1:]:
        with open(path, errors="replace") as f:
            logs.append(f.read())
    ok, lines = gate(expected, logs)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
