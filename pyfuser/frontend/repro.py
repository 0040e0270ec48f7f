"""Repro scripts: ``fd.repro_script_for(inputs)`` and ``fd.last_repro_script()`` (nvFuser's names).

The script imports ``nvfuser_direct`` names, rebuilds the fusion from its printed definition and, when inputs
are given, makes tensors of the same sizes, strides, dtypes and devices and runs ``fd.execute(inputs)``.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch


def fake_copies(inputs: Sequence[Any]) -> list:
    """Inputs as fake tensors (sizes, strides, dtype and device kept, no data) for a later repro script."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    return [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs]


def _tensor_expr(t: torch.Tensor) -> str:
    size, stride, dtype, device = tuple(t.size()), tuple(t.stride()), t.dtype, t.device
    if t.is_contiguous():
        return f"torch.testing.make_tensor({size}, dtype={dtype}, device='{device}')"
    # as_strided over a buffer just large enough for the highest linear index
    extent = 0 if 0 in size else 1 + sum((n - 1) * s for n, s in zip(size, stride))
    if dtype.is_floating_point or dtype.is_complex:
        base = f"torch.randn({extent}, dtype={dtype}, device='{device}')"
    else:
        high = 2 if dtype == torch.bool else 10
        base = f"torch.randint(0, {high}, ({extent},), dtype={dtype}, device='{device}')"
    return f"{base}.as_strided({size}, {stride})"


def _scalar_expr(x) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return 'float("nan")'
        if math.isinf(x):
            return 'float("inf")' if x > 0 else 'float("-inf")'
    if isinstance(x, complex):
        return f"complex({_scalar_expr(x.real)}, {_scalar_expr(x.imag)})"
    return repr(x)


def repro_script(fd, inputs: Optional[Sequence[Any]] = None) -> str:
    lines = ["# CUDA devices:"]
    if torch.cuda.is_available():
        lines += [f"#  {i}: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    lines += [
        f"# torch version: {torch.__version__}",
        f"# cuda version: {torch.version.cuda}",
        "import torch",
        "from nvfuser_direct import FusionDefinition, DataType",
    ]
    text = "\n".join(lines) + "\n" + repr(fd) + "with FusionDefinition() as fd:\n    nvfuser_fusion(fd)\n"
    if inputs is not None:
        items = [_tensor_expr(x) if isinstance(x, torch.Tensor) else _scalar_expr(x) for x in inputs]
        text += "\ninputs = [\n" + "".join(f"    {e},\n" for e in items) + "]\nfd.execute(inputs)\n"
    return text
