"""The meta-inference contract (meta_inference.md): for every op that can run in an ExprEval segment, the layout
inferred on meta tensors has exactly the sizes and strides of the real result.

Each case builds a single-op fusion, executes it for real, and compares every output with the layout the runtime
inferred for it (``fd.last_runtime().layout(tv)``), over row-major and column-major inputs. Cases exist for every
ATEN op and every VIEW op; ops not registered (yet) are skipped, and ``test_every_expr_eval_op_has_a_case`` fails
when a registered ATEN or VIEW op has no case here, so no future op can skip the contract.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from harness import DEVICE, make
from pyfuser import DataType, FusionDefinition
from pyfuser.ops import OpKind, all_ops
from pyfuser.segment.segmenter import SchedulerKind

LAYOUTS = ["row_major", "column_major"]


def maker(layout: str) -> Callable:
    """make(shape, dtype) in the requested memory order (column-major: all strides reversed)."""

    def build(shape, dtype=torch.float32, **kw):
        if layout == "row_major":
            return make(shape, dtype, **kw)
        rev = tuple(reversed(shape))
        return make(rev, dtype, **kw).permute(*reversed(range(len(shape))))

    return build


def bshd_maker(layout: str) -> Callable:
    """[B,H,S,E] tensors made as [B,S,H,E] (in ``layout``) and transposed, as attention code usually has them."""
    inner = maker(layout)

    def build(shape, dtype=torch.float32, **kw):
        b, h, s, e = shape
        return inner((b, s, h, e), dtype, **kw).transpose(1, 2)

    return build


@dataclass
class Case:
    id: str
    op: str
    # (make) -> (inputs, define): ``define(fd, *input_vals)`` returns the op's outputs to add.
    setup: Callable


def _single(op_name, *args, **kwargs):
    """A define function applying ``fd.ops.<op_name>`` to the inputs, then extra args."""

    def define(fd, *vals):
        out = getattr(fd.ops, op_name)(*vals, *args, **kwargs)
        return list(out) if isinstance(out, tuple) else [out]

    return define


def _matmul(sa, sb):
    return lambda mk: ([mk(sa), mk(sb)], _single("matmul"))


def _linear(sa, sw, sbias):
    def setup(mk):
        inputs = [mk(sa), mk(sw)] + ([mk(sbias)] if sbias is not None else [])
        return inputs, _single("linear")

    return setup


def _sdpa_fwd(q_shape, kv_len, ev, dtype=torch.float32, *, bshd=False, with_mask=False, **kw):
    def setup(mk):
        mk_qkv = bshd_maker(mk.layout) if bshd else mk
        b, h, s, e = q_shape
        q = mk_qkv(q_shape, dtype)
        k = mk_qkv((b, h, kv_len, e), dtype)
        v = mk_qkv((b, h, kv_len, ev), dtype)
        inputs = [q, k, v]
        if with_mask:
            inputs.append(mk((1, h, s, kv_len), torch.bool))

            def define(fd, q, k, v, m):
                return list(fd.ops.sdpfa_fwd(q, k, v, mask=m, **kw))

            return inputs, define
        return inputs, _single("sdpfa_fwd", **kw)

    return setup


def _sdpa_bwd(shape, dtype=torch.float32, *, bshd=False, is_causal=False):
    def setup(mk):
        mk_qkv = bshd_maker(mk.layout) if bshd else mk
        q, k, v, grad, out = (mk_qkv(shape, dtype) for _ in range(5))
        lse = mk(shape[:-1], torch.float32)
        seed = torch.zeros((2,), dtype=torch.uint64, device=DEVICE)
        offset = torch.zeros((), dtype=torch.uint64, device=DEVICE)

        def define(fd, grad, q, k, v, out, lse, seed, offset):
            return list(fd.ops.sdpfa_bwd(grad, q, k, v, out, lse, 0.0, is_causal, seed, offset, 1 / math.sqrt(shape[-1])))

        return [grad, q, k, v, out, lse, seed, offset], define

    return setup


def _embedding(idx_shape, rows, cols):
    def setup(mk):
        return [mk(idx_shape, torch.int64, low=0, high=rows), mk((rows, cols))], _single("embedding_fwd")

    return setup


def _unary(op_name, shape, *args, dtype=torch.float32, **kwargs):
    return lambda mk: ([mk(shape, dtype)], _single(op_name, *args, **kwargs))


def _grouped_mm(case):
    """torch._grouped_mm operands as models hold them (weights [g, n, k] transposed); CUDA wants 16-byte
    aligned strides, so both layouts use these. n=20 checks the CUDA output's padded row pitch."""

    def setup(mk):
        bf = dict(dtype=torch.bfloat16)
        if case == "rows":
            a, b, offs = make((10, 32), **bf), make((3, 24, 32), **bf).transpose(-1, -2), [2, 5, 10]
        elif case == "rows_n20":
            a, b, offs = make((10, 32), **bf), make((3, 20, 32), **bf).transpose(-1, -2), [2, 5, 10]
        elif case == "cols":
            a, b, offs = make((3, 10, 32), **bf), make((24, 32), **bf).t(), [8, 16, 24]
        else:
            a, b, offs = make((32, 16), **bf).t(), make((32, 24), **bf), [8, 16, 32]
        return [a, b, torch.tensor(offs, dtype=torch.int32, device=DEVICE)], _single("grouped_mm")

    return setup


def _nvfp4_gemm(mk):
    from nvfp4_inputs import gemm_inputs

    g = gemm_inputs(40, 128, 64, [15, 25], DEVICE)
    return g.as_list(), lambda fd, *vals: [fd.ops.cutlass_nvfp4_grouped_mm(*vals, dtype=DataType.BFloat16)]


def _scaled_mm(kind):
    """FP8 (per-tensor scales) and NVFP4 (swizzled block scales) operands; the layouts are the op's contract."""

    def setup(mk):
        if kind == "fp8":
            a = make((16, 32)).to(torch.float8_e4m3fn)
            b = make((24, 32)).to(torch.float8_e4m3fn).t()
            scales = [torch.tensor(0.5, device=DEVICE), torch.tensor(2.0, device=DEVICE)]
        else:
            from pyfuser.nvfp4 import reference as nvfp4

            a, sa = nvfp4.quantize_nvfp4(make((40, 64)), None, 16)
            b, sb = nvfp4.quantize_nvfp4(make((24, 64)), None, 16)
            b = b.t()
            scales = [nvfp4.linear_to_swizzled_128_4(sa), nvfp4.linear_to_swizzled_128_4(sb)]
        return [a, b, *scales], lambda fd, *vals: [fd.ops.scaled_mm(*vals)[0]]

    return setup


CASES = [
    Case("mm", "matmul", _matmul((3, 4), (4, 5))),
    Case("dot", "matmul", _matmul((4,), (4,))),
    Case("mv", "matmul", _matmul((3, 4), (4,))),
    Case("vm_batched", "matmul", _matmul((4,), (2, 4, 5))),
    Case("bmm", "matmul", _matmul((2, 3, 4), (2, 4, 5))),
    Case("batched_2d", "matmul", _matmul((2, 3, 4), (4, 5))),
    Case("broadcast_batch", "matmul", _matmul((2, 1, 3, 4), (3, 4, 5))),
    Case("2d", "linear", _linear((3, 4), (5, 4), None)),
    Case("3d_bias", "linear", _linear((2, 3, 4), (5, 4), (5,))),
    Case("1d_weight", "linear", _linear((3, 4), (4,), None)),
    Case("bhsd", "sdpfa_fwd", _sdpa_fwd((2, 3, 5, 8), 7, 8)),
    Case("bshd", "sdpfa_fwd", _sdpa_fwd((2, 3, 5, 8), 7, 8, bshd=True)),
    Case("bshd_bf16_causal", "sdpfa_fwd", _sdpa_fwd((2, 3, 6, 16), 6, 16, torch.bfloat16, bshd=True, is_causal=True)),
    Case("ev_ne_e", "sdpfa_fwd", _sdpa_fwd((2, 3, 5, 8), 7, 4)),
    Case("mask", "sdpfa_fwd", _sdpa_fwd((2, 3, 5, 8), 7, 8, with_mask=True)),
    Case("bhsd", "sdpfa_bwd", _sdpa_bwd((2, 3, 5, 8))),
    Case("bshd_bf16", "sdpfa_bwd", _sdpa_bwd((2, 3, 6, 16), torch.bfloat16, bshd=True, is_causal=True)),
    Case("2d", "embedding_fwd", _embedding((3, 4), 10, 6)),
    # (sorted=False and k=1 stay on ATen; a sorted top-k of 2 to 16 runs in a generated kernel)
    Case("last_dim", "topk", _unary("topk", (4, 6), 3, dim=-1, largest=True, sorted=False)),
    Case("first_dim", "topk", _unary("topk", (4, 6), 1, dim=0, largest=False, sorted=True)),
    # (1-D: an argsort over a small dim of a larger tensor is a generated kernel, tests/test_codegen_argsort.py)
    Case("1d", "argsort", _unary("argsort", (24,), 0)),
    Case("1d_desc", "argsort", _unary("argsort", (24,), -1, descending=True)),
    Case("2d", "slice", _unary("slice", (4, 6), [1, 2], [3, 5])),
    Case("2d", "expand", _unary("expand", (4, 1), [4, 6])),
    Case("3d", "permute", _unary("permute", (2, 3, 4), [2, 0, 1])),
    Case("2d", "broadcast_in_dim", _unary("broadcast_in_dim", (4, 6), [2, 4, 6], [1, 2])),
    Case("2d", "broadcast", _unary("broadcast", (4, 6), [False, True, False])),
    Case("split", "reshape", _unary("reshape", (4, 6), [2, 2, 6])),
    Case("flatten", "reshape", _unary("reshape", (2, 3, 4), [6, 4])),
    Case("middle", "squeeze", _unary("squeeze", (4, 1, 6), [1])),
    Case("dim0", "select", _unary("select", (4, 6), 2, 0)),
    Case("dim1", "select", _unary("select", (4, 6), -1, 1)),
    Case("rows", "grouped_mm", _grouped_mm("rows")),
    Case("rows_n20", "grouped_mm", _grouped_mm("rows_n20")),
    Case("cols", "grouped_mm", _grouped_mm("cols")),
    Case("k", "grouped_mm", _grouped_mm("k")),
    Case("upstream", "cutlass_nvfp4_grouped_mm", _nvfp4_gemm),
    Case("fp8", "scaled_mm", _scaled_mm("fp8")),
    Case("nvfp4", "scaled_mm", _scaled_mm("nvfp4")),
]


def _maker_for(layout: str):
    mk = maker(layout)
    mk.layout = layout
    return mk


def _run_case(case: Case, layout: str):
    inputs, define = case.setup(_maker_for(layout))
    with FusionDefinition() as fd:
        vals = [fd.from_pytorch(t) for t in inputs]
        outs = define(fd, *vals)
        for o in outs:
            fd.add_output(o)
    real = fd.execute(inputs)
    return fd, outs, real


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c.op}-{c.id}" for c in CASES])
def test_meta_layout_matches_real(case: Case, layout: str):
    if case.op not in all_ops():
        pytest.skip(f"fd.ops.{case.op} is not registered (yet)")
    fd, outs, real = _run_case(case, layout)
    runtime = fd.last_runtime()
    # The premise: the op runs in an ExprEval segment (ATen decides its layouts).
    seg = next(s for s in runtime.segments if any(e.op.name == case.op for e in s.exprs))
    assert seg.kind is SchedulerKind.EXPR_EVAL, f"fd.ops.{case.op} ran in a {seg.kind.value} segment"
    assert len(real) == len(outs)
    for i, (tv, t) in enumerate(zip(outs, real)):
        inferred = runtime.layout(tv)
        assert inferred.sizes == tuple(t.shape), f"output {i}: meta sizes {inferred.sizes} != real {tuple(t.shape)}"
        assert inferred.strides == tuple(t.stride()), (
            f"output {i} of fd.ops.{case.op} (shape {tuple(t.shape)}): meta strides {inferred.strides} != real "
            f"strides {tuple(t.stride())}"
        )


_OVERRIDDEN = [c for c in CASES if (c.op, c.id) in {("matmul", "dot"), ("sdpfa_fwd", "bshd"), ("sdpfa_bwd", "bshd_bf16")}]


@pytest.mark.parametrize("case", _OVERRIDDEN, ids=[f"{c.op}-{c.id}" for c in _OVERRIDDEN])
def test_meta_override_is_used_on_meta_tensors(case: Case):
    """Calling the op directly (OpDef.run) on meta twins of the inputs picks the meta override and gives the real
    sizes, strides and dtypes."""
    if case.op not in all_ops():
        pytest.skip(f"fd.ops.{case.op} is not registered (yet)")
    from pyfuser.runtime.evaluator import bind_inputs, resolve
    from pyfuser.runtime.meta_inference import to_meta

    fd, outs, real = _run_case(case, "row_major")
    expr = outs[0].defined_by
    inputs, _ = case.setup(_maker_for("row_major"))
    env = bind_inputs(fd.fusion, [to_meta(t) for t in inputs])
    result = expr.op.run(expr, resolve(expr.args, env), resolve(expr.kwargs, env))
    result = result if isinstance(result, tuple) else (result,)
    for m, t in zip(result, real):
        assert m.device.type == "meta"
        assert (tuple(m.shape), m.stride(), m.dtype) == (tuple(t.shape), t.stride(), t.dtype)


def test_every_expr_eval_op_has_a_case():
    """Every registered ATEN op (always ExprEval) and VIEW op (ExprEval when it makes an output alias) needs a case
    above, so the meta contract is checked for it."""
    ops = all_ops()
    covered = {id(ops[c.op]) for c in CASES if c.op in ops}
    missing = sorted(
        name for name, opdef in ops.items() if opdef.kind in (OpKind.ATEN, OpKind.VIEW) and id(opdef) not in covered
    )
    assert not missing, f"add meta-vs-real cases to tests/test_meta_vs_real.py for: {missing}"


def test_sdpa_bshd_layout_is_inferred_not_aten_meta():
    """Why sdpfa_fwd needs its override: ATen's meta of F.scaled_dot_product_attention runs the math path and
    returns contiguous BHSD, while the fused kernels' result follows q. For q, k, v made as [B,S,H,E] and
    transposed, both the real output and the inferred layout must have q's memory order."""
    case = next(c for c in CASES if c.op == "sdpfa_fwd" and c.id == "bshd")
    fd, outs, real = _run_case(case, "row_major")
    b, h, s, e = real[0].shape
    expected = (s * h * e, e, h * e, 1)
    assert real[0].stride() == expected
    assert fd.last_runtime().layout(outs[0]).strides == expected
    assert real[1].is_contiguous() and fd.last_runtime().layout(outs[1]).strides == (h * s, s, 1)
