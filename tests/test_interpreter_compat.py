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
