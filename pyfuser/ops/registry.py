"""The op registry: every op is defined once, as one OpDef.

An OpDef holds
- ``builder``: the ``fd.ops.<name>`` function. It checks arguments, infers output shapes and dtypes and returns
  an :class:`OpResult` (outputs plus the canonical call that recreates them);
- ``evaluate``: the ATen implementation, ``evaluate(node, *args, **kwargs)`` with Vals replaced by runtime values
  (torch tensors, Python numbers). It runs on real and on meta tensors;
- ``meta``: optional, same signature, used instead of ``evaluate`` on meta tensors where ATen's meta result
  differs from what the GPU produces (or where ATen has no meta kernel);
- ``kind``: what the segmenter needs to know about the op.

Later stages add fields here (e.g. a Triton lowering), never new places.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from ..ir.nodes import Expr, Val


class OpKind(enum.Enum):
    POINTWISE = "pointwise"  # elementwise math, casts, where, ...
    REDUCTION = "reduction"  # sum/max/min/prod/var/var_mean/welford
    SCAN = "scan"  # cumsum & co.
    VIEW = "view"  # pure aliasing when evaluated by ATen: slice, expand, permute, broadcast, squeeze, reshape
    RESIZE = "resize"  # pad, cat
    INDEXING = "indexing"  # gather, index_select, take_along_axis, scatter, select
    FACTORY = "factory"  # full, iota, uniform, normal
    ATEN = "aten"  # only ever run by ATen (an ExprEval segment): matmul, linear, sdpa, embedding, topk, ...
    HOST = "host"  # host-side scalar ops: size, shape
    # An op with a hand-written Triton kernel family (pyfuser.nvfp4: the layout op, block quantization). It is
    # scheduled like a pointwise op over its input but always forms its own segment: its writes are
    # data-dependent (offsets decide where each row lands), so nothing may consume its output in the same kernel.
    OWN_KERNEL = "own_kernel"


@dataclass
class OpResult:
    outputs: Sequence[Val]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    # Ops like ``shape`` return Python structures of Vals to the user rather than the output tuple.
    user_result: Any = None
    # A form of the op with semantics of its own (e.g. MXFP8 block quantization, which has no hand-written
    # kernel): the node gets this OpDef, which has the op's name (so it prints as the same call) but its own
    # evaluator, meta and kind. None: the registered OpDef.
    variant: Optional["OpDef"] = None


@dataclass
class OpDef:
    name: str
    kind: OpKind
    builder: Callable
    evaluate: Callable
    meta: Optional[Callable] = None
    # Triton lowering, attached by pyfuser.codegen (see :func:`attach`): ``lower(node, kb, *operands)`` emits the op
    # into a kernel builder and returns its output value(s). None: no generated-kernel form; its segment runs on ATen.
    lower: Optional[Callable] = None
    # ``loop_map(node)`` -> pairs ((out, dim), (in, dim)) of dims that are the same loop dim. None: positional.
    loop_map: Optional[Callable] = None
    # For reductions: ``reduced_dims(node)`` -> the reduced dims of the (first) tensor input.
    reduced_dims: Optional[Callable] = None
    # A hand-written Triton implementation, same signature as ``evaluate``, attached by pyfuser.kernels. Executors
    # call it where Triton runs (CUDA, or the interpreter) and kernels are enabled; ``evaluate`` stays the
    # pure-torch reference.
    kernel: Optional[Callable] = None
    # The kernel's work that depends only on its arguments' metadata, done once per input signature (attached with
    # ``kernel``): ``prepare(node, *args, **kwargs)`` checks the shapes, dtypes and layouts (raising what ``kernel``
    # raises) and works out the launch configuration, and returns ``run``, of ``kernel``'s signature, which does
    # only what depends on values: binding pointers, allocating outputs, checking offsets, launching. ``run``
    # computes what ``kernel`` computes for any arguments with the metadata ``prepare`` saw (sizes, strides, dtype,
    # device, 16-byte alignment, negative/conjugate bits: what an input signature fixes); anything else it depends
    # on (a storage's size) it compares per call. None: the runtime calls ``kernel`` on every call.
    prepare: Optional[Callable] = None
    # Whether the op accepts Float4_e2m1fn operands (packed at run time: most ATen ops cannot read them).
    accepts_fp4: bool = False

    def run(self, node: Expr, args: tuple, kwargs: dict, use_kernel: bool = False, on_meta: Optional[bool] = None):
        """Evaluate with ATen, picking the meta override on meta tensors (``on_meta``; None: look at the
        arguments), or the op's own Triton kernel when ``use_kernel``."""
        fn = self.evaluate
        if on_meta is None:
            on_meta = self.meta is not None and _any_meta(args, kwargs)
        if self.meta is not None and on_meta:
            fn = self.meta
        elif use_kernel and self.kernel is not None:
            fn = self.kernel
        return fn(node, *args, **kwargs)


_OPS: dict[str, OpDef] = {}


def _any_meta(args, kwargs) -> bool:
    import torch

    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor) and a.device.type == "meta":
            return True
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) and x.device.type == "meta" for x in a):
            return True
    return False


def register(
    name: str,
    kind: OpKind,
    evaluate: Callable,
    meta: Optional[Callable] = None,
    aliases: Sequence[str] = (),
    **fields,
):
    """Decorator: turn a builder returning OpResult into the user-facing op, and record the OpDef.

    ``fields`` are the optional semantic OpDef fields ``loop_map``, ``reduced_dims`` and ``accepts_fp4``; a
    lowering or hand-written kernel is attached later by name (:func:`attach`)."""

    def deco(builder: Callable):
        @functools.wraps(builder)
        def op(*args, **kwargs):
            _check_special_operands(opdef, args, kwargs)
            result = builder(*args, **kwargs)
            outputs = list(result.outputs)
            if outputs:
                fusion = outputs[0].fusion
                node = Expr(result.variant or opdef, result.args, result.kwargs, outputs, result.info)
                fusion.add_expr(node)
            if result.user_result is not None:
                return result.user_result
            return outputs[0] if len(outputs) == 1 else tuple(outputs)

        op.__name__ = name
        opdef = OpDef(name, kind, op, evaluate, meta, **fields)
        for n in (name, *aliases):
            if n in _OPS:
                raise RuntimeError(f"op {n!r} registered twice")
            _OPS[n] = opdef
        return op

    return deco


def _check_special_operands(opdef: OpDef, args: tuple, kwargs: dict) -> None:
    """Operands only some ops may read: packed FP4 tensors, and block-scale tensors in the swizzled grouped
    layout (the layout op's output), whose strides do not describe their data (layout_op.md)."""
    from ..errors import FusionDefinitionError, FusionDtypeError
    from ..ir.dtypes import DataType
    from ..ir.nodes import TensorView

    for x in list(args) + list(kwargs.values()):
        if not isinstance(x, TensorView):
            continue
        producer = swizzled_scales_producer(x)
        if producer is not None and opdef.name not in _SCALE_CONSUMERS:
            raise FusionDefinitionError(
                f"fd.ops.{opdef.name}: {x.name} is the output of fd.ops.{producer} (block scales in the padded "
                f"128x4-swizzled grouped layout); it may only be used as scale1/scale2 of "
                f"fd.ops.cutlass_nvfp4_grouped_mm or returned as a fusion output"
            )
        if x.dtype is DataType.Float4_e2m1fn and not opdef.accepts_fp4:
            raise FusionDtypeError(
                f"fd.ops.{opdef.name}: {x.name} is Float4_e2m1fn (packed at run time); cast it to Float first"
            )


def swizzled_scales_producer(tv) -> Optional[str]:
    """The op name if ``tv`` holds block scales in the swizzled grouped layout (its producer's node marks the
    output with ``info["swizzled_output"]``), else None."""
    d = tv.defined_by
    if d is None or d.info.get("swizzled_output") is None:
        return None
    return d.op.name if d.outputs[d.info["swizzled_output"]] is tv else None


# The ops that read swizzled grouped block scales (the builder checks which argument position).
_SCALE_CONSUMERS = ("cutlass_nvfp4_grouped_mm",)


def get(name: str) -> OpDef:
    try:
        return _OPS[name]
    except KeyError:
        from ..errors import UnsupportedOpError

        raise UnsupportedOpError(f"fd.ops.{name} is not supported by pyfuser") from None


def all_ops() -> dict[str, OpDef]:
    return dict(_OPS)


# The fields that later layers attach to an op by name: ``lower`` (pyfuser.codegen), ``kernel`` and ``prepare``
# (pyfuser.kernels). The registry holds the slot; the layer that owns the code fills it, so ops never import it.
_ATTACHABLE = ("lower", "kernel", "prepare")


def attach(name: str, **fields) -> None:
    """Attach a Triton lowering (``lower=``) or a hand-written kernel (``kernel=``, optionally with its
    ``prepare=``) to the registered op ``name``. Attaching a field twice is a programming error (two lowerings
    for one op)."""
    opdef = _OPS.get(name)
    if opdef is None:
        raise RuntimeError(f"attach: no op named {name!r} is registered")
    for key, fn in fields.items():
        if key not in _ATTACHABLE:
            raise RuntimeError(f"attach: {key!r} is not an attachable OpDef field ({', '.join(_ATTACHABLE)})")
        if getattr(opdef, key) is not None:
            raise RuntimeError(f"attach: fd.ops.{name} already has a {key}")
        setattr(opdef, key, fn)
