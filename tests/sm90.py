"""Compile generated kernels for Hopper (sm_90) without a GPU, as the GPU would run them.

Triton compiles for a target given explicitly when the interpreter is off, so the compile runs in a subprocess
without TRITON_INTERPRET. Each kernel is compiled with the launch options pyfuser uses (num_warps and its plan's
compile_options(): codegen.kernel_builder.COMPILE_OPTIONS and any register cap), from the source and signature its
plan records."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import tempfile


_COMPILE = """
import base64, importlib.util, json, os, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
kernels = json.load(sys.stdin)
out = []
with tempfile.TemporaryDirectory() as d:
    for i, k in enumerate(kernels):
        path = os.path.join(d, f"k{i}.py")
        with open(path, "w") as f:
            f.write(k["source"])
        spec = importlib.util.spec_from_file_location(f"k{i}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        # (JSON has no tuples or functions: a list is a tuple argument's types, "@name" a function of the source)
        sig = {n: tuple(t) if isinstance(t, list) else t for n, t in k["signature"].items()}
        consts = {n: getattr(mod, c[1:]) if isinstance(c, str) and c.startswith("@") else c
                  for n, c in k["constexprs"].items()}
        # "aligned": the pointer parameters' indices, specialized as the JIT does for 16-byte-aligned tensors
        attrs = {(i,): [["tt.divisibility", 16]] for i in k.get("aligned", [])}
        src = triton.compiler.ASTSource(fn=getattr(mod, k["name"]), signature=sig, constexprs=consts, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=k["options"])
        assert compiled.asm["cubin"], k["name"]
        out.append(base64.b64encode(compiled.asm["cubin"]).decode() if "--cubin" in sys.argv
                   else compiled.asm["ptx"])
print(json.dumps(out))
"""


def kernel_spec(plan, specialized: bool = False) -> dict:
    """What the compile needs of a generated kernel's plan (codegen.plan.KernelPlan). ``specialized``: as the JIT
    specializes a launch with 16-byte-aligned tensors: every pointer marked divisible by 16 and every int argument
    equal to 1 made a constant (so the compiler vectorizes as it does on the GPU)."""
    signature, constexprs = plan.compile_spec()
    spec = {"name": plan.name, "source": plan.source, "signature": signature, "constexprs": constexprs,
            "options": {"num_warps": plan.num_warps, **plan.compile_options()}}
    if specialized:
        names = list(signature)
        spec["aligned"] = [i for i, n in enumerate(names) if str(signature[n]).startswith("*")]
        ints = [n for n in names if signature[n] in ("i32", "i64")]  # the plan's fixed ints come last
        for n, v in zip(ints[len(ints) - len(plan.fixed_args):], plan.fixed_args):
            if v == 1:
                signature[n], constexprs[n] = "constexpr", 1
    return spec


def plans_of(fd) -> list:
    """The plans of the generated kernels the last execute of ``fd`` ran."""
    rt = fd.last_runtime()
    return [rt.kernel_step(i).plan for i in range(len(rt.segments)) if rt.kernel_step(i) is not None]


def compile_ptx(specs: list) -> list[str]:
    """sm_90 PTX of each kernel_spec (each also assembled to a cubin); raises AssertionError with the compiler's
    error output when one fails."""
    return _compile(specs)


def compile_cubin(specs: list) -> list[bytes]:
    """The sm_90a cubin of each kernel_spec (for cuobjdump: benchmarks/sass_census.py)."""
    return [base64.b64decode(c) for c in _compile(specs, "--cubin")]


def cuobjdump(cubin: bytes, flag: str) -> str:
    """The output of the cuobjdump Triton ships for ``cubin``: ``-sass`` its SASS, ``-res-usage`` its resources."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([tool, flag, path], capture_output=True, text=True, check=True).stdout


_OPCODE = re.compile(r"/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def opcodes(sass: str) -> list[str]:
    """The opcode of every instruction in ``sass`` (cuobjdump -sass text), predicated ones included, NOPs (padding)
    left out."""
    return [m.group(2) for m in map(_OPCODE.search, sass.splitlines()) if m and m.group(2) != "NOP"]


def main_loop(sass: str) -> list[str]:
    """The instructions of the longest loop body in ``sass`` (cuobjdump -sass text: the span of the longest backward
    branch), addresses and branch targets blanked, so two kernels' main loops compare instruction for
    instruction."""
    code = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    best: list = []
    for addr, text in code:
        target = re.search(r"BRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            body = [t for a, t in code if int(target.group(1), 16) <= a <= addr]
            best = max(best, body, key=len)
    return [re.sub(r"0x[0-9a-f]+", "X", " ".join(t.split())) for t in best]


def resource_usage(cubin: bytes) -> dict:
    """ptxas's registers, stack bytes and static shared memory of a cubin's kernel (None where not reported)."""
    usage = cuobjdump(cubin, "-res-usage")
    found = {k: re.search(rf"{k}:(\d+)", usage) for k in ("REG", "STACK", "SHARED")}
    return {k: int(m.group(1)) if m else None for k, m in found.items()}


def programs_per_sm(regs: int, warps: int) -> int:
    """Programs of ``warps`` warps that fit on one sm_90 SM by their registers and threads (65536 registers,
    allocated per warp in units of 8 per thread; 2048 threads; 32 programs). Shared memory is not counted: the
    generated kernels' is dynamic and small. Why: a kernel whose registers halve its programs per SM can lose
    what its fewer instructions gain (the bf16 tanh-GELU tail at 46 registers, docs/codegen.md)."""
    per_warp = 32 * -(-max(regs, 1) // 8) * 8
    return min(65536 // (per_warp * warps), 2048 // (32 * warps), 32)


def _compile(specs: list, *flags: str) -> list:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _COMPILE, *flags], input=json.dumps(specs), capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gpu_plans(monkeypatch, fd, inputs) -> list:
    """The kernel plans the GPU would run ``fd`` on ``inputs`` with, planned on this machine as if it were not
    interpreting (the GPU forms: PTX blocks, bf16 NaN selects). Off the GPU the execute may fail where the
    interpreter cannot run such a form; the plans are what the caller reads."""
    from pyfuser.codegen import elementwise_lowerings, kernel_builder, plan, reduction_lowerings
    from pyfuser.runtime import plan as runtime_plan

    plans = []
    real = plan.plan_kernel

    def capture(*a, **k):
        plans.append(real(*a, **k))
        return plans[-1]

    monkeypatch.setattr(runtime_plan, "plan_kernel", capture)
    for module in (kernel_builder, elementwise_lowerings, reduction_lowerings):
        monkeypatch.setattr(module, "interpreting", lambda: False)
    try:
        fd.execute(inputs)
    except Exception:
        if any(getattr(t, "device", None) is not None and t.device.type == "cuda" for t in inputs):
            raise
    assert plans
    return plans
