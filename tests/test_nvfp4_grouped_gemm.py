"""The Triton NVFP4 grouped GEMM (pyfuser.kernels.nvfp4_grouped_gemm) against an independent dequantize+matmul.

The oracle here decodes FP4 codes with its own table, builds the swizzled scale buffers with the tensor-view form
of the 128x4 swizzle (pad, view [R/128, 4, 32, pk/4, 4], swap axes 1 and 3) while the kernel uses the flat index
formula, and multiplies in float64. Each case is also compared with pyfuser.nvfp4.reference.nvfp4_grouped_mm.
Under TRITON_INTERPRET (CPU) the kernel runs in Triton's interpreter; on a GPU the same tests run it on CUDA.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from harness import DEVICE
from pyfuser.nvfp4 import reference
from pyfuser.kernels.nvfp4_grouped_gemm import default_config, nvfp4_grouped_mm
from pyfuser.kernels import nvfp4_grouped_gemm as gg

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _round_up(a, b):
    return -(-a // b) * b


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., K] -> float4_e2m1fn_x2 [..., K/2]; element 2j in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous().view(torch.float4_e2m1fn_x2)


def _swizzle(s: torch.Tensor) -> torch.Tensor:
    rows, cols = s.shape
    r, pk = _round_up(max(rows, 1), 128), _round_up(cols, 4)
    padded = torch.zeros((r, pk), dtype=s.dtype, device=s.device)
    padded[:rows, :cols] = s
    return padded.view(r // 128, 4, 32, pk // 4, 4).permute(0, 3, 2, 1, 4).contiguous().reshape(r, pk)


def _e4m3(shape, gen, lo_bits=0x08, hi_bits=0x48, signed=False) -> torch.Tensor:
    """Random e4m3 values from their bit patterns in [lo_bits, hi_bits] (0x08 = 2**-6, 0x48 = 4, 0x7e = 448)."""
    bits = torch.randint(lo_bits, hi_bits + 1, shape, generator=gen, dtype=torch.int32)
    if signed:
        bits |= torch.randint(0, 2, shape, generator=gen, dtype=torch.int32) << 7
    return bits.to(torch.uint8).view(torch.float8_e4m3fn)


def _to_device(t: torch.Tensor) -> torch.Tensor:
    """``t`` on DEVICE with its WHOLE storage. ``Tensor.to``/``clone`` copy only the elements the view shows, and
    the layout op's result shows [M, K/16] of a (M + 127 G) * K/16 buffer: a copied view keeps only the first M
    rows of the buffer, and the kernel (which bounds its scale1 reads by the storage) reads zero scales past them.
    This is what made the layout-form cases fail on the GPU while they passed on CPU (where .to is a no-op)."""
    if t.device == DEVICE:
        return t
    whole = torch.as_strided(t, (t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
    return torch.as_strided(whole.to(DEVICE), t.shape, t.stride(), t.storage_offset())


class Case:
    """Random operands in the op's run-time form, plus what the oracle needs (codes and linear scales)."""

    def __init__(self, tokens, n, k, *, seed=0, scale1_form="layout", e_offs=None, sf_offs=None, m=None,
                 scale_bits=(0x08, 0x48), signed_scales=False):
        gen = torch.Generator().manual_seed(seed)
        g = len(tokens)
        self.tokens, self.n, self.k = list(tokens), n, k
        self.e_offs = e_offs if e_offs is not None else [sum(tokens[:i]) for i in range(g)]
        if sf_offs is None:
            sf_offs = [sum(_round_up(t, 128) for t in tokens[:i]) for i in range(g)]
        self.sf_offs = sf_offs
        self.m = m if m is not None else sum(tokens)
        sk = k // 16
        self.codes1 = torch.randint(0, 16, (self.m, k), generator=gen, dtype=torch.uint8)
        self.codes2 = torch.randint(0, 16, (g, n, k), generator=gen, dtype=torch.uint8)  # weights stored [G, N, K]
        self.s1 = _e4m3((self.m, sk), gen, *scale_bits, signed=signed_scales)  # linear, row r of mat1
        self.s2 = _e4m3((g, n, sk), gen, *scale_bits, signed=signed_scales)
        self.alpha = (torch.rand(g, generator=gen) + 0.5) / k

        mat1 = _pack(self.codes1)
        mat2 = _pack(self.codes2).transpose(-1, -2)  # [G, K/2, N], strides [N*K/2, 1, K/2]
        scale2 = torch.stack([_swizzle(self.s2[i]) for i in range(g)])  # [G, roundup(N,128), K/16]
        if scale1_form == "layout":  # the layout op's result: logical [M, K/16] over a (M + 127 G) * pk buffer
            storage = torch.zeros(((self.m + 127 * g) * sk,), dtype=torch.uint8)
            self._place(storage, sk)
            scale1 = torch.as_strided(storage.view(torch.float8_e4m3fn), (self.m, sk), (sk, 1))
        else:  # a plain [rows, K/16] buffer covering every group's padded slab
            rows = max([sf + _round_up(t, 128) for sf, t in zip(self.sf_offs, tokens)] + [1])
            storage = torch.zeros((rows * sk,), dtype=torch.uint8)
            self._place(storage, sk)
            scale1 = storage.view(torch.float8_e4m3fn).view(rows, sk)
        ps = torch.tensor([[t, n, k] for t in tokens], dtype=torch.int32).reshape(g, 3)
        i32 = dict(dtype=torch.int32)
        self.args = [mat1, mat2, scale1, scale2, self.alpha, ps, torch.tensor(self.e_offs, **i32).reshape(g),
                     torch.tensor(self.sf_offs, **i32).reshape(g)]
        self.args = [_to_device(a) for a in self.args]

    def _place(self, storage, sk):
        for t, e, sf in zip(self.tokens, self.e_offs, self.sf_offs):
            if t:
                sw = _swizzle(self.s1[e:e + t]).view(torch.uint8).reshape(-1)
                storage[sf * sk: sf * sk + sw.numel()] = sw

    def oracle(self, out_dtype) -> torch.Tensor:
        table = torch.tensor(FP4_VALUES, dtype=torch.float64)
        a = table[self.codes1.long()] * self.s1.double().repeat_interleave(16, dim=1)
        b = table[self.codes2.long()] * self.s2.double().repeat_interleave(16, dim=2)  # [G, N, K]
        out = torch.zeros((self.m, self.n), dtype=torch.float64)
        for i, (t, e) in enumerate(zip(self.tokens, self.e_offs)):
            out[e:e + t] = (a[e:e + t] @ b[i].t()) * float(self.alpha[i])
        return out.to(out_dtype)


def _check(out, case, out_dtype):
    assert out.dtype == out_dtype and tuple(out.shape) == (case.m, case.n) and out.is_contiguous()
    expected = case.oracle(out_dtype)
    scale = expected.double().abs().max().item() or 1.0
    got = out.cpu()
    torch.testing.assert_close(got.double(), expected.double(), atol=1e-2 * scale, rtol=1e-2)
    # Every product is exact and the sum is fp32: beyond the tolerance, nearly all elements round identically.
    assert (got == expected).double().mean().item() > 0.9
    covered = torch.zeros(case.m, dtype=torch.bool)
    for t, e in zip(case.tokens, case.e_offs):
        covered[e:e + t] = True
    assert torch.all(got[~covered] == 0), "rows no group covers must be zero"


@pytest.mark.parametrize("predequant", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale1_form", ["layout", "plain"])
@pytest.mark.parametrize("k", [64, 128])
def test_matches_oracle_and_reference(k, scale1_form, out_dtype, predequant):
    case = Case([20, 33, 0, 43], 128, k, seed=k, scale1_form=scale1_form)
    out = nvfp4_grouped_mm(*case.args, out_dtype, predequant=predequant)
    _check(out, case, out_dtype)
    ref = reference.nvfp4_grouped_mm(*case.args, out_dtype)
    scale = ref.double().abs().max().item()
    torch.testing.assert_close(out.double(), ref.double(), atol=1e-2 * scale, rtol=1e-2)


def test_layout_form_operand_keeps_its_whole_buffer():
    # Regression (GPU-only failure): the layout op's result must reach the kernel with its whole grouped buffer.
    case = Case([20, 33, 0, 43], 128, 64, seed=64)
    scale1 = case.args[2]
    assert scale1.device.type == DEVICE.type and tuple(scale1.shape) == (96, 4)
    assert scale1.untyped_storage().nbytes() == (96 + 127 * 4) * 4
    # What a plain copy of the view does instead, and what the kernel then computes: the groups whose scale slabs
    # lie past the copied rows get zero scales (zero rows), which is the mismatch the GPU run showed.
    cut = scale1.clone()
    assert cut.untyped_storage().nbytes() == 96 * 4
    out = nvfp4_grouped_mm(case.args[0], case.args[1], cut, *case.args[3:], torch.bfloat16).cpu()
    assert torch.all(out[20:] == 0) and torch.any(out[:20] != 0)


@pytest.mark.parametrize(
    "block_m,block_n,block_k,split_k,group_m,predequant",
    [(16, 64, 128, 1, 1, False), (32, 128, 256, 1, 8, True), (16, 64, 128, 2, 2, True), (64, 64, 128, 3, 1, False)],
)
def test_tile_configs(block_m, block_n, block_k, split_k, group_m, predequant):
    # K=256: two k-tiles of 128 (unmasked K) or one of 256; split_k is capped at the k-tile count; m-tiles split
    # the 33- and 43-row groups; group_m bands of m-tiles in the program order; tokens dequantized in the GEMM's
    # k loop or by the first launch.
    case = Case([20, 33, 0, 43], 128, 256, seed=1)
    out = nvfp4_grouped_mm(*case.args, torch.bfloat16, block_m=block_m, block_n=block_n, block_k=block_k,
                           split_k=split_k, group_m=group_m, predequant=predequant, num_warps=4, num_stages=2)
    _check(out, case, torch.bfloat16)


@pytest.mark.parametrize("k,split_k,predequant", [(640, 4, False), (192, 2, True), (1024, 8, False)])
def test_split_k(k, split_k, predequant):
    # K=640: 5 k-tiles of 128 in runs of 2, so the 4th split has none (its partial is zero); K=192: a masked last
    # k-tile; K=1024: 8 splits of one k-tile. Rows no group covers stay zero (only split 0 writes them).
    case = Case([5, 0, 19], 64, k, seed=10 + split_k, e_offs=[2, 7, 9], m=30)
    kwargs = dict(block_m=16, block_n=64, block_k=128, split_k=split_k, predequant=predequant)
    out = torch.full((30, 64), float("nan"), dtype=torch.float16, device=DEVICE)
    nvfp4_grouped_mm(*case.args, torch.float16, out=out, **kwargs)
    _check(out, case, torch.float16)
    again = nvfp4_grouped_mm(*case.args, torch.float16, **kwargs)
    assert torch.equal(again, out)  # deterministic, and the counters are fresh for every launch


@pytest.mark.parametrize("chunk_experts,split_k", [(1, 1), (2, 2), (3, 1)])
def test_predequant_expert_chunks(monkeypatch, chunk_experts, split_k):
    # Prefill's fp16 weights pass through a buffer of F16_WEIGHT_BUDGET bytes, a chunk of experts per GEMM launch:
    # each launch computes only its chunk's groups, and the gap rows (before group 0, between groups, after the
    # last) must still be written exactly once across the launches (out starts as NaN).
    case = Case([5, 0, 19, 7], 64, 256, seed=20 + chunk_experts, e_offs=[2, 7, 9, 30], m=40)
    monkeypatch.setattr(gg, "F16_WEIGHT_BUDGET", chunk_experts * 2 * 64 * 256)
    out = torch.full((40, 64), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    nvfp4_grouped_mm(*case.args, torch.bfloat16, out=out, predequant=True, block_m=16, block_n=64, block_k=32,
                     split_k=split_k, num_warps=4, num_stages=2)
    _check(out, case, torch.bfloat16)


def _shifted(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A contiguous copy of ``t`` that starts ``nbytes`` into a fresh buffer (data_ptr % 16 == nbytes)."""
    raw = t.contiguous().view(torch.uint8).reshape(-1)
    buf = torch.zeros(raw.numel() + 16, dtype=torch.uint8, device=t.device)
    buf[nbytes:nbytes + raw.numel()] = raw
    return buf[nbytes:nbytes + raw.numel()].view(t.dtype).view(t.shape)


def test_repeated_calls_and_operand_alignment():
    # Repeated launches of one specialization take the direct launch path on CUDA; an operand that starts 4 bytes
    # off a 16-byte boundary is a different specialization and must not reuse the aligned one's kernel.
    case = Case([9, 23], 128, 128, seed=12)
    mat1, mat2, *rest = case.args
    w = mat2.transpose(-1, -2)
    moved = (_shifted(mat1, 4), _shifted(w, 4).transpose(-1, -2))
    assert moved[0].data_ptr() % 16 == 4 and moved[1].data_ptr() % 16 == 4
    for operands in [(mat1, mat2), (mat1, mat2), moved, moved, (mat1, mat2)]:
        _check(nvfp4_grouped_mm(*operands, *rest, torch.bfloat16, split_k=2, block_k=128), case, torch.bfloat16)


def test_groups_over_128_rows_and_n_tiles():
    # A 150-row group spans two 128-row tiles of the scale swizzle; N=256 two 128-row tiles of each weight scale.
    case = Case([150, 10], 256, 64, seed=2)
    out = nvfp4_grouped_mm(*case.args, torch.bfloat16, block_m=64, block_n=128)
    _check(out, case, torch.bfloat16)


def test_single_group_with_padding_rows():
    # One expert covering rows [3, 40) of 48: the rows around it are zero.
    case = Case([37], 128, 128, seed=9, e_offs=[3], m=48)
    _check(nvfp4_grouped_mm(*case.args, torch.float16, block_m=16), case, torch.float16)


def test_n_not_multiple_of_128():
    # scale2 is then [G, roundup(N,128), K/16] (each slice padded to whole 128-row tiles).
    case = Case([5, 12], 72, 64, seed=3)
    assert tuple(case.args[3].shape) == (2, 128, 4)
    _check(nvfp4_grouped_mm(*case.args, torch.float16), case, torch.float16)


def test_full_e4m3_range_and_signed_scales():
    # Subnormal to 448 scales of both signs: every product is still exact in the fp16 operands.
    case = Case([9, 23], 128, 128, seed=4, scale_bits=(0x01, 0x7E), signed_scales=True)
    _check(nvfp4_grouped_mm(*case.args, torch.bfloat16), case, torch.bfloat16)


def test_uncovered_rows_are_zeroed_in_a_preallocated_output():
    # Rows 0-4 precede group 0, 15-29 follow it, group 1 is empty, 60-63 follow the last group; sf offsets have
    # an extra slab between groups (the kernel must use them, not recompute them).
    case = Case([10, 0, 20], 128, 64, seed=5, e_offs=[5, 30, 40], sf_offs=[0, 256, 256], m=64, scale1_form="plain")
    out = torch.full((64, 128), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    res = nvfp4_grouped_mm(*case.args, torch.bfloat16, out=out, block_m=16)
    assert res is out
    _check(out, case, torch.bfloat16)


@pytest.mark.parametrize("tokens", [[7, 0, 30], [1, 0, 1]])  # the tensor-core kernel; the integer kernel
def test_strided_vector_operands(tokens):
    # alpha and the offsets as every-other-element views, problem_sizes as a column slice of a wider tensor.
    case = Case(tokens, 128, 64, seed=8)
    assert default_config(case.m, 128, 64, 3).integer == (max(tokens) == 1)
    mat1, mat2, scale1, scale2, alpha, ps, e_offs, sf_offs = case.args
    spread = [t.repeat_interleave(2)[::2] for t in (alpha, e_offs, sf_offs)]
    assert all(t.stride(0) == 2 for t in spread)
    wide_ps = torch.cat([ps, torch.full_like(ps, -1)], dim=1)[:, :3]
    out = nvfp4_grouped_mm(mat1, mat2, scale1, scale2, spread[0], wide_ps, spread[1], spread[2], torch.bfloat16)
    _check(out, case, torch.bfloat16)


def test_scale1_reads_stay_inside_its_storage():
    # Group 1's scale slab lies past scale1's end: its scales read as 0 (rows of zeros), nothing outside is read.
    case = Case([16, 16], 128, 64, seed=6, scale1_form="plain", sf_offs=[0, 128])
    mat1, mat2, scale1, *rest = case.args
    short = scale1[:128]  # only group 0's slab
    out = nvfp4_grouped_mm(mat1, mat2, short.clone(), *rest, torch.float16)
    _check(out[:16], _SliceOf(case, 16), torch.float16)
    assert torch.all(out[16:].cpu() == 0)


class _SliceOf:
    """The first group of a case, for checking the rows that kept their scales."""

    def __init__(self, case, rows):
        self.m, self.n, self.tokens, self.e_offs = rows, case.n, case.tokens[:1], case.e_offs[:1]
        self._case = case

    def oracle(self, out_dtype):
        return self._case.oracle(out_dtype)[: self.m]


def test_default_config_heuristic():
    # The sweeps' choices (pyfuser.kernels.nvfp4_grouped_gemm.tensor_core_config's and integer_config's docstrings).
    for tokens in range(1, gg.INTEGER_MAX_TOKENS + 1):
        assert default_config(8 * tokens, 2048, 4096, 8) == gg.INTEGER_CONFIG
    assert not default_config(8 * (gg.INTEGER_MAX_TOKENS + 1), 2048, 4096, 8).integer
    # Few tokens' tiles: split along K (one expert, N=2048: 32 tiles, split 4), but each split keeps two steps.
    assert default_config(1, 2048, 4096, 1) == replace(gg.INTEGER_CONFIG, split_k=4)
    assert default_config(1, 2048, 2048, 1).split_k == 2 and default_config(1, 2048, 512, 1).split_k == 1
    tc = gg.tensor_core_config  # the rest: the tensor-core kernel's own choices
    for tokens in (1, 16):
        one = tc(8 * tokens, 2048, 4096, 8)
        assert (one.block_m, one.block_n, one.split_k, one.predequant) == (16, 64, 2, False)  # 256 tiles: split
        wide = tc(8 * tokens, 14336, 4096, 8)
        assert (wide.block_m, wide.block_n, wide.split_k) == (16, 64, 1)  # 1792 tiles of 64 columns
        assert one.paired_planes and wide.paired_planes and one.num_stages == wide.num_stages == 3
    assert tc(8 * 32, 14336, 4096, 8).block_n == 64 and tc(8 * 32, 14336, 4096, 8).num_stages == 4
    assert tc(8 * 64, 2048, 4096, 8).paired_planes and tc(8 * 64, 2048, 4096, 8).num_stages == 4
    assert (tc(8 * 64, 2048, 4096, 8).block_m, tc(8 * 64, 2048, 4096, 8).split_k) == (64, 2)
    assert tc(8 * 64, 14336, 4096, 8).block_n == 128
    assert tc(8 * 64, 2048, 4096, 8).block_n == 128  # 64-token tiles: half the in-loop token dequant
    # The offsets' device check: inlined in 16-token tiles split along K, a call elsewhere (measured per shape).
    assert tc(8 * 16, 2048, 4096, 8).check_form == "inline" and tc(8 * 16, 14336, 4096, 8).check_form == "call"
    assert tc(8 * 64, 2048, 4096, 8).check_form == tc(8 * 64, 14336, 4096, 8).check_form == "call"
    assert gg.INTEGER_CONFIG.check_form == "call"
    assert tc(8, 2048, 256, 8).split_k == 1  # K=256 is a single k-tile
    prefill = tc(8192, 14336, 4096, 8)
    assert (prefill.block_m, prefill.block_n, prefill.split_k, prefill.predequant) == (256, 128, 1, True)
    assert not prefill.paired_planes


def _bad(case, **changes):
    args = dict(zip(["mat1", "mat2", "scale1", "scale2", "alpha", "problem_sizes", "expert_offsets", "sf_offsets"],
                    case.args))
    out_dtype = changes.pop("out_dtype", torch.bfloat16)
    kwargs = {k: changes.pop(k) for k in list(changes)
              if k in ("block_k", "block_m", "block_n", "predequant", "out", "integer", "split_k", "num_stages",
                       "max_registers", "paired_planes")}
    args.update(changes)
    return lambda: nvfp4_grouped_mm(*args.values(), out_dtype, **kwargs)


@pytest.fixture(scope="module")
def small():
    return Case([3, 5], 128, 64, seed=7)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda c: dict(mat1=c.args[0].view(torch.uint8).to(torch.bfloat16)), "mat1 must be packed fp4"),
        (lambda c: dict(mat2=c.args[1].contiguous()), "mat2 must be a \\[G, N, K/2\\] contiguous weight"),
        (lambda c: dict(mat2=c.args[1][:, :16]), "mat2's K/2 is 16"),
        (lambda c: dict(mat1=c.args[0][:, :16], mat2=c.args[1][:, :16], scale1=c.args[2][:, :2],
                        scale2=c.args[3][:, :, :2]), "K must be a multiple of 64"),
        (lambda c: dict(mat2=c.args[1][:, :, :100]), "N must be a multiple of 8"),
        (lambda c: dict(scale1=c.args[2].float()), "scale1 must be float8_e4m3fn"),
        (lambda c: dict(scale1=c.args[2][:, :2]), "scale1 must be a contiguous \\[rows, K/16=4\\]"),
        (lambda c: dict(scale2=c.args[3][:, :64]), "scale2 must be a contiguous \\[G, roundup\\(N,128\\), K/16\\]"),
        (lambda c: dict(alpha=c.args[4].double()), "alpha must be float32"),
        (lambda c: dict(alpha=c.args[4][:1]), "alpha must be \\[G=2\\]"),
        (lambda c: dict(problem_sizes=c.args[5].long()), "problem_sizes must be int32"),
        (lambda c: dict(problem_sizes=c.args[5][:, :2]), "problem_sizes must be \\[G=2, 3\\]"),
        (lambda c: dict(expert_offsets=c.args[6][:1]), "expert_offsets must be \\[G=2\\]"),
        (lambda c: dict(sf_offsets=c.args[7].long()), "sf_offsets must be int32"),
        (lambda c: dict(out_dtype=torch.float32), "out_dtype must be torch.bfloat16 or torch.float16"),
        (lambda c: dict(block_k=64), "block_k must be >= 128 \\(with predequant=False\\)"),
        (lambda c: dict(block_k=8, predequant=True), "block_k must be >= 16 \\(with predequant=True\\)"),
        (lambda c: dict(block_m=48), "block_m must be a power of two"),
        (lambda c: dict(block_n=32),
         "block_k must be >= 128 \\(with predequant=False\\), block_m >= 16 and block_n >= 64"),
        (lambda c: dict(out=torch.empty(8, 128, dtype=torch.float16, device=DEVICE)), "out must be a \\[8, 128\\]"),
        (lambda c: dict(integer=True, block_m=2), "the integer kernel takes block_k >= 32"),
        (lambda c: dict(integer=True, block_m=1, split_k=0), "the integer kernel takes .* split_k and num_stages >= 1"),
        (lambda c: dict(integer=True, block_m=1, num_stages=0), "the integer kernel takes .* split_k and num_stages >= 1"),
        (lambda c: dict(max_registers=16), "max_registers must be None or between 32 and 255"),
        (lambda c: dict(integer=True, block_m=1, max_registers=256),
         "max_registers must be None or between 32 and 255"),
        (lambda c: dict(integer=True, block_m=1, paired_planes=True), "paired_planes applies to the tensor-core"),
        (lambda c: dict(predequant=True, block_k=64, paired_planes=True), "paired_planes applies to the tensor-core"),
    ],
)
def test_validation_errors(small, change, match):
    with pytest.raises(ValueError, match="nvfp4_grouped_mm: " + match):
        _bad(small, **change(small))()


def test_kernel_overrides_drop_the_defaults_paired_planes(monkeypatch):
    """A default that pairs planes (the decode kernel's form) does not make ``predequant=True`` or ``integer=True``
    an error: the caller asked for another kernel, not for paired planes. Asked for explicitly, it is one."""
    paired_default = replace(gg.tensor_core_config(8 * 16, 2048, 4096, 8), paired_planes=True)
    monkeypatch.setattr(gg, "default_config", lambda m, n, k, g: paired_default)
    assert gg._config(8 * 16, 2048, 4096, 8, {"predequant": True, "block_k": 64}).paired_planes is False
    assert gg._config(8 * 16, 2048, 4096, 8, {"integer": True}).paired_planes is False
    assert gg._config(8 * 16, 2048, 4096, 8, {"num_stages": 3}).paired_planes is True
    with pytest.raises(ValueError, match="paired_planes applies to the tensor-core"):
        gg._config(8 * 16, 2048, 4096, 8, {"predequant": True, "block_k": 64, "paired_planes": True})


def test_cpu_without_interpreter_is_refused(small, monkeypatch):
    if DEVICE.type != "cpu":
        pytest.skip("the refusal concerns CPU tensors")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        nvfp4_grouped_mm(*small.args, torch.bfloat16)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="shared-memory limits exist only when compiling for a GPU")
def test_tile_config_beyond_shared_memory_is_our_error(small):
    # 256 x 256 fp16 tiles of 512 k in 6 stages need far more than the 227 KiB an sm_90 block may use.
    with pytest.raises(ValueError, match="nvfp4_grouped_mm: the tile config .* does not fit this GPU"):
        nvfp4_grouped_mm(*small.args, torch.bfloat16, predequant=True, block_m=256, block_n=256, block_k=512,
                         num_warps=8, num_stages=6)


_COMPILE_GEMM = """
import base64, json, sys
import triton
from triton.backends.compiler import GPUTarget
from pyfuser.kernels import nvfp4_grouped_gemm as gg

sig = {n: "*i32" for n in ("a_ptr", "b_ptr", "ps_ptr", "eoff_ptr", "sfoff_ptr", "cnt_ptr", "flags_ptr")}
sig.update(s1_ptr="*fp8e4nv", s2_ptr="*fp8e4nv", alpha_ptr="*fp32", out_ptr="*bf16", ws_ptr="*fp32")
for n in ("M", "N", "KW", "G", "s1_capacity", "stride_am", "stride_bg", "stride_bn", "stride_s2g", "stride_ps",
          "stride_om", "g_lo", "g_hi", "check_m", "check_capacity", "check_n", "check_k"):
    sig[n] = "i32"
# What the JIT specializes at these shapes: every pointer 16-byte aligned, and these ints multiples of 16.
aligned = {n for n, t in sig.items() if t.startswith("*")} | {
    "N", "KW", "stride_am", "stride_bg", "stride_bn", "stride_s2g", "stride_om", "check_n", "check_k"}
out = {}
# (tokens per expert, N, the offsets check, paired planes): decode launches that can run the check
for tokens, n, check, paired in ((16, 2048, False, False), (16, 2048, True, False), (16, 2048, False, True),
                                 (16, 14336, False, True), (16, 14336, True, True), (64, 2048, False, True),
                                 (64, 2048, True, True)):
    cfg = gg.default_config(8 * tokens, n, 4096, 8)
    consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
                  GROUP_M=cfg.group_m, F16=False, EVEN_K=True, G_BLOCK=8, ASM=True, PAIRED=paired, CHECK=check,
                  CHECK_EVERY_ROW=False, CHECK_BLOCK=16, CHECK_CALL=cfg.check_form == "call")
    full = {**sig, **{k: "constexpr" for k in consts}}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(full) if name in aligned}
    src = triton.compiler.ASTSource(fn=gg._nvfp4_gemm_kernel, signature=full, constexprs=consts, attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    assert c.asm["cubin"]
    out[f"{tokens} {n} {check} {paired}"] = [c.asm["ptx"].count("st.global"), c.asm["ptx"].count("0x07070707"),
                                    base64.b64encode(c.asm["cubin"]).decode()]
print(json.dumps(out))
"""


def test_decode_kernel_with_the_offsets_check_compiles_for_sm90():
    """The decode launch that ORs the offsets' check bits into the call's flags (program 0) compiles for the H200;
    it stores one more thing than the launch without the check. Where the check is a call (check_form), the
    main loop is the unchecked launch's, instruction for instruction, at the shapes where inlining it cost 14%
    (N=14336 with 16 tokens per expert, N=2048 with 64). The paired-planes form compiles too."""
    import base64
    import json
    import os
    import subprocess
    import sys

    from sm90 import cuobjdump, main_loop

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _COMPILE_GEMM], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["16 2048 True False"][0] > counts["16 2048 False False"][0]
    # paired_planes assembles for sm_90 with its planes' PTX inlined (the even planes' lop3 constant); the
    # unpaired form does not use it
    assert counts["16 2048 False True"][1] > 0 and counts["16 2048 False False"][1] == 0
    for shape in ("16 14336", "64 2048"):
        loops = [main_loop(cuobjdump(base64.b64decode(counts[f"{shape} {check} True"][2]), "-sass"))
                 for check in (False, True)]
        assert sum("HGMMA" in i for i in loops[0]) >= 8
        assert loops[1] == loops[0], shape


# The integer kernel (dp4a block dot products, one token per program): the default at <= INTEGER_MAX_TOKENS tokens
# per expert. Its block sums are exact integers, so beyond the oracle's tolerance it rounds like the tensor-core
# kernel nearly everywhere.
INTEGER = dict(integer=True, block_m=1, split_k=1)


@pytest.mark.parametrize("tokens,n,k,block_n,block_k,split_k,scale1_form,out_dtype", [
    ([1, 2, 0, 3], 64, 128, 16, 64, 1, "layout", torch.bfloat16),  # an empty group, several tokens per group
    ([0, 1], 48, 256, 32, 128, 1, "plain", torch.float16),  # N not a multiple of the tile; group 0 empty
    ([2, 1], 32, 192, 16, 128, 1, "layout", torch.bfloat16),  # K not a multiple of the step (masked last step)
    ([1], 16, 64, 16, 32, 1, "plain", torch.bfloat16),  # one step of two blocks
    ([1, 0, 2], 32, 256, 16, 64, 2, "layout", torch.bfloat16),  # split-K: 2 runs of 2 steps
    ([1, 1], 48, 192, 32, 64, 2, "plain", torch.float16),  # 3 steps in runs of 2 and 1
    ([2, 1], 32, 192, 16, 128, 2, "layout", torch.bfloat16),  # a masked short last run (K % step != 0)
    ([1], 16, 128, 16, 32, 8, "plain", torch.bfloat16),  # split_k past the step count: 4 runs of one step
    ([1, 1], 16, 320, 16, 64, 4, "layout", torch.bfloat16),  # 5 steps, split 4: runs of 2, so 3 splits
    ([3, 5, 0, 9, 1], 48, 128, 16, 64, 2, "layout", torch.bfloat16),  # 23 m-slots: bands of 8, 8 and 7
])
def test_integer_kernel_matches_oracle(tokens, n, k, block_n, block_k, split_k, scale1_form, out_dtype):
    case = Case(tokens, n, k, seed=n + k, scale1_form=scale1_form)
    gemm = gg.GroupedGemm(*case.args, out_dtype, **{**INTEGER, "block_n": block_n, "block_k": block_k,
                                                       "split_k": split_k})
    steps = -(-k // block_k)
    run = -(-steps // split_k)  # each split's steps; every split the host launches has some
    assert gemm.split == -(-steps // run) and (gemm.split - 1) * run < steps
    out = gemm(*case.args)
    _check(out, case, out_dtype)
    # Split partials are summed in split order and the tile counters are left zero: the next call's bits are the same.
    assert torch.equal(gemm(*case.args).view(torch.int16), out.view(torch.int16))
    tc_config = {key: v for key, v in vars(gg.tensor_core_config(case.m, n, k, len(tokens))).items()
                 if key != "check_form"}  # (nvfp4_grouped_mm runs no offsets check)
    tensor_cores = nvfp4_grouped_mm(*case.args, out_dtype, **tc_config)
    assert (out == tensor_cores).double().mean().item() > 0.9


def test_check_form_is_validated(small):
    with pytest.raises(ValueError, match="check_form must be 'call', 'inline' or 'launch', got 'fused'"):
        gg.GroupedGemm(*small.args, torch.bfloat16, check_form="fused")


@pytest.mark.parametrize("integer", [False, True])
def test_unchecked_launch_is_the_same_for_every_check_form(small, integer):
    """check_form says only how a launch with the offsets' check runs it: the unchecked launch's arguments (its
    constexprs included, so its compiled kernel) do not depend on it."""
    fixed = {form: gg.GroupedGemm(*small.args, torch.bfloat16, check_form=form, integer=integer).launches[0].fixed
             for form in ("call", "inline", "launch")}
    assert fixed["call"] == fixed["inline"] == fixed["launch"]


def test_kernel_override_starts_from_that_kernels_default():
    # integer=False at a one-token shape takes the tensor-core kernel's own config (then any other override).
    case = Case([1, 1], 64, 128, seed=5)
    assert default_config(2, 64, 128, 2).integer
    gemm = gg.GroupedGemm(*case.args, torch.bfloat16, integer=False)
    assert gemm.cfg == gg.tensor_core_config(2, 64, 128, 2)
    _check(gemm(*case.args), case, torch.bfloat16)
    assert gg.GroupedGemm(*case.args, torch.bfloat16, integer=False, block_n=128).cfg.block_n == 128
    four = Case([4, 4], 64, 128, seed=6)  # the tensor-core kernel's shape: integer=True starts from INTEGER_CONFIG
    gemm = gg.GroupedGemm(*four.args, torch.bfloat16, integer=True, block_n=16)
    assert gemm.cfg == replace(gg.INTEGER_CONFIG, block_n=16)
    _check(gemm(*four.args), four, torch.bfloat16)


@pytest.mark.parametrize("integer", [False, True])
def test_register_cap_changes_no_bits(integer):
    # ptxas's cap moves values between registers and the stack, never what is computed: the same bits as uncapped
    # (the interpreter takes no compile options, so on CPU this checks that the cap is accepted and passed through).
    case = Case([1, 0, 2] if integer else [16, 3, 20], 128, 512, seed=11)
    plain = gg.GroupedGemm(*case.args, torch.bfloat16, integer=integer)
    capped = gg.GroupedGemm(*case.args, torch.bfloat16, integer=integer, max_registers=64)
    assert capped.cfg == replace(plain.cfg, max_registers=64)
    out = capped(*case.args)
    _check(out, case, torch.bfloat16)
    assert torch.equal(out, plain(*case.args))


def test_integer_kernel_gap_rows_and_signed_scales():
    # Rows no group covers are zeroed in a preallocated output; signed e4m3 scales over the full range.
    case = Case([1, 0, 2], 32, 128, seed=3, e_offs=[1, 3, 3], m=6, scale_bits=(0x01, 0x7e), signed_scales=True)
    out = torch.full((6, 32), 7.0, dtype=torch.bfloat16, device=DEVICE)
    nvfp4_grouped_mm(*case.args, torch.bfloat16, out=out, block_n=16, block_k=64, **INTEGER)
    _check(out, case, torch.bfloat16)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the byte-permute/dp4a form runs on the GPU only")
def test_integer_kernel_ptx_equals_elementwise_form(monkeypatch):
    # The same integers either way, and the same fp32 sums in the same order: bit for bit.
    case = Case([1, 1, 2, 1], 256, 1024, seed=11, scale_bits=(0x01, 0x7e), signed_scales=True)
    for split_k in (1, 2):
        cfg = {**INTEGER, "block_n": 64, "block_k": 512, "split_k": split_k}
        monkeypatch.setattr(gg, "interpreting", lambda: False)
        ptx = nvfp4_grouped_mm(*case.args, torch.bfloat16, **cfg)
        monkeypatch.setattr(gg, "interpreting", lambda: True)  # ASM off: the interpreter's element-wise form
        plain = nvfp4_grouped_mm(*case.args, torch.bfloat16, **cfg)
        assert torch.equal(ptx.view(torch.int16), plain.view(torch.int16))
        _check(ptx, case, torch.bfloat16)


PAIRED_CASES = [([16, 3, 20, 0], 128, 1024, dict(block_n=64, split_k=2)),
                 ([40, 64, 1], 256, 512, dict(block_n=128, block_m=64))]


@pytest.mark.parametrize("tokens,n,k,cfg", PAIRED_CASES)
def test_paired_planes_match_the_oracle(tokens, n, k, cfg):
    # paired_planes sums the planes in the order 0, 2, 1, 3 (on CPU by the element-wise form): the oracle's values,
    # its own bits whichever form computes them (next test), not necessarily the default order's.
    case = Case(tokens, n, k, seed=13, scale_bits=(0x01, 0x7e), signed_scales=True)
    gemm = gg.GroupedGemm(*case.args, torch.bfloat16, integer=False, paired_planes=True, **cfg)
    assert gemm.cfg.paired_planes
    _check(gemm(*case.args), case, torch.bfloat16)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="inline PTX runs on the GPU only")
@pytest.mark.parametrize("tokens,n,k,cfg", PAIRED_CASES)
def test_paired_planes_ptx_equals_elementwise_form(monkeypatch, tokens, n, k, cfg):
    # The planes' PTX gives _fp4_pair's values and the dots run in the same order: bit for bit (on CPU,
    # test_fp4_planes_ptx_matches_fp4_pair checks the PTX through a model of its instructions).
    case = Case(tokens, n, k, seed=13, scale_bits=(0x01, 0x7e), signed_scales=True)
    monkeypatch.setattr(gg, "interpreting", lambda: False)
    ptx = nvfp4_grouped_mm(*case.args, torch.bfloat16, integer=False, paired_planes=True, **cfg)
    monkeypatch.setattr(gg, "interpreting", lambda: True)
    plain = nvfp4_grouped_mm(*case.args, torch.bfloat16, integer=False, paired_planes=True, **cfg)
    assert torch.equal(ptx.view(torch.int16), plain.view(torch.int16))
    _check(ptx, case, torch.bfloat16)


def _fp4_pair_bits(w: int, p: int) -> tuple:
    """_fp4_pair's fp16 bit patterns (before the scale) of nibbles p and p + 4 of the int32 word w."""
    mag = ((w << (9 - 4 * p)) if p < 3 else (w >> 3)) & 0x0E000E00
    bits = (mag | ((w << (12 - 4 * p)) & 0x80008000)) & 0xFFFFFFFF
    return bits & 0xFFFF, bits >> 16


def test_fp4_planes_ptx_matches_fp4_pair():
    # _PLANES_PTX_EVEN / _ODD (the GPU's dequantization of two k-adjacent words) through a model of its
    # instructions: planes PAR and PAR + 2, each (lo, hi) packed as two words' values, equal to _fp4_pair's times
    # the scale, for every code in every nibble, random words, and scales of every kind (subnormal, huge, NaN).
    import numpy as np

    from ptx_model import run_ptx

    def times(bits, scale):
        with np.errstate(all="ignore"):
            return int((np.array([bits], np.uint16).view(np.float16)
                        * np.array([scale], np.uint16).view(np.float16)).view(np.uint16)[0])

    gen = torch.Generator().manual_seed(0)
    words = [int(str(hex(c)[2:]) * 8, 16) for c in range(16)]  # one code in all 8 nibbles
    words += torch.randint(0, 2**32, (600,), generator=gen, dtype=torch.int64).tolist()
    scales = [0x3C00, 0x5800, 0x0001, 0x7BFF, 0x7E00, 0x0400] + torch.randint(
        0, 2**16, (40,), generator=gen).tolist()
    for i, w0 in enumerate(words):
        w1 = words[(i * 7 + 3) % len(words)]
        s = scales[i % len(scales)]
        for par, ptx in ((0, gg._PLANES_PTX_EVEN.value), (1, gg._PLANES_PTX_ODD.value)):
            got = run_ptx(ptx, {4: w0, 5: w1, 6: s | (s << 16)}, outputs=4)
            want = []
            for p in (par, par + 2):
                (lo0, hi0), (lo1, hi1) = _fp4_pair_bits(w0, p), _fp4_pair_bits(w1, p)
                want += [times(lo0, s) | times(lo1, s) << 16, times(hi0, s) | times(hi1, s) << 16]
            assert got == want, (hex(w0), hex(w1), hex(s), par)


# Split-K scratch (tile counters and partials): each GroupedGemm owns its pair for its lifetime, so a CUDA graph
# that captured one GEMM's launches keeps valid pointers whatever other GEMMs allocate later.
def _split_gemms():
    small = Case([1], 16, 128, seed=21)
    large = Case([1, 0, 1], 32, 128, seed=22)
    cfg = {**INTEGER, "block_n": 16, "block_k": 64, "split_k": 2}
    return [(case, gg.GroupedGemm(*case.args, torch.bfloat16, **cfg)) for case in (small, large)]


def test_split_scratch_is_each_gemms_own_and_kept_between_calls():
    (small, a), (large, b) = _split_gemms()
    assert a.split == b.split == 2
    out_a = a(*small.args)
    workspace, counters = a._scratch(small.args[4])
    b(*large.args)  # a larger pair for the other GEMM leaves the first one's in place
    assert a._scratch(small.args[4])[0].data_ptr() == workspace.data_ptr()
    assert b._scratch(large.args[4])[1].data_ptr() != counters.data_ptr()
    assert counters.numel() >= a.scratch_sizes[0] and not counters.any()  # every launch leaves them zero
    assert torch.equal(a(*small.args).view(torch.int16), out_a.view(torch.int16))
    _check(out_a, small, torch.bfloat16)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs")
def test_split_gemm_graphs_stay_valid_and_a_first_call_captured_zeroes_its_counters():
    (small, a), (large, b) = _split_gemms()
    want_a, want_b = a(*small.args), b(*large.args)
    out_a = torch.empty_like(want_a)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a(*small.args, out=out_a)
    # Another GEMM allocates and runs after the capture: the graph's pointers into a's scratch stay a's.
    _, c = _split_gemms()[1]
    got_c = c(*large.args)
    out_a.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_a.view(torch.int16), want_a.view(torch.int16))
    assert torch.equal(got_c.view(torch.int16), want_b.view(torch.int16))
    # A GEMM whose first call is captured: the counters' zeroing is recorded in the graph, and done by the next
    # call outside a capture.
    _, d = _split_gemms()[1]
    out_d = torch.empty_like(want_b)
    graph_d = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph_d):
        d(*large.args, out=out_d)
    assert d._split_scratch.zero_pending
    assert torch.equal(d(*large.args).view(torch.int16), want_b.view(torch.int16))
    assert not d._split_scratch.zero_pending
    out_d.zero_()
    graph_d.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_d.view(torch.int16), want_b.view(torch.int16))
