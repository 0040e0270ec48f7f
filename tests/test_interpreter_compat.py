"""pyfuser.codegen.interpreter_compat: the CPU path runs for users without any test set-up, and the patches
exist only under the interpreter. Each check runs in a fresh Python process (TRITON_INTERPRET is read when
triton and pyfuser are imported), without the tests' conftest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, interpret: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", code], cwd=str(ROOT / "docs"), env=env, capture_output=True,
                          text=True, timeout=300)


def test_readme_usage_runs_under_the_interpreter():
    """The README's usage example (sigmoid: a libdevice call, and bf16 casts) as a user runs it on CPU."""
    readme = (ROOT / "README.md").read_text()
    usage = readme.split("## Usage", 1)[1]
    code = re.search(r"```python\n(.*?)```", usage, re.S).group(1)
    code += (
        "\nfrom pyfuser.codegen.launcher import triton_usable\n"
        "assert triton_usable(x.device), 'kernels must run under the interpreter'\n"
        "rt = fd.last_runtime()\n"
        "assert all(rt.kernel_step(s.index) is not None for s in rt.segments if s.kind.value != 'ExprEval')\n"
        "ref = (torch.sigmoid(x.float()) * x.float()).bfloat16()\n"
        "torch.testing.assert_close(out, ref, atol=0, rtol=0)\n"
        "print('README-OK')\n")
    r = _run(code, interpret=True)
    assert r.returncode == 0 and "README-OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def test_install_does_nothing_without_the_interpreter():
    code = (
        "import triton.runtime.interpreter as interp\n"
        "from triton.language.extra import libdevice\n"
        "before = (interp._convert_float, interp.InterpreterBuilder.cast_impl, libdevice.exp)\n"
        "import pyfuser, pyfuser.codegen\n"
        "from pyfuser.codegen import interpreter_compat\n"
        "interpreter_compat.install()\n"
        "after = (interp._convert_float, interp.InterpreterBuilder.cast_impl, libdevice.exp)\n"
        "assert before == after, 'patched without TRITON_INTERPRET=1'\n"
        "print('UNPATCHED-OK')\n")
    r = _run(code, interpret=False)
    assert r.returncode == 0 and "UNPATCHED-OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def test_install_patches_once_under_the_interpreter():
    code = (
        "import pyfuser.codegen\n"
        "from triton.language.extra import libdevice\n"
        "from pyfuser.codegen import interpreter_compat\n"
        "first = libdevice.exp\n"
        "interpreter_compat.install()\n"
        "assert libdevice.exp is first, 'install() is not idempotent'\n"
        "print('ONCE-OK')\n")
    r = _run(code, interpret=True)
    assert r.returncode == 0 and "ONCE-OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


# --- tl.reduce with a combine function (on CPU: the interpreter's tree over whole slices) ----------------------

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from harness import DEVICE  # noqa: E402


@triton.jit
def _max_nan(a, b):
    return tl.where(a != a, a, tl.where(b != b, b, tl.maximum(a, b)))


@triton.jit
def _argmax_first(v1, i1, v2, i2):
    pick = (v1 > v2) | ((v1 == v2) & (i1 < i2))
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)


@triton.jit
def _reductions(x_ptr, y_ptr, max_ptr, arg_ptr, all_ptr, kept_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)[:, None]
    c = tl.arange(0, C)[None, :]
    x = tl.load(x_ptr + r * C + c)
    tl.store(max_ptr + tl.arange(0, R), tl.reduce(x, 1, _max_nan))
    y = tl.load(y_ptr + r * C + c)
    _, i = tl.reduce((y, tl.broadcast_to(c, [R, C])), 1, _argmax_first)
    tl.store(arg_ptr + tl.arange(0, R), i)
    tl.store(all_ptr, tl.reduce(y, None, _max_nan))
    kept = tl.reduce(x, 0, _max_nan, keep_dims=True)  # [1, C]
    tl.store(kept_ptr + c, kept)


@pytest.mark.parametrize("cols", [1, 2, 64, 4096])
def test_reduce_with_a_combine_function(cols):
    # NaN rows propagate NaN (the leftmost NaN's bits survive: a tree keeps left operands first), -0.0/+0.0 ties,
    # and the first index of a repeated maximum, over widths from one element to a 4096-wide row.
    rows = 4
    gen = torch.Generator().manual_seed(cols)
    x = torch.randn(rows, cols, generator=gen)
    x[1, cols // 2] = float("nan")
    x[2, :] = -0.0
    x[2, cols - 1] = 0.0
    y = torch.randint(-3, 3, (rows, cols), generator=gen).float()  # many repeated maxima
    x, y = x.to(DEVICE), y.to(DEVICE)
    mx = torch.empty(rows, device=DEVICE)
    arg = torch.empty(rows, dtype=torch.int32, device=DEVICE)
    top = torch.empty(1, device=DEVICE)
    kept = torch.empty(cols, device=DEVICE)
    _reductions[(1,)](x, y, mx, arg, top, kept, rows, cols)
    want = x.cpu().amax(1)
    want[2] = 0.0  # the GPU's max orders the zeros (+0.0); ATen's CPU amax returns -0.0 for this tie
    assert torch.equal(mx.cpu().isnan(), want.isnan())
    assert torch.equal(mx.cpu().nan_to_num(), want.nan_to_num())
    assert torch.equal(mx.cpu().signbit(), want.signbit())  # max(-0.0, 0.0) is +0.0
    assert torch.equal(arg.cpu().long(), y.cpu().argmax(1))  # torch.argmax: the first maximal index
    assert top.item() == y.cpu().max().item()
    want_kept = x.cpu().amax(0)
    assert torch.equal(kept.cpu().nan_to_num(), want_kept.nan_to_num())
    assert torch.equal(kept.cpu().isnan(), want_kept.isnan())
