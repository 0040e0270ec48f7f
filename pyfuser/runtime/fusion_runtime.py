"""A FusionRuntime: one segmentation of a fusion prepared for one input signature.

Preparing it infers the boundary layouts (meta_inference.py) and builds the flat execution plan (plan.py); a call
runs the plan, or replays its CUDA graph with the ``cuda_graph`` option (cuda_graph.py).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from ..errors import OptionError
from ..ir.nodes import TensorView
from ..ops import run_context
from ..segment.segmenter import Segment, SegmentedFusion
from .cuda_graph import GraphedPlan
from .device_errors import DeviceErrorSink
from .introspection import dump, reports
from .layouts import TensorLayout
from .meta_inference import infer_layouts
from .options import Options, offset_check_mode
from .plan import ExecutionPlan
from .steps import KernelStep


# Device types whose runs check group offsets on the device and report from a later call (docs/runtime.md, "No hidden
# host syncs"). Off CUDA the values are read directly, which costs no synchronization there; tests and
# benchmarks/bench_op_host.py add "cpu" to run the CUDA path on CPU tensors (under the Triton interpreter).
DEFERRED_ERROR_DEVICES = frozenset({"cuda"})

_is_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled


def run_device(flat_inputs: Sequence[Any], device=None) -> torch.device:
    """The device a call runs on: the explicit one (a bare "cuda" means the current CUDA device, so that streams
    and allocations have an index), else that of the first tensor input that is not a CPU scalar."""
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device
    for x in flat_inputs:
        if isinstance(x, torch.Tensor) and not (x.device.type == "cpu" and x.dim() == 0):
            return x.device
    return run_context.default_device()


class FusionRuntime:
    def __init__(self, segmented: SegmentedFusion, flat_inputs: Sequence[Any], options: Options, device=None,
                 errors: Optional[DeviceErrorSink] = None):
        self.segmented = segmented
        self.options = options
        self.device = run_device(flat_inputs, device)
        if options.cuda_graph and self.device.type != "cuda":
            raise OptionError(f"cuda_graph: CUDA graphs need a CUDA device, but this call runs on {self.device}")
        self.layouts: dict[int, TensorLayout] = infer_layouts(segmented, flat_inputs, options, self.device.type)
        self.plan = ExecutionPlan(self, flat_inputs)
        self._offset_mode = offset_check_mode(options)
        # Device-side check results are collected only where reading values would synchronize (elsewhere checks
        # read them directly).
        self.errors = errors if self.device.type in DEFERRED_ERROR_DEVICES else None
        self._cuda = self.device.type == "cuda"
        self.graphed: Optional[GraphedPlan] = None
        if options.cuda_graph:
            self.graphed = GraphedPlan(self.plan, reuse_outputs=options.cuda_graph_reuse_outputs)
        # A plan of generated kernels alone reads no run context (only evaluators do) and records no autograd
        # (no ATen step, no alias write): its calls skip both, and this runtime's ``run`` is the plan's compiled
        # function itself (an instance attribute over the method: one Python call less per call).
        self._bare = self.graphed is None and self.plan.kernels_only()
        if self._bare:
            self.run = self.plan.run
        # Without a device-error sink a run context is never written (only error slots are numbered per call):
        # one serves every call.
        self._context = run_context.RunContext(self.device, self._offset_mode) if self.errors is None else None
        # The executor cache's check that a call repeats this runtime's signature (input_guard.py): None until the
        # cache builds it, False where none can be built.
        self.input_guard = None
        dump(self)

    def describe(self) -> list:
        """One SegmentReport per segment: kind, Triton kernel or ATen (and why), boundary layouts."""
        return reports(self)

    def kernel_step(self, index: int) -> Optional[KernelStep]:
        """The generated-kernel step of segment ``index`` (its ``plan``, ``launcher``, ``last_path``), or None
        when that segment runs on ATen (``segment_reason`` says why)."""
        return next((s for s in self.plan.segment_steps[index] if isinstance(s, KernelStep)), None)

    def segment_reason(self, index: int) -> str:
        """Why segment ``index`` runs on ATen ("" when it runs a generated kernel)."""
        return self.plan.segment_reasons[index]

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
        errors = self.errors
        if errors is None:
            context = self._context
        else:
            if errors.flagged():  # (most calls find no flag: one byte compare)
                errors.report_flagged(self._cuda)
            context = run_context.RunContext(self.device, self._offset_mode, errors)
        token = run_context.enter(context)
        # Autograd off while the steps run (torch.no_grad() as a context manager costs microseconds per call), and
        # toggled only where it is on: a caller under no_grad or inference_mode pays nothing.
        grad = _is_grad_enabled()
        if grad:
            _set_grad_enabled(False)
        try:
            if self.graphed is not None:
                outs = self.graphed.run(flat_inputs, self.plan.run)
            else:
                outs = self.plan.run(flat_inputs)
        finally:
            if grad:
                _set_grad_enabled(True)
            run_context.leave(token)
        return outs

    def __repr__(self) -> str:
        return repr(self.segmented)
