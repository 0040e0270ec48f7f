"""The IR: values (scalars, vectors, tensors), iteration domains and expressions.

Deliberately small. A TensorView knows its logical domain (extents, broadcast/expanded/reduction dims), an
allocation order and a per-dim contiguity; an Expr knows its op, its canonical call arguments and its outputs.
There is no loop-transformation machinery: tiling is Triton's job.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .dtypes import DataType

# Annotations name ``Fusion`` (ir/fusion.py, which imports this module) and ``OpDef`` (the op registry, a higher
# layer) as strings only: the IR imports neither.


class IterType(enum.Enum):
    Iteration = "Iteration"
    Broadcast = "Broadcast"
    Reduction = "Reduction"


@dataclass(frozen=True)
class IterDomain:
    """One logical dimension.

    ``extent`` is an int when known at definition time and None when symbolic (bound from the inputs at run
    time). A broadcast dim has extent 1, unless ``expanded``: then ``extent`` is the expanded extent (None if
    symbolic) and the dim has stride 0 at run time.
    """

    extent: Optional[int]
    iter_type: IterType = IterType.Iteration
    expanded: bool = False

    @property
    def is_broadcast(self) -> bool:
        return self.iter_type is IterType.Broadcast

    @property
    def is_reduction(self) -> bool:
        return self.iter_type is IterType.Reduction

    @staticmethod
    def iteration(extent: Optional[int]) -> "IterDomain":
        return IterDomain(extent, IterType.Iteration)

    @staticmethod
    def broadcast(expanded_extent: Optional[int] = 1) -> "IterDomain":
        expanded = expanded_extent != 1
        return IterDomain(expanded_extent, IterType.Broadcast, expanded)

    @staticmethod
    def reduction(extent: Optional[int]) -> "IterDomain":
        return IterDomain(extent, IterType.Reduction)

    def __repr__(self) -> str:
        ext = "?" if self.extent is None else str(self.extent)
        tag = {IterType.Iteration: "i", IterType.Broadcast: "b", IterType.Reduction: "r"}[self.iter_type]
        return f"{tag}{ext}{'(exp)' if self.expanded else ''}"


class Val:
    """Base of everything an op consumes or produces. ``defined_by`` is the Expr that produced it, if any
    (nvFuser's ``definition()``, attached by the frontend with its other Val methods)."""

    fusion: "Fusion"
    dtype: DataType
    defined_by: Optional["Expr"]
    name: str

    def __init__(self, fusion: "Fusion", dtype: DataType, prefix: str):
        self.fusion = fusion
        self.dtype = dtype
        self.defined_by = None
        self.name = fusion._new_name(prefix)

    def __repr__(self) -> str:
        return self.name

    # Python operators (``tv0 + tv1``) are attached by pyfuser/ops/operators.py: building an op is the op
    # layer's work.
    __hash__ = object.__hash__


class Scalar(Val):
    """A scalar. ``value`` is set for constants and None for symbolic scalars (inputs or op results)."""

    def __init__(self, fusion: "Fusion", dtype: DataType, value: Any = None):
        super().__init__(fusion, dtype, "S")
        self.value = value
        self.declared = False  # True when created by define_scalar (printed as its own statement)

    @property
    def is_constant(self) -> bool:
        return self.value is not None

    def is_symbolic(self) -> bool:
        return self.value is None


class Vector(Val):
    """A list of Int scalars (``define_vector``), used as a shape argument."""

    def __init__(self, fusion: "Fusion", elements: Sequence[Scalar], dtype: DataType = DataType.Int):
        super().__init__(fusion, dtype, "V")
        self.elements = list(elements)

    def __len__(self) -> int:
        return len(self.elements)

    def __iter__(self):
        return iter(self.elements)

    def __getitem__(self, i):
        return self.elements[i]


class TensorView(Val):
    """A tensor.

    ``logical_domain``: logical IterDomains, reductions included (they keep their place; a reduction output's
    rank is the number of non-reduction dims; nvFuser's ``tv.domain()``, attached by the frontend, prints them).
    ``alloc_order``: logical positions from outermost to innermost allocation, or None for row-major.
    ``contiguity``: one entry per allocation position (True / False / None for broadcast and reduction dims),
    nvFuser's convention.
    """

    def __init__(
        self,
        fusion: "Fusion",
        domain: Sequence[IterDomain],
        dtype: DataType,
        *,
        contiguity: Optional[Sequence[Optional[bool]]] = None,
        alloc_order: Optional[Sequence[int]] = None,
        is_cpu: bool = False,
    ):
        super().__init__(fusion, dtype, "T")
        self.logical_domain = tuple(domain)
        if alloc_order is not None and list(alloc_order) == list(range(len(self.logical_domain))):
            alloc_order = None
        self.alloc_order = None if alloc_order is None else tuple(alloc_order)
        if contiguity is None:
            contiguity = default_contiguity(self.logical_domain, self.alloc_order)
        self.contiguity = tuple(contiguity)
        self.is_cpu = is_cpu

    # --- shape queries -------------------------------------------------------------------------------
    @property
    def logical(self) -> tuple[IterDomain, ...]:
        """Logical dims without reductions: what a torch tensor holding this value has."""
        return tuple(d for d in self.logical_domain if not d.is_reduction)

    @property
    def ndim(self) -> int:
        return len(self.logical)

    def static_shape(self) -> list[Optional[int]]:
        return [d.extent if (not d.is_broadcast or d.expanded) else 1 for d in self.logical]

    def stride_order(self) -> list[int]:
        """nvFuser's stride_order over non-reduction logical dims (0 = fastest)."""
        order = self.alloc_order or tuple(range(len(self.logical_domain)))
        kept = [p for p in order if not self.logical_domain[p].is_reduction]
        logical_pos = {
            p: i for i, p in enumerate(p for p, d in enumerate(self.logical_domain) if not d.is_reduction)
        }
        n = len(kept)
        result = [0] * n
        for alloc_pos, p in enumerate(kept):
            result[logical_pos[p]] = n - 1 - alloc_pos
        return result

    # --- nvFuser-style conveniences (``size(dim)`` builds an op: attached by pyfuser/ops/operators.py) ----------
    def shape(self) -> list:
        """One Int scalar per logical dim (nvFuser's ``T.shape()``)."""
        return [self.size(i) for i in range(self.ndim)]

    def __getitem__(self, key):
        raise TypeError("TensorView does not support indexing; use fd.ops.slice / fd.ops.select")


def default_contiguity(domain: Sequence[IterDomain], alloc_order: Optional[Sequence[int]] = None):
    """Contiguity of a freshly allocated tensor: True for real dims, None for broadcast/reduction dims."""
    order = alloc_order or range(len(domain))
    return tuple(None if (domain[i].is_broadcast or domain[i].is_reduction) else True for i in order)


class Expr:
    """One op application. ``args``/``kwargs`` are the canonical call (Vals nested where the user passed them);
    they are what gets printed, hashed and handed to the evaluator. ``info`` holds facts the builder derived
    from them (e.g. the compute dtype), so evaluators need not re-derive them."""

    __slots__ = ("op", "args", "kwargs", "outputs", "inputs", "info")

    def __init__(self, op: "OpDef", args: tuple, kwargs: dict, outputs: Sequence[Val], info: Optional[dict] = None):
        self.op = op
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.outputs = tuple(outputs)
        self.inputs = tuple(collect_vals((self.args, self.kwargs)))
        self.info = info or {}
        for out in self.outputs:
            out.defined_by = self

    def __repr__(self) -> str:
        outs = ", ".join(o.name for o in self.outputs)
        return f"{outs} = {self.op.name}({', '.join(map(repr, self.args))})"


def collect_vals(obj) -> list[Val]:
    """Vals nested anywhere in tuples/lists/dicts, in order, without duplicates."""
    seen: dict[int, Val] = {}

    def walk(o):
        if isinstance(o, Vector):
            seen.setdefault(id(o), o)
            for e in o.elements:
                walk(e)
        elif isinstance(o, Val):
            seen.setdefault(id(o), o)
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)
        elif isinstance(o, dict):
            for x in o.values():
                walk(x)

    walk(obj)
    return list(seen.values())


def _dtype_call(self):
    # nvFuser exposes ``tv.dtype()`` as a method; our IR stores a plain attribute. Making the enum value
    # callable (returning itself) lets both spellings work.
    return self


DataType.__call__ = _dtype_call
