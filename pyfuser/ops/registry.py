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


@dataclass
class OpResult:
    outputs: Sequence[Val]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    # Ops like ``shape`` return Python structures of Vals to the user rather than the output tuple.
    user_result: Any = None


@dataclass
class OpDef:
    name: str
    kind: OpKind
    builder: Callable
    evaluate: Callable
    meta: Optional[Callable] = None
    # Triton lowering (pyfuser.codegen): ``lower(node, kb, *operands)`` emits the op into a kernel builder and
    # returns its output value(s). None: the op has no generated-kernel form; a segment holding it runs on ATen.
    lower: Optional[Callable] = None
    # ``loop_map(node)`` -> pairs ((out, dim), (in, dim)) of dims that are the same loop dim. None: positional.
    loop_map: Optional[Callable] = None
    # For reductions: ``reduced_dims(node)`` -> the reduced dims of the (first) tensor input.
    reduced_dims: Optional[Callable] = None

    def run(self, node: Expr, args: tuple, kwargs: dict):
        """Evaluate with ATen, picking the meta override when any tensor argument is on the meta device."""
        fn = self.evaluate
        if self.meta is not None and _any_meta(args, kwargs):
            fn = self.meta
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
    **codegen_fields,
):
    """Decorator: turn a builder returning OpResult into the user-facing op, and record the OpDef.

    ``codegen_fields`` are the optional OpDef fields ``lower``, ``loop_map`` and ``reduced_dims``."""

    def deco(builder: Callable):
        @functools.wraps(builder)
        def op(*args, **kwargs):
            result = builder(*args, **kwargs)
            outputs = list(result.outputs)
            if outputs:
                fusion = outputs[0].fusion
                node = Expr(opdef, result.args, result.kwargs, outputs, result.info)
                fusion.add_expr(node)
            if result.user_result is not None:
                return result.user_result
            return outputs[0] if len(outputs) == 1 else tuple(outputs)

        op.__name__ = name
        opdef = OpDef(name, kind, op, evaluate, meta, **codegen_fields)
        for n in (name, *aliases):
            if n in _OPS:
                raise RuntimeError(f"op {n!r} registered twice")
            _OPS[n] = opdef
        return op

    return deco


def get(name: str) -> OpDef:
    try:
        return _OPS[name]
    except KeyError:
        from ..errors import UnsupportedOpError

        raise UnsupportedOpError(f"fd.ops.{name} is not supported by pyfuser") from None


def all_ops() -> dict[str, OpDef]:
    return dict(_OPS)
