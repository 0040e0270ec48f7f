"""The counting-sort segment: a 1-D stable argsort of small-range integer keys, with what else reads only its keys
and their counts, in one hand-written kernel launch (kernels/counting_sort.py).

The rule (applied to the pieces the segmenter has cut, segment/segmenter.py):

1. **The sort.** ``perm = argsort(keys, dim=0, stable=True)`` (ascending) over 1-D Int/Int32 keys whose values the
   IR proves to lie in ``[0, n)`` (ops/value_range.py: top-k indices, argsort results, views and copies of them).
   ATen would run it (today's Triton argsort lowering takes rows of at most 256, not 1-D tensors). The number of
   bins ``n`` may be known only at run time; more than ``kernels.counting_sort.MAX_BINS`` runs on ATen then.
2. **Its inverse** (optional): ``argsort(perm, dim=0)`` ascending, stable or not (perm's values are distinct, so
   every sort gives the same result): each element's position, which the counting sort computes anyway.
3. **The histogram** (optional): a kernel piece that is exactly the one-hot count of the same keys,
   ``sum(cast(eq(broadcast_in_dim(keys, [M, E], [0]), broadcast_in_dim(iota(E), [M, E], [1]))), dims=[0])``
   (the eq's operands in either order, the cast to an integer dtype or absent, iota from 0 by 1 of an integer
   dtype, an integer sum), none of its intermediate values read elsewhere. The kernel counts the keys anyway.
4. **The epilogue** (optional): the rest of the histogram's piece (the reduction's per-row epilogue) if it has
   one, else the first later kernel piece that reads the counts, all of whose other inputs exist before the
   argsort's piece (or come from the sort): generated as usual and run as a function at the end of the same
   launch when it is one program (codegen/epilogue.py), else launched after it in the same segment.

The segment takes the argsort's place. The other ATen work of the argsort's piece runs around the kernel: before
it what does not read the sort's results (the reshape making the keys), after it what does.

On the MoE layer this makes segments 3 (argsorts), 4 (counts) and 5 (offset scans) of docs/codegen.md's table one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..ir.dtypes import DataType, is_integral
from ..ir.nodes import Expr, Scalar, TensorView, Vector
from ..ops.value_range import IndexRange, index_range

_KEY_DTYPES = (DataType.Int, DataType.Int32)


@dataclass
class CountingSortGroup:
    argsort: Expr  # perm = argsort(keys, dim=0, stable=True)
    keys: TensorView
    key_range: IndexRange
    inverse: Optional[Expr] = None  # argsort(perm)
    histogram: list[Expr] = field(default_factory=list)  # the one-hot count's exprs, the sum last
    epilogue: list[Expr] = field(default_factory=list)  # a kernel piece reading the counts
    pre: list[Expr] = field(default_factory=list)  # ATen work of the argsort's piece run before the kernel
    post: list[Expr] = field(default_factory=list)  # ... and after it

    @property
    def perm(self) -> TensorView:
        return self.argsort.outputs[0]

    @property
    def inv(self) -> Optional[TensorView]:
        return self.inverse.outputs[0] if self.inverse is not None else None

    @property
    def counts(self) -> Optional[TensorView]:
        return self.histogram[-1].outputs[0] if self.histogram else None

    def exprs(self) -> list[Expr]:
        """Every expr of the segment, in an order that runs them one by one (the ATen fallback's order)."""
        sort = [self.argsort] + ([self.inverse] if self.inverse is not None else [])
        return self.pre + sort + self.histogram + self.epilogue + self.post

    def planned_tensors(self) -> list[TensorView]:
        """Tensors inside the segment whose layouts its plan needs (meta inference records them): the tensor whose
        extent bounds the keys, and what the epilogue reads from the sort."""
        made = [t for t in (self.perm, self.inv, self.counts) if t is not None]
        return [self.key_range.source] + made


def is_counting_sort(e: Expr) -> bool:
    """Rule 1: a stable ascending argsort of 1-D Int/Int32 keys with a proven index range."""
    if e.op.name != "argsort" or e.kwargs.get("stable") is not True or e.kwargs.get("descending", False):
        return False
    keys = e.args[0]
    return keys.ndim == 1 and keys.dtype in _KEY_DTYPES and index_range(keys) is not None


def _is_inverse(e: Expr, perm: TensorView) -> bool:
    return e.op.name == "argsort" and e.args[0] is perm and not e.kwargs.get("descending", False)


def _defined_by(v, name: str) -> Optional[Expr]:
    e = v.defined_by if isinstance(v, TensorView) else None
    return e if e is not None and e.op.name == name else None


def _const(x, default) -> Optional[int]:
    if x is None:
        return default
    if isinstance(x, Scalar):
        return x.value
    return x


def match_histogram(piece: list[Expr], keys: TensorView, uses: dict, returned: set) -> Optional[list[Expr]]:
    """Rule 3: the exprs of the one-hot count of ``keys`` in the piece, in order (the sum last), if it has one."""
    sums = [e for e in piece if e.op.name == "sum"]
    if len(sums) != 1:
        return None
    s = sums[0]
    if list(s.kwargs.get("dims", [])) != [0] or s.kwargs.get("keepdim") or not is_integral(s.outputs[0].dtype):
        return None
    chain = [s]
    x = s.args[0]
    cast = _defined_by(x, "cast")
    if cast is not None:
        if not is_integral(x.dtype):
            return None
        chain.append(cast)
        x = cast.args[0]
    eq = _defined_by(x, "eq")
    if eq is None or x.ndim != 2:
        return None
    chain.append(eq)
    a, b = eq.args
    bk, bi = _defined_by(a, "broadcast_in_dim"), _defined_by(b, "broadcast_in_dim")
    if bk is None or bi is None:
        return None
    if bk.args[0] is not keys:
        bk, bi = bi, bk
    if bk.args[0] is not keys or list(bk.kwargs["broadcast_dims"]) != [0]:
        return None
    if list(bi.kwargs["broadcast_dims"]) != [1]:
        return None
    iota = _defined_by(bi.args[0], "iota")
    if iota is None or not is_integral(iota.outputs[0].dtype):
        return None
    start = _const(iota.args[1] if len(iota.args) > 1 else iota.kwargs.get("start"), 0)
    step = _const(iota.args[2] if len(iota.args) > 2 else iota.kwargs.get("step"), 1)
    if start != 0 or step != 1:
        return None
    chain += [bk, bi, iota]
    exprs = {id(e) for e in chain}
    if not exprs <= {id(e) for e in piece}:
        return None
    for e in chain[1:]:  # intermediates: read by nothing outside the chain, not returned
        for o in e.outputs:
            if id(o) in returned or any(id(c) not in exprs for c in uses.get(id(o), [])):
                return None
    return [e for e in piece if id(e) in exprs]


def split_around(piece: list[Expr], sort: list[Expr]) -> tuple[list[Expr], list[Expr]]:
    """The rest of the argsort's piece: (exprs not reading the sort's results, exprs that do), in order."""
    tainted = {id(o) for e in sort for o in e.outputs}
    inside = {id(e) for e in sort}
    pre, post = [], []
    for e in piece:
        if id(e) in inside:
            continue
        if any(id(v) in tainted for v in e.inputs):
            tainted.update(id(o) for o in e.outputs)
            post.append(e)
        else:
            pre.append(e)
    return pre, post


def merge_counting_sorts(fusion, pieces: list, expr_eval: str, kernel: str, kind: str) -> tuple[list, dict]:
    """Applies the rule to ``pieces`` ([(kind, exprs)] in a valid order; ``expr_eval``/``kernel`` name the kinds).
    Returns the pieces, each group's segment of kind ``kind`` in its argsort's place, and id(first expr of that
    segment) -> CountingSortGroup."""
    uses = fusion.uses()
    returned = {id(v) for v in fusion.all_outputs()} | {id(v) for pair in fusion.aliases for v in pair}
    groups: dict = {}
    i = 0
    while i < len(pieces):
        k, piece = pieces[i]
        argsort = next((e for e in piece if is_counting_sort(e)), None) if k == expr_eval else None
        if argsort is None:
            i += 1
            continue
        keys = argsort.args[0]
        group = CountingSortGroup(argsort, keys, index_range(keys))
        group.inverse = next((e for e in piece if _is_inverse(e, group.perm)), None)
        sort = [argsort] + ([group.inverse] if group.inverse is not None else [])
        group.pre, group.post = split_around(piece, sort)
        # What exists when the segment's kernel runs: everything made by earlier pieces, the pre work, the sort.
        available = {id(o) for _, g in pieces[:i] for e in g for o in e.outputs}
        available |= {id(o) for e in group.pre + sort for o in e.outputs}
        taken = []
        for j in range(i + 1, len(pieces)):
            if pieces[j][0] != kernel:
                continue
            hist = match_histogram(pieces[j][1], keys, uses, returned)
            if hist is None or not all(_ready(e, available, hist) for e in hist):
                continue
            # The rest of the piece (a reduction's per-row epilogue: work on the counts) is the epilogue.
            rest = [e for e in pieces[j][1] if not any(e is h for h in hist)]
            if rest and not all(_ready(e, available | {id(o) for h in hist for o in h.outputs}, rest) for e in rest):
                continue
            group.histogram, group.epilogue = hist, rest
            available.add(id(group.counts))
            taken.append(j)
            break
        if group.counts is not None and not group.epilogue:
            for j in range(taken[0] + 1, len(pieces)):
                g = pieces[j][1]
                if pieces[j][0] != kernel or not any(group.counts is v for e in g for v in e.inputs):
                    continue
                if all(_ready(e, available, g) for e in g) and not any(e.op.name == "segment_set" for e in g):
                    group.epilogue = list(g)
                    taken.append(j)
                break
        exprs = group.exprs()
        groups[id(exprs[0])] = group
        pieces = ([*pieces[:i], (kind, exprs)]
                  + [p for j, p in enumerate(pieces) if j > i and j not in taken])
        i += 1
    return pieces, groups


def _ready(e: Expr, available: set, piece: list[Expr]) -> bool:
    """Whether ``e``'s inputs exist before the piece runs or are made inside it (fusion inputs, constants)."""
    made = {id(o) for x in piece for o in x.outputs}
    for v in e.inputs:
        if isinstance(v, Vector) or (isinstance(v, Scalar) and v.is_constant):
            continue
        if id(v) in made or id(v) in available or v.defined_by is None:
            continue
        return False
    return True
