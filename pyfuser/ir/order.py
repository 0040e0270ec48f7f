"""The canonical order of a fusion's statements: nvFuser's printing order.

``repr(fd)`` prints statements in this order, and the segmenter walks the expressions in it, so a definition and
the one rebuilt from its printed text (whose creation order *is* this order) are segmented, and therefore
computed, identically: same kernels, same reduction orders, same bits. The order depends only on the inputs,
the outputs and what each expression reads, except for expressions no output depends on (creation order)."""

from __future__ import annotations

from .fusion import Fusion
from .nodes import Expr, Vector


def print_order(fusion: Fusion) -> list:
    """The statements in nvFuser's printing order: declared values (inputs, non-inline constants, vectors) in
    creation order, then the expressions depth first from the outputs (each output in turn, an expression's
    inputs in argument order before it, so an expression follows right after the last one it needs), then any
    expression no output depends on, in creation order. Names stay in creation order (``printed_names``).

    Only the outputs that no other output depends on start a walk, as nvFuser's topological sort does; an
    output that feeds another one is reached from it. A declared vector holding computed scalars is printed
    where the walk first needs it, after them."""
    late = {id(s) for s in fusion.statements
            if isinstance(s, Vector) and s.defined_by is None and any(e.defined_by is not None for e in s.elements)}
    declared = [s for s in fusion.statements if not isinstance(s, Expr) and id(s) not in late]

    def deps(stmt) -> list:
        vals = stmt.inputs if isinstance(stmt, Expr) else stmt.elements
        return [v if id(v) in late else v.defined_by for v in vals
                if v.defined_by is not None or id(v) in late]

    outputs = [v for v, _ in fusion.output_log]
    feeds_output = _values_feeding(outputs)
    roots = [v.defined_by for v in dict.fromkeys(outputs) if id(v) not in feeds_output and v.defined_by is not None]
    ordered: list = []
    done: set = set()
    for root in roots:
        stack = [(root, False)]
        while stack:
            stmt, deps_done = stack.pop()
            if id(stmt) in done:
                continue
            if deps_done:
                done.add(id(stmt))
                ordered.append(stmt)
                continue
            stack.append((stmt, True))
            stack.extend((d, False) for d in reversed(deps(stmt)) if id(d) not in done)
    ordered += [s for s in fusion.statements if id(s) not in done and (isinstance(s, Expr) or id(s) in late)]
    return declared + ordered


def _values_feeding(outputs) -> set:
    """ids of the values some output is computed from (the outputs themselves excluded unless they feed one)."""
    seen: set = set()
    stack = [v for out in outputs if out.defined_by is not None for v in out.defined_by.inputs]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if v.defined_by is not None:
            stack.extend(v.defined_by.inputs)
        if isinstance(v, Vector):
            stack.extend(v.elements)
    return seen
