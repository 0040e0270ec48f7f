"""Chained epilogues: a generated single-program kernel run at the end of a hand-written kernel's launch.

A hand-written kernel that runs as one program (the counting sort, kernels/counting_sort.py) may finish with the
work that reads what it just wrote, when that work is itself a generated kernel of one program: the generated
kernel is called as a function from the hand-written one, after a CTA-wide barrier, instead of being launched on
its own. Its source is unchanged (the same plan, the same lowering and compile options); a wrapper

    @triton.jit
    def pf_epilogue_<hash>(A):
        pf_persistent_<hash>(A[0], ..., A[n - 1], BLOCK_R, BLOCK_C)

passes it its arguments from one tuple (pointers, scalars, the plan's fixed integers) and its block sizes as
constants. Inside the call ``tl.program_id(0)`` is 0, the only program the generated kernel's grid has.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..segment.loop_domain import NotFusable
from .plan import KernelPlan


@dataclass
class EpiloguePlan:
    name: str  # the wrapper's name
    source: str  # the generated kernel's source plus the wrapper
    kernel: KernelPlan


def plan_epilogue(plan: KernelPlan) -> EpiloguePlan:
    """The wrapper of ``plan``'s kernel; NotFusable when it cannot run inside another program's launch."""
    if plan.grid != (1,):
        raise NotFusable(f"the epilogue kernel {plan.name} needs {plan.grid[0]} programs, not one")
    if plan.checks:  # (its error flags would need the call's run context and a slot of their own)
        raise NotFusable(f"the epilogue kernel {plan.name} has run-time checks")
    n = len(plan.inputs) + len(plan.outputs) + len(plan.scalar_vals) + len(plan.fixed_args)
    call_args = ", ".join([f"A[{i}]" for i in range(n)] + [str(plan.block_r), str(plan.block_c)])
    body = f"@triton.jit\ndef EPILOGUE(A):\n    {plan.name}({call_args})\n"
    name = "pf_epilogue_" + hashlib.sha1((plan.name + body).encode()).hexdigest()[:12]
    return EpiloguePlan(name, plan.source + "\n\n" + body.replace("def EPILOGUE(", f"def {name}("), plan)
