"""``fd.ops``: the user-facing op namespace, backed by the op registry.

Arguments are taken as nvFuser's pybind11 bindings take them: a parameter whose default is a bool also accepts
an int (pybind converts ``manual_normalization=0`` to False). Nothing looser: floats, strings or None stay
errors of the op itself.
"""

from __future__ import annotations

import functools
import inspect
import numbers

from ..errors import UnknownOpError, UnsupportedOpError
from ..ops import registry


def _bool_params(builder) -> dict:
    """name -> position of the builder's parameters with a bool default."""
    try:
        params = list(inspect.signature(builder).parameters.values())
    except (TypeError, ValueError):
        return {}
    return {p.name: i for i, p in enumerate(params) if isinstance(p.default, bool)
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _as_bool(v):
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return bool(v)
    return v


@functools.lru_cache(maxsize=None)
def _lenient(name: str):
    builder = registry.get(name).builder
    bools = _bool_params(builder)
    if not bools:
        return builder
    positions = {i for i in bools.values()}

    @functools.wraps(builder)
    def op(*args, **kwargs):
        if any(i < len(args) for i in positions):
            args = tuple(_as_bool(a) if i in positions else a for i, a in enumerate(args))
        for k in bools.keys() & kwargs.keys():
            kwargs[k] = _as_bool(kwargs[k])
        return builder(*args, **kwargs)

    return op


class OpsNamespace:
    """Attribute access returns the registered builder, so ``fd.ops.add(a, b)`` builds an ``add`` node.

    ``shape(t)`` is a convenience over ``size``: it returns one Int scalar per dim (nvFuser's ``T.shape()``).
    """

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            registry.get(name)
        except UnsupportedOpError as e:
            # our error for an op pyfuser does not have, which is also an AttributeError: hasattr() and
            # getattr(fd.ops, name, default) work as on any object
            raise UnknownOpError(str(e)) from None
        return _lenient(name)

    def __dir__(self):
        return sorted(set(registry.all_ops()) | {"shape"})

    @staticmethod
    def shape(arg):
        from ..ops.common import require_tensor

        tv = require_tensor("shape", arg, "arg")
        return [registry.get("size").builder(tv, i) for i in range(tv.ndim)]


ops = OpsNamespace()
