"""Value-range facts: what an op's semantics guarantee about the values of an integer tensor.

Some ops produce *indices*: every value of top-k's indices and of argsort's result lies in ``[0, n)``, ``n`` the
extent of the selected (sorted) dim of their input. Ops that only move or copy values keep that fact (views,
``segment_set``, ``stride_order``, casts between Int and Int32, which represent every extent). A consumer that
can exploit a small value range asks here: the counting sort of 1-D argsorts (segment/counting_sort.py) needs
keys known to lie in ``[0, n)`` with ``n`` small.

The fact is derived from the IR (a walk up the producers), never measured: it holds for any input data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ir.dtypes import DataType
from ..ir.nodes import TensorView

# Ops whose every output value is one of their first operand's values.
_VALUE_PRESERVING = frozenset({
    "reshape", "permute", "squeeze", "broadcast", "broadcast_in_dim", "expand", "slice", "select", "segment_set",
    "stride_order",
})
# Integer dtypes that hold every index of a dim (extents fit in int32 on every device pyfuser targets).
_INDEX_DTYPES = frozenset({DataType.Int, DataType.Int32})


@dataclass(frozen=True)
class IndexRange:
    """Every value lies in ``[0, n)``, ``n`` the extent of dim ``dim`` of ``source`` (known at run time if not at
    definition: a size-1 broadcast dim has extent 1)."""

    source: TensorView
    dim: int

    def static_bound(self) -> Optional[int]:
        d = self.source.logical[self.dim]
        if d.is_broadcast and not d.expanded:
            return 1
        return d.extent


def index_range(tv: TensorView) -> Optional[IndexRange]:
    """The index range of ``tv``'s values, or None when the IR does not prove one."""
    while isinstance(tv, TensorView) and tv.dtype in _INDEX_DTYPES:
        e = tv.defined_by
        if e is None:
            return None
        name = e.op.name
        if name == "topk" and tv is e.outputs[1]:
            return IndexRange(e.args[0], e.kwargs["dim"])
        if name == "argsort":
            return IndexRange(e.args[0], e.kwargs["dim"])
        if name in _VALUE_PRESERVING or name == "cast":  # (a cast's input must itself be Int or Int32: loop test)
            tv = e.args[0]
            continue
        return None
    return None
