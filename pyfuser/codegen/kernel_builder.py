"""A tiny kernel IR and its Triton source emitter.

Op lowerings add nodes through :class:`KernelBuilder` (loads, elementwise templates, reductions, stores); the
emitter then writes one Triton kernel over a 2-D tile [BLOCK_R rows, BLOCK_C columns]:

- *pointwise* (no reductions): each program computes one tile;
- *persistent* (reductions, all columns fit one tile): each program owns BLOCK_R whole rows in registers;
- *looped* (reductions, long rows): one pass over the columns per reduction depth (softmax: max, then sum,
  then the output pass), recomputing cheap elementwise work from the inputs instead of keeping it resident.

Every value is either *full* (varies along columns, a [BLOCK_R, BLOCK_C] tile) or *per row* ([BLOCK_R, 1]).
A value's *level* is the number of reductions on its path; level-k full values are computed in pass k.
"""

from __future__ import annotations

import functools
import math

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from . import gelu_tanh_bf16
from .interpreter_compat import interpreting

TL_DTYPE = {
    torch.float32: "tl.float32",
    torch.float64: "tl.float64",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.int64: "tl.int64",
    torch.int32: "tl.int32",
    torch.int16: "tl.int16",
    torch.int8: "tl.int8",
    torch.uint8: "tl.uint8",
    torch.uint64: "tl.uint64",
    torch.bool: "tl.int1",
    torch.float8_e4m3fn: "tl.float8e4nv",
    torch.float8_e5m2: "tl.float8e5",
}

# (identity as a Python literal per dtype kind, elementwise combine template, row-reduce template)
REDUCTIONS = {
    "sum": ("0", "{a} + {b}", "tl.sum({x}, axis=1, keep_dims=True)"),
    "prod": ("1", "{a} * {b}", "tl.reduce({x}, 1, _mul_combine, keep_dims=True)"),
    "max": ("MIN", "_max_nan({a}, {b})", "tl.reduce({x}, 1, _max_nan, keep_dims=True)"),
    "min": ("MAX", "_min_nan({a}, {b})", "tl.reduce({x}, 1, _min_nan, keep_dims=True)"),
    # A float max/min whose result only feeds arithmetic (kernel_source marks them): one max.NaN/min.NaN
    # instruction per element instead of five. Its NaN is the canonical one, not an operand's, but an add,
    # subtract, multiply or divide of a NaN gives the canonical NaN on the GPU whichever it is, as eager's does.
    "max_arith": ("MIN", "_max_canonical_nan({a}, {b})", "tl.reduce({x}, 1, _max_canonical_nan, keep_dims=True)"),
    "min_arith": ("MAX", "_min_canonical_nan({a}, {b})", "tl.reduce({x}, 1, _min_canonical_nan, keep_dims=True)"),
    # integers only (no NaN to propagate): Triton's own max/min
    "max_int": ("MIN", "tl.maximum({a}, {b})", "tl.max({x}, axis=1, keep_dims=True)"),
    "min_int": ("MAX", "tl.minimum({a}, {b})", "tl.min({x}, axis=1, keep_dims=True)"),
}

# Inclusive scans along the columns, by kind.
SCANS = {
    "cumsum": "tl.cumsum({x}, axis=1)",
    "cumprod": "tl.cumprod({x}, axis=1)",
    "cummax": "tl.associative_scan({x}, 1, _cummax_combine)",
    "cummin": "tl.associative_scan({x}, 1, _cummin_combine)",
}

_PRELUDE = '''
@triton.jit
def _mul_combine(a, b):
    return a * b


@triton.jit
def _int_to_bf16(x):
    # An integer as eager converts it to bfloat16: to fp32 (round to nearest), then to bf16 (round to nearest
    # even), that second rounding written with integer ops. Converted directly, LLVM folds a 0/-1 select (a
    # sign, a negated Bool) into a signed conversion of the i1, which Triton 3.6's NVPTX backend lowers to bf16
    # as +1 (selp 1, 0 then cvt.rn.bf16.s32; H200, fuzz seed 917). The value is finite: no NaN case.
    b = x.to(tl.float32).to(tl.int32, bitcast=True)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _bf16_to_f32(x):
    # bf16 widened to fp32 as its bits in the high half of the word: exact, NaN payloads and subnormals kept, as
    # the conversion instruction keeps them. Two bf16 share a 32-bit register; converted with cvt.f32.bf16,
    # ptxas takes the high one out with a byte permute and then shifts it back (two instructions), where the
    # integer form gives it one mask (bf16 tanh-GELU [16384, 4096], sm_90: 3.0 -> 2.0 instructions per element
    # for its three bf16 inputs).
    return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _max_nan(a, b):
    # torch.maximum/amax propagate NaN (either operand); tl.maximum alone would drop it. tl.maximum itself is
    # IEEE's maximum, like CUDA's fmax that ATen uses: max(-0.0, +0.0) is +0.0 in either order.
    return tl.where(a != a, a, tl.where(b != b, b, tl.maximum(a, b)))


@triton.jit
def _min_nan(a, b):
    return tl.where(a != a, a, tl.where(b != b, b, tl.minimum(a, b)))


@triton.jit
def _max_canonical_nan(a, b):
    # IEEE 754-2019 maximum (llvm.maximum, max.NaN on NVIDIA GPUs): NaN if either is NaN (the canonical NaN),
    # and max(-0.0, +0.0) is +0.0 in either order, as _max_nan.
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_canonical_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _cummax_combine(a, b):
    # ATen's cummax: a later element replaces the running value if it is NaN, or if neither is NaN and it is >=
    # (so a later NaN, or a later equal value such as -0.0 after 0.0, wins). Associative: the last element of
    # the greatest key, NaN above everything.
    return tl.where((b != b) | ((a == a) & (b >= a)), b, a)


@triton.jit
def _cummin_combine(a, b):
    return tl.where((b != b) | ((a == a) & (b <= a)), b, a)


@triton.jit
def _exp_ftz(x):
    # exp(x) as ex2.approx.ftz(x * log2(e)): two instructions, where tl.exp's form without .ftz takes five (it
    # scales subnormal inputs and results). Only for the terms of a softmax's row sum (Emitter.sum_exp: the
    # online sum, a sum's own pass): each term is at most 1 and the row's sum at least 1, so a subnormal term
    # flushed to 0, or a subnormal input flushed to 0 (exp 1, which the exact exp rounds to as well), changes
    # nothing the sum keeps. NaN stays NaN, -inf gives 0. The interpreter has no PTX: it uses tl.exp.
    return tl.inline_asm_elementwise(
        "{ .reg .f32 t; mul.rn.f32 t, $1, 0f3FB8AA3B; ex2.approx.ftz.f32 $0, t; }",
        "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _tanh_f32(x):
    # libdevice's tanhf (__nv_tanhf), instruction for instruction, with both of its halves computed and one
    # selected: an odd polynomial below |x| = 0.6 (NaN included), 1 - 2 / (2^(2|x|/ln 2) + 1) with x's sign
    # above, 1 at |x| >= 9.0109. libdevice branches between the halves, and inputs on both sides in one warp
    # run both plus the branching (tanh-GELU: about 30% of its instructions). Same instructions, same bits: the
    # GPU tests compare it with libdevice.tanh on all 2^32 inputs. The interpreter has no PTX: it uses libdevice.
    return tl.inline_asm_elementwise(
        """{
        .reg .f32 x, t, x2, p, e, y;
        .reg .b32 s, yb;
        .reg .pred small, one;
        mov.b32 x, $1;
        abs.f32 t, x;
        mul.rn.f32 x2, x, x;
        fma.rn.f32 p, 0f3C80F082, x2, 0fBD563CAE;
        fma.rn.f32 p, p, x2, 0f3E085941;
        fma.rn.f32 p, p, x2, 0fBEAAA9ED;
        fma.rn.f32 p, p, x2, 0f00000000;
        fma.rn.f32 p, p, x, x;
        mul.rn.f32 e, t, 0f4038AA3B;
        ex2.approx.ftz.f32 e, e;
        add.rn.f32 e, e, 0f3F800000;
        rcp.approx.ftz.f32 e, e;
        fma.rn.f32 y, e, 0fC0000000, 0f3F800000;
        setp.ge.f32 one, t, 0f41102CB4;
        selp.f32 y, 0f3F800000, y, one;
        mov.b32 yb, y;
        and.b32 s, $1, 0x80000000;
        or.b32 yb, yb, s;
        setp.ltu.f32 small, t, 0f3F19999A;
        mov.b32 s, p;
        selp.b32 $0, s, yb, small;
        }""",
        "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _to_bf16_canonical_nan(x):
    # x narrowed to bf16 with every NaN as 0x7FFF, the canonical NaN of eager's CUDA conversion (cvt.rn.bf16.f32:
    # 0x7FC0 in, 0x7FFF out on the H200). Used where x may be a bf16 value widened and then only moved (selected,
    # padded, its sign changed): LLVM folds such a widening and narrowing into a copy, which would keep the NaN's
    # own bits. The select is on the integer bits, which no float folding removes.
    b = x.to(tl.bfloat16).to(tl.int16, bitcast=True)
    return tl.where(x != x, tl.full([], 0x7FFF, tl.int16), b).to(tl.bfloat16, bitcast=True)


@triton.jit
def _bf16_div_reciprocal(b):
    # The row divisor's reciprocal for _div_for_bf16, rounded to nearest (one IEEE division per row); NaN where
    # it is not a normal number (b zero, infinite, NaN, subnormal or above 2^126), which sends every quotient by
    # that b down the exact path.
    r = libdevice.div_rn(tl.full([], 1.0, tl.float32), b)
    return tl.where((tl.abs(r) >= 1.1754943508222875e-38) & (tl.abs(r) <= 3.4028234663852886e38), r, float("nan"))


@triton.jit
def _div_for_bf16(a, r, b):
    # a / b for a quotient that is only ever rounded to bf16: a * r (r = RN(1 / b), normal) is within 2 ulps of
    # the IEEE quotient RN(a / b) (subnormal and overflowing quotients included), so both round to the same
    # bf16 unless a bf16 rounding midpoint (low 16 bits 0x8000) lies within those 2 ulps. Quotients whose low
    # 16 bits are within 4 of it, and NaN ones (a NaN operand or r), take IEEE division (div.rn), four lanes
    # behind one branch that warps rarely take. The midpoint test is one multiply-add and one compare: the low
    # 16 bits minus 0x7FFC, shifted to the top of the word (bits * 65536 + 0x8004 << 16), at most 8 << 16.
    # The fast path is 4 instructions against div.rn's 10.
    return tl.inline_asm_elementwise(
        """{
        .reg .f32 q<4>;
        .reg .b32 t<4>;
        .reg .pred slow;
        mul.rn.f32 q0, $4, $8;
        mul.rn.f32 q1, $5, $9;
        mul.rn.f32 q2, $6, $10;
        mul.rn.f32 q3, $7, $11;
        mov.b32 t0, q0;
        mov.b32 t1, q1;
        mov.b32 t2, q2;
        mov.b32 t3, q3;
        mad.lo.u32 t0, t0, 65536, 0x80040000;
        mad.lo.u32 t1, t1, 65536, 0x80040000;
        mad.lo.u32 t2, t2, 65536, 0x80040000;
        mad.lo.u32 t3, t3, 65536, 0x80040000;
        setp.le.u32 slow, t0, 0x80000;
        setp.le.or.u32 slow, t1, 0x80000, slow;
        setp.le.or.u32 slow, t2, 0x80000, slow;
        setp.le.or.u32 slow, t3, 0x80000, slow;
        setp.nan.or.f32 slow, q0, q1, slow;
        setp.nan.or.f32 slow, q2, q3, slow;
        @!slow bra DIV_DONE_${:uid};
        div.rn.f32 q0, $4, $12;
        div.rn.f32 q1, $5, $13;
        div.rn.f32 q2, $6, $14;
        div.rn.f32 q3, $7, $15;
        DIV_DONE_${:uid}:
        mov.b32 $0, q0;
        mov.b32 $1, q1;
        mov.b32 $2, q2;
        mov.b32 $3, q3;
        }""",
        "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r", [a, r, b], dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def _remainder_adjust(r, b):
    # Python/torch remainder from a C remainder r (fmod, or % on integers, both take the dividend's sign): move
    # a non-zero r to the divisor's sign. A zero keeps the dividend's sign, as ATen's remainder does.
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
'''


@functools.lru_cache(maxsize=None)
def prelude_for_bound(u_abs_error: float) -> str:
    """The helpers every generated kernel starts with, the bf16 tanh-GELU tail's window from ``u_abs_error``."""
    return _PRELUDE + gelu_tanh_bf16.prelude(gelu_tanh_bf16.window(u_abs_error))


def prelude() -> str:
    """prelude_for_bound of the visible GPUs (gelu_tanh_bf16.device_bound: the largest of their bounds, each
    measured per architecture or else the documented one)."""
    return prelude_for_bound(gelu_tanh_bf16.device_bound())

# Options every generated kernel is compiled with (the launcher passes them to the JIT launch; the interpreter
# ignores them). Triton compiles libdevice in its flush-to-zero flavour by default: fp32 ceil/floor/sqrt/div_rn/
# exp/... then read and write subnormals as 0 (measured on the H200: ceil(1.5e-39) = 0, 0 / 1.5e-39 = NaN),
# where ATen's CUDA kernels keep them. Plain arithmetic and comparisons never flush.
# Triton also contracts a multiply feeding an add or subtract into one fused multiply-add (LLVM's fp-contract and
# ptxas --fmad, both on by default), which rounds once where eager, one op per kernel, rounds the product and then
# the sum: a*b + c, or frac(a*b) = a*b - trunc(a*b), came out one ulp off (fuzzer seeds 1388, 3484; Double 5654).
# Every fma a kernel needs is written out (libdevice calls keep theirs), so contraction is switched off.
COMPILE_OPTIONS = {"enable_reflect_ftz": False, "enable_fp_fusion": False}

# The test that sends a pointwise tile wholly inside its rows to the unmasked path (``split_interior``); the
# instruction census compiles the kernel with it taken as true to count that path alone.
INTERIOR_TILE_TEST = "pid_c * BLOCK_C + BLOCK_C <= n_cols"


_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits_if_not_normal(value: float, dtype: torch.dtype) -> Optional[int]:
    """The bit pattern (as a signed integer of the dtype's width) of ``value`` rounded to ``dtype`` when that is
    a zero or a subnormal; None for normal numbers, infinities and NaN."""
    t = torch.tensor(value, dtype=torch.float64).to(dtype)
    v = float(t)
    if v != v or abs(v) == float("inf") or abs(v) >= torch.finfo(dtype).tiny:
        return None
    return int(t.view(_INT_OF_WIDTH[dtype.itemsize]))


def _converted(value: Any, dtype: torch.dtype) -> Any:
    """A Python scalar as ``dtype`` holds it (a float rounded to its precision; the constants' KValue.value),
    None where torch cannot hold it (an int beyond int64)."""
    try:
        return torch.tensor(value).to(dtype).item()
    except (OverflowError, RuntimeError, TypeError):
        return None


def _is_fp8(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point and dtype.itemsize == 1


def identity_literal(kind: str, dtype: torch.dtype) -> str:
    ident = REDUCTIONS[kind][0]
    if ident not in ("MIN", "MAX"):
        return ident
    if dtype.is_floating_point:
        return 'float("-inf")' if ident == "MIN" else 'float("inf")'
    if dtype == torch.bool:
        return "0" if ident == "MIN" else "1"
    info = torch.iinfo(dtype)
    return str(info.min if ident == "MIN" else info.max)


@dataclass(eq=False)
class KValue:
    """A node of the kernel IR."""

    kind: str  # "load" | "arg" | "const" | "op" | "reduce" | "scan" | "argsort" | "flag" | "search"
    dtype: torch.dtype
    operands: tuple = ()
    template: str = ""  # op: format string over operands ({0}, {1}, ...); const/arg: the literal / arg name
    full: bool = False
    level: int = 0
    param: Any = None  # load: the TensorParam
    reduction: str = ""  # reduce: key of REDUCTIONS
    uid: int = 0
    # Lanes where a full value is defined, when that is fewer than the kernel's columns (a Bool KValue, or None:
    # every column): a top-k result is k wide along a column dim of the input's extent (sort_lowerings.py).
    # Elementwise ops pass it on; reductions fold only those lanes and stores write only those.
    valid: Optional["KValue"] = None
    # search: (loop variable, hit, bad), computed inside its loop over the variable (KernelBuilder.search_last)
    body: tuple = ()
    # KernelBuilder.const: the constant's value, as converted to ``dtype`` (None: not a constant of the source,
    # e.g. a scalar argument, whose value the compiler does not know either)
    value: Any = None

    @property
    def var(self) -> str:
        return f"v{self.uid}"


@dataclass(eq=False)
class TensorParam:
    """A tensor argument of the kernel: its pointer name and how it is indexed."""

    name: str
    dtype: torch.dtype
    # [(coordinate index, stride arg name, constant factor)]: the stride is arg * factor
    row_terms: list = field(default_factory=list)
    col_terms: list = field(default_factory=list)
    is_output: bool = False
    # A view read by a memory-read op (slice, pad, cat, ...; codegen/memory_views.py): the arg holding the
    # element offset of its coordinate 0 (None: 0), and the stride args of its gathered dims, each multiplied by
    # an index value the load receives as an operand.
    base: Optional[str] = None
    gathers: list = field(default_factory=list)

    def arg_names(self) -> list[str]:
        """This tensor's int arguments, in signature order."""
        return [s for _, s, _ in self.row_terms + self.col_terms] + ([self.base] if self.base else []) + self.gathers

    @property
    def has_col(self) -> bool:
        return bool(self.col_terms)

    @property
    def has_row(self) -> bool:
        return bool(self.row_terms)


class KernelBuilder:
    def __init__(self):
        self.nodes: list[KValue] = []
        self.stores: list[tuple[TensorParam, KValue]] = []
        self.scalar_args: list[str] = []
        self.fixed_ints: list[tuple[str, int]] = []  # (arg name, value), see fixed_int
        self.store_masks: dict[str, KValue] = {}  # param name -> the lanes a narrow output exists in (store)
        # Run-time checks (an index out of range): each ORs into its own slot of the call's error flags
        # (runtime/device_errors.py); the kernel takes ``err_ptr`` and one ``err_slot<i>`` per check.
        self.checks: list = []
        # Set by the planner: id(memory-read expr) -> its Access (codegen/memory_views.py), and
        # coordinate_of(tv, dim) -> the KValue of that dim's coordinate.
        self.access: dict = {}
        self.coordinate_of = None
        self.has_columns = True  # whether the kernel iterates any column dim of extent > 1
        self.n_cols = 0  # the product of the column extents (set by the planner)
        self.resolve = None  # resolve(expr argument, local values) -> kernel value (set while lowering)

    # --- node constructors ------------------------------------------------------------------------------
    def _add(self, v: KValue) -> KValue:
        v.uid = len(self.nodes)
        self.nodes.append(v)
        return v

    def load(self, param: TensorParam, mask: Optional[KValue] = None, indices: tuple = ()) -> KValue:
        """A load of ``param`` at the tile's coordinates; ``indices`` (one per ``param.gathers``) add
        index * stride to the address, and ``mask`` (bool) limits it further: masked-off lanes read 0."""
        if len(indices) != len(param.gathers):
            raise ValueError(f"internal error: {param.name} gathers {len(param.gathers)} dims, got {len(indices)}")
        ops = tuple(indices) + ((mask,) if mask is not None else ())
        full = param.has_col or any(o.full for o in ops)
        level = max((o.level for o in ops), default=0)
        return self._add(KValue("load", param.dtype, ops, full=full, level=level, param=param,
                                template="mask" if mask is not None else ""))

    def coordinate(self, name: str, full: bool, dtype: torch.dtype) -> KValue:
        """The kernel's coordinate variable ``name`` (a loop dim of its own run: see plan.py). A column
        coordinate ("c", "cc<i>") is named per tile: the emitter fills in the tile's suffix (``{sfx}``)."""
        if full:
            name = name[:2] + "{sfx}" + name[2:] if name.startswith("cc") else name + "{sfx}"
        return self._add(KValue("op", dtype, (), name, full, 0))

    def fixed_int(self, value: int) -> KValue:
        """An int known when the kernel is planned (an extent, a bound), passed as a launch argument so the
        source does not change with it."""
        name = f"x{len(self.fixed_ints)}"
        self.fixed_ints.append((name, int(value)))
        return self._add(KValue("const", torch.int64 if abs(int(value)) > 2**31 - 1 else torch.int32, template=name))

    def arg(self, name: str, dtype: torch.dtype) -> KValue:
        """A scalar kernel argument, typed here: the interpreter passes Python floats unwrapped, and a
        0-dim tensor behaves the same everywhere (e.g. in ``a != a``)."""
        if name not in self.scalar_args:
            self.scalar_args.append(name)
        return self.op(f"tl.full([], {name}, {TL_DTYPE[dtype]})", [], dtype)

    def const(self, value: Any, dtype: torch.dtype) -> KValue:
        """A literal converted to ``dtype`` the way a cast would (2.7 as an int is 2); the node keeps the value."""
        v = self._const(value, dtype)
        v.value = _converted(value, dtype)
        return v

    def _const(self, value: Any, dtype: torch.dtype) -> KValue:
        if dtype.is_floating_point:
            value = float(value)  # also numpy scalars, whose repr is not Triton source
            bits = _bits_if_not_normal(value, dtype)
            if bits is not None:
                # -0.0 and subnormals as their bit pattern: Triton turns a zero constant into +0.0 (tl.full's
                # null value, and '-0.0' in source is 0 - 0.0), and types an fp32-subnormal Python float as fp64.
                int_dt = _INT_OF_WIDTH[dtype.itemsize]
                return self.op(f"tl.full([], {bits}, {TL_DTYPE[int_dt]}).to({TL_DTYPE[dtype]}, bitcast=True)", [],
                               dtype)
            lit = repr(value) if value == value and abs(value) != float("inf") else f'float("{value}")'
            if dtype != torch.float32:  # a bare float literal is fp32 in Triton
                return self.op(f"tl.full([], {lit}, {TL_DTYPE[dtype]})", [], dtype)
        elif dtype == torch.bool:
            lit = "1" if value else "0"  # as a cast to Bool: any non-zero value is True
        else:
            value = int(value)
            if not -2**31 <= value < 2**31:
                # Triton types a bare literal outside int32 as int64 or uint64 (and '-9223372036854775808' is a
                # negation of a uint64): say the dtype.
                return self.op(f"tl.full([], {value}, {TL_DTYPE[dtype]})", [], dtype)
            lit = repr(value)
        return self._add(KValue("const", dtype, template=lit))

    def op(self, template: str, operands: list, dtype: torch.dtype) -> KValue:
        """An elementwise node: ``template`` formats the operands' variables ({0}, {1}, ...)."""
        ops = tuple(operands)
        full = any(o.full for o in ops)
        level = max((o.level for o in ops), default=0)
        v = self._add(KValue("op", dtype, ops, template, full, level))
        v.valid = self._valid_of(ops)
        return v

    def _valid_of(self, ops) -> Optional[KValue]:
        masks = []
        for o in ops:
            if o.valid is not None and all(o.valid is not m for m in masks):
                masks.append(o.valid)
        out = masks[0] if masks else None
        for m in masks[1:]:
            out = self._add(KValue("op", torch.bool, (out, m), "{0} & {1}", True, max(out.level, m.level)))
        return out

    def cast(self, v: KValue, dtype: torch.dtype) -> KValue:
        if v.dtype == dtype:
            return v
        fp8 = _is_fp8(v.dtype) or _is_fp8(dtype)
        if fp8 and torch.float32 not in (v.dtype, dtype):
            # Triton converts fp8 only to and from fp32 on every path (ints, fp64 and the other fp8 fail).
            return self.cast(self.cast(v, torch.float32), dtype)
        if v.kind in ("arg", "const"):
            return self.op(f"tl.full([], {{0}}, {TL_DTYPE[dtype]})", [v], dtype)
        if dtype == torch.bfloat16 and not v.dtype.is_floating_point:
            return self.op("_int_to_bf16({0})", [v], dtype)  # (see the prelude: a backend miscompile)
        return self.op(f"{{0}}.to({TL_DTYPE[dtype]})", [v], dtype)

    def reduce(self, kind: str, v: KValue, dtype: Optional[torch.dtype] = None) -> KValue:
        dtype = dtype or v.dtype
        v = self.cast(v, dtype)
        if v.valid is not None:  # lanes past a narrower tensor's extent take no part
            ident = self.op(f"tl.full([], {identity_literal(kind, dtype)}, {TL_DTYPE[dtype]})", [], dtype)
            v = self.op("tl.where({0}, {1}, {2})", [v.valid, v, ident], dtype)
            v.valid = None
        return self._add(KValue("reduce", dtype, (v,), full=False, level=v.level + 1, reduction=kind))

    def scan(self, kind: str, v: KValue) -> KValue:
        """The inclusive scan of ``v`` along the columns (whole rows in one tile: persistent kernels only)."""
        if kind not in SCANS:
            raise ValueError(f"internal error: no scan {kind!r}")
        out = self._add(KValue("scan", v.dtype, (v,), full=True, level=v.level + 1, reduction=kind))
        # A narrow operand's lanes (a top-k result: the first k columns) stay the result's: the lanes past them
        # come after every valid one, so they change no valid prefix, but a later reduction must skip them
        # (fuzz seed 127512: a min over a cummin of top-k indices took the lanes past k).
        out.valid = v.valid
        return out

    def argsort(self, key: KValue, column: KValue, descending: bool) -> KValue:
        """The stable argsort of ``key`` along the columns (persistent kernels only; ``column``: the column
        coordinate): each row's indices in ascending (or descending) order of ``key``, NaN above everything, equal
        keys (-0.0 and +0.0 included) in index order. Int32 (codegen/sort_lowerings.py)."""
        return self._add(KValue("argsort", torch.int32, (key, column), "descending" if descending else "ascending",
                                full=True, level=max(key.level, column.level) + 1))

    def loop_var(self) -> KValue:
        """The variable of a loop emitted by ``search_last`` (an int32 scalar; a name no other node has)."""
        return self._add(KValue("const", torch.int32, template=f"j{len(self.nodes)}"))

    def search_last(self, j: KValue, extent: KValue, hit: KValue, bad: KValue, invariants: tuple = ()) -> KValue:
        """The last ``j`` in [0, extent) for which ``hit`` holds, -1 where it never does, and -2 where ``bad``
        held for some ``j`` (a value the caller turns into an error flag). ``hit`` and ``bad`` are Bool values
        computed from the loop variable ``j`` (``loop_var``): they are emitted inside one loop over ``j`` (O(extent)
        work per lane, O(1) registers). ``invariants``: values they read that do not depend on ``j``, emitted once
        before the loop. Int32 (codegen/scatter_lowerings.py)."""
        ops = (extent, *invariants)
        full = any(o.full for o in ops + (hit, bad))
        level = max(o.level for o in ops + (hit, bad))
        return self._add(KValue("search", torch.int32, ops, full=full, level=level, body=(j, hit, bad)))

    def error_flag(self, bad: KValue, check) -> KValue:
        """A node that sets the error flag of ``check`` (an object with ``messages(bits)``) where ``bad`` holds on a
        lane the kernel computes. Make the values that must not exist without it depend on it (as an extra
        operand): it is emitted before them, in whichever pass computes them."""
        i = len(self.checks)
        self.checks.append(check)
        return self._add(KValue("flag", torch.int32, (bad,), f"err_slot{i}", full=bad.full, level=bad.level))

    def n_reduced(self, v: Optional[KValue] = None) -> KValue:
        """The number of elements per row a reduction of ``v`` folds: the product of the column extents, or the
        lanes where a narrow ``v`` exists (a top-k result)."""
        if v is not None and v.valid is not None:
            return self.reduce("sum", self.cast(v.valid, torch.int64))
        return self.op("tl.full([], n_cols, tl.int64)", [], torch.int64)

    def store(self, param: TensorParam, v: KValue, mask: Optional[KValue] = None) -> None:
        """``mask`` (a full Bool value) limits the store to the lanes where the tensor exists (a narrow tensor)."""
        if mask is not None:
            self.store_masks[param.name] = mask
        self.stores.append((param, self.cast(v, param.dtype)))

    @property
    def max_level(self) -> int:
        return max((v.level for v in self.nodes if v.kind == "reduce"), default=0)


class _Scope:
    """Emission scope: which nodes already have a variable visible here."""

    def __init__(self, parent: Optional["_Scope"] = None):
        self.parent = parent
        self.emitted: set[int] = set()

    def has(self, v: KValue) -> bool:
        s = self
        while s is not None:
            if v.uid in s.emitted:
                return True
            s = s.parent
        return False


def _expr(v: KValue) -> str:
    if v.kind in ("const", "arg"):
        return v.template
    return v.var


class Emitter:
    """Writes the kernel source for a KernelBuilder and a row/column index structure."""

    def __init__(self, kb: KernelBuilder, params: list[TensorParam], n_row_dims: int, n_col_dims: int,
                 mode: str, index64: bool, n_cols_factor: int = 1, row_tiles: int = 0, wide: int = 0,
                 split_interior: int = 0, full_col_tiles: bool = False, online: Optional[dict] = None,
                 welford: Optional[dict] = None, fast_exp_sums: frozenset = frozenset(),
                 sum_exp: str = "tl.exp", welford_group: int = 0, grid_2d: bool = False):
        assert mode in ("pointwise", "persistent", "looped")
        assert not grid_2d or mode == "pointwise"
        # A pointwise kernel on a (column blocks, row blocks) grid reads its tile's coordinates from the two
        # program ids; on a one-dimensional grid it divides its id by the column blocks, a count known only at run
        # time (a signed division: about 30 instructions per thread, 1.5 per element in a bf16 tanh-GELU).
        self.grid_2d = grid_2d
        assert not split_interior or mode == "pointwise"
        assert not full_col_tiles or not (split_interior or row_tiles)
        self.kb, self.params = kb, params
        # Every column tile lies wholly inside the row (the plan's BLOCK_C, times a looped kernel's tiles per
        # step, divides n_cols): the column mask is a constant True, which the compiler folds away, and
        # reductions fold every lane (a bf16 softmax's row max and sum each paid a select per element).
        self.full_col_tiles = full_col_tiles
        # A pointwise kernel over rows whose width is not a multiple of a 16-byte vector (``split_interior``
        # elements of the narrowest column tensor): the column mask ``c < n_cols`` then has constancy 1 in
        # Triton's alignment analysis, and every masked load and store of the kernel is scalar. Tiles wholly
        # inside the row take a branch of their own where the column mask is a constant True (row masks alone
        # are constant along a row); the row's last tile masks its columns up to the last multiple of a vector
        # (constant over each vector) and writes the few columns after it as a tile of one vector's width. So
        # every access is vectorized but those of that narrow tile (plan.py picks tiles narrower than the row).
        self.split_interior = split_interior
        # The tile being written: its width and the suffix of its variables' names (a row's last few columns get
        # a narrower tile of their own, names apart: Triton wants each name to keep one type across an if).
        self.bc, self.sfx = "BLOCK_C", ""
        # A looped kernel over a row of exactly this many BLOCK_C tiles (0: any number): a row held in registers
        # in pieces (plan.py, row_tiles). Each tile is written out as straight-line code with names of its own
        # (suffix _<k>), once per pass, so a later pass reads the values an earlier one computed for that tile
        # instead of loading and computing them again (an output stored in between may alias the input, so the
        # compiler could not reuse the loads, nor the exp of a softmax computed from them), and every tile but
        # the last (row_tiles = ceil(n_cols / BLOCK_C)) lies wholly inside the row: no column mask.
        self.row_tiles = row_tiles
        # A looped kernel over rows too long for registers (plan.py, wide_rows): ``wide`` tiles per step of its
        # column loops, unrolled (all their loads in flight at once), and a grid of a few programs per SM, each
        # walking rows in turn, so that the rows being read fit in L2 and later passes re-read them from there.
        self.wide = wide
        # A softmax's row sum of exp(x - max) accumulated in the pass of its max (wide rows: see
        # _online_softmax_sums): the sum's uid -> the max, whose pass then computes both.
        self.online = online or {}
        # A variance's sum of squared deviations accumulated in the pass of the mean's sum (wide rows with whole
        # column tiles: see welford_moments): that sum's uid -> (the mean, the sum of squares).
        self.welford = welford or {}
        # Columns per Welford lane (0: one; see _welford_init).
        self.welford_group = welford_group
        # A softmax's row sum of exp(x - max) in a pass of its own (wide rows whose sum is not online): the sums'
        # uids, whose pass adds sum_exp's exp (see _online_softmax_sums: the same sums).
        self.fast_exp_sums = fast_exp_sums
        # The exp of those sums' terms and of the online sums' (tl.exp, or the prelude's _exp_ftz on the GPU).
        self.sum_exp = sum_exp
        self._load_policy = ""  # eviction policy of row loads in the pass being written (wide kernels)
        self.n_row_dims, self.n_col_dims = n_row_dims, n_col_dims
        self.mode, self.index64 = mode, index64
        # n_cols's power-of-two factor, as a source constant: column masks are then provably constant over a
        # vector, so masked loads and stores can be wide (Triton only knows "divisible by 16" by itself).
        self.n_cols_factor = n_cols_factor
        self.lines: list[str] = []
        self.indent = 1

    # --- helpers -------------------------------------------------------------------------------------------
    def _n(self, v: KValue) -> str:
        """What the source calls ``v``: a literal, an argument, or its variable in the tile being written (a
        per-row value has one name in every tile: it is the same value there)."""
        if v.kind in ("const", "arg"):
            return _expr(v)
        return v.var + self.sfx if v.full else v.var

    def w(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def _coords(self, flat: str, prefix: str, sizes: list[str]) -> list[str]:
        """Coordinates of a flattened index over dims with these size args (outermost first)."""
        n = len(sizes)
        if n == 0:
            return []
        if n == 1:
            return [flat]
        names = [f"{prefix}{i}" for i in range(n)]
        rest = flat
        for i in range(n - 1, 0, -1):
            self.w(f"{names[i]} = {rest} % {sizes[i]}")
            self.w(f"{prefix}q{i} = {rest} // {sizes[i]}")
            rest = f"{prefix}q{i}"
        self.w(f"{names[0]} = {rest}")
        return names

    @staticmethod
    def _offset(terms: list, coords: list[str], base: str) -> str:
        if not terms:
            return f"{base} * 0"  # a block of zeros, so pointer and mask shapes agree
        return " + ".join(f"{coords[i]} * {stride}" if f == 1 else f"{coords[i]} * ({stride} * {f})"
                          for i, stride, f in terms)

    # --- emission ------------------------------------------------------------------------------------------
    def emit_node(self, v: KValue, scope: _Scope, col_mask: str) -> None:
        if scope.has(v) or v.kind in ("const", "arg"):
            return
        for o in v.operands:
            self.emit_node(o, scope, col_mask)
        if v.kind == "load":
            p = v.param
            zero = "0.0" if p.dtype.is_floating_point else "0"  # Triton casts no int to fp8
            extra = "".join(f" + {self._n(i)}.to(tl.int64) * {g}" for i, g in zip(v.operands, p.gathers))
            if p.base:
                extra += f" + {p.base}"
            if p.has_col and not p.has_row and not v.operands:  # e.g. a bias: one [1, BLOCK_C] row
                addr, mask = f"{p.name}_coff{self.sfx}", f"cmask{self.sfx}"
            elif p.has_col:
                addr, mask = f"{p.name}_roff + {p.name}_coff{self.sfx}", col_mask
            else:
                addr, mask = f"{p.name}_roff", col_mask if v.full else "rmask"
            if v.template == "mask":
                mask = f"({mask}) & {self._n(v.operands[-1])}"
            hint = f", eviction_policy='{self._load_policy}'" if self._load_policy and p.has_row else ""
            self.w(f"{self._n(v)} = tl.load({p.name}_ptr + {addr}{extra}, mask={mask}, other={zero}{hint})")
        elif v.kind == "op":
            self.w(f"{self._n(v)} = {v.template.format(*[self._n(o) for o in v.operands], sfx=self.sfx)}")
        elif v.kind == "flag":
            # Any lane flagged sets the slot (every program writes the same 1: no read-modify-write race).
            (bad,) = v.operands
            any_bad = f"tl.max(tl.where({col_mask}, {self._n(bad)}, 0).to(tl.int32))"
            self.w(f"tl.store(err_ptr + {v.template}, tl.full([], 1, tl.int32), mask={any_bad} > 0)")
        elif v.kind == "scan":
            if self.mode != "persistent":
                raise ValueError("internal error: a scan outside a persistent kernel")
            (x,) = v.operands
            src = self._n(x) if x.full else f"tl.broadcast_to({self._n(x)}, [BLOCK_R, {self.bc}])"
            # Lanes past the row end come after every real lane: they never reach a real prefix.
            self.w(f"{self._n(v)} = {SCANS[v.reduction].format(x=src)}")
        elif v.kind == "argsort":
            self._emit_argsort(v)
        elif v.kind == "search":
            self._emit_search(v, scope, col_mask)
        elif v.kind == "reduce":
            # Only the column mask: lanes of rows past n_rows hold masked loads' zeros and what is computed from
            # them, and reach only their own rows' results, which are never stored.
            (x,) = v.operands
            src = self._n(x)
            if not x.full:  # a per-row value reduced over columns: broadcast it over the tile first
                src = f"tl.broadcast_to({src}, [BLOCK_R, {self.bc}])"
            if not self.full_col_tiles:
                src = f"tl.where(cmask{self.sfx}, {src}, {identity_literal(v.reduction, v.dtype)})"
            self.w(f"{self._n(v)} = {REDUCTIONS[v.reduction][2].format(x=src)}")
        scope.emitted.add(v.uid)

    def _emit_argsort(self, v: KValue) -> None:
        """Two loops over the row's columns, O(n) registers and O(n^2) comparisons (n <= 256): the rank of each
        element (how many come before it: smaller keys, NaN last, then equal keys at lower indices), then the
        inverse of that permutation. A column j's key is taken out of the tile by a row sum over the one lane
        holding it (exact: every other lane adds 0; only a zero's sign can change, and -0.0 == +0.0 here)."""
        if self.mode != "persistent":
            raise ValueError("internal error: an argsort outside a persistent kernel")
        key, col = v.operands
        k, c, r = self._n(key), self._n(col), self._n(v)
        if not key.full:
            k = f"tl.broadcast_to({k}, [BLOCK_R, {self.bc}])"
        is_float = key.dtype.is_floating_point
        self.w(f"{r}_rank = tl.zeros([BLOCK_R, {self.bc}], tl.int32)")
        self.w(f"for {r}_j in range(0, n_cols):")
        self.indent += 1
        self.w(f"{r}_kj = tl.sum(tl.where({c} == {r}_j, {k}, 0), axis=1, keep_dims=True)")
        lt, gt = (f"({r}_kj < {k})", f"({r}_kj > {k})")
        before = lt if v.template == "ascending" else gt
        tie = f"({r}_kj == {k})"
        if is_float:
            nan_j, nan_i = f"({r}_kj != {r}_kj)", f"({k} != {k})"
            # ascending: NaN after every number; descending: before every number. Two NaNs are equal.
            before = (f"({before} | ({nan_i} & ~{nan_j}))" if v.template == "ascending"
                      else f"({before} | ({nan_j} & ~{nan_i}))")
            tie = f"({tie} | ({nan_j} & {nan_i}))"
        self.w(f"{r}_rank += ({before} | ({tie} & ({r}_j < {c}))).to(tl.int32)")
        self.indent -= 1
        self.w(f"{r} = tl.zeros([BLOCK_R, {self.bc}], tl.int32)")
        self.w(f"for {r}_i in range(0, n_cols):")
        self.indent += 1
        self.w(f"{r}_ri = tl.sum(tl.where({c} == {r}_i, {r}_rank, 0), axis=1, keep_dims=True)")
        self.w(f"{r} = tl.where({c} == {r}_ri, {r}_i, {r})")
        self.indent -= 1

    def _emit_search(self, v: KValue, scope: _Scope, col_mask: str) -> None:
        """One loop over ``j`` (KernelBuilder.search_last). The accumulators have the value's tile shape from the
        start, so every iteration assigns them the same type; ``hit`` and ``bad`` (and whatever they read that
        depends on ``j``) are emitted inside the loop, in a scope of their own."""
        j, hit, bad = v.body
        r, shape = self._n(v), f"[BLOCK_R, {self.bc}]" if v.full else "[BLOCK_R, 1]"
        self.w(f"{r} = tl.full({shape}, -1, tl.int32)")
        self.w(f"{r}_bad = tl.zeros({shape}, tl.int1)")
        self.w(f"for {self._n(j)} in range(0, {self._n(v.operands[0])}):")
        self.indent += 1
        inner = _Scope(scope)
        self.emit_node(hit, inner, col_mask)
        self.emit_node(bad, inner, col_mask)
        self.w(f"{r} = tl.where({self._n(hit)}, {self._n(j)}, {r})")
        self.w(f"{r}_bad = {r}_bad | {self._n(bad)}")
        self.indent -= 1
        self.w(f"{r} = tl.where({r}_bad, -2, {r})")

    def _col_setup(self, col_base: str, end: Optional[str] = "n_cols") -> None:
        """The tile's columns ``c`` from ``col_base`` on, ``cmask`` (those before ``end``; None: a tile wholly
        inside the row, all True) and each tensor's column offsets."""
        c = f"c{self.sfx}"
        self.w(f"{c} = {col_base} + tl.arange(0, {self.bc})[None, :]")
        if self.index64:
            self.w(f"{c} = {c}.to(tl.int64)")
        if end is None:
            self.w(f"cmask{self.sfx} = tl.full([1, {self.bc}], 1, tl.int1)")
        else:
            self.w(f"cmask{self.sfx} = {c} < {end}")
        ccoords = self._coords(c, f"cc{self.sfx}", [f"cs{i}" for i in range(self.n_col_dims)])
        for p in self.params:
            if p.has_col:
                self.w(f"{p.name}_coff{self.sfx} = {self._offset(p.col_terms, ccoords, c)}")

    def _store(self, p: TensorParam, v: KValue, scope: _Scope) -> None:
        if p.has_col:
            mask = f"rmask & cmask{self.sfx}"
            narrow = self.kb.store_masks.get(p.name)
            if narrow is not None:
                self.emit_node(narrow, scope, mask)
                mask += f" & {self._n(narrow)}"
            # Wide rows' outputs are written once and not read again here: stream them past L2 (.cs).
            hint = ", cache_modifier='.cs'" if self.wide else ""
            self.w(f"tl.store({p.name}_ptr + {p.name}_roff + {p.name}_coff{self.sfx}, {self._n(v)}, mask={mask}{hint})")
        else:
            if v.full:  # the plan gave a column-varying value to a tensor without column dims
                raise ValueError(f"internal error: per-row output {p.name} receives a full tile")
            self.w(f"tl.store({p.name}_ptr + {p.name}_roff, {self._n(v)}, mask={self._row_store_mask})")

    def source(self, name: str) -> str:
        kb = self.kb
        args = [f"{p.name}_ptr" for p in self.params] + (["err_ptr"] if kb.checks else []) + list(kb.scalar_args)
        args += [f"err_slot{i}" for i in range(len(kb.checks))]
        args += [f"rs{i}" for i in range(self.n_row_dims)] + [f"cs{i}" for i in range(self.n_col_dims)]
        for p in self.params:
            args += p.arg_names()
        args += [name for name, _ in kb.fixed_ints]
        n_cols_arg = "n_cols" if self.n_cols_factor == 1 else "n_cols_q"
        args += ["n_rows", n_cols_arg, "BLOCK_R: tl.constexpr", "BLOCK_C: tl.constexpr"]
        self.lines = ["@triton.jit", f"def {name}({', '.join(args)}):"]
        self.indent = 1
        if self.n_cols_factor != 1:
            self.w(f"n_cols = n_cols_q * {self.n_cols_factor}")
        if self.mode == "pointwise" and self.grid_2d:
            self.w("pid_c = tl.program_id(0)")
            self.w("pid_r = tl.program_id(1)")
        elif self.mode == "pointwise":
            self.w("pid = tl.program_id(0)")
            self.w("nb_c = tl.cdiv(n_cols, BLOCK_C)")
            self.w("pid_r = pid // nb_c")
            self.w("pid_c = pid % nb_c")
        elif self.wide:
            self.w("for pid_r in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_R), tl.num_programs(0)):")
            self.indent += 1
        else:
            self.w("pid_r = tl.program_id(0)")
        self.w("r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
        if self.index64:
            self.w("r = r.to(tl.int64)")
        self.w("rmask = r < n_rows")
        rcoords = self._coords("r", "rc", [f"rs{i}" for i in range(self.n_row_dims)])
        for p in self.params:
            self.w(f"{p.name}_roff = {self._offset(p.row_terms, rcoords, 'r')}")
        # A per-row output is written once per row: by the first column block in pointwise kernels.
        self._row_store_mask = "rmask & (pid_c == 0)" if self.mode == "pointwise" else "rmask"

        top = _Scope()
        full_stores = [(p, v) for p, v in kb.stores if p.has_col]
        row_stores = [(p, v) for p, v in kb.stores if not p.has_col]
        if self.mode in ("pointwise", "persistent"):
            self._col_setup("pid_c * BLOCK_C" if self.mode == "pointwise" else "0",
                            None if self.full_col_tiles else "n_cols")
            if self.split_interior:
                vec = self.split_interior
                self.w(f"n_cols_v = n_cols // {vec} * {vec}")
                # (both branches bind the same names to the same types, as Triton requires of an if)
                self.w(f"if {INTERIOR_TILE_TEST}:")
                self.indent += 1
                self.w("cmask = tl.full([1, BLOCK_C], 1, tl.int1)")
                self._emit_stores(_Scope(top))
                self.indent -= 1
                self.w("else:")
                self.indent += 1
                self.w("cmask = c < n_cols_v")
                self._emit_stores(_Scope(top))
                # The row's last n_cols % vec columns: BLOCK_C and the tile's start are multiples of vec, so they
                # lie in this tile, after the columns just written. Per-row outputs are written above already.
                self.bc, self.sfx = str(vec), "_t"
                self._col_setup("n_cols_v")
                self._emit_stores(_Scope(top), per_row=False)
                self.bc, self.sfx = "BLOCK_C", ""
                self.indent -= 1
            else:
                self._emit_stores(top)
        else:
            self._emit_looped(top, full_stores, row_stores)
        return "\n".join(self.lines) + "\n"

    def _emit_stores(self, scope: _Scope, per_row: bool = True) -> None:
        """Every output's value and its store (``per_row``: those of per-row outputs too), over the current tile
        (pointwise and persistent kernels)."""
        for p, v in self.kb.stores:
            if per_row or p.has_col:
                self.emit_node(v, scope, f"rmask & cmask{self.sfx}")
                self._store(p, v, scope)

    def _emit_looped(self, top: _Scope, full_stores, row_stores) -> None:
        kb = self.kb
        reduces = [v for v in kb.nodes if v.kind == "reduce"]
        last_pass = kb.max_level - (0 if full_stores else 1)
        tiles: list[_Scope] = []  # rows in tiles: each tile's scope, kept from pass to pass
        online = {m.uid: s for s, m in ((v, self.online[v.uid]) for v in reduces if v.uid in self.online)}
        in_earlier_pass = set(self.online) | {m2.uid for _, m2 in self.welford.values()}
        for level in range(kb.max_level):
            # Wide rows: what a pass reads is re-read by the next, so it stays in L2 (evict_last) until the last.
            self._load_policy = "" if not self.wide else "evict_first" if level == last_pass else "evict_last"
            these = [v for v in reduces if v.operands[0].level == level and v.uid not in in_earlier_pass]
            if not these:  # (a softmax's sum, computed in its max's pass; a variance's, in its mean's)
                continue
            # Per-row operands needed by this pass must exist before the loop.
            for v in these:
                self._emit_row_deps(v.operands[0], top)
            for v in these:
                if v.uid in online:
                    self._online_init(online[v.uid])
                    continue
                if v.uid in self.welford:
                    self._welford_init(v)
                    continue
                ident = identity_literal(v.reduction, v.dtype)
                self.w(f"acc{v.uid} = tl.full([BLOCK_R, BLOCK_C], {ident}, {TL_DTYPE[v.dtype]})")
            for scope, masked in self._column_tiles(top, tiles):
                for v in these:
                    x = v.operands[0]
                    if v.uid in self.fast_exp_sums:  # exp(x - max), the exact exp left to the output pass
                        (shifted,) = x.operands
                        self.emit_node(shifted, scope, f"rmask & cmask{self.sfx}")
                        src = f"{self.sum_exp}({self._n(shifted)})"
                    else:
                        self.emit_node(x, scope, f"rmask & cmask{self.sfx}")
                        src = self._n(x) if x.full else f"tl.broadcast_to({self._n(x)}, [BLOCK_R, {self.bc}])"
                    if masked:  # (no row mask: see emit_node's reduce)
                        src = f"tl.where(cmask{self.sfx}, {src}, {identity_literal(v.reduction, v.dtype)})"
                    if v.uid in online:
                        self._online_step(online[v.uid], src)
                        continue
                    if v.uid in self.welford:
                        self._welford_step(v, src)
                        continue
                    self.w(f"acc{v.uid} = {REDUCTIONS[v.reduction][1].format(a=f'acc{v.uid}', b=src)}")
            for v in these:
                if v.uid in online:
                    total = online[v.uid]
                    self.w(f"{self._n(v)} = on_m{total.uid}")
                    self.w(f"{self._n(total)} = tl.sum(acc{total.uid}, axis=1, keep_dims=True)")
                    top.emitted.add(total.uid)
                else:
                    self.w(f"{self._n(v)} = {REDUCTIONS[v.reduction][2].format(x=f'acc{v.uid}')}")
                top.emitted.add(v.uid)
                if v.uid in self.welford:
                    self._welford_finish(v, top)
        self._load_policy = ""
        for p, v in row_stores:
            self._emit_row_deps(v, top)
            self._store(p, v, top)
        if full_stores:
            for p, v in full_stores:
                self._emit_row_deps(v, top)
            self._load_policy = "evict_first" if self.wide else ""
            for scope, _ in self._column_tiles(top, tiles):
                for p, v in full_stores:
                    self.emit_node(v, scope, f"rmask & cmask{self.sfx}")
                    self._store(p, v, scope)
            self._load_policy = ""

    def _online_init(self, total: KValue) -> None:
        """A softmax's running row max and the lane-wise sum."""
        u = total.uid
        self.w(f"on_m{u} = tl.full([BLOCK_R, 1], float(\"-inf\"), tl.float32)")
        self.w(f"acc{u} = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)")

    def _online_step(self, total: KValue, x: str) -> None:
        """One tile of a softmax's max and sum in one pass: the tile's row max moves the running max; the sum so
        far is rescaled to it and the tile's exp(x - shift) added, each row's shift being the max, or 0 while the
        max is -inf. The rescale is exp(old max - shift): the old max is the old shift wherever it is finite, and
        where it is -inf the sum so far is 0 and the factor exp(-inf) = 0 (exp(0 - shift), the old shift's, would
        overflow to inf for a shift under about -88, and 0 * inf is NaN). ``x``: the tile's values, -inf in masked
        lanes (exp(-inf - shift) is 0, or NaN where the shift is: a row holding a NaN, whose outputs are NaN
        whatever its sum). The exp is a fast one (``sum_exp``: tl.exp's ex2.approx, or _exp_ftz): the sum is a
        reduction, whose rounding already differs from eager's with its order, and only ever divides the exactly
        recomputed exp(x - max) (see _online_softmax_sums)."""
        u = total.uid
        self.w(f"on_mo{u} = on_m{u}")
        self.w(f"on_m{u} = _max_canonical_nan(on_m{u}, tl.reduce({x}, 1, _max_canonical_nan, keep_dims=True))")
        self.w(f"on_sn{u} = tl.where(on_m{u} == float(\"-inf\"), 0.0, on_m{u})")
        self.w(f"acc{u} = acc{u} * tl.exp(on_mo{u} - on_sn{u}) + {self.sum_exp}({x} - on_sn{u})")

    def _welford_init(self, total: KValue) -> None:
        """``total``'s (the row sum's) accumulator and, beside it, each lane's running mean and sum of squared
        deviations from it (Welford). With ``welford_group`` G a lane is G adjacent columns of the tile (one
        thread's elements: a G-wide sum stays in its registers), and the three accumulators G times narrower."""
        u, dt, g = total.uid, TL_DTYPE[total.dtype], self.welford_group
        width = f"BLOCK_C // {g}" if g else "BLOCK_C"
        for name in (f"acc{u}", f"wf_m{u}", f"wf_q{u}"):
            self.w(f"{name} = tl.zeros([BLOCK_R, {width}], {dt})")

    def _welford_step(self, total: KValue, x: str) -> None:
        """The row sum's and Welford's update of every lane by the tile ``x``. All tiles are whole
        (full_col_tiles), so every lane has seen the same number of elements, and the update divides by a
        per-program scalar: the tile's index plus one (its fast reciprocal: the mean it keeps only centres the
        squares). A lane of G columns merges the G elements' own mean and squared deviations (Chan's formula for
        counts G k and G: the mean moves by 1 / (k + 1) of the difference, the squares gain its square times
        G k / (k + 1))."""
        u, dt, g = total.uid, TL_DTYPE[total.dtype], self.welford_group
        self.w(f"wf_k{u} = (c0 // BLOCK_C).to({dt})")
        self.w(f"wf_r{u} = tl.fdiv(tl.full([], 1.0, {dt}), wf_k{u} + 1.0)")
        if not g:
            self.w(f"acc{u} = acc{u} + {x}")
            self.w(f"wf_d{u} = {x} - wf_m{u}")
            self.w(f"wf_m{u} = wf_m{u} + wf_d{u} * wf_r{u}")
            self.w(f"wf_q{u} = wf_q{u} + wf_d{u} * ({x} - wf_m{u})")
            return
        self.w(f"wf_g{u} = tl.reshape({x}, [BLOCK_R, BLOCK_C // {g}, {g}])")
        self.w(f"wf_s{u} = tl.sum(wf_g{u}, axis=2)")
        self.w(f"acc{u} = acc{u} + wf_s{u}")
        self.w(f"wf_gm{u} = wf_s{u} * {1.0 / g!r}")  # (G a power of two: exact)
        self.w(f"wf_gd{u} = wf_g{u} - wf_gm{u}[:, :, None]")
        self.w(f"wf_d{u} = wf_gm{u} - wf_m{u}")
        self.w(f"wf_m{u} = wf_m{u} + wf_d{u} * wf_r{u}")
        self.w(f"wf_q{u} = wf_q{u} + tl.sum(wf_gd{u} * wf_gd{u}, axis=2) + (wf_d{u} * wf_d{u}) * "
               f"({float(g)!r} * wf_k{u} * wf_r{u})")

    def _welford_finish(self, total: KValue, top: _Scope) -> None:
        """The row's sum of squared deviations from its mean (computed from the exact sum, as before): the lanes'
        own sums plus, Chan's merge of equal counts, each lane's count times its mean's squared distance from
        the row's."""
        u = total.uid
        mean, m2 = self.welford[u]
        self._emit_row_deps(mean, top)
        self.w(f"wf_n{u} = (n_cols // BLOCK_C * {max(self.welford_group, 1)}).to({TL_DTYPE[total.dtype]})")
        self.w(f"wf_e{u} = wf_m{u} - {self._n(mean)}")
        self.w(f"{self._n(m2)} = tl.sum(wf_q{u} + wf_n{u} * (wf_e{u} * wf_e{u}), axis=1, keep_dims=True)")
        top.emitted.add(m2.uid)

    def _column_tiles(self, top: _Scope, tiles: list):
        """The tiles of one pass over the row, each as (its scope, whether its column mask is needed), written
        inside a column loop, or (rows in tiles, see __init__) one after the other with names of their own
        (``tiles``: their scopes, made by the first pass and reused by later ones)."""
        if not self.row_tiles:
            depth = self._open_column_loop()
            yield _Scope(top), not self.full_col_tiles
            self.indent -= depth
            return
        last = self.row_tiles - 1
        for k in range(self.row_tiles):
            self.sfx = f"_{k}"
            if k == len(tiles):  # the tile's coordinates, written once before its first use
                tiles.append(_Scope(top))
                self._col_setup(f"{k} * BLOCK_C", "n_cols" if k == last else None)
            yield tiles[k], k == last
        self.sfx = ""

    def _open_column_loop(self) -> int:
        """Write a column loop's header and the tile's coordinates; returns the indent its body is at."""
        if self.wide:
            # The ``wide`` tiles' bodies side by side: a tile's accumulation does not wait for the next one's loads.
            self.w(f"for c00 in range(0, n_cols, {self.wide} * BLOCK_C):")
            self.w(f"    for cu in tl.static_range({self.wide}):")
            self.w("        c0 = c00 + cu * BLOCK_C")
            depth = 2
        else:
            self.w("for c0 in range(0, n_cols, BLOCK_C):")
            depth = 1
        self.indent += depth
        self._col_setup("c0", None if self.full_col_tiles else "n_cols")
        return depth

    def _emit_row_deps(self, v: KValue, scope: _Scope) -> None:
        """Emit, at the current (row) level, every per-row node ``v`` depends on."""
        if scope.has(v) or v.kind in ("const", "arg"):
            return
        if v.full:
            for o in v.operands:
                self._emit_row_deps(o, scope)
            return
        self.emit_node(v, scope, "rmask")


# Ops whose result is the canonical NaN on the GPU when an operand is NaN, whatever that NaN's bits: a NaN they
# read leaves no trace of its payload.
_ARITHMETIC = frozenset(("{0} + {1}", "{0} - {1}", "{0} * {1}", "libdevice.div_rn({0}, {1})"))


def _readers_and_stored(kb: KernelBuilder) -> tuple[dict, set]:
    """(uid -> the nodes that read that node, ids of the stored nodes): what the rewrites below ask of a node."""
    readers: dict = {}
    for n in kb.nodes:
        for o in n.operands + tuple(b for b in n.body if isinstance(b, KValue)):
            readers.setdefault(o.uid, []).append(n)
    return readers, {id(v) for _, v in kb.stores}


def _mark_arithmetic_min_max(kb: KernelBuilder) -> None:
    """Float max/min reductions that are not stored and are read only by arithmetic reduce with the one-
    instruction combine (REDUCTIONS' *_arith): a softmax's row max, subtracted from its row (13% of a bf16
    softmax's time on the H200)."""
    readers, stored = _readers_and_stored(kb)
    for n in kb.nodes:
        if (n.kind == "reduce" and n.reduction in ("max", "min") and n.dtype.is_floating_point
                and id(n) not in stored and readers.get(n.uid)
                and all(r.kind == "op" and r.template in _ARITHMETIC for r in readers[n.uid])):
            n.reduction += "_arith"


_DIV = "libdevice.div_rn({0}, {1})"
_TO_BF16 = "{0}.to(tl.bfloat16)"
_DIV_FOR_BF16 = "_div_for_bf16({0}, {1}, {2})"
_RECIPROCAL = "_bf16_div_reciprocal({0})"


def _online_softmax_sums(kb: KernelBuilder) -> dict:
    """sum(exp(x - max(x))) of a softmax whose sum is read only as the divisor of that same exp (plain division,
    or the bf16 row division with its reciprocal) and is not stored: sum uid -> the max. A looped kernel over
    wide rows accumulates such a sum in its max's pass, relative to a running max (``Emitter._online_step``):
    one pass over the row fewer; or, where that is off, in a pass of its own with the fast exp, since the
    output pass computes the quotient's exact exp again anyway (``Emitter.fast_exp_sums``). Its value is only a
    reduction's (its rounding differs from eager's with the order, as every sum's does), and where it differs
    otherwise (0 for a row of -inf, which eager sums to NaN) the exp it divides is NaN, so the quotient is
    eager's either way."""
    readers, stored = _readers_and_stored(kb)
    found: dict = {}
    for s in kb.nodes:
        if not (s.kind == "reduce" and s.reduction == "sum" and s.dtype == torch.float32 and id(s) not in stored):
            continue
        (e,) = s.operands
        if not (e.kind == "op" and e.template == "libdevice.exp({0})" and e.dtype == torch.float32):
            continue
        (d,) = e.operands
        if not (d.kind == "op" and d.template == "{0} - {1}" and d.dtype == torch.float32):
            continue
        x, m = d.operands
        if not (m.kind == "reduce" and m.reduction == "max_arith" and m.operands[0] is x and x.full):
            continue
        if any(v is m for v in found.values()):  # one sum per max: a second keeps its own pass
            continue

        def divides_e(r: KValue) -> bool:
            if r.kind != "op":
                return False
            if r.template == _DIV:
                return r.operands[0] is e and r.operands[1] is s
            if r.template == _DIV_FOR_BF16:
                return r.operands[0] is e and r.operands[2] is s
            return r.template == _RECIPROCAL and all(divides_e(q) for q in readers.get(r.uid, []))

        if readers.get(s.uid) and all(divides_e(r) for r in readers[s.uid]):
            found[s.uid] = m
    return found


def online_softmax_sums(kb: KernelBuilder) -> dict:
    """_online_softmax_sums after the row max's marking that it matches (idempotent). The plan calls this (it
    picks a wide kernel's form and tiles by it) and hands the result to kernel_source. The bf16 row division
    that kernel_source writes later rewrites the division in place and adds the reciprocal as a reader of the
    sum, both forms that the match accepts, so the sums stay the same."""
    _mark_arithmetic_min_max(kb)
    return _online_softmax_sums(kb)


def welford_moments(kb: KernelBuilder) -> dict:
    """A variance's sum of squared deviations ``sum((x - mean) ** 2)`` with ``mean = div_rn(sum(x), n)`` (the
    two-pass moments of reduction_lowerings._lower_moments): the sum's uid -> (mean, that sum of squares). A
    looped kernel over wide rows of whole tiles accumulates it in the pass of sum(x), by Welford's update per
    lane and Chan's merge of the lanes (``Emitter._welford_step``): one pass over the row fewer (a LayerNorm's
    three become two). Eager's CUDA var_mean and layer_norm compute their moments this way, Welford's update and
    Chan's merge, in Float; the mean itself is still div_rn(sum(x), n) (its bits unchanged). The plan calls this
    (it picks such a kernel's tiles) and hands the result to kernel_source."""
    found: dict = {}
    for m2 in kb.nodes:
        if not (m2.kind == "reduce" and m2.reduction == "sum" and m2.dtype.is_floating_point):
            continue
        (sq,) = m2.operands
        if not (sq.kind == "op" and sq.template == "{0} * {0}" and sq.dtype == m2.dtype):
            continue
        (dev,) = sq.operands
        if not (dev.kind == "op" and dev.template == "{0} - {1}" and dev.dtype == m2.dtype):
            continue
        x, mean = dev.operands
        if not (x.full and not mean.full and mean.kind == "op" and mean.template == _DIV):
            continue
        s, n = mean.operands
        if not (s.kind == "reduce" and s.reduction == "sum" and s.operands[0] is x and s.dtype == m2.dtype
                and not n.full and s.uid not in found):
            continue
        found[s.uid] = (mean, m2)
    return found


def _bf16_row_divisions(kb: KernelBuilder) -> None:
    """Float divisions by a per-row value (a softmax's row sum) whose quotient is not stored and is read only by
    conversions to bf16 multiply by the row's reciprocal and fall back to IEEE division only near a bf16
    rounding midpoint (_div_for_bf16 in the prelude): the bf16 results are eager's bit for bit, and the fast
    path costs half of div.rn's instructions. Only on the GPU (the interpreter cannot run PTX), and only where
    each thread holds a multiple of the four lanes the PTX block takes."""
    readers, stored = _readers_and_stored(kb)
    for n in list(kb.nodes):
        if not (n.kind == "op" and n.template == _DIV and n.dtype == torch.float32 and n.full):
            continue
        a, b = n.operands
        if b.full or b.kind in ("const", "arg") or id(n) in stored or not readers.get(n.uid):
            continue
        if all(r.kind == "op" and r.template == _TO_BF16 for r in readers[n.uid]):
            recip = kb.op(_RECIPROCAL, [b], torch.float32)
            n.operands, n.template = (a, recip, b), _DIV_FOR_BF16


_TANH = "_tanh_f32({0})"


def _bf16_tanh_gelu_tails(kb: KernelBuilder) -> None:
    """A tanh-GELU's tail ``g = h * (tanh(z) + 1)`` (either operand order of the add and the product) whose g is
    read only by conversions to bf16, and whose tanh and sum are read by nothing else and not stored, becomes one
    node that takes tanh's cheap exp form and falls back to libdevice's polynomial only near a bf16 rounding
    midpoint (codegen/gelu_tanh_bf16.py): the bf16 results are eager's bit for bit, with about 5 instructions
    per element fewer on the fast path. Same conditions as _bf16_row_divisions (the GPU, four lanes per thread)."""
    readers, stored = _readers_and_stored(kb)

    def sole_reader(v: KValue) -> Optional[KValue]:
        rs = readers.get(v.uid, [])
        return rs[0] if len(rs) == 1 and id(v) not in stored else None

    def other(node: KValue, v: KValue) -> Optional[KValue]:
        a, b = node.operands
        return b if a is v and b is not v else a if b is v and a is not v else None

    for t in list(kb.nodes):
        if not (t.kind == "op" and t.template == _TANH and t.full):
            continue
        u = sole_reader(t)
        if u is None or u.kind != "op" or u.template != "{0} + {1}" or u.dtype != torch.float32:
            continue
        one = other(u, t)
        if one is None or one.kind != "const" or one.dtype != torch.float32 or one.value != 1.0:
            continue
        g = sole_reader(u)
        if g is None or g.kind != "op" or g.template != "{0} * {1}" or g.dtype != torch.float32:
            continue
        h = other(g, u)
        if h is None or h.dtype != torch.float32 or id(g) in stored or not readers.get(g.uid):
            continue
        if all(r.kind == "op" and r.template == _TO_BF16 for r in readers[g.uid]):
            z = t.operands[0]
            y = _halved(h, z)
            g.operands, g.template = ((z, y), gelu_tanh_bf16.TEMPLATE_HALF) if y is not None else (
                (z, h), gelu_tanh_bf16.TEMPLATE)


def _halved(h: KValue, z: KValue) -> Optional[KValue]:
    """y where h is the fp32 product y * 0.5 (either order) and z vanishes with y (_vanishing_scale: a subnormal y
    gives |z| < 2^-40), the half form's condition (gelu_tanh_bf16.TEMPLATE_HALF); else None."""
    if not (h.kind == "op" and h.template == "{0} * {1}" and h.dtype == torch.float32):
        return None
    a, b = h.operands
    for c, y in ((b, a), (a, b)):
        if (isinstance(c, KValue) and c.kind == "const" and c.value == 0.5 and isinstance(y, KValue)
                and y.dtype == torch.float32):
            scale = _vanishing_scale(z, y)
            return y if scale is not None and scale <= 2.0 ** 86 else None
    return None


def _vanishing_scale(v: KValue, y: KValue, memo: Optional[dict] = None) -> Optional[float]:
    """S with |v| <= S |y| (up to roundings) for every |y| <= 1, where v is built from y by products (with each
    other or with literals) and sums and differences of such terms: a polynomial in y without a constant term.
    None for anything else. Each node is scaled once (``memo``): the kernel IR is a DAG, whose shared terms
    (repeated squarings) a plain recursion would visit exponentially often."""
    if v is y:
        return 1.0
    if not (isinstance(v, KValue) and v.kind == "op" and v.template in ("{0} * {1}", "{0} + {1}", "{0} - {1}")):
        return None
    memo = {} if memo is None else memo
    if v.uid not in memo:
        memo[v.uid] = _scale_of_term(v, y, memo)
    return memo[v.uid]


def _scale_of_term(v: KValue, y: KValue, memo: dict) -> Optional[float]:
    a, b = v.operands
    consts = [o for o in (a, b) if isinstance(o, KValue) and o.kind == "const"]
    if v.template == "{0} * {1}" and len(consts) == 1 and isinstance(consts[0].value, (int, float)):
        inner = _vanishing_scale(b if consts[0] is a else a, y, memo)
        return None if inner is None else inner * abs(float(consts[0].value))
    if consts:
        return None
    sa, sb = _vanishing_scale(a, y, memo), _vanishing_scale(b, y, memo)
    if sa is None or sb is None:
        return None
    return sa * sb if v.template == "{0} * {1}" else sa + sb


# Ops whose float result is computed (so a NaN result is the GPU's canonical NaN, also when the compiler narrows
# the op itself to bf16), unless a constant operand makes them a move (x * 1.0, x * -1.0, x + -0.0, x - 0.0).
_COMPUTING_CALLS = tuple(f"libdevice.{f}(" for f in (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "tanh", "sin", "cos", "tan", "sinh", "cosh", "asin",
    "acos", "atan", "asinh", "acosh", "atanh", "erf", "erfc", "sqrt", "rsqrt", "div_rn")) + (
    "_tanh_f32(", "_div_for_bf16(", "_bf16_div_reciprocal(", gelu_tanh_bf16.TEMPLATE.split("(")[0] + "(",
    gelu_tanh_bf16.TEMPLATE_HALF.split("(")[0] + "(")
_TO_BF16_CANONICAL = "_to_bf16_canonical_nan({0})"


def _may_move_nan(v: KValue, memo: dict) -> bool:
    """Whether float ``v`` may be a NaN of a 16-bit float that reached it through moves alone (a widening cast,
    selects, sign changes, reductions that pick an element), never through arithmetic. Unknown ops count as moves:
    the answer only decides whether a narrowing pays two instructions per element for eager's bits."""
    if not v.dtype.is_floating_point:
        return False
    if v.uid in memo:
        return memo[v.uid]
    memo[v.uid] = False  # (no cycles in the kernel IR; this only guards the recursion)
    ops = [o for o in v.operands if isinstance(o, KValue)]
    if v.kind == "const" or (v.kind == "op" and not ops):
        out = isinstance(v.value, float) and v.value != v.value  # a NaN constant, narrowed at compile time
    elif v.kind in ("load", "arg"):
        out = False  # a 32/64-bit float read or passed is converted by the instruction, canonically
    elif v.kind == "op" and v.template.endswith((".to(tl.float32)", ".to(tl.float64)")) and len(ops) == 1:
        out = ops[0].dtype in (torch.bfloat16, torch.float16) or _may_move_nan(ops[0], memo)
    elif v.kind == "op" and v.template in _ARITHMETIC:
        out = _may_be_a_move(v.template, ops) and any(_may_move_nan(o, memo) for o in ops)
    elif v.kind == "op" and v.template.startswith(_COMPUTING_CALLS):
        out = False
    else:
        out = any(_may_move_nan(o, memo) for o in ops)
    memo[v.uid] = out
    return out


def _may_be_a_move(template: str, ops: list) -> bool:
    """Whether the compiler may fold this arithmetic op into a move of an operand: a product or quotient by +-1,
    a sum with -0.0, a difference with +0.0. An operand whose value the source does not hold (a scalar argument)
    is not known to the compiler either: with one the op is computed."""
    for i, o in enumerate(ops):
        if not isinstance(o.value, float):
            continue
        negative_zero = o.value == 0.0 and math.copysign(1.0, o.value) < 0
        if template in ("{0} * {1}", "libdevice.div_rn({0}, {1})") and abs(o.value) == 1.0 and (
                i == 1 or template == "{0} * {1}"):
            return True
        if (template == "{0} + {1}" and negative_zero) or (
                template == "{0} - {1}" and i == 1 and o.value == 0.0 and not negative_zero):
            return True
    return False


def _canonical_bf16_nans(kb: KernelBuilder) -> None:
    """Narrowings to bf16 of values that may be moved 16-bit NaNs (_may_move_nan) give every NaN eager's CUDA
    bits, 0x7FFF (_to_bf16_canonical_nan in the prelude); the GPU only (the interpreter runs each conversion as
    written, with torch's CPU rounding, as eager's CPU conversion does)."""
    memo: dict = {}
    for n in kb.nodes:
        if (n.kind == "op" and n.template == _TO_BF16 and n.operands[0].dtype in (torch.float32, torch.float64)
                and _may_move_nan(n.operands[0], memo)):
            n.template = _TO_BF16_CANONICAL


_TO_F32 = "{0}.to(tl.float32)"
_BF16_TO_F32 = "_bf16_to_f32({0})"


def _bf16_widenings_as_shifts(kb: KernelBuilder) -> None:
    """bf16 -> fp32 conversions as integer shifts (_bf16_to_f32 in the prelude): the same bits in fewer
    instructions."""
    for n in kb.nodes:
        if n.kind == "op" and n.template == _TO_F32 and n.operands[0].dtype == torch.bfloat16:
            n.template = _BF16_TO_F32


def rewrite_nodes(kb: KernelBuilder, lanes_per_thread: int = 1, gelu_tail: bool = True,
                  widening_shifts: bool = True) -> None:
    """The GPU forms of a kernel's nodes, rewritten in place before its source is written (the plan reads the
    result: a GELU tail caps the kernel's registers and picks its grid). ``lanes_per_thread``: elements of a
    [BLOCK_R, BLOCK_C] tile each thread holds (1 where unknown). ``gelu_tail``: _bf16_tanh_gelu_tails.
    ``widening_shifts``: _bf16_widenings_as_shifts."""
    _mark_arithmetic_min_max(kb)
    if lanes_per_thread % 4 == 0 and not interpreting():
        _bf16_row_divisions(kb)
        if gelu_tail:
            _bf16_tanh_gelu_tails(kb)
    if not interpreting():
        _canonical_bf16_nans(kb)
    if widening_shifts:
        _bf16_widenings_as_shifts(kb)  # (last: the passes above read the widenings' templates)


def uses_gelu_tail(kb: KernelBuilder) -> bool:
    """Whether rewrite_nodes put a bf16 tanh-GELU tail (gelu_tanh_bf16's PTX block) into the kernel."""
    return any(v.kind == "op" and v.template in (gelu_tanh_bf16.TEMPLATE, gelu_tanh_bf16.TEMPLATE_HALF)
               for v in kb.nodes)


def kernel_source(name: str, kb: KernelBuilder, params, n_row_dims, n_col_dims, mode, index64,
                  n_cols_factor: int = 1, row_tiles: int = 0, wide: int = 0, split_interior: int = 0,
                  full_col_tiles: bool = False, softmax_sums: Optional[dict] = None, online_softmax: bool = True,
                  welford: Optional[dict] = None, fast_exp_sums: bool = False, welford_group: int = 0,
                  grid_2d: bool = False) -> str:
    """The kernel's source, from nodes rewrite_nodes has rewritten. ``split_interior``, ``full_col_tiles``,
    ``grid_2d``: see Emitter. ``softmax_sums``: online_softmax_sums' result (wide rows). ``online_softmax``: wide
    rows accumulate those sums in their max's pass. ``welford``: the variances (welford_moments' result) whose
    squared deviations wide rows of whole tiles accumulate in the mean's pass, in lanes of ``welford_group``
    columns (0: one). ``fast_exp_sums``: the terms of wide rows' softmax sums take _exp_ftz (two instructions),
    online, or in the sum's own pass where that sum is not online (where it adds libdevice's exp otherwise)."""
    sums = (softmax_sums or {}) if wide else {}
    online = sums if online_softmax else None
    fast = frozenset(sums) if sums and not online_softmax and fast_exp_sums else frozenset()
    sum_exp = "_exp_ftz" if fast_exp_sums and not interpreting() else "tl.exp"  # (the interpreter runs no PTX)
    moments = welford if wide and full_col_tiles else None
    body = Emitter(kb, params, n_row_dims, n_col_dims, mode, index64, n_cols_factor, row_tiles, wide,
                   split_interior, full_col_tiles, online, moments, fast, sum_exp, welford_group,
                   grid_2d).source(name)
    header = "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n"
    return header + prelude() + "\n\n" + body
