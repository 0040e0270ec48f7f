"""A flat execution plan: what a cached call runs.

Preparing a runtime for an input signature turns its segments into a list of ready-to-call steps
(pyfuser/runtime/steps.py) over a list of value slots: the fusion's inputs take slots ``0..n-1`` in order, every
value a later step or the caller needs gets the next free slot, constants are baked into each step's argument
binder. A call is then: copy the inputs into a fresh slot list, run the steps, write alias outputs into their
inputs, pick the outputs. No IR walking, no option parsing, no dictionaries keyed by ids.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from ..codegen.compiler import load_kernel
from ..codegen.launcher import Launcher, triton_usable
from ..codegen.plan import TensorMeta, plan_kernel, segment_metas
from ..codegen.prologue import plan_prologue, prologue_segment
from ..errors import FusionExecutionError
from ..ir.dtypes import DataType
from ..ir.nodes import Scalar, TensorView, Val, Vector
from ..ops.registry import OpKind
from ..segment.loop_domain import NotFusable, lowering_refusal
from ..segment.segmenter import SchedulerKind, Segment, SegmentedFusion
from .counting_sort_step import counting_sort_steps
from .steps import (CallStep, KernelStep, LayoutCheckStep, PrologueStep, StepReport, compile_binder, resolving_bits,
                    resolving_bits_prepare, scalar_args)


class SlotMap:
    """Val -> slot number, by identity (only while the plan is built)."""

    def __init__(self, inputs: Sequence[Val]):
        self._slots: dict[int, int] = {}
        self._keep: list = []  # keeps the Vals alive so their ids stay unique while building
        for v in inputs:
            self.assign(v)

    def assign(self, v: Val) -> int:
        slot = self._slots.get(id(v))
        if slot is None:
            slot = self._slots[id(v)] = len(self._keep)
            self._keep.append(v)
        return slot

    def get(self, v: Val) -> Optional[int]:
        return self._slots.get(id(v))

    def __len__(self) -> int:
        return len(self._keep)


def _is_scalar_expr(e) -> bool:
    return all(isinstance(o, (Scalar, Vector)) for o in e.outputs)


def _guards_and_scalars(plan, metas: dict, slots, runtime, expr_eval_outputs: set):
    """A generated kernel's (or load prologue's) layout guards: (slot, strides) of the inputs an ExprEval segment
    makes, whose layout the plan assumed, checked per call when layout inference is off; and the binder of its
    by-value arguments (0-dim CPU tensors and Bools converted to what Triton takes)."""
    guards = []
    if not runtime.options.infer_contiguity:
        guards = [(slots.get(tv), tuple(metas[id(tv)].strides)) for tv in plan.inputs if id(tv) in expr_eval_outputs]
    scalars = plan.scalar_vals
    convert = any(isinstance(s, TensorView) or s.dtype is DataType.Bool for s in scalars if isinstance(s, Val))
    return guards, scalar_args(compile_binder(tuple(scalars), slots.get), convert)


def _expr_eval_reason(seg: Segment) -> str:
    """Why an ExprEval segment runs on ATen: "ExprEval segment", followed by the reasons of its ops that have a
    Triton lowering but refused this use of it (an index searched over too many positions, a 0-D index, ...)."""
    whys: list[str] = []
    for e in seg.exprs:
        why = lowering_refusal(e) if e.op.lower is not None else None
        if why and why not in whys:
            whys.append(why)
    return "ExprEval segment" + (": " + "; ".join(whys) if whys else "")


class ExecutionPlan:
    """Steps over slots, plus how to bind inputs and collect outputs. ``segment_steps[i]`` lists the steps
    segment ``i`` runs (for introspection); ``steps`` is the flat order."""

    guards_and_scalars = staticmethod(_guards_and_scalars)  # (for counting_sort_step.py, which plan.py imports)

    def __init__(self, runtime, flat_inputs: Sequence[Any]):
        segmented: SegmentedFusion = runtime.segmented
        fusion = segmented.fusion
        options, device = runtime.options, runtime.device
        self.n_inputs = len(fusion.inputs)
        slots = SlotMap(fusion.inputs)
        use_kernels = options.kernel_codegen and triton_usable(device)
        input_metas = {id(v): TensorMeta(tuple(x.shape), tuple(x.stride()), x.dtype)
                       for v, x in zip(fusion.inputs, flat_inputs) if isinstance(x, torch.Tensor)}
        # A negative-bit view (x.conj().imag, torch._neg_view) stores unnegated values, and ATen views of it keep
        # the bit. When the signature has such an input, every Triton kernel (generated or hand-written) resolves
        # the operands that carry the bit into copies with the same strides; ATen steps and the caller keep views.
        self.resolve_bits = any(isinstance(x, torch.Tensor) and (x.is_neg() or x.is_conj()) for x in flat_inputs)
        self.segment_steps: list[list] = []
        self.segment_reasons: list[str] = []
        expr_eval_outputs: set[int] = set()
        for seg in segmented.segments:
            steps, reason = self._segment_steps(seg, slots, runtime, input_metas, use_kernels, expr_eval_outputs)
            if options.check_layouts:
                checks = [(slots.get(o), o.name, runtime.layouts[id(o)]) for o in seg.outputs
                          if isinstance(o, TensorView) and id(o) in runtime.layouts and slots.get(o) is not None]
                steps = steps + [LayoutCheckStep(seg, checks)]
            self.segment_steps.append(steps)
            self.segment_reasons.append(reason)
        self.steps = [s for steps in self.segment_steps for s in steps]
        self.n_slots = len(slots)
        self._outputs = compile_binder(list(fusion.outputs), slots.get)
        self.aliases = [(slots.get(val), slots.get(inp), val, inp) for val, inp in fusion.aliases]
        # An output that is also written into an input (add_output(out) and add_output(out, alias_input)) is
        # returned as that input tensor, which holds its value after the write (nvFuser returns the same buffer).
        written = {id(val): slots.get(inp) for val, inp in fusion.aliases}
        self.outputs_in_inputs = [(i, written[id(o)]) for i, o in enumerate(fusion.outputs) if id(o) in written]
        self.run = self._compile_run([slots.get(o) for o in fusion.outputs])

    # --- building ---------------------------------------------------------------------------------------------
    def _segment_steps(self, seg: Segment, slots: SlotMap, runtime, input_metas, use_kernels: bool,
                       expr_eval_outputs: set) -> tuple[list, str]:
        """The steps of one segment and, when it runs on ATen, why."""
        if seg.kind is SchedulerKind.COUNTING_SORT:
            return counting_sort_steps(self, seg, slots, runtime, input_metas, use_kernels, expr_eval_outputs)
        own_kernel = any(e.op.kind is OpKind.OWN_KERNEL for e in seg.exprs)
        if seg.kind is SchedulerKind.EXPR_EVAL or own_kernel:
            expr_eval_outputs.update(id(o) for o in seg.outputs)
            reason = _expr_eval_reason(seg)
            if own_kernel and not use_kernels:  # why the op's torch reference runs instead of its kernel
                reason = "torch reference of an op with a hand-written kernel: " + (
                    "kernel_codegen is disabled" if not runtime.options.kernel_codegen
                    else f"no Triton on {runtime.device.type}")
            elif own_kernel and seg.prologue_exprs:
                steps_or_reason = self._prologue_steps(seg, slots, runtime, input_metas, expr_eval_outputs)
                if not isinstance(steps_or_reason, str):
                    return steps_or_reason, reason
                reason = f"load prologue on ATen: {steps_or_reason}"
            return self._call_steps(seg, seg.exprs, slots, use_kernels, reason), reason
        reason = self._why_no_kernel(runtime)
        if reason is None:
            step_or_reason = self._kernel_steps(seg, slots, runtime, input_metas, expr_eval_outputs)
            if not isinstance(step_or_reason, str):
                return step_or_reason, ""
            reason = step_or_reason
        return self._call_steps(seg, seg.exprs, slots, False, reason), reason

    @staticmethod
    def _why_no_kernel(runtime) -> Optional[str]:
        if not runtime.options.kernel_codegen:
            return "kernel_codegen is disabled"
        if not triton_usable(runtime.device):
            return f"no Triton on {runtime.device.type}"
        return None

    def _call_steps(self, seg: Segment, exprs, slots: SlotMap, use_kernels: bool, reason: str) -> list:
        steps = []
        for e in exprs:
            own = use_kernels and e.op.kernel is not None
            fn, prepare = e.op.evaluate, None
            if own:
                fn, prepare = e.op.kernel, e.op.prepare
                if self.resolve_bits:
                    fn = resolving_bits(fn)
                    prepare = prepare and resolving_bits_prepare(prepare)
            out_slots = [slots.assign(o) for o in e.outputs]
            element_slots = [[slots.assign(x) for x in o.elements] if isinstance(o, Vector) else None
                             for o in e.outputs]
            kind = "op kernel" if own else "aten"
            steps.append(CallStep(e, fn, slots.get, out_slots, element_slots, kind, e.op.name if own else reason,
                                  seg.index, prepare))
        return steps

    def _prologue_steps(self, seg: Segment, slots: SlotMap, runtime, input_metas: dict, expr_eval_outputs: set):
        """[host scalar steps..., PrologueStep] for a hand-written kernel op whose input producer was merged into
        its segment (codegen/prologue.py), or the reason it cannot be planned (the producer then runs on ATen)."""
        (value,) = seg.prologue_outputs
        op = seg.exprs[-1]
        if op.op.kernel is None:  # (a form of the op without a hand-written kernel computes on ATen)
            return f"fd.ops.{op.op.name} has no hand-written kernel here"
        pseg = prologue_segment([e for e in seg.prologue_exprs if not _is_scalar_expr(e)], value)
        metas = segment_metas(pseg, runtime.layouts, input_metas)
        if metas is None:
            return "a boundary layout is unknown"
        scalar_exprs = [e for e in seg.exprs if _is_scalar_expr(e)]
        try:
            plan = plan_prologue(pseg, metas, [])
        except NotFusable as e:
            return str(e)
        steps = self._call_steps(seg, scalar_exprs, slots, False, "host scalar")
        value_slot = slots.assign(value)  # holds the LoadPrologue while the op runs
        # The producer's ATen steps, run instead when a layout guard fails (they write the value's slot).
        fallback = self._call_steps(seg, pseg.exprs, slots, False, "input strides differ from the assumed layout")
        (call,) = self._call_steps(seg, [op], slots, True, op.op.name)
        guards, bind_scalars = _guards_and_scalars(plan, metas, slots, runtime, expr_eval_outputs)
        step = PrologueStep(plan, None, [slots.get(tv) for tv in plan.inputs], bind_scalars, value_slot, call,
                            runtime.device, seg.index, self.resolve_bits, guards, fallback)
        step.fn = load_kernel(plan.source, plan.name, owner=step)  # released with the step
        return steps + [step]

    def _kernel_steps(self, seg: Segment, slots: SlotMap, runtime, input_metas: dict, expr_eval_outputs: set):
        """[host scalar steps..., KernelStep], or the reason no kernel could be planned."""
        metas = segment_metas(seg, runtime.layouts, input_metas)
        if metas is None:
            return "a boundary layout is unknown"
        scalar_exprs = [e for e in seg.exprs if _is_scalar_expr(e)]
        try:
            plan = plan_kernel(seg, metas, scalar_exprs)
        except NotFusable as e:
            return str(e)
        steps = self._call_steps(seg, scalar_exprs, slots, False, "host scalar")
        # The ATen steps that run instead when a layout guard fails (they write the kernel's output slots too).
        fallback = self._call_steps(seg, [e for e in seg.exprs if e not in scalar_exprs], slots, False,
                                    "input strides differ from the assumed layout")
        guards, bind_scalars = _guards_and_scalars(plan, metas, slots, runtime, expr_eval_outputs)
        launcher = Launcher(None, plan.num_warps, name=plan.name, compile_options=plan.compile_options())
        launcher.fn = load_kernel(plan.source, plan.name, owner=launcher)  # released with the launcher
        out_metas = [(tuple(metas[id(tv)].sizes), tuple(metas[id(tv)].strides), metas[id(tv)].dtype)
                     for tv in plan.outputs]
        bound = launcher.bind(plan.grid, (*plan.fixed_args, plan.block_r, plan.block_c), runtime.device)
        step = KernelStep(plan, bound, [slots.get(tv) for tv in plan.inputs], [slots.assign(tv) for tv in plan.outputs],
                          out_metas, bind_scalars, runtime.device, guards, fallback, seg.index, self.resolve_bits)
        return steps + [step]

    def _compile_run(self, output_slots: list) -> Callable[[Sequence[Any]], list]:
        """``run(flat) -> outputs``: :meth:`bind`, every step, :meth:`finish`, compiled to one straight-line
        function with the steps' entry points as constants (a generated kernel's ``direct`` form where it has one).
        It references the steps, not the plan, so a plan stays free of reference cycles (kernels are released when
        their last owner is collected)."""
        consts: dict = {}
        pad = "".join(", None" for _ in range(self.n_slots - self.n_inputs))
        lines = [f"v = [*flat{pad}]"]
        for i, step in enumerate(self.steps):
            consts[f"step{i}"] = getattr(step, "direct", None) or step.run
            lines.append(f"step{i}(v)")
        if self.aliases or self.outputs_in_inputs or any(s is None for s in output_slots):
            consts.update(finish=_finish, aliases=self.aliases, outputs=self._outputs,
                          outputs_in_inputs=self.outputs_in_inputs)
            lines.append("return finish(aliases, outputs, outputs_in_inputs, v, flat)")
        else:  # (a constant output, bound by no slot, is built by the outputs binder: the general path above)
            lines.append("return [" + ", ".join(f"v[{s}]" for s in output_slots) + "]")
        source = "def run(flat):\n" + "".join(f"    {line}\n" for line in lines)
        exec(source, consts)  # noqa: S102 (source built above from slot numbers and constant names)
        return consts["run"]

    # --- running ----------------------------------------------------------------------------------------------
    def bind(self, flat: Sequence[Any]) -> list:
        v = list(flat)
        v.extend([None] * (self.n_slots - self.n_inputs))
        return v

    def kernels_only(self) -> bool:
        """Whether every step is a generated kernel without a layout guard or negative-bit operands to resolve, and
        nothing is written into inputs."""
        return (not self.aliases and not self.resolve_bits
                and all(isinstance(s, KernelStep) and not s.guards and not s.plan.checks for s in self.steps))

    def finish(self, v: list, flat: Sequence[Any]) -> list:
        """Write alias outputs into their inputs (the caller's tensors, not resolved copies), pick the outputs."""
        return _finish(self.aliases, self._outputs, self.outputs_in_inputs, v, flat)

    def reports(self) -> list[list[StepReport]]:
        return [[r for r in (s.describe() for s in steps) if r is not None] for steps in self.segment_steps]


def _finish(aliases: list, outputs: Callable[[list], list], outputs_in_inputs: list, v: list,
            flat: Sequence[Any]) -> list:
    """ExecutionPlan.finish, of the plan's parts (the compiled ``run`` holds these, not the plan)."""
    for val_slot, in_slot, val, inp in aliases:
        target = flat[in_slot]
        try:
            target.copy_(v[val_slot])
        except RuntimeError as e:  # e.g. an expanded (stride-0) input cannot be written element by element
            raise FusionExecutionError(
                f"add_output({val.name}, alias_input={inp.name}): cannot write into input {inp.name} (sizes "
                f"{list(target.shape)}, strides {list(target.stride())}): {e}") from e
    outs = outputs(v)
    for i, in_slot in outputs_in_inputs:
        outs[i] = flat[in_slot]
    return outs
