"""Ahead-of-time compilation of every kernel for a named GPU, on a machine without one.

``compile_rows(shapes, targets)`` compiles ``shapes.example_launch(kernel, shape)`` for every
kernel, shape and target with Triton's own compiler (``triton.compile(ASTSource(...),
target=GPUTarget("cuda", cc, 32))``: TTIR -> TTGIR -> LLVM -> PTX -> cubin, ptxas bundled in
the Triton wheel) and reads the cubin's resource usage with the bundled ``cuobjdump``.  The
signature, alignment attributes and constexprs come from Triton's launch-time binder applied
to the example's arguments, so the program compiled is the one a launch at that shape runs.

The interpreter (TRITON_INTERPRET=1, chosen when ``kernels`` is first imported on a machine
without CUDA) decides per process whether ``@triton.jit`` builds compilable functions, so
``compile_in_subprocess`` runs the compilation in a child process with the interpreter off.
"""
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# device limits a launch must fit: opt-in dynamic shared memory per block, registers per block
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
REGS_PER_BLOCK = 65536
WARP = 32
# Triton's message for a dtype the target has no instructions for (fp8e4nv below sm_89)
UNSUPPORTED = "not supported in this architecture"


class AotUnavailable(Exception):
    """Ahead-of-time compilation cannot run here (interpreter on, tools missing, child died)."""


def parse_targets(text):
    """"sm_80,sm_90" -> [80, 90]; a target outside SHARED_LIMIT is refused by name."""
    out = []
    for part in text.split(","):
        cc = part.strip().removeprefix("sm_")
        if not cc.isdigit() or int(cc) not in SHARED_LIMIT:
            raise ValueError(f"unknown target {part!r}; known: "
                             + ", ".join(f"sm_{c}" for c in SHARED_LIMIT))
        out.append(int(cc))
    return out


def _tool(name):
    import triton
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise AotUnavailable(f"{name} not found at {path} (Triton wheel without CUDA tools)")
    return str(path)


def resource_usage(cubin):
    """REG / SHARED / LOCAL / STACK of the one function in ``cubin`` (cuobjdump)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name],
                              capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in text.splitlines() if "REG:" in ln)
    fields = dict(tok.split(":", 1) for tok in line.split() if ":" in tok)
    return {k: int(fields[k]) for k in ("REG", "SHARED", "LOCAL", "STACK")}


def compile_launch(launch, cc):
    """Compile ``launch`` (a kernels.plan.Launch) for sm_``cc``: (CompiledKernel, seconds,
    the ptxas report)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature
    fn = launch.kernel
    if not isinstance(fn, JITFunction):
        raise AotUnavailable(f"{type(fn).__name__}: the interpreter is on in this process "
                             "(TRITON_INTERPRET=1); compile in a child (compile_in_subprocess)")
    target = GPUTarget("cuda", cc, WARP)
    backend = make_backend(target)
    try:      # Triton's own launch-time specialisation (internal API, checked for 3.9)
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, spec, opts = binder(*launch.args, **launch.constexprs)
        options, signature, constexprs, attrs = fn._pack_args(backend, launch.constexprs, bound,
                                                              spec, opts)
    except AttributeError as e:   # (a TypeError: the launch does not fit the kernel -> a row)
        raise AotUnavailable(f"Triton {triton.__version__}: its launch binder is not the one "
                             f"kernels.aot drives ({type(e).__name__}: {e})") from e
    log = io.StringIO()
    before = knobs.nvidia.dump_ptxas_log
    knobs.nvidia.dump_ptxas_log = True          # Triton prints ptxas -v's report to stdout
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(log):
            kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                    options=options.__dict__)
    finally:
        knobs.nvidia.dump_ptxas_log = before
    return kernel, time.perf_counter() - t0, ptxas_report(log.getvalue())


def ptxas_report(text):
    """Spill stores / loads and stack frame bytes from ``ptxas -v`` (0 where not reported)."""
    def num(pattern):
        m = re.search(r"(\d+) bytes " + pattern, text)
        return int(m.group(1)) if m else 0
    return {"spill_stores": num("spill stores"), "spill_loads": num("spill loads"),
            "stack": num("stack frame"), "reported": "Used" in text}


def compile_row(kernel_name, shape, cc):
    """One row of the table: compiled or not, registers, shared memory, spills, seconds.
    ``ok`` also needs the launch to fit the device (shared memory, registers per block)."""
    from kernels.shapes import example_launch
    row = _row_id(kernel_name, shape, cc)
    t0 = time.perf_counter()
    try:
        compiled, seconds, ptxas = compile_launch(example_launch(kernel_name, shape), cc)
        use = resource_usage(compiled.asm["cubin"])
    except AotUnavailable:
        raise
    except Exception as e:                      # the compiler's message, kept for the row
        msg = " ".join(str(e).split())
        row.update(ok=False, seconds=round(time.perf_counter() - t0, 2),
                   error=f"{type(e).__name__}: {msg[-1500:]}")
        if shape.kv_dtype.startswith("float8") and UNSUPPORTED in msg:
            row["unsupported"] = f"fp8 e4m3 has no conversions on sm_{cc} (sm_89+)"
        return row
    warps = compiled.metadata.num_warps
    shared = max(compiled.metadata.shared, use["SHARED"])
    row.update(ok=True, registers=use["REG"], shared_bytes=shared,
               spill_bytes=ptxas["spill_stores"], spill_load_bytes=ptxas["spill_loads"],
               stack_bytes=use["STACK"], local_bytes=use["LOCAL"], num_warps=warps,
               seconds=round(seconds, 2))
    if not ptxas["reported"]:
        row.update(ok=False, error="no ptxas -v report: spills unknown")
    if shared > SHARED_LIMIT[cc]:
        row.update(ok=False, error=f"shared memory {shared} B > sm_{cc} limit {SHARED_LIMIT[cc]}")
    elif use["REG"] * warps * WARP > REGS_PER_BLOCK:
        row.update(ok=False, error=f"{use['REG']} registers x {warps * WARP} threads > "
                                   f"{REGS_PER_BLOCK}")
    return row


def _row_id(kernel_name, shape, cc):
    return {"kernel": kernel_name, "target": f"sm_{cc}", "shape": shape.name,
            "dtype": shape.dtype, "kv_dtype": shape.kv_dtype or shape.dtype}


def row_ok(row):
    """A row passes when it compiled and fits, or is a named not-supported dtype / target pair
    (fp8 on sm_80: ``unsupported`` says why; not a kernel that fails to compile)."""
    return bool(row["ok"] or row.get("unsupported"))


def row_order(shapes, targets, kernels=None):
    """The (kernel, shape, target) of every row, in the order they are compiled."""
    from kernels.shapes import KERNELS
    return [(k, s, cc) for s in shapes for cc in targets for k in kernels or KERNELS]


def compile_rows(shapes, targets, kernels=None, emit=None):
    """Every row, compiled in this process (the interpreter must be off); ``emit(row)`` is
    called as each is done."""
    rows = []
    for k, s, cc in row_order(shapes, targets, kernels):
        rows.append(compile_row(k, s, cc))
        if emit:
            emit(rows[-1])
    return rows


def compile_in_subprocess(shapes, targets, kernels=None, timeout=1800):
    """``compile_rows`` in a child process with the interpreter off and a fresh Triton cache
    (so every row is a real compilation and its seconds are the compiler's).  Past
    ``timeout`` seconds the child is killed: the row it was compiling fails with that
    message, the rows after it fail as not compiled."""
    root = str(Path(__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory(prefix="hybridkv-aot-") as cache:
        env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=cache,
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        request = json.dumps({"shapes": [s._asdict() for s in shapes], "targets": targets,
                              "kernels": list(kernels) if kernels else None})
        # own session: on a timeout the child's ptxas is killed with it, not orphaned
        proc = subprocess.Popen([sys.executable, "-m", "kernels.aot"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=root, start_new_session=True)
        timed_out = False
        try:
            out, err = proc.communicate(request, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out = True
    if proc.returncode != 0 and not timed_out:
        raise AotUnavailable(f"compiler process exited {proc.returncode}: {err.strip()[-2000:]}")
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    for n, (k, s, cc) in enumerate(row_order(shapes, targets, kernels)[len(rows):]):
        why = (f"still compiling after {timeout} s (killed)" if n == 0
               else "not compiled: an earlier row timed out")
        rows.append({**_row_id(k, s, cc), "ok": False, "error": why})
    return rows


def _main():
    """Child side of compile_in_subprocess: a JSON request on stdin, one JSON row per line
    on stdout as each is compiled."""
    from kernels.shapes import KernelShape
    req = json.load(sys.stdin)
    shapes = [KernelShape(**s) for s in req["shapes"]]

    def emit(row):
        print(json.dumps(row), flush=True)

    try:
        compile_rows(shapes, req["targets"], req["kernels"], emit)
    except AotUnavailable as e:
        print(str(e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main())
