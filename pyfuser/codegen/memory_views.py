"""Memory reads: ops whose output element at some coordinates is an input element at other coordinates.

slice, pad, cat (and the indexing ops built on the same pieces) cannot be computed from a value the kernel holds
at its own coordinates; they read their input straight from global memory instead. Each such read is a
:class:`View`: the element at output coordinates ``c`` lives at ``base + sum(c[d] * strides[d])`` of the source
tensor (plus ``index * stride`` per gathered dim), possibly under a mask the lowering builds from coordinates:

- slice: the source's strides, ``base`` = the offset of the first element kept;
- pad: the source's strides, ``base`` shifted back by the left widths, loads masked to the source's extent and
  the pad value where the mask is off;
- cat: one view per input, each shifted back by its offset along the cat dim and masked to its own range; the
  result selects among them by the coordinate.

The planner (plan.py) turns every view into a kernel tensor argument indexed like any other tensor (so views
take part in merging contiguous dims and in the one-alignment-constant-per-coordinate rule), and gives each dim
whose coordinate a lowering reads a loop dim of its own (never merged). A memory-read operand must come from
outside the segment (segment/loop_domain.py enforces it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..ir.dtypes import is_complex
from ..ir.nodes import Scalar, TensorView
from ..segment.loop_domain import NotFusable


@dataclass
class View:
    """``source`` read at the coordinates of ``target``'s dims (the op's output)."""

    source: TensorView
    target: TensorView
    sizes: tuple  # extent per target dim
    strides: tuple  # element stride into ``source`` per target dim (0: constant along it)
    base: int = 0  # element offset of target coordinate 0 (may be negative: pad, cat; masked lanes only)
    gathers: tuple = ()  # element strides multiplied by index values the lowering gives the load
    param: object = None  # the kernel's TensorParam, filled by the planner


@dataclass
class Access:
    views: list
    coords: list = field(default_factory=list)  # (tv, dim) whose coordinate the lowering reads
    info: dict = field(default_factory=dict)  # whatever the lowering computed while planning


class MemoryReadLowering:
    """A lowering (``OpDef.lower``) of a memory-read op, in three parts:
    ``memory_operands(node)``: the tensors read from memory; ``plan_access(node, metas)``: their views for the
    actual layouts (metas: id(tv) -> TensorMeta); ``emit(node, kb, access, *args, **kwargs)``: the kernel IR.
    ``refusal(node)``: why a call cannot be lowered at all (None if it can); ``loop_map``: output dims that
    are loop dims of non-memory operands (index tensors)."""

    def __init__(self, memory_operands: Callable, plan_access: Callable, emit: Callable,
                 refusal: Optional[Callable] = None, loop_map: Optional[Callable] = None):
        self.memory_operands = memory_operands
        self.plan_access = plan_access
        self.emit = emit
        self.refusal = refusal or (lambda node: None)
        self.loop_map = loop_map

    def __call__(self, node, kb, *args, **kwargs):
        return self.emit(node, kb, kb.access[id(node)], *args, **kwargs)


def first_operand(node) -> list:
    """``memory_operands`` of ops that read their first argument (slice, pad, select, reshape)."""
    return [node.args[0]]


def no_operands(node) -> list:
    return []


def complex_refusal(node) -> Optional[str]:
    """Complex values have no Triton form."""
    if is_complex(node.outputs[0].dtype):
        return f"fd.ops.{node.op.name} on complex values has no Triton lowering"
    return None


def static_int(x) -> Optional[int]:
    """The value of an int argument known when the fusion is defined (a literal or constant Scalar), else None."""
    if isinstance(x, Scalar):
        return int(x.value) if x.is_constant else None
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    return None


def view_strides(meta) -> tuple:
    """The source's strides, 0 along size-1 dims (there only coordinate 0 is ever read)."""
    return tuple(0 if n == 1 else int(s) for n, s in zip(meta.sizes, meta.strides))


def require_gpu_tensor(node, tv) -> None:
    if tv.is_cpu:
        raise NotFusable(f"fd.ops.{node.op.name} reads the CPU scalar tensor {tv.name}")


def bounds_mask(kb, coord, lo, hi):
    """``lo <= coord < hi`` (lo, hi: launch-time ints)."""
    lo_v, hi_v = kb.fixed_int(lo), kb.fixed_int(hi)
    return kb.op("({0} >= {1}) & ({0} < {2})", [coord, lo_v, hi_v], torch.bool)


def and_masks(kb, masks: list):
    out = masks[0]
    for m in masks[1:]:
        out = kb.op("{0} & {1}", [out, m], torch.bool)
    return out
