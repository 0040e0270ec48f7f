"""The operand contract of the NVFP4 grouped GEMM (``fd.ops.cutlass_nvfp4_grouped_mm``): dtypes, shapes, layouts.

Pure torch, no Triton: the op layer checks it on every path and the hand-written kernel's launcher relies on it.
"""

from __future__ import annotations

import torch

from ..ir.dtypes import to_torch_dtype

_SUPPORTED_OUT = (torch.bfloat16, torch.float16)


def contract_error(msg: str):
    """Raise the contract violation as the ValueError the op layer turns into its own error."""
    raise ValueError(f"nvfp4_grouped_mm: {msg}")


def _check_dtype(t: torch.Tensor, name: str, dtypes, what: str):
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes:
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        contract_error(f"{name} must be {what}, got {got}")


def out_torch_dtype(out_dtype) -> torch.dtype:
    if not isinstance(out_dtype, torch.dtype):  # a pyfuser DataType
        out_dtype = to_torch_dtype(out_dtype)
    if out_dtype not in _SUPPORTED_OUT:
        contract_error(f"out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
    return out_dtype


def check_operands(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets):
    """The operand contract of fd.ops.cutlass_nvfp4_grouped_mm (dtypes, shapes, layouts, one device); returns
    (M, N, K, G). Raises ValueError. Shared by the Triton kernel's launcher and the op layer (which runs it on
    every path)."""
    fp4 = (torch.float4_e2m1fn_x2, torch.uint8)  # uint8: the same packed bytes, already viewed for bit work
    _check_dtype(mat1, "mat1", fp4, "packed fp4 (float4_e2m1fn_x2) [M, K/2]")
    _check_dtype(mat2, "mat2", fp4, "packed fp4 (float4_e2m1fn_x2) [G, K/2, N]")
    _check_dtype(scale1, "scale1", (torch.float8_e4m3fn,), "float8_e4m3fn")
    _check_dtype(scale2, "scale2", (torch.float8_e4m3fn,), "float8_e4m3fn")
    _check_dtype(alpha, "alpha", (torch.float32,), "float32 [G]")
    for name, t in (("problem_sizes", problem_sizes), ("expert_offsets", expert_offsets), ("sf_offsets", sf_offsets)):
        _check_dtype(t, name, (torch.int32,), "int32")
    if mat1.dim() != 2 or mat2.dim() != 3:
        contract_error(f"mat1 must be [M, K/2] and mat2 [G, K/2, N], got {tuple(mat1.shape)} and {tuple(mat2.shape)}")
    m, k = mat1.shape[0], mat1.shape[1] * 2
    g, n = mat2.shape[0], mat2.shape[2]
    if mat2.shape[1] * 2 != k:
        contract_error(f"mat2's K/2 is {mat2.shape[1]} but mat1's is {mat1.shape[1]}")
    if k % 64 != 0:
        contract_error(f"K must be a multiple of 64 (K/2 a multiple of 32), got K={k}")
    if n % 8 != 0:
        contract_error(f"N must be a multiple of 8, got N={n}")
    if not mat1.is_contiguous():
        contract_error(f"mat1 must be contiguous, got strides {tuple(mat1.stride())}")
    if not mat2.transpose(-1, -2).is_contiguous():
        contract_error(f"mat2 must be a [G, N, K/2] contiguous weight passed as .transpose(-1, -2) "
              f"(strides [N*K/2, 1, K/2]), got strides {tuple(mat2.stride())}")
    sk = k // 16
    if scale1.dim() != 2 or scale1.shape[1] != sk or not scale1.is_contiguous():
        contract_error(f"scale1 must be a contiguous [rows, K/16={sk}] e4m3 tensor (the layout op's result or a plain "
              f"[sum R_i, K/16] buffer), got shape {tuple(scale1.shape)} strides {tuple(scale1.stride())}")
    n_rows = -(-n // 128) * 128
    if scale2.dim() != 3 or tuple(scale2.shape) != (g, n_rows, sk) or not scale2.is_contiguous():
        contract_error(f"scale2 must be a contiguous [G, roundup(N,128), K/16] = {(g, n_rows, sk)} e4m3 tensor "
              f"(each slice 128x4-swizzled), got shape {tuple(scale2.shape)} strides {tuple(scale2.stride())}")
    if tuple(alpha.shape) != (g,):
        contract_error(f"alpha must be [G={g}], got {tuple(alpha.shape)}")
    if tuple(problem_sizes.shape) != (g, 3):
        contract_error(f"problem_sizes must be [G={g}, 3], got {tuple(problem_sizes.shape)}")
    for name, t in (("expert_offsets", expert_offsets), ("sf_offsets", sf_offsets)):
        if tuple(t.shape) != (g,):
            contract_error(f"{name} must be [G={g}], got {tuple(t.shape)}")
    devices = {t.device for t in (mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets)}
    if len(devices) != 1:
        contract_error(f"all operands must be on one device, got {sorted(map(str, devices))}")
    return m, n, k, g
