"""A Fusion: the container of a definition's inputs, expressions, outputs and in-place aliases."""

from __future__ import annotations

import threading
from typing import Optional

from .nodes import Expr, Scalar, TensorView, Val, Vector

_current = threading.local()


class Fusion:
    """Statements are kept in creation order, which is a topological order (an op only consumes existing Vals).

    ``statements`` interleaves defined Vals (inputs, constants, vectors) and Exprs; the printer walks it.
    """

    def __init__(self):
        self._counter = 0
        self.statements: list = []
        self.inputs: list[Val] = []
        self.outputs: list[Val] = []  # returned outputs, in add_output order
        self.aliases: list[tuple[Val, TensorView]] = []  # (value, input it is written into), in order
        self.output_log: list[tuple[Val, Optional[TensorView]]] = []  # every add_output call, for printing
        self.frozen = False
        # Some tensor has a device mesh (set by pyfuser.distributed): the fusion runs sharded, through
        # fd.execute / execute_with_dtensors only.
        self.has_device_mesh = False

    # --- construction ------------------------------------------------------------------------------------
    def _new_name(self, prefix: str) -> str:
        name = f"{prefix}{self._counter}"
        self._counter += 1
        return name

    def _check_open(self):
        if self.frozen:
            from ..errors import FusionDefinitionError

            raise FusionDefinitionError(
                "this fusion is finalized: define ops inside the `with FusionDefinition()` block"
            )

    def add_statement(self, stmt) -> None:
        self._check_open()
        self.statements.append(stmt)

    def add_input(self, val: Val) -> None:
        self._check_open()
        self.inputs.append(val)

    def add_expr(self, expr: Expr) -> None:
        self.add_statement(expr)

    def add_output(self, val: Val, alias_input: Optional[TensorView] = None) -> None:
        self._check_open()
        self.output_log.append((val, alias_input))
        if alias_input is None:
            self.outputs.append(val)
        else:
            self.aliases.append((val, alias_input))

    # --- queries ------------------------------------------------------------------------------------------
    @property
    def exprs(self) -> list[Expr]:
        return [s for s in self.statements if isinstance(s, Expr)]

    def all_outputs(self) -> list[Val]:
        """Returned outputs followed by alias-only outputs (deduplicated)."""
        seen = {id(v) for v in self.outputs}
        extra = [v for v, _ in self.aliases if id(v) not in seen]
        return list(self.outputs) + extra

    def uses(self) -> dict[int, list[Expr]]:
        """Map id(val) -> consuming exprs."""
        result: dict[int, list[Expr]] = {}
        for e in self.exprs:
            for v in e.inputs:
                result.setdefault(id(v), []).append(e)
        return result


def current_fusion(required: bool = True) -> Optional[Fusion]:
    fusion = getattr(_current, "fusion", None)
    if fusion is None and required:
        from ..errors import FusionDefinitionError

        raise FusionDefinitionError("no active fusion: call fd.ops.* inside `with FusionDefinition() as fd:`")
    return fusion


class FusionGuard:
    """Makes a fusion current for the ops namespace (nested guards restore the previous one)."""

    def __init__(self, fusion: Fusion):
        self.fusion = fusion
        self.prev = None

    def __enter__(self):
        self.prev = getattr(_current, "fusion", None)
        _current.fusion = self.fusion
        return self.fusion

    def __exit__(self, *exc):
        _current.fusion = self.prev
        return False


__all__ = ["Fusion", "FusionGuard", "current_fusion", "Scalar", "Vector", "TensorView"]


def external_inputs(exprs: list) -> list:
    """The values ``exprs`` read that none of them makes (constants and vectors aside), in first-read order."""
    made = {id(o) for e in exprs for o in e.outputs}
    inputs, seen = [], set()
    for e in exprs:
        for v in e.inputs:
            if isinstance(v, Vector) or (isinstance(v, Scalar) and v.is_constant):
                continue
            if id(v) not in made and id(v) not in seen:
                seen.add(id(v))
                inputs.append(v)
    return inputs
