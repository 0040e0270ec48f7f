"""Running a kernel segment: its generated Triton kernel, or ATen when no kernel can be generated.

The plan (and so the compiled kernel) is fixed when the runtime is built for an input signature; a call only
evaluates the segment's host scalars, allocates the outputs with their inferred (eager) strides and launches.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from ..codegen.compiler import load_kernel
from ..segment.loop_domain import NotFusable
from ..codegen.plan import KernelPlan, TensorMeta, plan_kernel, segment_metas
from ..ir.nodes import Scalar, Vector
from .evaluator import Env, run_expr, run_exprs


def triton_usable(device: torch.device) -> bool:
    """Generated kernels run on CUDA devices, and on CPU tensors under the Triton interpreter."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def _is_scalar_expr(e) -> bool:
    return all(isinstance(o, (Scalar, Vector)) for o in e.outputs)


def _direct_launcher(compiled, grid, device: torch.device):
    """Launch a compiled kernel without Triton's per-call argument binding and specialization.

    Valid because a runtime serves one input signature: the pointer alignments, integer values and dtypes
    Triton specializes on are fixed by it (outputs are fresh allocations, always aligned). Used on CUDA only,
    and only while no launch hooks (profilers) are installed."""
    if device.type != "cuda" or compiled is None or not hasattr(compiled, "run"):
        return None
    from triton import knobs

    if knobs.runtime.launch_enter_hook is not None or knobs.runtime.launch_exit_hook is not None:
        return None
    return compiled[grid]


def _scalar_arg(x):
    if isinstance(x, torch.Tensor):  # a 0-dim CPU tensor passed by value
        x = x.item()
    return int(x) if isinstance(x, bool) else x


class AtenSegmentExecutor:
    """Evaluates a segment op by op with ATen (ExprEval segments, and kernel segments without a kernel).

    ``use_kernels``: ops that have a hand-written Triton kernel (the NVFP4 family) launch it instead of their
    pure-torch reference evaluator."""

    kernel_source: Optional[str] = None

    def __init__(self, segment, reason: str = "", use_kernels: bool = False):
        self.segment = segment
        self.reason = reason
        self.use_kernels = use_kernels

    def run(self, env: Env) -> None:
        run_exprs(self.segment.exprs, env, self.use_kernels)


class KernelSegmentExecutor:
    def __init__(self, segment, plan: KernelPlan, scalar_exprs: list, out_metas: list, device: torch.device,
                 guards: list):
        self.segment = segment
        self.plan = plan
        self.kernel = load_kernel(plan.source, plan.name)
        self.scalar_exprs = scalar_exprs
        self.out_metas = out_metas
        self.device = device
        self.guards = guards  # [(tv, expected strides)] checked before launch (infer_contiguity off)
        self.fallback = AtenSegmentExecutor(segment, "input strides differ from the assumed layout")
        self.kernel_source = plan.source
        self.launch_kwargs = dict(BLOCK_R=plan.block_r, BLOCK_C=plan.block_c, num_warps=plan.num_warps)
        self._launch = None  # the compiled kernel's direct launcher, once the first call has compiled it
        self.last_path = None  # "kernel", or "aten (layout guard)" when a guard sent the last call to ATen

    def run(self, env: Env) -> None:
        for tv, strides in self.guards:
            if tuple(env.value(tv).stride()) != strides:
                # The kernel was generated for a layout these tensors do not have: take the safe path.
                self.last_path = "aten (layout guard)"
                self.fallback.run(env)
                return
        self.last_path = "kernel"
        for e in self.scalar_exprs:
            run_expr(e, env)
        plan = self.plan
        outs = [torch.empty_strided(m.sizes, m.strides, dtype=m.dtype, device=self.device) for m in self.out_metas]
        if plan.n_rows * plan.n_cols > 0:
            args = [env.value(t) for t in plan.inputs] + outs + [_scalar_arg(env.value(s)) for s in plan.scalar_vals]
            if self._launch is not None:
                self._launch(*args, *plan.fixed_args, plan.block_r, plan.block_c)
            else:
                compiled = self.kernel[plan.grid](*args, *plan.fixed_args, **self.launch_kwargs)
                self._launch = _direct_launcher(compiled, plan.grid, self.device)
        for tv, t in zip(plan.outputs, outs):
            env[id(tv)] = t


def build_segment_executor(segment, layouts: dict, flat_inputs, fusion, device: torch.device, options,
                           produced_by_expr_eval: set):
    """The executor for a kernel segment: a generated kernel when possible, else ATen (with the reason)."""
    if not options.kernel_codegen:
        return AtenSegmentExecutor(segment, "kernel_codegen is disabled")
    if not triton_usable(device):
        return AtenSegmentExecutor(segment, f"no Triton on {device.type}")
    input_metas = {}
    for v, x in zip(fusion.inputs, flat_inputs):
        if isinstance(x, torch.Tensor):
            input_metas[id(v)] = TensorMeta(tuple(x.shape), tuple(x.stride()), x.dtype)
    metas = segment_metas(segment, layouts, input_metas)
    if metas is None:
        return AtenSegmentExecutor(segment, "a boundary layout is unknown")
    scalar_exprs = [e for e in segment.exprs if _is_scalar_expr(e)]
    try:
        plan = plan_kernel(segment, metas, scalar_exprs)
    except NotFusable as e:
        return AtenSegmentExecutor(segment, str(e))
    out_metas = [metas[id(tv)] for tv in plan.outputs]
    guards = []
    if not options.infer_contiguity:
        guards = [(tv, tuple(metas[id(tv)].strides)) for tv in plan.inputs if id(tv) in produced_by_expr_eval]
    return KernelSegmentExecutor(segment, plan, scalar_exprs, out_metas, device, guards)

