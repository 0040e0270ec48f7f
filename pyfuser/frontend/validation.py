"""``fd.validate`` / ``fd.manual_validate``: compare a fusion's outputs with references."""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch


def fake_free_copies(inputs: Sequence[Any]) -> list:
    """Copies of the inputs for the reference evaluation: aliased outputs write into their inputs, and the
    reference must not see (or cause) those writes."""
    return [x.clone() if isinstance(x, torch.Tensor) else copy.deepcopy(x) for x in inputs]


def compare_outputs(outputs: Sequence[Any], references: Sequence[Any], check_strides: bool, **tolerances) -> None:
    """AssertionError naming the first output that differs in count, dtype, shape, strides (when asked) or value.

    Tolerances default to torch.testing's per-dtype ones; NaNs compare equal to NaNs."""
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
            torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m, i=i: f"validate: output {i}: {m}",
                                       **tolerances)
        elif out != ref and not (out != out and ref != ref):  # NaN scalars are equal here
            raise AssertionError(f"validate: output {i} is {out!r}, expected {ref!r}")
