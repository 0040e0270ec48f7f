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
plane q of the tokens (a permutation of the k sum, which is free since every product is exact). With
``paired_planes`` (on in the default decode configs) the decode kernel computes the same values on the GPU by
inline PTX on two k-adjacent words at a time (``_fp4_planes``): about 4 instructions per pair of values instead of
6, since the pairs come out as the MMA's register operand holds them; its dots run in plane order 0, 2, 1, 3.

No host sync; one launch, or 1 + 2 per chunk of experts with ``predequant``:
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
- Decode (few tokens): the tokens are dequantized inside the k loop too, one launch.
- One token per expert (``INTEGER_MAX_TOKENS``): ``_nvfp4_gemm_int_kernel`` computes each 16-element block's dot
  product exactly on the integer units (byte permutes turn codes into twice their values, dp4a multiplies and
  adds 4 at a time; see the comment above it) and sums the scaled blocks in fp32, one token per program. No
  tensor cores or MMA barriers: with 64-row tiles 2.6 sm_90 instructions per weight (the shared-memory pipeline
  its loads go through, two steps in flight, included) against the tensor-core loop's 4.4. H200, CUDA graphs, 8 experts,
  K=4096 (benchmarks/sweep_nvfp4_integer.py): N=14336 130 -> 83 us (2.9x -> 4.5x bf16), N=2048 29.5 -> 21.5 us
  (2.0x -> 2.8x; 0.87x the time of a plain copy of the same bytes at this size); at 2 tokens per expert it
  draws at best (N=14336 130 vs 125-133 us), since each token's program decodes the weights again. Split-K as
  below, by ``integer_config`` where the tokens' tiles are too few to fill the GPU. Its grid runs bands of 8
  m-slots so that the empty m-slots' programs start after every working one.
- Prefill (``predequant``): both operands are dequantized once, exactly, to fp16 in k order (``_dequant_a_kernel``,
  ``_dequant_b_kernel``), and the same kernel then runs as a plain fp16 grouped GEMM (``F16``: one dot of
  BLOCK_K per k-tile, both operands through the pipeliner's shared-memory stages). Measured on the H200 (G=8,
  K=4096, 1024 tokens per expert): the register-operand form waits for its MMAs after every two dots (the SASS
  has ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` after each pair of ``HGMMA``), so dequantization and tensor cores never
  overlap, and it stays at 0.57x bf16 cuBLAS even with the dequantization removed (320 vs 355 us at N=2048); an
  fp16 Triton GEMM of this tiling reaches 214 us, 0.90x cuBLAS. The fp16 weights pass through a buffer of at
  most ``F16_WEIGHT_BUDGET`` bytes: experts are dequantized and multiplied a chunk at a time, each GEMM launch
  computing only its chunk's groups (their gap rows included, so every row is still written once).

Split-K (decode shapes with too few tiles to fill the GPU): SPLIT_K programs share a tile, each over a contiguous
range of k-tiles; each stores its fp32 partial in a workspace, then bumps the tile's counter; the last one to
arrive sums the SPLIT_K partials in split order (deterministic: the same bits whatever the arrival order), resets
the counter to zero for the next launch and runs the epilogue.

Host cost matters as much as GPU time at decode sizes: see ``pyfuser/codegen/launcher.py`` (cached
specializations are launched without Triton's per-call argument binding), and :class:`GroupedGemm`, which does
everything but allocating and launching once per operand layout (the op's kernel keeps one per input signature).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ..codegen.interpreter_compat import interpreting
from ..codegen.launcher import bound_launch, cdiv, next_pow2, triton_usable
from ..ir.dtypes import to_torch_dtype
from ..ops import narrow_precision as ops
from ..ops.offset_checks import PreparedGroupCheck
from ..ops.registry import attach
from ..nvfp4.gemm_contract import check_operands, contract_error, out_torch_dtype
from .group_offsets_check import fused_check_args, group_offsets_bits, or_into_flags

__all__ = ["GemmConfig", "GroupedGemm", "default_config", "integer_config", "nvfp4_grouped_mm",
           "tensor_core_config"]

_NUM_SMS = 132  # H200; only shapes the heuristic's split-K choice
# Bytes of dequantized fp16 weights one predequant GEMM launch covers: experts are dequantized and multiplied a
# chunk at a time, so the temporary never exceeds this (or one expert's weights, if larger).
F16_WEIGHT_BUDGET = 256 << 20


@dataclass(frozen=True)
class GemmConfig:
    block_m: int  # tokens per tile (the MMA's N side)
    block_n: int  # output columns (weight rows) per tile (the MMA's M side)
    block_k: int  # K elements per pipeline stage: >= 128 (8 dots of block_k/8 >= 16 words), >= 16 with predequant
    split_k: int  # programs sharing one output tile along K
    group_m: int  # m-tiles per band of the program order (L2 reuse)
    predequant: bool  # dequantize both operands to fp16 in first launches (else in registers in the k loop)
    num_warps: int
    num_stages: int  # (integer kernel: its k loop's pipeline depth through shared memory; 1 loads in place)
    integer: bool = False  # block dot products on the integer units (_nvfp4_gemm_int_kernel), block_m = 1
    # ptxas's register cap (Triton's ``maxnreg``; None: uncapped). Residency per SM is set by registers at decode
    # tiles, so a cap can turn a grid's partial second wave into one wave.
    max_registers: Optional[int] = None
    # Decode kernel: dequantize two planes of two k-adjacent words per inline-PTX call on the GPU (_fp4_planes,
    # about 4 instructions per pair of values instead of 6) and run the dots in plane order 0, 2, 1, 3. On in
    # tensor_core_config's decode configs; off here so that a config built by hand keeps the one-plane form.
    paired_planes: bool = False
    # Decode launches, when the call asks for the offsets' device check: where it runs. "call": program 0 of the
    # GEMM's launch calls it as a function of its own (_fused_offsets_check_call), one launch fewer per call;
    # "inline": the same, inlined; "launch": a launch of its own before the GEMM, which then runs its unchecked
    # kernel. Any code added to the kernel can change how ptxas schedules its main loop, so which costs nothing
    # depends on the specialization (tensor_core_config has the measurements).
    check_form: str = "call"


# Up to this many tokens per expert (on average: the sizes are static, the groups' counts are not) the default is
# the integer kernel, one token per program (benchmarks/sweep_nvfp4_integer.py).
INTEGER_MAX_TOKENS = 1
# 64 weight rows x 512 k per step, 4 warps, 3 stages (two steps in flight through shared memory): on the H200 at
# G=8, K=4096, one token per expert, 83 us at N=14336 (87 us with one step prefetched in registers, 32-row tiles)
# and 21.5 us at N=2048, 0.87x the time of a plain copy of the same bytes (2026-12-04).
INTEGER_CONFIG = GemmConfig(1, 64, 512, 1, 1, False, 4, 3, integer=True)


@functools.lru_cache(maxsize=256)
def default_config(m: int, n: int, k: int, g: int) -> GemmConfig:
    """Heuristic from the static sizes only (no host sync): :func:`integer_config` for the fewest tokens per
    expert, else :func:`tensor_core_config`."""
    if -(-m // max(g, 1)) <= INTEGER_MAX_TOKENS:
        return integer_config(m, n, k, g)
    return tensor_core_config(m, n, k, g)


@functools.lru_cache(maxsize=256)
def integer_config(m: int, n: int, k: int, g: int) -> GemmConfig:
    """INTEGER_CONFIG, split along K while the tokens' tiles (one per token and 64 weight rows) would not give
    every SM a program and each split keeps >= 2 steps: G=1, N=2048, one token: 12.2 -> 10.8 us with split 4
    (32 tiles); at G=8 (256 tiles) splitting is slower (21.4 -> 25.2 us with split 2; 2026-12-04 sweeps)."""
    cfg = INTEGER_CONFIG
    tiles = m * -(-n // cfg.block_n)
    split = 1
    while tiles * split * 2 <= _NUM_SMS and k // (cfg.block_k * split * 2) >= 2:
        split *= 2
    return replace(cfg, split_k=split)


@functools.lru_cache(maxsize=256)
def tensor_core_config(m: int, n: int, k: int, g: int) -> GemmConfig:
    """The tensor-core kernel's config, from the static sizes only: tokens per expert decide decode vs prefill.

    - decode (<= 64 tokens per expert): one m-tile holds an expert's tokens, dequantized inside the k loop (a
      first launch costs more than it saves at this size, and fp16 token tiles crowd shared memory), BLOCK_K 256,
      4 warps, planes paired (``paired_planes``), split-K until there are 2 programs per SM (N=2048: split 2).
      Chosen on an H100 (G=8, K=4096, CUDA graphs, L2 cleared by a read; 2026-12-06, docs/nvfp4.md): with paired
      planes, 64-wide weight tiles and 3 stages at 16-token tiles (N=14336: 131.9 us unpaired in 128-wide tiles ->
      112.1 us; 128-wide paired tiles take 151 us, 64-wide unpaired ones 150.6 us; N=2048: 27.9 -> 24.0 us), 4
      stages at 32-token tiles (N=14336: 181.9 -> 157.4 us, 170.8 us with 3; N=2048: 36.7 -> 31.1 us, 30.3 with 3).
    - 33-64 tokens per expert: the tokens' in-loop dequantization is repeated for every weight tile, so 128-wide
      weight tiles (half the repeats), split-K to one program per SM: N=2048 split 2, 47.6 -> 39.5 us (2026-12-02,
      H200); paired planes, 4 stages (H100: N=2048 39.7 -> 35.6 us, N=14336 200.5 -> 192.0 us; 3 stages ties).
    - prefill: both operands dequantized to fp16 first, then 128 weight rows x 256 tokens x 64 k per tile, 8 warps,
      4 stages: 284 us at N=2048 and 1828 us at N=14336 with 1024 tokens per expert, 0.71x / 0.70x bf16
      _grouped_mm (the register-operand form: 352 / 2213 us; 256 x 128 tiles: 299 / 1921 us; H200, from
      benchmarks/sweep_nvfp4_gemm.py)."""
    per_expert = -(-m // max(g, 1))
    if per_expert <= 64:
        block_m = max(16, next_pow2(per_expert))
        block_n = 128 if block_m >= 64 else 64
        tiles = g * -(-n // block_n)
        programs = 2 * _NUM_SMS if block_m < 64 else _NUM_SMS  # 64-token tiles: 4x the MMA work per program
        split_k = 1
        while tiles * split_k < programs and k // (256 * split_k) >= 4:
            split_k *= 2
        stages = 3 if block_m == 16 else 4
        # The offsets' device check as a call from program 0, but inlined in 16-token tiles split along K: there
        # the call cost 14% (H100, N=2048, 16 tokens per expert: 31.1 us, 27.3 inlined, 27.4 without the check),
        # while inlined it cost 14% at N=14336, 16 tokens (144.8 us against 126.6 as a call) and 2048, 64 tokens
        # (43.3 against 37.9). Both ran as fast as no check at N=14336, 64 tokens; 32-token tiles are untimed.
        check_form = "inline" if block_m == 16 and split_k > 1 else "call"
        return GemmConfig(block_m, block_n, 256, split_k, 8, False, 4, stages, paired_planes=True,
                          check_form=check_form)
    return GemmConfig(256, 128, 64, 1, 8, True, 8, 4)


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
    integer: Optional[bool] = None,
    max_registers: Optional[int] = None,
    paired_planes: Optional[bool] = None,
    out: Optional[torch.Tensor] = None,
    shapes: Optional[tuple] = None,
) -> torch.Tensor:
    """NVFP4 grouped GEMM; returns a contiguous ``[M, N]`` tensor of ``out_dtype`` (bf16 or fp16).

    Operands as ``fd.ops.cutlass_nvfp4_grouped_mm`` receives them (see the module docstring and
    ``pyfuser.nvfp4.reference.nvfp4_grouped_mm``). The keyword arguments override ``default_config``'s choice
    (with ``integer`` set against it, they override the default of the kernel it names: ``integer_config`` or
    ``tensor_core_config``).
    Offsets and problem sizes are read on the device only: the launches never synchronize with the host. Offsets
    are trusted (the op layer validates them); reads of scale1 are bounded by its storage all the same (a row
    whose scales would extend past its end gets zero scales). ``out``: an optional preallocated ``[M, N]``
    result of ``out_dtype`` with unit column stride; every element of it is written (rows no group covers with
    zeros). ``shapes``: (M, N, K, G) from ``check_operands`` when the caller already checked the operands (the
    op layer does, on every path), to skip checking them twice. Temporaries: with predequant the fp16 tokens (2*M*K
    bytes) and fp16 weights of a chunk of experts (at most F16_WEIGHT_BUDGET bytes, or one expert's); with split-K
    an fp32 workspace and a counter per output tile (a GroupedGemm keeps its own between calls: the kernel leaves
    the counters zero). The same as preparing a :class:`GroupedGemm` and calling it once."""
    overrides = {key: v for key, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k),
                                        ("split_k", split_k), ("group_m", group_m), ("predequant", predequant),
                                        ("num_warps", num_warps), ("num_stages", num_stages),
                                        ("integer", integer), ("max_registers", max_registers),
                                        ("paired_planes", paired_planes)) if v is not None}
    operands = (mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets)
    out_stride = out.stride(0) if isinstance(out, torch.Tensor) and out.dim() == 2 else None  # (else refused)
    gemm = GroupedGemm(*operands, out_dtype, shapes=shapes, out_stride=out_stride, **overrides)
    return gemm(*operands, out=out)


def _config(m: int, n: int, k: int, g: int, overrides: dict) -> GemmConfig:
    cfg = default_config(m, n, k, g)
    if overrides:
        # Overrides apply to the default of the kernel they ask for (``integer``, else the default's kernel).
        if overrides.get("integer", cfg.integer) != cfg.integer:
            cfg = (integer_config if overrides["integer"] else tensor_core_config)(m, n, k, g)
        cfg = replace(cfg, **overrides)
        if (cfg.integer or cfg.predequant) and "paired_planes" not in overrides:
            cfg = replace(cfg, paired_planes=False)  # a default's decode-kernel form the caller did not ask for
        if cfg.integer:
            if (cfg.block_k < 32 or cfg.block_m != 1 or cfg.block_n < 16 or cfg.split_k < 1 or cfg.num_stages < 1
                    or cfg.predequant):
                contract_error(f"the integer kernel takes block_k >= 32 (two 16-element blocks per step), block_m "
                               f"1 (one token per program), block_n >= 16, split_k and num_stages >= 1 and no "
                               f"predequant, got {cfg} (integer=False selects the tensor-core kernel)")
        else:
            min_k = 16 if cfg.predequant else 128  # an fp16 dot's K, or 8 of them (one per fp4 nibble plane)
            if cfg.block_k < min_k or cfg.block_m < 16 or cfg.block_n < 64 or cfg.split_k < 1 or cfg.group_m < 1:
                contract_error(f"block_k must be >= {min_k} (with predequant={cfg.predequant}), block_m >= 16 and "
                               f"block_n >= 64 (the MMA's sides), split_k and group_m >= 1, got {cfg}")
        if cfg.paired_planes and (cfg.integer or cfg.predequant):
            contract_error(f"paired_planes applies to the tensor-core decode kernel (integer=False, predequant=False), "
                           f"got {cfg}")
        if cfg.check_form not in ("call", "inline", "launch"):
            contract_error(f"check_form must be 'call', 'inline' or 'launch', got {cfg.check_form!r}")
        if cfg.max_registers is not None and not 32 <= cfg.max_registers <= 255:
            contract_error(f"max_registers must be None or between 32 and 255 (ptxas's registers per thread), got "
                           f"{cfg.max_registers}")
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(cfg, name)
            if v & (v - 1):
                contract_error(f"{name} must be a power of two, got {v}")
    return cfg


class GroupedGemm:
    """:func:`nvfp4_grouped_mm` for operands of fixed metadata (sizes, strides, dtypes, device, 4-byte alignment of
    the fp4 operands) and a fixed size of scale1's storage: checked, configured and bound once (tile config, grids,
    integer arguments, one :class:`BoundLaunch` per launch), so that a call only allocates the output and
    temporaries, binds the pointers and launches. ``out_stride``: the row stride of the ``out`` tensors calls pass
    (None: they pass none and get a fresh contiguous result)."""

    def __init__(self, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets, out_dtype, *,
                 shapes: Optional[tuple] = None, out_stride: Optional[int] = None, check=None, **overrides):
        self.out_dtype = out_torch_dtype(out_dtype)
        if shapes is None:
            shapes = check_operands(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets)
        m, n, k, g = self.shapes = shapes
        self.device = dev = mat1.device
        _check_device(dev)
        self.cfg = cfg = _config(m, n, k, g, overrides)
        self.out_stride = n if out_stride is None else out_stride
        self.launches = None  # nothing to launch: an empty result, or zeros (no groups)
        self.scratch_sizes = (0, 0)  # split-K tile counters and partials that the largest launch needs
        self._split_scratch: Optional[_SplitScratch] = None  # allocated on first use
        self.checked = None  # the decode launch that also runs ``check`` on the device (fuses_check)
        if m == 0 or n == 0 or g == 0:
            return
        # The kernels index these [G] vectors with unit stride.
        self.dense_vectors = alpha.stride(0) == 1 and expert_offsets.stride(0) == 1 and sf_offsets.stride(0) == 1
        if mat1.data_ptr() % 4 or mat2.data_ptr() % 4:
            contract_error("mat1 and mat2 must start on a 4-byte boundary (they are read as int32 words of 8 fp4 "
                           "codes)")
        kw = k // 8
        g_block = next_pow2(g)
        s1_capacity = scale1.untyped_storage().nbytes() - scale1.storage_offset()  # e4m3: one byte per element
        # Both fp4 operands are contiguous (validated): as int32 words, mat1 is [M, K/8] and mat2 (a [G, N, K/2]
        # weight passed transposed) is [G, N, K/8], with these word strides.
        stride_am, stride_bg, stride_bn = kw, n * kw, kw
        bkw = max(cfg.block_k // 8, 1)  # words per k-tile
        # Each split takes a run of cdiv(k-tiles, split_k) k-tiles; as many splits as that leaves non-empty.
        tiles_k = max(cdiv(kw, bkw), 1)
        self.split = split = cdiv(tiles_k, cdiv(tiles_k, cfg.split_k))
        asm = not interpreting()  # inline PTX in either decode kernel (the interpreter runs their element-wise forms)
        meta = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split,
                    GROUP_M=cfg.group_m, F16=cfg.predequant, EVEN_K=(kw % bkw == 0), G_BLOCK=g_block,
                    ASM=asm, PAIRED=cfg.paired_planes)
        ints = (m, n, kw, g, s1_capacity, stride_am, stride_bg, stride_bn, scale2.stride(0), problem_sizes.stride(0),
                self.out_stride)
        # (the interpreter takes no compile options)
        options = {"maxnreg": cfg.max_registers} if cfg.max_registers is not None and asm else None

        def check_args(check):
            # (CHECK_CALL only where there is a check: unchecked launches of any check_form share one compile)
            checks, check_meta = fused_check_args(check, g, sizes=True)
            return checks, {**check_meta, "CHECK_CALL": check is not None and cfg.check_form == "call"}

        def gemm(g_lo, g_hi, check=None):
            # Groups [g_lo, g_hi): their tiles fit in cdiv(M, BLOCK_M) + (g_hi - g_lo) m-slots (docstring).
            grid_m, grid_n = cdiv(m, cfg.block_m) + g_hi - g_lo, cdiv(n, cfg.block_n)
            self._grow_scratch(grid_m * grid_n, grid_m * grid_n * split * cfg.block_n * cfg.block_m)
            checks, check_meta = check_args(check)
            return bound_launch(_nvfp4_gemm_kernel, (grid_m * grid_n, split, 1), (*ints, g_lo, g_hi, *checks),
                                {**meta, **check_meta}, cfg.num_warps, cfg.num_stages, device=dev,
                                compile_options=options)

        if cfg.integer:
            # EVEN_K: every split's run of words is whole steps (a multiple of bkw, KW included).
            int_meta = dict(BLOCK_N=cfg.block_n, BLOCK_KW=bkw, SPLIT_K=split, EVEN_K=kw > 0 and kw % bkw == 0,
                            G_BLOCK=g_block, ASM=asm, STAGES=cfg.num_stages)
            tiles = (m + g) * cdiv(n, cfg.block_n)  # one token per tile
            self._grow_scratch(tiles, tiles * split * cfg.block_n)

            def int_gemm(check=None):
                checks, check_meta = check_args(check)
                return bound_launch(_nvfp4_gemm_int_kernel, (tiles, split, 1), (*ints, *checks),
                                    {**int_meta, **check_meta}, cfg.num_warps, cfg.num_stages, device=dev,
                                    compile_options=options)

            self.launches = [int_gemm()]
            if check is not None and cfg.check_form != "launch":
                self.checked = int_gemm(check)
            return
        if not cfg.predequant:
            self.launches = [gemm(0, g)]
            if check is not None and cfg.check_form != "launch":
                self.checked = gemm(0, g, check)
            return
        # Prefill: both operands dequantized to fp16 (exact) by first launches, then a plain fp16 grouped GEMM. The
        # weights go through a bounded buffer, a chunk of experts at a time.
        block_r, block_w = 16, 64
        self.dequant_a = bound_launch(_dequant_a_kernel, (cdiv(m, block_r), cdiv(kw, block_w), 1),
                                      (m, kw, g, s1_capacity, stride_am, problem_sizes.stride(0)),
                                      dict(BLOCK_R=block_r, BLOCK_W=block_w, G_BLOCK=g_block), 4, 3, device=dev)
        self.chunk = chunk = max(1, min(g, F16_WEIGHT_BUDGET // (2 * n * k)))
        self.launches = []
        for g_lo in range(0, g, chunk):
            g_hi = min(g, g_lo + chunk)
            dequant_b = bound_launch(_dequant_b_kernel, ((g_hi - g_lo) * cdiv(n, block_r), cdiv(kw, block_w), 1),
                                     (n, kw, g_lo, stride_bg, stride_bn, scale2.stride(0)),
                                     dict(BLOCK_R=block_r, BLOCK_W=block_w), 4, 3, device=dev)
            self.launches.append((dequant_b, gemm(g_lo, g_hi)))

    @property
    def fuses_check(self) -> bool:
        """Whether a call can run the offsets' device check inside the GEMM's own launch (``check_flags``)."""
        return self.checked is not None

    def __call__(self, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets,
                 out: Optional[torch.Tensor] = None, check_flags: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The GEMM of these operands, which must have the metadata the launches were prepared for.
        ``check_flags`` (with fuses_check): the int32 flag the launch ORs the offsets' check bits into."""
        m, n, k, g = self.shapes
        dev = self.device
        if out is None:
            out = torch.empty((m, n), dtype=self.out_dtype, device=dev)
        elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != (m, n) or out.dtype != self.out_dtype
              or out.device != dev or (n > 1 and out.stride(1) != 1) or out.stride(0) != self.out_stride):
            contract_error(f"out must be a [{m}, {n}] {self.out_dtype} tensor on {dev} with unit column stride")
        if self.launches is None:
            return out.zero_() if m and n else out
        if not self.dense_vectors:
            alpha, expert_offsets, sf_offsets = alpha.contiguous(), expert_offsets.contiguous(), sf_offsets.contiguous()
        common = (alpha, problem_sizes, expert_offsets, sf_offsets, out)
        try:
            if not self.cfg.predequant:
                (launch,) = self.launches
                if check_flags is not None:
                    launch = self.checked
                # The JIT path (first launch of a specialization) takes the packed operands as int32 word views.
                # (Without a check, any pointer stands for the flags: they are never read.)
                tensors = (mat1, scale1, mat2, scale2, *common, *self._scratch(alpha),
                           alpha if check_flags is None else check_flags)
                launch(tensors, (), lambda: (_words(mat1), scale1, _words(mat2.transpose(-1, -2)), *tensors[3:]))
                return out
            a16 = torch.empty((m, k), dtype=torch.float16, device=dev)
            self.dequant_a((mat1, scale1, problem_sizes, expert_offsets, sf_offsets, a16), (),
                           lambda: (_words(mat1), scale1, problem_sizes, expert_offsets, sf_offsets, a16))
            b16 = torch.empty((self.chunk, n, k), dtype=torch.float16, device=dev)
            for dequant_b, launch in self.launches:
                dequant_b((mat2, scale2, b16), (), lambda: (_words(mat2.transpose(-1, -2)), scale2, b16))
                launch((a16, scale1, b16, scale2, *common, *self._scratch(alpha), alpha))
        except OutOfResources as e:  # a tile config (given, or the default on a smaller GPU) the device cannot hold
            contract_error(f"the tile config {self.cfg} does not fit this GPU ({e}); choose smaller blocks or fewer "
                           f"stages")
        return out

    def _grow_scratch(self, n_counters: int, n_partials: int) -> None:
        self.scratch_sizes = (max(self.scratch_sizes[0], n_counters), max(self.scratch_sizes[1], n_partials))

    def _scratch(self, alpha: torch.Tensor) -> tuple:
        """(workspace, counters) of the split-K launches (one pair for all of them: they run one after the
        other)."""
        if self.split == 1:
            return alpha, alpha  # never touched (SPLIT_K == 1 compiles the split-K epilogue away)
        scratch = self._split_scratch
        if scratch is None or scratch.zero_pending:
            scratch = self._split_scratch = _SplitScratch.ready(scratch, self.device, *self.scratch_sizes)
        return scratch.workspace, scratch.counters


class _SplitScratch:
    """A GroupedGemm's split-K tile counters and fp32 partial workspace, its own for its lifetime: a CUDA graph that
    captured its launches keeps pointing at them, so they are never replaced by a larger pair for another GEMM
    (which freed them under a graph of the first). Its launches run one after the other (one stream at a time;
    calls on two streams must not overlap), and each leaves the counters zero. Allocated inside a CUDA graph
    capture, the counters' zeroing is only recorded: every capture then records it again and the next call
    outside a capture does it (``zero_pending``)."""

    def __init__(self, counters: torch.Tensor, workspace: torch.Tensor, zero_pending: bool):
        self.counters, self.workspace, self.zero_pending = counters, workspace, zero_pending

    @classmethod
    def ready(cls, old: "Optional[_SplitScratch]", dev: torch.device, n_counters: int,
              n_partials: int) -> "_SplitScratch":
        """``old`` with its counters zeroed (again), or a new pair (zeroed counters)."""
        capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if old is None:
            return cls(torch.zeros((n_counters,), dtype=torch.int32, device=dev),
                       torch.empty((n_partials,), dtype=torch.float32, device=dev), capturing)
        old.counters.zero_()
        old.zero_pending = capturing
        return old


def _words(t: torch.Tensor) -> torch.Tensor:
    """Packed fp4 bytes (K fastest, contiguous) re-viewed as int32 words of 8 codes."""
    return t.view(torch.uint8).view(torch.int32)


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


# _fp4_pair's values for planes P and P + 2 at once (P = PAR in {0, 1}), on two words in one call (``pack=2``: the
# two elements a thread holds side by side along K, as the MMA's register operand pairs them). One prmt per half
# gathers the two words' low (then high) 16-bit halves into one register x (y), so the values come out paired as the
# MMA takes them (the element-wise form needs one byte permute per pair of values for that). One shift and one lop3
# per register then put the sign of each of the parity's nibbles 6 bits above its magnitude's low bit, as in the
# fp16 pattern ``sign << 15 | code & 7 << 9``: even nibbles take magnitudes from x and signs from x << 3; odd ones
# magnitudes from x >> 3 and signs from x (lop3 0xE4 selects its first operand where the constant has ones, its
# second elsewhere; the bits the final mask drops may hold anything). Then one shift and one mask per plane, and
# one fp16x2 multiply by the block's scale: about 4 instructions per pair of values where the element-wise form
# takes 6 (tests/ptx_model.py runs both against each other on CPU).
def _planes_ptx(odd: bool) -> str:
    """The PTX of one parity: $0-$3 = (lo, hi) of plane P, then of plane P + 2; $4, $5 the two words; $6 the two
    scales (fp16x2)."""
    # the spread: (even) magnitudes from x, signs from x << 3; (odd) magnitudes from x >> 3, signs from x
    spread = ("shr.u32 t, {r}, 3;\n    lop3.b32 {r}, t, {r}, 0x0E0E0E0E, 0xE4;" if odd
              else "shl.b32 t, {r}, 3;\n    lop3.b32 {r}, {r}, t, 0x07070707, 0xE4;")
    lines = ["prmt.b32 x, $4, $5, 0x5410;", "prmt.b32 y, $4, $5, 0x7632;",
             spread.format(r="x"), spread.format(r="y")]
    # each plane's magnitude's low bit to bit 9 (and 25): it sits at bit 4P of an even spread, 4P - 3 of an odd one
    for out, (reg, shift) in enumerate([("x", 8 if odd else 9), ("y", 8 if odd else 9),
                                         ("x", 0 if odd else 1), ("y", 0 if odd else 1)]):
        lines.append(f"shl.b32 t, {reg}, {shift};\n    and.b32 t, t, 0x8E008E00;" if shift
                     else f"and.b32 t, {reg}, 0x8E008E00;")
        lines.append(f"mul.f16x2 ${out}, t, $6;")
    return "{\n    .reg .b32 x, y, t;\n    " + "\n    ".join(lines) + "\n}"


_PLANES_PTX_EVEN = tl.constexpr(_planes_ptx(odd=False))
_PLANES_PTX_ODD = tl.constexpr(_planes_ptx(odd=True))


@triton.jit
def _fp4_planes(w, scale, PAR: tl.constexpr, ASM: tl.constexpr):
    """(lo, hi) of plane PAR, then of plane PAR + 2: ``_fp4_pair``'s values, by inline PTX when ASM (the GPU)."""
    if ASM:
        return tl.inline_asm_elementwise(_PLANES_PTX_ODD if PAR else _PLANES_PTX_EVEN, "=r,=r,=r,=r,r,r,r",
                                         [w, scale], dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
                                         is_pure=True, pack=2)
    else:
        lo0, hi0 = _fp4_pair(w, scale, PAR)
        lo1, hi1 = _fp4_pair(w, scale, PAR + 2)
        return lo0, hi0, lo1, hi1


@triton.jit
def _fp4_natural(w, scale):
    """int32 words [R, W] -> fp16 [R, 8 * W] equal to fp4 * scale * 2**-7, in k order (nibble q of word j at 8j + q).

    ``_fp4_pair`` gives nibbles p and p + 4; three levels of interleave put them in order: level one pairs p with
    p + 4 (index 2j + h), level two p with p + 2, level three p with p + 1, so that the index is 8j + 4h + p."""
    lo0, hi0 = _fp4_pair(w, scale, 0)
    lo1, hi1 = _fp4_pair(w, scale, 1)
    lo2, hi2 = _fp4_pair(w, scale, 2)
    lo3, hi3 = _fp4_pair(w, scale, 3)
    even = tl.interleave(tl.interleave(lo0, hi0), tl.interleave(lo2, hi2))
    odd = tl.interleave(tl.interleave(lo1, hi1), tl.interleave(lo3, hi3))
    return tl.interleave(even, odd)


@triton.jit
def _scale_row(base, r, PK):
    """Flat offset of row r's first scale in a 128x4-swizzled scale matrix of PK = K/16 columns starting at
    ``base`` (int64): whole 128-row tiles, then the row's place inside its tile (see layout_op.md)."""
    return base + (r // 128).to(tl.int64) * 128 * PK + (r % 32) * 16 + ((r % 128) // 32) * 4


@triton.jit
def _scale_col(kb):
    """The column part of the swizzle: 4 consecutive 16-element blocks are 4 consecutive bytes."""
    return (kb // 4) * 512 + kb % 4


@triton.jit
def _load_scales(s_ptr, s_row, row_mask, kb, PK):
    """e4m3 scales [rows, blocks kb] of a swizzled matrix; zeros where the row is masked or kb >= PK."""
    return tl.load(s_ptr + s_row[:, None] + _scale_col(kb)[None, :], mask=row_mask[:, None] & (kb < PK)[None, :],
                   other=0.0)


@triton.jit
def _zero_rows(out_ptr, start, end, offs_n, n_mask, stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty)
    for r0 in range(start, end, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(ptrs, zeros, mask=(rows < end)[:, None] & n_mask[None, :])


@triton.jit
def _fused_offsets_check(flags_ptr, ps_ptr, eoff_ptr, sfoff_ptr, G, check_m, check_capacity, check_n, check_k,
                         stride_ps, CHECK_EVERY_ROW: tl.constexpr, CHECK_BLOCK: tl.constexpr):
    """The call's device check of the offsets and problem sizes (group_offsets_check.py), run by one program of
    the GEMM's launch instead of a launch of its own."""
    bits = group_offsets_bits(eoff_ptr, sfoff_ptr, ps_ptr, G, check_m, check_capacity, check_n, check_k,
                              stride_ps, CHECK_EVERY_ROW, True, True, CHECK_BLOCK)
    or_into_flags(flags_ptr, bits)


@triton.jit(noinline=True)
def _fused_offsets_check_call(flags_ptr, ps_ptr, eoff_ptr, sfoff_ptr, G, check_m, check_capacity, check_n,
                              check_k, stride_ps, CHECK_EVERY_ROW: tl.constexpr, CHECK_BLOCK: tl.constexpr):
    """_fused_offsets_check as a function of its own in the compiled kernel (GemmConfig.check_form "call")."""
    _fused_offsets_check(flags_ptr, ps_ptr, eoff_ptr, sfoff_ptr, G, check_m, check_capacity, check_n, check_k,
                         stride_ps, CHECK_EVERY_ROW, CHECK_BLOCK)


@triton.jit
def _program0_offsets_check(pid, pid_k, flags_ptr, ps_ptr, eoff_ptr, sfoff_ptr, G, check_m, check_capacity, check_n,
                            check_k, stride_ps, CHECK_EVERY_ROW: tl.constexpr, CHECK_BLOCK: tl.constexpr,
                            CHECK_CALL: tl.constexpr):
    """Program (0, 0) runs the call's device check of the offsets (group_offsets_check.py): no launch of its own.
    CHECK_CALL: as a call (GemmConfig.check_form), else inlined."""
    if (pid == 0) & (pid_k == 0):
        if CHECK_CALL:
            _fused_offsets_check_call(flags_ptr, ps_ptr, eoff_ptr, sfoff_ptr, G, check_m, check_capacity, check_n,
                                      check_k, stride_ps, CHECK_EVERY_ROW, CHECK_BLOCK)
        else:
            _fused_offsets_check(flags_ptr, ps_ptr, eoff_ptr, sfoff_ptr, G, check_m, check_capacity, check_n,
                                 check_k, stride_ps, CHECK_EVERY_ROW, CHECK_BLOCK)


@triton.jit
def _banded_tile(pid, num_pid_m, num_pid_n, BAND: tl.constexpr):
    """(m-slot, n-tile) of program ``pid`` when programs run in bands of BAND m-slots, m-slot fastest inside a
    band: a band's m-slots side by side on each n-tile (they share its weight tile through L2), and the m-slots
    past the last tile, which have nothing to do, after every working one."""
    band = BAND * num_pid_n  # programs per band
    first_m = (pid // band) * BAND
    band_m = tl.minimum(num_pid_m - first_m, BAND)  # the last band may be short
    return first_m + (pid % band) % band_m, (pid % band) // band_m


@triton.jit
def _group_tile(pid_m, ps_ptr, stride_ps, G, g_lo, g_hi, BLOCK_M: tl.constexpr, G_BLOCK: tl.constexpr):
    """(group, m-tile inside it) of m-slot ``pid_m``: prefix sums of the groups' tile counts (each group of [g_lo,
    g_hi) owns max(cdiv(m_i, BLOCK_M), 1) tiles), all G sizes in one vector load rather than a loop of G dependent
    scalar loads. The group is >= g_hi for slots past the last tile (the program has nothing to do)."""
    offs_g = tl.arange(0, G_BLOCK)
    g_mask = offs_g < G
    sizes = tl.load(ps_ptr + offs_g * stride_ps, mask=g_mask, other=0)
    tiles = tl.where(g_mask & (offs_g >= g_lo) & (offs_g < g_hi), tl.maximum(tl.cdiv(sizes, BLOCK_M), 1), 0)
    ends = tl.cumsum(tiles, 0)
    grp = tl.sum((ends <= pid_m).to(tl.int32), 0)  # the first group whose tiles end after pid_m
    return grp, pid_m - tl.sum(tl.where(offs_g == grp, ends - tiles, 0), 0)


@triton.jit
def _zero_gap_rows(out_ptr, eoff_ptr, grp, e_g, m_g, first, G, M, offs_n, n_mask, stride_om,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows no group covers, zeroed by the ``first`` program (tile 0, split 0) of each group: the gap after the
    group, and for group 0 the rows before it."""
    nxt = tl.where(grp + 1 < G, tl.load(eoff_ptr + tl.minimum(grp + 1, G - 1)), M)
    gap_start = tl.minimum(tl.maximum(e_g + m_g, 0), M)
    gap_end = tl.where(first, tl.minimum(nxt, M), gap_start)
    _zero_rows(out_ptr, gap_start, gap_end, offs_n, n_mask, stride_om, BLOCK_M, BLOCK_N)
    head_end = tl.where((grp == 0) & first, tl.minimum(e_g, M), 0)
    _zero_rows(out_ptr, 0, head_end, offs_n, n_mask, stride_om, BLOCK_M, BLOCK_N)


@triton.jit
def _group_rows(out_ptr, ps_ptr, eoff_ptr, grp, first, G, M, N, pid_n, stride_ps, stride_om, ZERO_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """(m_g, e_g, offs_n, n_mask) of a program's group (below g_hi) and n-tile; the ``first`` program of the group
    also zeroes the rows no group covers (_zero_gap_rows), ZERO_M rows at a time."""
    m_g = tl.load(ps_ptr + grp * stride_ps)
    e_g = tl.load(eoff_ptr + grp)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    _zero_gap_rows(out_ptr, eoff_ptr, grp, e_g, m_g, first, G, M, offs_n, n_mask, stride_om, ZERO_M, BLOCK_N)
    return m_g, e_g, offs_n, n_mask



# The token count, group count and scale1's size tile nothing: not specialized on (Triton would otherwise compile a
# variant per divisibility of each).
@triton.jit(do_not_specialize=["M", "G", "s1_capacity"])
def _dequant_a_kernel(
    a_ptr, s1_ptr, ps_ptr, eoff_ptr, sfoff_ptr, a16_ptr,
    M, KW, G, s1_capacity, stride_am, stride_ps,
    BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, G_BLOCK: tl.constexpr,
):
    """Tokens -> fp16 ``a16[r, k] = fp4(mat1[r, k]) * s1 * 2**-7`` ([M, K], k in order); zeros for rows no group
    covers."""
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
    s1_row = _scale_row(sf * PK, lr, PK)
    # Bound scale1 reads by its storage per row (a row's last scale sits at +(PK/4-1)*512+3).
    s1_mask = covered & (s1_row + (PK // 4 - 1) * 512 + 4 <= s1_capacity)
    kw = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    k_mask = kw < KW
    rows64 = rows.to(tl.int64)
    w = tl.load(a_ptr + rows64[:, None] * stride_am + kw[None, :], mask=covered[:, None] & k_mask[None, :], other=0)
    sa = _load_scales(s1_ptr, s1_row, s1_mask, pid_w * (BLOCK_W // 2) + tl.arange(0, BLOCK_W // 2), PK)
    sa = sa.to(tl.float16) * 128.0
    sa = tl.interleave(sa, sa)  # one scale per 16 values = 2 words

    vals = _fp4_natural(w, sa)
    cols = pid_w * (8 * BLOCK_W) + tl.arange(0, 8 * BLOCK_W)
    st_mask = (rows < M)[:, None] & (cols < 8 * KW)[None, :]
    tl.store(a16_ptr + rows64[:, None] * (8 * KW) + cols[None, :], vals, mask=st_mask)


@triton.jit(do_not_specialize=["g_lo"])
def _dequant_b_kernel(
    b_ptr, s2_ptr, b16_ptr,
    N, KW, g_lo, stride_bg, stride_bn, stride_s2g,
    BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr,
):
    """Weights of experts [g_lo, g_lo + chunk) -> fp16 ``b16[e - g_lo, n, k] = fp4(w_e[n, k]) * s2_e * 2**-7``."""
    r_tiles = tl.cdiv(N, BLOCK_R)
    local_e = tl.program_id(0) // r_tiles
    rows = (tl.program_id(0) % r_tiles) * BLOCK_R + tl.arange(0, BLOCK_R)
    e = (g_lo + local_e).to(tl.int64)
    PK = KW // 2
    r_mask = rows < N
    kw = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    k_mask = kw < KW
    rows64 = rows.to(tl.int64)
    w = tl.load(b_ptr + e * stride_bg + rows64[:, None] * stride_bn + kw[None, :],
                mask=r_mask[:, None] & k_mask[None, :], other=0)
    kb = tl.program_id(1) * (BLOCK_W // 2) + tl.arange(0, BLOCK_W // 2)
    sb = _load_scales(s2_ptr, _scale_row(e * stride_s2g, rows, PK), r_mask, kb, PK)
    sb = sb.to(tl.float16) * 128.0
    vals = _fp4_natural(w, tl.interleave(sb, sb))
    cols = tl.program_id(1) * (8 * BLOCK_W) + tl.arange(0, 8 * BLOCK_W)
    dst = b16_ptr + (local_e.to(tl.int64) * N + rows64[:, None]) * (8 * KW) + cols[None, :]
    tl.store(dst, vals, mask=r_mask[:, None] & (cols < 8 * KW)[None, :])


@triton.jit(do_not_specialize=["M", "G", "s1_capacity", "g_lo", "g_hi", "check_m", "check_capacity"])
def _nvfp4_gemm_kernel(
    a_ptr, s1_ptr, b_ptr, s2_ptr, alpha_ptr, ps_ptr, eoff_ptr, sfoff_ptr, out_ptr, ws_ptr, cnt_ptr, flags_ptr,
    M, N, KW, G, s1_capacity,
    stride_am, stride_bg, stride_bn, stride_s2g, stride_ps, stride_om, g_lo, g_hi,
    check_m, check_capacity, check_n, check_k,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    GROUP_M: tl.constexpr, F16: tl.constexpr, EVEN_K: tl.constexpr, G_BLOCK: tl.constexpr, ASM: tl.constexpr,
    PAIRED: tl.constexpr, CHECK: tl.constexpr, CHECK_EVERY_ROW: tl.constexpr, CHECK_BLOCK: tl.constexpr,
    CHECK_CALL: tl.constexpr,
):
    # KW = K/8 int32 words per row, passed rather than derived so that Triton's divisibility specialization of
    # integer arguments sees it (vectorized, unmasked-in-K loads when EVEN_K).
    # F16: a_ptr holds _dequant_a_kernel's fp16 tokens [M, K] and b_ptr _dequant_b_kernel's fp16 weights of groups
    # [g_lo, g_hi) ([g_hi - g_lo, N, K]); otherwise the packed operands as int32 words (tokens [M, KW], weights
    # [G, N, KW]), dequantized here with their block scales. Only groups [g_lo, g_hi) are computed.
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    if CHECK:
        _program0_offsets_check(pid, pid_k, flags_ptr, ps_ptr, eoff_ptr, sfoff_ptr, G, check_m, check_capacity,
                                check_n, check_k, stride_ps, CHECK_EVERY_ROW, CHECK_BLOCK, CHECK_CALL)
    num_pid_m = tl.cdiv(M, BLOCK_M) + g_hi - g_lo
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _banded_tile(pid, num_pid_m, num_pid_n, GROUP_M)  # GROUP_M m-tiles per band (L2 reuse)

    grp, local = _group_tile(pid_m, ps_ptr, stride_ps, G, g_lo, g_hi, BLOCK_M, G_BLOCK)
    if grp >= g_hi:
        return
    m_g, e_g, offs_n, n_mask = _group_rows(out_ptr, ps_ptr, eoff_ptr, grp, (local == 0) & (pid_k == 0), G, M, N,
                                           pid_n, stride_ps, stride_om, BLOCK_M, BLOCK_N)
    if local * BLOCK_M >= m_g:  # an empty group's tile only zero-fills
        return

    BKW: tl.constexpr = BLOCK_K // 8
    PK = KW // 2  # scale columns (a multiple of 4: K % 64 == 0)
    lr = local * BLOCK_M + tl.arange(0, BLOCK_M)  # row inside the group
    rows = e_g + lr
    r_mask = (lr < m_g) & (rows < M)
    # This split's k-tiles: a contiguous run of ceil(tiles / SPLIT_K) (the last run may be short or empty).
    run = tl.cdiv(tl.cdiv(KW, BKW), SPLIT_K)
    k_lo = pid_k * run * BKW
    k_hi = tl.minimum(k_lo + run * BKW, KW)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)

    if F16:  # a plain fp16 grouped GEMM over the dequantized operands, K in order
        K = KW * 8
        a_row_ptr = a_ptr + rows.to(tl.int64) * K
        b_row_ptr = b_ptr + ((grp - g_lo).to(tl.int64) * N + offs_n.to(tl.int64)) * K
        offs_k = tl.arange(0, BLOCK_K)
        for k0 in range(k_lo * 8, k_hi * 8, BLOCK_K):
            kk = k0 + offs_k
            if EVEN_K:
                k_mask = tl.full((BLOCK_K,), 1, tl.int1)
            else:
                k_mask = kk < K
            a = tl.load(a_row_ptr[:, None] + kk[None, :], mask=r_mask[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(b_row_ptr[:, None] + kk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            acc = tl.dot(b, tl.trans(a), acc)
    else:
        b_row_ptr = b_ptr + grp.to(tl.int64) * stride_bg + offs_n.to(tl.int64) * stride_bn
        s2_row = _scale_row(grp.to(tl.int64) * stride_s2g, offs_n, PK)

        a_row_ptr = a_ptr + rows.to(tl.int64) * stride_am
        sf_g = tl.load(sfoff_ptr + grp).to(tl.int64)
        s1_row = _scale_row(sf_g * PK, lr, PK)
        # Bound scale1 reads by its storage per ROW (a row's last scale sits at +(PK/4-1)*512+3): an element-wise
        # bound would make the mask vary along K, and the scale loads could no longer be vectorized and pipelined.
        s1_mask = r_mask & (s1_row + (PK // 4 - 1) * 512 + 4 <= s1_capacity)
        # scale1 is prefetched one k-tile ahead by hand: at decode tiles (16 rows x BLOCK_K/16 bytes) a thread holds
        # under 4 bytes of it, too few for the pipeliner's async copies, so it would otherwise wait on every load.
        sa_next = _load_scales(s1_ptr, s1_row, s1_mask, k_lo // 2 + tl.arange(0, BKW // 2), PK)

        offs_w = tl.arange(0, BKW)
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
            sb = tl.load(s2_ptr + s2_row[:, None] + _scale_col(kb)[None, :], mask=n_mask[:, None] & kb_mask[None, :],
                         other=0.0)
            sb = sb.to(tl.float16) * 128.0
            sb = tl.interleave(sb, sb)
            aw = tl.load(a_ptrs, mask=a_mask, other=0)
            sa = sa_next
            sa_next = _load_scales(s1_ptr, s1_row, s1_mask, kb + BKW // 2, PK)
            sa = sa.to(tl.float16) * 128.0
            sa = tl.interleave(sa, sa)
            if PAIRED:
                for par in tl.static_range(2):  # planes 0 and 2, then 1 and 3 (the same order with or without ASM)
                    a_lo0, a_hi0, a_lo1, a_hi1 = _fp4_planes(aw, sa, par, ASM)
                    b_lo0, b_hi0, b_lo1, b_hi1 = _fp4_planes(bw, sb, par, ASM)
                    acc = tl.dot(b_lo0, tl.trans(a_lo0), acc)
                    acc = tl.dot(b_hi0, tl.trans(a_hi0), acc)
                    acc = tl.dot(b_lo1, tl.trans(a_lo1), acc)
                    acc = tl.dot(b_hi1, tl.trans(a_hi1), acc)
            else:
                for p in tl.static_range(4):
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


# --------------------------------------------------------------------------------------------------------------
# Integer decode kernel: fp4 x fp4 block dot products on the integer units (dp4a), no tensor cores.
#
# Twice an E2M1 value is an integer in [-12, 12]. The product of two such values summed over one 16-element block
# is an integer of at most 16 * 144 = 2304 (exact in int32, and in fp32), and times the two blocks' e4m3 scales
# (8 significant bits between them) it is still exact in fp32: 20 significant bits. So a block's contribution is
# computed exactly on integer units, 4 codes per dp4a, and only the sum over blocks rounds, in fp32, as the
# tensor-core kernel's accumulator does. Codes become bytes by byte permutes of a table: a word's 4 low (or high)
# nibbles are prmt's 4 byte selectors, the fp4 sign bit its sign-replicate bit, which on the all-positive table
# gives 0 for negative codes; the sign-flipped word gives the negative codes' magnitudes. The weights' positive and
# negative magnitudes are dotted with the tokens' signed bytes and subtracted: 23 instructions per block of 16
# weights; with the scales, the loads through the shared-memory pipeline and the token's own decoding the sm_90
# loop takes 2.6 per weight at 64-row tiles (3.3 at 32), where the tensor-core decode loop takes 4.37.

# Byte tables of prmt: selector values 0-3 read the first operand's bytes, 4-7 the second's: 2 * |E2M1| by code.
_X2_TABLE_LO, _X2_TABLE_HI = tl.constexpr(0x03020100), 0x0C080604
# ($5: the low table, in a register the caller computes once: as an immediate, ptxas materializes it again
# before every prmt, one more instruction each.)
_FP4_BYTES_PTX = tl.constexpr("""{
    .reg .b32 x, h, xh;
    xor.b32 x, $4, 0x88888888;
    shr.u32 h, $4, 16;
    shr.u32 xh, x, 16;
    prmt.b32 $0, $5, TABLE_HI, $4;
    prmt.b32 $1, $5, TABLE_HI, h;
    prmt.b32 $2, $5, TABLE_HI, x;
    prmt.b32 $3, $5, TABLE_HI, xh;
}""".replace("TABLE_HI", hex(_X2_TABLE_HI)))
# Signed bytes from the magnitudes: at most one of p, n is non-zero per byte, so (p + 128 - n) ^ 128 per byte is
# p - n in two's complement, with no borrow between bytes (every byte of p | 0x80 is at least 128 > 12).
_FP4_SIGNED_PTX = tl.constexpr("""{
    .reg .b32 x, h, xh, p, n;
    xor.b32 x, $2, 0x88888888;
    shr.u32 h, $2, 16;
    shr.u32 xh, x, 16;
    prmt.b32 p, $3, TABLE_HI, $2;
    prmt.b32 n, $3, TABLE_HI, x;
    or.b32 p, p, 0x80808080;
    sub.u32 p, p, n;
    xor.b32 $0, p, 0x80808080;
    prmt.b32 p, $3, TABLE_HI, h;
    prmt.b32 n, $3, TABLE_HI, xh;
    or.b32 p, p, 0x80808080;
    sub.u32 p, p, n;
    xor.b32 $1, p, 0x80808080;
}""".replace("TABLE_HI", hex(_X2_TABLE_HI)))
# One block (2 words) of weight magnitudes ($1-$4 word 0: positive low/high, negative low/high; $5-$8 word 1)
# against the token's signed bytes ($9-$10 word 0 low/high, $11-$12 word 1).
_BLOCK_DOT_PTX = tl.constexpr("""{
    .reg .b32 sp, sn;
    dp4a.u32.s32 sp, $1, $9, 0;
    dp4a.u32.s32 sp, $2, $10, sp;
    dp4a.u32.s32 sp, $5, $11, sp;
    dp4a.u32.s32 sp, $6, $12, sp;
    dp4a.u32.s32 sn, $3, $9, 0;
    dp4a.u32.s32 sn, $4, $10, sn;
    dp4a.u32.s32 sn, $7, $11, sn;
    dp4a.u32.s32 sn, $8, $12, sn;
    sub.s32 $0, sp, sn;
}""")


@triton.jit
def _fp4_x2(w):
    """Twice the E2M1 value of the low nibble of int32 words, as int32 (element-wise; the interpreter's form)."""
    code = w & 15
    mag = code & 7
    v = tl.where(mag < 5, mag, tl.where(mag == 7, 12, 2 * mag - 4))
    return tl.where(code >= 8, -v, v)


@triton.jit
def _fp4_words_dot(w, a):
    """sum over the 8 codes of int32 words w and a ([R, C] tensors) of (2 fp4(w)) * (2 fp4(a)), element-wise. The
    8 nibbles are one [R, C, 8] tensor rather than 8 passes: the interpreter's time goes by operations, not
    elements."""
    shifts = (4 * tl.arange(0, 8))[None, None, :]
    return tl.sum(_fp4_x2(w[:, :, None] >> shifts) * _fp4_x2(a[:, :, None] >> shifts), axis=2)


@triton.jit
def _block_dots(w0, w1, a0, a1, table_w, table_a, ASM: tl.constexpr):
    """Exact integer sums of 4 * fp4(w) * fp4(a) over 16-element blocks, each block two int32 words of weights
    (w0, w1: [BLOCK_N, NB]) and of one token (a0, a1: [1, NB]): [BLOCK_N, NB] int32. ASM: byte
    permutes and dp4a, the token's bytes decoded once for all weight rows;
    otherwise the same sums element by element (what the interpreter runs: same integers). ``table_w`` ([BLOCK_N,
    1]) and ``table_a`` ([1, NB]): _X2_TABLE_LO, computed by the caller from run-time values (see _FP4_BYTES_PTX)."""
    if ASM:
        wp0, wq0, wn0, wm0 = tl.inline_asm_elementwise(
            _FP4_BYTES_PTX, "=r,=r,=r,=r,r,r", [w0, table_w], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True, pack=1)
        wp1, wq1, wn1, wm1 = tl.inline_asm_elementwise(
            _FP4_BYTES_PTX, "=r,=r,=r,=r,r,r", [w1, table_w], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True, pack=1)
        al0, ah0 = tl.inline_asm_elementwise(_FP4_SIGNED_PTX, "=r,=r,r,r", [a0, table_a],
                                             dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
        al1, ah1 = tl.inline_asm_elementwise(_FP4_SIGNED_PTX, "=r,=r,r,r", [a1, table_a],
                                             dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
        return tl.inline_asm_elementwise(
            _BLOCK_DOT_PTX, "=r" + ",r" * 12,
            [wp0, wq0, wn0, wm0, wp1, wq1, wn1, wm1, al0, ah0, al1, ah1], dtype=tl.int32, is_pure=True, pack=1)
    return _fp4_words_dot(w0, a0) + _fp4_words_dot(w1, a1)


@triton.jit(do_not_specialize=["M", "G", "s1_capacity", "check_m", "check_capacity"])
def _nvfp4_gemm_int_kernel(
    a_ptr, s1_ptr, b_ptr, s2_ptr, alpha_ptr, ps_ptr, eoff_ptr, sfoff_ptr, out_ptr, ws_ptr, cnt_ptr, flags_ptr,
    M, N, KW, G, s1_capacity, stride_am, stride_bg, stride_bn, stride_s2g, stride_ps, stride_om,
    check_m, check_capacity, check_n, check_k,
    BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    G_BLOCK: tl.constexpr, ASM: tl.constexpr, STAGES: tl.constexpr,
    CHECK: tl.constexpr, CHECK_EVERY_ROW: tl.constexpr, CHECK_BLOCK: tl.constexpr, CHECK_CALL: tl.constexpr,
):
    # Programs: (m-slot, n-tile) on axis 0 in bands of 8 m-slots, m-slot fastest inside a band, so that the tokens
    # of one group (which read the same weight tile) run side by side and share it through L2; the K split on axis
    # 1. An m-slot is one token of one group (_group_tile with tiles of 1; M + G slots cover every token and give
    # each group one), and the slots past the last tile have nothing to do: at one token per expert half of them.
    # Banding puts those empty programs after every working one instead of among them (H100, N=2048, one token
    # per expert: 26.5 -> 25.7 us; docs/nvfp4.md). A program sums
    # its split's contiguous run of k-steps for its BLOCK_N outputs, BLOCK_KW words (8 * BLOCK_KW codes) per step.
    # The step loads go through shared memory, STAGES - 1 steps ahead (cp.async; Triton pipelines loads that feed
    # no dot only when the loop asks): registers alone hold one step ahead, too few bytes in flight per SM.
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    if CHECK:
        _program0_offsets_check(pid, pid_k, flags_ptr, ps_ptr, eoff_ptr, sfoff_ptr, G, check_m, check_capacity,
                                check_n, check_k, stride_ps, CHECK_EVERY_ROW, CHECK_BLOCK, CHECK_CALL)
    pid_m, pid_n = _banded_tile(pid, M + G, tl.cdiv(N, BLOCK_N), 8)
    grp, local = _group_tile(pid_m, ps_ptr, stride_ps, G, 0, G, 1, G_BLOCK)
    if grp >= G:
        return
    m_g, e_g, offs_n, n_mask = _group_rows(out_ptr, ps_ptr, eoff_ptr, grp, (local == 0) & (pid_k == 0), G, M, N,
                                           pid_n, stride_ps, stride_om, 16, BLOCK_N)
    if local >= m_g:
        return

    NB: tl.constexpr = BLOCK_KW // 2  # 16-element blocks per step
    PK = KW // 2
    run = tl.cdiv(tl.cdiv(KW, BLOCK_KW), SPLIT_K) * BLOCK_KW  # words per split (the host leaves none empty)
    k_lo = pid_k * run
    k_hi = tl.minimum(k_lo + run, KW)
    lt = local + tl.arange(0, 1)  # the token inside the group (a [1] vector: the tile's one row)
    row = e_g + lt
    t_mask = (lt < m_g) & (row < M)
    b_rows = b_ptr + grp.to(tl.int64) * stride_bg + offs_n.to(tl.int64) * stride_bn
    s2_rows = _scale_row(grp.to(tl.int64) * stride_s2g, offs_n, PK)
    a_row = a_ptr + row.to(tl.int64) * stride_am
    s1_row = _scale_row(tl.load(sfoff_ptr + grp).to(tl.int64) * PK, lt, PK)
    s1_mask = t_mask & (s1_row + (PK // 4 - 1) * 512 + 4 <= s1_capacity)  # (as the tensor-core kernel bounds it)

    offs_w = tl.arange(0, BLOCK_KW)
    offs_b = tl.arange(0, NB)
    # The prmt table as per-thread values the compiler cannot fold (M >= 0, so M >> 31 is 0): kept in registers.
    table_w = ((offs_n & (M >> 31)) + _X2_TABLE_LO)[:, None]
    table_a = ((offs_b & (M >> 31)) + _X2_TABLE_LO)[None, :]
    acc = tl.zeros((BLOCK_N, NB), dtype=tl.float32)
    for k0 in tl.range(k_lo, k_hi, BLOCK_KW, num_stages=STAGES):
        kw = k0 + offs_w
        if EVEN_K:  # no mask along K, so the word loads vectorize
            kw_mask = tl.full((BLOCK_KW,), 1, tl.int1)
        else:
            kw_mask = kw < k_hi
        w = tl.load(b_rows[:, None] + kw[None, :], mask=n_mask[:, None] & kw_mask[None, :], other=0)
        a = tl.load(a_row[:, None] + kw[None, :], mask=t_mask[:, None] & kw_mask[None, :], other=0)
        sb = _load_scales(s2_ptr, s2_rows, n_mask, k0 // 2 + offs_b, PK)
        sa = _load_scales(s1_ptr, s1_row, s1_mask, k0 // 2 + offs_b, PK)
        w0, w1 = tl.split(tl.reshape(w, [BLOCK_N, NB, 2]))
        a0, a1 = tl.split(tl.reshape(a, [1, NB, 2]))
        dots = _block_dots(w0, w1, a0, a1, table_w, table_a, ASM)
        # Exact: the integer (<= 2304) times the two e4m3 scales' product (8 significant bits) fits fp32's 24.
        acc += dots.to(tl.float32) * (sb.to(tl.float32) * sa.to(tl.float32))
    part = tl.sum(acc, axis=1)

    if SPLIT_K > 1:
        # As the tensor-core kernel: publish this split's partial, count arrivals; the last to arrive sums them all
        # in split order (the same bits whatever the arrival order) and leaves the counter zero.
        offs_t = tl.arange(0, BLOCK_N)
        ws_tile = ws_ptr + pid.to(tl.int64) * (SPLIT_K * BLOCK_N)
        tl.store(ws_tile + pid_k * BLOCK_N + offs_t, part)
        tl.debug_barrier()  # every thread's partial is written before the (release) counter update
        if tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu") != SPLIT_K - 1:
            return
        part = tl.load(ws_tile + offs_t, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT_K):
            part += tl.load(ws_tile + s * BLOCK_N + offs_t, cache_modifier=".cg")
        tl.store(cnt_ptr + pid, 0)

    # The integers are 4x the products (twice each fp4 value); then alpha and one rounding.
    res = (part * 0.25) * tl.load(alpha_ptr + grp)  # (x 0.25 first: exact)
    ptrs = out_ptr + row.to(tl.int64) * stride_om + offs_n
    tl.store(ptrs, res.to(out_ptr.dtype.element_ty), mask=t_mask & n_mask)


def _cutlass_nvfp4_grouped_mm_for(node, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets,
                                  dtype):
    """fd.ops.cutlass_nvfp4_grouped_mm's kernel: the op's checks (pyfuser/ops/narrow_precision.py), then the GEMM."""
    shapes = ops.check_gemm(node.op.name, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets,
                            sf_offsets)
    return nvfp4_grouped_mm(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets,
                            to_torch_dtype(dtype), shapes=shapes)


def _prepare_cutlass_nvfp4_grouped_mm(node, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets,
                                      sf_offsets, dtype):
    """The kernel above for one input signature (OpDef.prepare): the operand contract and the launches once; a call
    checks the offsets' values (on the device by default) and launches."""
    m, n, k, g, check = ops.gemm_contract(node.op.name, mat1, mat2, scale1, scale2, alpha, problem_sizes,
                                          expert_offsets, sf_offsets)
    gemm = GroupedGemm(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets,
                       to_torch_dtype(dtype), shapes=(m, n, k, g), check=check)
    offsets = PreparedGroupCheck(check)
    capacity = ops.scale1_capacity(scale1)
    fused_check = gemm.fuses_check  # (decided once: the decode form runs the device check in its own launch)

    def run(node, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets, dtype):
        if ops.scale1_capacity(scale1) != capacity:  # another storage behind the same view: checked anew
            return _cutlass_nvfp4_grouped_mm_for(node, mat1, mat2, scale1, scale2, alpha, problem_sizes,
                                                 expert_offsets, sf_offsets, dtype)
        if not fused_check:
            offsets(expert_offsets, sf_offsets, problem_sizes)
            return gemm(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets)
        # The device check runs inside the GEMM's launch (program 0), one launch fewer per call.
        flag = offsets.device_flag(expert_offsets, sf_offsets, problem_sizes)
        return gemm(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets, check_flags=flag)

    return run


attach("cutlass_nvfp4_grouped_mm", kernel=_cutlass_nvfp4_grouped_mm_for, prepare=_prepare_cutlass_nvfp4_grouped_mm)
