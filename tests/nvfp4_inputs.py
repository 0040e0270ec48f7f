"""Building NVFP4 grouped-GEMM operands the way upstream's tests do (test_narrow_precision.py), for op tests.

Weights: per expert gs_B = 2688 / max(W_i) (max, not abs-max: upstream's quirk), quantized in the reference
order, each expert's [N, K/16] scales 128x4-swizzled, stored [G, N, K/2] and passed transposed; alpha = 1/gs_B.
Activations: gs = 1, grouped quantization with the scales in the layout op's buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.nvfp4 import reference as ref


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def start_offsets(tokens, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert_offsets, sf_offsets): exclusive prefix sums of the tokens and of their roundup to 128."""
    starts, sf, a, b = [], [], 0, 0
    for t in tokens:
        starts.append(a)
        sf.append(b)
        a += t
        b += round_up(t, 128)
    as_t = lambda v: torch.tensor(v, dtype=torch.int32, device=device)
    return as_t(starts), as_t(sf)


@dataclass
class GemmInputs:
    mat1: torch.Tensor  # packed [M, K/2]
    mat2: torch.Tensor  # packed [G, K/2, N] (transpose of [G, N, K/2])
    scale1: torch.Tensor  # layout-op style [M, K/16] over the padded swizzled buffer
    scale2: torch.Tensor  # [G, N, K/16], each slice swizzled
    alpha: torch.Tensor
    problem_sizes: torch.Tensor
    expert_offsets: torch.Tensor
    sf_offsets: torch.Tensor
    a_ref: torch.Tensor  # the float32 activations before quantization
    w_ref: torch.Tensor  # the float32 weights [G, N, K] before quantization

    def as_list(self) -> list:
        return [self.mat1, self.mat2, self.scale1, self.scale2, self.alpha, self.problem_sizes, self.expert_offsets,
                self.sf_offsets]


def gemm_inputs(m: int, n: int, k: int, tokens, device, seed: int = 0) -> GemmInputs:
    assert sum(tokens) == m
    gen = torch.Generator().manual_seed(seed)
    g = len(tokens)
    a = torch.randn((m, k), generator=gen).to(device)
    w = torch.randn((g, n, k), generator=gen).to(device)
    eo, so = start_offsets(tokens, device)
    w_packed = torch.empty((g, n, k // 2), dtype=torch.uint8, device=device)
    scale2 = torch.empty((g, n, k // 16), dtype=torch.float8_e4m3fn, device=device)
    alpha = torch.empty((g,), dtype=torch.float32, device=device)
    for i in range(g):
        gs = ref.FLOAT4_E2M1_MAX * ref.FLOAT8_E4M3_MAX / w[i].max()
        packed, s = ref.quantize_nvfp4(w[i], gs)
        w_packed[i] = packed.view(torch.uint8)
        scale2[i] = ref.linear_to_swizzled_128_4(s)
        alpha[i] = 1.0 / gs
    mat1, scale1 = ref.grouped_quantize_nvfp4(a, eo, so, None, 16, fused=False)
    ps = torch.tensor([[t, n, k] for t in tokens], dtype=torch.int32, device=device)
    mat2 = w_packed.view(torch.float4_e2m1fn_x2).transpose(-1, -2)
    return GemmInputs(mat1, mat2, scale1, scale2, alpha, ps, eo, so, a, w)


def gemm_fusion() -> FusionDefinition:
    """fd.ops.cutlass_nvfp4_grouped_mm of eight inputs of any sizes (``GemmInputs.as_list()``), bf16 out."""
    with FusionDefinition() as fd:
        mat1 = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float4_e2m1fn)
        mat2 = fd.define_tensor(shape=[-1, -1, -1], dtype=DataType.Float4_e2m1fn, stride_order=[2, 0, 1])
        scale1 = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float8_e4m3fn)
        scale2 = fd.define_tensor(shape=[-1, -1, -1], dtype=DataType.Float8_e4m3fn)
        alpha = fd.define_tensor(shape=[-1], dtype=DataType.Float)
        sizes = fd.define_tensor(shape=[-1, -1], dtype=DataType.Int32)
        offsets = fd.define_tensor(shape=[-1], dtype=DataType.Int32)
        sf_offsets = fd.define_tensor(shape=[-1], dtype=DataType.Int32)
        fd.add_output(fd.ops.cutlass_nvfp4_grouped_mm(mat1, mat2, scale1, scale2, alpha, sizes, offsets, sf_offsets,
                                                      DataType.BFloat16))
    return fd
