"""Planning one generated kernel for a kernel segment, for one set of boundary layouts.

From the segment's loop domain and the sizes/strides of every tensor it reads or writes (real inputs, or the
meta-inferred layouts of other segments' outputs), the plan
- drops loop dims of extent 1 and merges adjacent loop dims that every tensor walks contiguously (so a fully
  contiguous pointwise kernel indexes with one flat offset), keeping row and column dims apart;
- lowers every op into a KernelBuilder and emits the Triton source;
- fixes the launch: block sizes, grid, warps, and the size/stride arguments.
Strides are runtime arguments: Triton specializes on their values (==1, divisibility by 16) and on pointer
alignment, so a row pitch like 4097 elements can never be assumed vector-aligned (nvFuser issue #4888).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..ir.dtypes import to_torch_dtype
from ..ir.nodes import Scalar, TensorView, Vector
from ..ops.registry import OpKind
from .kernel_builder import (COMPILE_OPTIONS, KernelBuilder, TensorParam, kernel_source, online_softmax_sums,
                             rewrite_nodes, uses_gelu_tail, welford_moments)
from .launcher import next_pow2
from ..segment.loop_domain import LoopDomain, NotFusable, build_loop_domain, column_dims, memory_operands

_SIG_DTYPE = {
    torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.uint64: "u64", torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5",
}
INT32_MAX = 2**31 - 1
GRID_Y_MAX = 65535  # CUDA's limit for a grid's y dimension


@dataclass
class TensorMeta:
    sizes: tuple
    strides: tuple
    dtype: torch.dtype


@dataclass
class KernelPlan:
    name: str
    source: str
    mode: str
    inputs: list  # segment input TensorViews, in pointer order
    outputs: list  # segment output TensorViews, in pointer order (after the inputs)
    scalar_vals: list  # Scalars passed by value, in argument order
    fixed_args: list  # sizes, strides, n_rows, n_cols
    block_r: int
    block_c: int
    grid: tuple
    num_warps: int
    n_rows: int
    n_cols: int
    arg_types: dict  # argument name -> Triton signature type ("*bf16", "i64", "fp32", "constexpr")
    # Run-time checks (index_select's index range): the kernel takes the call's error flags (int32) after the
    # tensor pointers and one slot per check after the scalars (codegen/gather_lowerings.py).
    checks: tuple = ()
    # What a load prologue is emitted from (plan_kernel's ``prologue_of``, codegen/prologue.py): the builder, the
    # tensor params, the row/column runs, index64, the argument names of ``fixed``. None otherwise.
    prologue_state: Optional[dict] = None
    # ptxas's register cap for this kernel (Triton's ``maxnreg``), where a form trades registers for
    # instructions (TUNING["bf16_gelu_tail_max_registers"]); None: ptxas chooses.
    max_registers: Optional[int] = None

    def compile_options(self) -> dict:
        """Triton's compile options for this kernel: the generated kernels' (kernel_builder.COMPILE_OPTIONS)
        and its register cap (the interpreter ignores it)."""
        if self.max_registers is None:
            return dict(COMPILE_OPTIONS)
        return {**COMPILE_OPTIONS, "maxnreg": self.max_registers}

    def compile_spec(self) -> tuple[dict, dict]:
        """(signature, constexprs) for ``triton.compile`` of this kernel ahead of time (e.g. for sm_90 in CI)."""
        return dict(self.arg_types), {"BLOCK_R": self.block_r, "BLOCK_C": self.block_c}


def _dims_strides(tv: TensorView, meta: TensorMeta, dom: LoopDomain) -> dict:
    """loop dim -> stride for the dims ``tv``'s memory really walks. Size-1 and stride-0 dims contribute
    nothing. The actual layout decides, not the IR: e.g. the sum of an expanded tensor keeps an expanded dim in
    the IR, but eager materializes it, so the output is written along it."""
    result = {}
    for d, ld in enumerate(dom.dims_of[id(tv)]):
        if meta.sizes[d] == 1 or meta.strides[d] == 0:
            continue
        result[ld] = meta.strides[d]
    return result


def _loop_sizes(dom: LoopDomain, tensors: list) -> dict:
    """Extent of each loop dim, from the tensors the kernel reads or writes (the dims they really walk); a
    reduced dim no tensor walks (a dim broadcast_in_dim expands inside the kernel) takes its static extent from
    the IR. Disagreeing extents, or an unknown reduced extent, send the segment to ATen."""
    sizes: dict = {}
    for tv, meta in tensors:
        for d, ld in enumerate(dom.dims_of[id(tv)]):
            n = int(meta.sizes[d])
            if n == 1 or meta.strides[d] == 0:
                continue
            if ld in dom.narrow:  # a top-k's k next to its input's n: the loop runs over n (narrow_masks)
                sizes[ld] = max(sizes.get(ld, n), n)
                continue
            if sizes.get(ld, n) != n:
                raise NotFusable(f"extents {sizes[ld]} and {n} share one loop dim")
            sizes[ld] = n
    for tid, tv in dom.tensors.items():
        for ld, idom in zip(dom.dims_of[tid], tv.logical):
            if ld in sizes or ld not in dom.reduced or (idom.is_broadcast and not idom.expanded):
                continue
            if idom.extent is None:
                raise NotFusable(f"the extent of a reduced dim of {tv.name} is only known at run time")
            sizes[ld] = int(idom.extent)
    return sizes


def _alias_row_dim_to_reduced(dom: LoopDomain, sizes: dict) -> None:
    """Walk a row dim as the reduced dim when both have the same extent and no tensor of the kernel has both.

    A row reduction whose result is broadcast back to a shape read from another tensor (``broadcast_in_dim(sum,
    shape=fd.ops.shape(t))``, RMSNorm's backward) puts the broadcast dim and the reduced dim in separate loop
    dims when nothing in the segment links them: the kernel then had a row per element of the broadcast output
    and each row re-reduced the whole reduced dim (nvFuser's test_shared_memory_usage: 393,248 rows of 24,578).
    Values along either dim only meet through per-row values, so one column coordinate can serve both. Plans are
    per exact input shape, so the equal extents hold for every call of the plan."""
    reduced = [ld for ld in dom.col_dims if sizes.get(ld, 1) != 1]
    if len(reduced) != 1:
        return
    (red,) = reduced
    for ld in dom.row_dims:
        if sizes.get(ld) != sizes[red] or any(ld in dims and red in dims for dims in dom.dims_of.values()):
            continue
        for tid, dims in dom.dims_of.items():
            dom.dims_of[tid] = [red if d == ld else d for d in dims]
        dom.dims.remove(ld)
        dom.n_row -= 1
        del sizes[ld]
        return


def _merge(group: list, sizes: dict, walks: list[dict], pinned=frozenset()) -> list[list]:
    """Split ``group`` (outer to inner) into runs of loop dims every tensor can walk as one flat dim. ``pinned``
    loop dims stay runs of their own."""
    runs: list[list] = []
    for ld in group:  # ``ld`` is inner to every dim already placed
        if sizes.get(ld, 1) == 1:
            continue
        if ld in pinned or (runs and runs[-1][-1] in pinned):
            runs.append([ld])
            continue
        if runs:
            outer = runs[-1][-1]
            ok = True
            for w in walks:
                so, si = w.get(outer), w.get(ld)
                # A flat walk: the outer dim steps over the whole inner dim.
                if (so is None) != (si is None) or (so is not None and so != si * sizes[ld]):
                    ok = False
                    break
            if ok:
                runs[-1].append(ld)
                continue
        runs.append([ld])
    return runs


def plan_kernel(segment, metas: dict, scalar_exprs: list, prologue_of: Optional[TensorView] = None,
                embedded: bool = False) -> KernelPlan:
    """``metas``: id(tv) -> TensorMeta for every segment input and output tensor. ``prologue_of``: the segment's
    one output, for a pointwise segment planned as a load prologue (codegen/prologue.py): the loop dims of its
    dims stay coordinates of their own, so that the prologue can be called at its (row, column) coordinates.
    ``embedded``: the plan's code runs inside a hand-written kernel with warps of its own (an epilogue,
    codegen/epilogue.py), as a prologue's does."""
    kernel_exprs = [e for e in segment.exprs if e not in scalar_exprs]
    made_here = {id(o) for e in kernel_exprs for o in e.outputs}
    if any(id(v) in made_here for e in scalar_exprs for v in e.inputs):
        # Host scalars are evaluated before the launch; one reading a tensor this kernel makes cannot be.
        raise NotFusable("a host scalar reads a tensor computed inside the kernel")
    outputs = [o for o in segment.outputs if isinstance(o, TensorView)]
    # 0-dim CPU tensors (is_cpu inputs) cannot be read by a GPU kernel: they are passed by value.
    inputs = [v for v in segment.inputs if isinstance(v, TensorView) and not v.is_cpu]
    host_tensors = [v for v in segment.inputs if isinstance(v, TensorView) and v.is_cpu]
    if not outputs:
        raise NotFusable("segment has no tensor outputs")
    # Reductions and scans work along the kernel's columns: either makes it a row kernel.
    reduction = next((e for e in kernel_exprs if column_dims(e)), None)
    has_scan = any(e.op.kind is OpKind.SCAN for e in kernel_exprs)
    if reduction is not None:
        reference = next(v for v in reduction.inputs if isinstance(v, TensorView))
        ref_meta = next((metas[id(t)] for t in inputs if t.ndim == reference.ndim), None)
    else:
        reference = max(outputs, key=lambda t: _numel(metas[id(t)].sizes))
        ref_meta = metas[id(reference)]
    order = None
    if ref_meta is not None:
        from ..ir.tensor_layout import allocation_order_from_strides

        order = allocation_order_from_strides(ref_meta.sizes, ref_meta.strides)
    dom = build_loop_domain(kernel_exprs, reference, order)
    # Memory reads (slice, pad, cat, ...): their operands are read through views; an input read only that way
    # is no tensor of the loop domain.
    # Exprs absorbed into a reader that recomputes them at its own coordinates are lowered only there.
    absorbed = [e for e in kernel_exprs if id(e) in dom.absorbed]
    if any(id(o) in {id(t) for t in segment.outputs} for e in absorbed for o in e.outputs):
        raise NotFusable("a value recomputed at shifted coordinates is also needed outside the kernel")
    kernel_exprs = [e for e in kernel_exprs if id(e) not in dom.absorbed]
    accesses = {}
    for e in kernel_exprs:
        if getattr(e.op.lower, "plan_access", None) is not None:
            relocated = {vid: closure for (rid, vid), closure in dom.relocated.items() if rid == id(e)}
            accesses[id(e)] = e.op.lower.plan_access(e, metas, relocated)
    views = [v for a in accesses.values() for v in a.views]
    through_views = {id(v) for e in kernel_exprs for v in memory_operands(e)}
    through_views |= {id(t) for e in absorbed for t in e.inputs}
    inputs_read = [v for v in inputs if id(v) in dom.tensors or id(v) not in through_views]
    # (tensor whose loop dims index it, its layout) for every tensor argument: inputs, views, outputs.
    memory = ([(tv, metas[id(tv)]) for tv in inputs_read]
              + [(v.target, TensorMeta(v.sizes, v.strides, metas[id(v.source)].dtype)) for v in views]
              + [(tv, metas[id(tv)]) for tv in outputs])
    if any(_numel(meta.sizes) == 0 for _, meta in memory) or any(_numel(metas[id(v.source)].sizes) == 0 for v in views):
        # Nothing to compute (or, for reductions over an empty dim, eager's own semantics): leave it to ATen.
        raise NotFusable("a tensor of the segment is empty")
    for tv, _ in memory:
        if any(ld is None for ld in dom.dims_of.get(id(tv), [])):
            raise NotFusable(f"{tv.name} is not in the loop domain")
        if id(tv) not in dom.dims_of:
            dom.dims_of[id(tv)] = []
    sizes = _loop_sizes(dom, memory)
    if reduction is not None and not accesses and not has_scan and prologue_of is None:
        _alias_row_dim_to_reduced(dom, sizes)
    walks = [_dims_strides(tv, meta, dom) for tv, meta in memory]
    # Dims whose coordinate a lowering reads get a run of their own (their coordinate is then one variable).
    pinned = {dom.dims_of[id(tv)][d] for a in accesses.values() for tv, d in a.coords}
    if prologue_of is not None:
        if reduction is not None or has_scan:
            raise NotFusable("a load prologue has no reductions or scans")
        pinned |= set(dom.dims_of[id(prologue_of)])
    if reduction is None:
        # Pointwise: merge across the row/column split too; the innermost run is the column dim, so a fully
        # contiguous kernel becomes one flat 1-D index.
        runs = _merge(dom.row_dims + dom.col_dims, sizes, walks, pinned)
        row_runs, col_runs = runs[:-1], runs[-1:]
    else:
        row_runs = _merge(dom.row_dims, sizes, walks, pinned)
        col_runs = _merge(dom.col_dims, sizes, walks, pinned)
    for w in walks:  # a tensor dim that walks a dropped (extent-1) loop dim is fine; anything else is a bug
        for ld in w:
            if sizes.get(ld, 1) != 1 and not any(ld in run for run in row_runs + col_runs):
                raise NotFusable("internal: loop dim missing from the plan")

    params: list[TensorParam] = []
    fixed_sizes = [_prod(sizes[ld] for ld in run) for run in row_runs + col_runs]
    factors = _coordinate_factors(memory, walks, row_runs, col_runs)
    stride_args: list[int] = []
    index64 = False
    n_in = len(inputs_read) + len(views)
    for k, ((tv, meta), w) in enumerate(zip(memory, walks)):
        p = TensorParam(f"t{k}", meta.dtype, is_output=k >= n_in)
        view = views[k - len(inputs_read)] if len(inputs_read) <= k < n_in else None
        max_off = 0
        for axis, (terms, runs) in enumerate(((p.row_terms, row_runs), (p.col_terms, col_runs))):
            for i, run in enumerate(runs):
                inner = run[-1]
                if inner in w:
                    stride = int(w[inner])
                    factor = factors[axis, i]
                    if stride % factor:
                        factor = 1  # see _coordinate_factors: this coordinate's one constant does not divide ours
                    terms.append((i, f"{p.name}_s{len(stride_args)}", factor))
                    stride_args.append(stride // factor)
                    max_off += abs(stride) * (_prod(sizes[ld] for ld in run) - 1)
        if view is not None:
            view.param = p
            src = metas[id(view.source)]
            # Masked-off lanes may address outside the source: bound what any lane computes.
            max_off += abs(view.base) + sum(abs(int(st)) * (int(n) - 1) for n, st in zip(src.sizes, src.strides))
            if view.base:
                p.base = f"{p.name}_b"
                stride_args.append(view.base)
            for j, st in enumerate(view.gathers):
                p.gathers.append(f"{p.name}_g{j}")
                stride_args.append(int(st))
        index64 |= max_off > INT32_MAX
        params.append(p)
    n_rows = _prod(fixed_sizes[: len(row_runs)])
    n_cols = _prod(fixed_sizes[len(row_runs):])
    index64 |= n_rows * max(n_cols, 1) > INT32_MAX

    kb = KernelBuilder()
    kb.access = accesses
    kb.has_columns = bool(col_runs)
    kb.n_cols = n_cols
    kb.coordinate_of = _coordinate_resolver(kb, dom, sizes, row_runs, col_runs, index64)
    narrow = narrow_masks(kb, dom, sizes, memory, views)
    scalar_vals = _lower(segment, kernel_exprs, kb, inputs_read, params, outputs, host_tensors, views, narrow)
    for p, v in kb.stores:
        if v.full and not p.has_col:
            # e.g. the squeeze of an expanded dim that another output of the kernel materializes: the value is
            # taken along a dim the output does not have. ATen picks the element; the kernel has no such read.
            raise NotFusable(f"output {p.name} has no column dims but its value varies along the kernel's columns")
    itemsize = max(p.dtype.itemsize for p in params)
    # Scans, argsorts and top-k's narrow (lane-masked) results need each row whole in one tile.
    whole_rows = has_scan or any(v.kind in ("scan", "argsort") or v.valid is not None for v in kb.nodes)
    tiles = wide = None
    if reduction is None:
        mode = "pointwise"
    elif n_cols <= TUNING["persistent_max_cols"]:
        tiles = None if whole_rows else row_tiles(n_cols, kb.max_level, itemsize)
        row_inputs = sum(1 for p in params if p.has_col and not p.is_output)
        wide = None if whole_rows or tiles is not None else wide_rows(n_cols, itemsize, kb.max_level, row_inputs)
        mode = "persistent" if tiles is None and wide is None else "looped"
    elif whole_rows:
        raise NotFusable(f"a scan, argsort or top-k over {n_cols} columns (generated kernels keep the whole row in "
                         "registers for them)")
    else:
        mode = "looped"
        wide = wide_rows(n_cols, itemsize, kb.max_level)
    n_cols_factor = _aligned_factor(n_cols, 1)
    # (the element size of the row-sized tensors the kernel reads: what a wide kernel's later passes re-read)
    row_in_itemsize = min((p.dtype.itemsize for p in params if p.has_col and not p.is_output), default=itemsize)
    # A variance's moments in one pass (kernel_builder.welford_moments), in lanes of one vector of the row input
    welford = (welford_moments(kb) if wide is not None and n_cols > TUNING["wide_min_cols"]
               and row_in_itemsize >= TUNING["wide_welford_min_itemsize"] else {})
    welford_group = (max(16 // row_in_itemsize, 1)
                     if welford and row_in_itemsize <= TUNING["wide_welford_grouped_max_itemsize"] else 0)
    # A softmax's sums that wide rows add in their max's pass (online) or with the fast exp in a pass of their own
    softmax_sums = online_softmax_sums(kb) if wide is not None else {}
    online = bool(softmax_sums) and row_in_itemsize >= TUNING["wide_online_softmax_min_itemsize"]
    form = None  # the wide kernel's form and row element size, for the knobs set per form (wide_form)
    if wide is not None:
        # (rows wide only for their row inputs, no longer than wide_min_cols, have keys of their own)
        inputs = "" if n_cols > TUNING["wide_min_cols"] else " row inputs"
        form = f"{wide_form(kb.max_level, online, welford, welford_group)}{inputs}:{row_in_itemsize}"
        wide = _wide_tiles_of_form(wide, n_cols, form)
    if _for_form(TUNING["wide_literal_cols"], form):
        # The source's n_cols a constant (n_cols_q is then 1, which Triton's JIT specializes): the column loops'
        # trip counts are known to the compiler, which may unroll them (plans are per exact shape already).
        n_cols_factor = n_cols
    # Rows whose width is no multiple of every column tensor's 16-byte vector (Emitter.split_interior).
    min_itemsize = min((p.dtype.itemsize for p in params if p.has_col), default=16)
    ragged = (mode == "pointwise" and len(col_runs) == 1 and n_cols_factor * min_itemsize < 16 and not embedded
              and prologue_of is None and n_cols >= TUNING["pw_ragged_min_cols"])
    split_interior = 16 // min_itemsize if ragged else 0  # (one vector of the narrowest column tensor)
    # A row vector broadcast over the tile's rows (a bias: a column tensor without row dims, not gathered);
    # _blocks caps the warps of such a pointwise kernel, except over ragged rows, whose 256-column tiles the cap
    # would leave on one warp (and a 4999-column bf16 bias kernel compiles without a layout conversion).
    row_vector = any(v.kind == "load" and v.param.has_col and not v.param.has_row and not v.operands
                     for v in kb.nodes)
    if tiles is not None:
        (block_c, n_tiles, num_warps), block_r = tiles, 1
    else:
        n_tiles = 0
        block_r, block_c, num_warps = _blocks(mode, n_rows, n_cols, itemsize, kb.max_level, ragged,
                                              16 // min_itemsize if row_vector and not ragged else 0)
        if wide is not None:
            block_c, unroll, num_warps, programs = wide
    # Tiles of at least four elements per thread are a power-of-two multiple of four per thread. (A load
    # prologue's or an epilogue's code runs inside a hand-written kernel whose tiles or warps this plan does not
    # fix: 1, unknown.)
    lanes = block_r * block_c // (32 * num_warps) if prologue_of is None and not embedded else 1
    # Column tiles wholly inside the row: their column mask is a constant (Emitter.full_col_tiles). The plan is
    # per exact shape, and the source says which it assumed.
    full_col_tiles = not split_interior and not n_tiles and (
        n_cols == block_c if mode == "persistent" else n_cols % ((unroll if wide else 1) * block_c) == 0)
    rewrite_nodes(kb, lanes if lanes >= 4 else 1, gelu_tail=TUNING["bf16_gelu_tail"],
                  widening_shifts=not _for_form(TUNING["wide_cvt_widenings"], form))
    # The GELU tail's PTX block holds four lanes' operands at once (46 registers uncapped); capped, more programs
    # fit per SM with no spill (sass_census.py).
    max_registers = TUNING["bf16_gelu_tail_max_registers"] if uses_gelu_tail(kb) else None
    n_blocks_r = -(-n_rows // block_r)
    n_blocks_c = -(-n_cols // block_c)
    grid_2d = (mode == "pointwise" and prologue_of is None and not embedded and n_blocks_r <= GRID_Y_MAX
               and _pointwise_grid_2d(max_registers))
    source_body = kernel_source("KERNEL", kb, params, len(row_runs), len(col_runs), mode, index64, n_cols_factor,
                                n_tiles, unroll if wide else 0, split_interior, full_col_tiles,
                                softmax_sums=softmax_sums, online_softmax=online,
                                fast_exp_sums=TUNING["wide_fast_exp_sums"], welford=welford,
                                welford_group=welford_group, grid_2d=grid_2d)
    name = "pf_" + mode + "_" + hashlib.sha1(source_body.encode()).hexdigest()[:12]
    source = source_body.replace("def KERNEL(", f"def {name}(")
    grid = (n_blocks_r * n_blocks_c,) if mode == "pointwise" else (n_blocks_r,)
    if grid_2d:
        grid = (n_blocks_c, n_blocks_r)  # column blocks fastest: the one-dimensional grid's program order
    if wide is not None:
        grid = (min(n_blocks_r, programs),)
    if grid[0] > INT32_MAX:  # CUDA's limit for a grid's x dimension (Triton would fail with an OverflowError)
        raise NotFusable(f"{grid[0]} programs exceed the {INT32_MAX} a kernel grid allows")
    fixed = fixed_sizes + stride_args + [v for _, v in kb.fixed_ints] + [n_rows, n_cols // n_cols_factor]
    arg_types = {f"{p.name}_ptr": "*" + _SIG_DTYPE[p.dtype] for p in params}
    if kb.checks:
        arg_types["err_ptr"] = "*i32"
    for i, sv in enumerate(scalar_vals):
        arg_types[f"s{i}"] = "fp32" if _arg_dtype(sv).is_floating_point else "i64"
    for i in range(len(kb.checks)):
        arg_types[f"err_slot{i}"] = "i32"
    fixed_names = [f"rs{i}" for i in range(len(row_runs))] + [f"cs{i}" for i in range(len(col_runs))]
    fixed_names += [name for p in params for name in p.arg_names()] + [name for name, _ in kb.fixed_ints]
    fixed_names += ["n_rows", "n_cols" if n_cols_factor == 1 else "n_cols_q"]
    for n, v in zip(fixed_names, fixed):
        arg_types[n] = "i32" if abs(v) <= INT32_MAX else "i64"
    arg_types.update(BLOCK_R="constexpr", BLOCK_C="constexpr")
    pointer_inputs = inputs_read + [v.source for v in views]
    state = None
    if prologue_of is not None:
        state = dict(kb=kb, params=params, row_runs=row_runs, col_runs=col_runs, index64=index64,
                     dims=list(dom.dims_of[id(prologue_of)]), fixed_names=fixed_names, sizes=sizes)
    return KernelPlan(name, source, mode, pointer_inputs, outputs, scalar_vals, fixed, block_r, block_c, grid,
                      num_warps, n_rows, n_cols, arg_types, tuple(kb.checks), state, max_registers)


def _pointwise_grid_2d(max_registers) -> bool:
    """TUNING["pointwise_grid_2d"] for a kernel of this register cap (None: uncapped)."""
    choice = TUNING["pointwise_grid_2d"]
    return choice is True or (choice == "capped" and max_registers is not None)


def _coordinate_resolver(kb: KernelBuilder, dom: LoopDomain, sizes: dict, row_runs, col_runs, index64: bool):
    """coordinate_of(tv, dim): the KValue of the coordinate of ``tv``'s dim in the kernel (its loop dim has a run
    of its own; an extent-1 dim is always at 0)."""
    dtype = torch.int64 if index64 else torch.int32
    made: dict = {}

    def coordinate_of(tv, d):
        ld = dom.dims_of[id(tv)][d]
        if sizes.get(ld, 1) == 1:
            return kb.const(0, dtype)
        if ld not in made:
            for axis, runs, flat, prefix in ((0, row_runs, "r", "rc"), (1, col_runs, "c", "cc")):
                for i, run in enumerate(runs):
                    if ld in run:
                        if run != [ld]:
                            raise NotFusable("internal: a coordinate's loop dim was merged")
                        name = flat if len(runs) == 1 else f"{prefix}{i}"
                        made[ld] = kb.coordinate(name, axis == 1, dtype)
            if ld not in made:
                raise NotFusable("internal: loop dim of a coordinate missing from the plan")
        return made[ld]

    return coordinate_of


class _ReadThroughView:
    """Stands for an operand that its memory-read op reads through views (it has no value in the kernel)."""


def narrow_masks(kb: KernelBuilder, dom: LoopDomain, sizes: dict, memory: list, views: list) -> dict:
    """id(tensor) -> the Bool lanes where a tensor narrower than its loop dims exists (a top-k result, k of the n
    columns it shares a loop dim with): its loads and stores are masked to them."""
    masks: dict = {}
    for tv, meta in memory:
        for d, ld in enumerate(dom.dims_of[id(tv)]):
            n = int(meta.sizes[d])
            if ld not in dom.narrow or n == 1 or meta.strides[d] == 0 or n == sizes.get(ld, 1):
                continue
            if any(v.target is tv for v in views):
                raise NotFusable(f"a memory read of {tv.name} is narrower than its loop dim")
            inside = kb.op("{0} < {1}", [kb.coordinate_of(tv, d), kb.fixed_int(n)], torch.bool)
            prev = masks.get(id(tv))
            masks[id(tv)] = inside if prev is None else kb.op("{0} & {1}", [prev, inside], torch.bool)
    return masks


def folded_constant(s: Scalar) -> Any:
    """The value of a scalar computed from constants only (``reciprocal(define_scalar(2560.0))``), evaluated now
    by its ops' own evaluators, as the host would evaluate it before every launch; None when it depends on an input.
    The kernel then holds it as a literal of the dtype its consumer computes in: a Double value stays exact in
    Double arithmetic, where passing it by value would round it to fp32 (Triton types Python floats as fp32)."""
    if s.is_constant:
        return s.value
    e = s.defined_by
    if e is None or not all(isinstance(o, Scalar) for o in e.outputs):
        return None
    missing = object()

    def fold(a):
        if isinstance(a, Scalar):
            v = folded_constant(a)
            return missing if v is None else v
        if isinstance(a, (TensorView, Vector)):
            return missing
        if isinstance(a, (list, tuple)):
            items = [fold(x) for x in a]
            return missing if any(x is missing for x in items) else type(a)(items)
        return a

    args = fold(tuple(e.args))
    kwargs = {k: fold(v) for k, v in e.kwargs.items()}
    if args is missing or any(v is missing for v in kwargs.values()):
        return None
    try:
        result = e.op.run(e, args, kwargs)
    except Exception:  # let the host step evaluate (and report) it as before
        return None
    if len(e.outputs) > 1:
        result = result[e.outputs.index(s)]
    if isinstance(result, torch.Tensor):
        result = result.item() if result.numel() == 1 and not result.is_complex() else None
    return result if isinstance(result, (bool, int, float)) else None


def _lower(segment, kernel_exprs, kb: KernelBuilder, inputs, params, outputs, host_tensors, views,
           narrow: dict) -> list:
    """Lower every expr; returns the Vals passed by value (symbolic Scalars, 0-dim CPU tensors), in argument
    order."""
    values: dict[int, Any] = {}
    for e in kernel_exprs:
        for v in memory_operands(e):
            values[id(v)] = _ReadThroughView()
    for tv, p in zip(inputs, params):
        mask = narrow.get(id(tv))
        values[id(tv)] = kb.load(p, mask=mask)
        values[id(tv)].valid = mask
    scalar_vals = []
    for tv in host_tensors:
        values[id(tv)] = kb.arg(f"s{len(scalar_vals)}", _arg_dtype(tv))
        scalar_vals.append(tv)

    def resolve(obj, local=None):
        """Kernel values for an expr's arguments; ``local`` (id -> value) first: a recomputation's own values."""
        if local is not None and isinstance(obj, (Scalar, TensorView)) and id(obj) in local:
            return local[id(obj)]
        if isinstance(obj, Vector):
            return [resolve(e, local) for e in obj.elements]
        if isinstance(obj, Scalar):
            if obj.is_constant:
                return obj.value
            folded = folded_constant(obj)
            if folded is not None:
                return folded
            if id(obj) not in values:
                values[id(obj)] = kb.arg(f"s{len(scalar_vals)}", _arg_dtype(obj))
                scalar_vals.append(obj)
            return values[id(obj)]
        if isinstance(obj, TensorView):
            return values[id(obj)]
        if isinstance(obj, list):
            return [resolve(x, local) for x in obj]
        if isinstance(obj, tuple):
            return tuple(resolve(x, local) for x in obj)
        return obj

    kb.resolve = resolve

    for e in kernel_exprs:
        args = resolve(e.args)
        kwargs = {k: resolve(v) for k, v in e.kwargs.items()}
        result = e.op.lower(e, kb, *args, **kwargs)
        if len(e.outputs) == 1:
            result = (result,)
        for o, r in zip(e.outputs, result):
            values[id(o)] = r
    for tv, p in zip(outputs, params[len(params) - len(outputs):]):
        kb.store(p, values[id(tv)], narrow.get(id(tv)))
    return scalar_vals


def _coordinate_factors(memory, walks, row_runs, col_runs) -> dict:
    """(0 for rows / 1 for columns, run index) -> the one power-of-two constant strides along that coordinate may
    be written with in the source, as ``coord * (stride_arg * factor)``: the largest any tensor's stride allows.
    Every tensor whose stride it divides is written with it (an fp32 output beside bf16 inputs, all with a row
    pitch of 4096: 8, two fp32 vectors, where its own vector would be 4), a tensor whose stride it does not divide
    with a plain ``coord * stride``. (Only an fp32 tensor proven 16-byte aligned is stored without a layout
    conversion: Triton lays an unproven store out one element per thread and moves the tile there through shared
    memory.)

    The factor (up to a 16-byte vector) lets Triton prove row starts aligned when they are (a row pitch of 5000
    bf16 is 16-byte aligned; 4097 is not, and then nothing is claimed: nvFuser issue #4888). One per coordinate:
    ptxas (the 12.8 that Triton 3.6 ships, and 13.0) miscompiles a coordinate scaled by two different constants:
    ``rc0 * (s0 * 4)`` for an int32 and ``rc0 * (s9 * 2)`` for an int64 tensor both became ``(rc0 * 4) * s``
    (SASS read on the H200; out-of-bounds stores, fuzzer seeds 2538, 3225, 3562, 4785, 5522, 6886, 8128), while
    a constant next to plain products of the same coordinate compiles correctly (measured)."""
    factors = {}
    for (tv, meta), w in zip(memory, walks):
        itemsize = meta.dtype.itemsize
        for axis, runs in enumerate((row_runs, col_runs)):
            for i, run in enumerate(runs):
                if run[-1] in w:
                    f = _aligned_factor(int(w[run[-1]]), itemsize)
                    factors[axis, i] = max(factors.get((axis, i), f), f)
    return factors


def _aligned_factor(stride: int, itemsize: int) -> int:
    """Largest power of two dividing ``stride`` (elements), capped at one 16-byte vector."""
    factor = 1
    while factor * 2 * itemsize <= 16 and stride % (factor * 2) == 0:
        factor *= 2
    return factor


def _arg_dtype(s) -> torch.dtype:
    """What Triton receives for a by-value argument (a Scalar or a 0-dim CPU tensor's item): Python floats arrive
    as fp32 and bools are passed as ints."""
    dt = to_torch_dtype(s.dtype)
    if dt == torch.bool:
        return torch.int32
    if dt.is_complex:
        raise NotFusable(f"complex scalar {s.name} has no Triton lowering")
    if dt.is_floating_point:
        if dt == torch.float64:
            raise NotFusable(f"Double scalar {s.name} would be passed to Triton as fp32")
        return torch.float32
    return torch.int64


# Launch heuristics. Measured on the H200 (benchmarks/sweep_shapes.py; benchmarks/results/
# 2026-12-01-sweep-shapes.jsonl); a module dict so a sweep can try others. Rows up to 16384 elements stay in
# registers (RMSNorm [4096, 16384]: 88% of copy bandwidth persistent, 66% looped; [8191, 5000]: 78% vs 75%); 4096
# elements per pointwise program (tanh-GELU over bf16: 62% vs 56% with 8192).
TUNING = {
    "pw_elems_narrow": 4096,  # elements per program for 1- and 2-byte tensors
    "pw_elems": 4096,
    "pw_max_block_c": 2048,  # column tile of a 2-D pointwise kernel
    "pw_warps": 8,
    # Rows at least this wide whose width is no multiple of a vector: column tile (at most the row's width).
    # benchmarks/sweep_ragged.py (2026-12-04-ragged-sweep.jsonl, before the last tile's vector-wide tail), bf16
    # slice+add+mul, % of copy with tiles of 1024 / 512 / 256 / 128: [32768, 1023] 81.6 / 81.5 / 84.0 / 81.5,
    # [8191, 4999] 84.1 / 85.5 / 85.8 / 65.3, wider rows 91-93% down to 256, 89-91% at 128 (one masked tile:
    # 77-83%). With the tail (-run2): 84.2 / 83.3 / 84.1 / 80.4 and 86.4 / 86.4 / 82.5 / 75.0 (run-to-run noise
    # is about 2 points); 256 has the best mean of the two runs.
    "pw_ragged_min_cols": 128,
    "pw_ragged_block_c": 256,
    "pw_row_vector_warps": True,  # at most BLOCK_C / (32 x vector) warps with a broadcast row vector (_blocks)
    "persistent_max_cols": 16384,  # longer rows use the looped kernel
    "persistent_elems": 2048,  # rows per program: up to this many elements
    "persistent_warps": {2048: 4, 8192: 8, 1 << 62: 16},  # by elements per program
    "looped_block_c": 2048,
    # Rows in a few tiles (row_tiles): widths tried, widest first; at most this many tiles, this much waste.
    "row_tiles_widths": (4096, 2048, 1024),
    "row_tiles_max": 8,
    "row_tiles_max_waste": 0.2,
    "row_tiles_min_cols": 2048,
    "row_tiles_warps": 8,
    # Rows with two or more dependent reductions (softmax, LayerNorm) meet across warps once per level: they
    # run fewer warps, more elements per thread (sweep of 2026-12-02, bf16: softmax [16384, 4096] 78% -> 84%
    # of copy, [32768, 1024] 71% -> 76%, LayerNorm [16384, 4096] 86% -> 88%; within noise for RMSNorm's one
    # level, so it keeps the table above). Persistent rows of 1- and 2-byte elements: this many elements per
    # thread. Rows in tiles: the narrowest tile (least masked waste) and warps by element size.
    "multi_pass_elems_per_thread": 32,
    "multi_pass_row_tiles_widths": (1024, 2048, 4096),  # narrowest first
    "multi_pass_row_tiles_warps": {2: 4, 4: 8},  # by the widest element's bytes (bf16 5000 columns: softmax
    # 52% -> 61%, LayerNorm 73% -> 79%; fp32: softmax 83% -> 88%, LayerNorm 90%, unchanged)
    "looped_warps": 8,
    # Rows too long for registers (wide_rows): programs per SM walking rows in turn, tile width, tiles in flight
    # per step, warps (benchmarks/sweep_kernel_variants.py sections l2 and rowgrid, 2026-12-02).
    "wide_min_cols": 16384,  # longer looped rows are wide (all of them, while persistent_max_cols is 16384)
    "wide_programs_per_sm": 2,
    "wide_block_c": 8192,
    # Rows of 4-byte elements with two or more reduction passes that read at least wide_fp32_min_row_inputs
    # row-sized tensors are wide from this many columns on, in tiles of wide_fp32_block_c: a persistent kernel
    # keeps each of them in registers across the passes and spills (fp32 [4096, 16384]: LayerNorm, x, w and b,
    # 80% persistent -> 84-86% wide). A softmax reads x alone and stays persistent (93% against 76% wide since
    # its row max takes one instruction; 69% -> 75% before). RMSNorm, one pass, stays persistent at 94%; bf16
    # rows lose: LayerNorm 81% -> 66%. (benchmarks/results/2026-12-02-fp32-wide-rows.jsonl)
    "wide_fp32_min_cols": 16384,
    "wide_fp32_min_row_inputs": 2,
    "wide_fp32_block_c": 4096,
    "wide_unroll": 4,
    "wide_warps": 32,
    # A softmax over wide rows whose row input has elements of at least this many bytes sums its exps in its
    # max's pass, relative to a running max (two passes over the row instead of three, a cross-warp row max per
    # tile more: kernel_builder._online_softmax_sums). H100, ab_trees.py against three passes, two rounds
    # (benchmarks/results/2026-12-06-ab-online-fp32-h100*.json, -ab-gelu-tail-h100*.json): [1024, 65536] fp32
    # 77.3 -> 81.1-81.3% of copy, bf16 65.2-65.6 -> 62.0% (bf16 rows keep three passes). Not run on the H200.
    "wide_online_softmax_min_itemsize": 4,
    # The terms of a softmax's sum over wide rows take the prelude's _exp_ftz (ex2.approx.ftz: 2 SASS instructions,
    # tl.exp 5, libdevice's expf about 8): in the online sum, and in the sum's own pass where it is not online
    # (rows of 1- and 2-byte elements, which add libdevice's exp there otherwise; the output pass computes the
    # quotient's exact exp again in any case). sass_census.py, softmax [1024, 65536]: bf16 1734 -> 1538
    # instructions, fp32 1488 -> 1393, registers unchanged. H100, sweep_tuning.py, 3 rounds
    # (results/2026-12-06-tuning-fast-exp-h100.json): bf16 0.1346 -> 0.1205 ms (66.0 -> 73.7% of copy), fp32
    # 0.2203 -> 0.2185 ms; the online sum with it for bf16 rows too stays slower (0.1420 ms).
    "wide_fast_exp_sums": True,
    # A bf16 tanh-GELU's tail with tanh's exp form and an exact fallback near bf16 rounding midpoints
    # (codegen/gelu_tanh_bf16.py): 15% fewer instructions on the fast path (sm_90, bf16 [16384, 4096]: 34.8 ->
    # 29.4 per element), exact (GPU tests). Its PTX block holds four lanes' operands at once: uncapped, ptxas
    # takes 46 registers against the exact kernel's 32 (5 programs of 8 warps per SM instead of 8), and the form
    # lost: 2-4% on the H100 (-ab-gelu-tail-h100*.json), 0.970-1.004x on the H200 (-ab-gelu-tail-h200.json).
    # Capped at 40 registers (no spill; 6 programs per SM) it wins on the H100 at all five roofline shapes, 3
    # rounds (-tuning-gelu-tail-cap*-h100.json): [16384, 4096] 96.5 -> 95.5 us, [8191, 5000] 63.2 -> 63.3,
    # [32768, 1024] 51.9 -> 50.6, [4096, 16384] 95.7 -> 94.3, [1024, 65536] 96.7 -> 95.0 (uncapped: 98.6-99.4,
    # 64.2-64.6, 52.4-53.1 us). At 32 registers it spills (a 40-byte stack, 31.4 instructions per element).
    # Without libdevice's select of t = 1 from |z| >= 9.0109 (the exp form rounds to it there): 27.5 per element,
    # 1.1-2.9% faster on the H100 (-ab-gelu-noselect-h100.json). H200, 3 rounds, exact kernel -> this tail
    # (-tuning-gelu-tail-s18-h200.json): 5.2-9.4% faster at the five roofline shapes, 66.7-71.4 -> 70.3-76.7% of copy.
    "bf16_gelu_tail": True,
    "bf16_gelu_tail_max_registers": 40,  # ptxas's register cap for a kernel with that tail (None: uncapped)
    # Pointwise kernels launched on their own, on a (column blocks, row blocks) grid instead of one dimension whose
    # id each program divides by the column blocks (Emitter.grid_2d): True for all, "capped" for those whose
    # registers the plan caps (the bf16 tanh-GELU tail's), False for none. sm_90 SASS (sass_census.py), hot
    # instructions per element: bf16 tanh-GELU 25.6 -> 24.1 at [16384, 4096], 25.9 -> 23.9 at [8191, 5000] (the
    # kernel is bound by instruction issue on the H200), registers unchanged under the cap; fp32 tanh-GELU 31.9 ->
    # 30.5, 40 -> 38 registers. But bf16 slice+add+mul (memory-bound) goes from 32 to 40 registers, 8 to 6
    # programs per SM, so uncapped kernels keep one dimension until a GPU A/B says otherwise.
    "pointwise_grid_2d": "capped",
    # A variance over rows longer than wide_min_cols, in whole tiles, whose row input has elements of at least
    # this many bytes, accumulates its squared deviations in its mean's pass by Welford's update per lane
    # (kernel_builder.welford_moments): two passes over the row instead of three, two more lane accumulators.
    # H200, LayerNorm, benchmarks/sweep_tuning.py, 3 rounds (results/2026-12-06-tuning-welford*-h200.json), lanes
    # of one column: fp32 [1024, 65536] 0.193 -> 0.184 ms (65.6 -> 68.7% of copy; its kernel held 64 registers
    # already); bf16 0.093 -> 0.108 ms, where the lanes take the kernel from 32 registers to 52 and one program
    # per SM instead of two; bf16 rows take it in lanes of one vector (below). fp32 [4096, 16384] (wide for its
    # row inputs) lost 0.154 -> 0.197 ms, so rows no longer than wide_min_cols keep three passes.
    "wide_welford_min_itemsize": 1,
    # Welford lanes of one 16-byte vector of the row input (8 bf16 or 4 fp32 columns, one thread's, summed and
    # centred in its registers, then merged into lanes that many times narrower) for row inputs of at most this
    # many bytes: the lane accumulators that cost the kernel its second program per SM shrink (its tiles:
    # wide_tiles). sass_census.py, LayerNorm [1024, 65536], registers: bf16 52 -> 43
    # grouped (the form without Welford: 32); fp32 60 -> 56. H100, sweep_tuning.py, 3 rounds
    # (results/2026-12-06-tuning-welford-grouped-h100.json), against the default of then (bf16 without Welford,
    # fp32 in lanes of one column): bf16 0.1269 -> 0.1112 ms (70.0 -> 79.9% of copy; 0.1222 in tiles of 4096),
    # fp32 0.2379 -> 0.2420 ms grouped (0.2646 in tiles of 4096), so fp32 rows keep lanes of one column.
    "wide_welford_grouped_max_itemsize": 2,
    # Wide kernels with n_cols written into their source (see plan_kernel), by form (True: every form; else the
    # "<wide_form>:<bytes>" keys of wide_tiles it lists). H100, sweep_tuning.py, [1024, 65536], 3 rounds, every
    # form at once (results/2026-12-06-tuning-wide-serpentine-h100.json): bf16 RMSNorm 104.1 -> 99.7 us (85.2
    # -> 88.9% of copy), the others 1-9% slower; on another H100, that form alone (-tuning-wide-s17-h100.json):
    # 102.3 -> 98.6 us. H200, 3 rounds (-tuning-wide-s18-h200.json): that form 84.0 -> 77.7 us (75.7 -> 81.8%).
    "wide_literal_cols": ("2 passes:2",),
    # Wide forms whose bf16 -> fp32 widenings keep the conversion instruction instead of the integer shifts
    # (kernel_builder._bf16_widenings_as_shifts; the same bits), by form as wide_literal_cols. bf16 RMSNorm: the
    # conversion's byte permutes hold the kernel at 44 registers (32 with the shifts), so one of its 32-warp
    # programs fits per SM, and with a grid of 8 programs per SM (wide_tiles) each program takes about one row
    # and the SM that finishes first takes the next. H100, sweep_tuning.py, 3 rounds, [1024, 65536]
    # (results/2026-12-06-tuning-wide-cvt2-h100.json, -grid8-h100.json): 16384 x 2, 8 programs per SM: 0.0961-
    # 0.0967 ms (91.9-92.4% of copy) against 0.1036-0.1043 with the shifts (two programs then share an SM);
    # the table's one program per SM walking its rows: 0.0997-0.1011 ms with the shifts (16384 x 4; 16384 x 2:
    # 0.1017-0.1027), 0.0990 ms with the conversion and two programs per SM, one resident (the eighteenth
    # session's kernel). The conversion alone, one program per SM: 0.1011 against 0.1017 ms (-cvt-h100.json);
    # for bf16 LayerNorm and softmax it was 1-2% slower.
    "wide_cvt_widenings": ("2 passes:2",),
    # (tile width, tiles per step[, programs per SM]) of wide rows by the kernel's form and its row input's element
    # size, "<plan.wide_form>:<bytes>" for rows longer than wide_min_cols and "<plan.wide_form> row inputs:<bytes>"
    # for rows wide only for their row inputs (wide_rows; none tuned yet), where a sweep found them better than
    # (wide_block_c or, for the latter, wide_fp32_block_c; wide_unroll; wide_programs_per_sm). H100, [1024, 65536],
    # sweep_tuning.py, 2 rounds
    # (results/2026-12-06-tuning-wide-unroll-h100.json, % of copy against 8192 x 4): RMSNorm bf16 16384 x 2 86.9
    # (79.1); LayerNorm bf16 16384 x 4 86.3 (80.0); softmax fp32 16384 x 2 87.3 (81.5), bf16 8192 x 8 76.9 (74.0).
    # The same tiles lost elsewhere: RMSNorm fp32 16384 x 2 80.8 (83.7), LayerNorm fp32 16384 x 2 68.2 (74.9),
    # softmax bf16 16384 x 2 69.6. The tile width matters apart from the bytes in flight: bf16 RMSNorm's 8192 x 4
    # and 16384 x 2 move the same 64 KiB per step. LayerNorm fp32 (Welford lanes of one column) 8192 x 2 78.0
    # (74.8), where RMSNorm fp32 lost 83.4 -> 67.9 with it (-tuning-wide-fp32-h100.json); RMSNorm fp32 16384 x 4
    # with 4 programs per SM 85.9 (83.5; 3 or 4 programs per SM in 8192 x 4: 85.1), 3 rounds
    # (-tuning-wide-rms-fp32-h100.json). bf16 softmax with its sum online stays slower in every tiling tried
    # (61-69 against 76.9, -tuning-wide-softmax-bf16-online-h100.json). One run of the table against no table, 3
    # rounds: -tuning-wide-tiles-table-h100.json. H200, 3 rounds, the table against none (both without the literal
    # row length; -tuning-wide-s18-h200.json): every form faster, RMSNorm bf16 76.2 -> 75.7 (81.8 with its literal
    # length), LayerNorm bf16 68.7 -> 72.1, softmax bf16 60.2 -> 63.0, RMSNorm fp32 80.5 -> 83.7, LayerNorm fp32
    # 68.7 -> 72.0, softmax fp32 69.4 -> 72.5% of copy.
    # bf16 RMSNorm ("2 passes:2") must run one program per SM at a time: up to the eighteenth session its kernel
    # had 44 registers, so one of its 32-warp programs fit per SM whatever the grid; the bf16 widenings as shifts
    # (nineteenth session) took it to 32, two programs then ran at once and [1024, 65536] went 98 -> 112 us on an
    # H100 (bench_fusions, 2026-12-06-fusions-h100-s18.md against -s20.md). It keeps the conversions
    # (wide_cvt_widenings) and so its 44 registers; tests/test_wide_tiles.py pins each form's residency.
    # Twenty-first session, H100, 3 rounds (-tuning-wide-grid8-h100.json): a grid of 8 programs per SM where the
    # registers let one run per SM, so each takes about one row (the block scheduler balances the SMs): bf16
    # RMSNorm as above; fp32 RMSNorm 0.2067 -> 0.2014 ms (85.9 -> 88.2%; 58 registers), fp32 softmax 0.2033 ->
    # 0.2019 ms (87.3 -> 87.9%; 63 registers); bf16 LayerNorm 88.0 -> 86.9% and bf16 softmax (two resident)
    # 77.6 -> 77.0% lost, fp32 LayerNorm 78.1 -> 78.3% (noise), so those keep theirs (-softmax-ln-h100.json:
    # bf16 softmax with one or four programs per SM, or other tiles, at best equal).
    "wide_tiles": {"2 passes:2": (16384, 2, 8), "2 passes:4": (16384, 4, 8),
                   "2 passes welford vector:2": (16384, 4), "2 passes welford column:4": (8192, 2),
                   "2 passes online:4": (16384, 2, 8), "3 passes:2": (8192, 8)},
}


def wide_rows(n_cols: int, itemsize: int, passes: int, row_inputs: int = 1) -> Optional[tuple[int, int, int, int]]:
    """(tile width, tiles per step, warps, programs) of a looped kernel, whose rows are too long to hold in
    registers: every pass after the first re-reads the row. With one program per row all rows are read at
    once (1024 rows of 65536 floats: 256 MiB, five times the H200's L2), so the re-reads come from HBM and a
    two-pass RMSNorm moves 1.5x its bytes. Instead a grid of ``wide_programs_per_sm`` programs per SM walks the
    rows in turn, so the rows being read fit in L2; each program keeps ``wide_unroll`` tiles of ``wide_block_c``
    in flight to pull its share of the bandwidth, marks the loads its later passes re-read evict_last and
    streams its outputs (H200, [1024, 65536], % of copy bandwidth: RMSNorm bf16 60 -> 79, fp32 62 -> 76;
    LayerNorm 48 -> 67 / 65; softmax 40 -> 46 / 48 -> 65). Rows that would fit in registers are wide too when
    their elements are 4 bytes, they take two or more passes and read ``row_inputs`` >= wide_fp32_min_row_inputs
    row-sized tensors (``wide_fp32_min_cols``: there the persistent kernel's several row-sized fp32 values
    spill). None: the persistent or plain looped kernel."""
    t = TUNING
    if n_cols > t["wide_min_cols"]:
        block_c = min(t["wide_block_c"], next_pow2(max(n_cols, 1)))
    elif (itemsize >= 4 and passes >= 2 and n_cols >= t["wide_fp32_min_cols"]
          and row_inputs >= t["wide_fp32_min_row_inputs"]):
        block_c = min(t["wide_fp32_block_c"], next_pow2(max(n_cols, 1)))
    else:
        return None
    steps = -(-n_cols // block_c)
    if steps < 2 or t["wide_programs_per_sm"] <= 0:
        return None
    return block_c, min(t["wide_unroll"], steps), t["wide_warps"], t["wide_programs_per_sm"] * sm_count()


def wide_form(max_level: int, online: bool, welford: dict, welford_group: int) -> str:
    """A wide kernel's passes over the row (a reduction level each, one of them folded into the one before by an
    online softmax sum or Welford moments, and the output pass) and the lanes of its Welford moments: the key
    of TUNING["wide_tiles"]."""
    passes = max_level + 1 - (1 if online or welford else 0)
    lanes = " welford vector" if welford and welford_group else " welford column" if welford else ""
    return f"{passes} passes{' online' if online else ''}{lanes}"


def _wide_tiles_of_form(wide: tuple, n_cols: int, form: str) -> tuple:
    """``wide`` with the tile width, tiles per step and (where given) programs per SM that TUNING["wide_tiles"]
    gives the kernel's ``form`` ("<wide_form>:<the row inputs' element bytes>")."""
    entry = TUNING["wide_tiles"].get(form)
    if not entry:
        return wide
    block_c = min(entry[0], next_pow2(n_cols))
    programs = entry[2] * sm_count() if len(entry) > 2 else wide[3]
    return block_c, max(min(entry[1], -(-n_cols // block_c)), 1), wide[2], programs


def _for_form(setting, form: Optional[str]) -> bool:
    """Whether a per-form TUNING setting (True: every wide form; False or (): none; else the form keys it lists)
    applies to a wide kernel of ``form`` (None: not wide)."""
    if form is None or not setting:
        return False
    return setting is True or form in setting


_SM_COUNT: list = []


def sm_count() -> int:
    """Multiprocessors of the current CUDA device (the interpreter, without one: 4, so that CPU runs walk
    several rows per program as the GPU does)."""
    if not _SM_COUNT:
        n = 4
        if torch.cuda.is_available():
            n = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        _SM_COUNT.append(n)
    return _SM_COUNT[0]


def row_tiles(n_cols: int, passes: int = 1, itemsize: int = 4) -> Optional[tuple[int, int, int]]:
    """(tile width, tiles, warps) for a reduction row that fits in registers but would waste more than
    ``row_tiles_max_waste`` of a power-of-two tile to masked lanes (5000 columns: 39% of 8192): the row is then
    walked as a few narrower tiles by an unrolled looped kernel (5000: 3 x 2048, or 5 x 1024 for rows of two or
    more reduction passes). Masked lanes cost the exp, the division and the conversions of real ones, so
    compute-heavy rows gain most (H200, [8191, 5000] fp32: LayerNorm 85% -> 94% of copy bandwidth, RMSNorm 90% ->
    94%, softmax 80% -> 83%). None: one power-of-two tile."""
    t = TUNING
    width = next_pow2(max(n_cols, 1))
    if n_cols < t["row_tiles_min_cols"] or (width - n_cols) / width <= t["row_tiles_max_waste"]:
        return None
    widths, warps = t["row_tiles_widths"], t["row_tiles_warps"]
    if passes >= 2:
        widths = t["multi_pass_row_tiles_widths"]
        warps = t["multi_pass_row_tiles_warps"][2 if itemsize <= 2 else 4]
    for block_c in widths:
        n = -(-n_cols // block_c)
        if 1 < n <= t["row_tiles_max"] and (n * block_c - n_cols) / (n * block_c) <= t["row_tiles_max_waste"]:
            return block_c, n, warps
    return None


def _blocks(mode: str, n_rows: int, n_cols: int, itemsize: int, passes: int = 1, ragged: bool = False,
            row_vector: int = 0):
    """``row_vector``: the elements of a 16-byte vector of the narrowest column tensor, when the kernel reads a
    row vector (a bias) broadcast over its tile's rows; else 0."""
    t = TUNING
    if mode == "pointwise":
        target = t["pw_elems_narrow"] if itemsize <= 2 else t["pw_elems"]
        if ragged:
            # Column tiles narrower than the row: all but its last tile are vectorized (Emitter.split_interior).
            block_c = min(t["pw_ragged_block_c"], 1 << (n_cols.bit_length() - 1))
            block_r = max(1, min(next_pow2(n_rows), target // block_c))
        elif n_rows == 1:
            block_c, block_r = min(next_pow2(max(n_cols, 1)), target), 1
        else:
            # The widest column tile that divides the row (no masked tail), else the narrower default.
            wide = t["pw_max_block_c"]
            block_c = min(next_pow2(max(n_cols, 1)), wide if n_cols % wide == 0 else max(wide // 2, 1))
            block_r = max(1, min(next_pow2(n_rows), target // block_c))
        num_warps = 4 if block_r * block_c <= 2048 else t["pw_warps"]
        fit = max(1, block_c // (32 * row_vector)) if row_vector and t["pw_row_vector_warps"] else num_warps
        if num_warps > fit:
            # Triton lays a [1, BLOCK_C] load out over all the program's threads: below a vector per thread its
            # layout differs from the [BLOCK_R, BLOCK_C] tiles it is broadcast into, and every tile then passes
            # through shared memory twice (a layout conversion to the row vector's layout and back for the
            # store, with barriers). Fewer warps, as many elements per thread (benchmarks/
            # sweep_pointwise_warps.py, 2026-12-04-pointwise-warps*.jsonl, two runs): bf16 tanh-GELU tiles [4,
            # 1024] on 8 warps -> [2, 1024] on 4 at [32768, 1024] 60.5 -> 67-68% of copy, [8191, 5000] 58 -> 67-68%;
            # x + b there 84-87% either way. Keeping the tile on 4 warps (run2): GELU 65-69%, x + b 84-85%.
            block_r, num_warps = max(1, block_r * fit // num_warps), fit
    elif mode == "persistent":
        block_c = next_pow2(max(n_cols, 1))
        block_r = max(1, min(next_pow2(max(n_rows, 1)), t["persistent_elems"] // block_c))
        elems = block_r * block_c
        num_warps = next(w for limit, w in sorted(t["persistent_warps"].items()) if elems <= limit)
        if passes >= 2 and itemsize <= 2:
            per_warp = 32 * t["multi_pass_elems_per_thread"]
            block_r = max(1, min(next_pow2(max(n_rows, 1)), per_warp // block_c))
            num_warps = max(1, min(16, block_r * block_c // per_warp))
    else:
        block_c, block_r, num_warps = t["looped_block_c"], 1, t["looped_warps"]
    return block_r, block_c, num_warps


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def _numel(sizes) -> int:
    return _prod(sizes)


def segment_metas(segment, layouts: dict, env_metas: dict) -> Optional[dict]:
    """TensorMeta for each tensor the segment reads or writes, from real inputs or inferred layouts."""
    metas = {}
    for tv in list(segment.inputs) + list(segment.outputs):
        if not isinstance(tv, TensorView):
            continue
        if id(tv) in env_metas:
            metas[id(tv)] = env_metas[id(tv)]
        elif id(tv) in layouts:
            lay = layouts[id(tv)]
            metas[id(tv)] = TensorMeta(lay.sizes, lay.strides, to_torch_dtype(tv.dtype))
        else:
            return None
    return metas
