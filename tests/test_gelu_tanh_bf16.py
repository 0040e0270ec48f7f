"""A tanh-GELU whose result is only rounded to bf16: on the GPU its tail ``h * (tanh(z) + 1)`` takes tanh's exp form
and libdevice's polynomial only near a bf16 rounding midpoint (``codegen/gelu_tanh_bf16.py``). The bf16 results
must be eager's bit for bit. The GPU tests prove the premise of the error bound (the fast ``1 + tanh(z)`` equals
libdevice's for |z| >= 0.6 and is within ``U_ABS_ERROR`` of it below, over every fp32 z) and compare the bf16
results with the exact form over every fp32 z for a set of h. Without a GPU: which fusions take the form (and
which keep the exact one), and that the kernel compiles for sm_90 within its register cap, without spilling.
"""

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen import gelu_tanh_bf16
from pyfuser.codegen.kernel_builder import COMPILE_OPTIONS, prelude
from harness import DEVICE, load_source_module, make
from sm90 import compile_cubin, compile_ptx, gpu_plans, kernel_spec, resource_usage

triton = pytest.importorskip("triton")
MARK = gelu_tanh_bf16.TEMPLATE.split("(")[0]  # (also the prefix of the half form's name)
HALF = gelu_tanh_bf16.TEMPLATE_HALF.split("(")[0] + "("


@pytest.fixture(autouse=True)
def gelu_tail(monkeypatch):
    """The form under test (plan.TUNING["bf16_gelu_tail"], on by default; set here so each test says so)."""
    from pyfuser.codegen import plan

    monkeypatch.setitem(plan.TUNING, "bf16_gelu_tail", True)


def _gelu(fd, x, out_dtype=DataType.BFloat16, order="tanh+1", store=None):
    """0.5 * y * (1 + tanh(sqrt(2/pi) * (y + 0.044715 y^3))) with y = float(x), written in ``order``."""
    y = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
    inner = fd.ops.mul(fd.ops.add(y, fd.ops.mul(fd.ops.mul(fd.ops.mul(y, y), y), 0.044715)), 0.7978845608028654)
    t = fd.ops.tanh(inner)
    u = fd.ops.add(t, 1.0) if order == "tanh+1" else fd.ops.add(1.0, t)
    h = fd.ops.mul(y, 0.5)
    g = fd.ops.mul(h, u) if order == "tanh+1" else fd.ops.mul(u, h)
    fd.add_output(fd.ops.cast(g, out_dtype))
    if store is not None:
        fd.add_output({"tanh": t, "sum": u, "product": g}[store])


def _eager(x, order="tanh+1"):
    y = x.float()
    t = torch.tanh((y + y * y * y * 0.044715) * 0.7978845608028654)
    u = t + 1.0 if order == "tanh+1" else 1.0 + t
    return ((y * 0.5) * u if order == "tanh+1" else u * (y * 0.5)).bfloat16()


def _body(source: str) -> str:
    """The generated kernel itself, without the prelude (which defines every helper)."""
    return source[source.index("\ndef pf_"):]


def _gpu_source(monkeypatch, x, **kw) -> str:
    with FusionDefinition() as fd:
        _gelu(fd, x, **kw)
    return _body(gpu_plans(monkeypatch, fd, [x])[-1].source)


@pytest.mark.parametrize("order", ["tanh+1", "1+tanh"])
def test_bf16_gelu_tail_takes_the_fast_form_and_compiles_for_sm90(monkeypatch, order):
    x = make((8, 1024), torch.bfloat16)
    with FusionDefinition() as fd:
        _gelu(fd, x, order=order)
    (p,) = gpu_plans(monkeypatch, fd, [x])
    # h = 0.5 * y: the half form, from y (the multiply by 0.5 goes)
    assert HALF in _body(p.source) and "_tanh_f32(" not in _body(p.source)
    (ptx,) = compile_ptx([kernel_spec(p, specialized=True)])
    assert "ex2.approx.ftz.f32" in ptx and "mad.lo.u32" in ptx
    assert "fma.rn.f32 t, t, 0f3F000000, 0f3F000000;" in ptx and "0f3F000000;\n\tmul" not in ptx


@pytest.mark.parametrize("case, half", [
    ("tanh(y), h = 0.5 y", True),
    ("tanh(y * y - 3 y), h = 0.5 y", True),
    ("tanh(y), h = 0.25 y", False),  # h is not half of a value
    ("tanh(y + 1), h = 0.5 y", False),  # a constant term: a subnormal y need not give u = 1
    ("tanh(1e30 y), h = 0.5 y", False),  # a coefficient too large for that
    ("tanh(w), h = 0.5 y", False),  # z not a function of y
])
def test_the_half_form_is_taken_only_where_a_subnormal_y_gives_u_1(monkeypatch, case, half):
    x, w = make((8, 1024), torch.bfloat16), make((8, 1024), torch.bfloat16)
    with FusionDefinition() as fd:
        y = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        other = fd.ops.cast(fd.from_pytorch(w), DataType.Float)
        z = {"tanh(y), h = 0.5 y": y, "tanh(y), h = 0.25 y": y, "tanh(y + 1), h = 0.5 y": fd.ops.add(y, 1.0),
             "tanh(y * y - 3 y), h = 0.5 y": fd.ops.sub(fd.ops.mul(y, y), fd.ops.mul(y, 3.0)),
             "tanh(1e30 y), h = 0.5 y": fd.ops.mul(y, 1e30), "tanh(w), h = 0.5 y": other}[case]
        u = fd.ops.add(fd.ops.tanh(z), 1.0)
        h = fd.ops.mul(y, 0.25 if "0.25" in case else 0.5)
        fd.add_output(fd.ops.cast(fd.ops.mul(h, u), DataType.BFloat16))
    src = _body(gpu_plans(monkeypatch, fd, [x, w])[-1].source)
    assert (HALF in src) == half and (MARK + "(" in src) == (not half)


def _resource_usage(p) -> dict:
    """ptxas's registers and stack bytes of a plan's sm_90 kernel."""
    (cubin,) = compile_cubin([kernel_spec(p, specialized=True)])
    return resource_usage(cubin)


def test_the_tail_kernel_is_capped_at_its_register_budget_without_spilling(monkeypatch):
    from pyfuser.codegen import plan

    cap = plan.TUNING["bf16_gelu_tail_max_registers"]
    assert cap is not None
    x = make((64, 4096), torch.bfloat16)
    with FusionDefinition() as fd:
        _gelu(fd, x)
    (p,) = gpu_plans(monkeypatch, fd, [x])
    assert p.max_registers == cap and p.compile_options()["maxnreg"] == cap
    usage = _resource_usage(p)
    assert usage["REG"] <= cap and usage["STACK"] == 0, usage
    monkeypatch.setitem(plan.TUNING, "bf16_gelu_tail_max_registers", None)  # uncapped, it takes more
    with FusionDefinition() as fd:
        _gelu(fd, x)
    (p,) = gpu_plans(monkeypatch, fd, [x])
    assert p.max_registers is None and "maxnreg" not in p.compile_options()
    assert _resource_usage(p)["REG"] > cap


def test_the_half_form_analysis_scales_each_shared_term_once(monkeypatch):
    # z = y^(2^40) by repeated squaring: a DAG of 40 nodes whose tree has 2^40 leaves. The analysis of whether z
    # vanishes with y must visit each node once (it would not finish otherwise), and it may take the half form.
    x = make((8, 1024), torch.bfloat16)
    with FusionDefinition() as fd:
        y = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        z = y
        for _ in range(40):
            z = fd.ops.mul(z, z)
        u = fd.ops.add(fd.ops.tanh(z), 1.0)
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.mul(y, 0.5), u), DataType.BFloat16))
    src = _body(gpu_plans(monkeypatch, fd, [x])[-1].source)
    assert HALF in src


def test_the_window_is_the_measured_one_on_sm90_and_the_documented_one_elsewhere():
    assert gelu_tanh_bf16.window(gelu_tanh_bf16.U_ABS_ERROR) == gelu_tanh_bf16.WINDOW == 37
    assert gelu_tanh_bf16.device_bound((9, 0)) == 2.0 ** -22 and gelu_tanh_bf16.window(2.0 ** -22) == 11
    for other in ((8, 0), (8, 9), (10, 0), (12, 0)):
        assert gelu_tanh_bf16.device_bound(other) == gelu_tanh_bf16.U_ABS_ERROR
    # the midpoint test's two immediates: low 16 bits of g shifted up, plus 0x8000 + w; slow where <= 2w
    for w, add, limit in ((37, "0x80250000", "0x4a0000"), (11, "0x800b0000", "0x160000")):
        text = gelu_tanh_bf16.prelude(w)
        assert text.count(f"mad.lo.u32 b, b, 65536, {add};") == 8 and text.count(f"u32 slow, b, {limit}") == 8
    if not torch.cuda.is_available():
        assert gelu_tanh_bf16.device_bound() == gelu_tanh_bf16.U_ABS_ERROR and gelu_tanh_bf16.prelude(37) in prelude()


def test_a_process_with_an_unmeasured_gpu_beside_an_sm90_one_takes_the_documented_window(monkeypatch):
    caps = {0: (9, 0), 1: (8, 0)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: caps[d])
    assert gelu_tanh_bf16.device_bound() == gelu_tanh_bf16.U_ABS_ERROR
    caps[1] = (9, 0)
    assert gelu_tanh_bf16.device_bound() == 2.0 ** -22


@pytest.mark.parametrize("kw", [dict(out_dtype=DataType.Float), dict(out_dtype=DataType.Half), dict(store="tanh"),
                                dict(store="sum"), dict(store="product")],
                         ids=["fp32 output", "fp16 output", "tanh stored", "sum stored", "product stored"])
def test_gelu_tails_seen_beyond_bf16_keep_the_exact_tanh(monkeypatch, kw):
    src = _gpu_source(monkeypatch, make((8, 1024), torch.bfloat16), **kw)
    assert MARK not in src and "_tanh_f32(v" in src


def test_the_tuning_switch_turns_it_off(monkeypatch):
    from pyfuser.codegen import plan

    monkeypatch.setitem(plan.TUNING, "bf16_gelu_tail", False)
    x = make((8, 1024), torch.bfloat16)
    with FusionDefinition() as fd:
        _gelu(fd, x)
    (p,) = gpu_plans(monkeypatch, fd, [x])
    assert MARK not in _body(p.source) and "_tanh_f32(v" in _body(p.source)
    assert p.max_registers is None  # the exact kernel keeps ptxas's own choice


def test_a_tail_other_than_one_plus_tanh_keeps_the_exact_tanh(monkeypatch):
    x = make((8, 1024), torch.bfloat16)
    with FusionDefinition() as fd:  # h * (tanh(z) + 2): the bound assumes 1 + tanh
        y = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        fd.add_output(fd.ops.cast(fd.ops.mul(y, fd.ops.add(fd.ops.tanh(y), 2.0)), DataType.BFloat16))
    src = _body(gpu_plans(monkeypatch, fd, [x])[-1].source)
    assert MARK not in src and "_tanh_f32(v" in src


def test_interpreter_keeps_the_exact_tanh():
    x = make((8, 1024), torch.bfloat16)
    with FusionDefinition() as fd:
        _gelu(fd, x)
    fd.execute([x])
    assert (MARK in _body(fd.last_execution()[0].kernel_source)) == (DEVICE.type == "cuda")


@pytest.mark.parametrize("order", ["tanh+1", "1+tanh"])
@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
def test_bf16_gelu_with_special_values_has_eagers_bits(order, layout):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 1027, generator=g) * 3).bfloat16().to(DEVICE)
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x.view(-1)[: bits.numel()] = bits.to(DEVICE)  # every bf16 value: NaNs, infinities, zeros, subnormals
    x[1, :8] = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 3e38, -3e38, 1e-40])
    if layout == "sliced":
        x = x[:, 1:1025]
    with FusionDefinition() as fd:
        _gelu(fd, x, order=order)
    (out,) = fd.execute([x])
    ref = _eager(x, order)
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.stride() == ref.stride()
    if DEVICE.type == "cuda":
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
    else:  # the interpreter's tanh and eager's CPU tanh differ: a bf16 ulp (or 2^-24 near -1) apart at times
        torch.testing.assert_close(out.float(), ref.float(), atol=2 ** -20, rtol=2 ** -7, equal_nan=True)


# --- GPU: the premise of the bound, and the bf16 results over every fp32 z ---------------------------------

_KERNELS = '''
import triton
import triton.language as tl
from triton.language.extra import libdevice
''' + prelude() + '''

@triton.jit
def fast_u(out_ptr, start, BLOCK: tl.constexpr):
    # 1 + tanh(z) by the fast path alone (h = 1), for BLOCK consecutive fp32 bit patterns z from start
    bits = start + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    z = bits.to(tl.int32).to(tl.float32, bitcast=True)
    one = tl.full([BLOCK], 1.0, tl.float32)
    u = tl.inline_asm_elementwise("""''' + gelu_tanh_bf16.ptx_block(exact_path=False) + '''""",
                                  "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [z, one], dtype=tl.float32, is_pure=True, pack=4)
    tl.store(out_ptr + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK), u)


@triton.jit
def exact_u(out_ptr, start, BLOCK: tl.constexpr):
    bits = start + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    z = bits.to(tl.int32).to(tl.float32, bitcast=True)
    tl.store(out_ptr + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK), libdevice.tanh(z) + 1.0)


@triton.jit
def count_mismatches(v_ptr, count_ptr, start, BLOCK: tl.constexpr, HALF: tl.constexpr):
    # z: BLOCK consecutive fp32 bit patterns from start; one value per program_id(1): h, or with HALF y, the half
    # form against the exact form of h = RN(0.5 y), over the pairs the form is taken for (a subnormal y only with
    # |z| < 2^-40: kernel_builder._halved)
    bits = start + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)[None, :]
    z = bits.to(tl.int32).to(tl.float32, bitcast=True)
    v = tl.load(v_ptr + tl.program_id(1) + tl.zeros([1, 1], tl.int32))
    if HALF:
        ours = _gelu_tanh_tail_bf16_half(z, v)
        h = v * 0.5
        taken = (tl.abs(v) >= 1.1754943508222875e-38) | (v == 0) | (v != v) | (tl.abs(z) < 9.094947017729282e-13)
    else:
        ours = _gelu_tanh_tail_bf16(z, v)
        h = v
        taken = tl.full([1, BLOCK], 1, tl.int1)
    exact = (h * (libdevice.tanh(z) + 1.0)).to(tl.bfloat16).to(tl.int16, bitcast=True)
    bad = (ours.to(tl.bfloat16).to(tl.int16, bitcast=True) != exact) & taken
    tl.atomic_add(count_ptr + tl.program_id(1), tl.sum(bad.to(tl.int32)))
'''

_CHUNK = 1 << 28
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_gpu
def test_fast_one_plus_tanh_is_exact_from_0_6_and_within_the_bound_below(tmp_path):
    mod = load_source_module(_KERNELS, tmp_path, "gelu_tail_kernels")
    fast = torch.empty(_CHUNK, dtype=torch.float32, device="cuda")
    exact = torch.empty_like(fast)
    worst, block = 0.0, 1024
    for start in range(-(1 << 31), 1 << 31, _CHUNK):
        grid = (_CHUNK // block,)
        mod.fast_u[grid](fast, start, BLOCK=block, num_warps=4, **COMPILE_OPTIONS)
        mod.exact_u[grid](exact, start, BLOCK=block, num_warps=4, **COMPILE_OPTIONS)
        z = torch.arange(start, start + _CHUNK, dtype=torch.int64, device="cuda").to(torch.int32).view(torch.float32)
        small = z.abs() < 0.6  # (NaN z: False, and compared bit for bit below)
        same = fast.view(torch.int32) == exact.view(torch.int32)
        bad = ~small & ~same
        if bad.any():
            i = int(bad.nonzero()[0])
            pytest.fail(f"z bits {int(z.view(torch.int32)[i]):#x}: fast 1 + tanh {float(fast[i])!r}, exact "
                        f"{float(exact[i])!r}: the exp form is not libdevice's at |z| >= 0.6")
        if small.any():
            worst = max(worst, float((fast[small].double() - exact[small].double()).abs().max()))
    bound = gelu_tanh_bf16.device_bound()  # (this device's window rests on it: the measured bound of its architecture)
    print(f"max |fast - exact| of 1 + tanh(z) over |z| < 0.6: {worst!r} = 2^{torch.tensor(worst).log2().item():.2f}"
          f" (bound 2^{torch.tensor(bound).log2().item():.2f})")
    assert worst <= bound


@needs_gpu
def test_bf16_gelu_tails_equal_the_exact_form_for_every_fp32_z(tmp_path):
    mod = load_source_module(_KERNELS, tmp_path, "gelu_tail_kernels")
    g = torch.Generator().manual_seed(0)
    special = [1.0, -1.0, 0.5, -0.5, 3.0, 0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-30, -1e-40,
               1.401298464324817e-45, -4.203895392974451e-45, 2.0 ** -125 + 2.0 ** -148,
               1.1754943508222875e-38, 2.0 ** 126, 1.7e38, -3.4028234663852886e38, 65504.0, 0.3183, -7.25]
    log_uniform = torch.exp2(torch.rand(12, generator=g) * 250 - 125) * torch.randint(0, 2, (12,), generator=g).mul(2).sub(1)
    hs = torch.cat([torch.tensor(special), log_uniform]).float().cuda()
    for half in (False, True):  # (the half form takes them as y)
        counts = torch.zeros(len(hs), dtype=torch.int32, device="cuda")
        block, chunk = 4096, 1 << 30
        for start in range(-(1 << 31), 1 << 31, chunk):
            mod.count_mismatches[(chunk // block, len(hs))](hs, counts, start, BLOCK=block, HALF=half, num_warps=4,
                                                            **COMPILE_OPTIONS)
        bad = counts.nonzero().flatten().tolist()
        assert not bad, ("half form" if half else "plain form", [(float(hs[i]), int(counts[i])) for i in bad])
