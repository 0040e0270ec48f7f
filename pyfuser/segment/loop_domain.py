"""The loop domain of a kernel segment.

Every tensor in a kernel segment is indexed by one shared set of loop dims. Each op says which of its output
dims are the same loop dim as which input dims (``OpDef.loop_map``); a union-find over (tensor, dim) pairs turns
those statements into loop dims. A broadcast dim joined with a real dim is read with stride 0 along it.

Ops that read a tensor at other coordinates than their output's (slice, pad, cat, select, index_select, ...:
*memory reads*) read it straight from global memory, at an offset and with masks the lowering computes. Their
lowering says which operands it reads that way (``lower.memory_operands(node)``) and, where an operand such as an
index tensor does share loop dims with the output, which (``lower.loop_map``). A memory-read operand takes no
part in the loop domain, and it must come from outside the segment: a value computed in the kernel exists only
at the kernel's own coordinates. Except: cat, slice and pad may *recompute* an operand made in the kernel by
elementwise ops over outside tensors (and slices of them) at their own shifted coordinates
(``relocation_closure``); exprs used only that way are absorbed into the reader.

Reduction exprs name the loop dims they reduce, scans (cumsum) the dim they scan. A segment is one kernel only if
all its reductions and scans reduce/scan the same loop dims; those become the kernel's "column" dims, the rest
its "row" dims (pointwise segments take the
innermost dim of their reference output as the column dim, for a 2-D tile).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..errors import UnsupportedOpError
from ..ir.nodes import Expr, TensorView
from ..ops.registry import OpKind


class _UnionFind:
    def __init__(self):
        self.parent: dict = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def _size1(dom) -> bool:
    return dom.is_broadcast and not dom.expanded


def positional_loop_map(node: Expr) -> list[tuple[tuple[TensorView, int], tuple[TensorView, int]]]:
    """Default for pointwise ops: dims pair up aligned to the right (a lower-rank operand is broadcast)."""
    pairs = []
    for out in node.outputs:
        if not isinstance(out, TensorView):
            continue
        for inp in node.inputs:
            if isinstance(inp, TensorView) and inp.ndim <= out.ndim:
                lead = out.ndim - inp.ndim
                pairs.extend(((out, lead + d), (inp, d)) for d in range(inp.ndim))
    return pairs


def memory_operands(node: Expr) -> list:
    """The tensors ``node`` reads from global memory at remapped coordinates (empty for ordinary ops)."""
    fn = getattr(node.op.lower, "memory_operands", None)
    return list(fn(node)) if fn is not None else []


# Memory reads that may recompute an operand made in the same kernel at their own coordinates (cat, slice, pad
# read it at the output's coordinates shifted by constants; scatter with one coordinate replaced by the position
# its search loops over), and the views of outside tensors such a recomputation may start from.
RELOCATING_OPS = ("cat", "slice", "pad", "scatter")
# View ops a recomputation composes into one strided view of an outside tensor (reshape only where it is a view).
CHAIN_VIEWS = ("slice", "select", "reshape", "permute", "broadcast", "broadcast_in_dim", "expand", "squeeze")


def _is_elementwise(e: Expr) -> bool:
    return (e.op.kind is OpKind.POINTWISE and e.op.loop_map is None and e.op.name != "segment_set"
            and e.op.lower is not None and getattr(e.op.lower, "plan_access", None) is None
            and lowering_refusal(e) is None and len(e.outputs) == 1 and isinstance(e.outputs[0], TensorView))


def relocation_closure(v: TensorView, producer: dict, position: dict) -> Optional[list]:
    """The exprs (in program order) that compute ``v`` in this kernel, if a memory read can recompute them at
    shifted coordinates: elementwise ops over tensors from outside the kernel and over chains of views of such
    tensors (slice, select, permute, broadcast, reshape...: one strided view, which simply shifts). None
    otherwise."""
    closure, stack, seen = [], [v], set()

    def view_chain_from_outside(e) -> bool:
        while e is not None:
            if e.op.name not in CHAIN_VIEWS or lowering_refusal(e) is not None:
                return False
            e = producer.get(id(e.args[0]))
        return True

    while stack:
        e = producer.get(id(stack.pop()))
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.op.name in CHAIN_VIEWS:
            if not view_chain_from_outside(e):
                return None
            stack.append(e.args[0])
        elif _is_elementwise(e):
            stack.extend(t for t in e.inputs if isinstance(t, TensorView))
        else:
            return None
        closure.append(e)
    return sorted(closure, key=lambda e: position[id(e)])


def _absorbed(exprs: list, relocated: dict) -> set:
    """ids of the exprs only ever used, in this kernel, to be recomputed by memory reads: they are lowered only
    there, at the readers' coordinates, and take no part in the loop domain."""
    absorbed = {id(e) for closure in relocated.values() for e in closure}
    if not absorbed:
        return absorbed
    relocated_reads = set(relocated)
    # A value also needed outside this kernel (returned, or read by another segment) must be computed here at
    # its own coordinates too.
    fusion = exprs[0].outputs[0].fusion
    uses, returned = fusion.uses(), {id(v) for v in fusion.all_outputs()}
    here = {id(e) for e in exprs}
    for e in exprs:
        if id(e) in absorbed and any(id(o) in returned or any(id(u) not in here for u in uses.get(id(o), []))
                                     for o in e.outputs):
            absorbed.discard(id(e))
    changed = True
    while changed:
        changed = False
        for e in exprs:
            if id(e) in absorbed:
                continue
            for v in e.inputs:
                if not isinstance(v, TensorView) or (id(e), id(v)) in relocated_reads:
                    continue
                for p in exprs:
                    if id(p) in absorbed and any(o is v for o in p.outputs):
                        absorbed.discard(id(p))  # also needed at the kernel's own coordinates
                        changed = True
    return absorbed


def column_dims(node: Expr):
    """The input dims a reduction reduces, a scan scans or a selection (top-k) selects along: they must be the
    kernel's column dims. None for other ops."""
    if node.op.kind is OpKind.REDUCTION:
        return list(node.op.reduced_dims(node))
    if node.op.kind is OpKind.SCAN:
        return [node.kwargs["dim"]]
    fn = getattr(node.op.lower, "column_dims", None)
    return list(fn(node)) if fn is not None else None


def narrowing_dims(node: Expr) -> list:
    """(output, dim) pairs that ``node`` makes narrower than the input dim they share a loop dim with (top-k's k
    of n): such a loop dim keeps the widest extent, and narrower tensors are masked along it."""
    fn = getattr(node.op.lower, "narrowing_dims", None)
    return list(fn(node)) if fn is not None else []


def lowering_refusal(node: Expr):
    """Why ``node``'s lowering cannot take this particular call (e.g. slice bounds known only at run time), or
    None. The segmenter runs such a call on ATen instead of planning a kernel that would fall back whole."""
    fn = getattr(node.op.lower, "refusal", None)
    return fn(node) if fn is not None else None


class NotFusable(UnsupportedOpError):
    """The segment cannot become one generated kernel (the runtime falls back to ATen for it)."""


@dataclass
class LoopDomain:
    """Loop dims of one kernel segment. ``dims_of[id(tv)]`` gives, per logical dim of ``tv``, its loop dim."""

    dims: list[int]  # loop-dim ids, in kernel order: row dims (outer to inner), then column dims
    n_row: int  # how many of ``dims`` are row dims
    reduced: frozenset  # loop dims reduced by the segment's reductions (the column dims); empty if pointwise
    dims_of: dict = field(default_factory=dict)  # id(tv) -> list[loop dim id]
    tensors: dict = field(default_factory=dict)  # id(tv) -> tv, every tensor of the segment
    relocated: dict = field(default_factory=dict)  # (id(reader), id(operand)) -> exprs recomputing the operand
    absorbed: frozenset = frozenset()  # ids of exprs lowered only inside such recomputations
    narrow: frozenset = frozenset()  # loop dims along which some tensors are narrower (see narrowing_dims)

    @property
    def row_dims(self) -> list[int]:
        return self.dims[: self.n_row]

    @property
    def col_dims(self) -> list[int]:
        return self.dims[self.n_row :]

    def covering_tensor(self) -> Optional[TensorView]:
        """A tensor that varies along every loop dim any tensor varies along, or None. One kernel iterates over
        one such space; two unrelated computations (say [64,65] and [4,64,64]) in a segment have none."""
        real = {
            ld
            for tid, tv in self.tensors.items()
            for ld, dom in zip(self.dims_of[tid], tv.logical)
            if not dom.is_broadcast
        }
        for tid, tv in self.tensors.items():
            mine = {ld for ld, dom in zip(self.dims_of[tid], tv.logical) if not dom.is_broadcast}
            if mine >= real:
                return tv
        return None

    def has_col(self, tv: TensorView) -> bool:
        """Whether ``tv`` varies along the column dims (a full tile) or is per-row."""
        return any(d in self.col_dims for d, dom in zip(self.dims_of[id(tv)], tv.logical) if not dom.is_broadcast)


def _static_shape(tv: TensorView):
    """(extent, is_broadcast) per dim when every iterated extent is known at definition time, else None."""
    shape = []
    for dom in tv.logical:
        if not dom.is_broadcast and dom.extent is None:
            return None
        shape.append((None if dom.is_broadcast else dom.extent, dom.is_broadcast))
    return tuple(shape)


def _join_parallel_spaces(uf: _UnionFind, tensors: dict) -> None:
    """Computations that share no loop dims (two cumsum chains over [E], two [E, 3] concatenations) but iterate
    spaces of the same extents, known when the fusion is defined, run as one kernel: their widest tensors' dims
    become the same loop dims, position by position. Each tensor still reads only its own dims, so nothing
    combines values across them; a tensor that would then have two dims on one loop dim is refused later."""
    widest: dict = {}
    for tid, tv in tensors.items():
        real = frozenset(uf.find((tid, d)) for d, dom in enumerate(tv.logical) if not dom.is_broadcast)
        widest.setdefault(real, tv)
    maximal = [tv for s, tv in widest.items() if not any(s < other for other in widest)]
    if len(maximal) < 2:
        return  # one tensor covers the iteration space (or there is none)
    shape = _static_shape(maximal[0])
    if shape is None or any(_static_shape(tv) != shape for tv in maximal[1:]):
        return
    for tv in maximal[1:]:
        for d, dom in enumerate(tv.logical):
            if not dom.is_broadcast:
                uf.union((id(maximal[0]), d), (id(tv), d))


def build_loop_domain(
    exprs: list[Expr], reference: Optional[TensorView] = None, layout_order=None, require_covering: bool = True,
    join_parallel: bool = True,
) -> LoopDomain:
    """Unify the dims of every tensor in ``exprs``.

    ``reference`` fixes the order of loop dims (its allocation order, outermost first, from ``layout_order`` if
    given, else logical order); dims it lacks go last among their group."""
    uf = _UnionFind()
    tensors: dict[int, TensorView] = {}
    producer = {id(o): e for e in exprs for o in e.outputs}
    position = {id(e): i for i, e in enumerate(exprs)}
    relocated: dict = {}  # (id(reader), id(operand made here)) -> the exprs recomputing it
    for e in exprs:
        if e.op.lower is None:
            raise NotFusable(f"fd.ops.{e.op.name} has no Triton lowering")
        refusal = lowering_refusal(e)
        if refusal is not None:
            raise NotFusable(refusal)
        for v in memory_operands(e):
            if id(v) in producer:
                closure = relocation_closure(v, producer, position) if e.op.name in RELOCATING_OPS else None
                if closure is None:
                    raise NotFusable(f"fd.ops.{e.op.name} reads {v.name} at other coordinates than its own, and "
                                     f"{v.name} is computed in the same kernel")
                relocated[(id(e), id(v))] = closure
    absorbed = _absorbed(exprs, relocated)
    for e in exprs:
        if id(e) in absorbed:
            continue
        lower = e.op.lower
        from_memory = {id(v) for v in memory_operands(e)}
        for v in list(e.inputs) + list(e.outputs):
            if isinstance(v, TensorView) and id(v) not in from_memory:
                tensors[id(v)] = v
                for d in range(v.ndim):
                    uf.find((id(v), d))
        loop_map = getattr(lower, "loop_map", None) or e.op.loop_map or positional_loop_map
        for (o, od), (i, idim) in loop_map(e):
            if id(i) in from_memory:
                continue
            # A size-1 broadcast dim never joins another dim: joining it would make one loop dim of the different
            # extents it is broadcast against. (An expanded dim has a real extent, and eager materializes it in
            # any result it flows into, so it joins like any dim.)
            if _size1(o.logical[od]) or _size1(i.logical[idim]):
                continue
            uf.union((id(o), od), (id(i), idim))

    if join_parallel and require_covering:
        # Only for a whole candidate kernel: in a partial one (require_covering=False) two computations may be
        # unrelated only until a later op relates them, perhaps dim 0 to dim 1.
        _join_parallel_spaces(uf, tensors)

    reduced: set = set()
    for e in exprs:
        if id(e) in absorbed:
            continue
        dims = column_dims(e)
        if dims is not None:
            inp = next(v for v in e.inputs if isinstance(v, TensorView))
            these = {uf.find((id(inp), d)) for d in dims}
            if not these:  # reducing no dims is a copy
                continue
            if reduced and these != reduced:
                raise NotFusable("reductions or scans over different dims in one segment")
            reduced = these

    dims_of = {tid: [uf.find((tid, d)) for d in range(tv.ndim)] for tid, tv in tensors.items()}
    narrow = frozenset(uf.find((id(o), d)) for e in exprs if id(e) not in absorbed for o, d in narrowing_dims(e))
    for tid, dims in dims_of.items():
        if len(set(dims)) != len(dims):
            # The tensor is read through two different dim maps (x + x.T, an outer difference): one kernel
            # cannot index it with a single loop dim per tensor dim.
            raise NotFusable(f"{tensors[tid].name} has two dims on one loop dim")
    if not tensors:
        return LoopDomain([], 0, frozenset(reduced), dims_of, tensors, relocated, frozenset(absorbed), narrow)
    if require_covering and tensors and LoopDomain([], 0, frozenset(), dims_of, tensors).covering_tensor() is None:
        raise NotFusable("the segment's tensors do not share one iteration space")
    if reference is None:
        reference = max(tensors.values(), key=lambda t: t.ndim)
    ref_dims = dims_of[id(reference)]
    order = list(layout_order) if layout_order is not None else list(range(reference.ndim))
    ordered: list[int] = []
    for d in order:
        if ref_dims[d] not in ordered:
            ordered.append(ref_dims[d])
    for tid in dims_of:
        for ld in dims_of[tid]:
            if ld not in ordered:
                ordered.append(ld)
    if reduced:
        rows = [d for d in ordered if d not in reduced]
        cols = [d for d in ordered if d in reduced]
    else:
        # Pointwise: the innermost reference dim is the column dim, so tiles follow memory order.
        rows, cols = ordered[:-1], ordered[-1:]
    return LoopDomain(rows + cols, len(rows), frozenset(reduced), dims_of, tensors, relocated, frozenset(absorbed),
                      narrow)
