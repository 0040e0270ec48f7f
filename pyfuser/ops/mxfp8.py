"""MXFP8 block quantization: ``fd.ops.nv_block_quantize(x, block_size=32, dtype=DataType.Float8_e4m3fn)``.

Each run of 32 consecutive elements along the last dim shares one power-of-two scale stored as Float8_e8m0fnu
(an 8-bit biased exponent, bias 127); the values are stored as Float8_e4m3fn. The rules, as nvFuser's runtime
(and Transformer Engine's MXFP8 quantizer, which nvFuser's tests compare against) apply them:

- ``amax`` is the largest |x| of the block, computed in fp32; NaN elements do not take part (CUDA's fmax);
- the scale is ``amax * fp32(1/448)`` (one fp32 multiply) rounded *up* to a power of two, saturating to the
  largest finite e8m0 (2^127, for an infinite amax); a zero amax gives the smallest, 2^-127;
- each value is multiplied by the scale's reciprocal, taken as the float with biased exponent ``254 - e``
  (so a block of scale 2^127 multiplies by 0.0, an inf element becoming NaN), except that the smallest scale
  2^-127 multiplies by 1.0; the product is rounded to nearest-even e4m3, saturating to +-448, NaN kept.

There is no hand-written kernel: the op runs as an ATen step on any device. Only this form of MXFP8 is
supported: the grouped variant (``nv_grouped_block_quantize`` with Float8_e4m3fn) is refused.
"""

from __future__ import annotations

import torch

from ..ir.dtypes import DataType
from ..ir.nodes import IterDomain, TensorView
from .common import FusionDtypeError, fail, fusion_of, new_tensor
from .registry import OpDef, OpKind, OpResult

BLOCK_SIZE = 32
E4M3_MAX = 448.0
# fp32(1/448) as a Python float. Either way torch multiplies an fp32 tensor by it (in fp32, or exactly in double
# and then rounded once), the product is the correctly rounded fp32 one; and no device tensor is made per call.
_RCP_E4M3_MAX = float(torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32))
_FP32_MANTISSA_BITS = 23


def _e8m0_round_up(v: torch.Tensor) -> torch.Tensor:
    """Biased e8m0 exponents (int32, 0..254) of ``v`` (fp32, >= 0, possibly +inf) rounded up to a power of two."""
    bits = v.view(torch.int32)
    exponent = bits >> _FP32_MANTISSA_BITS  # v >= 0: no sign bit
    mantissa = bits & 0x7FFFFF
    # Not a power of two: the next exponent up. Subnormals (exponent 0) are mantissa * 2^-149, at most 2^-127
    # when the mantissa is at most 2^22; the largest finite exponent (254) saturates instead of becoming NaN.
    inexact = (mantissa > 0) & (exponent != 254) & ~((exponent == 0) & (mantissa <= 0x400000))
    biased = exponent + inexact.to(torch.int32)
    return torch.where(torch.isinf(v), torch.full_like(biased, 254), biased)


def _reciprocal_of_scale(biased: torch.Tensor) -> torch.Tensor:
    """fp32 with biased exponent ``254 - e`` (2^(127 - e); 0.0 for e = 254), and 1.0 for e = 0."""
    rcp = ((254 - biased) << _FP32_MANTISSA_BITS).view(torch.float32)
    return torch.where(biased == 0, torch.ones_like(rcp), rcp)


def quantize_mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [..., K] (fp32/bf16/fp16, K a multiple of 32) -> (e4m3 values [..., K], e8m0 scales [..., K/32])."""
    k = x.shape[-1]
    # contiguous first: both outputs are dense row-major, whatever the input's strides
    blocks = x.to(torch.float32).contiguous().reshape(*x.shape[:-1], k // BLOCK_SIZE, BLOCK_SIZE)
    magnitude = blocks.abs()
    amax = torch.where(torch.isnan(magnitude), torch.zeros_like(magnitude), magnitude).amax(-1)
    biased = _e8m0_round_up(amax * _RCP_E4M3_MAX)
    scaled = blocks * _reciprocal_of_scale(biased).unsqueeze(-1)
    values = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).reshape(x.shape)
    scales = biased.to(torch.uint8).view(torch.float8_e8m0fnu)
    return values, scales


def _check_k(op: str, k: int) -> None:
    if k % BLOCK_SIZE:
        from ..errors import FusionExecutionError

        raise FusionExecutionError(
            f"fd.ops.{op}: the last dim of input is {k}, not a multiple of block_size {BLOCK_SIZE} (MXFP8)")


def _evaluate(node, input, global_scale=None, swizzle_block_scales=False, block_size=BLOCK_SIZE, dtype=None):
    _check_k(node.op.name, input.shape[-1])
    return quantize_mxfp8(input)


def _meta(node, input, global_scale=None, swizzle_block_scales=False, block_size=BLOCK_SIZE, dtype=None):
    _check_k(node.op.name, input.shape[-1])
    shape = list(input.shape)
    values = torch.empty(shape, dtype=torch.float8_e4m3fn, device="meta")
    return values, torch.empty(shape[:-1] + [shape[-1] // BLOCK_SIZE], dtype=torch.float8_e8m0fnu, device="meta")


def block_quantize_mxfp8(op: str, x: TensorView, global_scale, swizzle_block_scales, block_size,
                         builder) -> OpResult:
    """The Float8_e4m3fn form of ``nv_block_quantize`` (``x`` already checked to be a Float/BF16/Half tensor)."""
    if block_size != BLOCK_SIZE:
        fail(op, f"argument 'block_size' must be {BLOCK_SIZE} for dtype Float8_e4m3fn (MXFP8), got {block_size!r}")
    if swizzle_block_scales:
        fail(op, "argument 'swizzle_block_scales' must be False for dtype Float8_e4m3fn (MXFP8)")
    if global_scale is not None:
        fail(op, "argument 'global_scale' must be None for dtype Float8_e4m3fn (MXFP8)")
    if x.ndim == 0:
        fail(op, f"input ({x.name}) is zero-dimensional; block quantization needs a last dim", FusionDtypeError)
    shape = x.static_shape()
    k = shape[-1]
    if k is not None and k % BLOCK_SIZE:
        fail(op, f"the last dim of input ({x.name}) is {k}, not a multiple of block_size {BLOCK_SIZE}")
    fusion = fusion_of(op, x)
    values = new_tensor(fusion, [IterDomain.iteration(e) for e in shape], DataType.Float8_e4m3fn)
    scale_dims = [IterDomain.iteration(e) for e in shape[:-1]] + [
        IterDomain.iteration(None if k is None else k // BLOCK_SIZE)]
    scales = new_tensor(fusion, scale_dims, DataType.Float8_e8m0fnu)
    kwargs = {"global_scale": None, "swizzle_block_scales": False, "block_size": block_size,
              "dtype": DataType.Float8_e4m3fn}
    return OpResult([values, scales], (x,), kwargs, variant=_variant(op, builder))


_VARIANTS: dict = {}


def _variant(op: str, builder) -> OpDef:
    """The OpDef MXFP8 nodes carry: the op's name and builder (printing, defaults), this module's semantics."""
    if op not in _VARIANTS:
        _VARIANTS[op] = OpDef(op, OpKind.ATEN, builder, _evaluate, meta=_meta)
    return _VARIANTS[op]
