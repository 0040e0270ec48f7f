"""pyfuser.nvf_cutlass (nvFuser's ``nvfuser_direct.nvf_cutlass``) against independent float64 oracles.

The oracles decode FP4 codes and e4m3 / e8m0 scales from their bit patterns with their own tables, and multiply in
float64 group by group; the operands' swizzled scales are built with pyfuser.nvfp4.reference's layout helpers
(themselves tested against upstream's in test_nvfp4_reference.py). Under TRITON_INTERPRET (CPU) the NVFP4 kernels
run in Triton's interpreter; on a GPU the same tests run them on CUDA.
"""

from __future__ import annotations

import sys

import pytest
import torch

import pyfuser
from harness import DEVICE
from pyfuser import InputTypeError, InputValidationError, UnsupportedOpError, nvf_cutlass
from pyfuser.nvfp4 import reference

FP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                          dtype=torch.float64)


@pytest.fixture(autouse=True)
def _no_unreported_device_errors():
    """A test that leaves a device-side check's error unreported fails (and the error is cleared): it would
    otherwise be raised by the next test's first nvf_cutlass call."""
    yield
    from pyfuser.frontend import nvf_cutlass as module
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    if module._ERRORS.flagged():
        try:
            module._ERRORS.poll()
        except pyfuser.FusionExecutionError as e:
            pytest.fail(f"an nvf_cutlass device check's error was left unreported: {e}")


def _round_up(x, m):
    return (x + m - 1) // m * m


def _e4m3_value(bits: torch.Tensor) -> torch.Tensor:
    """float64 value of e4m3 bit patterns 0..0x7E (positive; 0x7F would be NaN), from the format's definition."""
    b = bits.to(torch.int64)
    exp, man = b >> 3, (b & 7).to(torch.float64)
    normal = (1 + man / 8) * torch.pow(2.0, (exp - 7).to(torch.float64))
    return torch.where(exp == 0, man / 8 * 2.0 ** -6, normal)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


class Nvfp4Operand:
    """Random FP4 codes [rows, k] with e4m3 scale bits [rows, k/16], and their float64 dequantized values."""

    def __init__(self, shape, seed, scale_bits=(0x20, 0x41), special=False):
        gen = _gen(seed)
        self.codes = torch.randint(0, 16, shape, dtype=torch.uint8, generator=gen)
        sshape = (*shape[:-1], shape[-1] // 16)
        self.bits = torch.randint(*scale_bits, sshape, dtype=torch.uint8, generator=gen)
        if special:  # (first matrix) row 0: zero codes; row 1: zero scales; row 2: +-6 codes with scale 448
            self.codes[..., 0, :] = 0
            self.bits[..., 1, :] = 0
            self.codes[..., 2, :] = torch.tensor([7, 15], dtype=torch.uint8).repeat(shape[-1] // 2)
            self.bits[..., 2, :] = 0x7E
        self.values = FP4_VALUES[self.codes.long()] * _e4m3_value(self.bits).repeat_interleave(16, dim=-1)

    def packed(self):
        return reference.pack_fp4(self.codes).to(DEVICE)

    def scales(self):
        return self.bits.view(torch.float8_e4m3fn)


def _swizzled(scales: torch.Tensor) -> torch.Tensor:
    return reference.linear_to_swizzled_128_4(scales).to(DEVICE)


def _starts(tokens, pad=1):
    out, at = [], 0
    for t in tokens:
        out.append(at)
        at += _round_up(t, pad)
    return torch.tensor(out, dtype=torch.int32)


def _assert_dense_result(out, shape, dtype):
    assert out.dtype == dtype and tuple(out.shape) == shape and out.is_contiguous() and out.device.type == DEVICE.type


# ----------------------------------------------------------------------------------------------------------------
# NVFP4 grouped


def _grouped_case(tokens, n, k, seed=0, alphas=None, **kw):
    g, m = len(tokens), sum(tokens)
    a = Nvfp4Operand((m, k), seed, **kw)
    w = Nvfp4Operand((g, n, k), seed + 1, **kw)
    eo, so = _starts(tokens), _starts(tokens, 128)
    if alphas is None:
        alphas = torch.rand(g, generator=_gen(seed + 2), dtype=torch.float32) / k + 1e-3
    args = dict(
        a=a.packed(), b=w.packed(),
        a_blockscale=reference.preprocess_grouped_matmul_input_sf(a.scales().to(DEVICE), eo.to(DEVICE), so.to(DEVICE)),
        b_blockscale=torch.stack([_swizzled(w.scales()[i]) for i in range(g)]),
        alphas=alphas.to(DEVICE), ab_strides=torch.full((g,), k, dtype=torch.int64, device=DEVICE),
        c_strides=torch.full((g,), n, dtype=torch.int64, device=DEVICE),
        problem_sizes=torch.tensor([[t, n, k] for t in tokens], dtype=torch.int32, device=DEVICE),
        expert_offsets=eo.to(DEVICE), sf_offsets=so.to(DEVICE))
    oracle = torch.zeros((m, n), dtype=torch.float64)
    for i, (start, rows) in enumerate(zip(eo.tolist(), tokens)):
        oracle[start:start + rows] = alphas[i].double() * (a.values[start:start + rows] @ w.values[i].T)
    return args, oracle


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_nvfp4_scaled_grouped_mm_uneven_and_empty_groups(out_dtype):
    args, oracle = _grouped_case([70, 0, 130], n=128, k=128)
    out = nvf_cutlass.nvfp4_scaled_grouped_mm(*args.values(), out_dtype)
    _assert_dense_result(out, (200, 128), out_dtype)
    torch.testing.assert_close(out.cpu(), oracle.to(out_dtype))
    # pyfuser's reference of the op, on the op's operand form (b transposed), agrees too
    ref = reference.nvfp4_grouped_mm(args["a"], args["b"].transpose(-1, -2), args["a_blockscale"],
                                     args["b_blockscale"], args["alphas"], args["problem_sizes"],
                                     args["expert_offsets"], args["sf_offsets"], out_dtype)
    torch.testing.assert_close(out, ref)


def test_nvfp4_scaled_grouped_mm_special_values():
    """Every code (+-6, -0 included), e4m3 scales from 0 (zero blocks) to 448, a negative alpha, uint8 operands."""
    alphas = torch.tensor([2.0 ** -20, -(2.0 ** -18)])
    args, oracle = _grouped_case([128, 64], n=128, k=64, seed=5, alphas=alphas, scale_bits=(0x00, 0x7F),
                                 special=True)
    args["a"], args["b"] = args["a"].view(torch.uint8), args["b"].view(torch.uint8)
    out = nvf_cutlass.nvfp4_scaled_grouped_mm(*args.values(), torch.bfloat16)
    assert (oracle[:2] == 0).all() and oracle[2].abs().max() > 100  # the case covers what it says
    torch.testing.assert_close(out.cpu(), oracle.to(torch.bfloat16))


# ----------------------------------------------------------------------------------------------------------------
# NVFP4 dense


def _dense_case(m, n, k, seed=0):
    a, b = Nvfp4Operand((m, k), seed), Nvfp4Operand((n, k), seed + 1)
    alpha = torch.tensor(1.0 / 3.0, dtype=torch.float32)
    args = dict(a=a.packed(), b=b.packed(), scales_a=_swizzled(a.scales()), scales_b=_swizzled(b.scales()),
                alpha=alpha.to(DEVICE))
    return args, alpha.double() * (a.values @ b.values.T)


def test_single_group_grouped_scale_layout_is_the_swizzled_layout():
    """What nvfp4_scaled_mm relies on: group 0 at row 0 of the grouped buffer holds the plain 128x4 swizzle."""
    s = Nvfp4Operand((200, 64), 3).scales()
    zero = torch.zeros(1, dtype=torch.int32)
    grouped = reference.preprocess_grouped_matmul_input_sf(s, zero, zero)
    single = reference.linear_to_swizzled_128_4(s)
    flat = torch.as_strided(grouped, (single.numel(),), (1,))
    assert torch.equal(flat.view(torch.uint8), single.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("alpha_shape", [(), (1,)])
def test_nvfp4_scaled_mm(out_dtype, alpha_shape):
    args, oracle = _dense_case(200, 160, 128)  # m, n not multiples of 128: padded scale tiles
    args["alpha"] = args["alpha"].reshape(alpha_shape)
    out = nvf_cutlass.nvfp4_scaled_mm(*args.values(), out_dtype)
    _assert_dense_result(out, (200, 160), out_dtype)
    torch.testing.assert_close(out.cpu(), oracle.to(out_dtype))


def test_nvfp4_scaled_mm_blockscale():
    args, oracle = _dense_case(128, 128, 128, seed=11)
    gs = torch.tensor(2.0, device=DEVICE)
    out_fp4, out_scales = nvf_cutlass.nvfp4_scaled_mm_blockscale(*args.values(), gs)
    assert out_fp4.dtype == torch.float4_e2m1fn_x2 and tuple(out_fp4.shape) == (128, 64) and out_fp4.is_contiguous()
    assert out_scales.dtype == torch.float8_e4m3fn and tuple(out_scales.shape) == (128, 8)
    # nvFuser's test: quantize the reference GEMM result (here the float64 oracle rounded to bf16) and compare fp4
    # values within 2.0 on fewer than 10% of elements, scales within e4m3's resolution.
    exp_fp4, exp_scales = reference.quantize_nvfp4(oracle.to(torch.bfloat16).float(), gs.cpu())
    diff = (reference.from_fp4(out_fp4.cpu()) - reference.from_fp4(exp_fp4)).abs()
    assert diff.max() <= 2.0 and (diff != 0).float().mean() < 0.1
    torch.testing.assert_close(out_scales.cpu().float(), reference.linear_to_swizzled_128_4(exp_scales).float(),
                               atol=2e-3, rtol=0.125)
    # Exactly: the fused quantization of this GEMM's own bf16 result (the documented rounding), padding zero.
    gemm = nvf_cutlass.nvfp4_scaled_mm(*args.values(), torch.bfloat16).cpu()
    want_fp4, want_scales = reference.quantize_nvfp4_fused(gemm.float(), gs.cpu())
    assert torch.equal(out_fp4.cpu().view(torch.uint8), want_fp4.view(torch.uint8))
    assert torch.equal(out_scales.cpu().view(torch.uint8), reference.linear_to_swizzled_128_4(want_scales).view(torch.uint8))


def test_nvfp4_scaled_mm_blockscale_pads_scales_to_128_rows():
    args, _ = _dense_case(64, 96, 64, seed=13)
    out_fp4, out_scales = nvf_cutlass.nvfp4_scaled_mm_blockscale(*args.values(), torch.tensor([1.0], device=DEVICE))
    assert tuple(out_fp4.shape) == (64, 48) and tuple(out_scales.shape) == (128, 8)
    linear = reference.swizzled_to_linear_128_4(out_scales.cpu(), 64, 6)
    full = reference.linear_to_swizzled_128_4(linear)
    assert torch.equal(out_scales.cpu().view(torch.uint8), full.view(torch.uint8))  # padding is zero


# ----------------------------------------------------------------------------------------------------------------
# prepared launches per operand signature


def _counting(monkeypatch, name):
    """Count the constructions of nvf_cutlass's prepared kernel class ``name`` (GroupedGemm, BlockQuantize)."""
    cls, built = getattr(nvf_cutlass, name), []

    def counted(*args, **kwargs):
        built.append(1)
        return cls(*args, **kwargs)

    monkeypatch.setattr(nvf_cutlass, name, counted)
    monkeypatch.setattr(nvf_cutlass, "_PREPARED", type(nvf_cutlass._PREPARED)())
    monkeypatch.setattr(nvf_cutlass, "_LAST", {})
    return built


def test_nvfp4_grouped_prepared_once_per_signature_and_offsets_checked_every_call(monkeypatch):
    built = _counting(monkeypatch, "GroupedGemm")
    args, oracle = _grouped_case([40, 0, 24], n=128, k=64, seed=21)
    for _ in range(2):  # the second call reuses the prepared launch, and computes the same
        out = nvf_cutlass.nvfp4_scaled_grouped_mm(*args.values(), torch.bfloat16)
        torch.testing.assert_close(out.cpu(), oracle.to(torch.bfloat16))
    assert len(built) == 1
    nvf_cutlass.nvfp4_scaled_grouped_mm(*args.values(), torch.float16)  # another out_dtype: prepared anew
    assert len(built) == 2
    # Same metadata, bad values: still refused (checked on every call: on CPU at once, on CUDA on the device).
    bad = {**args, "expert_offsets": torch.tensor([0, 40, 10], dtype=torch.int32, device=DEVICE)}
    _bad_values_refused("nvfp4_scaled_grouped_mm", "expert_offsets must be non-decreasing",
                        lambda: nvf_cutlass.nvfp4_scaled_grouped_mm(*bad.values(), torch.bfloat16),
                        lambda: nvf_cutlass.nvfp4_scaled_grouped_mm(*args.values(), torch.bfloat16))
    # The same view of a_blockscale over another storage size: the kernel bounds its scale reads by the storage, so
    # the launch is prepared (and the capacity checked) anew: a larger storage computes the same, a storage of just
    # the view's elements is refused (the groups' padded scale rows do not fit).
    scale1 = args["a_blockscale"]
    total = scale1.untyped_storage().nbytes()
    whole = torch.as_strided(scale1, (total,), (1,), 0)
    larger = torch.zeros(total + 512, dtype=scale1.dtype, device=DEVICE)
    larger[:total].copy_(whole)
    larger = larger.as_strided(scale1.shape, scale1.stride(), scale1.storage_offset())
    out = nvf_cutlass.nvfp4_scaled_grouped_mm(*{**args, "a_blockscale": larger}.values(), torch.bfloat16)
    torch.testing.assert_close(out.cpu(), oracle.to(torch.bfloat16))
    assert len(built) == 3
    tight = scale1.clone()  # (a storage of just the view's elements; whether it fits depends on sf_offsets' values)
    _bad_values_refused("nvfp4_scaled_grouped_mm", "a_blockscale holds 64 block-scale rows",
                        lambda: nvf_cutlass.nvfp4_scaled_grouped_mm(*{**args, "a_blockscale": tight}.values(),
                                                                    torch.bfloat16),
                        lambda: nvf_cutlass.nvfp4_scaled_grouped_mm(*args.values(), torch.bfloat16))


def test_nvfp4_dense_and_blockscale_prepared_once(monkeypatch):
    gemms, quantizers = _counting(monkeypatch, "GroupedGemm"), _counting(monkeypatch, "BlockQuantize")
    args, oracle = _dense_case(128, 128, 64, seed=23)
    gs = torch.tensor(2.0, device=DEVICE)
    first = [nvf_cutlass.nvfp4_scaled_mm_blockscale(*args.values(), gs) for _ in range(2)]
    assert len(gemms) == 1 and len(quantizers) == 1
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(*first))
    out = nvf_cutlass.nvfp4_scaled_mm(*args.values(), torch.bfloat16)  # another function: its own launch
    torch.testing.assert_close(out.cpu(), oracle.to(torch.bfloat16))
    assert len(gemms) == 2


# ----------------------------------------------------------------------------------------------------------------
# MXFP8


def _mxfp8_operand(rows, k, seed):
    """e4m3 data (zeros, negatives and +-448 included) and e8m0 scale bits 2**-8 .. 2**7, with float64 values."""
    gen = _gen(seed)
    data = (torch.randn((rows, k), generator=gen) * 64).clamp(-448, 448)
    data[0, :4] = torch.tensor([448.0, -448.0, 0.0, -0.0])
    data = data.to(torch.float8_e4m3fn)
    bits = torch.randint(119, 135, (rows, k // 32), dtype=torch.uint8, generator=gen)
    values = data.double() * torch.pow(2.0, bits.double() - 127).repeat_interleave(32, dim=1)
    return data.to(DEVICE), _swizzled(bits.view(torch.float8_e8m0fnu)), values


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_mxfp8_scaled_mm(out_dtype):
    m, n, k = 130, 128, 96  # k/32 = 3 scale columns, padded to 4
    a, sa, av = _mxfp8_operand(m, k, 0)
    b, sb, bv = _mxfp8_operand(n, k, 1)
    alpha = torch.tensor(2.0 ** -12, device=DEVICE)
    out = nvf_cutlass.mxfp8_scaled_mm(a, b, sa, sb, alpha, out_dtype)
    _assert_dense_result(out, (m, n), out_dtype)
    # float32 sums against float64 ones: the final rounding may differ by one ulp of out_dtype
    eps = torch.finfo(out_dtype).eps
    torch.testing.assert_close(out.cpu(), (av @ bv.T * 2.0 ** -12).to(out_dtype), rtol=2 * eps, atol=1e-5)
    # Non-contiguous operands (column-major a, every other row of a wider b): the same result, bit for bit.
    a_cm = a.t().contiguous().t()
    wide = torch.zeros((2 * n, k), dtype=b.dtype, device=b.device)
    wide[::2] = b
    b_rows = wide[::2]
    assert not a_cm.is_contiguous() and not b_rows.is_contiguous()
    again = nvf_cutlass.mxfp8_scaled_mm(a_cm, b_rows, sa, sb, alpha, out_dtype)
    _assert_dense_result(again, (m, n), out_dtype)
    assert torch.equal(again, out)


# ----------------------------------------------------------------------------------------------------------------
# grouped_mm


def _grouped_mm_case(dtype, k=48, n=32, seed=0):
    """Rows 0..9 before the first group, an empty group, uneven groups up to m."""
    starts, sizes, m, g = [10, 10, 70], [0, 60, 30], 100, 3
    gen = _gen(seed)
    a = torch.randn((m, k), generator=gen).to(dtype)
    b = torch.randn((g, n, k), generator=gen).to(dtype)
    oracle = torch.zeros((m, n), dtype=torch.float64)
    for i, (s, r) in enumerate(zip(starts, sizes)):
        oracle[s:s + r] = a[s:s + r].double() @ b[i].double().T
    args = (a.to(DEVICE), b.to(DEVICE), torch.full((g,), k, dtype=torch.int64, device=DEVICE),
            torch.full((g,), n, dtype=torch.int64, device=DEVICE),
            torch.tensor([[r, n, k] for r in sizes], dtype=torch.int32, device=DEVICE),
            torch.tensor(starts, dtype=torch.int32, device=DEVICE))
    return args, oracle.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("path", ["grouped_mm", "loop"])
def test_grouped_mm(dtype, path, monkeypatch):
    if path == "loop":
        monkeypatch.setattr(nvf_cutlass, "_grouped_mm_fits", lambda a, b: False)
    elif not nvf_cutlass._grouped_mm_fits(torch.empty((1, 48), dtype=dtype, device=DEVICE),
                                          torch.empty((1, 32, 48), dtype=dtype, device=DEVICE)):
        pytest.skip(f"torch._grouped_mm does not run {dtype} on {DEVICE}")
    args, oracle = _grouped_mm_case(dtype)
    out = nvf_cutlass.grouped_mm(*args)
    _assert_dense_result(out, (100, 32), dtype)
    assert (out[:10] == 0).all()  # rows no group covers: zero, never uninitialized memory
    torch.testing.assert_close(out.cpu(), oracle)


def test_grouped_mm_unaligned_k_takes_the_loop():
    args, oracle = _grouped_mm_case(torch.bfloat16, k=20)  # 40-byte rows: not what torch._grouped_mm accepts
    torch.testing.assert_close(nvf_cutlass.grouped_mm(*args).cpu(), oracle)


# ----------------------------------------------------------------------------------------------------------------
# bad arguments: our error type, the function, the argument, what was expected and found


def _raises(cls, fn_name, *fragments):
    return pytest.raises(cls, match="^nvf_cutlass\\." + fn_name + ": .*" + ".*".join(fragments))


def _bad_values_refused(fn_name, fragment, bad_call, good_call, deferred=DEVICE.type == "cuda"):
    """Offsets or problem sizes with bad VALUES: on CPU ``bad_call`` raises at once; on CUDA (``deferred``) it is
    checked on the device (no host read), and the next call after the GPU has finished it raises, naming the
    check, once. The good call after that runs."""
    if not deferred:
        with _raises(InputValidationError, fn_name, fragment):
            bad_call()
        return
    bad_call()  # queued, not refused: its output is invalid, and it is reported later
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    with pytest.raises(pyfuser.FusionExecutionError,
                       match="^nvf_cutlass\\." + fn_name + ": .*" + fragment + ".*found on the device by an earlier "
                             "nvf_cutlass call"):
        good_call()
    good_call()  # reported once: the flags are clear again
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def test_bad_values_found_on_the_device_are_reported_by_the_next_call(monkeypatch):
    """The CUDA form of the value checks (device check into pinned flags, reported by the next call), run on CPU
    tensors: the checks' kernels write plain host memory there."""
    from pyfuser.frontend import nvf_cutlass as module
    monkeypatch.setattr(module, "_DEFERRED_DEVICES", frozenset({"cpu", "cuda"}))
    args, _ = _grouped_case([40, 0, 24], n=128, k=64, seed=5)
    bad = {**args, "expert_offsets": torch.tensor([0, 40, 10], dtype=torch.int32, device=DEVICE)}
    call = lambda kw: nvf_cutlass.nvfp4_scaled_grouped_mm(*kw.values(), torch.bfloat16)
    _bad_values_refused("nvfp4_scaled_grouped_mm", "expert_offsets must be non-decreasing", lambda: call(bad),
                        lambda: call(args), deferred=True)
    ga, _ = _grouped_mm_case(torch.bfloat16)
    if nvf_cutlass._grouped_mm_fits(ga[0], ga[1]):
        _bad_values_refused("grouped_mm", "problem_sizes must be \\(m_i, N",
                            lambda: nvf_cutlass.grouped_mm(*ga[:4], ga[4].flip(0), ga[5]),
                            lambda: nvf_cutlass.grouped_mm(*ga), deferred=True)


def test_nvfp4_scaled_grouped_mm_bad_arguments():
    args, _ = _grouped_case([64, 0, 64], n=128, k=64)
    call = lambda out_dtype=torch.bfloat16, **kw: nvf_cutlass.nvfp4_scaled_grouped_mm(
        *{**args, **kw}.values(), out_dtype)
    fn = "nvfp4_scaled_grouped_mm"
    with _raises(InputTypeError, fn, "b must be packed fp4", "bfloat16"):
        call(b=torch.zeros((3, 128, 32), dtype=torch.bfloat16, device=DEVICE))
    with _raises(InputValidationError, fn, "out_dtype must be torch.bfloat16 or torch.float16", "float32"):
        call(torch.float32)
    with _raises(InputTypeError, fn, "out_dtype must be a torch.dtype"):
        call("bfloat16")
    with _raises(InputValidationError, fn, "b_blockscale must be a contiguous"):
        call(b_blockscale=args["b_blockscale"][:, :64])
    with _raises(InputValidationError, fn, "a must be packed fp4", "float8_e4m3fn"):
        call(a=args["a_blockscale"])
    with _raises(InputValidationError, fn, "alphas must be float32"):
        call(alphas=args["alphas"].double())
    with _raises(InputValidationError, fn, "ab_strides must be int64 \\[g=3\\]", "\\(2,\\)"):
        call(ab_strides=args["ab_strides"][:2])
    _bad_values_refused(fn, "expert_offsets must be non-decreasing",
                        lambda: call(expert_offsets=torch.tensor([0, 64, 10], dtype=torch.int32, device=DEVICE)),
                        call)
    _bad_values_refused(fn, "problem_sizes must be \\(m_i, N",
                        lambda: call(problem_sizes=torch.tensor([[64, 128, 64], [0, 128, 64], [60, 128, 64]],
                                                                dtype=torch.int32, device=DEVICE)),
                        call)
    with _raises(UnsupportedOpError, fn, "K=96 is not a multiple of 64"):
        call(a=torch.zeros((128, 48), dtype=torch.uint8, device=DEVICE),
             b=torch.zeros((3, 128, 48), dtype=torch.uint8, device=DEVICE))


def test_nvfp4_dense_bad_arguments():
    args, _ = _dense_case(128, 128, 64)
    fn = "nvfp4_scaled_mm"
    with _raises(InputValidationError, fn, "scales_a must be padded and 128x4-swizzled to shape \\(128, 4\\)",
                 "\\(64, 4\\)"):
        nvf_cutlass.nvfp4_scaled_mm(*{**args, "scales_a": args["scales_a"][:64]}.values(), torch.bfloat16)
    with _raises(InputValidationError, fn, "alpha must be a float32 scalar tensor", "\\(2,\\)"):
        nvf_cutlass.nvfp4_scaled_mm(*{**args, "alpha": torch.ones(2, device=DEVICE)}.values(), torch.bfloat16)
    with _raises(InputValidationError, fn, "same k/2"):
        nvf_cutlass.nvfp4_scaled_mm(*{**args, "b": args["b"][:, :16].contiguous()}.values(), torch.bfloat16)
    with _raises(InputValidationError, fn, "K must be a multiple of 32", "K=48"):
        nvf_cutlass.nvfp4_scaled_mm(*{**args, "a": args["a"][:, :24].contiguous(), "b": args["b"][:, :24].contiguous()}.values(),
                                    torch.bfloat16)
    with _raises(InputTypeError, "nvfp4_scaled_mm_blockscale", "global_normconst must be a float32 scalar",
                 "float64"):
        nvf_cutlass.nvfp4_scaled_mm_blockscale(*args.values(), torch.tensor(1.0, dtype=torch.float64))


def test_mxfp8_and_grouped_mm_bad_arguments():
    a, sa, _ = _mxfp8_operand(128, 64, 0)
    alpha = torch.tensor(1.0, device=DEVICE)
    with _raises(InputTypeError, "mxfp8_scaled_mm", "scales_b must be float8_e8m0fnu", "float8_e4m3fn"):
        nvf_cutlass.mxfp8_scaled_mm(a, a, sa, sa.view(torch.float8_e4m3fn), alpha, torch.bfloat16)
    with _raises(InputValidationError, "mxfp8_scaled_mm", "out_dtype must be", "float32"):
        nvf_cutlass.mxfp8_scaled_mm(a, a, sa, sa, alpha, torch.float32)
    args, _ = _grouped_mm_case(torch.bfloat16)
    with _raises(InputTypeError, "grouped_mm", "b must be torch.bfloat16 \\(a's dtype\\)", "float16"):
        nvf_cutlass.grouped_mm(args[0], args[1].half(), *args[2:])
    with _raises(InputTypeError, "grouped_mm", "c_strides must be int64", "int32"):
        nvf_cutlass.grouped_mm(*args[:3], args[3].int(), *args[4:])
    # (where torch._grouped_mm cannot run them, the per-group loop reads the values on the host anyway: at once)
    _bad_values_refused("grouped_mm", "problem_sizes must be \\(m_i, N",
                        lambda: nvf_cutlass.grouped_mm(*args[:4], args[4].flip(0), args[5]),
                        lambda: nvf_cutlass.grouped_mm(*args),
                        deferred=DEVICE.type == "cuda" and nvf_cutlass._grouped_mm_fits(args[0], args[1]))


# ----------------------------------------------------------------------------------------------------------------
# the module name nvFuser's code imports


def test_from_nvfuser_direct_import_nvf_cutlass(monkeypatch):
    for name in ("nvfuser_direct", "nvfuser_direct.pytorch_utils", "nvfuser_direct.nvf_cutlass",
                 "nvfuser_direct.nvfuser_direct_version", "nvfuser"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    pyfuser.register_as_nvfuser_direct()
    from nvfuser_direct import nvf_cutlass as imported
    import nvfuser_direct.nvf_cutlass as by_path

    assert imported is by_path is pyfuser.nvf_cutlass
    assert all(callable(getattr(imported, f)) for f in ("nvfp4_scaled_grouped_mm", "nvfp4_scaled_mm",
                                                        "nvfp4_scaled_mm_blockscale", "mxfp8_scaled_mm", "grouped_mm"))
