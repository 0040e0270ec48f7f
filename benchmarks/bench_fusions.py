"""pyfuser vs eager PyTorch vs torch.compile on memory-bound fusions, and host overhead per cached call.

Run on the GPU machine:  python benchmarks/bench_fusions.py --out DIR
Every case is checked against eager before it is timed. Times are medians of triton.testing.do_bench (CUDA
events). Bandwidth counts the fewest bytes a fusion must move (each input read once, each output written once)
and is compared with a measured device-to-device copy in two ways: the bandwidth of a 1 GiB copy (the roofline
the targets are stated against), and the time of a copy of the case's own bytes in the same harness. The
second shares the case's fixed costs: do_bench clears L2 before every call by zeroing 256 MB, so every timed
call starts by writing back L2's dirty lines, a cost that a 50 us kernel feels and a 500 us copy hardly does
(the report's flush study measures it). Writes DIR/<date>-fusions.md and .json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import time

import torch
import triton.testing

from pyfuser import DataType, FusionDefinition

from timing import median_ms_read_flush

EPS = 1e-5
# The roofline shapes: a typical hidden size, an odd one, wide rows, many narrow rows, very wide rows.
SHAPES = [(16384, 4096), (8191, 5000), (4096, 16384), (32768, 1024), (1024, 65536)]


# --------------------------------------------------------------------------------------------------------------
# the fusions, each with its eager twin


def gelu_bias_fd(shape, dt=DataType.BFloat16):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=dt)
        w = fd.define_tensor([-1], contiguity=[True], dtype=dt)
        b = fd.define_tensor([-1], contiguity=[True], dtype=dt)
        y = fd.ops.add(fd.ops.mul(x, w), b)  # Float
        inner = fd.ops.mul(fd.ops.add(y, fd.ops.mul(fd.ops.mul(fd.ops.mul(y, y), y), 0.044715)), math.sqrt(2 / math.pi))
        g = fd.ops.mul(fd.ops.mul(y, 0.5), fd.ops.add(fd.ops.tanh(inner), 1.0))
        fd.add_output(fd.ops.cast(g, dt))
    return fd


def gelu_bias_eager(x, w, b):
    return torch.nn.functional.gelu(x.float() * w.float() + b.float(), approximate="tanh").to(x.dtype)


def rmsnorm_fd(shape, dt=DataType.BFloat16):
    n = shape[1]
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=dt)
        w = fd.define_tensor([-1], contiguity=[True], dtype=dt)
        xf = fd.ops.cast(x, DataType.Float)
        ms = fd.ops.div(fd.ops.sum(fd.ops.mul(xf, xf), dims=[1], keepdim=True), float(n))
        y = fd.ops.mul(fd.ops.mul(xf, fd.ops.rsqrt(fd.ops.add(ms, EPS))), w)
        fd.add_output(fd.ops.cast(y, dt))
    return fd


def rmsnorm_eager(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def layernorm_fd(shape, dt=DataType.BFloat16):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=dt)
        w = fd.define_tensor([-1], contiguity=[True], dtype=dt)
        b = fd.define_tensor([-1], contiguity=[True], dtype=dt)
        xf = fd.ops.cast(x, DataType.Float)
        var, mean = fd.ops.var_mean(xf, dims=[1], correction=0, keepdim=True)
        y = fd.ops.add(fd.ops.mul(fd.ops.mul(fd.ops.sub(xf, mean), fd.ops.rsqrt(fd.ops.add(var, EPS))), w), b)
        fd.add_output(fd.ops.cast(y, dt))
    return fd


def layernorm_eager(x, w, b):
    return torch.nn.functional.layer_norm(x.float(), (x.shape[1],), w.float(), b.float(), EPS).to(x.dtype)


def softmax_fd(shape, dt=DataType.BFloat16):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=dt)
        xf = fd.ops.cast(x, DataType.Float)
        m = fd.ops.max(xf, dims=[1], keepdim=True)
        e = fd.ops.exp(fd.ops.sub(xf, m))
        y = fd.ops.div(e, fd.ops.sum(e, dims=[1], keepdim=True))
        fd.add_output(fd.ops.cast(y, dt))
    return fd


def softmax_eager(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def slice_add_mul_fd(shape, dt=DataType.BFloat16):
    rows, cols = shape
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=dt)
        y = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=dt)
        a = fd.ops.slice(x, [0, 1], [rows, cols])
        b = fd.ops.slice(y, [0, 0], [rows, cols - 1])
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.add(a, b), 0.5), dt))
    return fd


def slice_add_mul_eager(x, y):
    return ((x[:, 1:].float() + y[:, :-1].float()) * 0.5).to(x.dtype)


def issue4888_fd(s, h):
    with FusionDefinition() as fd:
        mask = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        scores = fd.define_tensor([1, -1, -1, -1], contiguity=[None, True, True, True], dtype=DataType.BFloat16)
        t1 = fd.ops.broadcast_in_dim(mask, shape=[1, 1, s, s + 1], broadcast_dims=[2, 3])
        t2 = fd.ops.slice(t1, [0, 0, 0, 0], [1, 1, s, s])
        view = fd.ops.broadcast_in_dim(t2, shape=[1, h, s, s], broadcast_dims=[0, 1, 2, 3])
        z = fd.ops.add(fd.ops.mul(fd.ops.cast(scores, DataType.Float), 0.0883883), fd.ops.cast(view, DataType.Float))
        m = fd.ops.max(z, dims=[3], keepdim=True)
        e = fd.ops.exp(fd.ops.sub(z, m))
        p = fd.ops.div(e, fd.ops.sum(e, dims=[3], keepdim=True))
        fd.add_output(view)
        fd.add_output(p)
        fd.add_output(fd.ops.cast(p, DataType.BFloat16))
    return fd


def issue4888_eager(mask, scores):
    s = mask.shape[0]
    view = mask[None, None, :, :s].expand(1, scores.shape[1], s, s)
    p = torch.softmax(scores.float() * 0.0883883 + view.float(), dim=-1)
    return view, p, p.to(torch.bfloat16)


_IO_DTYPES = {torch.bfloat16: DataType.BFloat16, torch.float32: DataType.Float}


# case name -> (its definition for (shape, dtype), its eager twin, which of x, y, w, b it takes)
CASE_FDS = {
    "gelu(x*w+b)": (gelu_bias_fd, gelu_bias_eager, "xwb"),
    "rmsnorm": (rmsnorm_fd, rmsnorm_eager, "xw"),
    "layernorm": (layernorm_fd, layernorm_eager, "xwb"),
    "softmax fp32": (softmax_fd, softmax_eager, "x"),
    "slice+add+mul": (slice_add_mul_fd, slice_add_mul_eager, "xy"),
}


def make_cases(rows, cols, dev, dtype=torch.bfloat16):
    """The cases at one shape, with inputs and outputs in ``dtype`` (compute in fp32 either way); fp32 cases are
    named with an " [fp32]" suffix."""
    io = dict(device=dev, dtype=dtype)
    tensors = {"x": torch.randn(rows, cols, **io), "y": torch.randn(rows, cols, **io),
               "w": torch.randn(cols, **io), "b": torch.randn(cols, **io)}
    shape, dt = (rows, cols), _IO_DTYPES[dtype]
    tag = "" if dtype == torch.bfloat16 else " [fp32]"
    return [(name + tag, make_fd(shape, dt), eager, [tensors[k] for k in takes])
            for name, (make_fd, eager, takes) in CASE_FDS.items()]


# --------------------------------------------------------------------------------------------------------------
# measurement


def parse_shapes(text: str) -> list:
    """[(rows, cols), ...] from a command line's "16384x4096,1024x65536"."""
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",")]


def case_wanted(name: str, prefixes: list) -> bool:
    """Whether a command line's case-name prefixes (none: every case) select the case ``name``."""
    return not prefixes or any(name.startswith(p) for p in prefixes)


def result_suffix(tag: str) -> str:
    """A result file's name suffix from a script's --tag: the tag after one dash (``--tag=-x``, the old spelling,
    gives the same as ``--tag x``)."""
    return "-" + tag.lstrip("-") if tag else ""


def nbytes(ts):
    out = 0
    for t in ts:
        if isinstance(t, torch.Tensor):
            # A view (stride 0 or sliced) moves only what it covers at most.
            out += min(t.numel(), t.untyped_storage().nbytes() // t.element_size()) * t.element_size()
    return out


def copy_bandwidth(dev) -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device=dev)  # 1 GiB
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    return 2 * x.numel() / (ms * 1e-3) / 1e9


def bench(fn, warmup=25, rep=200) -> float:
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


_COPIES: dict = {}


def same_size_copy_ms(moved: int, dev) -> float:
    """ms of a device copy that reads and writes ``moved`` bytes in all, timed as the cases are (cached by size)."""
    half = max(moved // 2, 1)
    if half not in _COPIES:
        x = torch.empty(half, dtype=torch.uint8, device=dev)
        y = torch.empty_like(x)
        _COPIES[half] = bench(lambda: y.copy_(x))
        del x, y
    return _COPIES[half]


def flush_study(dev) -> list[dict]:
    """GB/s of copies of several sizes, L2 cleared by do_bench's zeroing and by a read: how much of a short
    kernel's time is the flush's write-back rather than its own."""
    out = []
    for mib in (32, 64, 128, 256, 512, 1024):
        x = torch.empty(mib << 20, dtype=torch.uint8, device=dev)
        y = torch.empty_like(x)
        zero = bench(lambda: y.copy_(x))
        read = median_ms_read_flush(lambda: y.copy_(x))
        out.append({"MiB": mib, "zero_flush_GBs": 2 * x.numel() / zero / 1e6,
                    "read_flush_GBs": 2 * x.numel() / read / 1e6, "zero_flush_ms": zero, "read_flush_ms": read})
        del x, y
    return out


def check(outs, refs, name):
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    refs = refs if isinstance(refs, (list, tuple)) else [refs]
    for o, r in zip(outs, refs):
        assert o.shape == r.shape and o.dtype == r.dtype, f"{name}: {o.shape}/{o.dtype} vs {r.shape}/{r.dtype}"
        assert o.stride() == r.stride() or o.numel() <= 1, f"{name}: strides {o.stride()} vs {r.stride()}"
        torch.testing.assert_close(o.float(), r.float(), atol=2e-2, rtol=2e-2, msg=lambda m: f"{name}: {m}")


@contextlib.contextmanager
def tuning(**overrides):
    """plan.TUNING with ``overrides`` inside the block, restored after (the launch-heuristic sweeps)."""
    from pyfuser.codegen import plan

    saved = dict(plan.TUNING)
    plan.TUNING.update(overrides)
    try:
        yield
    finally:
        plan.TUNING.clear()
        plan.TUNING.update(saved)


def time_with_tuning(make_fd, eager, inputs, overrides: dict, copy_bw: float, name: str):
    """A fresh fusion from ``make_fd()`` planned under ``tuning(**overrides)``, checked against ``eager`` and
    timed: (fd, ms, % of copy bandwidth). The launch-heuristic sweeps' A/B step."""
    with tuning(**overrides):
        fd = make_fd()
        outs = fd.execute(inputs)
        check(outs, eager(*inputs), name)
        ms = bench(lambda: fd.execute(inputs))
    moved = nbytes(inputs) + nbytes(outs)
    return fd, ms, 100 * moved / (ms * 1e-3) / 1e9 / copy_bw


def run_case(name, fd, eager, inputs, copy_bw, compiled_cache, read_flush=False):
    outs = fd.execute(inputs)
    check(outs, eager(*inputs), name)
    kinds = [s.kind.value for s in fd.segments()]
    runs = [r.runs_as for r in fd.last_execution()]
    compiled = compiled_cache.setdefault(eager, torch.compile(eager))
    check(compiled(*inputs), eager(*inputs), name + " (compile)")
    t_pf = bench(lambda: fd.execute(inputs))
    t_eager = bench(lambda: eager(*inputs))
    t_comp = bench(lambda: compiled(*inputs))
    moved = nbytes(inputs) + nbytes([o for o in outs if o._base is None])
    gbs = moved / (t_pf * 1e-3) / 1e9
    t_copy = same_size_copy_ms(moved, outs[0].device)
    flushed = {}
    if read_flush:  # pyfuser and torch.compile again, L2 cleared by a read (timing.py)
        pf, comp = median_ms_read_flush(lambda: fd.execute(inputs)), median_ms_read_flush(lambda: compiled(*inputs))
        flushed = {"pyfuser_ms_read_flush": pf, "compile_ms_read_flush": comp,
                   "pct_copy_bw_read_flush": 100 * moved / (pf * 1e-3) / 1e9 / copy_bw,
                   "vs_compile_read_flush": comp / pf}
    return {
        "case": name,
        "shape": list(inputs[0].shape),
        "segments": kinds,
        "runs": runs,
        "pyfuser_ms": t_pf,
        "eager_ms": t_eager,
        "compile_ms": t_comp,
        "bytes": moved,
        "pyfuser_GBs": gbs,
        "pct_copy_bw": 100 * gbs / copy_bw,
        "same_size_copy_ms": t_copy,
        "pct_same_size_copy": 100 * t_copy / t_pf,
        "vs_eager": t_eager / t_pf,
        "vs_compile": t_comp / t_pf,
        **flushed,
    }


def host_overhead(dev):
    """µs of host time per cached call: tiny inputs, so the GPU is never the bottleneck."""
    x = torch.randn(16, device=dev)
    w = torch.randn(16, 16, device=dev)
    with FusionDefinition() as fd1:
        t = fd1.define_tensor([-1], contiguity=[True])
        fd1.add_output(fd1.ops.relu(t))
    with FusionDefinition() as fd3:  # pointwise -> matmul (ExprEval) -> pointwise
        t = fd3.define_tensor([-1], contiguity=[True])
        m = fd3.define_tensor([-1, -1], contiguity=[True, True])
        a = fd3.ops.relu(t)
        b = fd3.ops.matmul(m, a)
        fd3.add_output(fd3.ops.mul(b, 2.0))

    def tiny_eager(x):
        return torch.relu(x)

    def three_eager(x, w):
        return (w @ torch.relu(x)) * 2.0

    tiny_c, three_c = torch.compile(tiny_eager), torch.compile(three_eager)
    cases = {
        "1 kernel: pyfuser": lambda: fd1.execute([x]),
        "1 kernel: eager": lambda: tiny_eager(x),
        "1 kernel: torch.compile": lambda: tiny_c(x),
        "3 segments: pyfuser": lambda: fd3.execute([x, w]),
        "3 segments: eager": lambda: three_eager(x, w),
        "3 segments: torch.compile": lambda: three_c(x, w),
    }
    result = {}
    for name, fn in cases.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        result[name] = (time.perf_counter() - t0) / n * 1e6
    result["segments (3-segment fusion)"] = [s.kind.value for s in fd3.segments()]
    return result


def segment_counts(rows, dev):
    """Segments per fusion where splitting costs launches and round trips through memory: slice+add+mul (from
    its timed rows) and the NVFP4 MoE layer (pyfuser/demo/moe_nvfp4.py; the count depends only on the
    definition, so small sizes serve)."""
    from pyfuser.demo.moe_nvfp4 import MoEConfig, MoENVFP4, make_weights, quantize_weights

    counts = {f"{r['case']} {r['shape']}": len(r["segments"]) for r in rows if r["case"] == "slice+add+mul"}
    cfg = MoEConfig()
    layer = MoENVFP4(cfg, quantize_weights(make_weights(cfg, device=dev)))
    layer(torch.randn(64, cfg.hidden, device=dev, dtype=torch.bfloat16))
    reports = layer.fusion(64).last_execution()
    counts["NVFP4 MoE layer"] = len(reports)
    counts["NVFP4 MoE layer (kinds)"] = [f"{r.kind} ({r.runs_as}): {', '.join(r.ops)}" for r in reports]
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    ap.add_argument("--tag", default="", help="suffix of the result files' names (a second run the same day)")
    ap.add_argument("--fp32", action="store_true", help="also every case with fp32 inputs and outputs")
    ap.add_argument("--read-flush", action="store_true",
                    help="also time pyfuser and torch.compile with L2 cleared by a read (benchmarks/timing.py)")
    ap.add_argument("--cases", default="", help="only cases whose names start with one of these (comma-separated)")
    ap.add_argument("--shapes", default="", help="only these shapes, e.g. 16384x4096,1024x65536")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="start no case after this many seconds and skip the extras (host overhead, segment "
                         "counts, flush study); the report then says how many cases ran")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script itself (TRITON_INTERPRET=1)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    over_budget = lambda: args.budget_s > 0 and time.perf_counter() - t0 > args.budget_s  # noqa: E731
    copy_bw = copy_bandwidth(dev)
    shapes = parse_shapes(args.shapes) if args.shapes else [(1024, 512)] if args.quick else SHAPES
    wanted = [c for c in args.cases.split(",") if c]
    dtypes = (torch.bfloat16, torch.float32) if args.fp32 else (torch.bfloat16,)
    planned = len(dtypes) * len(shapes) * sum(case_wanted(n, wanted) for n in CASE_FDS)
    rows = []
    compiled = {}
    for dtype, (r, c) in ((d, s) for d in dtypes for s in shapes):
        if over_budget():
            break
        for name, fd, eager, inputs in make_cases(r, c, dev, dtype):
            if not case_wanted(name, wanted) or over_budget():
                continue
            rows.append(run_case(name, fd, eager, inputs, copy_bw, compiled, args.read_flush))
            print(json.dumps(rows[-1]), flush=True)
            # Written after every case, so that a run stopped from outside still leaves its rows.
            report(args.out, copy_bw, rows, {}, {}, args.tag, partial=f"{len(rows)} of {planned} cases so far")
    if over_budget() or wanted or args.shapes:
        ran = f"{len(rows)} of {planned} cases" + (" (the time budget ran out)" if len(rows) < planned else "")
        report(args.out, copy_bw, rows, {}, {}, args.tag, partial=ran + "; the extras were skipped")
        return
    s, h = (256, 2) if args.quick else (4096, 16)
    mask = torch.randn(s, s + 1, device=dev, dtype=torch.bfloat16)
    scores = torch.randn(1, h, s, s, device=dev, dtype=torch.bfloat16)
    rows.append(run_case("#4888 pattern", issue4888_fd(s, h), issue4888_eager, [mask, scores], copy_bw, compiled,
                         args.read_flush))
    print(json.dumps(rows[-1]))
    overhead = host_overhead(dev)
    print(json.dumps(overhead))
    counts = segment_counts(rows, dev)
    print(json.dumps(counts))
    flushes = flush_study(dev)
    print(json.dumps(flushes))
    report(args.out, copy_bw, rows, overhead, counts, args.tag, flushes)


def targets_met(rows, key: str, vs: str = "vs_compile") -> tuple[int, int]:
    """(met, of): the memory-bound cases (the 4888 pattern aside) at >= 85% by ``key`` and >= 1.1x torch.compile
    by ``vs``."""
    cases = [r for r in rows if r["case"] != "#4888 pattern"]
    return sum(r[key] >= 85 and r[vs] >= 1.1 for r in cases), len(cases)


def report(out_dir, copy_bw, rows, overhead, counts, tag="", flushes=(), partial=""):
    """Writes <date>-fusions[-tag].md and .json; ``partial`` says, when not every case ran, how many did."""
    os.makedirs(out_dir, exist_ok=True)
    day = datetime.date.today().isoformat()
    meta = {
        "date": day,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_GBs": copy_bw,
    }
    with open(os.path.join(out_dir, f"{day}-fusions{result_suffix(tag)}.json"), "w") as f:
        json.dump({"meta": meta, "cases": rows, "host_overhead_us": overhead, "segment_counts": counts,
                   "flush_study": list(flushes), "partial": partial}, f, indent=1)
    met, of = targets_met(rows, "pct_copy_bw")
    met_same, _ = targets_met(rows, "pct_same_size_copy")
    lines = [
        f"# Fusion benchmarks, {day}",
        "",
        f"{meta['device']}, torch {meta['torch']}, triton {meta['triton']}. Measured copy bandwidth "
        f"{copy_bw:.0f} GB/s (read + write). Times: median of triton.testing.do_bench; bytes = inputs read once + "
        "outputs written once. % same-size copy: the time of a copy of the same bytes, timed the same way, over "
        "pyfuser's.",
        "",
        f"Targets (>= 85% and >= 1.1x torch.compile): **{met} of {of}** against the 1 GiB copy's bandwidth; "
        f"{met_same} of {of} against a same-size copy.",
        "",
    ]
    if partial:
        lines[2:2] = [f"**Partial run**: {partial}; the counts below are of the cases that ran.", ""]
    read = all("pct_copy_bw_read_flush" in r for r in rows)
    if read:
        met_read, _ = targets_met(rows, "pct_copy_bw_read_flush", "vs_compile_read_flush")
        lines += [f"With L2 cleared by a read instead of do_bench's zeroing (pyfuser and torch.compile timed again; "
                  f"the timed call then writes back none of the flush's dirty lines): **{met_read} of {of}** "
                  "against the 1 GiB copy's bandwidth.", ""]
    lines += [
        "| case | shape | pyfuser ms | eager ms | compile ms | GB/s | % copy BW | % same-size copy | vs eager | "
        "vs compile | " + ("% copy BW, read flush | vs compile, read flush | " if read else "") + "segments (runs) |",
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if read else ""),
    ]
    for r in rows:
        segs = ", ".join(f"{k} ({x})" for k, x in zip(r["segments"], r["runs"]))
        flushed = (f"{r['pct_copy_bw_read_flush']:.0f}% | {r['vs_compile_read_flush']:.2f}x | " if read else "")
        lines.append(
            f"| {r['case']} | {r['shape']} | {r['pyfuser_ms']:.3f} | {r['eager_ms']:.3f} | {r['compile_ms']:.3f} | "
            f"{r['pyfuser_GBs']:.0f} | {r['pct_copy_bw']:.0f}% | {r['pct_same_size_copy']:.0f}% | "
            f"{r['vs_eager']:.2f}x | {r['vs_compile']:.2f}x | {flushed}{segs} |"
        )
    if flushes:
        lines += ["", "Flush study: GB/s of a copy, L2 cleared before each call by zeroing 256 MB (do_bench) or by "
                  "reading it:", "", "| MiB copied | zeroing flush | reading flush |", "|---|---|---|"]
        lines += [f"| {f['MiB']} | {f['zero_flush_GBs']:.0f} | {f['read_flush_GBs']:.0f} |" for f in flushes]
    if overhead:
        lines += ["", "Host time per cached call (µs, tiny inputs):", ""]
        lines += [f"- {k}: {v:.1f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in overhead.items()]
    if counts:
        lines += ["", "Segments per fusion:", ""]
        for k, v in counts.items():
            lines += [f"- {k}: {v}"] if not isinstance(v, list) else [f"- {k}:"] + [f"  - {x}" for x in v]
    with open(os.path.join(out_dir, f"{day}-fusions{result_suffix(tag)}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
