"""The generated kernels' float tanh on the GPU: the prelude's branch-free copy of libdevice's tanhf.

libdevice branches between a polynomial (|x| < 0.6) and an exp-based form; a warp whose inputs straddle 0.6 runs
both and the branching. ``_tanh_f32`` computes both and selects, with libdevice's own instructions, so its bits
must be libdevice's on every input: the GPU test compares all 2^32 of them. Without a GPU the kernel is compiled
for sm_90 to check that it has no branch left; the interpreter keeps libdevice.tanh (it cannot run PTX).
"""

import pytest
import torch

from pyfuser.codegen import elementwise_lowerings
from pyfuser.codegen.kernel_builder import COMPILE_OPTIONS, prelude
from harness import load_source_module
from sm90 import compile_ptx

triton = pytest.importorskip("triton")

_KERNELS = '''
import triton
import triton.language as tl
from triton.language.extra import libdevice
''' + prelude() + '''

@triton.jit
def branch_free(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, _tanh_f32(x), mask=i < n)


@triton.jit
def libdevice_tanh(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, libdevice.tanh(x), mask=i < n)
'''


def test_float_tanh_lowers_to_the_branch_free_copy_on_the_gpu_only(monkeypatch):
    monkeypatch.setattr(elementwise_lowerings, "interpreting", lambda: False)
    assert elementwise_lowerings._tanh_template(torch.float32) == "_tanh_f32({0})"
    assert elementwise_lowerings._tanh_template(torch.float64) == "libdevice.tanh({0})"
    monkeypatch.setattr(elementwise_lowerings, "interpreting", lambda: True)
    assert elementwise_lowerings._tanh_template(torch.float32) == "libdevice.tanh({0})"


def _spec(name):
    return {"name": name, "source": _KERNELS, "signature": {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32",
                                                             "BLOCK": "constexpr"},
            "constexprs": {"BLOCK": 1024}, "options": {"num_warps": 4, **COMPILE_OPTIONS}}


def _body(ptx: str) -> list[str]:
    return [ln.split()[0] for ln in ptx.splitlines() if ln.startswith("\t") and not ln.strip().startswith(("//", "."))]


def test_branch_free_tanh_compiles_for_sm90_without_branches():
    ours, theirs = compile_ptx([_spec("branch_free"), _spec("libdevice_tanh")])
    assert any(op.startswith("bra") for op in _body(theirs)), "libdevice's tanhf no longer branches: drop the copy"
    assert not any(op.startswith("bra") for op in _body(ours))
    for op in ("ex2.approx.ftz.f32", "rcp.approx.ftz.f32", "fma.rn.f32"):  # libdevice's own instructions
        assert op in ours and op in theirs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_branch_free_tanh_has_libdevices_bits_on_all_2_to_the_32_inputs(tmp_path):
    mod = load_source_module(_KERNELS, tmp_path, "tanh_kernels")
    chunk = 1 << 28
    x = torch.empty(chunk, dtype=torch.int32, device="cuda")
    ours, theirs = torch.empty_like(x), torch.empty_like(x)
    for start in range(-(1 << 31), 1 << 31, chunk):
        x.copy_(torch.arange(start, start + chunk, dtype=torch.int64, device="cuda"))
        xf = x.view(torch.float32)
        grid = (triton.cdiv(chunk, 1024),)
        mod.branch_free[grid](xf, ours.view(torch.float32), chunk, BLOCK=1024, **COMPILE_OPTIONS)
        mod.libdevice_tanh[grid](xf, theirs.view(torch.float32), chunk, BLOCK=1024, **COMPILE_OPTIONS)
        diff = ours != theirs
        if diff.any():
            i = int(diff.nonzero()[0])
            pytest.fail(f"tanh of bits {int(x[i]):#x}: {int(ours[i]):#x}, libdevice {int(theirs[i]):#x} "
                        f"({int(diff.sum())} of this chunk's {chunk} differ)")
