"""Meta-device inference of every segment-boundary layout (meta_inference.md, ``inferOutputMetaTensor``).

Segments run in order on meta tensors built with ``empty_strided`` from the real inputs' sizes and strides; each
op's evaluator runs unchanged, except where the registry holds a meta override because ATen's meta result
differs from the GPU's, and elementwise ATen ops are laid out as TensorIterator does on CPU and CUDA
(ops/iterator_strides.py: the meta device's reference implementations order ambiguous dims differently). The
sizes and strides of each segment output give its layout (contiguity and allocation
order) through :func:`layout_from_strides`. With ``infer_contiguity`` disabled, ExprEval segment outputs fall
back to the old assumption (contiguous in the TV's allocation order), which later segments then also see.

This runs only on an input-signature miss; the results are cached with the runtime.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..ir.nodes import TensorView
from ..ops.iterator_strides import IteratorStridesMode
from ..segment.segmenter import SchedulerKind, SegmentedFusion
from .evaluator import Env, bind_inputs, run_exprs
from .layouts import TensorLayout, contiguous_strides, layout_from_strides
from .options import Options

# Incremented once per segment evaluated on meta tensors; tests use it to prove cache hits do no meta work.
STATS = {"segments_inferred": 0}


def to_meta(x: Any) -> Any:
    """A meta tensor with ``x``'s sizes, strides, dtype and negative/conjugate bits. The bits change layouts: an
    ATen op resolves an operand that carries one into a clone first (empty_like, preserve_format), so an op reading
    an expanded negative-bit view sees a contiguous operand and orders its output's dims by it (fuzz seed 301851
    at PYFUSER_FUZZ_MAX_DIM=40: minimum of x.conj().imag broadcast to [4, 16, 1, 2] and a permuted [4, 1, 1, 1]
    has strides (32, 2, 2, 1), against (2, 8, 128, 1) without the bit)."""
    if isinstance(x, torch.Tensor):
        meta = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
        if x.is_neg():
            meta = torch._neg_view(meta)
        if x.is_conj():
            meta = meta.conj()
        return meta
    return x


def infer_layouts(segmented: SegmentedFusion, flat_inputs: Sequence[Any], options: Options,
                  device_type: str = "cuda") -> dict[int, TensorLayout]:
    """id(TensorView) -> inferred layout, for every tensor a segment hands to a later segment or returns.
    ``device_type``: where the fusion will run (elementwise ops are laid out as ATen's kernels there do)."""
    fusion = segmented.fusion
    env: Env = bind_inputs(fusion, [to_meta(x) for x in flat_inputs], device="meta")
    # Fusion inputs have their real layouts; every later boundary gets an inferred one.
    layouts: dict[int, TensorLayout] = {
        id(v): layout_from_strides(v, x.shape, x.stride())
        for v, x in zip(fusion.inputs, flat_inputs)
        if isinstance(v, TensorView) and isinstance(x, torch.Tensor)
    }
    with torch.no_grad(), IteratorStridesMode(device_type):
        for seg in segmented.segments:
            run_exprs(seg.exprs, env)
            STATS["segments_inferred"] += 1
            # (a load prologue is planned with a layout, and so are a counting sort's inner tensors)
            planned = seg.counting_sort.planned_tensors() if seg.counting_sort is not None else []
            for out in seg.outputs + seg.prologue_outputs + planned:
                if not isinstance(out, TensorView):
                    continue
                t = env.value(out)
                if seg.kind is SchedulerKind.EXPR_EVAL and not options.infer_contiguity:
                    strides = contiguous_strides(out, t.shape)
                    t = torch.empty_strided(tuple(t.shape), strides, dtype=t.dtype, device="meta")
                    env[id(out)] = t
                layouts[id(out)] = layout_from_strides(out, t.shape, t.stride())
    return layouts
