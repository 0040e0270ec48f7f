"""nvFuser's methods on values that the IR does not need itself, attached by the frontend.

- ``is_tensor()`` / ``is_scalar()`` / ``is_vector()``: what kind of value it is (nvFuser's ``Val`` queries);
- nvFuser's manual-scheduling methods of a TensorView (``split``, ``merge``, ``parallelize``, ``cache_after``,
  ...): pyfuser schedules every segment itself, so they raise ``UnsupportedOpError`` naming the call instead of
  an AttributeError.
"""

from __future__ import annotations

from ..errors import UnsupportedOpError
from ..ir.nodes import Scalar, TensorView, Val, Vector

# split, axis, get_loop_domain, set_allocation_domain and set_device_mesh are the sharding API: pyfuser.distributed
# attaches them (docs/multidevice.md).
SCHEDULING_METHODS = (
    "merge", "reorder", "parallelize", "cache_after", "cache_before", "cache_fork", "set_memory_type",
    "rfactor", "get_logical_domain", "get_root_domain", "get_allocation_domain",
    "set_loop_domain", "swizzle", "inline_at", "compute_at",
    "has_root", "vectorize", "unroll", "split_reduction",
)


def _is_tensor(self) -> bool:
    return isinstance(self, TensorView)


def _is_scalar(self) -> bool:
    return isinstance(self, Scalar)


def _is_vector(self) -> bool:
    return isinstance(self, Vector)


def _unsupported(name: str):
    def method(self, *args, **kwargs):
        raise UnsupportedOpError(
            f"TensorView.{name}: pyfuser has no manual scheduling API (it schedules every segment itself)")

    method.__name__ = name
    return method


def attach() -> None:
    for name, fn in (("is_tensor", _is_tensor), ("is_scalar", _is_scalar), ("is_vector", _is_vector)):
        if name not in vars(Val):
            setattr(Val, name, fn)
    for name in SCHEDULING_METHODS:
        if not hasattr(TensorView, name):
            setattr(TensorView, name, _unsupported(name))


attach()
