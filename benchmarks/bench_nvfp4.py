"""NVFP4 on the H200: layout op and grouped quantize, the fused-dequant grouped GEMM, and the whole MoE layer.

Run on the GPU machine:  python benchmarks/bench_nvfp4.py --out DIR
Smoke run on CPU:        TRITON_INTERPRET=1 python benchmarks/bench_nvfp4.py --quick --device cpu --out /tmp/x

Sections (each runs even if another fails; an error is printed and recorded in the JSON):
(a) layout op (preprocess_grouped_matmul_input_sf) and grouped quantize (nv_grouped_block_quantize): the fd op,
    the raw Triton launcher, the pure-torch reference, and a plain device copy that moves the same number of bytes.
(b) NVFP4 grouped GEMM (fd.ops.cutlass_nvfp4_grouped_mm and the raw launcher) vs bf16 torch._grouped_mm and vs
    dequantize-the-weights-then-bf16-_grouped_mm, at decode shapes (8 experts, 1/16/64 tokens each, K=4096,
    N=2048 and 14336) and prefill (8192 tokens over 8 experts).
(c) the MoE layer of pyfuser/demo/moe_nvfp4.py (one pyfuser fusion) vs its bf16 version, eager and torch.compile.

Every implementation is checked against a reference before it is timed. Times are medians of
triton.testing.do_bench (CUDA events). Bytes are the fewest an implementation must move (inputs read once,
outputs written once; for the layout op the whole zero-filled buffer counts as written). Writes
DIR/<date>-nvfp4[-TAG].md and .json. ``--read-flush`` also times the GEMM rows with L2 cleared by a read
(benchmarks/timing.py). ``--gemm-shapes 14336x16,14336x1`` runs only those GEMM cases (N x tokens per expert), in
that order.

Targets (issue 11; issue 4's were 2x at decode, 0.5x at prefill, 2x a copy): fused NVFP4 grouped GEMM >= 3x bf16
_grouped_mm at 1-16 tokens per expert, >= 2x at 64, >= 0.9x at prefill; the layout op and the grouped quantize
within 1.2x of a plain copy of their bytes.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
import sys
import time
import traceback
from types import SimpleNamespace

import torch
import triton
import triton.testing

from pyfuser import DataType, FusionDefinition
from pyfuser.nvfp4 import reference as ref

from pyfuser.demo import moe_nvfp4  # noqa: E402

from bench_fusions import parse_shapes  # noqa: E402
from timing import median_ms_read_flush  # noqa: E402

E = 8  # experts in every GEMM / layout case
DECODE_TOKENS_PER_EXPERT = (1, 16, 64)
K_GEMM = 4096
N_GEMM = (2048, 14336)
PREFILL_TOKENS = 8192
TARGETS = {"gemm_decode_1_16_vs_bf16": 3.0, "gemm_decode_64_vs_bf16": 2.0, "gemm_prefill_vs_bf16": 0.9,
           "layout_op_vs_copy": 1.2, "grouped_quantize_vs_copy": 1.2}


# --------------------------------------------------------------------------------------------------------------
# timing and bytes


class Timer:
    def __init__(self, device: torch.device, quick: bool, read_flush: bool = False):
        self.device = device
        self.rep = 30 if quick else 100
        # Also time the GEMM rows with L2 cleared by a read (timing.py): do_bench's zeroing flush charges each call
        # the write-back of up to 50 MB of dirty lines, most of a decode GEMM's own time at N=2048.
        self.read_flush = read_flush and device.type == "cuda"

    def read_flushed(self, fn) -> float:
        """Median ms of fn() with L2 cleared by a read before each call."""
        return median_ms_read_flush(fn, n=self.rep)

    def __call__(self, fn) -> float:
        """Median ms of fn()."""
        if self.device.type == "cuda":
            return triton.testing.do_bench(fn, warmup=25, rep=self.rep, return_mode="median")
        fn()  # CPU smoke runs: wall clock, a few calls
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


class _Deferred:
    """A CUDA-graph implementation, captured only when its row runs (so a capture error stays in that row)."""

    def __init__(self, fn):
        self.fn = fn

    def build(self):
        return cuda_graphed(self.fn)


def _graphed_or_none(dev, fn):
    return _Deferred(fn) if dev.type == "cuda" else None


def cuda_graphed(fn):
    """``fn`` captured in a CUDA graph (after warm-up calls on a side stream, which also compile every kernel):
    the returned callable replays it on the same input buffers, without any host work per op. This is how decode
    steps are deployed (vLLM, torch.compile's reduce-overhead mode); it needs a call without host syncs."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay():
        graph.replay()
        return out

    return replay


def tensor_bytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def copy_bandwidth(dev, timer) -> float:
    """GB/s of a device-to-device copy (read + write counted), 1 GiB (16 MiB on CPU)."""
    n = (1 << 30) if dev.type == "cuda" else (1 << 24)
    x = torch.empty(n, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    return 2 * n / (timer(lambda: y.copy_(x)) * 1e-3) / 1e9


def copy_ms(nbytes: int, dev, timer) -> float:
    """A plain copy moving ``nbytes`` in total (nbytes/2 read, nbytes/2 written)."""
    half = max(nbytes // 2, 1)
    x = torch.empty(half, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    return timer(lambda: y.copy_(x))


def gbs(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


# --------------------------------------------------------------------------------------------------------------
# shared set-up


NO_CHECKS = ["offset_checks"]  # rows marked "offset_checks off": offsets trusted, no host sync per op call


def offsets_for(counts: torch.Tensor):
    """START offsets (exclusive prefix sums) of the tokens and of the 128-row-padded block-scale groups."""
    counts = counts.to(torch.int64)
    padded = (counts + 127) // 128 * 128
    starts = (torch.cumsum(counts, 0) - counts).to(torch.int32)
    sf_starts = (torch.cumsum(padded, 0) - padded).to(torch.int32)
    return starts, sf_starts


def uneven_counts(m: int, g: int, seed: int = 0) -> torch.Tensor:
    """How m routed rows fall on g experts under a random router (multinomial, so groups are uneven)."""
    gen = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(torch.full((g,), 1.0 / g), m, replacement=True, generator=gen)
    return torch.bincount(draws, minlength=g)


def equal_counts(m_per_expert: int, g: int) -> torch.Tensor:
    return torch.full((g,), m_per_expert, dtype=torch.int64)


def define_input(fd, dtype, ndim, stride_order=()):
    return fd.define_tensor(shape=[-1] * ndim, contiguity=[True] * ndim, dtype=dtype, stride_order=stride_order)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def grouped_buffer(t: torch.Tensor) -> torch.Tensor:
    """The whole storage behind a layout-op-style tensor (what consumers read), as raw bytes."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.as_strided(t, (n,), (1,), 0).view(torch.uint8)


# --------------------------------------------------------------------------------------------------------------
# (a) layout op and grouped quantize


def layout_cases(quick: bool):
    k = 256 if not quick else 16  # scale columns: K/16 for K = 4096
    rows = [("decode 8x16", 128), ("prefill 8192 tok x top-2", 16384)] if not quick else [("quick", 96)]
    return k * 16, [(label, m, uneven_counts(m, E, seed=m)) for label, m in rows]


def layout_fusion() -> FusionDefinition:
    """The layout op alone: e4m3 block scales [m, k] and the two offset vectors in, the grouped buffer out."""
    with FusionDefinition() as fd:
        s = define_input(fd, DataType.Float8_e4m3fn, 2)
        io, oo = define_input(fd, DataType.Int32, 1), define_input(fd, DataType.Int32, 1)
        fd.add_output(fd.ops.preprocess_grouped_matmul_input_sf(s, io, oo))
    return fd


def grouped_quantize_fusion() -> FusionDefinition:
    """nv_grouped_block_quantize alone: bf16 x [m, K] and the two offset vectors in, packed FP4 and scales out."""
    with FusionDefinition() as fq:
        xi = define_input(fq, DataType.BFloat16, 2)
        io, oo = define_input(fq, DataType.Int32, 1), define_input(fq, DataType.Int32, 1)
        for o in fq.ops.nv_grouped_block_quantize(xi, io, oo):
            fq.add_output(o)
    return fq


def layout_bytes(m: int, k: int) -> int:
    """The layout op's bytes: the scales read, the whole zero-filled buffer of m + 127 E rows written."""
    return m * k + (m + 127 * E) * ((k + 3) // 4 * 4)


def grouped_quantize_bytes(m: int, big_k: int) -> int:
    """The grouped quantize's bytes: bf16 x read, packed FP4 written, and the layout op's buffer of its scales."""
    return m * big_k * 2 + m * big_k // 2 + (m + 127 * E) * ((big_k // 16 + 3) // 4 * 4)


def bench_layout(dev, timer, copy_bw, quick):
    from pyfuser.kernels import nvfp4_layout as layout_kernels

    K, cases = layout_cases(quick)
    rows = []
    for label, m, counts in cases:
        starts, sf_starts = (t.to(dev) for t in offsets_for(counts))
        k = K // 16

        # --- layout op on e4m3 block scales [m, K/16]
        scales = (torch.rand(m, k, device=dev) * 400 + 1).to(torch.float8_e4m3fn)
        fd = layout_fusion()
        impls = {
            "pyfuser fd op": lambda: fd.execute([scales, starts, sf_starts])[0],
            "pyfuser fd op, offset_checks off": lambda: fd.execute([scales, starts, sf_starts], _disable_options=NO_CHECKS)[0],
            "Triton launcher": lambda: layout_kernels.layout_op(scales, starts, sf_starts),
            "torch reference": lambda: ref.preprocess_grouped_matmul_input_sf(scales, starts, sf_starts),
        }
        expect = grouped_buffer(ref.preprocess_grouped_matmul_input_sf(scales, starts, sf_starts))
        nbytes = layout_bytes(m, k)
        rows += _time_impls("layout op", label, f"[{m}, {k}] e4m3, g={E}", impls, nbytes, dev, timer, copy_bw,
                            check=lambda out: torch.equal(grouped_buffer(out), expect))

        # --- grouped quantize of bf16 activations [m, K]: packed FP4 + grouped swizzled scales, one kernel
        x = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
        fq = grouped_quantize_fusion()
        with FusionDefinition() as fs:  # the two-op form: plain quantize, then the layout op
            xi = define_input(fs, DataType.BFloat16, 2)
            io, oo = define_input(fs, DataType.Int32, 1), define_input(fs, DataType.Int32, 1)
            q, sc = fs.ops.nv_block_quantize(xi)
            fs.add_output(q)
            fs.add_output(fs.ops.preprocess_grouped_matmul_input_sf(sc, io, oo))
        impls = {
            "pyfuser fd op (nv_grouped_block_quantize)": lambda: fq.execute([x, starts, sf_starts]),
            "pyfuser fd op (nv_grouped_block_quantize), offset_checks off":
                lambda: fq.execute([x, starts, sf_starts], _disable_options=NO_CHECKS),
            "pyfuser fd ops (nv_block_quantize + layout op)": lambda: fs.execute([x, starts, sf_starts]),
            "Triton launcher": lambda: layout_kernels.grouped_block_quantize(x, starts, sf_starts),
            "torch reference": lambda: ref.grouped_quantize_nvfp4(x, starts, sf_starts),
        }
        want_q, want_s = ref.grouped_quantize_nvfp4(x, starts, sf_starts)
        want_q, want_s = want_q.view(torch.uint8), grouped_buffer(want_s)
        nbytes = grouped_quantize_bytes(m, K)

        def check_q(out):
            q, s = out
            return torch.equal(q.view(torch.uint8), want_q) and torch.equal(grouped_buffer(s), want_s)

        rows += _time_impls("grouped quantize", label, f"[{m}, {K}] bf16, g={E}", impls, nbytes, dev, timer,
                            copy_bw, check=check_q)
    return rows


def _time_impls(what, label, shape, impls, nbytes, dev, timer, copy_bw, check):
    t_copy = copy_ms(nbytes, dev, timer)
    rows = []
    for name, fn in impls.items():
        row = {"op": what, "case": label, "shape": shape, "impl": name, "bytes": nbytes, "copy_ms": t_copy}
        try:
            row["exact"] = bool(check(fn()))
            row["ms"] = timer(fn)
            row["GBs"] = gbs(nbytes, row["ms"])
            row["pct_copy_bw"] = 100 * row["GBs"] / copy_bw
            row["x_copy_time"] = row["ms"] / t_copy  # 1.0 = as fast as a copy of the same bytes
        except Exception as e:  # one implementation failing must not hide the others
            row["error"] = _err(e)
        rows.append(row)
        print(json.dumps(row))
    return rows


# --------------------------------------------------------------------------------------------------------------
# (b) grouped GEMM


def gemm_cases(quick, shapes=()):
    """(phase, tokens per expert, N, K) of each GEMM case, in the order they run. ``shapes``: (N, tokens per
    expert) pairs from ``--gemm-shapes``, run in the order given (prefill where the tokens are PREFILL_TOKENS / E),
    at K=256 with ``quick``. (Made to test whether the order slows the bf16 row at N=14336 with 16 tokens per
    expert: it does not; where the operands are allocated does, docs/performance.md.)"""
    if shapes:
        k = 256 if quick else K_GEMM
        return [("prefill" if t == PREFILL_TOKENS // E else "decode", t, n, k) for n, t in shapes]
    if quick:
        return [("decode", 2, 128, 256), ("prefill", 100, 128, 256)]
    cases = [("decode", m, n, K_GEMM) for n in N_GEMM for m in DECODE_TOKENS_PER_EXPERT]
    return cases + [("prefill", PREFILL_TOKENS // E, n, K_GEMM) for n in N_GEMM]


_FP4_PAIR_LUT = None


def dequantize_bf16(packed, scales_linear, alpha):
    """Per-call torch dequantization of packed [E, N, K/2] weights to bf16 [E, N, K] (alpha folded in): the naive
    way to run an NVFP4 checkpoint on Hopper. A 256-entry table decodes both nibbles of a byte at once."""
    global _FP4_PAIR_LUT
    if _FP4_PAIR_LUT is None or _FP4_PAIR_LUT.device != packed.device:
        b = torch.arange(256, device=packed.device)
        _FP4_PAIR_LUT = torch.stack([ref.fp4_decode((b & 15).to(torch.uint8)), ref.fp4_decode((b >> 4).to(torch.uint8))], 1)
        _FP4_PAIR_LUT = _FP4_PAIR_LUT.to(torch.bfloat16)
    g, n, kh = packed.shape
    v = _FP4_PAIR_LUT[packed.view(torch.uint8).int()].reshape(g, n, kh * 2 // 16, 16)
    factor = (scales_linear.float() * alpha.view(-1, 1, 1)).to(torch.bfloat16)
    return (v * factor[..., None]).reshape(g, n, kh * 2)


BF16_OTHER_ALLOCATION = "bf16 torch._grouped_mm, operands copied"


def gemm_operands(dev, m_per: int, n: int, k: int) -> SimpleNamespace:
    """One GEMM case's operands, made as the bench makes them: bf16 weights ``w_bf16`` [E, n, k] (fp32 ``randn /
    sqrt(k)`` cast), their NVFP4 quantization ``w``, ``m_per`` tokens ``x`` per expert, the bf16 call's group ends
    ``ends``, the NVFP4 op's arguments ``args`` (tokens quantized by the grouped quantize) and its fp32 reference
    ``expect``. ``ab_bf16_grouped_mm.py`` times the bf16 call on these too."""
    from pyfuser.kernels import nvfp4_layout as layout_kernels

    w_bf16 = (torch.randn(E, n, k, device=dev) / k**0.5).to(torch.bfloat16)
    w = moe_nvfp4.quantize_experts(w_bf16)
    counts = equal_counts(m_per, E)
    m = int(counts.sum())
    starts, sf_starts = (t.to(dev) for t in offsets_for(counts))
    ends = torch.cumsum(counts, 0).to(torch.int32).to(dev)
    ps = torch.tensor([[m_per, n, k]] * E, dtype=torch.int32, device=dev)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    a, a_sf = layout_kernels.grouped_block_quantize(x, starts, sf_starts)
    args = (a, w.packed.transpose(-1, -2), a_sf, w.scales, w.alpha, ps, starts, sf_starts)
    expect = ref.nvfp4_grouped_mm(*args, torch.bfloat16)
    return SimpleNamespace(w_bf16=w_bf16, w=w, m=m, ends=ends, x=x, args=args, expect=expect)


def bench_gemm(dev, timer, copy_bw, quick, shapes=()):
    from pyfuser.kernels import nvfp4_grouped_gemm as grouped_gemm

    rows = []
    fd = _gemm_fusion()
    for phase, m_per, n, k in gemm_cases(quick, shapes):
        label = f"{phase}: {E}x{m_per} tokens, N={n}, K={k}"
        try:
            ops = gemm_operands(dev, m_per, n, k)
            w_bf16, w, m, ends, x, args, expect = ops.w_bf16, ops.w, ops.m, ops.ends, ops.x, ops.args, ops.expect
            a = args[0]
            w_alt, x_alt = w_bf16.clone(), x.clone()
        except Exception as e:
            rows.append({"case": label, "error": _err(e)})
            print(json.dumps(rows[-1]))
            continue
        impls = {
            "pyfuser fd op": (lambda: fd.execute(list(args))[0], expect),
            "pyfuser fd op, offset_checks off": (lambda: fd.execute(list(args), _disable_options=NO_CHECKS)[0], expect),
            "pyfuser fd op, offset_checks off, CUDA graph": (
                _graphed_or_none(dev, lambda: fd.execute(list(args), _disable_options=NO_CHECKS)[0]), expect),
            "pyfuser fd op, cuda_graph option, CUDA graph": (
                (lambda: fd.execute(list(args), _enable_options=["cuda_graph"])[0]) if dev.type == "cuda" else None,
                expect),
            "Triton launcher": (lambda: grouped_gemm.nvfp4_grouped_mm(*args, torch.bfloat16), expect),
            # The bf16 call on its operands and on copies of them in other allocations: at N=14336 its time depends
            # by up to 13% on where its tensors land (docs/performance.md). The ratios take the faster baseline.
            **{name + graph: (call if not graph else _graphed_or_none(dev, call), None)
               for name, call in (
                   ("bf16 torch._grouped_mm", functools.partial(torch._grouped_mm, x, w_bf16.mT, offs=ends)),
                   (BF16_OTHER_ALLOCATION, functools.partial(torch._grouped_mm, x_alt, w_alt.mT, offs=ends)))
               for graph in ("", ", CUDA graph")},
            "dequant + bf16 _grouped_mm": (
                lambda: torch._grouped_mm(x, dequantize_bf16(w.packed, w.scales_linear, w.alpha).transpose(-1, -2),
                                          offs=ends),
                None,
            ),
        }
        fp4_bytes = tensor_bytes(a, w.packed, w.scales, w.alpha) + m * k // 16 + m * n * 2
        bf16_bytes = tensor_bytes(x, w_bf16) + m * n * 2
        case_rows = []
        for name, (fn, want) in impls.items():
            row = {"phase": phase, "case": label, "tokens_per_expert": m_per, "N": n, "K": k, "impl": name}
            try:
                if fn is None:
                    continue  # CUDA-graph rows on a CPU run
                if isinstance(fn, _Deferred):
                    fn = fn.build()
                out = fn()
                # The bf16 paths differ from the NVFP4 math by quantization, so only the NVFP4 ones are checked
                # tightly (against the fp32 reference of the same operands).
                row["rel_err_vs_nvfp4_reference"] = rel_l2(out, expect)
                if want is not None and row["rel_err_vs_nvfp4_reference"] > 1e-2:
                    raise AssertionError(f"relative error {row['rel_err_vs_nvfp4_reference']:.3g} vs the reference")
                row["ms"] = timer(fn)
                nbytes = bf16_bytes if name.startswith("bf16") else fp4_bytes
                row["bytes"] = nbytes
                row["GBs"] = gbs(nbytes, row["ms"])
                row["pct_copy_bw"] = 100 * row["GBs"] / copy_bw
                row["TFLOPs"] = 2 * m * n * k / (row["ms"] * 1e-3) / 1e12
                if timer.read_flush:
                    row["ms_read_flush"] = timer.read_flushed(fn)
            except Exception as e:
                row["error"] = _err(e)
            case_rows.append(row)
        attach_speedups(case_rows)
        for r in case_rows:
            print(json.dumps(r))
        rows += case_rows
        del w_bf16, w, args, expect, impls, w_alt, x_alt
    return rows


def attach_speedups(case_rows: list) -> None:
    """Each row's ``speedup_vs_bf16`` (and ``_read_flush``): the bf16 baseline's time over the row's. CUDA-graph
    rows are compared with bf16 in a CUDA graph too (both then GPU time only); the baseline is the faster of the
    call's two allocations (``BF16_OTHER_ALLOCATION``)."""
    for r in case_rows:
        graph = ", CUDA graph" if r["impl"].endswith("CUDA graph") else ""
        baselines = ("bf16 torch._grouped_mm" + graph, BF16_OTHER_ALLOCATION + graph)
        for key, speedup in (("ms", "speedup_vs_bf16"), ("ms_read_flush", "speedup_vs_bf16_read_flush")):
            bf16_ms = min((b[key] for b in case_rows if b["impl"] in baselines and b.get(key)), default=None)
            if bf16_ms and r.get(key):
                r[speedup] = bf16_ms / r[key]


def _gemm_fusion():
    with FusionDefinition() as fd:
        a = define_input(fd, DataType.Float4_e2m1fn, 2)
        w = define_input(fd, DataType.Float4_e2m1fn, 3, stride_order=[2, 0, 1])
        a_sf = define_input(fd, DataType.Float8_e4m3fn, 2)
        w_sf = define_input(fd, DataType.Float8_e4m3fn, 3)
        alpha = define_input(fd, DataType.Float, 1)
        ps = define_input(fd, DataType.Int32, 2)
        eo, so = define_input(fd, DataType.Int32, 1), define_input(fd, DataType.Int32, 1)
        out = fd.ops.cutlass_nvfp4_grouped_mm(a, w, a_sf, w_sf, alpha, ps, eo, so, dtype=DataType.BFloat16)
        fd.add_output(out)
    return fd


# --------------------------------------------------------------------------------------------------------------
# (c) the MoE layer


def bench_moe(dev, timer, copy_bw, quick):
    if quick:
        cfg, token_counts = moe_nvfp4.MoEConfig(hidden=128, intermediate=64, experts=4, top_k=2), (4, 64)
    else:
        cfg, token_counts = moe_nvfp4.MoEConfig(hidden=4096, intermediate=2048, experts=E, top_k=2), (16, 8192)
    weights = moe_nvfp4.make_weights(cfg, dev)
    layer = moe_nvfp4.MoENVFP4(cfg, moe_nvfp4.quantize_weights(weights))
    bf16 = lambda x: moe_nvfp4.moe_bf16(x, weights.router, weights.w13, weights.w2, cfg.top_k)  # noqa: E731
    compiled = torch.compile(moe_nvfp4.moe_bf16)
    bf16_c = lambda x: compiled(x, weights.router, weights.w13, weights.w2, cfg.top_k)  # noqa: E731
    rows = []
    for t in token_counts:
        x = torch.randn(t, cfg.hidden, device=dev, dtype=torch.bfloat16)
        base = {"tokens": t, "H": cfg.hidden, "I": cfg.intermediate, "E": cfg.experts, "top_k": cfg.top_k}
        expect = bf16(x)
        case_rows = []
        for name, fn in (("pyfuser NVFP4 fusion", lambda: layer(x)),
                         ("pyfuser NVFP4 fusion, offset_checks off", lambda: layer(x, NO_CHECKS)),
                         ("pyfuser NVFP4 fusion, offset_checks off, CUDA graph",
                          _graphed_or_none(dev, lambda: layer(x, NO_CHECKS))),
                         ("pyfuser NVFP4 fusion, cuda_graph option, CUDA graph",
                          (lambda: layer(x, enable_options=["cuda_graph"])) if dev.type == "cuda" else None),
                         ("bf16 eager", lambda: bf16(x)), ("bf16 torch.compile", lambda: bf16_c(x)),
                         ("bf16 eager, CUDA graph", _graphed_or_none(dev, lambda: bf16(x)))):
            row = dict(base, impl=name)
            if fn is None:
                continue
            try:
                if isinstance(fn, _Deferred):
                    fn = fn.build()
                t0 = time.perf_counter()
                out = fn()
                row["first_call_s"] = time.perf_counter() - t0
                row.update({k: v for k, v in moe_nvfp4.relative_errors(out, expect).items()})
                row["ms"] = timer(fn)
                if name.startswith("pyfuser"):
                    f = layer.fusion(t)
                    row["segments"] = [s.kind.value for s in f.segments()]
                    row["runs"] = _runs_as(f.last_runtime())
            except Exception as e:
                row["error"] = _err(e)
            case_rows.append(row)
        by_name = {r["impl"]: r.get("ms") for r in case_rows}
        compile_ms = by_name.get("bf16 torch.compile")
        for r in case_rows:
            # A CUDA-graph row's "vs eager" is against bf16 eager in a CUDA graph.
            eager_ms = by_name.get("bf16 eager" + (", CUDA graph" if r["impl"].endswith("CUDA graph") else ""))
            if r.get("ms"):
                r["speedup_vs_eager"] = eager_ms / r["ms"] if eager_ms else None
                r["speedup_vs_compile"] = compile_ms / r["ms"] if compile_ms else None
            print(json.dumps(r))
        rows += case_rows
    return rows


# --------------------------------------------------------------------------------------------------------------
# targets, report


def _runs_as(runtime) -> list[str]:
    """Per segment: "triton" (generated kernel), "op kernel" (an NVFP4 op's hand-written Triton kernel) or "aten"."""
    return [r.runs_as for r in runtime.describe()]


def _err(e: BaseException) -> str:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    print("".join(tb[-3:]), file=sys.stderr)
    return f"{type(e).__name__}: {e}"


def check_targets(sections: dict) -> list[dict]:
    out = []
    for r in sections.get("gemm") or []:
        if not (r.get("impl", "").startswith("pyfuser fd op") or r.get("impl") == "Triton launcher") or "speedup_vs_bf16" not in r:
            continue
        if r["phase"] != "decode":
            key = "gemm_prefill_vs_bf16"
        else:
            key = "gemm_decode_1_16_vs_bf16" if r["tokens_per_expert"] <= 16 else "gemm_decode_64_vs_bf16"
        for speedup, flush in (("speedup_vs_bf16", ""), ("speedup_vs_bf16_read_flush", ", L2 cleared by a read")):
            if speedup in r:
                out.append({"target": key, "case": f"{r['case']} ({r['impl']}{flush})", "value": r[speedup],
                            "goal": TARGETS[key], "met": r[speedup] >= TARGETS[key]})
    for r in sections.get("layout") or []:
        if (r.get("op") in ("layout op", "grouped quantize") and r.get("impl") != "torch reference"
                and "x_copy_time" in r):
            key = "layout_op_vs_copy" if r["op"] == "layout op" else "grouped_quantize_vs_copy"
            out.append({"target": key, "case": f"{r['case']} ({r['impl']})", "value": r["x_copy_time"],
                        "goal": TARGETS[key], "met": r["x_copy_time"] <= TARGETS[key]})
    return out


def _f(v, fmt=".3f"):
    return "-" if v is None else format(v, fmt)


def report(out_dir, meta, sections, errors, targets, tag=""):
    os.makedirs(out_dir, exist_ok=True)
    day = meta["date"]
    stem = f"{day}-nvfp4" + (f"-{tag}" if tag else "")
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump({"meta": meta, "sections": sections, "errors": errors, "targets": targets}, f, indent=1)
    L = [
        f"# NVFP4 benchmarks, {day}",
        "",
        f"{meta['device']}, torch {meta['torch']}, triton {meta['triton']}. Measured copy bandwidth "
        f"{meta['copy_GBs']:.0f} GB/s (read + write). Times: median of triton.testing.do_bench. Bytes: each input "
        "read once, each output written once (the layout op's whole zero-filled buffer counts as written). "
        "Rows marked \"CUDA graph\" replay the call captured in a CUDA graph (no host work per op, as decode steps "
        "are deployed) and are compared with the bf16 baseline captured the same way. The GEMM's bf16 baseline is "
        "the faster of two allocations of its operands (\"operands copied\": the same call on copies), since at "
        "N=14336 the call's time depends on where its tensors land.",
        "",
        "## Targets",
        "",
        "| target | case | value | goal | met |",
        "|---|---|---|---|---|",
    ]
    for t in targets:
        op = "<=" if t["target"].endswith("_vs_copy") else ">="  # a time ratio for the copies, a speedup else
        L.append(f"| {t['target']} | {t['case']} | {t['value']:.2f}x | {op} {t['goal']}x | {'yes' if t['met'] else 'NO'} |")
    L += ["", "## (a) layout op and grouped quantize", "",
          "| op | case | shape | impl | ms | GB/s | % copy BW | time / copy of same bytes | bit-exact |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in sections.get("layout") or []:
        if "error" in r:
            L.append(f"| {r['op']} | {r['case']} | {r['shape']} | {r['impl']} | error: {r['error'][:120]} |||||")
            continue
        L.append(f"| {r['op']} | {r['case']} | {r['shape']} | {r['impl']} | {r['ms']:.4f} | {r['GBs']:.0f} | "
                 f"{r['pct_copy_bw']:.0f}% | {r['x_copy_time']:.2f}x | {'yes' if r['exact'] else 'NO'} |")
    L += ["", "## (b) grouped GEMM (bf16 out)", "",
          "\"read flush\": the same call timed with L2 cleared by reading 256 MB instead of do_bench's zeroing it "
          "(benchmarks/timing.py), where the timed call writes back none of the flush's dirty lines.", "",
          "| case | impl | ms | speed-up vs bf16 _grouped_mm | ms, read flush | speed-up, read flush | GB/s | "
          "% copy BW | TFLOP/s | rel. err vs NVFP4 ref |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sections.get("gemm") or []:
        if "error" in r:
            L.append(f"| {r['case']} | {r.get('impl', '-')} | error: {r['error'][:120]} ||||||||")
            continue
        L.append(f"| {r['case']} | {r['impl']} | {r['ms']:.4f} | {_f(r.get('speedup_vs_bf16'), '.2f')}x | "
                 f"{_f(r.get('ms_read_flush'), '.4f')} | {_f(r.get('speedup_vs_bf16_read_flush'), '.2f')}x | "
                 f"{r['GBs']:.0f} | {r['pct_copy_bw']:.0f}% | {r['TFLOPs']:.1f} | {r['rel_err_vs_nvfp4_reference']:.2e} |")
    L += ["", "## (c) MoE layer (pyfuser/demo/moe_nvfp4.py)", "",
          "| tokens | H / I / E / top-k | impl | ms | vs bf16 eager | vs bf16 compile | rel. err vs bf16 (max / mean per token) | segments (runs) |",
          "|---|---|---|---|---|---|---|---|"]
    for r in sections.get("moe") or []:
        shape = f"{r['H']} / {r['I']} / {r['E']} / {r['top_k']}"
        if "error" in r:
            L.append(f"| {r['tokens']} | {shape} | {r['impl']} | error: {r['error'][:120]} |||||")
            continue
        segs = ", ".join(f"{k} ({x})" for k, x in zip(r.get("segments", []), r.get("runs", [])))
        L.append(f"| {r['tokens']} | {shape} | {r['impl']} | {r['ms']:.3f} | {_f(r.get('speedup_vs_eager'), '.2f')}x | "
                 f"{_f(r.get('speedup_vs_compile'), '.2f')}x | {r['rel_err_max']:.3f} / {r['rel_err_mean']:.3f} | {segs or '-'} |")
    if errors:
        L += ["", "## Errors", ""] + [f"- {e['section']}: {e['error']}" for e in errors]
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write("\n".join(L) + "\n")
    return "\n".join(L)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sections", default="layout,gemm,moe", help="comma-separated subset of layout,gemm,moe")
    ap.add_argument("--read-flush", action="store_true",
                    help="also time the GEMM rows with L2 cleared by a read (benchmarks/timing.py)")
    ap.add_argument("--tag", default="", help="suffix of the result files' names (<date>-nvfp4-<tag>.md)")
    ap.add_argument("--gemm-shapes", default="",
                    help="only these GEMM cases, in this order: N x tokens per expert, e.g. 14336x16,14336x1")
    args = ap.parse_args(argv)
    gemm_shapes = parse_shapes(args.gemm_shapes) if args.gemm_shapes else ()
    dev = torch.device(args.device)
    torch.manual_seed(0)
    timer = Timer(dev, args.quick, read_flush=args.read_flush)
    copy_bw = copy_bandwidth(dev, timer)
    meta = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_GBs": copy_bw,
        "quick": args.quick,
    }
    print(json.dumps(meta))
    sections, errors = {}, []
    gemm = lambda *a: bench_gemm(*a, shapes=gemm_shapes)  # noqa: E731
    for name, fn in (("layout", bench_layout), ("gemm", gemm), ("moe", bench_moe)):
        if name not in args.sections.split(","):
            continue
        t0 = time.perf_counter()
        try:
            sections[name] = fn(dev, timer, copy_bw, args.quick)
        except Exception as e:  # a failing section must not kill the others
            sections[name] = None
            errors.append({"section": name, "error": _err(e)})
        errors += [{"section": name, "error": f"{r.get('case')} / {r.get('impl')}: {r['error']}"}
                   for r in sections[name] or [] if "error" in r]
        print(f"section {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        # Written after every section, so that a run stopped from outside still leaves the sections it finished.
        report(args.out, meta, sections, errors, check_targets(sections), args.tag)
    targets = check_targets(sections)
    print(report(args.out, meta, sections, errors, targets, args.tag))


if __name__ == "__main__":
    main()
