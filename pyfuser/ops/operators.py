"""Python operators on Vals build ops, as in nvFuser (``tv0 + tv1``, ``-tv0``, ``tv0 < 1``), and so does
``TensorView.size(dim)``.

They are attached to :class:`~pyfuser.ir.nodes.Val` here, in the op layer, so the IR never imports the ops.
"""

from __future__ import annotations

from ..ir.nodes import TensorView, Val
from .registry import get


def _binary(name: str):
    def forward(self, other):
        return get(name).builder(self, other)

    def reflected(self, other):
        return get(name).builder(other, self)

    forward.__name__, reflected.__name__ = name, "r" + name
    return forward, reflected


def _unary(name: str):
    def op(self):
        return get(name).builder(self)

    op.__name__ = name
    return op


for _dunder, _name in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div")):
    _fwd, _refl = _binary(_name)
    setattr(Val, f"__{_dunder}__", _fwd)
    setattr(Val, f"__r{_dunder}__", _refl)
for _dunder, _name in (("pow", "pow"), ("mod", "fmod"), ("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge")):
    setattr(Val, f"__{_dunder}__", _binary(_name)[0])
Val.__neg__ = _unary("neg")
Val.__abs__ = _unary("abs")


def _size(self, dim: int):
    """nvFuser's ``T.size(dim)``: the extent of a dim as an Int scalar."""
    return get("size").builder(self, dim)


TensorView.size = _size
