"""Splitting a fusion into segments.

Two kinds of work exist: kernel work (pointwise, reduction, normalization: one generated Triton kernel per
segment) and ExprEval work (ATen-only ops such as matmul, linear, SDPA, embedding, topk, ops that have no
Triton lowering yet, and zero-copy view chains). The segmenter
1. marks view ops that must stay ATen views: a chain of views ending in a fusion output, or feeding an
   ExprEval op, is evaluated by ATen so the result aliases its producer exactly as eager would; so is a view that
   other ops only read through views of their own (a slice that cat reads), which costs no copy that way;
2. orders the expressions topologically, preferring to continue the current segment, and cuts a new segment
   whenever the kind changes, after ``segment_set``, or when adding an expr would stop a kernel segment from
   being one kernel (its reductions must all reduce the same loop dims). Every segment only reads values
   produced by earlier segments, so the order is a valid schedule;
3. merges a pointwise kernel into the hand-written kernel op it feeds, as that op's *load prologue*, where the
   op declares one on that input (``node.info["prologue_input"]``: the quantize kernels compute their input
   tile through a generated function instead of reading it from memory, codegen/prologue.py);
4. makes a 1-D stable argsort of keys with a small proven value range, its inverse, the one-hot count of its keys
   and the kernel work reading that count one CountingSort segment (segment/counting_sort.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

from ..ir.fusion import Fusion
from ..ir.nodes import Expr, Scalar, TensorView, Val, Vector
from ..ir.packing import is_packed_fp4
from ..ir.order import print_order
from ..ops.registry import OpKind
from .counting_sort import CountingSortGroup, merge_counting_sorts
from .loop_domain import (
    RELOCATING_OPS,
    NotFusable,
    build_loop_domain,
    column_dims,
    lowering_refusal,
    memory_operands,
)


class SchedulerKind(enum.Enum):
    EXPR_EVAL = "ExprEval"
    POINTWISE = "PointWise"
    REDUCTION = "Reduction"
    INNER_PERSISTENT = "InnerPersistent"
    COUNTING_SORT = "CountingSort"  # a 1-D argsort of small-range keys and its by-products (counting_sort.py)

    def __repr__(self) -> str:
        return f"SchedulerKind.{self.name}"


@dataclass
class Segment:
    index: int
    kind: SchedulerKind
    exprs: list[Expr]
    inputs: list[Val] = field(default_factory=list)  # tensors and symbolic scalars produced outside
    outputs: list[Val] = field(default_factory=list)  # values read by later segments or returned
    # A hand-written kernel op's segment may start with a merged pointwise producer (its load prologue):
    # its exprs, and the tensors it hands to the op inside the segment (never written to memory by the kernels).
    prologue_exprs: list[Expr] = field(default_factory=list)
    prologue_outputs: list[TensorView] = field(default_factory=list)
    # A CountingSort segment's parts (segment/counting_sort.py: the sort, its inverse, histogram, epilogue).
    counting_sort: Optional[CountingSortGroup] = None

    def __repr__(self) -> str:
        ops = ", ".join(e.op.name for e in self.exprs)
        ins = ", ".join(v.name for v in self.inputs)
        outs = ", ".join(v.name for v in self.outputs)
        return f"Segment {self.index} [{self.kind.value}] ({ins}) -> ({outs}): {ops}"


@dataclass
class SegmentedFusion:
    fusion: Fusion
    segments: list[Segment]

    def __repr__(self) -> str:
        return "\n".join(map(repr, self.segments))


_EXPR_EVAL = "expr_eval"
_KERNEL = "kernel"
_OWN_KERNEL = "own_kernel"  # an op with its own hand-written kernel: always a segment of its own
_COUNTING_SORT = "counting_sort"  # a counting-sort group (segment/counting_sort.py)


def _touches_packed_fp4(e: Expr) -> bool:
    """Generated kernels neither read nor write packed FP4 (pairs of values per byte): such casts run on ATen."""
    return any(is_packed_fp4(v) for v in list(e.inputs) + list(e.outputs))


def _is_scalar_expr(e: Expr) -> bool:
    return all(isinstance(o, (Scalar, Vector)) for o in e.outputs)


def classify(fusion: Fusion) -> dict[int, str]:
    """id(expr) -> 'expr_eval' | 'kernel' (scalar-only exprs get the kind of whatever segment they land in)."""
    exprs = fusion.exprs
    uses = fusion.uses()
    returned = {id(v) for v in fusion.all_outputs()}
    kind: dict[int, str] = {}
    for e in reversed(exprs):
        if _is_scalar_expr(e):
            kind[id(e)] = None
        elif e.op.kind is OpKind.OWN_KERNEL:
            kind[id(e)] = _OWN_KERNEL
        elif (e.op.lower is None or _touches_packed_fp4(e) or lowering_refusal(e) is not None):
            # (OpKind.ATEN ops have no lowering, except the top-k over small extents: codegen/sort_lowerings.py)
            kind[id(e)] = _EXPR_EVAL
        elif e.op.kind is OpKind.VIEW:
            consumers = [c for o in e.outputs for c in uses.get(id(o), [])]
            is_alias_output = any(id(o) in returned for o in e.outputs)
            feeds_expr_eval = any(kind.get(id(c)) == _EXPR_EVAL for c in consumers)
            # A view only ever read through views (a slice that cat or pad reads at shifted coordinates) is read
            # from memory anyway: as an ATen view it costs no copy, in a kernel it would be written out first.
            # (Unless every reader can recompute it at its own coordinates: a slice that cat reads is then part of
            # the cat's kernel.)
            read_through_views = bool(consumers) and all(
                any(o is m for o in e.outputs for m in memory_operands(c)) for c in consumers) and not all(
                c.op.name in RELOCATING_OPS and e.op.name in ("slice", "select") for c in consumers)
            kind[id(e)] = _EXPR_EVAL if (is_alias_output or feeds_expr_eval or read_through_views) else _KERNEL
        elif e.op.kind is OpKind.INDEXING and memory_operands(e):
            # A gather (index_select) whose every reader reads it at other coordinates (a reshape of the gathered
            # rows) could only be a kernel of its own, written out and read back: ATen does that in the segment
            # of its neighbours instead of adding one.
            consumers = [c for o in e.outputs for c in uses.get(id(o), [])]
            read_through_views = bool(consumers) and all(
                any(o is m for o in e.outputs for m in memory_operands(c)) for c in consumers)
            kind[id(e)] = _EXPR_EVAL if read_through_views else _KERNEL
        else:
            kind[id(e)] = _KERNEL
    return kind


def _one_kernel(exprs: list[Expr], require_covering: bool = True, join_parallel: bool = True) -> bool:
    try:
        build_loop_domain([e for e in exprs if not _is_scalar_expr(e)], require_covering=require_covering,
                          join_parallel=join_parallel)
    except NotFusable:
        return False
    return True


def _split_kernel_group(group: list[Expr]) -> list[list[Expr]]:
    """A greedy kernel group may hold unrelated computations (a [64,65] mask and a [4,64,64] scale): split it
    into dataflow-connected components (they share no values, so any order is valid), then cut each component
    in topological order wherever it stops being one kernel over one iteration space."""
    parent = list(range(len(group)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for i, e in enumerate(group):
        for v in list(e.inputs) + list(e.outputs):
            if isinstance(v, TensorView) or (isinstance(v, Scalar) and not v.is_constant):
                j = owner.setdefault(id(v), i)
                parent[find(i)] = find(j)
    comps: dict[int, list[Expr]] = {}
    for i, e in enumerate(group):
        comps.setdefault(find(i), []).append(e)
    # Host scalar exprs (size, scalar math) join the component that reads their results.
    position = {id(e): i for i, e in enumerate(group)}
    scalar_only = [k for k, c in comps.items() if all(_is_scalar_expr(e) for e in c)]
    for k in scalar_only:
        outs = {id(o) for e in comps[k] for o in e.outputs}
        target = next((c for j, c in comps.items() if j not in scalar_only
                       and any(id(v) in outs for e in c for v in e.inputs)), None)
        if target is not None:
            target.extend(comps.pop(k))
            target.sort(key=lambda e: position[id(e)])
    result = []
    for comp in comps.values():
        rest = comp
        while rest:
            n = _longest_kernel_prefix(rest)
            result.append(rest[:n])
            rest = rest[n:]
    return result


def _merge_neighbour_kernels(pieces: list) -> list:
    """Consecutive kernel pieces become one where the later reads values of the earlier (the greedy pass may
    have placed a producer with unrelated work) or where only joining their iteration spaces makes them one
    kernel (independent computations over equal static extents, segment/loop_domain.py), provided the union is
    one kernel. Other pieces that would be one kernel were kept apart on purpose (work unrelated by data waits for
    its own segment). Consecutive pieces keep every segment reading only values of earlier ones. ``segment_set``
    still ends a segment."""
    out: list = []
    for k, g in pieces:
        if out and k == _KERNEL and out[-1][0] == _KERNEL and out[-1][1][-1].op.name != "segment_set":
            prev = out[-1][1]
            made = {id(o) for e in prev for o in e.outputs}
            reads = any(id(v) in made for e in g for v in e.inputs)
            if (reads or not _one_kernel(prev + g, join_parallel=False)) and _one_kernel(prev + g):
                out[-1] = (k, prev + g)
                continue
        out.append((k, g))
    return out


def _longest_kernel_prefix(exprs: list[Expr]) -> int:
    """The length of the longest prefix of ``exprs`` (topological order) that is one kernel, at least 1. A prefix
    may stop covering one iteration space and cover one again further on (an iota broadcast to [M, E] next to
    ids broadcast to [M, E] share loop dims only once the op comparing them joins), so the search goes on past
    such prefixes and stops only where no longer prefix can be one kernel (different reduction dims, a memory
    read of a value made in the prefix, ...)."""
    best = 1
    for n in range(2, len(exprs) + 1):
        if not _one_kernel(exprs[:n], require_covering=False):
            break
        if _one_kernel(exprs[:n]):
            best = n
    return best


def _kernel_clusters(exprs: list[Expr], kind: dict) -> dict[int, int]:
    """id(kernel expr) -> cluster: kernel exprs connected by tensors that flow between kernel exprs."""
    kernel = [e for e in exprs if kind[id(e)] == _KERNEL]
    parent = {id(e): id(e) for e in kernel}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    producer = {id(o): id(e) for e in kernel for o in e.outputs}
    for e in kernel:
        for v in e.inputs:
            if isinstance(v, TensorView) and id(v) in producer:
                parent[find(id(e))] = find(producer[id(v)])
    return {i: find(i) for i in parent}


def segment_fusion(fusion: Fusion) -> SegmentedFusion:
    # The printing order, not creation order: a definition rebuilt from repr(fd) is then segmented (and computes)
    # exactly as the original (ir/order.py).
    exprs = [s for s in print_order(fusion) if isinstance(s, Expr)]
    kind = classify(fusion)
    producers: dict[int, Expr] = {id(o): e for e in exprs for o in e.outputs}
    deps = {id(e): {id(producers[id(v)]) for v in e.inputs if id(v) in producers} for e in exprs}
    position = {id(e): i for i, e in enumerate(exprs)}
    cluster = _kernel_clusters(exprs, kind)
    # What each kernel cluster waits for outside itself: a cluster that still waits on other work (an ATen view
    # between two of its parts) is not started before one that can run to its end, or it would be cut in two.
    outside: dict[int, set[int]] = {}
    for e in exprs:
        if id(e) in cluster:
            outside.setdefault(cluster[id(e)], set()).update(
                d for d in deps[id(e)] if cluster.get(d) != cluster[id(e)])

    done: set[int] = set()
    groups: list[tuple[str, list[Expr]]] = []
    current_kind: Optional[str] = None
    current: list[Expr] = []
    remaining = list(exprs)
    while remaining:
        ready = [e for e in remaining if deps[id(e)] <= done]
        # Prefer scalar exprs (they fit anywhere), then the current kind; otherwise close the group.
        pick = next((e for e in ready if kind[id(e)] is None), None)
        if pick is None:
            same = [e for e in ready if kind[id(e)] == current_kind]
            if current_kind == _KERNEL:
                # Only work connected to the group (through other kernel work) joins it: an unrelated ready
                # computation waits for the segment its own data flows into.
                here = {cluster[id(x)] for x in current if id(x) in cluster}
                same = [e for e in same if (not here or cluster[id(e)] in here)
                        and _one_kernel(current + [e], require_covering=False)]
            pick = same[0] if same else None
        if pick is None:
            unblocked = [e for e in ready if id(e) not in cluster or outside[cluster[id(e)]] <= done]
            pick = min(unblocked or ready, key=lambda e: position[id(e)])
            if current_kind is not None:  # a group of only scalar exprs simply takes on the new kind
                groups.append((current_kind, current))
                current = []
            current_kind = kind[id(pick)]
        current.append(pick)
        done.add(id(pick))
        remaining.remove(pick)
        if current_kind is None and kind[id(pick)] is not None:
            current_kind = kind[id(pick)]
        if pick.op.name == "segment_set" or current_kind == _OWN_KERNEL:
            groups.append((current_kind, current))
            current_kind, current = None, []
    if current:
        groups.append((current_kind, current))

    split = []
    for k, g in groups:
        split.extend((k, piece) for piece in (_split_kernel_group(g) if k == _KERNEL else [g]))
    split = _merge_neighbour_kernels(split)
    split, prologues = _merge_prologues(fusion, split)
    split, counting_sorts = merge_counting_sorts(fusion, split, _EXPR_EVAL, _KERNEL, _COUNTING_SORT)
    segments = [Segment(i, _scheduler_kind(k, g), g) for i, (k, g) in enumerate(split)]
    for seg in segments:
        if id(seg.exprs[-1]) in prologues:
            seg.prologue_exprs, seg.prologue_outputs = prologues[id(seg.exprs[-1])]
        seg.counting_sort = counting_sorts.get(id(seg.exprs[0])) if seg.kind is SchedulerKind.COUNTING_SORT else None
    _wire(fusion, segments)
    return SegmentedFusion(fusion, segments)


def _merge_prologues(fusion: Fusion, pieces: list) -> tuple[list, dict]:
    """Each hand-written kernel op that takes a load prologue on an input (``info["prologue_input"]``, an argument
    position) absorbs the kernel piece producing that input when the piece is pointwise (no reduction, scan or
    selection: the prologue computes single elements at the coordinates the op asks for), everything it makes is
    read only by that op, once, and nothing of it is returned or aliased. The piece moves to the op's place (its
    values are read by nothing in between). Returns the pieces and id(op expr) -> (prologue exprs, [input])."""
    uses = fusion.uses()
    returned = {id(v) for v in fusion.all_outputs()} | {id(v) for pair in fusion.aliases for v in pair}
    producer_piece: dict[int, int] = {}
    for j, (k, g) in enumerate(pieces):
        if k == _KERNEL:
            for e in g:
                for o in e.outputs:
                    producer_piece[id(o)] = j
    merged: dict[int, tuple] = {}
    absorbed: dict[int, int] = {}  # piece index -> index of the op piece that takes it
    for i, (k, g) in enumerate(pieces):
        ops = [e for e in g if not _is_scalar_expr(e)]
        if k != _OWN_KERNEL or len(ops) != 1:
            continue
        op = ops[0]
        pos = op.info.get("prologue_input")
        if pos is None or pos >= len(op.args) or not isinstance(op.args[pos], TensorView):
            continue
        v = op.args[pos]
        j = producer_piece.get(id(v))
        if j is None or j in absorbed:
            continue
        piece = pieces[j][1]
        if not _prologue_piece(piece, v, op, uses, returned):
            continue
        absorbed[j] = i
        merged[id(op)] = (list(piece), [v])
    if not absorbed:
        return pieces, {}
    out = []
    for i, (k, g) in enumerate(pieces):
        if i in absorbed:
            continue
        ops = [e for e in g if not _is_scalar_expr(e)]
        if k == _OWN_KERNEL and len(ops) == 1 and id(ops[0]) in merged:
            g = merged[id(ops[0])][0] + [e for e in g if e is not ops[0]] + [ops[0]]  # the op last
        out.append((k, g))
    return out, merged


def _prologue_piece(piece: list[Expr], v: TensorView, op: Expr, uses: dict, returned: set) -> bool:
    """Whether the kernel piece ``piece`` may become ``op``'s load prologue for its input ``v`` (above)."""
    made = {id(o) for e in piece for o in e.outputs}
    inside = {id(e) for e in piece}
    for e in piece:
        if column_dims(e) or e.op.kind is OpKind.SCAN or e.op.name == "segment_set":
            return False
        for o in e.outputs:
            if id(o) in returned:
                return False
            outside = [c for c in uses.get(id(o), []) if id(c) not in inside]
            if outside and (o is not v or len(outside) != 1 or outside[0] is not op):
                return False
    # ``v`` is read once by the op (not also as another of its operands).
    return id(v) in made and sum(1 for x in op.inputs if x is v) == 1


def _scheduler_kind(kind: Optional[str], exprs: list[Expr]) -> SchedulerKind:
    if kind == _EXPR_EVAL or kind is None:
        return SchedulerKind.EXPR_EVAL
    if kind == _OWN_KERNEL:  # scheduled like a pointwise op over its input (layout_op.md)
        return SchedulerKind.POINTWISE
    if kind == _COUNTING_SORT:
        return SchedulerKind.COUNTING_SORT
    reductions = [e for e in exprs if column_dims(e)]
    if not reductions:
        return SchedulerKind.POINTWISE
    # A normalization (softmax, layer norm) combines a reduction's result with values that still vary along
    # the reduced dims, so the rows stay resident ("persistent") while they are reused; a plain reduction (with
    # or without a per-row epilogue) does not.
    dom = build_loop_domain([e for e in exprs if not _is_scalar_expr(e)])
    derived = {id(o) for e in reductions for o in e.outputs}
    for e in exprs:
        if any(id(v) in derived for v in e.inputs):
            derived.update(id(o) for o in e.outputs)
            if any(isinstance(o, TensorView) and dom.has_col(o) for o in e.outputs):
                return SchedulerKind.INNER_PERSISTENT
    return SchedulerKind.REDUCTION


def _wire(fusion: Fusion, segments: list[Segment]) -> None:
    """Fill each segment's inputs (values from outside) and outputs (values needed outside)."""
    produced_in: dict[int, int] = {}
    for seg in segments:
        for e in seg.exprs:
            for o in e.outputs:
                produced_in[id(o)] = seg.index
                if isinstance(o, Vector):
                    for el in o.elements:
                        produced_in[id(el)] = seg.index
    needed_outside: dict[int, set[int]] = {}
    for seg in segments:
        seen: set[int] = set()
        for e in seg.exprs:
            for v in e.inputs:
                if isinstance(v, Vector) or (isinstance(v, Scalar) and v.is_constant):
                    continue
                src = produced_in.get(id(v))
                if src != seg.index and id(v) not in seen:
                    seen.add(id(v))
                    seg.inputs.append(v)
                    if src is not None:
                        needed_outside.setdefault(src, set()).add(id(v))
    returned = fusion.all_outputs() + [a for _, a in fusion.aliases]
    for v in returned:
        src = produced_in.get(id(v))
        if src is not None:
            needed_outside.setdefault(src, set()).add(id(v))
    for seg in segments:
        wanted = needed_outside.get(seg.index, set())
        seg.outputs = [
            o for e in seg.exprs for o in e.outputs if id(o) in wanted and isinstance(o, (TensorView, Scalar))
        ]
