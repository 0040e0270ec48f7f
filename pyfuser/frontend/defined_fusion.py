"""The Fusion a FusionDefinition builds, with nvFuser's introspection methods on top of the IR container.

nvFuser's ``Fusion`` exposes ``inputs()``, ``outputs()``, ``vals()``, ``print_math()`` and ``print_kernel()``
and compares structurally (``fd1.fusion == fd2.fusion``). Our IR keeps ``inputs``/``outputs`` as lists that the
runtime reads as attributes, so they become lists that can also be called.
"""

from __future__ import annotations

import weakref
from typing import Optional

from ..errors import FusionDefinitionError
from ..ir.fusion import Fusion
from ..ir.nodes import Expr, Val, Vector


class ValList(list):
    """A list of Vals that answers ``fusion.inputs()`` (nvFuser) as well as ``fusion.inputs`` (our IR)."""

    def __call__(self) -> list:
        return list(self)


class DefinedFusion(Fusion):
    def __init__(self):
        super().__init__()
        self.inputs = ValList()
        self.outputs = ValList()
        # The executor that runs this fusion (set by the frontend), for print_kernel; weak so that a cached
        # executor does not keep itself alive through its own fusion.
        self._executor_ref: Optional[weakref.ref] = None

    # --- nvFuser's introspection -------------------------------------------------------------------------
    def vals(self) -> list[Val]:
        """Every value of the fusion in definition order: inputs, constants, vectors and op outputs."""
        seen: set[int] = set()
        result: list[Val] = []

        def add(v):
            if isinstance(v, Val) and id(v) not in seen:
                seen.add(id(v))
                result.append(v)

        for stmt in self.statements:
            if isinstance(stmt, Expr):
                for o in stmt.outputs:
                    add(o)
            else:
                add(stmt)
                if isinstance(stmt, Vector):
                    for e in stmt.elements:
                        add(e)
        return result

    def print_math(self) -> str:
        """The fusion's math as text: inputs with dtype and shape, one line per op, outputs."""
        from .math_printer import math_text

        return math_text(self)

    def print_kernel(self) -> str:
        """The source of the Triton kernels the most recent execution ran (ATen segments named as such)."""
        executor = None if self._executor_ref is None else self._executor_ref()
        runtime = None if executor is None else executor.last_runtime
        if runtime is None:
            raise FusionDefinitionError(
                "print_kernel: this fusion has not been executed yet; pyfuser generates its kernels for the first "
                "inputs it runs with (call fd.execute(inputs) first)"
            )
        parts = []
        for report in runtime.describe():
            if report.kernel_source is not None:
                parts.append(f"# segment {report.index} [{report.kind}]: Triton kernel {report.kernel_name}\n"
                             + report.kernel_source)
            else:
                why = f" ({report.reason})" if report.reason else ""
                parts.append(f"# segment {report.index} [{report.kind}]: runs on {report.runs_as}{why}: "
                             + ", ".join(report.ops))
        return "\n\n".join(parts) + "\n"

    def is_frozen(self) -> bool:
        return self.frozen

    # --- structural equality (nvFuser compares fusions, LRUCache keys on it) ----------------------------
    def structural_key(self) -> str:
        from .printer import fusion_to_python

        return fusion_to_python(self)

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if not isinstance(other, DefinedFusion):
            return NotImplemented
        # Only finished definitions compare by structure: an open one can still change.
        if not (self.frozen and other.frozen):
            return False
        return self.structural_key() == other.structural_key()

    def __hash__(self) -> int:
        # Consistent with __eq__ for finished definitions; an open definition is only equal to itself.
        return hash(self.structural_key()) if self.frozen else id(self)
