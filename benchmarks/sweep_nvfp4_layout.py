"""Sweep the tile configs of the NVFP4 layout-op and quantize kernels (pyfuser.kernels.nvfp4_layout) on the GPU.

Run on the GPU machine:  PYTHONPATH=$PWD python3 benchmarks/sweep_nvfp4_layout.py [--jobs 12] [--out sweep.json]
CPU smoke run:           TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 benchmarks/sweep_nvfp4_layout.py --smoke

1. Diagnosis of the reference's fp32 division on the device (see ``diagnose_division``): torch's CUDA kernel for
   ``tensor / python_float`` multiplies by the float reciprocal, which is not the IEEE quotient the kernels (and the
   spec) compute; reported as the failure rate of the non-contiguous bf16 quantize test over many random inputs.
2. Correctness, before any timing: every candidate config is checked bit-exactly against pyfuser.nvfp4.reference
   on ragged cases that compile the same kernel variants as the timed shapes (g=8, the same dtypes and
   divisibility), then the default launchers on a wider set (dtypes, global scale, layouts, offsets that are not
   multiples of 128, strided inputs, special values). --jobs N checks configs in N processes (compiling dominates;
   Triton's on-disk cache then serves the timing phase). A config that fails is not timed.
3. Timing, two ways: the median of triton.testing.do_bench (as benchmarks/bench_nvfp4.py: L2 flushed, and the
   host's launch work included whenever it is longer than the GPU's), and the kernels alone (profiler durations, L2
   flushed). Cases: the layout op on e4m3 scales [m, 256] and the grouped quantize of
   bf16 [m, 4096], g=8 uneven groups, m = 128 (decode) and 16384 (prefill): each config, the default launcher, the
   previous implementation when --baseline FILE names its module file, and a plain ``Tensor.copy_`` moving the same
   number of bytes (half read, half written). Bytes: inputs read once, outputs written once (the whole padded
   scale buffer counts as written), as in benchmarks/bench_nvfp4.py. Prints a table; --out writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import multiprocessing as mp
import sys
import time
import traceback

import torch
import triton
import triton.testing

from pyfuser.kernels import nvfp4_layout as lk
from pyfuser.nvfp4 import reference as ref

E = 8
LAYOUT_K = 256  # block-scale columns of K = 4096
QUANT_K = 4096
SHAPES = {"decode": 128, "prefill": 16384}
# (block_rows, block_cols, num_warps): buffer tiles of the layout op, in rows x 4-element units.
LAYOUT_CONFIGS = [(16, 64, 4), (32, 64, 4), (64, 64, 4), (64, 64, 8), (128, 64, 8), (32, 32, 4)]
# (block_m, block_k, tiles, num_warps) of the quantize kernel.
QUANT_CONFIGS = [(8, 512, 1, 4), (8, 512, 2, 4), (8, 512, 4, 4), (4, 512, 2, 4), (4, 512, 4, 4), (4, 1024, 2, 4),
                 (8, 256, 2, 2), (4, 512, 2, 2), (4, 512, 1, 2), (16, 256, 2, 4), (2, 1024, 2, 2), (16, 512, 1, 4),
                 (8, 1024, 2, 8), (4, 2048, 2, 8)]


def offsets_for(counts):
    counts = torch.as_tensor(counts, dtype=torch.int64)
    padded = (counts + 127) // 128 * 128
    return ((torch.cumsum(counts, 0) - counts).to(torch.int32), (torch.cumsum(padded, 0) - padded).to(torch.int32))


def uneven_counts(m, g, seed=0):
    gen = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(torch.full((g,), 1.0 / g), m, replacement=True, generator=gen)
    return torch.bincount(draws, minlength=g)


def buffer_bytes(t):
    """The whole storage behind a layout-op-style tensor, as raw bytes."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.as_strided(t, (n,), (1,), 0).view(torch.uint8)


@contextlib.contextmanager
def exact_division_reference():
    """Evaluate the reference with amax / 6 as an IEEE division on every device: divide by a 0-dim tensor on the
    data's device instead of a Python float (for which torch's CUDA kernel multiplies by the reciprocal)."""
    saved = ref.FLOAT4_E2M1_MAX
    ref.FLOAT4_E2M1_MAX = torch.tensor(saved, dtype=torch.float32, device=DEV)
    try:
        yield
    finally:
        ref.FLOAT4_E2M1_MAX = saved


# --------------------------------------------------------------------------------------------------------------
# 1. the reference's division on the device


def diagnose_division(trials: int) -> dict:
    out = {}
    vals = torch.arange(0x3F80, 0x4080, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float().to(DEV)
    six = torch.tensor(6.0, device=DEV)
    out["bf16_in_[1,4)_where_amax/6.0_differs_from_IEEE"] = int(((vals / 6.0) != (vals / six)).sum())
    fails = {"stock reference": 0, "reference with IEEE amax/6": 0}
    gs = torch.tensor(3.0, device=DEV)
    for seed in range(trials):  # the data of test_block_quantize_non_contiguous[bf16-transposed]
        torch.manual_seed(seed)
        x = torch.randn(64, 20, device=DEV, dtype=torch.bfloat16).t()
        packed, scales = lk.block_quantize(x, gs)
        for name in fails:
            with exact_division_reference() if name != "stock reference" else contextlib.nullcontext():
                rp, rs = ref.quantize_nvfp4_fused(x, gs)
            ok = torch.equal(packed.view(torch.uint8), rp.view(torch.uint8)) and torch.equal(
                scales.view(torch.uint8), rs.view(torch.uint8))
            fails[name] += not ok
    out["non_contiguous_bf16_test_failures"] = {k: f"{v}/{trials}" for k, v in fails.items()}
    return out


# --------------------------------------------------------------------------------------------------------------
# 2. correctness


def special_rows(m, k, dtype, seed=0):
    """Random rows over 6 decades plus blocks with zeros, -0, tiny (subnormal fp8 scale), huge, inf, NaN, ties."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(m, k, device=DEV, generator=gen) * torch.logspace(-3, 3, m, device=DEV)[:, None]
    x[0, :16] = 0.0
    x[1, :16] = -0.0
    x[2, :16] = torch.linspace(-1, 1, 16, device=DEV) * 1e-6
    x[3, :16] = torch.linspace(-1, 1, 16, device=DEV) * 1e5
    x[4, :16] = torch.tensor([6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5, -.25, -.75, -1.25, -1.75, -2.5, -3.5, -5, 0.],
                             device=DEV)
    x[5, 3] = float("inf")
    if DEV.type == "cuda":  # NaN's sign after arithmetic is the platform's (canonical on GPUs; numpy's on CPU)
        x[6, 40] = float("nan")
    return x.to(dtype)


def check_layout(fn, x, tokens, out_off=None):
    in_off, padded = (t.to(DEV) for t in offsets_for(tokens))
    out_off = padded if out_off is None else torch.tensor(out_off, dtype=torch.int32, device=DEV)
    got = fn(x, in_off, out_off)
    want = ref.preprocess_grouped_matmul_input_sf(x, in_off, out_off)
    return torch.equal(buffer_bytes(got), buffer_bytes(want))


def check_quant(fn, x, tokens, gs=None, out_off=None):
    in_off, padded = (t.to(DEV) for t in offsets_for(tokens))
    out_off = padded if out_off is None else torch.tensor(out_off, dtype=torch.int32, device=DEV)
    gs_t = None if gs is None else torch.tensor(gs, dtype=torch.float32, device=DEV)
    q, s = fn(x, in_off, out_off, gs_t)
    with exact_division_reference():
        rq, rs = ref.grouped_quantize_nvfp4(x, in_off, out_off, gs_t, fused=True)
    return torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(buffer_bytes(s), buffer_bytes(rs))


RAGGED8 = [37, 0, 200, 5, 130, 0, 64, 300]  # g = 8 like the timed shapes: empty groups, > 128 rows


def check_layout_config(cfg) -> list[str]:
    br, bc, w = cfg
    fn = lambda x, a, b: lk.layout_op(x, a, b, block_rows=br, block_cols=bc, num_warps=w)  # noqa: E731
    bad = []
    m = sum(RAGGED8)
    for k in (LAYOUT_K, 9):
        x = (torch.rand(m, k, device=DEV) * 400 + 1).to(torch.float8_e4m3fn)
        if not check_layout(fn, x, RAGGED8):
            bad.append(f"fp8 k={k}")
    return bad


def check_quant_config(cfg) -> list[str]:
    bm, bk, t, w = cfg
    fn = lambda x, a, b, gs: lk.grouped_block_quantize(x, a, b, gs, block_m=bm, block_k=bk, tiles=t,  # noqa: E731
                                                       num_warps=w)
    m = sum(RAGGED8)
    bad = []
    x = torch.randn(m, QUANT_K, device=DEV, dtype=torch.bfloat16)
    if not check_quant(fn, x, RAGGED8):
        bad.append("bf16 random")
    if not check_quant(fn, special_rows(m, QUANT_K, torch.bfloat16), RAGGED8):
        bad.append("bf16 special values")
    return bad


def check_default_layout(_=None) -> list[str]:
    """The default layout op: dtypes (units of 4, 4, 2 and 1 elements), odd k, strided inputs, unaligned slabs."""
    bad = []
    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    cases = [
        ("fp8 k256", (torch.rand(sum(RAGGED8), 256, device=DEV) * 400 + 1).to(fp8), RAGGED8, None),
        ("bf16 k70", torch.randn(sum(RAGGED8), 70, device=DEV, dtype=bf16), RAGGED8, None),
        ("f32 k12", torch.randn(sum(RAGGED8), 12, device=DEV), RAGGED8, None),
        ("f64 k5", torch.randn(77, 5, device=DEV, dtype=torch.float64), [7, 70], None),
        ("fp8 transposed", (torch.randn(64, 300, device=DEV)).to(fp8).t(), [100, 0, 200], None),
        ("f32 sliced", torch.randn(300, 20, device=DEV)[:, 3:15], [250, 50], None),
        ("fp8 unaligned out offsets", (torch.randn(48, 9, device=DEV)).to(fp8), [5, 40, 3], [3, 140, 300]),
        ("bf16 decode", torch.randn(128, 256, device=DEV, dtype=bf16), uneven_counts(128, E).tolist(), None),
    ]
    for name, x, tokens, oo in cases:
        if not check_layout(lk.layout_op, x, tokens, oo):
            bad.append(f"layout_op {name}")
    return bad


def check_default_quant(dtype) -> list[str]:
    """The default grouped quantize for one x dtype: special values, random data, three global scales."""
    q = lambda x, a, b, gs: lk.grouped_block_quantize(x, a, b, gs)  # noqa: E731
    m, bad = sum(RAGGED8), []
    for gs in (None, 448.0 * 6 / 9.0, 3.0):
        if not check_quant(q, special_rows(m, 512, dtype, seed=1), RAGGED8, gs):
            bad.append(f"grouped quantize special {dtype} gs={gs}")
        if not check_quant(q, torch.randn(m, 512, device=DEV).to(dtype), RAGGED8, gs):
            bad.append(f"grouped quantize random {dtype} gs={gs}")
    return bad


def check_default_misc(_=None) -> list[str]:
    """Strided input and gaps between slabs, unaligned slabs, plain and swizzled block_quantize."""
    q = lambda x, a, b, gs: lk.grouped_block_quantize(x, a, b, gs)  # noqa: E731
    bad = []
    if not check_quant(q, torch.randn(96, 64, device=DEV, dtype=torch.bfloat16).t(), [20, 30, 14], 2.0,
                       [0, 150, 300]):
        bad.append("grouped quantize transposed, gaps between slabs")
    if not check_quant(q, torch.randn(48, 48, device=DEV), [5, 40, 3], None, [3, 140, 300]):
        bad.append("grouped quantize unaligned out offsets, K/16 = 3")
    x = special_rows(300, 256, torch.bfloat16)
    for swizzle in (False, True):
        p, s = lk.block_quantize(x, None, swizzle=swizzle)
        with exact_division_reference():
            rp, rs = ref.quantize_nvfp4_fused(x)
        if swizzle:
            rs = ref.linear_to_swizzled_128_4(rs)
        if not (torch.equal(p.view(torch.uint8), rp.view(torch.uint8))
                and torch.equal(s.view(torch.uint8), rs.view(torch.uint8))):
            bad.append(f"block_quantize swizzle={swizzle}")
    return bad


CHECKS = {"layout": check_layout_config, "quant": check_quant_config, "default layout": check_default_layout,
          "default quant": check_default_quant, "default misc": check_default_misc}


def _check_job(job):
    kind, cfg = job
    try:
        return kind, cfg, CHECKS[kind](cfg)
    except Exception:  # noqa: BLE001 - report and keep sweeping
        return kind, cfg, ["error: " + traceback.format_exc(limit=3)]


# --------------------------------------------------------------------------------------------------------------
# 3. timing


def timer(fn) -> float:
    if DEV.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def kernel_ms(fn, n=20) -> float:
    """GPU-only time per call: the durations of the CUDA kernels fn launches (profiler), L2 flushed between calls
    (by a bitwise_not of 256 MiB, told apart by name). Unlike do_bench it leaves out the host's launch work, which
    at small sizes is longer than the kernel and then sets do_bench's time."""
    if DEV.type != "cuda":
        return float("nan")
    flush = torch.empty(256 << 20, dtype=torch.int8, device=DEV)
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            flush.bitwise_not_()
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for evt in prof.key_averages():
        t = getattr(evt, "device_time_total", None)
        t = evt.cuda_time_total if t is None else t
        if evt.device_type == torch.autograd.DeviceType.CUDA and "bitwise_not" not in evt.key:
            total += t
    return total / n / 1e3


def host_ms(fn, n=100) -> float:
    """Host time per call when calls are queued back to back without waiting for the GPU (launch overhead)."""
    if DEV.type != "cuda":
        n = 1  # the CPU interpreter's calls take seconds
    fn()
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    return (t1 - t0) * 1e3 / n


def time_rows(what, shape_label, impls, nbytes, copy_bw):
    half = max(nbytes // 2, 1)
    src = torch.empty(half, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    impls = {"copy_ of same bytes": lambda: dst.copy_(src), **impls}
    rows = []
    for name, fn in impls.items():
        try:
            rows.append({"op": what, "case": shape_label, "impl": name, "ms": timer(fn), "kernel_ms": kernel_ms(fn),
                         "host_ms": host_ms(fn)})
        except Exception as e:  # noqa: BLE001
            rows.append({"op": what, "case": shape_label, "impl": name, "error": repr(e)[:300]})
    t_copy, k_copy = rows[0]["ms"], rows[0]["kernel_ms"]
    for r in rows:
        if "ms" in r:
            r["GBs"] = nbytes / (r["ms"] * 1e-3) / 1e9
            r["pct_copy_bw"] = 100 * r["GBs"] / copy_bw
            r["x_copy_time"] = r["ms"] / t_copy
            r["kernel_GBs"] = nbytes / (r["kernel_ms"] * 1e-3) / 1e9
            r["kernel_pct_copy_bw"] = 100 * r["kernel_GBs"] / copy_bw
            r["kernel_x_copy"] = r["kernel_ms"] / k_copy
        print_row(r)
    return rows


def bench(layout_ok, quant_ok, baseline, smoke):
    n = (1 << 30) if DEV.type == "cuda" else (1 << 20)
    a, b = torch.empty(n, dtype=torch.uint8, device=DEV), torch.empty(n, dtype=torch.uint8, device=DEV)
    copy_bw = 2 * n / (timer(lambda: b.copy_(a)) * 1e-3) / 1e9
    del a, b
    print(f"\ncopy bandwidth (1 GiB copy_, read + write): {copy_bw:.0f} GB/s")
    print("do_bench (L2 flushed, includes host launch gaps) | kernel only (profiler, L2 flushed) | host launch "
          "work per call; GB/s, % of that copy bandwidth, time / copy_ of the same bytes")
    print(f"{'op':6} {'case':30} {'impl':34} {'ms':>8} {'GB/s':>6} {'%BW':>5} {'x copy':>7} | {'ms':>8} {'GB/s':>6} "
          f"{'%BW':>5} {'x copy':>7} | host us/call")
    rows = []
    shapes = SHAPES if not smoke else {"smoke": 96}
    for label, m in shapes.items():
        in_off, out_off = (t.to(DEV) for t in offsets_for(uneven_counts(m, E, seed=m)))
        k, K = (LAYOUT_K, QUANT_K) if not smoke else (16, 256)
        pk = (k + 3) // 4 * 4
        scales = (torch.rand(m, k, device=DEV) * 400 + 1).to(torch.float8_e4m3fn)
        impls = {"default launcher": lambda: lk.layout_op(scales, in_off, out_off)}
        if baseline is not None:
            impls["previous launcher"] = lambda: baseline.layout_op(scales, in_off, out_off)
        for cfg in layout_ok:
            br, bc, w = cfg
            impls[f"rows={br} cols={bc} warps={w}"] = (
                lambda br=br, bc=bc, w=w: lk.layout_op(scales, in_off, out_off, block_rows=br, block_cols=bc,
                                                       num_warps=w))
        rows += time_rows("layout op", f"{label} [{m}, {k}] e4m3 g={E}", impls, m * k + (m + 127 * E) * pk,
                          copy_bw)
        x = torch.randn(m, K, device=DEV, dtype=torch.bfloat16)
        pq = (K // 16 + 3) // 4 * 4
        impls = {"default launcher": lambda: lk.grouped_block_quantize(x, in_off, out_off)}
        if baseline is not None:
            impls["previous launcher"] = lambda: baseline.grouped_block_quantize(x, in_off, out_off)
        for cfg in quant_ok:
            bm, bk, t, w = cfg
            impls[f"m={bm} k={bk} tiles={t} warps={w}"] = (
                lambda bm=bm, bk=bk, t=t, w=w: lk.grouped_block_quantize(x, in_off, out_off, block_m=bm, block_k=bk,
                                                                         tiles=t, num_warps=w))
        rows += time_rows("grouped quantize", f"{label} [{m}, {K}] bf16 g={E}", impls,
                          m * K * 2 + m * K // 2 + (m + 127 * E) * pq, copy_bw)
    return copy_bw, rows


def print_row(r):
    if "ms" in r:
        print(f"{r['op'][:6]:6} {r['case']:30} {r['impl']:34} {r['ms']:8.4f} {r['GBs']:6.0f} {r['pct_copy_bw']:4.0f}% "
              f"{r['x_copy_time']:6.2f}x | {r['kernel_ms']:8.4f} {r['kernel_GBs']:6.0f} {r['kernel_pct_copy_bw']:4.0f}% "
              f"{r['kernel_x_copy']:6.2f}x | {r['host_ms'] * 1e3:5.0f}", flush=True)
    else:
        print(f"{r['op'][:6]:6} {r['case']:30} {r['impl']:34} ERROR {r['error']}", flush=True)


def _init_worker():
    global DEV
    DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=8, help="processes for the correctness checks (compiles)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--baseline", help="module file of a previous layout_kernels.py to time alongside")
    ap.add_argument("--trials", type=int, default=200, help="random inputs for the division diagnosis")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, two configs each (CPU interpreter)")
    args = ap.parse_args()
    _init_worker()
    t0 = time.time()
    result = {"device": torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu",
              "torch": torch.__version__, "triton": triton.__version__}
    layout_cfgs = LAYOUT_CONFIGS if not args.smoke else LAYOUT_CONFIGS[:2]
    quant_cfgs = QUANT_CONFIGS if not args.smoke else QUANT_CONFIGS[:2]
    global QUANT_K
    if args.smoke:
        QUANT_K = 256
    baseline = None
    if args.baseline:
        spec = importlib.util.spec_from_file_location("baseline_layout_kernels", args.baseline)
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)

    result["division"] = diagnose_division(args.trials if not args.smoke else 3)
    print("division diagnosis:", json.dumps(result["division"], indent=1), flush=True)

    jobs = [("layout", c) for c in layout_cfgs] + [("quant", c) for c in quant_cfgs]
    jobs += [("default layout", None), ("default misc", None)]
    jobs += [("default quant", d) for d in (torch.bfloat16, torch.float16, torch.float32)]
    if args.jobs > 1 and DEV.type == "cuda":
        with mp.get_context("spawn").Pool(args.jobs, initializer=_init_worker) as pool:
            checked = pool.map(_check_job, jobs)
    else:
        checked = [_check_job(j) for j in jobs]
    result["checks"] = [{"kind": k, "config": c, "failures": bad} for k, c, bad in checked]
    for k, c, bad in checked:
        if bad:
            print(f"FAILED {k} {c}: {bad}")
    layout_ok = [c for k, c, bad in checked if k == "layout" and not bad]
    quant_ok = [c for k, c, bad in checked if k == "quant" and not bad]
    defaults_bad = [b for k, c, bad in checked if k.startswith("default") for b in bad]
    print(f"configs bit-exact: layout {len(layout_ok)}/{len(layout_cfgs)}, quant {len(quant_ok)}/{len(quant_cfgs)}; "
          f"default launchers: {defaults_bad or 'all bit-exact'} ({time.time() - t0:.0f} s)", flush=True)

    copy_bw, rows = bench(layout_ok, quant_ok, baseline, args.smoke)
    result["copy_GBs"], result["rows"] = copy_bw, rows
    print(f"\ntotal {time.time() - t0:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
    sys.exit(1 if any(bad for _, _, bad in checked) else 0)


DEV = torch.device("cpu")

if __name__ == "__main__":
    main()
