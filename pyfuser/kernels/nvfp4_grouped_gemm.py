"""NVFP4 grouped GEMM for GPUs without FP4 tensor cores (Hopper): dequantize in registers, fp16 tensor-core dots.

``nvfp4_grouped_mm`` computes ``fd.ops.cutlass_nvfp4_grouped_mm`` with the run-time operands that op receives
(the contract of ``pyfuser.nvfp4.reference.nvfp4_grouped_mm``):
``out[e_i + r, n] = alpha[i] * sum_k A[e_i + r, k] * B_i[k, n]`` with ``A = fp4(mat1) * s1`` and
``B_i = fp4(mat2[i]) * s2[i]``, both scales read from their 128x4-swizzled e4m3 layouts.

Exactness. An fp4 value (at most 2 significant bits, a multiple of 0.5, |v| <= 6) times an e4m3 scale (4
significant bits, a multiple of 2**-9, <= 448) has at most 6 significant bits. Scaled by 2**-7 it is a multiple
of 2**-17 with magnitude <= 21, which fp16 (11 bits, subnormal step 2**-24, max 65504) holds EXACTLY. So each
operand is dequantized to ``fp4 * scale * 2**-7`` in fp16, the tensor cores multiply fp16 pairs exactly into an
fp32 accumulator, and the epilogue multiplies by ``alpha * 2**14`` (a power of two, so exact) and rounds once to
the output dtype. fp16 rather than bf16 because triton 3.6's CPU interpreter computes bf16 dots on raw bit
patterns (pyfuser's interpreter patch now widens them, docs/testing.md) while fp16 dots are right there unpatched:
the kernels that the CPU tests run are the very kernels the GPU runs.

Dequantization works on int32 words (8 fp4 codes) with two shifts and two masks per PAIR of values: nibble p and
nibble p+4 of a word land in the two 16-bit halves as fp16 bit patterns ``sign<<15 | code&7 << 9``, which read as
``fp4 * 2**-14`` (the fp4 exponent field becomes the low bits of the fp16 exponent field, and fp4's subnormal 0.5
becomes an fp16 subnormal). One fp16 multiply by ``scale * 2**7`` finishes the value. K is consumed in that
nibble order: "plane" q (0..7) holds nibble q of every word, and a k-tile is 8 dots, plane q of the weights with
plane q of the tokens (a permutation of the k sum, which is free since every product is exact).

No host sync; one launch, or two with ``predequant``:
- ``_nvfp4_gemm_kernel`` computes ``out^T = B^T A^T`` tiles: the weights fill the MMA's M side (64+ rows) and
  are dequantized in registers straight into the MMA's register operand (never stored dequantized anywhere),
  the tokens (16+ of them) its N side. The grid is ``((cdiv(M, BLOCK_M) + G) * cdiv(N, BLOCK_N), SPLIT_K)``;
  each program takes prefix sums of the groups' tile counts ``max(cdiv(m_i, BLOCK_M), 1)`` to find its (group,
  m-tile); the sum of those counts never exceeds ``cdiv(M, BLOCK_M) + G`` when sum(m_i) <= M, and extra programs
  exit. Programs run in GROUP_M-row bands of (m-tile, n-tile) pairs so that a band's token tiles and weight tiles
  stay in L2 while they are reused. Rows that no group covers are written with zeros by the program that holds
  tile 0 of the group before them (its "gap" rows [e_i + m_i, e_{i+1}) or [e_{G-1} + m_{G-1}, M), and rows
  [0, e_0) for group 0); every group owns one program even when empty. This covers every uncovered row when the
  groups are in order and do not overlap (what the op's offsets are: exclusive prefix sums).
- The tokens are dequantized either inside the k loop (decode: few tokens, one launch), or (``predequant``,
  prefill) once by ``_dequant_a_kernel`` into an fp16 ``[8, M, K/8]`` plane buffer that the GEMM then reads
  with plain pipelined loads: on sm_90 the MMA's second operand must sit in shared memory, and dequantizing it
  inside the GEMM costs a register -> shared store and a CTA barrier before every dot, once per weight tile.

Split-K (decode shapes with too few tiles to fill the GPU): SPLIT_K programs share a tile, each over a contiguous
range of k-tiles; each stores its fp32 partial in a workspace, then bumps the tile's counter; the last one to
arrive sums the SPLIT_K partials in split order (deterministic: the same bits whatever the arrival order), resets
the counter to zero for the next launch and runs the epilogue.

Host cost matters as much as GPU time at decode sizes: see ``pyfuser/codegen/launcher.py`` (cached specializations are launched
without Triton's per-call argument binding).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.runtime import driver

from ..codegen.launcher import launch, triton_usable
from ..ir.dtypes import to_torch_dtype
from ..ops import narrow_precision as ops
from ..ops.registry import attach
from ..nvfp4.gemm_contract import check_operands, contract_error, out_torch_dtype

__all__ = ["GemmConfig", "default_config", "nvfp4_grouped_mm"]

_NUM_SMS = 132  # H200; only shapes the heuristic's split-K choice


@dataclass(frozen=True)
class GemmConfig:
    block_m: int  # tokens per tile (the MMA's N side)
    block_n: int  # output columns (weight rows) per tile (the MMA's M side)
    block_k: int  # K elements per pipeline stage; a multiple of 128 (8 dots of block_k/8 >= 16 words)
    split_k: int  # programs sharing one output tile along K
    group_m: int  # m-tiles per band of the program order (L2 reuse)
    predequant: bool  # dequantize the tokens to fp16 planes in a first launch (else inside the GEMM's k loop)
    num_warps: int
    num_stages: int


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


@functools.lru_cache(maxsize=256)
def default_config(m: int, n: int, k: int, g: int) -> GemmConfig:
    """Heuristic from the static sizes only (no host sync): tokens per expert decide decode vs prefill.

    Chosen from benchmarks/sweep_nvfp4_gemm.py on the H200 (G=8, K=4096, N 2048/14336; GPU times from CUPTI):
    - decode (<= 64 tokens per expert): one m-tile holds an expert's tokens, dequantized inside the k loop (a
      first launch costs more than it saves at this size, and fp16 token tiles crowd shared memory), BLOCK_K 256,
      4 warps, 4 stages. 128-wide weight tiles when that still gives >= 2 tiles per SM (N=14336: 126 us at 1 and
      16 tokens, 197 us at 64), else 64-wide ones, and split-K until there are 2 programs per SM (N=2048: split 2,
      24 us at 1 and 16 tokens vs 34 us unsplit; 45 us at 64 tokens).
    - prefill: tokens dequantized once by a first launch (27 us at 8192x4096), 256 weight rows x 128 tokens per
      tile so each weight element is dequantized once per 128 tokens, 8 warps, 4 stages (0.53-0.56x bf16)."""
    per_expert = -(-m // max(g, 1))
    if per_expert <= 64:
        block_m = max(16, _next_pow2(per_expert))
        block_n = 128 if g * -(-n // 128) >= 2 * _NUM_SMS else 64
        tiles = g * -(-n // block_n)
        split_k = 1
        while tiles * split_k < 2 * _NUM_SMS and k // (256 * split_k) >= 4:
            split_k *= 2
        return GemmConfig(block_m, block_n, 256, split_k, 8, False, 4, 4)
    return GemmConfig(128, 256, 128, 1, 8, True, 8, 4)


def _check_device(dev: torch.device) -> None:
    if not triton_usable(dev):
        contract_error(f"the Triton kernel runs on CUDA tensors (or on CPU under TRITON_INTERPRET=1), got {dev}; "
                       "use pyfuser.nvfp4.reference.nvfp4_grouped_mm elsewhere")


def nvfp4_grouped_mm(
    mat1: torch.Tensor,
    mat2: torch.Tensor,
    scale1: torch.Tensor,
    scale2: torch.Tensor,
    alpha: torch.Tensor,
    problem_sizes: torch.Tensor,
    expert_offsets: torch.Tensor,
    sf_offsets: torch.Tensor,
    out_dtype,
    *,
    block_m: Optional[int] = None,
    block_n: Optional[int] = None,
    block_k: Optional[int] = None,
    split_k: Optional[int] = None,
    group_m: Optional[int] = None,
    predequant: Optional[bool] = None,
    num_warps: Optional[int] = None,
    num_stages: Optional[int] = None,
    out: Optional[torch.Tensor] = None,
    shapes: Optional[tuple] = None,
) -> torch.Tensor:
    """NVFP4 grouped GEMM; returns a contiguous ``[M, N]`` tensor of ``out_dtype`` (bf16 or fp16).

    Operands as ``fd.ops.cutlass_nvfp4_grouped_mm`` receives them (see the module docstring and
    ``pyfuser.nvfp4.reference.nvfp4_grouped_mm``). The keyword arguments override ``default_config``'s choice.
    Offsets and problem sizes are read on the device only: the launches never synchronize with the host. Offsets
    are trusted (the op layer validates them); reads of scale1 are bounded by its storage all the same (a row
    whose scales would extend past its end gets zero scales). ``out``: an optional preallocated ``[M, N]``
    result of ``out_dtype`` with unit column stride; every element of it is written (rows no group covers with
    zeros). ``shapes``: (M, N, K, G) from ``check_operands`` when the caller already checked the operands (the op
layer does, on every path), to skip checking them twice. Temporaries: with predequant the fp16 token planes (2*M*K bytes); with split-K an fp32 workspace and
    a counter per output tile, kept per device and stream between calls (the kernel leaves the counters zero)."""
    out_dtype = out_torch_dtype(out_dtype)
    if shapes is None:
        shapes = check_operands(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets)
    m, n, k, g = shapes
    _check_device(mat1.device)
    cfg = default_config(m, n, k, g)
    overrides = {key: v for key, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k),
                                        ("split_k", split_k), ("group_m", group_m), ("predequant", predequant),
                                        ("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
    if overrides:
        cfg = replace(cfg, **overrides)
        if cfg.block_k % 128 or cfg.block_m < 16 or cfg.block_n < 64 or cfg.split_k < 1 or cfg.group_m < 1:
            contract_error(f"block_k must be a multiple of 128, block_m >= 16 and block_n >= 64 (the MMA's sides), split_k "
                  f"and group_m >= 1, got {cfg}")
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(cfg, name)
            if v & (v - 1):
                contract_error(f"{name} must be a power of two, got {v}")

    dev = mat1.device
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=dev)
    elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != (m, n) or out.dtype != out_dtype
          or out.device != dev or (n > 1 and out.stride(1) != 1)):
        contract_error(f"out must be a [{m}, {n}] {out_dtype} tensor on {dev} with unit column stride")
    if m == 0 or n == 0:
        return out
    if g == 0:
        return out.zero_()
    # The kernels index these [G] vectors with unit stride.
    if alpha.stride(0) != 1 or expert_offsets.stride(0) != 1 or sf_offsets.stride(0) != 1:
        alpha, expert_offsets, sf_offsets = alpha.contiguous(), expert_offsets.contiguous(), sf_offsets.contiguous()
    if mat1.data_ptr() % 4 or mat2.data_ptr() % 4:
        contract_error("mat1 and mat2 must start on a 4-byte boundary (they are read as int32 words of 8 fp4 codes)")
    kw = k // 8
    g_block = _next_pow2(g)
    s1_capacity = scale1.untyped_storage().nbytes() - scale1.storage_offset()  # e4m3: one byte per element
    # Both fp4 operands are contiguous (validated): as int32 words, mat1 is [M, K/8] and mat2 (a [G, N, K/2]
    # weight passed transposed) is [G, N, K/8], with these word strides.
    stride_am, stride_bg, stride_bn = kw, n * kw, kw

    grid_m, grid_n = triton.cdiv(m, cfg.block_m) + g, triton.cdiv(n, cfg.block_n)
    split = min(cfg.split_k, triton.cdiv(kw, cfg.block_k // 8))  # every split gets at least one k-tile
    if split > 1:
        counters, workspace = _split_scratch(dev, grid_m * grid_n, grid_m * grid_n * split * cfg.block_n * cfg.block_m)
    else:
        counters = workspace = alpha  # never touched (SPLIT_K == 1 compiles the split-K epilogue away)

    if cfg.predequant:
        a_op = torch.empty((8, m, kw), dtype=torch.float16, device=dev)
        block_r, block_w = 16, 64
        launch(
            _dequant_a_kernel, (triton.cdiv(m, block_r), triton.cdiv(kw, block_w), 1),
            (mat1, scale1, problem_sizes, expert_offsets, sf_offsets, a_op),
            (m, kw, g, s1_capacity, stride_am, problem_sizes.stride(0)),
            dict(BLOCK_R=block_r, BLOCK_W=block_w, G_BLOCK=g_block), 4, 3,
            jit_tensors=lambda: (_words(mat1), scale1, problem_sizes, expert_offsets, sf_offsets, a_op),
        )
    else:
        a_op = mat1
    launch(
        _nvfp4_gemm_kernel, (grid_m * grid_n, split, 1),
        (a_op, scale1, mat2, scale2, alpha, problem_sizes, expert_offsets, sf_offsets, out, workspace, counters),
        (m, n, kw, g, s1_capacity, stride_am, stride_bg, stride_bn, scale2.stride(0), problem_sizes.stride(0),
         out.stride(0)),
        dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split, GROUP_M=cfg.group_m,
             A16=cfg.predequant, EVEN_K=(kw % (cfg.block_k // 8) == 0), G_BLOCK=g_block),
        cfg.num_warps, cfg.num_stages,
        jit_tensors=lambda: (a_op if cfg.predequant else _words(mat1), scale1, _words(mat2.transpose(-1, -2)),
                             scale2, alpha, problem_sizes, expert_offsets, sf_offsets, out, workspace, counters),
    )
    return out


def _words(t: torch.Tensor) -> torch.Tensor:
    """Packed fp4 bytes (K fastest, contiguous) re-viewed as int32 words of 8 codes."""
    return t.view(torch.uint8).view(torch.int32)


_SCRATCH: dict = {}


def _split_scratch(dev, n_counters: int, n_partials: int):
    """Zeroed tile counters and an fp32 partial workspace, kept per (device, stream): launches on one stream run
    one after the other, and each leaves the counters zero."""
    stream = driver.active.get_current_stream(dev.index) if dev.type == "cuda" else 0
    counters, workspace = _SCRATCH.get((dev, stream), (None, None))
    if counters is None or counters.numel() < n_counters:
        counters = torch.zeros((max(n_counters, 1024),), dtype=torch.int32, device=dev)
    if workspace is None or workspace.numel() < n_partials:
        workspace = torch.empty((n_partials,), dtype=torch.float32, device=dev)
    _SCRATCH[(dev, stream)] = (counters, workspace)
    return counters, workspace


@triton.jit
def _fp4_pair(w, scale, P: tl.constexpr):
    """Codes at nibbles P and P+4 of int32 words -> (lo, hi) fp16 tensors equal to fp4 * scale * 2**-7.

    ``bits`` holds, per 16-bit half, ``sign << 15 | (code & 7) << 9``: as fp16 that is fp4 * 2**-14 (code&7's
    two exponent bits become the fp16 exponent, its mantissa bit the top fp16 mantissa bit, exponent 0 the
    subnormal 0.5). ``scale`` is e4m3 * 2**7 in fp16, so the product is exact (module docstring)."""
    if P < 3:
        mag = (w << (9 - 4 * P)) & 0x0E000E00
    else:
        mag = (w >> 3) & 0x0E000E00  # bits above the masked ones do not matter, so arithmetic shift is fine
    sign = (w << (12 - 4 * P)) & -2147450880  # 0x80008000 as int32
    bits = mag | sign
    lo = bits.to(tl.int16).to(tl.float16, bitcast=True)
    hi = (bits >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return lo * scale, hi * scale


@triton.jit
def _swizzle_row(r):
    """The row part of the 128x4 swizzle's flat position (pk = K/16 columns): see layout_op.md."""
    return (r % 32) * 16 + ((r % 128) // 32) * 4


@triton.jit
def _load_s1(s1_ptr, s1_row, s1_mask, kb, PK):
    s_col = (kb // 4) * 512 + kb % 4
    return tl.load(s1_ptr + s1_row[:, None] + s_col[None, :], mask=s1_mask[:, None] & (kb < PK)[None, :], other=0.0)


@triton.jit
def _zero_rows(out_ptr, start, end, offs_n, n_mask, stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty)
    for r0 in range(start, end, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(ptrs, zeros, mask=(rows < end)[:, None] & n_mask[None, :])



# The token count, group count and scale1's size tile nothing: not specialized on (Triton would otherwise compile a
# variant per divisibility of each).
@triton.jit(do_not_specialize=["M", "G", "s1_capacity"])
def _dequant_a_kernel(
    a_ptr, s1_ptr, ps_ptr, eoff_ptr, sfoff_ptr, a16_ptr,
    M, KW, G, s1_capacity, stride_am, stride_ps,
    BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, G_BLOCK: tl.constexpr,
):
    """Tokens -> fp16 planes ``a16[q, r, j] = fp4(nibble q of word j of row r) * s1 * 2**-7``; zeros for rows no
    group covers."""
    pid_r = tl.program_id(0)
    pid_w = tl.program_id(1)

    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    # The group of each row: the one whose [start, start + size) holds it (groups never overlap), all G at once.
    offs_g = tl.arange(0, G_BLOCK)
    g_mask = offs_g < G
    starts = tl.load(eoff_ptr + offs_g, mask=g_mask, other=0)
    sizes = tl.load(ps_ptr + offs_g * stride_ps, mask=g_mask, other=0)
    hit = (starts[None, :] <= rows[:, None]) & (rows[:, None] < starts[None, :] + sizes[None, :]) & g_mask[None, :]
    grp = tl.max(tl.where(hit, offs_g[None, :], -1), axis=1)
    covered = (grp >= 0) & (rows < M)
    grp = tl.maximum(grp, 0)
    lr = rows - tl.load(eoff_ptr + grp, mask=covered, other=0)  # row inside its group
    sf = tl.load(sfoff_ptr + grp, mask=covered, other=0).to(tl.int64)

    PK = KW // 2  # scale columns (a multiple of 4: K % 64 == 0)
    s1_row = sf * PK + (lr // 128).to(tl.int64) * 128 * PK + _swizzle_row(lr)
    # Bound scale1 reads by its storage per row (a row's last scale sits at +(PK/4-1)*512+3).
    s1_mask = covered & (s1_row + (PK // 4 - 1) * 512 + 4 <= s1_capacity)
    kw = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    k_mask = kw < KW
    rows64 = rows.to(tl.int64)
    w = tl.load(a_ptr + rows64[:, None] * stride_am + kw[None, :], mask=covered[:, None] & k_mask[None, :], other=0)
    sa = _load_s1(s1_ptr, s1_row, s1_mask, pid_w * (BLOCK_W // 2) + tl.arange(0, BLOCK_W // 2), PK)
    sa = sa.to(tl.float16) * 128.0
    sa = tl.interleave(sa, sa)  # one scale per 16 values = 2 words

    plane = M.to(tl.int64) * KW
    dst = a16_ptr + rows64[:, None] * KW + kw[None, :]
    st_mask = (rows < M)[:, None] & k_mask[None, :]
    for p in tl.static_range(4):
        lo, hi = _fp4_pair(w, sa, p)
        tl.store(dst + p * plane, lo, mask=st_mask)
        tl.store(dst + (p + 4) * plane, hi, mask=st_mask)


@triton.jit(do_not_specialize=["M", "G", "s1_capacity"])
def _nvfp4_gemm_kernel(
    a_ptr, s1_ptr, b_ptr, s2_ptr, alpha_ptr, ps_ptr, eoff_ptr, sfoff_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, KW, G, s1_capacity,
    stride_am, stride_bg, stride_bn, stride_s2g, stride_ps, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    GROUP_M: tl.constexpr, A16: tl.constexpr, EVEN_K: tl.constexpr, G_BLOCK: tl.constexpr,
):
    # KW = K/8 int32 words per row, passed rather than derived so that Triton's divisibility specialization of
    # integer arguments sees it (vectorized, unmasked-in-K loads when EVEN_K).
    # A16: a_ptr holds _dequant_a_kernel's fp16 planes [8, M, KW]; otherwise the packed tokens [M, KW] (int32 words),
    # dequantized here with their scale1 block scales.
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M) + G
    num_pid_n = tl.cdiv(N, BLOCK_N)
    band = GROUP_M * num_pid_n  # programs per band of GROUP_M m-tiles, m-tile fastest inside a band
    first_m = (pid // band) * GROUP_M
    band_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % band) % band_m
    pid_n = (pid % band) // band_m

    # Which (group, m-tile) this program computes: prefix sums of the groups' tile counts (each group owns >= 1
    # tile), all G sizes in one vector load rather than a loop of G dependent scalar loads.
    offs_g = tl.arange(0, G_BLOCK)
    g_mask = offs_g < G
    sizes = tl.load(ps_ptr + offs_g * stride_ps, mask=g_mask, other=0)
    tiles = tl.where(g_mask, tl.maximum(tl.cdiv(sizes, BLOCK_M), 1), 0)
    ends = tl.cumsum(tiles, 0)
    grp = tl.sum((ends <= pid_m).to(tl.int32), 0)  # the first group whose tiles end after pid_m
    if grp >= G:
        return
    local = pid_m - tl.sum(tl.where(offs_g == grp, ends - tiles, 0), 0)

    m_g = tl.load(ps_ptr + grp * stride_ps)
    e_g = tl.load(eoff_ptr + grp)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N

    # Rows no group covers: tile 0 of each group zeroes the gap after the group (and group 0 the rows before it).
    nxt = tl.where(grp + 1 < G, tl.load(eoff_ptr + tl.minimum(grp + 1, G - 1)), M)
    gap_start = tl.minimum(tl.maximum(e_g + m_g, 0), M)
    gap_end = tl.where((local == 0) & (pid_k == 0), tl.minimum(nxt, M), gap_start)
    _zero_rows(out_ptr, gap_start, gap_end, offs_n, n_mask, stride_om, BLOCK_M, BLOCK_N)
    head_end = tl.where((grp == 0) & (local == 0) & (pid_k == 0), tl.minimum(e_g, M), 0)
    _zero_rows(out_ptr, 0, head_end, offs_n, n_mask, stride_om, BLOCK_M, BLOCK_N)
    if local * BLOCK_M >= m_g:  # an empty group's tile only zero-fills
        return

    BKW: tl.constexpr = BLOCK_K // 8
    PK = KW // 2  # scale columns (a multiple of 4: K % 64 == 0)
    lr = local * BLOCK_M + tl.arange(0, BLOCK_M)  # row inside the group
    rows = e_g + lr
    r_mask = (lr < m_g) & (rows < M)
    b_row_ptr = b_ptr + grp.to(tl.int64) * stride_bg + offs_n.to(tl.int64) * stride_bn
    s2_row = grp.to(tl.int64) * stride_s2g + (offs_n // 128).to(tl.int64) * 128 * PK + _swizzle_row(offs_n)

    # This split's k-tiles: a contiguous run of ceil(tiles / SPLIT_K) (the last run may be short or empty).
    run = tl.cdiv(tl.cdiv(KW, BKW), SPLIT_K)
    k_lo = pid_k * run * BKW
    k_hi = tl.minimum(k_lo + run * BKW, KW)

    if A16:
        plane = M.to(tl.int64) * KW
        a_row_ptr = a_ptr + rows.to(tl.int64) * KW
    else:
        a_row_ptr = a_ptr + rows.to(tl.int64) * stride_am
        sf_g = tl.load(sfoff_ptr + grp).to(tl.int64)
        s1_row = sf_g * PK + (lr // 128).to(tl.int64) * 128 * PK + _swizzle_row(lr)
        # Bound scale1 reads by its storage per ROW (a row's last scale sits at +(PK/4-1)*512+3): an element-wise
        # bound would make the mask vary along K, and the scale loads could no longer be vectorized and pipelined.
        s1_mask = r_mask & (s1_row + (PK // 4 - 1) * 512 + 4 <= s1_capacity)
        # scale1 is prefetched one k-tile ahead by hand: at decode tiles (16 rows x BLOCK_K/16 bytes) a thread holds
        # under 4 bytes of it, too few for the pipeliner's async copies, so it would otherwise wait on every load.
        sa_next = _load_s1(s1_ptr, s1_row, s1_mask, k_lo // 2 + tl.arange(0, BKW // 2), PK)

    offs_w = tl.arange(0, BKW)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BKW):
        kw = k0 + offs_w
        if EVEN_K:  # no mask along K, so the word loads vectorize to 16 bytes
            k_mask = tl.full((BKW,), 1, tl.int1)
        else:
            k_mask = kw < KW
        a_ptrs = a_row_ptr[:, None] + kw[None, :]
        a_mask = r_mask[:, None] & k_mask[None, :]
        bw = tl.load(b_row_ptr[:, None] + kw[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0)
        # One scale per 16-element block (2 words), loaded once and then repeated per word with interleave.
        # Loading it per word instead makes the scale load's scalar layout govern the whole dequantization
        # (seen in the compiled sm_90 SASS: twice the instructions per k-tile, and the dequantized weights go
        # through shared memory instead of straight into the MMA's register operand).
        kb = k0 // 2 + tl.arange(0, BKW // 2)
        if EVEN_K:
            kb_mask = tl.full((BKW // 2,), 1, tl.int1)
        else:
            kb_mask = kb < PK
        s_col = (kb // 4) * 512 + kb % 4  # 4 consecutive blocks are 4 consecutive bytes
        sb = tl.load(s2_ptr + s2_row[:, None] + s_col[None, :], mask=n_mask[:, None] & kb_mask[None, :], other=0.0)
        sb = sb.to(tl.float16) * 128.0
        sb = tl.interleave(sb, sb)
        if not A16:
            aw = tl.load(a_ptrs, mask=a_mask, other=0)
            sa = sa_next
            sa_next = _load_s1(s1_ptr, s1_row, s1_mask, kb + BKW // 2, PK)
            sa = sa.to(tl.float16) * 128.0
            sa = tl.interleave(sa, sa)
        for p in tl.static_range(4):
            if A16:
                a_lo = tl.load(a_ptrs + p * plane, mask=a_mask, other=0.0)
                a_hi = tl.load(a_ptrs + (p + 4) * plane, mask=a_mask, other=0.0)
            else:
                a_lo, a_hi = _fp4_pair(aw, sa, p)
            b_lo, b_hi = _fp4_pair(bw, sb, p)
            acc = tl.dot(b_lo, tl.trans(a_lo), acc)
            acc = tl.dot(b_hi, tl.trans(a_hi), acc)

    if SPLIT_K > 1:
        # Publish this split's partial, count arrivals; the last to arrive reduces all of them in split order.
        tile = pid_m * num_pid_n + pid_n
        offs_t = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        ws_tile = ws_ptr + tile.to(tl.int64) * (SPLIT_K * BLOCK_N * BLOCK_M)
        tl.store(ws_tile + pid_k * (BLOCK_N * BLOCK_M) + offs_t, acc)
        tl.debug_barrier()  # every thread's partial is written before the (release) counter update
        if tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu") != SPLIT_K - 1:
            return
        acc = tl.load(ws_tile + offs_t, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT_K):
            acc += tl.load(ws_tile + s * (BLOCK_N * BLOCK_M) + offs_t, cache_modifier=".cg")
        tl.store(cnt_ptr + tile, 0)  # every split has counted: the counter is zero again for the next launch

    # Undo the two 2**-7 operand factors together with alpha; one rounding to the output dtype.
    scale = tl.load(alpha_ptr + grp) * 16384.0
    res = (acc * scale).to(out_ptr.dtype.element_ty)
    ptrs = out_ptr + rows.to(tl.int64)[None, :] * stride_om + offs_n[:, None]
    tl.store(ptrs, res, mask=n_mask[:, None] & r_mask[None, :])


def _cutlass_nvfp4_grouped_mm_for(node, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets,
                                  dtype):
    """fd.ops.cutlass_nvfp4_grouped_mm's kernel: the op's checks (pyfuser/ops/narrow_precision.py), then the GEMM."""
    shapes = ops.check_gemm(node.op.name, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets,
                            sf_offsets)
    return nvfp4_grouped_mm(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets,
                            to_torch_dtype(dtype), shapes=shapes)


attach("cutlass_nvfp4_grouped_mm", kernel=_cutlass_nvfp4_grouped_mm_for)
