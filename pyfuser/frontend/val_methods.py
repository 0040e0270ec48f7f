"""nvFuser's methods on values that the IR does not need itself, attached by the frontend.

- ``is_tensor()`` / ``is_scalar()`` / ``is_vector()`` / ``is_symbolic()``: what kind of value it is (nvFuser's
  ``Val`` queries; a tensor is symbolic, as in nvFuser, and a vector is unless all its elements are constants);
- ``definition()`` / ``uses()``: the Expr that produced a value (None for an input or constant) and the Exprs of
  its fusion that read it, in definition order; ``Expr.input(i)`` / ``Expr.output(i)``;
- ``domain()``: a TensorView's dims, printed as nvFuser prints a TensorDomain (``[iS0{2}, iS1{4}, iS2{8}]``);
- nvFuser's manual-scheduling methods of a TensorView (``split``, ``merge``, ``parallelize``, ``cache_after``,
  ...): pyfuser schedules every segment itself, so they raise ``UnsupportedOpError`` naming the call instead of
  an AttributeError.
"""

from __future__ import annotations

from ..errors import UnsupportedOpError
from ..ir.nodes import Expr, Scalar, TensorView, Val, Vector
from .math_printer import TensorDomain

# split, axis, get_loop_domain, set_allocation_domain and set_device_mesh are the sharding API: pyfuser.distributed
# attaches them (docs/multidevice.md).
SCHEDULING_METHODS = (
    "merge", "reorder", "parallelize", "cache_after", "cache_before", "cache_fork", "set_memory_type",
    "rfactor", "get_logical_domain", "get_root_domain", "get_allocation_domain",
    "set_loop_domain", "swizzle", "inline_at", "compute_at",
    "has_root", "vectorize", "unroll", "split_reduction", "swizzle1d",
)


def _is_tensor(self) -> bool:
    return isinstance(self, TensorView)


def _is_scalar(self) -> bool:
    return isinstance(self, Scalar)


def _is_vector(self) -> bool:
    return isinstance(self, Vector)


def _is_symbolic_tensor(self) -> bool:
    return True


def _is_symbolic_vector(self) -> bool:
    return any(e.is_symbolic() for e in self.elements)


def _definition(self):
    return self.defined_by


def _uses(self) -> list:
    return [e for e in self.fusion.statements if isinstance(e, Expr) and any(v is self for v in e.inputs)]


def _expr_value(kind: str):
    def method(self, index: int):
        values = self.inputs if kind == "input" else self.outputs
        if not isinstance(index, int) or not -len(values) <= index < len(values):
            count = f"{len(values)} {kind}" + ("" if len(values) == 1 else "s")
            raise IndexError(f"Expr.{kind}({index!r}): {self!r} has {count}")
        return values[index]

    method.__name__ = kind
    return method


def _domain(self) -> TensorDomain:
    return TensorDomain(self)


def _unsupported(name: str):
    def method(self, *args, **kwargs):
        raise UnsupportedOpError(
            f"TensorView.{name}: pyfuser has no manual scheduling API (it schedules every segment itself)")

    method.__name__ = name
    return method


def attach() -> None:
    for name, fn in (("is_tensor", _is_tensor), ("is_scalar", _is_scalar), ("is_vector", _is_vector),
                     ("definition", _definition), ("uses", _uses)):
        if name not in vars(Val):
            setattr(Val, name, fn)
    for cls, fn in ((TensorView, _is_symbolic_tensor), (Vector, _is_symbolic_vector)):
        if "is_symbolic" not in vars(cls):
            cls.is_symbolic = fn
    for kind in ("input", "output"):
        if kind not in vars(Expr):
            setattr(Expr, kind, _expr_value(kind))
    if "domain" not in vars(TensorView):
        TensorView.domain = _domain
    for name in SCHEDULING_METHODS:
        if not hasattr(TensorView, name):
            setattr(TensorView, name, _unsupported(name))


attach()
