"""``fd.ops``: the user-facing op namespace, backed by the op registry."""

from __future__ import annotations

from ..ops import registry


class OpsNamespace:
    """Attribute access returns the registered builder, so ``fd.ops.add(a, b)`` builds an ``add`` node.

    ``shape(t)`` is a convenience over ``size``: it returns one Int scalar per dim (nvFuser's ``T.shape()``).
    """

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return registry.get(name).builder

    def __dir__(self):
        return sorted(set(registry.all_ops()) | {"shape"})

    @staticmethod
    def shape(arg):
        from ..ops.common import require_tensor

        tv = require_tensor("shape", arg, "arg")
        return [registry.get("size").builder(tv, i) for i in range(tv.ndim)]


ops = OpsNamespace()
