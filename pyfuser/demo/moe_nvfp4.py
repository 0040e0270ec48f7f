"""A mixture-of-experts layer with NVFP4 expert weights, expressed as one pyfuser fusion.

    python examples/moe_nvfp4.py                      # small sizes, runs on CPU in seconds
    python examples/moe_nvfp4.py --device cuda --tokens 256 --hidden 4096 --intermediate 2048 --experts 8

The layer (Mixtral-style): router (linear, softmax, top-k, renormalised top-k weights) -> permute the (token,
slot) pairs by expert -> quantize the activations to NVFP4 straight into the grouped 128x4 block-scale layout ->
gate/up NVFP4 grouped GEMM -> SiLU(gate) * up -> quantize again -> down NVFP4 grouped GEMM -> un-permute and take
the routing-weighted sum over the k slots.

Expert weights are bf16 checkpoints quantized offline to NVFP4 the way nvFuser's grouped-GEMM tests do it:
per-expert global scale gs_B = 2688 / max(W_e) (max, not abs-max: upstream's quirk, kept), reference-order
quantization, block scales swizzled per expert, alpha_e = 1 / gs_B. Activations use gs = 1 (as sglang).

Three implementations are compared:
- ``MoENVFP4.__call__``: the pyfuser fusion (what this example is about);
- ``moe_nvfp4_emulated``: plain torch, fp32 fake quantization of the same math (dequantize-then-matmul), written
  here without pyfuser's nvfp4 code (decodes the packed bytes itself), so it checks packing, swizzle and layout;
- ``moe_bf16``: the real bf16 layer with the original bf16 weights (``torch._grouped_mm``); accuracy is
  reported against it.

Relative errors are per token: ||y_t - ref_t|| / ||ref_t||, reported as max and mean over tokens (elementwise
relative errors are meaningless where the reference crosses zero).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from typing import Optional

import torch
import torch.nn.functional as F

from ..frontend import FusionDefinition
from ..ir import DataType

BLOCK = 16  # NVFP4 block size along K
FP4_MAX = 6.0
FP8_MAX = 448.0
WEIGHT_GS_NUMERATOR = FP8_MAX * FP4_MAX  # 2688: upstream's gs_B = 2688 / max(B_i)

# The verdict of run(): the fusion must compute the emulated math (they differ only where fp32 summation order flips
# a bf16 rounding), and its distance to bf16 must be NVFP4's quantization error (~0.25 mean per token for this
# layer, see tests/test_moe_example.py), not more.
MAX_REL_ERR_VS_EMULATION = 5e-3  # whole tensor
MAX_MEAN_REL_ERR_VS_BF16 = 0.4


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    hidden: int = 128  # H
    intermediate: int = 64  # I (per expert; gate and up are fused into one [2I, H] weight)
    experts: int = 4  # E
    top_k: int = 2

    def check(self) -> None:
        # The NVFP4 GEMM contracts K in multiples of 64 (K/2 bytes a multiple of 32) and each expert's weight scales
        # [N, K/16] are stored 128x4-swizzled in place, so N must be a multiple of 128 and K/16 of 4.
        # gate/up: N = 2I, K = H.  down: N = H, K = I.
        H, I = self.hidden, self.intermediate
        if H % 128 or I % 64:
            raise ValueError(f"hidden ({H}) must be a multiple of 128 and intermediate ({I}) of 64 for NVFP4 GEMMs")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k ({self.top_k}) must be in [1, experts={self.experts}]")


# --------------------------------------------------------------------------------------------------------------
# weights


@dataclasses.dataclass
class MoEWeights:
    """The bf16 checkpoint: router [E, H], gate/up [E, 2I, H] (gate rows first), down [E, H, I]."""

    router: torch.Tensor
    w13: torch.Tensor
    w2: torch.Tensor


def make_weights(cfg: MoEConfig, device="cpu", seed: int = 0) -> MoEWeights:
    g = torch.Generator(device="cpu").manual_seed(seed)
    H, I, E = cfg.hidden, cfg.intermediate, cfg.experts

    def rand(*shape, fan_in):
        # 1/sqrt(fan_in) keeps every layer's output O(1) for O(1) inputs, which matters for NVFP4: activations use
        # gs = 1, so a block whose amax/6 falls below e4m3's smallest normal (2^-6) loses scale precision.
        return (torch.randn(*shape, generator=g) / math.sqrt(fan_in)).to(device=device, dtype=torch.bfloat16)

    return MoEWeights(router=rand(E, H, fan_in=H), w13=rand(E, 2 * I, H, fan_in=H), w2=rand(E, H, I, fan_in=I))


@dataclasses.dataclass
class NVFP4Expert:
    """One grouped weight [E, N, K] in NVFP4, as cutlass_nvfp4_grouped_mm takes it."""

    packed: torch.Tensor  # float4_e2m1fn_x2 [E, N, K/2] (passed to the op as .transpose(-1, -2))
    scales: torch.Tensor  # float8_e4m3fn [E, N, K/16], each [N, K/16] slice 128x4-swizzled
    scales_linear: torch.Tensor  # float8_e4m3fn [E, N, K/16], row-major (for the emulation)
    global_scale: torch.Tensor  # float32 [E]
    alpha: torch.Tensor  # float32 [E] = 1 / global_scale (activations use gs = 1)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales, self.alpha))


def quantize_experts(w: torch.Tensor) -> NVFP4Expert:
    """Offline NVFP4 quantization of [E, N, K] weights, one global scale per expert (upstream's test recipe)."""
    from ..nvfp4 import reference

    packed, scales, swizzled, gss = [], [], [], []
    for we in w.float():
        # Upstream takes max, not abs-max. If a negative value dominates, the scale of its block clamps at 448 and
        # that value saturates at -6 (a visible but rare error); kept for fidelity with nvFuser's tests.
        top = we.max()
        gs = WEIGHT_GS_NUMERATOR / top if top > 0 else torch.tensor(1.0, device=we.device)
        gs = gs.to(torch.float32)
        p, s = reference.quantize_nvfp4(we, gs)  # the spec's reference order, as upstream's pytorch_nvfp4_quantize
        packed.append(p)
        scales.append(s)
        swizzled.append(reference.linear_to_swizzled_128_4(s))  # same shape: N % 128 == 0, (K/16) % 4 == 0
        gss.append(gs)
    gs = torch.stack(gss)
    return NVFP4Expert(torch.stack(packed), torch.stack(swizzled), torch.stack(scales), gs, (1.0 / gs).float())


@dataclasses.dataclass
class QuantizedMoE:
    router: torch.Tensor
    w13: NVFP4Expert
    w2: NVFP4Expert


def quantize_weights(w: MoEWeights) -> QuantizedMoE:
    return QuantizedMoE(router=w.router, w13=quantize_experts(w.w13), w2=quantize_experts(w.w2))


# --------------------------------------------------------------------------------------------------------------
# the pyfuser fusion


def define_moe(fd: FusionDefinition, cfg: MoEConfig, tokens: int, quant: str = "grouped") -> None:
    """The whole layer for ``tokens`` tokens. Inputs: x [T, H] bf16, router [E, H] bf16, then (packed weights,
    swizzled scales, alpha) for gate/up and for down. Output: [T, H] bf16.

    ``quant`` picks how activations reach the GEMM's block-scale layout: "grouped" quantizes straight into it
    (nv_grouped_block_quantize, one kernel); "split" quantizes to plain [M, K/16] scales (nv_block_quantize) and
    then applies the layout op (preprocess_grouped_matmul_input_sf).

    Token counts per expert are data, not shapes: every shape here depends only on T, H, I, E and k, so one
    definition serves every routing. The offsets computed here feed the layout op / grouped quantize, whose
    offsets must be segment inputs, so pyfuser cuts a segment boundary after them.

    The pieces (router, permutation, counts and offsets, experts, combine) are separate functions so that the
    expert-parallel layer (pyfuser/demo/moe_ep.py) defines the same ops around its all-to-alls.
    """
    T, E, k = tokens, cfg.experts, cfg.top_k
    M = T * k  # rows of the permuted activations: one per (token, slot)
    x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
    w_router = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
    experts = define_expert_weights(fd)
    topw, topi = define_router(fd, x, w_router, k)
    flat_ids, x_perm, inv_perm = define_permutation(fd, x, topi, M, k)
    offsets = define_offsets(fd, define_counts(fd, flat_ids, M, E), E)
    y_perm = define_experts(fd, cfg, x_perm, experts, offsets, M, E, quant)
    fd.add_output(define_combine(fd, cfg, y_perm, inv_perm, topw, T))


def define_expert_weights(fd: FusionDefinition) -> list:
    """(packed FP4 weights, swizzled block scales, alpha) inputs for gate/up, then for down."""
    experts = []
    for _ in range(2):  # (gate/up, down)
        w = fd.define_tensor(
            shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float4_e2m1fn, stride_order=[2, 0, 1]
        )
        sf = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float8_e4m3fn)
        alpha = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        experts.append((w, sf, alpha))
    return experts


def define_router(fd: FusionDefinition, x, w_router, k: int):
    """Softmax over experts, top-k, the k weights renormalised (Mixtral): (weights [T, k] fp32, ids [T, k])."""
    logits = fd.ops.cast(fd.ops.linear(x, w_router), DataType.Float)
    e = fd.ops.exp(fd.ops.sub(logits, fd.ops.max(logits, dims=[1], keepdim=True)))
    probs = fd.ops.div(e, fd.ops.sum(e, dims=[1], keepdim=True))
    topw, topi = fd.ops.topk(probs, k, dim=1, largest=True, sorted=True)
    topw = fd.ops.div(topw, fd.ops.sum(topw, dims=[1], keepdim=True))
    return topw, topi


def define_permutation(fd: FusionDefinition, x, topi, M: int, k: int):
    """(token, slot) pairs sorted by expert; stable, so tokens stay in order within an expert. Returns (expert id
    per (token, slot) [M], the permuted rows of x [M, H], the inverse permutation [M])."""
    flat_ids = fd.ops.reshape(topi, [M])
    perm = fd.ops.argsort(flat_ids, dim=0, stable=True)  # permuted row -> flat (token, slot) index
    x_perm = fd.ops.index_select(x, fd.ops.div(perm, k), 0)  # Int div truncates: flat index // k = token
    inv_perm = fd.ops.argsort(perm, dim=0)  # flat (token, slot) index -> permuted row
    return flat_ids, x_perm, inv_perm


def define_counts(fd: FusionDefinition, ids, M: int, E: int):
    """Rows per expert [E] (Int) from the expert id of each of M rows: a one-hot sum (no bincount op)."""
    iota_e = fd.ops.broadcast_in_dim(fd.ops.iota(E, dtype=DataType.Int), shape=[M, E], broadcast_dims=[1])
    one_hot = fd.ops.eq(fd.ops.broadcast_in_dim(ids, shape=[M, E], broadcast_dims=[0]), iota_e)
    return fd.ops.sum(fd.ops.cast(one_hot, DataType.Int32), dims=[0])  # Int


def define_offsets(fd: FusionDefinition, counts, E: int) -> tuple:
    """(START offsets (exclusive cumsum), block-scale offsets padded to 128 rows, each group's rows as an [E, 1]
    column).

    The rows of group i are taken as end - start of its range (equal to its count): everything below then comes
    out of the one kernel that scans the counts along the expert dim (the padded scan and the problem-size tables
    share that dim), instead of the counting reduction writing an epilogue that two more kernels read back
    (docs/codegen.md)."""
    ends = fd.ops.cumsum(counts, dim=0)
    starts_int = fd.ops.sub(ends, counts)
    starts = fd.ops.cast(starts_int, DataType.Int32)
    rows = fd.ops.sub(ends, starts_int)
    padded = fd.ops.mul(fd.ops.div(fd.ops.add(rows, 127), 128), 128)
    sf_starts = fd.ops.cast(fd.ops.sub(fd.ops.cumsum(padded, dim=0), padded), DataType.Int32)
    counts_col = fd.ops.broadcast_in_dim(fd.ops.cast(rows, DataType.Int32), shape=[E, 1], broadcast_dims=[0])
    return starts, sf_starts, counts_col


def define_experts(fd: FusionDefinition, cfg: MoEConfig, x_perm, experts, offsets, M: int, E: int, quant: str):
    """Rows sorted by expert [M, H] -> gate/up GEMM, SiLU(gate) * up in fp32, down GEMM -> [M, H] bf16."""
    H, I = cfg.hidden, cfg.intermediate
    starts, sf_starts, counts_col = offsets

    def problem_sizes(n, kk):
        full = lambda v: fd.ops.full([E, 1], v, DataType.Int32)  # noqa: E731
        return fd.ops.cat([counts_col, full(n), full(kk)], dim=1)

    def quantize(a):
        # gs = 1 for activations: no global scale.
        if quant == "grouped":
            return fd.ops.nv_grouped_block_quantize(a, starts, sf_starts)
        if quant == "split":
            a_fp4, a_sf = fd.ops.nv_block_quantize(a)
            return a_fp4, fd.ops.preprocess_grouped_matmul_input_sf(a_sf, starts, sf_starts)
        raise ValueError(f"quant must be 'grouped' or 'split', got {quant!r}")

    def grouped_gemm(a, weights, n, kk):
        a_fp4, a_sf = quantize(a)
        w, w_sf, alpha = weights
        return fd.ops.cutlass_nvfp4_grouped_mm(
            a_fp4, w, a_sf, w_sf, alpha, problem_sizes(n, kk), starts, sf_starts, dtype=DataType.BFloat16
        )

    gate_up = grouped_gemm(x_perm, experts[0], 2 * I, H)  # [M, 2I] bf16
    gate = fd.ops.cast(fd.ops.slice(gate_up, [0, 0], [M, I]), DataType.Float)
    up = fd.ops.cast(fd.ops.slice(gate_up, [0, I], [M, 2 * I]), DataType.Float)
    # Quantized from fp32, no bf16 round trip. Read only by the quantize, it is computed inside the quantize kernel
    # (its load prologue, docs/codegen.md), as are the gathered rows x_perm: neither is written to memory.
    h = fd.ops.mul(fd.ops.silu(gate), up)
    return grouped_gemm(h, experts[1], H, I)  # [M, H] bf16


def define_combine(fd: FusionDefinition, cfg: MoEConfig, y_perm, inv_perm, topw, T: int):
    """Un-permute and take the routing-weighted sum over the k slots: [T, H] bf16.

    Slot by slot: the rows of slot s are gathered with that slot's column of the inverse permutation, so each
    gather reads its index at the output's own coordinates and the gathers, products and sum are one kernel (a
    reshape of gathered rows would have to read them back from memory). The fp32 sum runs over the slots in
    order: for k = 2 exactly the one addition a sum over the slot dim makes."""
    k, H = cfg.top_k, cfg.hidden
    rows = fd.ops.reshape(inv_perm, [T, k])  # permuted row of each (token, slot)
    total = None
    for s in range(k):
        y = fd.ops.cast(fd.ops.index_select(y_perm, fd.ops.select(rows, s, 1), 0), DataType.Float)
        w = fd.ops.broadcast_in_dim(fd.ops.select(topw, s, 1), shape=[T, H], broadcast_dims=[0])
        term = fd.ops.mul(y, w)
        total = term if total is None else fd.ops.add(total, term)
    return fd.ops.cast(total, DataType.BFloat16)


class MoENVFP4:
    """The NVFP4 layer: quantized weights plus one fusion per token count."""

    def __init__(self, cfg: MoEConfig, weights: QuantizedMoE, quant: str = "grouped"):
        cfg.check()
        self.cfg, self.weights, self.quant = cfg, weights, quant
        self._fusions: dict[int, FusionDefinition] = {}

    def fusion(self, tokens: int) -> FusionDefinition:
        if tokens not in self._fusions:
            with FusionDefinition() as fd:
                define_moe(fd, self.cfg, tokens, self.quant)
            self._fusions[tokens] = fd
        return self._fusions[tokens]

    def inputs(self, x: torch.Tensor) -> list:
        q = self.weights
        return [
            x,
            q.router,
            q.w13.packed.transpose(-1, -2),  # [E, H/2, 2I]: K fastest, as the op's mat2 (stride_order [2, 0, 1])
            q.w13.scales,
            q.w13.alpha,
            q.w2.packed.transpose(-1, -2),
            q.w2.scales,
            q.w2.alpha,
        ]

    def __call__(self, x: torch.Tensor, disable_options=(), enable_options=()) -> torch.Tensor:
        """Options as ``fd.execute`` takes them: e.g. ``enable_options=["cuda_graph"]`` replays a CUDA graph."""
        (out,) = self.fusion(x.shape[0]).execute(self.inputs(x), _disable_options=list(disable_options),
                                                 _enable_options=list(enable_options))
        return out


# --------------------------------------------------------------------------------------------------------------
# plain-torch references


def route(x: torch.Tensor, router: torch.Tensor, top_k: int):
    """(weights [T, k] fp32, expert ids [T, k]): softmax over experts in fp32, top-k, renormalised."""
    probs = torch.softmax(F.linear(x, router).float(), dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    return w / w.sum(-1, keepdim=True), ids


def moe_bf16(x: torch.Tensor, router: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int) -> torch.Tensor:
    """The bf16 layer with the original weights, built on torch._grouped_mm (no data-dependent shapes, so
    torch.compile captures it whole)."""
    T, E, I = x.shape[0], w13.shape[0], w2.shape[2]
    topw, ids = route(x, router, top_k)
    flat = ids.reshape(-1)
    perm = torch.argsort(flat, stable=True)
    counts = (flat[:, None] == torch.arange(E, device=x.device)).sum(0)  # bincount's size is data-dependent
    ends = torch.cumsum(counts, 0).to(torch.int32)  # _grouped_mm takes cumulative END offsets
    xp = x[perm // top_k]
    gu = torch._grouped_mm(xp, w13.transpose(-1, -2), offs=ends)
    h = F.silu(gu[:, :I]) * gu[:, I:]
    yp = torch._grouped_mm(h, w2.transpose(-1, -2), offs=ends)
    y = torch.empty_like(yp)
    y[perm] = yp  # un-permute: row perm[i] of the (token, slot) order is permuted row i
    return (y.view(T, top_k, -1).float() * topw[..., None]).sum(1).to(torch.bfloat16)


_FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _fp4_round(v: torch.Tensor) -> torch.Tensor:
    """Round to the E2M1 grid, nearest with ties to the even code, saturating at 6; sign kept."""
    a = v.abs()
    code = (a > 0.25).int() + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5) + (a > 5)
    mag = torch.tensor(_FP4_VALUES, device=v.device)[code]
    return torch.where(torch.signbit(v), -mag, mag)


def fake_quantize_activation(x: torch.Tensor) -> torch.Tensor:
    """NVFP4 quantize-dequantize of [M, K] rows with gs = 1, in the fused ops' order (the scale is rounded to e4m3
    first, then the data is multiplied by 1 / that rounded scale; a zero scale gives zero data)."""
    m, k = x.shape
    b = x.float().reshape(m, k // BLOCK, BLOCK)
    s = (b.abs().amax(-1, keepdim=True) / FP4_MAX).clamp(max=FP8_MAX).to(torch.float8_e4m3fn).float()
    inv = torch.where(s == 0, torch.zeros_like(s), 1.0 / s)
    return (_fp4_round(b * inv) * s).reshape(m, k)


def decode_nvfp4(packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """[..., N, K/2] packed FP4 bytes + row-major e4m3 scales [..., N, K/16] + per-leading-index gs -> fp32."""
    b = packed.view(torch.uint8)
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)  # element 2j is the low nibble
    mag = torch.tensor(_FP4_VALUES, device=b.device)[(codes & 7).long()]
    v = torch.where(codes >= 8, -mag, mag)
    v = v.unflatten(-1, (-1, BLOCK)) * scales.float()[..., None]
    return v.flatten(-2) / global_scale.reshape(-1, *([1] * (packed.dim() - 1)))


def moe_nvfp4_emulated(x: torch.Tensor, q: QuantizedMoE, cfg: MoEConfig) -> torch.Tensor:
    """What the NVFP4 layer computes, in fp32 torch: dequantized weights, fake-quantized activations, matmul per
    expert in fp32, bf16 rounding where the GEMMs round, fp32 SiLU*mul and weighted sum."""
    T, I, k = x.shape[0], cfg.intermediate, cfg.top_k
    w13 = decode_nvfp4(q.w13.packed, q.w13.scales_linear, q.w13.global_scale)
    w2 = decode_nvfp4(q.w2.packed, q.w2.scales_linear, q.w2.global_scale)
    topw, ids = route(x, q.router, k)
    y = torch.zeros(T, k, cfg.hidden, device=x.device)
    for e in range(cfg.experts):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        gu = (fake_quantize_activation(x[tok]) @ w13[e].T).to(torch.bfloat16).float()
        h = F.silu(gu[:, :I]) * gu[:, I:]
        y[tok, slot] = (fake_quantize_activation(h) @ w2[e].T).to(torch.bfloat16).float()
    return (y * topw[..., None]).sum(1).to(torch.bfloat16)


# --------------------------------------------------------------------------------------------------------------
# accuracy and the report


def relative_errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Per-token relative L2 errors (max, mean over tokens) and the whole-tensor relative L2 error."""
    o, r = out.double(), ref.double().to(out.device)
    per_token = (o - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-30)
    return {
        "rel_err_max": per_token.max().item(),
        "rel_err_mean": per_token.mean().item(),
        "rel_err_total": ((o - r).norm() / r.norm().clamp_min(1e-30)).item(),
        "max_abs_err": (o - r).abs().max().item(),
    }


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def run(cfg: MoEConfig, tokens: int, device, quant: str = "grouped", seed: int = 0) -> dict:
    """Build, run and compare the three implementations; returns the metrics, a verdict under "ok" and the output
    tensors under "outputs"."""
    cfg.check()
    dev = pick_device(device) if isinstance(device, str) else device
    weights = make_weights(cfg, dev, seed)
    t0 = time.perf_counter()
    qweights = quantize_weights(weights)
    t_quant = time.perf_counter() - t0
    layer = MoENVFP4(cfg, qweights, quant)
    x = torch.randn(tokens, cfg.hidden, generator=torch.Generator().manual_seed(seed + 1)).to(dev, torch.bfloat16)

    t0 = time.perf_counter()
    out = layer(x)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t_first = time.perf_counter() - t0
    emulated = moe_nvfp4_emulated(x, qweights, cfg)
    ref = moe_bf16(x, weights.router, weights.w13, weights.w2, cfg.top_k)
    fd = layer.fusion(tokens)
    bf16_bytes = sum(t.numel() * t.element_size() for t in (weights.w13, weights.w2))
    vs_emulation, vs_bf16 = relative_errors(out, emulated), relative_errors(out, ref)
    return {
        "ok": vs_emulation["rel_err_total"] <= MAX_REL_ERR_VS_EMULATION
        and vs_bf16["rel_err_mean"] <= MAX_MEAN_REL_ERR_VS_BF16,
        "config": dataclasses.asdict(cfg) | {"tokens": tokens, "quant": quant, "device": str(dev)},
        "nvfp4_vs_bf16": vs_bf16,
        "emulation_vs_bf16": relative_errors(emulated, ref),
        "nvfp4_vs_emulation": vs_emulation,
        "segments": [s.kind.value for s in fd.segments()],
        "expert_weight_bytes": {"bf16": bf16_bytes, "nvfp4": qweights.w13.nbytes + qweights.w2.nbytes},
        "seconds": {"quantize_weights": t_quant, "first_execute": t_first},
        "outputs": {"nvfp4": out, "emulated": emulated, "bf16": ref},
    }


def run_demo(device="auto") -> dict:
    """The demo's entry point: small sizes on CPU, a realistic layer on a GPU. Returns the metrics (no tensors)."""
    dev = pick_device(device) if isinstance(device, str) else device
    if dev.type == "cuda":
        cfg, tokens = MoEConfig(hidden=2048, intermediate=1024, experts=8, top_k=2), 256
    else:
        cfg, tokens = MoEConfig(), 16
    result = run(cfg, tokens, dev)
    result.pop("outputs")
    return result


def format_report(m: dict) -> str:
    c = m["config"]
    lines = [
        f"MoE layer, NVFP4 experts: T={c['tokens']} tokens, H={c['hidden']}, I={c['intermediate']}, "
        f"E={c['experts']}, top-{c['top_k']}, activation quantization '{c['quant']}', device {c['device']}",
        f"fusion segments ({len(m['segments'])}): {', '.join(m['segments'])}",
        f"expert weights: bf16 {m['expert_weight_bytes']['bf16']} bytes, NVFP4 {m['expert_weight_bytes']['nvfp4']} "
        f"bytes ({m['expert_weight_bytes']['bf16'] / m['expert_weight_bytes']['nvfp4']:.2f}x smaller)",
        "relative error (per token ||y-ref||/||ref||):   max      mean     whole tensor",
    ]
    for key, label in (
        ("nvfp4_vs_bf16", "pyfuser NVFP4 vs bf16 reference"),
        ("emulation_vs_bf16", "torch NVFP4 emulation vs bf16"),
        ("nvfp4_vs_emulation", "pyfuser NVFP4 vs emulation"),
    ):
        e = m[key]
        lines.append(f"  {label:<40} {e['rel_err_max']:.2e} {e['rel_err_mean']:.2e} {e['rel_err_total']:.2e}")
    s = m["seconds"]
    lines.append(f"time: weight quantization {s['quantize_weights']:.2f} s, first execute {s['first_execute']:.2f} s")
    lines.append(
        f"{'OK' if m['ok'] else 'FAIL'}: pyfuser vs emulation <= {MAX_REL_ERR_VS_EMULATION:g} (whole tensor), "
        f"vs bf16 <= {MAX_MEAN_REL_ERR_VS_BF16:g} (mean per token)"
    )
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=64)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--quant", choices=["grouped", "split"], default="grouped")
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--print-fusion", action="store_true", help="print the fusion definition (repr)")
    args = ap.parse_args(argv)
    cfg = MoEConfig(args.hidden, args.intermediate, args.experts, args.top_k)
    m = run(cfg, args.tokens, args.device, args.quant, args.seed)
    if args.print_fusion:
        with FusionDefinition() as fd:
            define_moe(fd, cfg, args.tokens, args.quant)
        print(fd)
    print(format_report(m))
    if not m["ok"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
