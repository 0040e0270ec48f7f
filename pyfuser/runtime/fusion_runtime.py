"""A FusionRuntime: one segmentation of a fusion plus the boundary layouts inferred for one input signature."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..errors import FusionExecutionError
from ..ir.nodes import TensorView
from ..segment.segmenter import SchedulerKind, Segment, SegmentedFusion
from .evaluator import RUN_OPTIONS, Env, bind_inputs, collect_outputs, default_device
from ..ops.registry import OpKind
from .kernel_executor import AtenSegmentExecutor, build_segment_executor, triton_usable
from .introspection import dump, reports
from .layouts import TensorLayout
from .meta_inference import infer_layouts
from .options import Options


def run_device(flat_inputs: Sequence[Any], device=None) -> torch.device:
    """The device a call runs on: the explicit one, else that of the first tensor input that is not a CPU scalar."""
    if device is not None:
        return torch.device(device)
    for x in flat_inputs:
        if isinstance(x, torch.Tensor) and not (x.device.type == "cpu" and x.dim() == 0):
            return x.device
    return default_device()


class FusionRuntime:
    def __init__(self, segmented: SegmentedFusion, flat_inputs: Sequence[Any], options: Options, device=None):
        self.segmented = segmented
        self.options = options
        self.device = run_device(flat_inputs, device)
        self.layouts: dict[int, TensorLayout] = infer_layouts(segmented, flat_inputs, options)
        self.executors = self._build_executors(flat_inputs)
        dump(self)

    def describe(self) -> list:
        """One SegmentReport per segment: kind, Triton kernel or ATen (and why), boundary layouts."""
        return reports(self)

    def _build_executors(self, flat_inputs) -> list:
        expr_eval_outputs: set[int] = set()
        executors = []
        # Hand-written kernels (OpDef.kernel) run where generated ones would; otherwise their reference does.
        own_kernels = self.options.kernel_codegen and triton_usable(self.device)
        for seg in self.segments:
            own_kernel_segment = any(e.op.kind is OpKind.OWN_KERNEL for e in seg.exprs)
            if seg.kind is SchedulerKind.EXPR_EVAL or own_kernel_segment:
                reason = "ExprEval segment"
                if own_kernel_segment and not own_kernels:  # why its torch reference runs instead
                    reason = "torch reference of an op with a hand-written kernel: " + (
                        "kernel_codegen is disabled" if not self.options.kernel_codegen else f"no Triton on {self.device.type}")
                executors.append(AtenSegmentExecutor(seg, reason, use_kernels=own_kernels))
                expr_eval_outputs.update(id(o) for o in seg.outputs)
            else:
                executors.append(
                    build_segment_executor(seg, self.layouts, flat_inputs, self.segmented.fusion, self.device,
                                           self.options, expr_eval_outputs)
                )
        return executors

    @property
    def segments(self) -> list[Segment]:
        return self.segmented.segments

    def layout(self, tv: TensorView) -> TensorLayout:
        """The inferred layout of a segment-boundary tensor."""
        return self.layouts[id(tv)]

    def boundary_layouts(self) -> dict[str, TensorLayout]:
        """Name -> layout of every tensor that crosses a segment boundary (or is returned by a segment)."""
        return {o.name: self.layouts[id(o)] for s in self.segments for o in s.outputs if id(o) in self.layouts}

    def run(self, flat_inputs: Sequence[Any]) -> list:
        fusion = self.segmented.fusion
        env = bind_inputs(fusion, flat_inputs, self.device)
        token = RUN_OPTIONS.set(self.options)
        try:
            with torch.no_grad():
                for seg, executor in zip(self.segmented.segments, self.executors):
                    executor.run(env)
                    if self.options.check_layouts:
                        self._check_layouts(seg, env)
                return collect_outputs(fusion, env)
        finally:
            RUN_OPTIONS.reset(token)

    def _check_layouts(self, seg: Segment, env: Env) -> None:
        for out in seg.outputs:
            if not isinstance(out, TensorView):
                continue
            t, expected = env.value(out), self.layouts[id(out)]
            # Strides of size-1 dims carry no information (ATen's CPU and meta kernels differ there).
            strides = tuple(st for st, n in zip(t.stride(), t.shape) if n != 1)
            want = tuple(st for st, n in zip(expected.strides, expected.sizes) if n != 1)
            if tuple(t.shape) != expected.sizes or strides != want:
                raise FusionExecutionError(
                    f"segment {seg.index} ({seg.kind.value}) produced {out.name} with sizes {list(t.shape)} and strides "
                    f"{list(t.stride())}, but its layout was inferred as {expected}"
                )

    def __repr__(self) -> str:
        return repr(self.segmented)
