"""Variants of pyfuser's generated kernels for the bench_fusions.py cases, timed on the GPU.

Each case is planned and run once by pyfuser; its one generated kernel (source, grid, launch arguments) is
captured from the launcher, then re-compiled with source patches and launch options and timed in a CUDA graph
(``triton.testing.do_bench_cudagraph``: GPU time without launch gaps), as % of a measured device copy. Outputs
are compared bit for bit with pyfuser's own (a different reduction order or an approximate function differs).

    python benchmarks/sweep_kernel_variants.py --sections tiles,wide --out benchmarks/results

Sections:
- ``tiles``: rows in a few unrolled tiles (plan.row_tiles) against the plain looped kernel, tile widths and warps;
- ``wide``: the [1024, 65536] looped reductions: grids of 1-2 programs per SM over the rows with L2 eviction
  hints and streaming stores, tile widths, warps, pipelining stages;
- ``bounds``: what cheaper math would give (not eager's bits): ``tanh.approx.f32`` for tanh-GELU, reciprocal
  multiply and ``exp2``-based exp for softmax, and a row divisor's reciprocal with one Markstein correction;
- ``divcheck``: that corrected division against IEEE division on random pairs, by operand range;
- ``pointwise``: block shapes and warps of the slice+add+mul kernel;
- ``clusters``: ``num_ctas`` (Hopper thread-block clusters) on whole-row persistent kernels;
- ``pipeline``: looped reductions with several tiles in flight (pipelined or unrolled column loops);
- ``l2``: [1024, 65536] looped reductions scheduled so that their re-reads of a row hit L2;
- ``rowgrid``: the best of ``l2`` widened (programs per SM, tiles in flight, hints) over the long-row shapes;
- ``persistent``: [1024, 65536] bf16 rows held in registers by one program of 16 or 32 warps, with the fp32 tile
  values of later passes kept or recomputed from the bf16 row (``rematerialized``);
- ``rowpipe``: bf16 [4096, 16384] rows in registers walked by a grid of 1-4 programs per SM, the next row's loads
  pipelined (1-3 stages), against one program per row;
- ``maxnreg``: bf16 row kernels with their registers capped (more programs per SM, some spills);
- ``prefetch``: bf16 rows in registers walked by a grid of 1-8 programs per SM, with and without each row
  block's loads issued one block ahead into registers.
The looped-kernel sections patch plain looped kernels, so they turn plan.wide_rows off (``wide_programs_per_sm=0``).
Results (JSON, one record per variant) go to ``<out>/<date>-kernel-variants<--tag>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import sys
import tempfile

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_fusions as bf  # noqa: E402
from pyfuser.codegen import launcher as launcher_mod  # noqa: E402
from pyfuser.codegen import plan as plan_mod  # noqa: E402

_CAPTURED: list = []
_launch = launcher_mod.Launcher.launch


def _capturing_launch(self, grid, tensors, scalars=(), constexprs=(), jit_tensors=None):
    _CAPTURED.append(dict(fn=self.fn, opts=dict(self.options), grid=tuple(grid), tensors=list(tensors),
                          scalars=tuple(scalars), constexprs=tuple(constexprs)))
    return _launch(self, grid, tensors, scalars, constexprs, jit_tensors)


# --- source patches (generated kernels are plain text) ---------------------------------------------------------
def _indent_after(src: str, line: str, new_line: str) -> str:
    head, tail = src.split(line + "\n", 1)
    return head + new_line + "\n" + "\n".join(("    " + t) if t.strip() else t for t in tail.split("\n"))


def grid_over_rows_staged(stages: int = 0):
    """Each program loops over rows (a grid of a few programs per SM); ``stages``: with Triton's software
    pipeliner on the row loop, the next row's loads issued (as asynchronous copies into shared memory) while the
    current row is reduced (0: no pipelining)."""
    staging = f", num_stages={stages}" if stages else ""

    def patch(src: str) -> str:
        return _indent_after(src, "    pid_r = tl.program_id(0)",
                             "    for pid_r in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_R), tl.num_programs(0)"
                             f"{staging}):")
    return patch


grid_over_rows = grid_over_rows_staged()


_ROW_SETUP = re.compile(r"^    (r|rmask|rc\d+|\w+_roff) = ")
_COL_SETUP = re.compile(r"^    (c|cmask|\w+_coff)(_\d+)? = ")
_LOAD = re.compile(r"^    (\w+) = tl\.load\((t\d+)_ptr (.*)$")


def _next_row(line: str) -> str:
    """A row-setup or row-load line rewritten for the row block ``tl.num_programs(0)`` blocks further on."""
    line = re.sub(r"\bpid_r\b", "(pid_r + tl.num_programs(0))", line)
    line = re.sub(r"\b(\w+)_roff\b", r"\1_roff_n", line)
    line = re.sub(r"\brmask\b", "rmask_n", line)
    line = re.sub(r"\brc(\d+)\b", r"rcn\1", line)
    return re.sub(r"\br\b", "rn", line)


def register_prefetch_hoisting(hoist: bool):
    """A patch: a persistent kernel (rows in registers) as a grid of a few programs per SM walking the row blocks,
    each row block's loads issued into registers one row block ahead (no shared memory, no Triton pipelining):
    the next block's loads are in flight while the current one is reduced and stored. Column coordinates move
    before the loop; with ``hoist`` the loads of column-only tensors (a norm's weight and bias) too, once per
    program (the compiler then keeps them, converted to fp32, in registers across the loop)."""
    return lambda src: register_prefetch(src, hoist)


def register_prefetch(src: str, hoist: bool = False) -> str:
    """The patch of register_prefetch_hoisting(hoist), applied to a persistent kernel's source."""
    head, body = src.split("    pid_r = tl.program_id(0)\n", 1)
    lines = body.rstrip("\n").split("\n")
    rowless = set(re.findall(r"^    (t\d+)_roff = r \* 0$", body, re.M))
    row_setup = [ln for ln in lines if _ROW_SETUP.match(ln)]
    col_setup = [ln for ln in lines if _COL_SETUP.match(ln)]
    row_loads, col_loads = [], []
    for ln in lines:
        m = _LOAD.match(ln)
        if m:
            if m.group(2) not in rowless and f"{m.group(2)}_roff" in ln:
                row_loads.append(ln)
            elif hoist:
                col_loads.append(ln)
    moved = set(row_setup) | set(col_setup) | set(row_loads) | set(col_loads)
    rest = [ln for ln in lines if ln not in moved]
    out = ["    pid_r = tl.program_id(0)", *row_setup, *col_setup, *col_loads]
    out += [ln.replace(" = tl.load(", "_pf = tl.load(", 1) for ln in row_loads]
    out += ["    for pid_r in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_R), tl.num_programs(0)):"]
    loop = list(row_setup)
    loop += [f"    {_LOAD.match(ln).group(1)} = {_LOAD.match(ln).group(1)}_pf" for ln in row_loads]
    loop += [_next_row(ln) for ln in row_setup]
    loop += [_next_row(ln).replace(" = tl.load(", "_pf = tl.load(", 1) for ln in row_loads]
    loop += rest
    out += ["    " + ln for ln in loop]
    return head + "\n".join(out) + "\n"


def eviction_hints(src: str) -> str:
    """Row loads before the last column loop keep their lines in L2 (evict_last); the last pass streams them."""
    loops = [m.start() for m in re.finditer(r"for c0 in ", src)]
    if not loops:
        return src
    rowless = set(re.findall(r"(t\d+)_roff = r \* 0", src))

    def sub(text, policy):
        out = []
        for line in text.split("\n"):
            m = re.search(r"tl\.load\((t\d+)_ptr", line)
            if m and m.group(1) not in rowless:
                line = line.replace("other=0.0)", f"other=0.0, eviction_policy='{policy}')")
            out.append(line)
        return "\n".join(out)

    return sub(src[:loops[-1]], "evict_last") + sub(src[loops[-1]:], "evict_first")


def streaming_stores(src: str) -> str:
    return re.sub(r"(tl\.store\([^\n]*mask=[^\n]*)\)\n", r"\1, cache_modifier='.cs')\n", src)


def reciprocal_division(src: str) -> str:
    return re.sub(r"libdevice\.div_rn\((v\d+), (v\d+)\)", r"(\1 * (1.0 / \2))", src)


def corrected_division(src: str) -> str:
    # q0 = a * RN(1/b); q = fma(fma(-q0, b, a), RN(1/b), q0)
    return re.sub(r"libdevice\.div_rn\((v\d+), (v\d+)\)",
                  r"libdevice.fma(libdevice.fma(-(\1 * libdevice.div_rn(1.0, \2)), \2, \1), "
                  r"libdevice.div_rn(1.0, \2), \1 * libdevice.div_rn(1.0, \2))", src)


def exp2_exp(src: str) -> str:
    return src.replace("libdevice.exp(", "tl.exp(")


def approx_tanh(src: str) -> str:
    return re.sub(r"libdevice\.tanh\((v\d+)\)",
                  r"tl.inline_asm_elementwise('tanh.approx.f32 $0, $1;', '=f,f', [\1], dtype=tl.float32, "
                  r"is_pure=True, pack=1)", src)


_REMAT_CVT = """
@triton.jit
def _bf16_to_f32_again(x):
    # bf16 -> fp32 (the bits shifted up), as an asm block with side effects: the compiler can neither merge it
    # with the first conversion of the same tile nor hoist it, so the fp32 tile is rebuilt from the bf16 one.
    return tl.inline_asm_elementwise("shl.b32 $0, $2, 16; and.b32 $1, $2, -65536;", "=r,=r,r", [x],
                                     dtype=tl.float32, is_pure=False, pack=2)
"""


def rematerialized(src: str) -> str:
    """A persistent kernel whose row is loaded once as bf16 and kept so: each pass after a row reduction
    recomputes the fp32 tile values it reads from the bf16 load (conversion, centring, exp) instead of keeping
    the earlier pass's fp32 tiles live across the reduction (a 65536-element row on 1024 threads: 64 fp32
    registers per tile value, against 32 for the bf16 row)."""
    lines = src.split("\n")
    head = next(i for i, l in enumerate(lines) if l.startswith("@triton.jit") and "def pf_" in lines[i + 1])
    defs: dict = {}  # tile value -> (epoch, right-hand side)
    loads = set()
    epoch = 0
    out = lines[:head]
    out += _REMAT_CVT.split("\n")

    def uses(rhs):
        return re.findall(r"\b(v\d+)\b", rhs)

    def value(var, ep, emitted, body, indent):
        """The name of ``var`` valid in epoch ``ep``, emitting recomputations into ``body``."""
        if var in loads or var not in defs or defs[var][0] == ep:
            return var
        new = f"{var}_e{ep}"
        if new not in emitted:
            rhs = defs[var][1]
            m = re.fullmatch(r"(v\d+)\.to\(tl\.float32\)", rhs)
            if m and m.group(1) in loads:
                rhs = f"_bf16_to_f32_again({m.group(1)})"
            else:
                rhs = re.sub(r"\b(v\d+)\b", lambda u: value(u.group(1), ep, emitted, body, indent), rhs)
            body.append(f"{indent}{new} = {rhs}")
            emitted.add(new)
        return new

    emitted: set = set()
    for line in lines[head:]:
        m = re.match(r"(\s*)(v\d+) = (.*)$", line)
        if m is None or line.strip().startswith("#"):
            if "tl.store(" in line:
                body: list = []
                indent = re.match(r"\s*", line).group(0)
                line = re.sub(r"\b(v\d+)\b", lambda u: value(u.group(1), epoch, emitted, body, indent), line)
                out += body
            out.append(line)
            continue
        indent, var, rhs = m.groups()
        body = []
        here = re.sub(r"\b(v\d+)\b", lambda u: value(u.group(1), epoch, emitted, body, indent), rhs)
        out += body
        out.append(f"{indent}{var} = {here}")
        if rhs.startswith("tl.load(") and "_roff + " in rhs:
            loads.add(var)
        elif "tl.sum(" in rhs or "tl.reduce(" in rhs:
            epoch += 1  # a per-row value: later passes read it as it is
        elif any(u in loads or u in defs for u in uses(rhs)):
            defs[var] = (epoch, rhs)  # (recomputed from its own operands, each as valid in the later epoch)
    return "\n".join(out)


def unrolled(n_tiles: int):
    def patch(src: str) -> str:
        return src.replace("for c0 in range(0, n_cols, BLOCK_C):",
                           f"for c0 in tl.static_range(0, {n_tiles} * BLOCK_C, BLOCK_C):")
    return patch


def pipelined(stages: int):
    """The column loops as ``tl.range(..., num_stages=stages)``: Triton's software pipeliner issues the next tiles'
    loads (as asynchronous copies) while the current one is reduced."""
    def patch(src: str) -> str:
        return src.replace("for c0 in range(0, n_cols, BLOCK_C):",
                           f"for c0 in tl.range(0, n_cols, BLOCK_C, num_stages={stages}):")
    return patch


_COLUMN_LOOP = "for c0 in range(0, n_cols, BLOCK_C):"


def _rewrite_column_loops(src: str, header) -> str:
    """Replace each column loop's header by ``header(pad, k)`` (lines, for the k-th loop; None keeps it), the
    loop's body indented by 4 for each ``for`` line past the first."""
    lines, out, i, k = src.split("\n"), [], 0, 0
    while i < len(lines):
        line = lines[i]
        new = header(line[:len(line) - len(line.lstrip())], k) if line.strip() == _COLUMN_LOOP else None
        if line.strip() == _COLUMN_LOOP:
            k += 1
        if new is None:
            out.append(line)
            i += 1
            continue
        pad = line[:len(line) - len(line.lstrip())]
        out += new
        extra = " " * (4 * (sum(n.strip().startswith("for ") for n in new) - 1))
        i += 1
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(pad)):
            out.append((extra + lines[i]) if lines[i].strip() else lines[i])
            i += 1
    return "\n".join(out)


def unrolled_by(n: int):
    """Each column loop steps n tiles at a time, the n tiles' bodies unrolled (their loads independent of each
    other's arithmetic, so all n are in flight at once); the row's tail tiles are masked as before."""
    def patch(src: str) -> str:
        return _rewrite_column_loops(src, lambda pad, k: [f"{pad}for c00 in range(0, n_cols, {n} * BLOCK_C):",
                                                          f"{pad}    for cu in tl.static_range({n}):",
                                                          f"{pad}        c0 = c00 + cu * BLOCK_C"])
    return patch


def reversed_rereads(src: str) -> str:
    """Column loops alternate direction (the second walks the row backwards, a third forwards again): the tiles
    the previous pass loaded last are the likeliest to be still in L2."""
    return _rewrite_column_loops(src, lambda pad, k: None if k % 2 == 0 else [
        f"{pad}for ci in range(0, tl.cdiv(n_cols, BLOCK_C)):",
        f"{pad}    c0 = (tl.cdiv(n_cols, BLOCK_C) - 1 - ci) * BLOCK_C"])


# --- running variants ------------------------------------------------------------------------------------------
class Sweep:
    def __init__(self):
        self.copy = bf.copy_bandwidth("cuda")
        self.n_sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.records: list = []
        self._folder = tempfile.mkdtemp()
        self._count = 0
        print(f"copy {self.copy:.0f} GB/s, {self.n_sms} SMs", flush=True)

    def _load(self, src: str, name: str):
        self._count += 1
        path = os.path.join(self._folder, f"k{self._count}.py")
        with open(path, "w") as f:
            f.write(src)
        spec = importlib.util.spec_from_file_location(f"variant{self._count}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return getattr(module, name)

    def run(self, case: str, fd, inputs, nbytes: int, variants: list) -> None:
        """``variants``: (label, [source patches], launch options); options may set BLOCK_R/BLOCK_C (the last
        two constexprs) and ``grid`` (a tuple, or a function of (constexprs, captured launch, source))."""
        _CAPTURED.clear()
        outs = fd.execute(inputs)
        torch.cuda.synchronize()
        kernels = [c for c in _CAPTURED if getattr(c["fn"], "__name__", "").startswith("pf_")]
        if len(kernels) != 1:
            print(f"{case}: {len(kernels)} generated kernels, skipped", flush=True)
            return
        cap = kernels[0]
        with open(cap["fn"].fn.__code__.co_filename) as f:
            full = f.read()
        ref = [o.clone() for o in outs]
        for label, patches, options in variants:
            rec = dict(case=case, variant=label)
            try:
                src = full
                for p in patches:
                    src = p(src)
                kernel = self._load(src, cap["fn"].__name__)
                opts = dict(cap["opts"], **options)
                grid = opts.pop("grid", cap["grid"])
                cx = list(cap["constexprs"])
                if "BLOCK_R" in opts:
                    cx[-2] = opts.pop("BLOCK_R")
                if "BLOCK_C" in opts:
                    cx[-1] = opts.pop("BLOCK_C")
                if callable(grid):
                    grid = grid(cx, cap, src)
                for o in outs:
                    o.zero_()

                def launch():
                    return kernel[grid](*cap["tensors"], *cap["scalars"], *cx, **opts)

                compiled = launch()
                torch.cuda.synchronize()
                rec.update(regs=getattr(compiled, "n_regs", None), spills=getattr(compiled, "n_spills", None))
                same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(outs, ref))
                ms = triton.testing.do_bench_cudagraph(launch, rep=60)
                rec.update(ms=round(ms, 4), pct_copy=round(100 * nbytes / (ms * 1e-3) / 1e9 / self.copy, 1),
                           bits_as_pyfuser=same, grid=list(grid), block=cx[-2:], warps=opts.get("num_warps"))
            except Exception as e:  # a variant Triton refuses is a result too
                rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(rec), flush=True)
            self.records.append(rec)


def _cases(shape, dtype, names):
    for name, fd, eager, inputs in bf.make_cases(*shape, "cuda", dtype):
        if name.split(" ")[0].startswith(names):
            yield name, fd, inputs, bf.nbytes(inputs) + bf.nbytes([eager(*inputs)])


def section_tiles(sw: Sweep) -> None:
    with bf.tuning(persistent_max_cols=2048, row_tiles_min_cols=1 << 30, wide_programs_per_sm=0):  # plain looped
        for dtype in (torch.bfloat16, torch.float32):
            for shape in ((8191, 5000), (4096, 16384), (16384, 4096)):
                for name, fd, inputs, nbytes in _cases(shape, dtype, ("rmsnorm", "layernorm", "softmax")):
                    variants = []
                    for bc in (1024, 2048, 4096):
                        n = -(-shape[1] // bc)
                        for warps in (4, 8):
                            variants.append((f"looped bc{bc} w{warps}", [], dict(BLOCK_C=bc, num_warps=warps)))
                            variants.append((f"{n} tiles bc{bc} w{warps}", [unrolled(n)],
                                             dict(BLOCK_C=bc, num_warps=warps)))
                    sw.run(f"{name} {list(shape)}", fd, inputs, nbytes, variants)


def section_wide(sw: Sweep) -> None:
    with bf.tuning(wide_programs_per_sm=0):  # the plain looped kernels these patches expect
        for dtype in (torch.float32, torch.bfloat16):
            for name, fd, inputs, nbytes in _cases((1024, 65536), dtype, ("rmsnorm", "layernorm", "softmax")):
                variants = [("as planned", [], {})]
                for per_sm in (1, 2):
                    for warps in (8, 16):
                        variants.append((f"{per_sm}/SM grid, L2 hints, w{warps}",
                                         [grid_over_rows, eviction_hints, streaming_stores],
                                         dict(grid=(sw.n_sms * per_sm,), num_warps=warps)))
                for bc in (1024, 4096, 8192):
                    for warps in (4, 8, 16):
                        variants.append((f"bc{bc} w{warps}", [], dict(BLOCK_C=bc, num_warps=warps)))
                        variants.append((f"L2 hints bc{bc} w{warps}", [eviction_hints], dict(BLOCK_C=bc, num_warps=warps)))
                variants.append(("1/SM grid, L2 hints, 3 stages", [grid_over_rows, eviction_hints, streaming_stores],
                                 dict(grid=(sw.n_sms,), BLOCK_C=4096, num_warps=16, num_stages=3)))
                sw.run(f"{name} [1024, 65536]", fd, inputs, nbytes, variants)


def section_bounds(sw: Sweep) -> None:
    for shape in ((16384, 4096), (8191, 5000), (32768, 1024)):
        for name, fd, inputs, nbytes in _cases(shape, torch.bfloat16, ("gelu", "softmax")):
            if name.startswith("gelu"):
                variants = [("exact", [], {}), ("tanh.approx.f32", [approx_tanh], {})]
            else:
                variants = [("exact", [], {}), ("reciprocal multiply", [reciprocal_division], {}),
                            ("corrected reciprocal", [corrected_division], {}), ("exp2-based exp", [exp2_exp], {}),
                            ("both approximate", [reciprocal_division, exp2_exp], {})]
            sw.run(f"{name} {list(shape)}", fd, inputs, nbytes, variants)


@triton.jit
def _division_mismatches(a_ptr, b_ptr, bad_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + offs, mask=m, other=1.0)
    b = tl.load(b_ptr + offs, mask=m, other=1.0)
    r = libdevice.div_rn(1.0, b)
    q0 = a * r
    q = libdevice.fma(libdevice.fma(-q0, b, a), r, q0)
    ref = libdevice.div_rn(a, b)
    bad = (q.to(tl.int32, bitcast=True) != ref.to(tl.int32, bitcast=True)) & (ref == ref)
    tl.atomic_add(bad_ptr, tl.sum(bad.to(tl.int32)))


def section_divcheck(sw: Sweep) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    n = 1 << 26

    def random_floats(lo, hi):  # random bits with exponents in [lo, hi)
        mant = torch.randint(0, 1 << 23, (n,), device="cuda", generator=g, dtype=torch.int32)
        exp = torch.randint(lo + 127, hi + 127, (n,), device="cuda", generator=g, dtype=torch.int32)
        sign = torch.randint(0, 2, (n,), device="cuda", generator=g, dtype=torch.int32) << 31
        return (sign | (exp << 23) | mant).view(torch.float32)

    ranges = {
        "exponents -100..100 (quotients may over/underflow)": lambda: (random_floats(-100, 100), random_floats(-100, 100)),
        "softmax-like: a in [0, 1), b in [1, 65536)": lambda: (
            torch.rand(n, device="cuda", generator=g), 1 + torch.rand(n, device="cuda", generator=g) * 65535),
        "subnormal a, b in [1, 65536)": lambda: (
            random_floats(-126, -125).view(torch.int32).bitwise_and(0x807FFFFF).view(torch.float32),
            1 + torch.rand(n, device="cuda", generator=g) * 65535),
    }
    for label, make in ranges.items():
        bad = torch.zeros(1, dtype=torch.int32, device="cuda")
        for _ in range(8):
            a, b = make()
            _division_mismatches[(n // 4096,)](a, b, bad, n, BLOCK=4096)
        rec = dict(divcheck=label, pairs=8 * n, mismatches=int(bad))
        print(json.dumps(rec), flush=True)
        sw.records.append(rec)


def section_pointwise(sw: Sweep) -> None:
    for shape in ((16384, 4096), (8191, 5000), (4096, 16384), (32768, 1024), (1024, 65536)):
        for name, fd, inputs, nbytes in _cases(shape, torch.bfloat16, ("slice+add+mul",)):
            variants = [("as planned", [], {})]
            for br, bc, warps in ((4, 2048, 8), (8, 1024, 8), (2, 2048, 4), (4, 1024, 4), (1, 4096, 8)):
                def grid(cx, cap, src, br=br, bc=bc):
                    m = re.search(r"n_cols = n_cols_q \* (\d+)", src)
                    rows, cols = cap["constexprs"][-4], cap["constexprs"][-3] * (int(m.group(1)) if m else 1)
                    return (-(-rows // br) * -(-cols // bc),)
                variants.append((f"{br}x{bc} w{warps}", [], dict(BLOCK_R=br, BLOCK_C=bc, num_warps=warps, grid=grid)))
            sw.run(f"{name} {list(shape)}", fd, inputs, nbytes, variants)


def section_clusters(sw: Sweep) -> None:
    with bf.tuning(persistent_max_cols=1 << 17):  # whole 65536-wide rows in one (clustered) program
        for name, fd, inputs, nbytes in _cases((1024, 65536), torch.float32, ("rmsnorm", "softmax")):
            sw.run(f"{name} [1024, 65536]", fd, inputs, nbytes,
                   [(f"num_ctas {c} w{w}", [], dict(num_ctas=c, num_warps=w)) for c in (2, 4, 8) for w in (8, 16)])


def section_pipeline(sw: Sweep) -> None:
    """Looped reductions with more than one tile in flight per program: pipelined column loops, or loops unrolled
    by 2-4 tiles ([1024, 65536] in both dtypes; [4096, 16384] fp32 forced onto the looped kernel)."""
    with bf.tuning(persistent_max_cols=8192, row_tiles_min_cols=1 << 30, wide_programs_per_sm=0):
        shapes = [((1024, 65536), torch.bfloat16), ((1024, 65536), torch.float32), ((4096, 16384), torch.float32)]
        for shape, dtype in shapes:
            for name, fd, inputs, nbytes in _cases(shape, dtype, ("rmsnorm", "layernorm", "softmax")):
                variants = [("as planned", [], {})]
                for bc in (2048, 4096):
                    for warps in (8, 16):
                        for st in (2, 3):
                            variants.append((f"stages{st} bc{bc} w{warps}", [pipelined(st)],
                                             dict(BLOCK_C=bc, num_warps=warps)))
                for bc in (1024, 2048):
                    for warps in (8, 16):
                        for n in (2, 4):
                            variants.append((f"unroll{n} bc{bc} w{warps}", [unrolled_by(n)],
                                             dict(BLOCK_C=bc, num_warps=warps)))
                sw.run(f"{name} {list(shape)}", fd, inputs, nbytes, variants)


def section_l2(sw: Sweep) -> None:
    """[1024, 65536] looped reductions whose later passes re-read the row: with every row in flight at once
    (1024 programs) the rows are several times L2, so the re-reads come from HBM. Variants that keep them in L2:
    a grid of 1-2 programs per SM over the rows (with several tiles in flight per program), or later passes
    walking the row backwards."""
    with bf.tuning(wide_programs_per_sm=0):  # the plain looped kernels these patches expect
        for dtype in (torch.bfloat16, torch.float32):
            for name, fd, inputs, nbytes in _cases((1024, 65536), dtype, ("rmsnorm", "layernorm", "softmax")):
                variants = [("as planned", [], {})]
                for per_sm in (1, 2):
                    for n in (2, 4):
                        for bc in (2048, 4096):
                            for warps in (16, 32):
                                variants.append((f"{per_sm}/SM unroll{n} bc{bc} w{warps}",
                                                 [eviction_hints, streaming_stores, unrolled_by(n), grid_over_rows],
                                                 dict(grid=(sw.n_sms * per_sm,), BLOCK_C=bc, num_warps=warps)))
                for bc in (2048, 4096):
                    for warps in (8, 16):
                        variants.append((f"reversed bc{bc} w{warps}", [reversed_rereads],
                                         dict(BLOCK_C=bc, num_warps=warps)))
                        variants.append((f"2/SM reversed unroll2 bc{bc} w{warps}",
                                         [reversed_rereads, unrolled_by(2), grid_over_rows],
                                         dict(grid=(sw.n_sms * 2,), BLOCK_C=bc, num_warps=warps)))
                sw.run(f"{name} [1024, 65536]", fd, inputs, nbytes, variants)


def section_rowgrid(sw: Sweep) -> None:
    """The best of ``l2`` widened: a grid of 1-2 programs per SM over the rows, 32 warps, 4-8 tiles in flight,
    with and without the L2 eviction hints and streaming stores; the long-row shapes that miss today."""
    shapes = [((1024, 65536), torch.bfloat16), ((1024, 65536), torch.float32), ((4096, 16384), torch.float32),
              ((4096, 16384), torch.bfloat16)]
    with bf.tuning(persistent_max_cols=8192, row_tiles_min_cols=1 << 30, wide_programs_per_sm=0):  # looped kernels
        for shape, dtype in shapes:
            names = ("rmsnorm", "layernorm", "softmax") if shape[1] == 65536 else ("layernorm", "softmax")
            for name, fd, inputs, nbytes in _cases(shape, dtype, names):
                variants = [("as planned (looped)", [], {})]
                for per_sm in (1, 2):
                    for bc, n in ((4096, 4), (4096, 8), (8192, 2), (8192, 4)):
                        for hints in (True, False):
                            patches = ([eviction_hints, streaming_stores] if hints else []) + [unrolled_by(n),
                                                                                             grid_over_rows]
                            variants.append((f"{per_sm}/SM unroll{n} bc{bc} w32{' hints' if hints else ''}", patches,
                                             dict(grid=(sw.n_sms * per_sm,), BLOCK_C=bc, num_warps=32)))
                sw.run(f"{name} {list(shape)}", fd, inputs, nbytes, variants)


def section_persistent(sw: Sweep) -> None:
    """[1024, 65536] bf16 rows held in registers by one program each (the row: 32 registers per thread as bf16
    on 32 warps), against the planned wide looped kernel, which re-reads each row from L2 once per pass."""
    for name, fd, inputs, nbytes in _cases((1024, 65536), torch.bfloat16, ("rmsnorm", "layernorm", "softmax")):
        sw.run(f"{name} [1024, 65536]", fd, inputs, nbytes, [("as planned (wide looped)", [], {})])
    with bf.tuning(persistent_max_cols=65536, wide_min_cols=65536):
        for name, fd, inputs, nbytes in _cases((1024, 65536), torch.bfloat16, ("rmsnorm", "layernorm", "softmax")):
            variants = []
            for warps in (32, 16):
                variants.append((f"persistent w{warps}", [], dict(BLOCK_R=1, num_warps=warps)))
                variants.append((f"persistent w{warps}, rematerialized", [rematerialized],
                                 dict(BLOCK_R=1, num_warps=warps)))
            variants.append(("persistent w32, rematerialized, 1 stage", [rematerialized],
                             dict(BLOCK_R=1, num_warps=32, num_stages=1)))
            sw.run(f"{name} [1024, 65536]", fd, inputs, nbytes, variants)


def section_rowpipe(sw: Sweep) -> None:
    """bf16 rows of 16384 held in registers (persistent, 16 warps, two programs per SM by registers): a grid of
    1-4 programs per SM walking the rows, with the next row's loads in flight (1-3 pipeline stages), against
    one program per row."""
    for dtype in (torch.bfloat16,):
        for name, fd, inputs, nbytes in _cases((4096, 16384), dtype, ("layernorm", "softmax")):
            variants = [("as planned (persistent)", [], {})]
            for warps in (16, 8):
                for per_sm in (1, 2, 4):
                    for stages in (1, 2, 3):
                        variants.append((f"{per_sm}/SM w{warps} stages{stages}", [grid_over_rows_staged(stages)],
                                         dict(grid=(sw.n_sms * per_sm,), num_warps=warps)))
            sw.run(f"{name} [4096, 16384]", fd, inputs, nbytes, variants)


def section_prefetch(sw: Sweep) -> None:
    """bf16 rows held in registers (persistent kernels and rows in tiles): a grid of k programs per SM walking the
    row blocks, plain (``walk``) and with each block's loads issued one block ahead into registers
    (``prefetch``, register_prefetch), against one program per row block as planned."""
    for shape in ((16384, 4096), (8191, 5000), (32768, 1024), (4096, 16384)):
        for name, fd, inputs, nbytes in _cases(shape, torch.bfloat16, ("rmsnorm", "layernorm", "softmax")):
            variants = [("as planned", [], {})]
            for per_sm in (1, 2, 4, 8):
                grid = (sw.n_sms * per_sm,)
                variants.append((f"walk {per_sm}/SM", [grid_over_rows], dict(grid=grid)))
                variants.append((f"prefetch {per_sm}/SM", [register_prefetch], dict(grid=grid)))
                if name.startswith("layernorm"):
                    variants.append((f"prefetch+hoist {per_sm}/SM", [register_prefetch_hoisting(True)],
                                     dict(grid=grid)))
            sw.run(f"{name} {list(shape)}", fd, inputs, nbytes, variants)


def section_maxnreg(sw: Sweep) -> None:
    """bf16 row kernels held in registers, their registers capped (Triton's ``maxnreg``) so that more programs
    fit on an SM (at the cost of spills), against the compiler's own allocation."""
    for shape in ((4096, 16384), (8191, 5000), (16384, 4096)):
        for name, fd, inputs, nbytes in _cases(shape, torch.bfloat16, ("layernorm", "softmax")):
            variants = [("as planned", [], {})] + [(f"maxnreg {r}", [], dict(maxnreg=r)) for r in (32, 40, 48)]
            sw.run(f"{name} {list(shape)}", fd, inputs, nbytes, variants)


SECTIONS = dict(tiles=section_tiles, wide=section_wide, bounds=section_bounds, divcheck=section_divcheck,
                pointwise=section_pointwise, clusters=section_clusters,
                pipeline=section_pipeline, l2=section_l2, rowgrid=section_rowgrid, persistent=section_persistent,
                rowpipe=section_rowpipe, maxnreg=section_maxnreg,
                prefetch=section_prefetch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sections", default="tiles", help="comma-separated subset of " + ",".join(SECTIONS))
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="", help="suffix of the result file's name")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("sweep_kernel_variants.py times real kernels: it needs a CUDA device")
    launcher_mod.Launcher.launch = _capturing_launch
    sw = Sweep()
    for name in args.sections.split(","):
        SECTIONS[name](sw)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{datetime.date.today().isoformat()}-kernel-variants{args.tag}.json")
    with open(path, "w") as f:
        json.dump(dict(copy_gb_s=sw.copy, device=torch.cuda.get_device_name(), records=sw.records), f, indent=0)
    print("wrote", path)


if __name__ == "__main__":
    main()
