"""pyfuser/demo/moe_nvfp4.py (examples/moe_nvfp4.py): the NVFP4 MoE layer as one pyfuser fusion, at tiny sizes.

The fusion is checked
- tightly against the example's own plain-torch NVFP4 emulation (fake-quantized activations, weights decoded from
  the packed bytes, fp32 matmuls): both compute the same math, so they differ only where fp32 summation order flips
  a bf16 rounding of a GEMM output (and, rarely, an FP4 code of the re-quantized SiLU*mul downstream);
- loosely against the real bf16 layer (original bf16 weights), with a bound derived from NVFP4's quantization
  error (see BF16_MEAN_BOUNDS).
The emulation's own building blocks are checked against pyfuser.nvfp4.reference first, so a wrong emulation cannot
make a wrong fusion pass.
"""

from __future__ import annotations

import pytest
import torch
from harness import DEVICE

from pyfuser import FusionDefinition
from pyfuser.nvfp4 import reference as ref
from pyfuser.frontend.printer import fusion_to_python

from pyfuser.demo import moe_nvfp4 as moe

TINY = moe.MoEConfig(hidden=128, intermediate=64, experts=4, top_k=2)

# Fusion vs emulation. Per-token relative L2 error: bf16 rounding flips are 2^-9 relative on single elements, i.e.
# ~1e-3 on a token's norm at worst; one flipped FP4 code of h (one element off by one E2M1 step) moves a token by a
# few 1e-3..1e-2. On CPU both paths give identical bits (measured: 0); on a GPU the kernels sum in another order.
EMU_MAX, EMU_TOTAL = 3e-2, 5e-3

# Fusion vs bf16. One NVFP4-quantized Gaussian-like tensor (E2M1 values, amax/6 block scales in e4m3) has a relative
# RMS error of ~0.095 (measured); a GEMM with both operands quantized ~sqrt(2)*0.095 = 0.135; this layer quantizes
# four tensors (x, W13, SiLU*mul, W2) in two chained GEMMs: ~0.25 mean per token (measured 0.236..0.268 over 8
# seeds; max over 16 tokens 0.28..0.38). Upper bounds leave ~1.6x headroom. The lower bound proves quantization
# happened: a layer that silently ran in bf16 would be below 0.01.
BF16_MEAN_BOUNDS = (0.1, 0.4)
BF16_MAX_BOUND = 0.6


def _check_close_to_emulation(errs: dict) -> None:
    assert errs["rel_err_max"] <= EMU_MAX, errs
    assert errs["rel_err_total"] <= EMU_TOTAL, errs


# --------------------------------------------------------------------------------------------------------------
# the emulation's building blocks vs pyfuser.nvfp4.reference


def test_quantized_weights_layout_and_decode():
    w = moe.make_weights(TINY, DEVICE, seed=3)
    q = moe.quantize_experts(w.w13)
    E, N, K = w.w13.shape
    assert q.packed.dtype == torch.float4_e2m1fn_x2 and tuple(q.packed.shape) == (E, N, K // 2)
    assert q.scales.dtype == torch.float8_e4m3fn and tuple(q.scales.shape) == (E, N, K // 16)
    # upstream's recipe: gs_B = 2688 / max(W_e) (max, not abs-max), alpha = 1 / gs_B
    torch.testing.assert_close(q.global_scale, 2688.0 / w.w13.float().amax(dim=(1, 2)))
    torch.testing.assert_close(q.alpha, 1.0 / q.global_scale)
    for e in range(E):
        assert torch.equal(q.scales[e].view(torch.uint8), ref.linear_to_swizzled_128_4(q.scales_linear[e]).view(torch.uint8))
        want = ref.dequantize_nvfp4(q.packed[e], q.scales_linear[e], q.global_scale[e])
        got = moe.decode_nvfp4(q.packed[e : e + 1], q.scales_linear[e : e + 1], q.global_scale[e : e + 1])[0]
        torch.testing.assert_close(got, want, atol=0, rtol=1e-6)
    # and the decoded weights are NVFP4-close to the bf16 ones (~0.1 relative, see BF16_MEAN_BOUNDS)
    dec = moe.decode_nvfp4(q.packed, q.scales_linear, q.global_scale)
    rel = ((dec - w.w13.float()).norm() / w.w13.float().norm()).item()
    assert 0.03 < rel < 0.15, rel


def test_fake_quantize_activation_matches_fused_reference():
    x = torch.randn(24, 64, device=DEVICE) * torch.logspace(-3, 2, 24, device=DEVICE)[:, None]
    x[3, :16] = 0.0  # an all-zero block: zero scale, zero data
    packed, scales = ref.quantize_nvfp4_fused(x)
    want = ref.dequantize_nvfp4(packed, scales)
    torch.testing.assert_close(moe.fake_quantize_activation(x), want, atol=0, rtol=0)


def test_config_rejects_sizes_the_nvfp4_gemm_cannot_take():
    for bad, what in (
        (moe.MoEConfig(hidden=192), "hidden"),
        (moe.MoEConfig(intermediate=96), "intermediate"),
        (moe.MoEConfig(top_k=0), "top_k"),
        (moe.MoEConfig(experts=2, top_k=3), "top_k"),
    ):
        with pytest.raises(ValueError, match=what):
            bad.check()


# --------------------------------------------------------------------------------------------------------------
# the fusion


@pytest.mark.parametrize("quant", ["grouped", "split"])
def test_moe_layer_matches_emulation_and_bf16(quant):
    m = moe.run(TINY, 16, DEVICE, quant=quant, seed=0)
    assert m["ok"]
    out = m["outputs"]["nvfp4"]
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (16, TINY.hidden) and out.device.type == DEVICE.type
    assert out.is_contiguous() and torch.isfinite(out).all()
    _check_close_to_emulation(m["nvfp4_vs_emulation"])
    e = m["nvfp4_vs_bf16"]
    assert BF16_MEAN_BOUNDS[0] <= e["rel_err_mean"] <= BF16_MEAN_BOUNDS[1], e
    assert e["rel_err_max"] <= BF16_MAX_BOUND, e
    assert m["expert_weight_bytes"]["bf16"] > 3.4 * m["expert_weight_bytes"]["nvfp4"]
    # the offsets computed in the fusion feed the grouped quantize / layout op, which need them as segment inputs
    assert len(m["segments"]) > 1


def test_moe_layer_uneven_routing_empty_expert_and_two_scale_tiles():
    """Expert 0 gets every token (160 rows: two 128-row block-scale tiles), expert 3 none (an empty group)."""
    cfg = moe.MoEConfig(hidden=128, intermediate=64, experts=4, top_k=2)
    w = moe.make_weights(cfg, DEVICE, seed=1)
    x = torch.randn(160, cfg.hidden, generator=torch.Generator().manual_seed(5)).to(DEVICE, torch.bfloat16)
    x[:, 0] = 8.0  # a constant feature the router keys on
    w.router[0, 0], w.router[3, 0] = 2.0, -4.0
    _, ids = moe.route(x, w.router, cfg.top_k)
    counts = torch.bincount(ids.flatten(), minlength=cfg.experts)
    assert counts[0] == 160 and counts[3] == 0, counts  # the routing this test is about
    q = moe.quantize_weights(w)
    out = moe.MoENVFP4(cfg, q)(x)
    assert tuple(out.shape) == (160, cfg.hidden) and out.dtype == torch.bfloat16
    _check_close_to_emulation(moe.relative_errors(out, moe.moe_nvfp4_emulated(x, q, cfg)))


def test_moe_fusion_repr_round_trips_and_reruns():
    """The printed definition (every NVFP4 op in it) rebuilds the same fusion, which gives the same output."""
    w = moe.make_weights(TINY, DEVICE, seed=2)
    layer = moe.MoENVFP4(TINY, moe.quantize_weights(w))
    x = torch.randn(8, TINY.hidden, generator=torch.Generator().manual_seed(2)).to(DEVICE, torch.bfloat16)
    fd = layer.fusion(8)
    text = repr(fd)
    for op in ("nv_grouped_block_quantize", "cutlass_nvfp4_grouped_mm", "Float4_e2m1fn", "Float8_e4m3fn"):
        assert op in text
    scope = {"FusionDefinition": FusionDefinition, "DataType": moe.DataType}
    exec(text, scope)
    with FusionDefinition() as fd2:
        scope["nvfuser_fusion"](fd2)
    # names follow creation order and statements printing order: the rebuilt definition prints the canonical form
    assert repr(fd2) == fusion_to_python(fd.fusion, canonical=True)
    (out2,) = fd2.execute(layer.inputs(x))
    assert torch.equal(out2, layer(x))


def test_main_prints_the_accuracy_report(capsys):
    moe.main(["--tokens", "8", "--device", DEVICE.type, "--experts", "2", "--top-k", "1"])
    text = capsys.readouterr().out
    assert "pyfuser NVFP4 vs bf16 reference" in text and "T=8 tokens" in text and "top-1" in text
    assert "OK:" in text
