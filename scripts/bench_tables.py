"""Per-transition cost: the compiled hot-path table vs python-statemachine, one run.

Drives one compressed-KV object through write -> publish -> fill -> seal -> pin -> unpin -> evict
repeatedly, firing the same guard functions both ways.  Prints one JSON object.
"""
import json
import platform
import time

from hybridkv.cache.tables import table_for
from spec import common
from spec.compressed import CompRec, CompressedKVMachine
from spec.config import Ctx, SysConfig

CYCLE = [("write", lambda o, c: common.write(o, c, 5)), ("publish", common.publish),
         ("fill", common.fill), ("seal", None),
         ("pin", common.pin), ("unpin", common.unpin), ("evict", common.evict)]


def run_table(n, c):
    t = table_for(CompressedKVMachine)
    o = CompRec()
    t0 = time.perf_counter()
    for _ in range(n):
        for event, effect in CYCLE:
            st = t.fire(o.st, event, o, c)
            o = (effect(o, c) if effect else o)._replace(st=st)
        o = o._replace(ver=0)
    return (time.perf_counter() - t0) / (n * len(CYCLE))


def run_machine(n, c):
    sm = CompressedKVMachine()
    o = CompRec()
    t0 = time.perf_counter()
    for _ in range(n):
        for event, effect in CYCLE:
            sm.send(event, o=o, c=c)
            o = (effect(o, c) if effect else o)._replace(st=sm.current_state_value)
        o = o._replace(ver=0)
    return (time.perf_counter() - t0) / (n * len(CYCLE))


if __name__ == "__main__":
    c = Ctx(SysConfig(max_ver=10**9), 0)
    table_s, machine_s = run_table(20000, c), run_machine(2000, c)
    print(json.dumps({"table_us": round(table_s * 1e6, 2),
                      "statemachine_us": round(machine_s * 1e6, 2),
                      "speedup": round(machine_s / table_s, 1),
                      "machine": platform.processor() or platform.machine(),
                      "python": platform.python_version()}))
