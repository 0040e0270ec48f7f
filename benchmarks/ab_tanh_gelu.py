"""A/B in one run on the GPU: the tanh-GELU fusion of bench_fusions with libdevice.tanh (old) against the kernel
prelude's branch-free copy _tanh_f32 (new), bf16 and fp32 I/O at the roofline shapes.

    python benchmarks/ab_tanh_gelu.py [--out FILE.json]

The old form is what the lowering emits when it believes it is interpreting (the interpreter cannot run PTX), so
this script flips that belief per variant. Each variant is timed twice (fresh fusions); the better time counts.
Records the bits of both outputs as equal or not.
"""
import argparse
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
import bench_fusions as B  # noqa: E402

from pyfuser import DataType  # noqa: E402
from pyfuser.codegen import elementwise_lowerings as EL  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="tanh-ab.json")
args = ap.parse_args()
bw = B.copy_bandwidth("cuda")
rows = []
for dt, tdt, bits in ((DataType.BFloat16, torch.bfloat16, torch.int16), (DataType.Float, torch.float32, torch.int32)):
    for shape in ([16384, 4096], [8191, 5000], [4096, 16384], [32768, 1024], [1024, 65536]):
        x = torch.randn(shape, dtype=tdt, device="cuda")
        w, b = torch.randn(shape[1], dtype=tdt, device="cuda"), torch.randn(shape[1], dtype=tdt, device="cuda")
        res = {}
        for variant in ("old", "new", "old2", "new2"):
            EL.interpreting = (lambda: True) if variant.startswith("old") else (lambda: False)
            fd = B.gelu_bias_fd(shape, dt)
            out = fd.execute([x, w, b])
            src = fd.last_execution()[0].kernel_source
            assert ("_tanh_f32(v" in src) == variant.startswith("new"), variant
            res.setdefault(variant[:3] + "_out", out[0])
            res[variant] = B.bench(lambda: fd.execute([x, w, b]))
        moved = B.nbytes([x, w, b, res["new_out"]])
        r = dict(dtype=str(tdt), shape=shape, old_us=1e3 * min(res["old"], res["old2"]),
                 new_us=1e3 * min(res["new"], res["new2"]),
                 bits_equal=torch.equal(res["old_out"].view(bits), res["new_out"].view(bits)))
        for v in ("old", "new"):
            r[v + "_pct"] = 100 * moved / (r[v + "_us"] * 1e-6) / 1e9 / bw
        rows.append(r)
        print(r, flush=True)
json.dump(dict(copy_GBs=bw, rows=rows), open(args.out, "w"), indent=1)
