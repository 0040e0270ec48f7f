"""SASS instruction census of the generated kernels of bench_fusions' cases, without a GPU.

Run anywhere Triton is installed (a CPU machine will do):

    python benchmarks/sass_census.py --cases "softmax fp32,layernorm" --shapes 8191x5000 --dtypes bf16
    python benchmarks/sass_census.py --cases layernorm --shapes 1024x65536 --tuning '{"wide_warps": 16}'

Each case is planned as the GPU would plan it (the kernels' GPU sources, 132 SMs, launches skipped), compiled
for sm_90a with the launch options pyfuser uses, and disassembled with the cuobjdump Triton ships. Printed per
kernel: SASS instructions, MUFU (special-function) instructions, registers, stack bytes (spills), programs per
SM by registers and threads, and, for kernels without loops, static instructions per element (each thread runs
its code once for its share of the program's elements; a rarely taken branch, such as the bf16 row division's
exact path, counts as if it ran), and the same without the rarely taken exact paths (``hot_per_elem``: what a
warp that takes none of them issues). A pointwise kernel whose tiles inside the rows take an unmasked path and
whose last tile per row a masked one (rows of odd widths) counts both paths in those two; ``interior_per_elem``
is the unmasked path alone (the kernel compiled with the test taken as true), what most of its tiles issue.
Why: bf16 kernels can be bound by instruction issue (tanh-GELU is), and an instruction count is the cheapest
A/B there is, with or without a GPU.
``--dump DIR`` writes each kernel's source and SASS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

if __name__ == "__main__":  # (run as a script on any machine; imported, e.g. by a test, it changes nothing)
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import bench_fusions as bf  # noqa: E402
from pyfuser.codegen.kernel_builder import INTERIOR_TILE_TEST  # noqa: E402

INTERIOR_TEST_LINE = f"if {INTERIOR_TILE_TEST}:"  # how a pointwise kernel's source opens its unmasked path

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def plans_for(name: str, rows: int, cols: int, dtype: torch.dtype) -> list:
    """The kernel plans of one bench_fusions case, planned for the GPU on the CPU: GPU sources, launches skipped."""
    from pyfuser.codegen import (elementwise_lowerings, gelu_tanh_bf16, kernel_builder, launcher, plan, prologue,
                                 reduction_lowerings)

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from sm90 import plans_of

    for module in (elementwise_lowerings, kernel_builder, reduction_lowerings):  # the GPU's forms of the ops
        module.interpreting = lambda: False
    launcher.Launcher.launch = lambda self, *a, **k: None
    plan._SM_COUNT[:] = [132]
    # the helpers as an sm_90 GPU builds them (the bf16 GELU tail's window is per architecture)
    kernel_builder.prelude = prologue.prelude = lambda: kernel_builder.prelude_for_bound(
        gelu_tanh_bf16.device_bound((9, 0)))
    for case, fd, _eager, inputs in bf.make_cases(rows, cols, torch.device("cpu"), dtype):
        if case.split(" [")[0] == name:
            fd.execute(inputs)
            return plans_of(fd)
    raise SystemExit(f"no case {name!r}; cases: {[c[0] for c in bf.make_cases(2, 2, 'cpu')]}")


def census(p, dump: str | None = None, label: str = "") -> dict:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from sm90 import compile_cubin, cuobjdump, kernel_spec, opcodes, programs_per_sm, resource_usage

    spec = kernel_spec(p, specialized=True)
    (cubin,) = compile_cubin([spec])
    sass = cuobjdump(cubin, "-sass")
    usage = resource_usage(cubin)
    info = {"regs": usage["REG"], "stack": usage["STACK"], "shared": usage["SHARED"]}
    ops = opcodes(sass)
    rare = len(_rare_path(sass))
    body = p.source[p.source.index(f"def {p.name}("):]
    loops = bool(re.search(r"^\s+for ", body, re.M))
    threads = 32 * p.num_warps
    elems = _elements_per_program(p)
    row = {"kernel": p.name, "warps": p.num_warps, "sass": len(ops), "mufu": sum(o.startswith("MUFU") for o in ops),
           **info, "programs_per_sm": programs_per_sm(info["regs"], p.num_warps), "loops": loops}
    if elems and not loops:
        row["per_elem"] = round(len(ops) * threads / elems, 1)
        row["hot_per_elem"] = round((len(ops) - rare) * threads / elems, 1)
        if INTERIOR_TEST_LINE in body:
            (interior,) = compile_cubin([dict(spec, source=p.source.replace(INTERIOR_TEST_LINE, "if True:"))])
            isass = cuobjdump(interior, "-sass")
            row["interior_per_elem"] = round((len(opcodes(isass)) - len(_rare_path(isass))) * threads / elems, 1)
    if dump:
        os.makedirs(dump, exist_ok=True)
        with open(os.path.join(dump, f"{label}{p.name}.py"), "w") as f:
            f.write(p.source)
        with open(os.path.join(dump, f"{label}{p.name}.sass"), "w") as f:
            f.write(sass)
    return row


_BRANCH = re.compile(r"/\*([0-9a-f]{4})\*/\s+@!P\d+\s+BRA\s+(0x[0-9a-f]+)")
_ADDR = re.compile(r"/\*([0-9a-f]{4})\*/\s+(?!NOP)[A-Z@]")


def _rare_path(sass: str) -> set:
    """Addresses of the instructions a forward ``@!P BRA`` skips: the exact paths behind the bf16 division's and
    the GELU tail's rarely taken branches (their PTX: ``@!slow bra DONE``)."""
    addrs = [int(m.group(1), 16) for m in map(_ADDR.search, sass.splitlines()) if m]
    out = set()
    for m in map(_BRANCH.search, sass.splitlines()):
        if m:
            start, end = int(m.group(1), 16), int(m.group(2), 16)
            out.update(a for a in addrs if start < a < end)
    return out


def _elements_per_program(p) -> int:
    """Elements one program covers: a tile of a pointwise kernel, whole rows of the others."""
    return p.block_r * (min(p.block_c, p.n_cols) if p.mode == "pointwise" else p.n_cols)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="gelu(x*w+b),rmsnorm,layernorm,softmax fp32,slice+add+mul")
    ap.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in bf.SHAPES))
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--dump", default=None, help="write each kernel's source and SASS here")
    ap.add_argument("--tuning", default=None,
                    help='JSON of plan.TUNING entries to plan with, as sweep_tuning.py --configs takes one, e.g. '
                         '\'{"wide_warps": 16}\' (what a setting does to registers and programs per SM, before a GPU '
                         'times it)')
    args = ap.parse_args()
    if args.tuning:
        from pyfuser.codegen import plan

        plan.TUNING.update(json.loads(args.tuning))
    for dt in args.dtypes.split(","):
        for shape in args.shapes.split(","):
            r, c = map(int, shape.split("x"))
            for name in args.cases.split(","):
                for p in plans_for(name, r, c, _DTYPES[dt]):
                    row = census(p, args.dump, f"{name}-{dt}-{shape}-".replace("*", "").replace("+", "_"))
                    print(json.dumps({"case": name, "dtype": dt, "shape": [r, c], **row}), flush=True)


if __name__ == "__main__":
    main()
