"""Differential fuzzer: random small fusions through the whole pipeline vs an independent eager reference.

    PYFUSER_FUZZ_CASES=N   number of random programs (default 400; thousands on the GPU, e.g.
                           PYFUSER_FUZZ_CASES=5000 python -m pytest -q -n 8 tests/test_fuzz.py)
    PYFUSER_FUZZ_SEED0=S   first seed (default 0), to sweep another range
    PYFUSER_FUZZ_MAX_DIM=D largest dim (default 9; e.g. 256 on the GPU for long rows and many tiles)
    PYFUSER_FUZZ_XFAIL_KNOWN=0   report failures that match a known bug as failures, with the full report,
                           instead of xfails (e.g. to see which seeds a fix repaired)

Each case ``test_fuzz[seed]`` generates a program (tests/fuzz_gen.py: a list of ops over named values) of 3-10
ops, up to 14 when a softmax or layer-norm chain is expanded into its primitives, over 1-5 inputs:
- dtypes float32, bfloat16, float16, float64, int64, int32, bool; shapes of rank 1-4 with dims 1-9 (at most 512
  elements; PYFUSER_FUZZ_MAX_DIM raises both); size-1 broadcast dims, lower-rank operands (broadcast from the right), [4, 1] with [1, 5];
- input layouts: contiguous, transposed, sliced rows, every other element, storage offset, expanded (stride 0),
  permuted 3-D/4-D, negative-bit views (torch._neg_view) and conj().imag of a complex tensor; some inputs defined
  with static sizes; Python-number and symbolic (Double/Int) scalars; now and then an empty tensor (a zero dim);
- special values: ~12% of inputs hold NaN, ±inf, ±0, subnormals of their dtype and the smallest normal (floats)
  or INT_MIN/INT_MAX/-1/0 (ints); "discrete" float inputs hold -0.0 as often as +0.0;
- ops: float unaries (exp, tanh, sigmoid, sin, cos, erf, atan, log1p/sqrt of |x|, log/reciprocal/rsqrt of
  |x| + 1), dtype-keeping unaries (relu, abs, neg, ceil, floor, round, trunc, frac, sign, silu, bitwise_not, set,
  segment_set), logical_not/isnan/isfinite/signbit, add, sub, mul, maximum, minimum, div, truediv, fmod,
  remainder, comparisons, logical and bitwise binaries, where, clamp, cast, permute, broadcast_in_dim (some with
  shapes from fd.ops.size), broadcast, expand, squeeze, reshape, slice, sum/prod/max/min/var/var_mean over one or
  two dims with keepdim both ways (sum also with dtype=Float), reductions broadcast back and combined with their
  input, softmax and layer-norm chains (with lower-rank weight and bias), index_select, gather/take_along_axis
  (in some gather programs followed by a scatter by the same index: the last of repeated indices wins, as in
  ATen's CPU scatter, which the reference runs), top-k, argsort, cumsum/cummax/cummin.
Every value no op consumes is an output (plus some intermediates, now and then an input, and now and then one
value twice).

A case runs ``fd.execute`` with ``check_layouts``, again with the inputs relaid (contiguous <-> sliced/strided/
offset, i.e. a second input signature of the same definition), then the printed ``repr(fd)``; a quarter of the
cases (seed % 4 == 3, small tensors) run with launch heuristics that tile even these shapes (several row and
column blocks, the looped long-row reduction kernel). Outputs are compared with ``fuzz_gen.run_reference``: the
same op list run op by op with ATen, never pyfuser's evaluator, with the dtype rules of docs/frontend.md written
out (promotion like torch, Half/BF16 computed in Float and rounded only where an op's result dtype says so).
Values (bit-exact for ints, bools and every float value both sides compute exactly; otherwise within the error
bound the generator tracks plus a dtype rtol), dtypes, shapes, strides (``harness.assert_same``) and aliasing of
inputs must match, and so must the sign of every zero of an exactly computed float output, except where an op on
its path decides a zero's sign by an order eager does not fix (``fuzz_gen.ZERO_SIGN_OPS``: reductions; on CPU
also relu/maximum/minimum/clamp, whose zero sign in ATen's CPU kernels depends on vectorized-vs-scalar loops;
the kernels follow CUDA). NaN positions and infinities always match. A failure prints the seed, the program (ops with result dtypes/shapes, input layouts and
strides), ``repr(fd)``, how each segment ran, and which known bugs can explain it. Reproduce with
``python -m pytest -q "tests/test_fuzz.py::test_fuzz[SEED]"`` or ``test_fuzz.run_case(SEED)``.

Failures that match an open bug (a strict ``test_regression_*`` xfail below) or a known Triton-interpreter gap
are xfailed, so the sweep reports new bugs only; bugs already fixed are plain regression tests and are never
excused. Under Triton's CPU interpreter every load and store is bounds-checked against the launch's tensors (an
out-of-bounds kernel raises instead of corrupting the heap; on a GPU it would be an illegal address).

Generator limitations (what it never produces, and why):
- Comparisons, logical ops, float->int/bool casts, ceil/floor/round/trunc/frac/sign, integer div, fmod and
  remainder only take operands that both sides compute exactly: a last-ulp difference (libdevice vs ATen,
  summation order, an fma the GPU contracts) would flip them legitimately.
- Divisors are known positive (a positive constant, or |x| + 1/2 or + 1): no division by zero.
- Magnitudes stay below 1e4 for floats and 1e6 for ints (no overflow, no fp16 infinity, no integer wrap-around);
  exp only sees |x| <= 6.
- No cast of NaN/inf to an integer (undefined); no var/var_mean of NaN/inf (the mean eager's Welford update gives
  for a row holding inf depends on where the inf sits: tests/test_special_values.py::test_var_mean_of_rows_holding_inf).
- No cast to the same dtype, no where() of two scalars, no full-range slice: their eager meaning is ambiguous
  (alias vs copy; Double vs the default float).
- fd.ops.size only for dims of extent > 1 (pyfuser's size of a broadcast dim is symbolic, so broadcast_in_dim
  would make an expanded dim that squeeze refuses).
- No pow, lerp, threshold, addcmul, cat, pad, matmul, random ops, fp8/fp4 or complex
  (outside this fuzzer's op mix; they have their own tests), no alias_input outputs, no empty reductions
  (max of nothing raises in eager).
"""

from __future__ import annotations

import contextlib
import os
import traceback
from typing import Optional

import pytest
import torch

import fuzz_gen
from harness import DEVICE, assert_same, clone_inputs, rebuild_from_repr

N_CASES = int(os.environ.get("PYFUSER_FUZZ_CASES", "400"))
SEED0 = int(os.environ.get("PYFUSER_FUZZ_SEED0", "0"))
XFAIL_KNOWN = os.environ.get("PYFUSER_FUZZ_XFAIL_KNOWN", "1") != "0"


class OutOfBoundsAccess(AssertionError):
    pass


def _install_bounds_guard() -> None:
    """Under Triton's CPU interpreter a kernel that indexes out of bounds reads or corrupts the Python heap
    (a later, unrelated test then crashes). Check every masked-in address of every load and store against the
    storages of the launch's tensor arguments and raise instead. Test instrumentation only: it changes no
    result of an in-bounds kernel. (On a GPU, out-of-bounds kernels fault with an illegal address instead.)"""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import numpy as np
    from triton.runtime import interpreter as interp

    if getattr(interp, "_pyfuser_fuzz_guard", False):
        return
    if not all(hasattr(c, m) for c, m in ((interp, "GridExecutor"), (interp, "InterpreterBuilder"))) or not all(
        hasattr(interp.InterpreterBuilder, m) for m in ("create_masked_load", "create_masked_store")
    ) or not hasattr(interp.GridExecutor, "_init_args_hst"):
        return  # another triton: run unguarded (the set-up pins 3.6.0, whose interpreter this matches)
    ranges: list = []
    init_args = interp.GridExecutor._init_args_hst

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        ranges.clear()
        todo = list(args_hst) + list(kwargs_hst.values())
        while todo:
            a = todo.pop()
            if isinstance(a, torch.Tensor):
                st = a.untyped_storage()
                ranges.append((st.data_ptr(), st.data_ptr() + st.nbytes()))
            elif isinstance(a, tuple):  # a tuple argument (a load prologue's arguments) holds tensors too
                todo.extend(a)
        return args_hst, kwargs_hst

    def check(what, ptrs, mask):
        itemsize = np.dtype(interp._get_np_dtype(ptrs.get_element_ty())).itemsize
        p, m = np.broadcast_arrays(ptrs.data, mask.data)
        addrs = p[m.astype(bool)].astype(np.uint64)
        inside = np.zeros(addrs.shape, dtype=bool)
        for lo, hi in ranges:
            inside |= (addrs >= lo) & (addrs + itemsize <= hi)
        if not inside.all():
            bad = [int(a) for a in addrs[~inside][:4]]
            raise OutOfBoundsAccess(
                f"kernel {what} outside every tensor argument's storage: {int((~inside).sum())} of {addrs.size} "
                f"addresses, e.g. {bad}; storages {ranges}")

    load, store = interp.InterpreterBuilder.create_masked_load, interp.InterpreterBuilder.create_masked_store

    def create_masked_load(self, ptrs, mask, *args, **kwargs):
        check("load", ptrs, mask)
        return load(self, ptrs, mask, *args, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
        check("store", ptrs, mask)
        return store(self, ptrs, value, mask, *args, **kwargs)

    interp.GridExecutor._init_args_hst = _init_args_hst
    interp.InterpreterBuilder.create_masked_load = create_masked_load
    interp.InterpreterBuilder.create_masked_store = create_masked_store
    interp._pyfuser_fuzz_guard = True


_install_bounds_guard()


# --- known bugs ----------------------------------------------------------------------------------------------


def known_bugs(program: fuzz_gen.Program, error: BaseException) -> list[str]:
    """Open bugs (each has a strict regression test below) and interpreter gaps that can explain a failure of
    ``program``. Fixed bugs are not listed: a failure that looks like one is a regression and must fail."""
    # (Empty now: the last one, triton 3.6's interpreter failing on (0-dim int1) & (2-D int1) when the 0-dim
    # operand comes from a by-value Float argument, is patched in codegen/interpreter_compat.py and tested in
    # tests/test_codegen.py.)
    return []


# --- running a program ---------------------------------------------------------------------------------------


class FuzzFailure(AssertionError):
    def __init__(self, message: str, known: list):
        super().__init__(message)
        self.known = known


def describe_run(fd) -> str:
    rt = fd.last_runtime()
    if rt is None:
        return "  (no runtime)"
    lines = []
    for seg in rt.segments:
        step = rt.kernel_step(seg.index)
        plan = None if step is None else step.plan
        how = f"generated {plan.mode} kernel {plan.name}" if plan is not None else f"ATen ({rt.segment_reason(seg.index)})"
        lines.append(f"  {seg!r}\n      -> {how}")
    return "\n".join(lines)


def _storage_owner(t, tensors: list) -> Optional[int]:
    """Index of the input whose storage ``t`` shares (a view of it), or None."""
    if not isinstance(t, torch.Tensor):
        return None
    ptr = t.untyped_storage().data_ptr()
    return next((k for k, x in enumerate(tensors) if isinstance(x, torch.Tensor)
                 and x.untyped_storage().data_ptr() == ptr), None)


def _clone(inputs: list, program: Optional[fuzz_gen.Program] = None) -> list:
    """clone_inputs, keeping negative-bit views as such, in their layout (a deep copy resolves the bit)."""
    out = clone_inputs([x.resolve_neg() if isinstance(x, torch.Tensor) and x.is_neg() else x for x in inputs])
    layouts = [spec.layout for spec in program.inputs] if program is not None else [None] * len(inputs)
    for k, (x, layout) in enumerate(zip(inputs, layouts)):
        if isinstance(x, torch.Tensor) and x.is_neg():
            if layout == "conjimag":
                out[k] = torch.complex(torch.zeros_like(out[k]), torch.neg(out[k])).conj().imag
            else:
                out[k] = torch._neg_view(torch.neg(out[k]))
    return out


def assert_zero_signs(out, ref, v: fuzz_gen.Val, what: str) -> None:
    """Bitwise for the sign of zero: where both are zero, the signs agree (exact values only, and not through
    an op that may decide a zero's sign by its own order, fuzz_gen.ZERO_SIGN_OPS)."""
    if not isinstance(ref, torch.Tensor) or not ref.is_floating_point() or not v.exact:
        return
    loose = fuzz_gen.ZERO_SIGN_OPS if DEVICE.type == "cpu" else fuzz_gen.ZERO_SIGN_OPS_EVERYWHERE
    if v.zero_ops & loose:
        return
    o, r = out.detach().cpu(), ref.detach().cpu()
    both = (o == 0) & (r == 0)
    bad = both & (torch.signbit(o) != torch.signbit(r))
    assert not bool(bad.any()), f"{what}: {int(bad.sum())} zeros of the other sign than eager's (e.g. at {bad.nonzero()[0].tolist()})"


def _check_against_reference(fd, program: fuzz_gen.Program, inputs: list) -> list:
    mine, theirs = _clone(inputs, program), _clone(inputs, program)
    outs = fd.execute(mine, _enable_options=["check_layouts"])
    refs = fuzz_gen.run_reference(program, theirs, DEVICE)
    assert len(outs) == len(refs), f"{len(outs)} outputs, {len(refs)} references"
    for i, (o, r, v) in enumerate(zip(outs, refs, program.outputs)):
        atol, rtol = fuzz_gen.tolerances(v)
        assert_same(o, r, atol=atol, rtol=rtol, what=f"output {i} ({v.name})")
        assert_zero_signs(o, r, v, what=f"output {i} ({v.name})")
        # Eager parity includes aliasing: a view of an input must be a view (of the same input), anything else
        # a new tensor.
        a, b = _storage_owner(o, mine), _storage_owner(r, theirs)
        assert a == b, f"output {i} ({v.name}): aliases input {a}, eager's aliases input {b}"
    return outs


def _computed_from_reduction_result(v) -> bool:
    """Whether ``v`` is, or is computed from, a sum/prod over expanded dims only (ops/reduction.py marks it)."""
    seen, stack = set(), [v]
    while stack:
        x = stack.pop()
        e = getattr(x, "defined_by", None)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.info.get("reduction_result", False):
            return True
        stack.extend(e.inputs)
    return False


def run_program(program: fuzz_gen.Program, inputs: Optional[list] = None) -> object:
    """Run ``program`` through pyfuser and the eager reference; raise FuzzFailure with a full report on any
    difference. ``inputs`` overrides the generated input tensors. Returns the FusionDefinition."""
    if inputs is None:
        inputs = fuzz_gen.make_inputs(program, DEVICE)
    fd = None
    stage = "defining the fusion"
    try:
        fd = fuzz_gen.build_fusion(program, inputs)
        stage = "fd.execute vs the eager reference"
        outs = _check_against_reference(fd, program, inputs)
        relaid = fuzz_gen.relaid_inputs(program, inputs)
        if relaid is not None:
            # Same fusion, a second input signature (other strides or alignment): a new runtime or a cache hit
            # must both give eager's answer for these inputs.
            stage = "fd.execute with relaid inputs (contiguous <-> sliced/strided/offset) vs the eager reference"
            _check_against_reference(fd, program, relaid)
        stage = "the repr round trip"
        fd2 = rebuild_from_repr(fd)
        outs2 = fd2.execute(_clone(inputs, program))
        for i, (a, b) in enumerate(zip(outs2, outs)):
            # Bit for bit where both compute exactly; elsewhere within the bound tracked against eager: the
            # rebuilt definition may segment differently (seed 10692 on the H200: its atan ran in a kernel in one
            # and on ATen in the other, one ulp apart).
            atol, rtol = fuzz_gen.tolerances(program.outputs[i])
            # A sum/prod over expanded dims only is printed as nvFuser's IR has it, a squeeze times the extent;
            # rebuilt, that product is laid out like its operand (eager's mul), the reduction contiguously, and
            # so are the pointwise results computed from it (seed 48607).
            printed_as_mul = _computed_from_reduction_result(fd.fusion.outputs[i])
            assert_same(a, b, atol=atol, rtol=rtol, check_strides=not printed_as_mul,
                        what=f"repr round-trip output {i}")
    except Exception as e:  # noqa: BLE001  (every failure gets the same report)
        known = known_bugs(program, e)
        report = [
            f"fuzz case failed in {stage}: {type(e).__name__}: {e}",
            program.describe(inputs),
            "repr(fd):",
            repr(fd) if fd is not None else "  (not built)",
            "segments:",
            describe_run(fd) if fd is not None and stage != "defining the fusion" else "  (none)",
            "known bugs this program can hit:" if known else "matches no known bug",
            *[f"  - {k}" for k in known],
        ]
        if not isinstance(e, AssertionError):
            report.append("".join(traceback.format_exception(e)))
        raise FuzzFailure("\n".join(report), known) from e
    return fd


# Launch heuristics that tile even these tiny shapes: several row and column blocks per kernel, the looped
# reduction kernel (long-row mode) for rows over 8 elements, wide rows (plan.wide_rows: programs walking several
# rows, two tiles of 4 per step) over 16 and for multi-pass 4-byte rows of 6 to 8, and rows of 5 and 6 in 3
# unrolled tiles of 2 (plan.row_tiles). A quarter of the cases run with them.
SMALL_TILES = dict(persistent_max_cols=8, looped_block_c=8, pw_max_block_c=8, pw_elems=64, pw_elems_narrow=64,
                   persistent_elems=32, row_tiles_min_cols=3, row_tiles_widths=(4, 2), row_tiles_max=4,
                   wide_min_cols=16, wide_block_c=4, wide_unroll=2, wide_programs_per_sm=1, wide_fp32_min_cols=6,
                   wide_fp32_block_c=2, multi_pass_elems_per_thread=1, multi_pass_row_tiles_widths=(2, 4),
                   wide_fp32_min_row_inputs=1)


@contextlib.contextmanager
def launch_tuning(small: bool):
    from pyfuser.codegen import plan

    saved = dict(plan.TUNING)
    if small:
        plan.TUNING.update({k: v for k, v in SMALL_TILES.items() if k in plan.TUNING})
    try:
        yield
    finally:
        plan.TUNING.clear()
        plan.TUNING.update(saved)


def small_tiles_for(seed: int, program: fuzz_gen.Program) -> bool:
    # The interpreter runs program instances one by one: keep the tiled cases to small tensors.
    biggest = max([v.numel for op in program.ops for v in op.outs] + [s.val.numel for s in program.inputs])
    return seed % 4 == 3 and biggest <= 256


def run_case(seed: int, program: Optional[fuzz_gen.Program] = None):
    """Reproduce one sweep case: ``python -c "import test_fuzz; test_fuzz.run_case(SEED)"`` (from tests/)."""
    program = program or fuzz_gen.generate(seed)
    small = small_tiles_for(seed, program)
    try:
        with launch_tuning(small):
            return run_program(program)
    except FuzzFailure as f:
        if small:
            f.args = (f.args[0] + f"\nlaunch tuning: {SMALL_TILES}",)
        raise


@pytest.mark.parametrize("seed", range(SEED0, SEED0 + N_CASES))
def test_fuzz(seed):
    try:
        run_case(seed)
    except FuzzFailure as f:
        if f.known and XFAIL_KNOWN:
            # A known open bug or interpreter gap: keep the sweep about new bugs.
            pytest.xfail(str(f).split("\n")[0][:300] + " | known: " + "; ".join(k[:120] for k in f.known))
        raise


def test_fuzzer_reaches_generated_kernels():
    """The sweep must exercise generated kernels of every mode, not only ATen fallbacks (e.g. if the interpreter
    stopped being enabled, or every segment fell back)."""
    from pyfuser.codegen.launcher import triton_usable

    if not triton_usable(DEVICE):
        pytest.skip(f"no generated kernels on {DEVICE} (PYFUSER_TEST_INTERPRET=0?)")
    modes, fallbacks = {}, {}
    for seed in range(3, 3 + 4 * 12, 4):  # seeds run with small tiles when small enough
        try:
            fd = run_case(seed)
        except FuzzFailure:
            continue
        rt = fd.last_runtime()
        for seg in rt.segments:
            step = rt.kernel_step(seg.index)
            if step is not None:
                mode = step.plan.mode + (" (wide rows)" if "tl.num_programs(0)" in step.plan.source else "")
                modes[mode] = modes.get(mode, 0) + 1
            elif seg.kind.value != "ExprEval":
                reason = rt.segment_reason(seg.index)
                fallbacks[reason] = fallbacks.get(reason, 0) + 1
    assert {"pointwise", "persistent", "looped", "looped (wide rows)"} <= set(modes), \
        f"kernel modes {modes}, ATen fallbacks {fallbacks}"
    assert sum(modes.values()) >= 4 * sum(fallbacks.values()), f"kernel modes {modes}, ATen fallbacks {fallbacks}"


# --- regression tests: bugs the fuzzer found. Fixed ones are plain tests; open ones are strict xfails (each must
# start passing, and lose its mark, once its bug is fixed).


def _program(build) -> fuzz_gen.Program:
    b = fuzz_gen.Builder()
    build(b)
    return b.program


def test_regression_reversed_dim_merge():
    """Found by the fuzzer, fixed in 0764890. Before the fix: codegen.plan._merge merges adjacent loop dims when
    inner stride == outer stride * outer extent, the reverse of a flat walk (outer stride == inner stride *
    inner extent), then indexes the run with the inner dim's stride: sum(permute(x[4, 8], [1, 0]), [0, 1]) sums
    x's storage at offsets 0, 8, ..., 248, past x's 32 elements (out of bounds; here inside a taller storage).
    It is reached because plan_kernel orders a reduction's loop dims by the layout of the first segment input of
    the same rank (x), not of the reduction's input (the permuted view). Contiguous dims, conversely, never
    merge."""

    def build(b):
        # 'head': x is the start of an 8x taller storage, so the wrong reads stay inside an allocation
        x = b.input((4, 8), fuzz_gen.F32, "head", seed=1)
        b.output(b.apply("sum", b.apply("permute", x, [1, 0]), [0, 1], False))

    run_program(_program(build))


def test_regression_self_broadcast():
    """Found by the fuzzer, fixed in 0764890. Before the fix: segment.loop_domain unifies (tensor, dim) pairs with
    one union-find per segment, so a tensor read through two different dim maps in one kernel gets its dims
    merged into one loop dim: sub(broadcast_in_dim(x[4], [4, 1], [0]), x) is an outer difference [4, 4] in
    eager, but the kernel has one loop dim of extent 4: it computes x[i] - x[i] = 0, writes it along the
    output's first row and leaves the other 12 elements uninitialized. Same for x + x.T ([[2, 4], [0, 0]] for
    [[1, 2], [3, 4]]), and for a reduction result broadcast from the right against its own input's other dim."""

    def build(b):
        x = b.input((4,), fuzz_gen.F32, seed=2)
        b.output(b.apply("sub", b.apply("broadcast_in_dim", x, [4, 1], [0]), x))

    run_program(_program(build))


def test_regression_keepdim_expanded():
    """Found by the fuzzer, fixed in 0764890. Before the fix: ops.reduction's loop_map pairs every position with
    keepdim=True, so the size-1 broadcast dim of max(x[5], [0], keepdim=True) is the same loop dim as the
    reduced extent-5 dim; broadcast_in_dim to [6] then joins extent 6 to it, and the kernel reduces over 6
    elements of x (reading past its end; here an element of the same storage, 100) instead of 5."""

    def build(b):
        x = b.input((5,), fuzz_gen.F32, "head", seed=3)
        m = b.apply("max", x, [0], True)
        b.output(b.apply("mul", b.apply("broadcast_in_dim", m, [6], [0]), 2.0))

    program = _program(build)
    storage = torch.arange(40, dtype=torch.float32, device=DEVICE)
    storage[5] = 100.0
    run_program(program, [storage[:5]])


def test_regression_sum_over_expanded_broadcast():
    """Found by the fuzzer, fixed in 0764890. Before the fix: codegen.plan sizes the loop dims from the segment's
    input and output tensors only (_loop_sizes), so a broadcast dim that broadcast_in_dim expands inside the
    kernel (extent 3) and that no input or output walks gets extent 1: sum(broadcast_in_dim(x[4, 8], [4, 3, 8],
    [0, 2]), [1, 2]) returns x.sum(1) instead of 3 * x.sum(1) (and var with correction divides by the wrong
    count)."""

    def build(b):
        x = b.input((4, 8), fuzz_gen.F32, seed=4)
        b.output(b.apply("sum", b.apply("broadcast_in_dim", x, [4, 3, 8], [0, 2]), [1, 2], False))

    run_program(_program(build))


def test_regression_reduce_keepdim_result():
    """Found by the fuzzer, fixed in 0764890. Before the fix: A reduction whose operand is broadcast along the
    reduced loop dims reduces over the loop dims' full extent instead of the operand's extent 1 (codegen:
    KernelBuilder.reduce / Emitter broadcast a per-row value over the column tile and reduce it): sum(sum(x[4,
    5], [1], keepdim=True), [1]) returns 5 * x.sum(1) (the second sum shares the loop dim of the first through
    keepdim), var_mean(keepdim) then sum likewise. Same root: sum(x[4, 1], [1]) in a kernel that also expands
    x's dim 1 to 2 (expand(mul(x, ...), [4, 2])) returns 2 * x."""

    def build(b):
        x = b.input((4, 5), fuzz_gen.F32, seed=8)
        b.output(b.apply("sum", b.apply("sum", x, [1], True), [1], False))

    run_program(_program(build))


def test_regression_size_of_intermediate():
    """Found by the fuzzer, fixed in 0764890. Before the fix: fd.ops.size(t, d) of a tensor t computed inside a
    kernel segment fails at execute with 'FusionExecutionError: internal error: no value bound for T1': the
    segmenter puts the size expr into t's kernel segment and the runtime's KernelStep.run
    evaluates the segment's scalar exprs before launching the kernel that produces t (the extent is known from
    the inferred layout). E.g. neg(broadcast_in_dim(a, [size(a, 0), size(a, 1), 2], [0, 1])) with a = abs(x)."""

    def build(b):
        x = b.input((3, 2), fuzz_gen.F32, seed=9)
        a = b.apply("abs", x)
        bc = b.apply("broadcast_in_dim", a, [3, 2, 2], [0, 1])
        b.program.ops[-1].kwargs["symbolic"] = True
        b.output(b.apply("neg", bc))

    run_program(_program(build))


def test_regression_bool_constant():
    """Found by the fuzzer, fixed in 0764890. Before the fix: codegen KernelBuilder.const(value, torch.bool) writes
    repr(int(value)): logical_and(x, 0.5) casts 0.5 to Bool as 0 (False) instead of 0.5 != 0 (True), so the
    kernel returns all False where ATen returns x != 0; logical_or(2, b) emits '2 | b' and stores 2/3 in a Bool
    tensor."""

    def build(b):
        x = b.input((6,), fuzz_gen.F32, "contiguous", "discrete", seed=5)
        b.output(b.apply("logical_and", x, 0.5))

    run_program(_program(build))


def test_regression_check_layouts_size1_stride():
    """Found by the fuzzer, fixed in 0764890. Before the fix: runtime.FusionRuntime._check_layouts compares strides
    of size-1 dims, where ATen's meta kernels and its CPU kernels legitimately differ: lt(permute(max(x[:,
    None], [1], keepdim=True)), x) is [1, 2] with strides (1, 1) on CPU but (2, 1) on meta; when the segment
    runs on ATen (add of two Bool tensors has no lowering), execute with check_layouts raises
    FusionExecutionError for a layout that is equivalent."""

    def build(b):
        x = b.input((2,), fuzz_gen.F32, seed=6)
        m = b.apply("max", b.apply("broadcast", x, [False, True]), [1], True)
        lt = b.apply("lt", b.apply("permute", m, [1, 0]), x)
        b.output(lt)
        b.output(b.apply("add", lt, lt))

    run_program(_program(build))


def test_regression_broadcast_shared_by_extents():
    """Found by the fuzzer, fixed in 5f2388e. Before the fix: segment.loop_domain joins a size-1 broadcast dim with
    every dim it is broadcast against, so two consumers of one broadcast value with different extents share a
    loop dim: s = sum(x[6], [0], keepdim=True) with add(s, y[8]) and add(s, x) in one kernel gets a single loop
    dim of extent 8 (plan._loop_sizes takes the largest), so the sum also reads x[6] and x[7] (past x; here 100s
    of the same storage) and add(s, x) writes 8 elements into its 6-element output. Nothing checks that the
    extents joined in one loop dim agree."""

    def build(b):
        x = b.input((6,), fuzz_gen.F32, "head", seed=10)
        y = b.input((8,), fuzz_gen.F32, seed=11)
        s = b.apply("sum", x, [0], True)
        b.output(b.apply("add", s, y))
        b.output(b.apply("add", s, x))

    program = _program(build)
    storage = torch.arange(48, dtype=torch.float32, device=DEVICE)
    storage[6:8] = 100.0
    run_program(program, [storage[:6], fuzz_gen.make_input(program.inputs[1], DEVICE)])


@pytest.mark.parametrize("boundary", ["segment_set", "slice"])
def test_regression_materialized_expanded_dim(boundary):
    """A pointwise op on an expanded input keeps the expanded-broadcast IterDomain (b?(exp)) on its output, which
    eager materializes densely. When such a tensor crosses a segment boundary (segment_set, or an ATen slice),
    the next kernel must still write its consumer's output along that dim. Found (PYFUSER_FUZZ_MAX_DIM=64) on an
    uncommitted loop-domain change that stopped broadcast dims from joining other dims: the kernel then treated
    the output as per-row and emission raised 'internal error: per-row output t1 receives a full tile'."""

    def build(b):
        x = b.input((4, 3), fuzz_gen.F32, "expanded1", seed=12)
        e = b.apply("exp", x)
        cut = b.apply("segment_set", e) if boundary == "segment_set" else b.apply("slice", e, [0, 1], [4, 3])
        b.output(b.apply("neg", cut))

    run_program(_program(build))


# Fixed in the runtime (runtime/plan.py, runtime/steps.py):
# Found by the fuzzer (layout conjimag). x = z.conj().imag of a complex [2, 2] tensor is a float view with the
# negative bit, strides (4, 2) and storage offset 1; a kernel segment reading it returns garbage (e.g.
# neg(x) gives [[-1, -3], [1.8e29, -6.9e-44]] for x = [[1, 2], [3, -4]]), while a torch._neg_view input of
# contiguous memory is read correctly: the runtime resolves the negative bit but indexes the result with
# the view's strides, or the other way round. Runtime (input binding), not codegen.
def test_regression_conj_imag_input():
    def build(b):
        x = b.input((2, 2), fuzz_gen.F32, "conjimag", seed=13)
        b.output(b.apply("neg", x))

    run_program(_program(build))


# Fixed in the runtime (runtime/plan.py, runtime/steps.py):
# Found by the fuzzer (zero-size inputs). With check_layouts, a segment output with a zero extent is
# compared stride by stride with its inferred layout ('produced T11 with sizes [4, 0, 1] and strides [0, 1, 0],
# but its layout was inferred as ... strides=[1, 1, 1]'); an empty tensor's strides carry no information
# (eager's own empty results differ by device). Runtime (layout check), not codegen.
def test_regression_check_layouts_empty():
    def build(b):
        x = b.input((4, 0, 1), fuzz_gen.F32, seed=14)
        y = b.input((4, 1, 3), fuzz_gen.F32, "transposed", seed=15)
        b.output(b.apply("add", b.apply("exp", x), 1.0))
        b.output(b.apply("mul", y, 2.0))

    run_program(_program(build))


# Fixed in the runtime (runtime/plan.py, runtime/steps.py):
# Found by the fuzzer (negbit layout). An input with the negative bit set that is also an output comes back
# as a resolved copy; eager (and pyfuser for any other input) returns the input tensor itself. Runtime
# (resolving negative-bit inputs), not codegen.
def test_regression_neg_bit_input_as_output():
    def build(b):
        x = b.input((3, 4), fuzz_gen.F32, "negbit", seed=16)
        b.output(b.apply("abs", x))
        b.output(x)

    run_program(_program(build))


# Fixed in the runtime (runtime/plan.py, runtime/steps.py):
# Found by the fuzzer on the H200 (seed 3334) and on CPU. A negative-bit input (torch._neg_view) that goes
# through an ATen segment first (here a slice) reaches the next kernel as a view that still has the negative
# bit, and the kernel reads its raw memory: every value has the wrong sign. Inputs read by a kernel directly
# are resolved. Runtime (resolving negative-bit tensors at segment boundaries), not codegen.
def test_regression_neg_bit_through_aten_view():
    def build(b):
        x = b.input((3, 5), fuzz_gen.F32, "negbit", seed=17)
        b.output(b.apply("add", b.apply("slice", x, [1, 0], [3, 2]), 0.5))

    run_program(_program(build))


# Fixed in the runtime (runtime/steps.py, resolved_like): found by the fuzzer (seed 3187, H200 and CPU). A
# negative-bit input expanded by an ATen segment (stride 0) and then read by a kernel was refused ("overlapping
# strides"); broadcast dims are now resolved once and expanded again.
def test_regression_neg_bit_expanded_into_kernel():
    def build(b):
        x = b.input((9, 6), fuzz_gen.F32, "negbit", seed=18)
        e = b.apply("expand", x, [2, 1, 9, 6])
        b.output(e)  # the expanded view is also an output
        b.output(b.apply("isnan", e))

    run_program(_program(build))


def test_regression_neg_bit_view_read_by_an_op():
    # Seed 301851 at PYFUSER_FUZZ_MAX_DIM=40: an op reading a negative-bit view gets that operand as ATen's
    # Negative fallback hands it over, a clone (empty_like: an expanded view becomes contiguous), and orders its
    # output's dims by it: minimum of x.conj().imag broadcast to [4, 16, 1, 2] and a permuted [4, 1, 1, 1] has
    # strides (32, 2, 2, 1). Layout inference built its meta inputs without the bit: (2, 8, 128, 1).
    def build(b):
        x = b.input((1, 16), fuzz_gen.F32, "conjimag", seed=3)
        y = b.input((4, 1, 1, 1), fuzz_gen.F32, "permuted2310", seed=4)
        b.output(b.apply("minimum", y, b.apply("broadcast_in_dim", x, [4, 16, 1, 2], [0, 1])))

    run_program(_program(build))


def test_regression_no_fma_contraction():
    """Seeds 1388, 3484 (Float) and 5654 (Double) on the H200: a multiply feeding an add/sub (frac(a*b) is
    a*b - trunc(a*b)) came out one ulp off eager, because Triton contracted the two into one fused multiply-add
    (one rounding) where eager's separate kernels round twice. Every generated kernel is compiled with
    enable_fp_fusion=False. Checked without a GPU: the kernels' sm_90 PTX has no fma (the interpreter never
    contracts, so only the compiled code can show it), and on a GPU against eager bit for bit."""
    from sm90 import compile_ptx, kernel_spec, plans_of

    torch_dt = {torch.float32: "Float", torch.float64: "Double"}
    kernels = []
    for dt in (torch.float32, torch.float64):
        a = torch.tensor([0.1, 1.7, -2.3, 3.3e-3], dtype=dt, device=DEVICE)
        b = torch.tensor([0.7, -3.1, 9.9, 1.1e3], dtype=dt, device=DEVICE)
        c = torch.tensor([-0.07, 5.27, 22.77, -3.63], dtype=dt, device=DEVICE)
        from pyfuser import DataType, FusionDefinition

        with FusionDefinition() as fd:
            ta, tb, tc = (fd.define_tensor([-1], contiguity=[True], dtype=getattr(DataType, torch_dt[dt]))
                          for _ in range(3))
            prod = fd.ops.mul(ta, tb)
            fd.add_output(fd.ops.add(prod, tc))
            fd.add_output(fd.ops.frac(fd.ops.mul(ta, -1.5)))
        outs = fd.execute([a, b, c])
        for o, r in zip(outs, [a * b + c, torch.frac(a * -1.5)]):
            assert torch.equal(o.view(torch.int64 if dt == torch.float64 else torch.int32),
                               r.view(torch.int64 if dt == torch.float64 else torch.int32)), (o, r)
        plans = plans_of(fd)
        assert plans, "the fusion must run a generated kernel"
        kernels += [kernel_spec(p) for p in plans]
    for k, ptx in zip(kernels, compile_ptx(kernels)):
        assert "fma." not in ptx and "mad.rn" not in ptx, f"{k['name']}: the compiler contracted a multiply-add"


@pytest.mark.parametrize("seed", [2538, 3225, 3562, 4785, 5522, 6886, 8128])
def test_regression_one_alignment_factor_per_coordinate(seed):
    """Seeds of the H200 sweep whose kernels stored out of bounds (garbage, NaN or stale values in the outputs,
    different from run to run). Each kernel indexed one row coordinate with strides written as
    ``rc0 * (s * 4)`` for its int32/bool tensors and ``rc0 * (s * 2)`` for its int64 ones (the alignment factors
    of codegen.plan); the ptxas Triton 3.6 ships turned both into ``(rc0 * 4) * s`` (SASS read on the H200;
    compute-sanitizer: writes 32 bytes past a 160-byte output; ptxas 13.0 too). Every coordinate now carries at
    most one constant (tensors whose strides allow less use a plain product, which compiles correctly). Here: the
    source shows one constant per coordinate, and on a GPU the values match eager."""
    import re

    fd = run_case(seed)
    for report in fd.last_execution():
        src = report.kernel_source
        if not src:
            continue
        scaled: dict = {}
        for coord, factor in re.findall(r"\b(\w+) \* \(\w+ \* (\d+)\)", src):
            scaled.setdefault(coord, set()).add(factor)
        for coord, fs in scaled.items():
            assert len(fs) == 1, f"{report.kernel_name}: {coord} scaled by {sorted(fs)}"


@pytest.mark.parametrize("seed", [127512, 917])
def test_regression_seeds_found_2026_12_02(seed):
    """127512 (CPU): a min over the cummin of top-k indices folded the lanes past k too: a scan dropped its
    operand's lane mask (KValue.valid). 917 (H200): sign of a bf16 input came out +1 for negatives (an integer
    converted straight to bf16, which Triton 3.6 miscompiles; codegen converts through fp32 now)."""
    run_case(seed)


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_regression_reduction_of_a_scan_of_top_k(layout):
    # The smallest 3 of 9 and their indices, a running minimum of the indices, and its min and sum: only the
    # 3 lanes count (lanes past k hold other indices).
    from harness import check_fusion, define

    x = torch.tensor([5.0, 0.5, -7.0, 3.0, -0.25, 8.0, 0.25, -0.5, 1.0], device=DEVICE)
    if layout == "strided":
        x = torch.stack([x, -x], -1)[:, 0]

    def fn(fd):
        _, idx = fd.ops.topk(fd.from_pytorch(x), 3, dim=0, largest=False, sorted=True)
        running = fd.ops.cummin(fd.ops.add(idx, 10), dim=0)
        fd.add_output(fd.ops.min(running, dims=[0]))
        fd.add_output(fd.ops.sum(running, dims=[0]))

    def eager(x):
        running = torch.cummin(torch.topk(x, 3, largest=False).indices + 10, 0).values
        return [running.amin(0), running.sum(0)]

    check_fusion(fn, [x], eager, atol=0, rtol=0)
    fd = define(fn)
    fd.execute([x])
    assert fd.last_execution()[0].runs_as == "triton"
