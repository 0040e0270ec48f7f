"""NVFP4 grouped GEMM for GPUs without FP4 tensor cores (Hopper): dequantize in registers, fp16 tensor-core dots.

``nvfp4_grouped_mm`` computes ``fd.ops.cutlass_nvfp4_grouped_mm`` with the run-time operands that op receives
(the contract of ``pyfuser.nvfp4.reference.nvfp4_grouped_mm``):
``out[e_i + r, n] = alpha[i] * sum_k A[e_i + r, k] * B_i[k, n]`` with ``A = fp4(mat1) * s1`` and
``B_i = fp4(mat2[i]) * s2[i]``, both scales read from their 128x4-swizzled e4m3 layouts. The kernel reads the
packed FP4 bytes and the e4m3 scales straight from the operands; no dequantized copy of either matrix exists.

Exactness. An fp4 value (at most 2 significant bits, a multiple of 0.5, |v| <= 6) times an e4m3 scale (4
significant bits, a multiple of 2**-9, <= 448) has at most 6 significant bits. Scaled by 2**-7 it is a multiple
of 2**-17 with magnitude <= 21, which fp16 (11 bits, subnormal step 2**-24, max 65504) holds EXACTLY. So each
operand is dequantized to ``fp4 * scale * 2**-7`` in fp16, the tensor cores multiply fp16 pairs exactly into an
fp32 accumulator, and the epilogue multiplies by ``alpha * 2**14`` (a power of two, so exact) and rounds once to
the output dtype. fp16 rather than bf16 because Triton's CPU interpreter computes bf16 dots on raw bit patterns
(shared/notes/measured_facts.md) while fp16 dots are right there: the kernel that the CPU tests run is the very
kernel the GPU runs.

Dequantization works on int32 words (8 fp4 codes) with two shifts and two masks per PAIR of values: nibble p and
nibble p+4 of a word land in the two 16-bit halves as fp16 bit patterns ``sign<<15 | code&7 << 9``, which read as
``fp4 * 2**-14`` (the fp4 exponent field becomes the low bits of the fp16 exponent field, and fp4's subnormal 0.5
becomes an fp16 subnormal). One fp16 multiply by ``scale * 2**7`` finishes the value. K is consumed in that
nibble order: the p-th sub-tile of A meets the p-th sub-tile of B, so a k-tile is 8 dots over BLOCK_K/8 words
(a permutation of the k sum, which is free since every product is exact).

Scheduling without a host sync: the grid is ``(cdiv(M, BLOCK_M) + G, cdiv(N, BLOCK_N))``. Each program takes
prefix sums of the groups' tile counts ``max(cdiv(m_i, BLOCK_M), 1)`` (m_i = problem_sizes[i, 0]) to find its
(group, m-tile);
the sum of those counts never exceeds the grid's first extent when sum(m_i) <= M, and extra programs exit.
Rows that no group covers are written with zeros by the program that holds tile 0 of the group before them (its
"gap" rows [e_i + m_i, e_{i+1}) or [e_{G-1} + m_{G-1}, M), and rows [0, e_0) for group 0); every group therefore
owns one program even when empty. This covers every uncovered row when the groups are in order and do not
overlap (what the op's offsets are: exclusive prefix sums), without a separate memset launch.

Swap-AB (``swap_ab=True``) computes the transposed tile ``out^T = B^T A^T``: the weights then fill the MMA's
M side (64/128 rows) and the few tokens of a decode step its N side, which suits Hopper's MMA shapes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Optional

import torch
import triton
import triton.language as tl

__all__ = ["GemmConfig", "default_config", "nvfp4_grouped_mm"]


@dataclass(frozen=True)
class GemmConfig:
    block_m: int  # token rows per tile (the MMA's N side when swap_ab)
    block_n: int  # output columns (weight rows) per tile
    block_k: int  # K elements per pipeline stage; a multiple of 128 (8 dots of block_k/8 >= 16 words)
    swap_ab: bool
    num_warps: int
    num_stages: int


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def default_config(m: int, n: int, k: int, g: int) -> GemmConfig:
    """Heuristic from the static sizes only (no host sync): tokens per expert decide decode vs prefill.

    Decode (<= 64 tokens per expert on average) is bound by reading the FP4 weights and by the integer work of
    dequantizing them: one m-tile covers a group's tokens (each weight byte is read and dequantized once), the
    weights take the MMA's M side (swap_ab), wide K tiles and 4 stages keep bytes in flight, and N tiles are 128
    wide (fewer instructions per weight; sm_90 SASS) unless that leaves under 2 programs per SM (132 SMs).
    Prefill is bound by the MMAs and the dequantization of both operands: 128x256 tiles dequantize each element
    once per 128 or 256 outputs. Blind defaults until benchmarks/sweep_nvfp4_gemm.py has run on the H200."""
    per_expert = -(-m // max(g, 1))
    if per_expert <= 64:
        block_m = min(64, max(16, _next_pow2(per_expert)))
        block_n = 128 if g * -(-n // 128) >= 264 else 64
        return GemmConfig(block_m, block_n, 256, True, 4, 4)
    return GemmConfig(128, 256, 128, False, 8, 3)


_SUPPORTED_OUT = (torch.bfloat16, torch.float16)


def _fail(msg: str):
    raise ValueError(f"nvfp4_grouped_mm: {msg}")


def _as_words(t: torch.Tensor, name: str) -> torch.Tensor:
    """Packed fp4 bytes (K fastest) re-viewed as int32 words of 8 codes; needs 4-byte aligned rows."""
    b = t.view(torch.uint8)
    if b.stride(-1) != 1:
        _fail(f"{name} must have its packed K dimension contiguous (stride 1), got strides {tuple(b.stride())}")
    if any(s % 4 for s in b.stride()[:-1]) or b.storage_offset() % 4 or b.data_ptr() % 4:
        _fail(f"{name} must have 4-byte aligned rows (strides {tuple(b.stride())}, offset {b.storage_offset()})")
    return b.view(torch.int32)


def _check_dtype(t: torch.Tensor, name: str, dtypes, what: str):
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes:
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        _fail(f"{name} must be {what}, got {got}")


def _out_torch_dtype(out_dtype) -> torch.dtype:
    if not isinstance(out_dtype, torch.dtype):  # a pyfuser DataType
        from ..ir.dtypes import to_torch_dtype

        out_dtype = to_torch_dtype(out_dtype)
    if out_dtype not in _SUPPORTED_OUT:
        _fail(f"out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
    return out_dtype


def _validate(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets):
    fp4 = (torch.float4_e2m1fn_x2, torch.uint8)  # uint8: the same packed bytes, already viewed for bit work
    _check_dtype(mat1, "mat1", fp4, "packed fp4 (float4_e2m1fn_x2) [M, K/2]")
    _check_dtype(mat2, "mat2", fp4, "packed fp4 (float4_e2m1fn_x2) [G, K/2, N]")
    _check_dtype(scale1, "scale1", (torch.float8_e4m3fn,), "float8_e4m3fn")
    _check_dtype(scale2, "scale2", (torch.float8_e4m3fn,), "float8_e4m3fn")
    _check_dtype(alpha, "alpha", (torch.float32,), "float32 [G]")
    for name, t in (("problem_sizes", problem_sizes), ("expert_offsets", expert_offsets), ("sf_offsets", sf_offsets)):
        _check_dtype(t, name, (torch.int32,), "int32")
    if mat1.dim() != 2 or mat2.dim() != 3:
        _fail(f"mat1 must be [M, K/2] and mat2 [G, K/2, N], got {tuple(mat1.shape)} and {tuple(mat2.shape)}")
    m, k = mat1.shape[0], mat1.shape[1] * 2
    g, n = mat2.shape[0], mat2.shape[2]
    if mat2.shape[1] * 2 != k:
        _fail(f"mat2's K/2 is {mat2.shape[1]} but mat1's is {mat1.shape[1]}")
    if k % 64 != 0:
        _fail(f"K must be a multiple of 64 (K/2 a multiple of 32), got K={k}")
    if n % 8 != 0:
        _fail(f"N must be a multiple of 8, got N={n}")
    if not mat1.is_contiguous():
        _fail(f"mat1 must be contiguous, got strides {tuple(mat1.stride())}")
    if not mat2.transpose(-1, -2).is_contiguous():
        _fail(f"mat2 must be a [G, N, K/2] contiguous weight passed as .transpose(-1, -2) (strides [N*K/2, 1, K/2]), "
              f"got strides {tuple(mat2.stride())}")
    sk = k // 16
    if scale1.dim() != 2 or scale1.shape[1] != sk or not scale1.is_contiguous():
        _fail(f"scale1 must be a contiguous [rows, K/16={sk}] e4m3 tensor (the layout op's result or a plain "
              f"[sum R_i, K/16] buffer), got shape {tuple(scale1.shape)} strides {tuple(scale1.stride())}")
    n_rows = -(-n // 128) * 128
    if scale2.dim() != 3 or tuple(scale2.shape) != (g, n_rows, sk) or not scale2.is_contiguous():
        _fail(f"scale2 must be a contiguous [G, roundup(N,128), K/16] = {(g, n_rows, sk)} e4m3 tensor (each slice "
              f"128x4-swizzled), got shape {tuple(scale2.shape)} strides {tuple(scale2.stride())}")
    if tuple(alpha.shape) != (g,):
        _fail(f"alpha must be [G={g}], got {tuple(alpha.shape)}")
    if tuple(problem_sizes.shape) != (g, 3):
        _fail(f"problem_sizes must be [G={g}, 3], got {tuple(problem_sizes.shape)}")
    for name, t in (("expert_offsets", expert_offsets), ("sf_offsets", sf_offsets)):
        if tuple(t.shape) != (g,):
            _fail(f"{name} must be [G={g}], got {tuple(t.shape)}")
    devices = {t.device for t in (mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets)}
    if len(devices) != 1:
        _fail(f"all operands must be on one device, got {sorted(map(str, devices))}")
    dev = mat1.device
    if dev.type != "cuda" and not (dev.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"):
        _fail(f"the Triton kernel runs on CUDA tensors (or on CPU under TRITON_INTERPRET=1), got {dev}; "
              "use pyfuser.nvfp4.reference.nvfp4_grouped_mm elsewhere")
    return m, n, k, g


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
    swap_ab: Optional[bool] = None,
    num_warps: Optional[int] = None,
    num_stages: Optional[int] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """NVFP4 grouped GEMM; returns a contiguous ``[M, N]`` tensor of ``out_dtype`` (bf16 or fp16).

    Operands as ``fd.ops.cutlass_nvfp4_grouped_mm`` receives them (see the module docstring and
    ``pyfuser.nvfp4.reference.nvfp4_grouped_mm``). The keyword arguments override ``default_config``'s choice.
    Offsets and problem sizes are read on the device only: the launch never synchronizes with the host. Offsets
    are trusted (the op layer validates them); reads of scale1 are bounded by its storage all the same (a row
    whose scales would extend past its end gets zero scales). ``out``: an optional preallocated ``[M, N]``
    result of ``out_dtype`` with unit column stride; every element of it is written (rows no group covers with
    zeros)."""
    out_dtype = _out_torch_dtype(out_dtype)
    m, n, k, g = _validate(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets)
    cfg = default_config(m, n, k, g)
    overrides = dict(block_m=block_m, block_n=block_n, block_k=block_k, swap_ab=swap_ab, num_warps=num_warps,
                     num_stages=num_stages)
    cfg = replace(cfg, **{key: v for key, v in overrides.items() if v is not None})
    if cfg.block_k % 128 or cfg.block_m < 16 or cfg.block_n < 16:
        _fail(f"block_k must be a multiple of 128 and block_m, block_n >= 16 (tl.dot needs 16), got {cfg}")
    for name in ("block_m", "block_n", "block_k"):
        v = getattr(cfg, name)
        if v & (v - 1):
            _fail(f"{name} must be a power of two, got {v}")

    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=mat1.device)
    elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != (m, n) or out.dtype != out_dtype
          or out.device != mat1.device or (n > 1 and out.stride(1) != 1)):
        _fail(f"out must be a [{m}, {n}] {out_dtype} tensor on {mat1.device} with unit column stride")
    if m == 0 or n == 0:
        return out
    if g == 0:
        return out.zero_()
    # The kernel indexes these [G] vectors with unit stride; .contiguous() is free when they already are.
    alpha, expert_offsets, sf_offsets = alpha.contiguous(), expert_offsets.contiguous(), sf_offsets.contiguous()
    a_words = _as_words(mat1, "mat1")  # [M, K/8]
    b_words = _as_words(mat2.transpose(-1, -2), "mat2")  # [G, N, K/8]
    s1_capacity = scale1.untyped_storage().nbytes() - scale1.storage_offset()  # e4m3: one byte per element
    grid = (triton.cdiv(m, cfg.block_m) + g, triton.cdiv(n, cfg.block_n))
    _nvfp4_grouped_mm_kernel[grid](
        a_words, b_words, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets, out,
        m, n, k // 8, g, s1_capacity,
        a_words.stride(0), b_words.stride(0), b_words.stride(1), scale2.stride(0), problem_sizes.stride(0),
        out.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SWAP_AB=cfg.swap_ab,
        EVEN_K=(k % cfg.block_k == 0), G_BLOCK=_next_pow2(g),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


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


# Values that tile nothing are not specialized on (Triton would otherwise compile a variant per divisibility of
# the token count, of the group count and of scale1's size).
@triton.jit(do_not_specialize=["M", "G", "s1_capacity"])
def _nvfp4_grouped_mm_kernel(
    a_ptr, b_ptr, s1_ptr, s2_ptr, alpha_ptr, ps_ptr, eoff_ptr, sfoff_ptr, out_ptr,
    M, N, KW, G, s1_capacity,
    stride_am, stride_bg, stride_bn, stride_s2g, stride_ps, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr,
    EVEN_K: tl.constexpr, G_BLOCK: tl.constexpr,
):
    # KW = K/8 int32 words per row, passed rather than derived so that Triton's divisibility specialization of
    # integer arguments sees it (vectorized, unmasked-in-K loads when EVEN_K).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)

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
    gap_end = tl.where(local == 0, tl.minimum(nxt, M), gap_start)
    _zero_rows(out_ptr, gap_start, gap_end, offs_n, n_mask, stride_om, BLOCK_M, BLOCK_N)
    head_end = tl.where((grp == 0) & (local == 0), tl.minimum(e_g, M), 0)
    _zero_rows(out_ptr, 0, head_end, offs_n, n_mask, stride_om, BLOCK_M, BLOCK_N)
    if local * BLOCK_M >= m_g:  # an empty group's tile only zero-fills
        return

    PK = KW // 2  # scale columns (a multiple of 4: K % 64 == 0)
    BKW: tl.constexpr = BLOCK_K // 8
    lr = local * BLOCK_M + tl.arange(0, BLOCK_M)  # row inside the group
    rows = e_g + lr
    r_mask = (lr < m_g) & (rows < M)
    a_row_ptr = a_ptr + rows.to(tl.int64) * stride_am
    sf_g = tl.load(sfoff_ptr + grp).to(tl.int64)
    s1_row = sf_g * PK + (lr // 128).to(tl.int64) * 128 * PK + _swizzle_row(lr)
    # Bound scale1 reads by its storage per ROW (a row's last scale sits at +(PK/4-1)*512+3): an element-wise
    # bound would make the mask vary along K, and the scale loads could no longer be vectorized and pipelined.
    s1_mask = r_mask & (s1_row + (PK // 4 - 1) * 512 + 4 <= s1_capacity)
    b_row_ptr = b_ptr + grp.to(tl.int64) * stride_bg + offs_n.to(tl.int64) * stride_bn
    s2_row = grp.to(tl.int64) * stride_s2g + (offs_n // 128).to(tl.int64) * 128 * PK + _swizzle_row(offs_n)

    offs_w = tl.arange(0, BKW)
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # scale1 is prefetched one k-tile ahead by hand: at decode tiles (16 rows x BLOCK_K/16 bytes) a thread holds
    # under 4 bytes of it, too few for the pipeliner's async copies, so it would otherwise wait on every load.
    sa_next = _load_s1(s1_ptr, s1_row, s1_mask, tl.arange(0, BKW // 2), KW // 2)
    for k0 in range(0, KW, BKW):
        kw = k0 + offs_w
        if EVEN_K:  # no mask along K, so the word loads vectorize to 16 bytes
            k_mask = tl.full((BKW,), 1, tl.int1)
        else:
            k_mask = kw < KW
        aw = tl.load(a_row_ptr[:, None] + kw[None, :], mask=r_mask[:, None] & k_mask[None, :], other=0)
        bw = tl.load(b_row_ptr[:, None] + kw[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0)
        # One scale per 16-element block (2 words), loaded once and then repeated per word with interleave.
        # Loading it per word instead makes the scale load's scalar layout govern the whole dequantization
        # (seen in the compiled sm_90 SASS: twice the instructions per k-tile, and the dequantized weights go
        # through shared memory instead of straight into the MMA's register operand).
        kb = k0 // 2 + tl.arange(0, BKW // 2)
        if EVEN_K:
            kb_mask = tl.full((BKW // 2,), 1, tl.int1)
        else:
            kb_mask = kb < KW // 2
        s_col = (kb // 4) * 512 + kb % 4  # 4 consecutive blocks are 4 consecutive bytes
        sa = sa_next
        sa_next = _load_s1(s1_ptr, s1_row, s1_mask, kb + BKW // 2, KW // 2)
        sb = tl.load(s2_ptr + s2_row[:, None] + s_col[None, :], mask=n_mask[:, None] & kb_mask[None, :], other=0.0)
        sa = sa.to(tl.float16) * 128.0
        sb = sb.to(tl.float16) * 128.0
        sa = tl.interleave(sa, sa)
        sb = tl.interleave(sb, sb)
        for p in tl.static_range(4):
            a_lo, a_hi = _fp4_pair(aw, sa, p)
            b_lo, b_hi = _fp4_pair(bw, sb, p)
            if SWAP_AB:
                acc = tl.dot(b_lo, tl.trans(a_lo), acc)
                acc = tl.dot(b_hi, tl.trans(a_hi), acc)
            else:
                acc = tl.dot(a_lo, tl.trans(b_lo), acc)
                acc = tl.dot(a_hi, tl.trans(b_hi), acc)

    # Undo the two 2**-7 operand factors together with alpha; one rounding to the output dtype.
    scale = tl.load(alpha_ptr + grp) * 16384.0
    res = (acc * scale).to(out_ptr.dtype.element_ty)
    if SWAP_AB:
        ptrs = out_ptr + rows.to(tl.int64)[None, :] * stride_om + offs_n[:, None]
        tl.store(ptrs, res, mask=n_mask[:, None] & r_mask[None, :])
    else:
        ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(ptrs, res, mask=r_mask[:, None] & n_mask[None, :])
