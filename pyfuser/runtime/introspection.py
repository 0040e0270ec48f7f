"""What ran: one report per segment of a runtime, and PYFUSER_DUMP.

``fd.last_execution()`` returns the reports of the runtime the last ``execute`` used: each segment's scheduler
kind, whether it ran as a generated Triton kernel (with its name and source) or on ATen (with the reason), and
the layout of every tensor at its boundary (inputs and outputs).

``PYFUSER_DUMP=segments,kernels`` prints the reports (``segments``) and the kernel sources (``kernels``) when a
runtime is built; with ``PYFUSER_DUMP_DIR=<folder>`` they are written there instead, one file per runtime and
kernel.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from ..ir.nodes import TensorView
from .layouts import TensorLayout


@dataclass
class SegmentReport:
    index: int
    kind: str  # scheduler kind: ExprEval, PointWise, Reduction, InnerPersistent
    runs_as: str  # "triton" (generated kernel), "op kernel" (an op's hand-written Triton kernel) or "aten"
    reason: str  # why ATen, when it is ATen
    kernel_name: Optional[str]
    kernel_source: Optional[str]
    ops: list[str]
    inputs: dict[str, Optional[TensorLayout]] = field(default_factory=dict)
    outputs: dict[str, Optional[TensorLayout]] = field(default_factory=dict)
    steps: list = field(default_factory=list)  # the plan's steps.StepReport for this segment, in run order

    def __str__(self) -> str:
        how = {"triton": f"triton kernel {self.kernel_name}",
               "op kernel": f"hand-written Triton kernel ({self.reason})"}.get(self.runs_as, f"aten ({self.reason})")
        lines = [f"segment {self.index} [{self.kind}] runs as {how}: {', '.join(self.ops)}"]
        lines += [f"  in  {n}: {lay}" for n, lay in self.inputs.items()]
        lines += [f"  out {n}: {lay}" for n, lay in self.outputs.items()]
        lines += [f"  step {st.kind}: {st.name}" + (f" ({st.reason})" if st.reason and st.kind == "aten" else "")
                  for st in self.steps]
        return "\n".join(lines)


def reports(runtime) -> list[SegmentReport]:
    """One report per segment, from what its plan steps say about themselves (steps.StepReport)."""
    result = []
    for seg, steps, reason in zip(runtime.segments, runtime.plan.reports(), runtime.plan.segment_reasons):
        triton = next((s for s in steps if s.kind == "triton"), None)
        own = [s.name for s in steps if s.kind == "op kernel"]
        runs_as = "triton" if triton is not None else ("op kernel" if own else "aten")
        result.append(
            SegmentReport(
                index=seg.index,
                kind=seg.kind.value,
                runs_as=runs_as,
                reason=", ".join(own) if own else ("" if triton is not None else reason),
                kernel_name=None if triton is None else triton.name,
                kernel_source=None if triton is None else triton.source,
                ops=[e.op.name for e in seg.exprs],
                inputs={v.name: runtime.layouts.get(id(v)) for v in seg.inputs if isinstance(v, TensorView)},
                outputs={v.name: runtime.layouts.get(id(v)) for v in seg.outputs if isinstance(v, TensorView)},
                steps=steps,
            )
        )
    return result


_dump_count = 0


def dump(runtime) -> None:
    """Honour PYFUSER_DUMP / PYFUSER_DUMP_DIR for a newly built runtime."""
    global _dump_count
    what = {w.strip() for w in os.environ.get("PYFUSER_DUMP", "").split(",") if w.strip()}
    if not what:
        return
    folder = os.environ.get("PYFUSER_DUMP_DIR")
    _dump_count += 1
    reps = reports(runtime)
    texts = {}
    if "segments" in what:
        texts[f"runtime{_dump_count}_segments.txt"] = "\n".join(map(str, reps)) + "\n"
    if "kernels" in what:
        for r in reps:
            if r.kernel_source is not None:
                texts[f"{r.kernel_name}.py"] = r.kernel_source
    for name, text in texts.items():
        if folder:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        else:
            print(f"# ---- {name}\n{text}")
