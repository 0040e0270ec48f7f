"""Row divisions whose quotient is only rounded to bf16 (a bf16 softmax's e / sum): on the GPU the generated kernel
multiplies by the row's reciprocal and takes IEEE division only near a bf16 rounding midpoint
(``_div_for_bf16`` in the kernel prelude). The bf16 results must be eager's bit for bit: the GPU test compares
them with IEEE division over every fp32 dividend for each of a set of divisors (special, subnormal, huge and
random ones). Without a GPU, the planned kernel is checked to take that form where it applies (and only there)
and to compile for sm_90; the interpreter cannot run PTX and keeps IEEE division.
"""

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen import kernel_builder, plan
from pyfuser.runtime import plan as runtime_plan
from pyfuser.codegen.kernel_builder import COMPILE_OPTIONS, prelude
from harness import DEVICE, load_source_module, make
from sm90 import compile_ptx, gpu_plans, kernel_spec

triton = pytest.importorskip("triton")


def _softmax(fd, x, out_dtype=DataType.BFloat16, store_quotient=False):
    t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
    e = fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, dims=[1], keepdim=True)))
    q = fd.ops.div(e, fd.ops.sum(e, dims=[1], keepdim=True))
    fd.add_output(fd.ops.cast(q, out_dtype))
    if store_quotient:
        fd.add_output(q)


def _gpu_plan(monkeypatch, x, **kw):
    """The kernel plan the GPU would run (planned on this machine as if it were not interpreting)."""
    with FusionDefinition() as fd:
        _softmax(fd, x, **kw)
    return gpu_plans(monkeypatch, fd, [x])[-1]


@pytest.mark.parametrize("cols", [1024, 5000])  # persistent, and rows in tiles
def test_bf16_softmax_quotient_takes_the_reciprocal_form_and_compiles_for_sm90(monkeypatch, cols):
    p = _gpu_plan(monkeypatch, make((4, cols), torch.bfloat16))
    assert "_div_for_bf16(v" in p.source and "_bf16_div_reciprocal(v" in p.source
    (ptx,) = compile_ptx([kernel_spec(p, specialized=True)])
    assert "div.rn.f32" in ptx and "mul.rn.f32" in ptx


@pytest.mark.parametrize("kw", [dict(out_dtype=DataType.Float), dict(out_dtype=DataType.Half),
                                dict(store_quotient=True)], ids=["fp32 output", "fp16 output", "quotient stored"])
def test_quotients_seen_in_fp32_or_fp16_keep_ieee_division(monkeypatch, kw):
    p = _gpu_plan(monkeypatch, make((4, 1024), torch.bfloat16), **kw)
    assert "_div_for_bf16(v" not in p.source and "libdevice.div_rn(v" in p.source


def test_interpreter_keeps_ieee_division():
    x = make((4, 1024), torch.bfloat16)
    with FusionDefinition() as fd:
        _softmax(fd, x)
    fd.execute([x])
    source = fd.last_execution()[0].kernel_source
    assert ("_div_for_bf16(v" in source) == (DEVICE.type == "cuda")


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_bf16_softmax_with_special_rows_has_eagers_bits(layout):
    x = make((12, 1000), torch.bfloat16) * 30
    if layout == "transposed":  # column-major rows: the kernel reads stride-12 elements along a row
        x = x.t().contiguous().t()
    x[0, 5] = float("nan")
    x[1, :] = float("-inf")
    x[2, 7] = float("inf")
    x[3, :] = 0.0
    x[4, :] = -0.0
    x[5, ::2] = float("-inf")
    x[6, 3] = 3e38
    x[7, :] = torch.linspace(-100, 100, 1000)
    with FusionDefinition() as fd:
        _softmax(fd, x)
    (out,) = fd.execute([x])
    t = x.float()
    e = torch.exp(t - t.amax(1, keepdim=True))
    ref = (e / e.sum(1, keepdim=True)).bfloat16()
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.stride() == ref.stride()
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))


_KERNEL = '''
import triton
import triton.language as tl
from triton.language.extra import libdevice
''' + prelude() + '''

@triton.jit
def count_mismatches(b_ptr, count_ptr, start, BLOCK: tl.constexpr):
    # dividends: BLOCK consecutive fp32 bit patterns from start; divisor: one per program_id(1)
    bits = start + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)[None, :]
    a = bits.to(tl.int32).to(tl.float32, bitcast=True)
    b = tl.load(b_ptr + tl.program_id(1) + tl.zeros([1, 1], tl.int32))
    ours = _div_for_bf16(a, _bf16_div_reciprocal(b), b).to(tl.bfloat16).to(tl.int16, bitcast=True)
    ieee = libdevice.div_rn(a, b).to(tl.bfloat16).to(tl.int16, bitcast=True)
    tl.atomic_add(count_ptr + tl.program_id(1), tl.sum((ours != ieee).to(tl.int32)))
'''


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_quotients_equal_ieee_division_for_every_fp32_dividend(tmp_path):
    mod = load_source_module(_KERNEL, tmp_path, "bf16_division_kernel")
    g = torch.Generator().manual_seed(0)
    special = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0, 3.0, 7.0, 1 / 3, 0.1, 4096.5,
               65535.9, -3.7, 1e-40, -1e-45, 1.1754943508222875e-38, 2.0 ** -126 * 1.5, 2.0 ** 125, 2.0 ** 126,
               2.0 ** 127, 3.4028234663852886e38, 8191.0, 1024.000122]
    log_uniform = torch.exp2(torch.rand(32, generator=g) * 250 - 125) * torch.randint(0, 2, (32,), generator=g).mul(2).sub(1)
    random_bits = torch.randint(-(2 ** 31), 2 ** 31, (16,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    divisors = torch.cat([torch.tensor(special), log_uniform, random_bits]).float().cuda()
    counts = torch.zeros(len(divisors), dtype=torch.int32, device="cuda")
    block, chunk = 4096, 1 << 30
    for start in range(-(1 << 31), 1 << 31, chunk):
        mod.count_mismatches[(chunk // block, len(divisors))](divisors, counts, start, BLOCK=block, num_warps=4,
                                                              **COMPILE_OPTIONS)
    bad = counts.nonzero().flatten().tolist()
    assert not bad, [(float(divisors[i]), int(counts[i])) for i in bad]


def test_load_prologue_keeps_ieee_division(monkeypatch):
    """A bf16 quotient by a per-row value computed as a load prologue of the grouped quantize runs inside the
    hand-written kernel, whose tiles the plan does not know: it keeps IEEE division there."""
    from pyfuser.codegen import plan as codegen_plan

    prologue_sources = []
    real = codegen_plan.plan_kernel

    def capture(*a, **k):
        p = real(*a, **k)
        if k.get("prologue_of") is not None or len(a) > 3 and a[3] is not None:
            prologue_sources.append(p.source)
        return p

    monkeypatch.setattr(codegen_plan, "plan_kernel", capture)
    monkeypatch.setattr("pyfuser.codegen.prologue.plan_kernel", capture)
    monkeypatch.setattr(kernel_builder, "interpreting", lambda: False)
    x = make((16, 64), torch.bfloat16)
    s = make((16, 1), torch.bfloat16).abs() + 1
    starts = torch.tensor([0, 6, 6], dtype=torch.int32, device=DEVICE)
    sf_starts = torch.tensor([0, 128, 256], dtype=torch.int32, device=DEVICE)
    with FusionDefinition() as fd:
        tx, ts = fd.from_pytorch(x), fd.from_pytorch(s)
        q = fd.ops.div(fd.ops.cast(tx, DataType.Float), fd.ops.cast(ts, DataType.Float))
        packed, scales = fd.ops.nv_grouped_block_quantize(fd.ops.cast(q, DataType.BFloat16),
                                                          fd.from_pytorch(starts), fd.from_pytorch(sf_starts))
        fd.add_output(packed)
        fd.add_output(scales)
    try:
        fd.execute([x, s, starts, sf_starts])
    except Exception:
        if DEVICE.type == "cuda":
            raise
    assert prologue_sources, "the quotient was not planned as a load prologue"
    assert all("_div_for_bf16(v" not in src and "libdevice.div_rn(v" in src for src in prologue_sources)


def test_embedded_plans_keep_ieee_division(monkeypatch):
    """A plan whose code runs inside a hand-written kernel with warps of its own (a counting sort's epilogue:
    plan_kernel(..., embedded=True)) keeps IEEE division; the same segment planned alone takes the bf16 form."""
    calls = []
    real = runtime_plan.plan_kernel

    def capture(*a, **k):
        calls.append((a, k))
        return real(*a, **k)

    monkeypatch.setattr(runtime_plan, "plan_kernel", capture)
    monkeypatch.setattr(kernel_builder, "interpreting", lambda: False)
    x = make((4, 1024), torch.bfloat16)
    with FusionDefinition() as fd:
        _softmax(fd, x)
    try:
        fd.execute([x])
    except Exception:
        if DEVICE.type == "cuda":
            raise
    (args, kwargs), = calls
    assert "_div_for_bf16(v" in plan.plan_kernel(*args, **kwargs).source
    assert "_div_for_bf16(v" not in plan.plan_kernel(*args, **kwargs, embedded=True).source
