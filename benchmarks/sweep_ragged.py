"""Column tiles of pointwise kernels over rows whose width is no multiple of a 16-byte vector (H200).

    python benchmarks/sweep_ragged.py [--out FILE.jsonl]

A column mask ``c < n_cols`` against such a width is constant over no vector in Triton's alignment analysis, so
every masked load and store of the kernel is scalar; the generated kernel gives the tiles wholly inside the row a
branch of their own without the column mask (codegen/kernel_builder.py, Emitter.split_interior), which only helps
when the row holds several tiles. The slice+add+mul case of bench_fusions (rows of ``cols - 1`` elements) is
timed, in bf16 and fp32, with that branch off and with column tiles of 1024 down to 128 (TUNING's
``pw_ragged_block_c``), fresh fusions each time; torch.compile once per shape. One JSON line per (shape, dtype,
config), then the best config per (shape, dtype).
"""

import argparse
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
import bench_fusions as bf  # noqa: E402


CONFIGS = {"off": {"pw_ragged_min_cols": 1 << 62}} | {f"block_c {b}": {"pw_ragged_block_c": b}
                                                      for b in (1024, 512, 256, 128)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    copy_bw = bf.copy_bandwidth(dev)
    out = open(args.out, "w") if args.out else None
    best = {}
    for dtype in (torch.bfloat16, torch.float32):
        dt = bf._IO_DTYPES[dtype]
        for shape in bf.SHAPES:
            x, y = (torch.randn(*shape, device=dev, dtype=dtype) for _ in range(2))
            compiled = torch.compile(bf.slice_add_mul_eager)
            compiled(x, y)
            t_comp = bf.bench(lambda: compiled(x, y))
            for name, cfg in CONFIGS.items():
                _, ms, pct = bf.time_with_tuning(lambda: bf.slice_add_mul_fd(shape, dt), bf.slice_add_mul_eager,
                                                 [x, y], cfg, copy_bw, f"slice+add+mul {shape} {name}")
                rec = dict(shape=list(shape), dtype=str(dtype), config=name, ms=round(ms, 5),
                           pct_copy_bw=round(pct, 1), vs_compile=round(t_comp / ms, 3))
                print(json.dumps(rec), flush=True)
                if out:
                    out.write(json.dumps(rec) + "\n")
                key = f"{shape} {dtype}"
                if key not in best or rec["ms"] < best[key]["ms"]:
                    best[key] = rec
    for key, rec in best.items():
        line = json.dumps({"best": key, "config": rec["config"], "pct_copy_bw": rec["pct_copy_bw"],
                           "vs_compile": rec["vs_compile"]})
        print(line)
        if out:
            out.write(line + "\n")


if __name__ == "__main__":
    main()
