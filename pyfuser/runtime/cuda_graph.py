"""CUDA graphs built in: ``_enable_options=["cuda_graph"]`` captures a fusion's whole plan once per input signature
and replays it, one graph launch for every kernel and ATen step.

How inputs are handled (docs/runtime.md says the same for users):
- The first call runs the plan normally (it compiles kernels and creates lazily allocated workspaces) and notes
  every tensor input's address. The second call captures.
- A tensor input found at the same address on both calls (weights, caches: tensors that never move) is read in
  place by the graph: no copy. Every other tensor input is *staged*: the graph reads a private buffer, and each
  replay first copies the call's tensor into it.
- If an in-place input later arrives at another address, the graph is captured again with that input staged
  (at most once per input). Non-tensor inputs and CPU scalar tensors are baked into a capture: the graph is
  captured again when their values change (the latest capture is kept).

Outputs are never overwritten by a later call: each replay returns copies of the graph's output buffers
(``cuda_graph_reuse_outputs`` returns the buffers themselves, valid until the next call of the fusion, for callers
that consume them at once). Output *views* of inputs therefore come back as fresh tensors in this mode. Alias
outputs (``add_output(..., alias_input=)``) are written into the caller's input tensors after each replay.

A fusion with a step that needs a host synchronization (e.g. ``sync_offset_checks``, or an op whose ATen
implementation reads device values on the host) cannot be captured: the capture fails and pyfuser raises
FusionExecutionError naming that op.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from ..errors import FusionExecutionError, PyfuserError


class GraphedPlan:
    def __init__(self, plan, reuse_outputs: bool = False):
        self.plan = plan
        self.reuse_outputs = reuse_outputs
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.pool = None
        self._seen_ptrs: Optional[list] = None  # tensor addresses of the first call
        self._in_place: set[int] = set()  # input positions the graph reads in place
        self._staged: dict[int, torch.Tensor] = {}  # input position -> private buffer
        self._captured_ptrs: dict[int, int] = {}
        self._baked: tuple = ()  # values of non-CUDA inputs at capture
        self._values: Optional[list] = None  # the captured slot values (graph-owned tensors)
        self.captures = 0

    @staticmethod
    def _baked_values(flat: Sequence[Any]) -> tuple:
        out = []
        for x in flat:
            if isinstance(x, torch.Tensor):
                out.append(x.item() if x.device.type == "cpu" and x.dim() == 0 else None)
            else:
                out.append(x)
        return tuple(out)

    def run(self, flat: Sequence[Any], run_eager) -> list:
        """``run_eager(flat)``: the plain path, for the first call."""
        if self._seen_ptrs is None:
            self._seen_ptrs = [x.data_ptr() if isinstance(x, torch.Tensor) and x.is_cuda else None for x in flat]
            return run_eager(flat)
        if self.graph is None or self._needs_capture(flat):
            self._capture(flat)
        for i, buf in self._staged.items():
            buf.copy_(flat[i])
        self.graph.replay()
        outs = self.plan.finish(self._values, flat)
        if self.reuse_outputs:
            return outs
        return [o.clone(memory_format=torch.preserve_format) if isinstance(o, torch.Tensor) else o for o in outs]

    def _needs_capture(self, flat) -> bool:
        for i, ptr in self._captured_ptrs.items():
            if flat[i].data_ptr() != ptr:
                self._in_place.discard(i)  # it moved: stage it from now on
                return True
        return self._baked_values(flat) != self._baked

    def _capture(self, flat: Sequence[Any]) -> None:
        plan = self.plan
        if self.graph is None:  # first capture: inputs that kept their address are read in place
            self._in_place = {i for i, (x, p) in enumerate(zip(flat, self._seen_ptrs))
                              if p is not None and x.data_ptr() == p}
        captured = list(flat)
        self._captured_ptrs = {}
        for i, x in enumerate(flat):
            if not (isinstance(x, torch.Tensor) and x.is_cuda):
                continue
            if i in self._in_place:
                self._captured_ptrs[i] = x.data_ptr()
                continue
            buf = self._staged.get(i)
            if buf is None:
                buf = self._staged[i] = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
            buf.copy_(x)
            captured[i] = buf
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        values = plan.bind(captured)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        failed = None
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                for step in plan.steps:
                    failed = step
                    step.run(values)
                failed = None
        except (PyfuserError, RuntimeError) as e:
            torch.cuda.synchronize()
            op = _step_op(failed)
            raise FusionExecutionError(
                f"cuda_graph: {op} cannot be captured in a CUDA graph (it needs a host synchronization or "
                f"another operation capture forbids); run this fusion without the cuda_graph option. Cause: {e}"
            ) from e
        self.graph, self._values = graph, values
        self._baked = self._baked_values(flat)
        self.captures += 1


def _step_op(step) -> str:
    node = getattr(step, "node", None)
    if node is not None:
        return f"fd.ops.{node.op.name}"
    plan = getattr(step, "plan", None)
    return f"generated kernel {plan.name}" if plan is not None else "a step"
