"""NVFP4 support for pyfuser.

`pyfuser.nvfp4.reference` is the pure-torch oracle (FP4 codes and packing, block quantization in the spec's
reference order and in the fused ops' order, dequantization, 128x4 scale swizzles, the grouped block-scale layout
of ``preprocess_grouped_matmul_input_sf`` and the NVFP4 grouped GEMM). Its public names are re-exported here so
users and tests can write ``from pyfuser.nvfp4 import quantize_nvfp4``. The Triton kernels live in sibling
modules (``layout_kernels``, ``grouped_gemm``) and are imported explicitly, so importing this package never
imports triton.
"""

from .reference import (
    FLOAT4_E2M1_MAX,
    FLOAT8_E4M3_EPS,
    FLOAT8_E4M3_MAX,
    dequantize_nvfp4,
    fp4_decode,
    fp4_encode,
    from_fp4,
    grouped_buffer_numel,
    grouped_quantize_nvfp4,
    grouped_scale_index,
    grouped_scales_to_linear,
    linear_to_swizzled_128_4,
    nvfp4_grouped_mm,
    pack_fp4,
    preprocess_grouped_matmul_input_sf,
    quantize_nvfp4,
    quantize_nvfp4_fused,
    swizzled_to_linear_128_4,
    to_fp4,
    unpack_fp4,
)

__all__ = [
    "FLOAT4_E2M1_MAX",
    "FLOAT8_E4M3_EPS",
    "FLOAT8_E4M3_MAX",
    "dequantize_nvfp4",
    "fp4_decode",
    "fp4_encode",
    "from_fp4",
    "grouped_buffer_numel",
    "grouped_quantize_nvfp4",
    "grouped_scale_index",
    "grouped_scales_to_linear",
    "linear_to_swizzled_128_4",
    "nvfp4_grouped_mm",
    "pack_fp4",
    "preprocess_grouped_matmul_input_sf",
    "quantize_nvfp4",
    "quantize_nvfp4_fused",
    "swizzled_to_linear_128_4",
    "to_fp4",
    "unpack_fp4",
]
