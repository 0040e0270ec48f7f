"""A/B in one run on the GPU: generated kernels' faster exact math against the plain libdevice forms, at the roofline
shapes, bf16 and fp32 I/O.

    python benchmarks/ab_exact_math.py [--out FILE.json] [--cases tanh,division]

- tanh: the tanh-GELU fusion of bench_fusions with libdevice.tanh (old) against the kernel prelude's branch-free
  copy _tanh_f32 (new);
- division: the softmax fusion (bf16 output) with IEEE division (old) against the row reciprocal with its exact
  fallback near bf16 rounding midpoints, _div_for_bf16 (new).

The old forms are what the code generator emits when it believes it is interpreting (the interpreter cannot run
PTX), so this script flips that belief per variant. Each variant is timed twice (fresh fusions); the better time
counts. Records whether both outputs have the same bits.
"""
import argparse
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
import bench_fusions as B  # noqa: E402

from pyfuser import DataType  # noqa: E402
from pyfuser.codegen import elementwise_lowerings, kernel_builder  # noqa: E402

CASES = {  # name: (fusion, module whose interpreting() chooses the form, marker of the new form in the source)
    "tanh": (B.gelu_bias_fd, elementwise_lowerings, "_tanh_f32(v"),
    "division": (B.softmax_fd, kernel_builder, "_div_for_bf16(v"),
}

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="exact-math-ab.json")
ap.add_argument("--cases", default="tanh,division")
args = ap.parse_args()
bw = B.copy_bandwidth("cuda")
rows = []
for case in args.cases.split(","):
    make_fd, module, marker = CASES[case]
    for dt, tdt, bits in ((DataType.BFloat16, torch.bfloat16, torch.int16),
                          (DataType.Float, torch.float32, torch.int32)):
        for shape in ([16384, 4096], [8191, 5000], [4096, 16384], [32768, 1024], [1024, 65536]):
            x = torch.randn(shape, dtype=tdt, device="cuda")
            w, b = torch.randn(shape[1], dtype=tdt, device="cuda"), torch.randn(shape[1], dtype=tdt, device="cuda")
            inputs = [x, w, b] if case == "tanh" else [x]
            res = {}
            for variant in ("old", "new", "old2", "new2"):
                module.interpreting = (lambda: True) if variant.startswith("old") else (lambda: False)
                fd = make_fd(shape, dt)
                out = fd.execute(inputs)
                res.setdefault(variant[:3] + "_out", out[0])
                res[variant[:3] + "_form"] = marker in fd.last_execution()[0].kernel_source
                res[variant] = B.bench(lambda: fd.execute(inputs))
            moved = B.nbytes(inputs + [res["new_out"]])
            r = dict(case=case, dtype=str(tdt), shape=shape, new_form_used=res["new_form"] and not res["old_form"],
                     old_us=1e3 * min(res["old"], res["old2"]), new_us=1e3 * min(res["new"], res["new2"]),
                     bits_equal=torch.equal(res["old_out"].view(bits), res["new_out"].view(bits)))
            for v in ("old", "new"):
                r[v + "_pct"] = 100 * moved / (r[v + "_us"] * 1e-6) / 1e9 / bw
            rows.append(r)
            print(r, flush=True)
json.dump(dict(copy_GBs=bw, rows=rows), open(args.out, "w"), indent=1)
