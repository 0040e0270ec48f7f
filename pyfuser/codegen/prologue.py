"""Load prologues: a pointwise producer computed inside the hand-written kernel that consumes it.

A hand-written kernel op may declare that it takes a *load prologue* on an input (``node.info["prologue_input"]``;
today the NVFP4 grouped quantize). The segmenter then merges the pointwise kernel that produces that input into
the op's segment (segment/segmenter.py), and instead of a generated kernel writing the input to memory and the
op kernel reading it back, the op kernel calls a generated ``@triton.jit`` function wherever it would have loaded
an element:

    value = PROLOGUE(row, col, valid, ARGS)

``row`` and ``col`` are index tensors of the input's two coordinates (any broadcastable shapes), ``valid`` the
lanes that exist, ``ARGS`` a tuple of the function's pointers and integers. The value is exactly what the producer
would have stored: the same lowering as its generated kernel (``plan.plan_kernel`` with the input's dims kept as
coordinates of their own), every op in its own dtype, rounded to the producer's output dtype; lanes outside
``valid`` are 0. Device error flags of the producer (an index out of range) are set as its kernel sets them.

The op kernel receives a :class:`LoadPrologue` where it would have received the input tensor.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from ..ir.fusion import external_inputs
from ..ir.nodes import TensorView
from ..segment.loop_domain import NotFusable
from .kernel_builder import TL_DTYPE, Emitter, _expr, _Scope, prelude
from .plan import KernelPlan, TensorMeta, plan_kernel


@dataclass
class LoadPrologue:
    """Stands for a 2-D input tensor that a hand-written kernel computes through ``fn(row, col, valid, args)``
    instead of loading it (shape, dtype and device are those of the tensor it replaces)."""

    fn: Any  # the generated @triton.jit function (a constexpr argument of the op kernel)
    args: tuple  # its pointers and integers, in the order its source unpacks them
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device

    def dim(self) -> int:
        return len(self.shape)


@dataclass
class ProloguePlan:
    """A load prologue for one input signature: its source and how to build its argument tuple."""

    name: str
    source: str
    inputs: list  # TensorViews whose tensors are its pointer arguments, in order
    scalar_vals: list  # Vals passed by value, in order (as a generated kernel's scalars)
    fixed: tuple  # the integers after the scalars (and error slots): sizes, strides, bounds
    checks: tuple  # run-time checks (as KernelPlan.checks)
    shape: tuple
    dtype: torch.dtype


def prologue_segment(exprs: list, output: TensorView) -> SimpleNamespace:
    """The producer exprs of a merged segment seen as a kernel segment of their own (what plan_kernel reads):
    the values they read from outside, and ``output``."""
    return SimpleNamespace(exprs=list(exprs), inputs=external_inputs(exprs), outputs=[output])


def plan_prologue(segment, metas: dict, scalar_exprs: list) -> ProloguePlan:
    """Plan ``segment`` (see prologue_segment; one 2-D output) as a load prologue; NotFusable when it is not one
    (a reduction, a layout whose dims do not stay the output's row and column)."""
    (out,) = segment.outputs
    if out.ndim != 2:
        raise NotFusable(f"a load prologue computes a 2-D tensor, {out.name} has {out.ndim} dims")
    # ``out`` is never written: planned as row-major, its row and column are the kernel's (a layout eager would
    # give it, e.g. transposed like an input, would only reorder the loop dims).
    sizes = tuple(metas[id(out)].sizes)
    metas = dict(metas)
    metas[id(out)] = TensorMeta(sizes, (sizes[1] if sizes[1] else 1, 1), metas[id(out)].dtype)
    plan: KernelPlan = plan_kernel(segment, metas, scalar_exprs, prologue_of=out)
    st = plan.prologue_state
    sizes, (row_ld, col_ld) = st["sizes"], st["dims"]
    want_rows = [[row_ld]] if sizes.get(row_ld, 1) != 1 else []
    want_cols = [[col_ld]] if sizes.get(col_ld, 1) != 1 else []
    if st["row_runs"] != want_rows or st["col_runs"] != want_cols:
        raise NotFusable(f"the loop dims of the load prologue are not {out.name}'s row and column")
    params = st["params"]
    kb = st["kb"]
    out_param = params[-1]
    out_args = set(out_param.arg_names())
    fixed = tuple(v for n, v in zip(st["fixed_names"], plan.fixed_args) if n not in out_args)
    fixed_names = [n for n in st["fixed_names"] if n not in out_args]
    arg_names = [f"{p.name}_ptr" for p in params[:-1]] + (["err_ptr"] if kb.checks else []) + list(kb.scalar_args)
    arg_names += [f"err_slot{i}" for i in range(len(kb.checks))] + fixed_names
    em = Emitter(kb, params[:-1], len(st["row_runs"]), len(st["col_runs"]), "pointwise", st["index64"])
    em.lines = []
    em.indent = 1
    for i, n in enumerate(arg_names):
        em.w(f"{n} = A[{i}]")
    em.w("r = row.to(tl.int64)" if st["index64"] else "r = row")
    em.w("c = col.to(tl.int64)" if st["index64"] else "c = col")
    em.w("rmask = valid")
    em.w("cmask = valid")
    for p in params[:-1]:
        em.w(f"{p.name}_roff = {em._offset(p.row_terms, ['r'], 'r')}")
        if p.has_col:
            em.w(f"{p.name}_coff = {em._offset(p.col_terms, ['c'], 'c')}")
    ((_, value),) = kb.stores
    em.emit_node(value, _Scope(), "valid")
    # (``& (row >= 0) & (col >= 0)``, always true, gives the result the caller's full shape even where the value
    # only varies along one coordinate: a per-row value, a constant)
    em.w(f"return tl.where(valid & (row >= 0) & (col >= 0), {_expr(value)}, 0).to({TL_DTYPE[out_param.dtype]})")
    body = "\n".join(["@triton.jit", "def PROLOGUE(row, col, valid, A):"] + em.lines) + "\n"
    name = "pf_prologue_" + hashlib.sha1(body.encode()).hexdigest()[:12]
    header = "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n"
    source = header + prelude() + "\n\n" + body.replace("def PROLOGUE(", f"def {name}(")
    return ProloguePlan(name, source, plan.inputs, plan.scalar_vals, fixed, plan.checks, tuple(metas[id(out)].sizes),
                        metas[id(out)].dtype)
