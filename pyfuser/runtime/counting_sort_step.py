"""Running a CountingSort segment (segment/counting_sort.py): its ATen work before the kernel, one launch of the
counting-sort kernel (kernels/counting_sort.py) writing the permutation, its inverse and the counts and running
the epilogue kernel as a function at its end (codegen/epilogue.py), then the ATen work reading the results.

Whatever cannot take that form for a signature runs as before, in the same segment and in the same order: the
argsort, its inverse and the histogram on ATen when the keys have more than MAX_BINS possible values (or kernels
are off), the epilogue as a generated kernel of its own launch when it is not one program (or on ATen)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from ..codegen.compiler import load_kernel
from ..codegen.epilogue import EpiloguePlan, plan_epilogue
from ..codegen.plan import plan_kernel, segment_metas
from ..ir.dtypes import to_torch_dtype
from ..ir.fusion import external_inputs
from ..ir.nodes import Scalar, Vector
from ..kernels.counting_sort import MAX_BINS, CountingSort, block_sizes
from ..segment.counting_sort import CountingSortGroup
from ..segment.loop_domain import NotFusable
from .steps import StepReport


class CountingSortStep:
    """One launch: ``perm``/``inv``/``counts`` (slots, each None when the segment does not compute it) from the
    keys in ``keys_slot``, then the epilogue. ``metas``: (sizes, strides, dtype) of each output allocated here."""

    __slots__ = ("keys_slot", "n_bins", "outs", "epilogue", "epi_fn", "epi_in_slots", "epi_out_slots",
                 "epi_out_metas", "epi_scalars", "device", "segment", "name", "sort", "__weakref__")

    def __init__(self, keys_slot: int, n_bins: int, outs: list, device, segment: int,
                 epilogue: Optional[EpiloguePlan] = None, epi_in_slots=(), epi_out_slots=(), epi_out_metas=(),
                 epi_scalars=None):
        self.keys_slot, self.n_bins, self.device, self.segment = keys_slot, n_bins, device, segment
        self.outs = outs  # [(slot, (sizes, strides, dtype)) or None] for perm, inv, counts
        self.epilogue, self.epi_fn = epilogue, None
        self.epi_in_slots, self.epi_out_slots, self.epi_out_metas = epi_in_slots, epi_out_slots, epi_out_metas
        self.epi_scalars = epi_scalars
        self.name = "counting_sort" + (f" + epilogue {epilogue.kernel.name}" if epilogue is not None else "")
        self.sort = None  # the launch, prepared by the first call (the tensors' metadata is the signature's)

    def run(self, v: list) -> None:
        made = []
        for out in self.outs:
            t = None
            if out is not None:
                slot, (sizes, strides, dtype) = out
                t = v[slot] = torch.empty_strided(sizes, strides, dtype=dtype, device=self.device)
            made.append(t)
        args = None
        if self.epilogue is not None:
            outs = [torch.empty_strided(s, st, dtype=dt, device=self.device) for s, st, dt in self.epi_out_metas]
            for slot, t in zip(self.epi_out_slots, outs):
                v[slot] = t
            plan = self.epilogue.kernel
            if plan.n_rows * plan.n_cols:  # (an empty epilogue writes nothing)
                ins = [v[s] for s in self.epi_in_slots]
                args = (*ins, *outs, *self.epi_scalars(v), *plan.fixed_args)
        keys = v[self.keys_slot]
        sort = self.sort
        if sort is None:
            sort = self.sort = CountingSort(keys, self.n_bins, *made, self.epi_fn if args is not None else None)
        sort(keys, *made, args)

    def describe(self) -> StepReport:
        counts = self.outs[2]
        block_m, block_b, warps = block_sizes(max(self.n_bins, counts[1][0][0] if counts is not None else 0))
        reason = f"{self.name} (one program, [{block_m}, {block_b}] one-hot tiles, {warps} warps)"
        return StepReport("op kernel", self.name, reason, self.epilogue.source if self.epilogue else None)


def n_bins_of(group: CountingSortGroup, layouts: dict, input_metas: dict) -> Optional[int]:
    """The number of values the keys may take, from the extent bounding them (known now: the plan is per
    signature)."""
    bound = group.key_range.static_bound()
    if bound is not None:
        return bound
    src = group.key_range.source
    meta = input_metas.get(id(src))
    if meta is not None:
        return meta.sizes[group.key_range.dim]
    layout = layouts.get(id(src))
    return None if layout is None else layout.sizes[group.key_range.dim]


def counting_sort_steps(planner, seg, slots, runtime, input_metas: dict, use_kernels: bool,
                        expr_eval_outputs: set) -> tuple[list, str]:
    """The segment's steps and, where part of it runs on ATen, why. ``planner``: the ExecutionPlan being built
    (its _call_steps and _kernel_steps build ATen and generated-kernel steps)."""
    group: CountingSortGroup = seg.counting_sort
    expr_eval_outputs.update(id(o) for e in group.pre + group.post for o in e.outputs)
    sort = [group.argsort] + ([group.inverse] if group.inverse is not None else [])
    n_bins = n_bins_of(group, runtime.layouts, input_metas)
    reason = ""
    if not use_kernels:
        reason = planner._why_no_kernel(runtime) or "kernels are off"
    elif n_bins is None:
        reason = "the extent bounding the keys is unknown"
    elif n_bins > MAX_BINS:
        reason = f"the keys take up to {n_bins} values, more than the counting sort's {MAX_BINS} bins"
    if reason:
        return planner._call_steps(seg, group.exprs(), slots, False, f"counting sort on ATen: {reason}"), reason
    steps = planner._call_steps(seg, group.pre, slots, False, "ExprEval work before the counting sort")
    outs = []
    for tv in (group.perm, group.inv, group.counts):
        if tv is None:
            outs.append(None)
            continue
        lay = runtime.layouts[id(tv)]
        outs.append((slots.assign(tv), (tuple(lay.sizes), tuple(lay.strides), to_torch_dtype(tv.dtype))))
    keys_slot = slots.assign(group.keys)
    step = CountingSortStep(keys_slot, n_bins, outs, runtime.device, seg.index)
    epilogue_steps, why = [], ""
    if group.epilogue:
        why = _chain_epilogue(planner, step, seg, group, slots, runtime, input_metas, expr_eval_outputs)
        if why:
            epi = _epilogue_segment(seg, group)
            epilogue_steps = planner._kernel_steps(epi, slots, runtime, input_metas, expr_eval_outputs)
            if isinstance(epilogue_steps, str):
                why = f"{why}; epilogue on ATen: {epilogue_steps}"
                epilogue_steps = planner._call_steps(seg, group.epilogue, slots, False, epilogue_steps)
            why = f"epilogue launched on its own: {why}"
    post = planner._call_steps(seg, group.post, slots, False, "ExprEval work after the counting sort")
    return steps + [step] + epilogue_steps + post, why


def _epilogue_segment(seg, group: CountingSortGroup) -> SimpleNamespace:
    """The epilogue seen as a kernel segment of its own (what plan_kernel reads)."""
    wanted = {id(o) for o in seg.outputs}
    return SimpleNamespace(index=seg.index, exprs=group.epilogue, inputs=external_inputs(group.epilogue),
                           outputs=[o for e in group.epilogue for o in e.outputs if id(o) in wanted])


def _chain_epilogue(planner, step: CountingSortStep, seg, group: CountingSortGroup, slots, runtime,
                    input_metas: dict, expr_eval_outputs: set) -> str:
    """Plans the epilogue into ``step``; returns why it cannot be (or "")."""
    if planner.resolve_bits:
        return "inputs carry a negative or conjugate bit"
    scalar_exprs = [e for e in group.epilogue if all(isinstance(o, (Scalar, Vector)) for o in e.outputs)]
    if scalar_exprs:  # (host scalar steps would have to run before the launch: not needed by any user yet)
        return "it computes host scalars"
    epi = _epilogue_segment(seg, group)
    metas = segment_metas(epi, runtime.layouts, input_metas)
    if metas is None:
        return "a boundary layout is unknown"
    try:
        kplan = plan_kernel(epi, metas, [], embedded=True)  # (the counting sort's launch has its own warps)
        eplan = plan_epilogue(kplan)
    except NotFusable as e:
        return str(e)
    guards, bind_scalars = planner.guards_and_scalars(kplan, metas, slots, runtime, expr_eval_outputs)
    if guards:  # (layout inference is off: the launch of its own checks the layouts it assumes)
        return "it assumes layouts of ExprEval results"
    step.epilogue = eplan
    step.epi_in_slots = [slots.get(tv) for tv in kplan.inputs]
    step.epi_out_slots = [slots.assign(tv) for tv in kplan.outputs]
    step.epi_out_metas = [(tuple(metas[id(tv)].sizes), tuple(metas[id(tv)].strides), metas[id(tv)].dtype)
                          for tv in kplan.outputs]
    step.epi_scalars = bind_scalars
    step.name = f"counting_sort + epilogue {kplan.name}"
    step.epi_fn = load_kernel(eplan.source, eplan.name, owner=step)
    return ""

