"""``fd.validate`` / ``fd.manual_validate``: compare a fusion's outputs with references.

Tolerances follow nvFuser's validator:

- by output dtype, from tables of errors measured for randn + add + sum against double precision (float, also
  used for double and complex: 1.7e-6 at 4 elements up to 3.4e-3 at 2M; half: 3.9e-3 up to 4.0). BFloat16 uses
  the half table times 10 (8 bits of mantissa against Half's 11); outputs of 1-byte floats at least 0.125.
- by reduction size: each tensor an op computes carries the product of the extents it reduces (a reduction's
  reduced dims, matmul/linear's K, a scan's dim) times the largest reduction size among its tensor operands,
  so chained reductions multiply (a sum of 4096 fed by another sum of 4096 counts 16M).
- with a reduction the next table entry up is the absolute tolerance (twice the last entry past the table)
  and 1% of it the relative one; an output with no reduction uses the first two entries as (atol, rtol).

``atol``/``rtol`` given by the caller override them.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch


def reference_run(fusion, inputs: Sequence[Any]) -> tuple[list, list[int]]:
    """The fusion evaluated op by op with ATen on copies of ``inputs``, and each output's reduction size."""
    from ..runtime.evaluator import bind_inputs, collect_outputs, run_exprs
    from ..runtime.validation import InputBinder

    flat = InputBinder(fusion).bind(fake_free_copies(inputs))
    env = bind_inputs(fusion, flat)
    with torch.no_grad():
        run_exprs(fusion.exprs, env)
        outputs = collect_outputs(fusion, env)
    return outputs, reduction_sizes(fusion, env)


def fake_free_copies(inputs: Sequence[Any]) -> list:
    """Copies of the inputs for the reference evaluation: aliased outputs write into their inputs, and the
    reference must not see (or cause) those writes. Each copy keeps its input's sizes and strides (stride-0
    expanded dims included), so it binds to the definition exactly as the input does."""
    return [same_layout_copy(x) if isinstance(x, torch.Tensor) else copy.deepcopy(x) for x in inputs]


def same_layout_copy(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` with its sizes and strides. ``clone()`` keeps the strides of dense tensors only: it would
    materialize a stride-0 (expanded) dim, which the definition may declare as an expanded broadcast, and make
    a sliced tensor row-major whatever its declared stride order."""
    if x.numel() == 0:
        return x.clone()
    # The memory x addresses, from its first element to its last (torch strides are never negative), copied
    # and viewed with x's sizes and strides. A negative or conjugate view's bits are resolved by the clone.
    span = 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride()))
    flat = x.as_strided((span,), (1,), x.storage_offset()).clone()
    return flat.as_strided(x.shape, x.stride())


# (reduction size, max abs error measured): float32 (also used for double and complex), and half / bfloat16.
_SUM_TOL_FLOAT = ((4, 1.68222e-06), (8, 2.23704e-06), (16, 2.95788e-06), (32, 4.4778e-06), (64, 6.75395e-06),
                  (128, 8.57934e-06), (256, 1.30594e-05), (512, 2.19122e-05), (1024, 3.3451e-05),
                  (2048, 5.78476e-05), (4096, 0.000108292), (8192, 0.00012207), (16384, 0.000136882),
                  (32768, 0.000248561), (65536, 0.000407594), (131072, 0.000500901), (262144, 0.000923019),
                  (524288, 0.00156909), (1048576, 0.00223107), (2097152, 0.00343043))
_SUM_TOL_HALF = ((4, 0.00390625), (8, 0.0078125), (16, 0.0078125), (32, 0.0155334), (64, 0.0156269),
                 (128, 0.0312042), (256, 0.0312548), (512, 0.0619979), (1024, 0.0625103), (2048, 0.124686),
                 (4096, 0.12501), (8192, 0.24945), (16384, 0.250049), (32768, 0.498946), (65536, 0.500071),
                 (131072, 0.985087), (262144, 1.00006), (524288, 1.99234), (1048576, 2.00032), (2097152, 3.99073))


def tolerance(dtype: torch.dtype, reduction_size: int) -> tuple[float, float]:
    """(atol, rtol) for an output of ``dtype`` computed through ``reduction_size`` reduced elements."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return 0.0, 0.0  # integers and bools: exact
    coarse = dtype == torch.bfloat16 or dtype.itemsize == 1
    table = _SUM_TOL_HALF if dtype == torch.float16 or coarse else _SUM_TOL_FLOAT
    if reduction_size <= 1:
        atol, rtol = table[0][1], table[1][1]
    else:
        entry = next((i for i, (n, _) in enumerate(table) if n >= reduction_size), len(table))
        atol = table[entry + 1][1] if entry + 1 < len(table) else table[-1][1] * 2.0
        atol, rtol = (atol * 10.0, atol * 0.1) if coarse else (atol, atol * 0.01)
    if dtype.itemsize == 1:  # fp8 / fp4 outputs are compared at their own (coarse) precision at least
        return max(atol, 0.125), max(rtol, 0.125)
    return atol, rtol


def reduction_sizes(fusion, env) -> list[int]:
    """For each returned output, its reduction size (module docstring): what the op computing a tensor reduces,
    times the largest reduction size of its tensor operands.

    ``env`` holds the run's values (for the reduced extents). Reductions say which dims they reduce; a scan
    reduces along its dim; an op whose output domain has reduction dims (matmul, linear: K) reduces over their
    extents, read from its first tensor input's last dim when symbolic."""
    from ..ir.nodes import Expr, TensorView
    from ..ops.registry import OpKind

    own: dict[int, int] = {}
    for e in fusion.statements:
        if not isinstance(e, Expr):
            continue
        size = 1
        tensors = [a for a in e.inputs if isinstance(a, TensorView)]
        x = env.get(id(tensors[0])) if tensors else None
        if e.op.reduced_dims is not None and tensors:
            if isinstance(x, torch.Tensor):
                for d in e.op.reduced_dims(e):
                    size *= int(x.shape[d]) if d < x.dim() else 1
        elif e.op.kind is OpKind.SCAN and isinstance(x, torch.Tensor) and x.dim():
            size = int(x.shape[e.kwargs.get("dim", 0)])
        else:
            for o in e.outputs:
                red = [d for d in getattr(o, "logical_domain", ()) if d.is_reduction]
                if red and tensors:
                    n = 1
                    for d in red:
                        n *= d.extent if d.extent is not None else (
                            int(x.shape[-1]) if isinstance(x, torch.Tensor) and x.dim() else 1
                        )
                    size = max(size, n)
        own[id(e)] = size
    memo: dict[int, int] = {}

    def chain(v) -> int:
        key = id(v)
        if key not in memo:
            memo[key] = 1  # (a DAG: no cycles, but guard re-entry)
            e = getattr(v, "defined_by", None)
            if e is not None:
                operands = [chain(a) for a in e.inputs if isinstance(a, TensorView)]
                memo[key] = own.get(id(e), 1) * max(operands, default=1)
        return memo[key]

    return [chain(v) for v in fusion.outputs]


def compare_outputs(outputs: Sequence[Any], references: Sequence[Any], check_strides: bool,
                    reduction_sizes: Sequence[int] = (), **tolerances) -> None:
    """AssertionError naming the first output that differs in count, dtype, shape, strides (when asked) or value.

    Values are compared with nvFuser's tolerances (module docstring) unless ``atol``/``rtol`` are given; NaNs
    compare equal to NaNs."""
    references = list(references)
    if len(outputs) != len(references):
        raise AssertionError(f"validate: {len(outputs)} outputs but {len(references)} references")
    for i, (out, ref) in enumerate(zip(outputs, references)):
        if isinstance(ref, torch.Tensor):
            if not isinstance(out, torch.Tensor):
                raise AssertionError(f"validate: output {i} is {type(out).__name__}, expected a tensor")
            if out.shape != ref.shape or out.dtype != ref.dtype:
                raise AssertionError(
                    f"validate: output {i} is {out.dtype}{list(out.shape)}, expected {ref.dtype}{list(ref.shape)}")
            if check_strides and out.numel() > 1 and out.stride() != ref.stride():
                raise AssertionError(f"validate: output {i} has strides {out.stride()}, expected {ref.stride()}")
            a, b = out, ref.to(out.device)
            if out.dtype == getattr(torch, "float4_e2m1fn_x2", None):
                a, b = a.view(torch.uint8), b.view(torch.uint8)  # packed FP4 has no arithmetic: compare bits
            tol = dict(tolerances)
            if "atol" not in tol or "rtol" not in tol:
                size = reduction_sizes[i] if i < len(reduction_sizes) else 1
                atol, rtol = tolerance(out.dtype, size)
                tol.setdefault("atol", atol)
                tol.setdefault("rtol", rtol)
            if a.dtype.itemsize == 1 and a.dtype.is_floating_point:
                a, b = a.float(), b.float()  # fp8: compared as values
            torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m, i=i: f"validate: output {i}: {m}", **tol)
        elif out != ref and not (out != out and ref != ref):  # NaN scalars are equal here
            raise AssertionError(f"validate: output {i} is {out!r}, expected {ref!r}")
