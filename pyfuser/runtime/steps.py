"""The steps of a flat execution plan: the one executor interface of pyfuser.

A step reads and writes a list of values by precomputed slot numbers, so a cached call never looks at the IR.
Three kinds:

- :class:`CallStep` runs one op's evaluator: its ATen implementation (``kind == "aten"``), or the op's hand-written
  Triton kernel (``kind == "op kernel"``, the NVFP4 family in pyfuser/kernels);
- :class:`KernelStep` launches a generated Triton kernel (``kind == "triton"``) through the one launcher;
- :class:`PrologueStep` runs a hand-written kernel op whose input is computed by a generated load prologue
  (codegen/prologue.py) instead of read from memory;
- :class:`LayoutCheckStep` compares segment outputs with their inferred layouts (option ``check_layouts``).

Every step reports what it is (:meth:`describe`) for ``fd.last_execution()`` and ``PYFUSER_DUMP``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ..codegen.prologue import LoadPrologue
from ..errors import FusionExecutionError, PyfuserError
from ..ops import run_context


@dataclass
class StepReport:
    kind: str  # "aten", "triton" or "op kernel"
    name: str  # the op name, or the generated kernel's name
    reason: str = ""  # why ATen runs this (or which hand-written kernel runs)
    source: Optional[str] = None  # a generated kernel's Triton source


def compile_binder(template: Any, slot_of: Callable[[Any], Optional[int]], call: Optional[tuple] = None
                   ) -> Callable[[list], Any]:
    """A function ``values -> template`` with every Val replaced by its value, compiled once to Python.

    ``slot_of(val)`` is the slot holding ``val`` at run time, or None when its value is known now (constant
    scalars; a Vector whose elements are resolved one by one). Lists, tuples and dicts are rebuilt; any other
    object is a constant. With ``call=(fn, node, kwargs_template)``, ``template`` is the positional arguments
    and the function returns ``fn(node, *args, **kwargs)`` itself (one Python call per step)."""
    from ..ir.nodes import Scalar, Val, Vector

    consts: dict = {}

    def const(x) -> str:
        name = f"c{len(consts)}"
        consts[name] = x
        return name

    def emit(x) -> str:
        if isinstance(x, Val):
            slot = slot_of(x)
            if slot is not None:
                return f"v[{slot}]"
            if isinstance(x, Scalar) and x.is_constant:
                return const(x.value)
            if isinstance(x, Vector):
                return "[" + ", ".join(emit(e) for e in x.elements) + "]"
            raise FusionExecutionError(f"internal error: no value bound for {x.name}")
        if isinstance(x, list):
            return "[" + ", ".join(emit(e) for e in x) + "]"
        if isinstance(x, tuple):
            return "(" + "".join(emit(e) + ", " for e in x) + ")"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k!r}: {emit(e)}" for k, e in x.items()) + "}"
        return const(x)

    if call is None:
        body = emit(template)
    else:
        fn, node, kwargs = call
        consts[_CALLEE] = fn
        args = "".join(emit(a) + ", " for a in template)
        kw = "".join(f"{k}={emit(x)}, " for k, x in kwargs.items() if k.isidentifier())
        extra = {k: x for k, x in kwargs.items() if not k.isidentifier()}
        body = f"{_CALLEE}({const(node)}, {args}{kw}" + (f"**{emit(extra)}" if extra else "") + ")"
    return eval(f"lambda v: {body}", consts)  # noqa: S307 (source built above from slots and names)


_CALLEE = "fn"  # the name of the called function among a call binder's constants (its globals)


def set_callee(binder: Callable[[list], Any], fn: Callable) -> None:
    """Make a binder compiled with ``call=(fn0, ...)`` call ``fn`` from now on: its constants are its globals, so
    this costs later calls nothing (a prepared op kernel replaces the first call's preparing function)."""
    binder.__globals__[_CALLEE] = fn


class CallStep:
    """One op evaluated by a Python callable: ``fn(node, *args, **kwargs)``; outputs stored by slot.

    With ``prepare`` (an op kernel's ``OpDef.prepare``), the first call runs ``prepare(node, *args, **kwargs)``,
    which checks what depends on the arguments' metadata and returns the kernel's ``run`` for them; every later
    call calls ``run`` directly. A plan serves one input signature, so that first call is the one that built it:
    bad metadata still raises on every new signature, and a failed preparation is tried again by the next call."""

    __slots__ = ("node", "call", "out_slots", "element_slots", "kind", "reason", "segment", "prepare", "only_slot")

    def __init__(self, node, fn: Callable, slot_of, out_slots: list, element_slots: list, kind: str, reason: str,
                 segment: int, prepare: Optional[Callable] = None):
        self.node = node
        self.prepare = prepare
        first = fn if prepare is None else self._prepare_and_run
        self.call = compile_binder(tuple(node.args), slot_of, call=(first, node, dict(node.kwargs)))
        self.out_slots = out_slots  # one per output (None: the value is not needed later)
        self.element_slots = element_slots  # per output: slots of a Vector output's elements, or None
        # The slot of an op's one output when that is all there is to store (most ops): stored without a loop.
        self.only_slot = out_slots[0] if len(out_slots) == 1 and element_slots[0] is None else None
        self.kind, self.reason, self.segment = kind, reason, segment

    def run(self, v: list) -> None:
        try:
            result = self.call(v)
        except PyfuserError:
            raise
        except (RuntimeError, ValueError, TypeError, IndexError, ZeroDivisionError) as e:
            outs = ", ".join(o.name for o in self.node.outputs)
            raise FusionExecutionError(f"fd.ops.{self.node.op.name} ({outs}) failed: {e}") from e
        if self.only_slot is not None:
            v[self.only_slot] = result
            return
        slots = self.out_slots
        if len(slots) == 1:
            result = (result,)
        for slot, elems, value in zip(slots, self.element_slots, result):
            if slot is not None:
                v[slot] = value
            if elems is not None:
                for s, x in zip(elems, value):
                    v[s] = x

    def _prepare_and_run(self, node, *args, **kwargs):
        run = self.prepare(node, *args, **kwargs)
        set_callee(self.call, run)
        return run(node, *args, **kwargs)

    def describe(self) -> StepReport:
        return StepReport(self.kind, self.node.op.name, self.reason)


def resolved_like(x: torch.Tensor) -> torch.Tensor:
    """``x`` with its negative/conjugate bit applied, in memory laid out with ``x``'s own strides.

    Broadcast (stride-0) dims are resolved once and expanded again, so an expanded view keeps its strides."""
    strides = x.stride()
    if any(st == 0 and n > 1 for n, st in zip(x.shape, strides)):
        compact = [1 if st == 0 else n for n, st in zip(x.shape, strides)]
        return resolved_like(x.as_strided(compact, strides, x.storage_offset())).expand(x.shape)
    out = torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device)
    try:
        out.copy_(x)
    except RuntimeError as e:  # overlapping strides (an expanded view) cannot be written element by element
        raise FusionExecutionError(
            f"an input of shape {list(x.shape)} and strides {list(x.stride())} has its negative or conjugate bit set "
            f"and overlapping strides; pass x.resolve_neg() (or x.resolve_conj()) instead") from e
    return out


def _resolved(x):
    if isinstance(x, torch.Tensor) and (x.is_neg() or x.is_conj()):
        return resolved_like(x)
    return x


def resolving_bits(kernel: Callable) -> Callable:
    """A hand-written kernel's entry point that first resolves negative/conjugate-bit tensor arguments (Triton
    reads raw memory), as KernelStep does for generated kernels."""
    def run(node, *args, **kwargs):
        return kernel(node, *map(_resolved, args), **{k: _resolved(x) for k, x in kwargs.items()})

    return run


def resolving_bits_prepare(prepare: Callable) -> Callable:
    """An op kernel's ``prepare`` that sees, and whose ``run`` takes, resolved arguments (:func:`resolving_bits`)."""
    resolved_prepare = resolving_bits(prepare)
    return lambda node, *args, **kwargs: resolving_bits(resolved_prepare(node, *args, **kwargs))


def _scalar_arg(x):
    if isinstance(x, torch.Tensor):  # a 0-dim CPU tensor passed by value
        x = x.item()
    return int(x) if isinstance(x, bool) else x


def error_flags(checks: tuple, device) -> tuple:
    """Where a launch with run-time checks (an index out of range) ORs its error bits: (flags tensor, one slot per
    check, flags to read right after the launch or None). On CUDA the runtime's device-error sink (pinned host
    memory the GPU writes: the next call raises, no sync); on the interpreter, with no slot left, or when
    ``sync_offset_checks`` asks for errors at once, flags of the launch's own."""
    ctx = run_context.current()
    deferred = ctx is not None and ctx.errors is not None and ctx.offset_checks != run_context.OFFSET_CHECKS_SYNC
    where = [ctx.error_slot(c) for c in checks] if deferred else [None]
    if all(w is not None for w in where):
        return where[0][0], tuple(w[1] for w in where), None
    flags = torch.zeros(len(checks), dtype=torch.int32, device=device)
    return flags, tuple(range(len(checks))), flags


def raise_flagged(checks: tuple, flags: torch.Tensor) -> None:
    bits = flags.tolist()
    if any(bits):
        raise FusionExecutionError("; ".join(m for c, b in zip(checks, bits) if b for m in c.messages(b)))


def guards_hold(guards, v: list) -> bool:
    """Whether every input whose layout a generated kernel assumes (layout inference off) has it."""
    for slot, strides in guards:
        if v[slot].stride() != strides:
            return False
    return True


class KernelStep:
    """A generated Triton kernel: allocate the outputs with their inferred (eager) strides, launch.

    ``guards``: (slot, strides) of inputs whose layout the kernel assumes but the plan could not prove (layout
    inference off); a call that breaks one runs ``fallback`` (the segment's ATen steps) instead.

    ``direct``: for a step with nothing to decide per call (no guard, no operand to resolve, no run-time check),
    :meth:`run` compiled to straight-line Python with its slots, output metadata and launch as constants; the
    plan calls it instead of ``run`` (the same work, without the branches, loops and lists of the general path).
    Such a step always launches, so its ``last_path`` is "kernel" from the start."""

    __slots__ = ("plan", "launch", "launcher", "in_slots", "out_slots", "out_metas", "bind_scalars", "device",
                 "guards", "fallback", "segment", "empty", "last_path", "resolve_bits", "direct")

    def __init__(self, plan, launch, in_slots, out_slots, out_metas, bind_scalars, device, guards, fallback,
                 segment: int, resolve_bits: bool = False):
        self.plan, self.launch = plan, launch  # a BoundLaunch: the plan's grid and constexprs bound
        self.launcher = launch.launcher
        self.in_slots, self.out_slots, self.out_metas = in_slots, out_slots, out_metas
        self.bind_scalars = bind_scalars
        self.device = device
        self.guards, self.fallback = guards, fallback
        self.segment = segment
        self.empty = plan.n_rows * plan.n_cols == 0
        self.last_path = None
        self.resolve_bits = resolve_bits  # the signature has negative/conjugate-bit inputs (plan.py)
        self.direct = None
        if not guards and not resolve_bits and not plan.checks:
            self.direct = self._straight_line()
            self.last_path = "kernel"

    def _straight_line(self) -> Callable[[list], None]:
        """``run`` for this step alone (see the class): allocate, launch, store, with nothing looked up."""
        consts = {"empty_strided": torch.empty_strided, "launch": self.launch, "device": self.device,
                  "scalars": self.bind_scalars}
        lines = []
        outs = []
        for i, (sizes, strides, dtype) in enumerate(self.out_metas):
            consts[f"size{i}"], consts[f"stride{i}"], consts[f"dtype{i}"] = sizes, strides, dtype
            lines.append(f"o{i} = empty_strided(size{i}, stride{i}, dtype=dtype{i}, device=device)")
            outs.append(f"o{i}")
        if not self.empty:
            tensors = [f"v[{s}]" for s in self.in_slots] + outs
            # A kernel without by-value scalars binds the empty tuple: pass it instead of calling the binder.
            scalars = "scalars(v)" if self.plan.scalar_vals else "()"
            lines.append(f"launch([{', '.join(tensors)}], {scalars})")
        lines += [f"v[{slot}] = o{i}" for i, slot in enumerate(self.out_slots)]
        source = "def run(v):\n" + "".join(f"    {line}\n" for line in lines or ["pass"])
        exec(source, consts)  # noqa: S102 (source built above from slot numbers and constant names)
        return consts["run"]

    def run(self, v: list) -> None:
        if self.guards and not guards_hold(self.guards, v):
            # The kernel was generated for a layout these tensors do not have: take the safe path.
            self.last_path = "aten (layout guard)"
            for step in self.fallback:
                step.run(v)
            return
        self.last_path = "kernel"
        device = self.device
        outs = [torch.empty_strided(sizes, strides, dtype=dtype, device=device) for sizes, strides, dtype in
                self.out_metas]
        if not self.empty:
            ins = [v[s] for s in self.in_slots]
            if self.resolve_bits:
                ins = [_resolved(t) for t in ins]
            if self.plan.checks:
                self._launch_checked(ins + outs, self.bind_scalars(v))
            else:
                self.launch(ins + outs, self.bind_scalars(v))
        for slot, t in zip(self.out_slots, outs):
            v[slot] = t

    def _launch_checked(self, tensors: list, scalars: tuple) -> None:
        err, slots, read_now = error_flags(self.plan.checks, self.device)
        self.launch(tensors + [err], tuple(scalars) + slots)
        if read_now is not None:
            raise_flagged(self.plan.checks, read_now)

    def describe(self) -> StepReport:
        return StepReport("triton", self.plan.name, "", self.plan.source)


class PrologueStep:
    """A hand-written kernel op (``call``, a CallStep) whose input in slot ``slot`` is a load prologue: the slot
    holds a LoadPrologue (the generated function and its arguments: the tensors of ``in_slots``, error flags, the
    bound scalars, the plan's fixed integers) while the op runs. Index checks of the prologue report like a
    generated kernel's (KernelStep._launch_checked). ``guards``/``fallback`` as KernelStep's: a call whose inputs
    break an assumed layout runs the producer's ATen steps (writing the slot) and then the op."""

    __slots__ = ("plan", "fn", "in_slots", "bind_scalars", "slot", "call", "device", "segment", "resolve_bits",
                 "guards", "fallback", "shape", "last_path", "__weakref__")

    def __init__(self, plan, fn, in_slots, bind_scalars, slot: int, call: CallStep, device, segment: int,
                 resolve_bits: bool = False, guards=(), fallback=()):
        self.plan, self.fn = plan, fn  # codegen.prologue.ProloguePlan and its loaded function
        self.in_slots, self.bind_scalars, self.slot, self.call = in_slots, bind_scalars, slot, call
        self.device, self.segment, self.resolve_bits = device, segment, resolve_bits
        self.guards, self.fallback = guards, fallback
        self.shape = torch.Size(plan.shape)
        self.last_path = None

    def run(self, v: list) -> None:
        if self.guards and not guards_hold(self.guards, v):
            self.last_path = "aten (layout guard)"
            for step in self.fallback:
                step.run(v)
            self.call.run(v)
            return
        self.last_path = "kernel"
        plan = self.plan
        ins = [v[s] for s in self.in_slots]
        if self.resolve_bits:
            ins = [_resolved(t) for t in ins]
        scalars = tuple(self.bind_scalars(v))
        read_now = None
        if plan.checks:
            err, slots, read_now = error_flags(plan.checks, self.device)
            args = (*ins, err, *scalars, *slots, *plan.fixed)
        else:
            args = (*ins, *scalars, *plan.fixed)
        v[self.slot] = LoadPrologue(self.fn, args, self.shape, plan.dtype, self.device)
        try:
            self.call.run(v)
        finally:
            v[self.slot] = None  # the prologue is the op's alone
        if read_now is not None:
            raise_flagged(plan.checks, read_now)

    def describe(self) -> StepReport:
        name = f"{self.call.node.op.name} + load prologue {self.plan.name}"
        return StepReport("op kernel", name, name, self.plan.source)


def scalar_args(bind: Callable[[list], tuple], convert: bool) -> Callable[[list], tuple]:
    """The kernel's by-value scalars; ``convert`` when some may be 0-dim CPU tensors or bools."""
    if not convert:
        return bind
    return lambda v: tuple(map(_scalar_arg, bind(v)))


class LayoutCheckStep:
    """``check_layouts``: each segment output against its inferred layout (a debugging aid)."""

    __slots__ = ("segment", "checks")

    def __init__(self, segment, checks: list):
        self.segment = segment  # the Segment (for its index and kind)
        self.checks = checks  # [(slot, tv name, TensorLayout)]

    def run(self, v: list) -> None:
        seg = self.segment
        for slot, name, expected in self.checks:
            t = v[slot]
            if t.numel() == 0 and tuple(t.shape) == expected.sizes:
                continue  # an empty tensor's strides carry no information (eager's differ by device)
            # Strides of size-1 dims carry no information (ATen's CPU and meta kernels differ there).
            strides = tuple(st for st, n in zip(t.stride(), t.shape) if n != 1)
            want = tuple(st for st, n in zip(expected.strides, expected.sizes) if n != 1)
            if tuple(t.shape) != expected.sizes or strides != want:
                raise FusionExecutionError(
                    f"segment {seg.index} ({seg.kind.value}) produced {name} with sizes {list(t.shape)} and strides "
                    f"{list(t.stride())}, but its layout was inferred as {expected}"
                )

    def describe(self) -> Optional[StepReport]:
        return None
