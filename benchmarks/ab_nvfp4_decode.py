"""A/B of the NVFP4 grouped GEMM's decode kernel: the shipped module against another version, in one process.

Save the other version here:  git show REV:pyfuser/kernels/nvfp4_grouped_gemm.py > /tmp/gemm_other.py
Run on the GPU machine:       python benchmarks/ab_nvfp4_decode.py --baseline FILE --out <date>-nvfp4-decode-ab.json
Smoke run on CPU:             TRITON_INTERPRET=1 python benchmarks/ab_nvfp4_decode.py --baseline FILE --smoke --out /tmp/ab.json
A config against the default: python benchmarks/ab_nvfp4_decode.py --after-config '{"paired_planes": true}'
                              --bits-may-differ --out <date>-nvfp4-decode-paired-ab.json
With the offsets' check:      ... --checked (adds the launches that also run the device check of the offsets,
                              as fd.execute does by default)

For G=8 experts, K=4096, N in {2048, 14336} and 1, 16 and 64 tokens per expert (the issue's decode shapes), times:
- ``bf16``: torch._grouped_mm on bf16 operands of the same shape (weights [G, N, K] passed transposed);
- ``before``: ``GroupedGemm`` of ``--baseline`` (the module's source as in the repository, loaded by
  benchmarks/kernel_variant.py) with its default config, or without ``--baseline`` the shipped one;
- ``after``: the shipped ``pyfuser.kernels.nvfp4_grouped_gemm.GroupedGemm`` with its default config, changed by
  ``--after-config``;
- at 64 tokens also both modules with BLOCK_K 128 and 6 stages (``before bk128`` / ``after bk128``), the config
  that sums K in other tiles;
- with ``--checked`` also ``before checked`` / ``after checked``: the launch that runs the device check of the
  offsets and problem sizes in its program 0 (``check_flags``, what ``fd.execute`` runs by default), its flag a
  device int32 that must still be 0 after the timing (valid offsets).
Each is prepared once (checks, config, bound launch) and captured alone in a CUDA graph; a time is the median
GPU time of ``triton.testing.do_bench`` over the graph's replays (L2 cleared before each, so the weights come
from HBM as in a decode step), in ``--rounds`` interleaved rounds (median and min-max over rounds reported).
Checks: every row against ``pyfuser.nvfp4.reference.nvfp4_grouped_mm`` (tolerance of benchmarks/sweep_nvfp4_gemm.py)
and each ``after`` row against the ``before`` row of the same config bit for bit (``identical``: the fraction of
equal elements; 1.0 expected unless ``--bits-may-differ``). Writes the JSON to --out and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_variant  # noqa: E402
from sweep_nvfp4_gemm import check_rows, make_operands, record_graph_times, save_partial  # noqa: E402
from pyfuser.kernels import nvfp4_grouped_gemm as shipped  # noqa: E402
from pyfuser.nvfp4 import reference  # noqa: E402
from pyfuser.ops.narrow_precision import gemm_contract  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--baseline", help="source file of the other nvfp4_grouped_gemm.py (default: the shipped one, "
                                        "for an A/B of --after-config against the default config)")
    ap.add_argument("--after-config", default="{}",
                    help="JSON of GemmConfig overrides for the 'after' rows, e.g. '{\"paired_planes\": true}'")
    ap.add_argument("--bits-may-differ", action="store_true",
                    help="report, but do not fail on, 'after' rows whose bits differ from 'before' (a config that "
                         "sums in another order)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--rep-ms", type=int, default=50, help="do_bench time per row and round (ms)")
    ap.add_argument("--checked", action="store_true",
                    help="also time the launches that run the offsets' device check (fd.execute's default)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any device (CPU: TRITON_INTERPRET=1)")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g, k, ns, tokens_per_expert = (2, 256, (128,), (1, 16, 64)) if args.smoke else (8, 4096, (2048, 14336),
                                                                                      (1, 16, 64))
    before = kernel_variant.load(args.baseline) if args.baseline else shipped
    after_config = json.loads(args.after_config)
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (smoke)",
              "torch": torch.__version__, "triton": triton.__version__, "baseline": args.baseline or "shipped",
              "after_config": after_config, "G": g, "K": k, "shapes": []}
    t_start = time.time()
    for n in ns:
        for tpe in tokens_per_expert:
            tokens = [tpe] * g
            m = sum(tokens)
            ops = make_operands(tokens, n, k, dev)
            ref = reference.nvfp4_grouped_mm(*ops, torch.bfloat16)
            rows = {}  # name -> (call, output of one call)

            check = gemm_contract("ab", *ops)[-1]
            flags = torch.zeros(1, dtype=torch.int32, device=dev)

            def add(name, module, checked=False, **overrides):
                try:
                    gemm = module.GroupedGemm(*ops, torch.bfloat16, check=check if checked else None, **overrides)
                except ValueError as e:  # --after-config for another kernel than this shape's (one token: integer)
                    if not set(after_config) & set(overrides):
                        raise
                    print(f"  ({name}: {e}; timed without --after-config)")
                    gemm = module.GroupedGemm(*ops, torch.bfloat16,
                                              **{key: v for key, v in overrides.items() if key not in after_config})
                out = torch.empty((m, n), dtype=torch.bfloat16, device=dev)
                if checked and not gemm.fuses_check:
                    return  # (prefill configs run the check as a launch of its own)
                flag = flags if checked else None
                rows[name] = (lambda: gemm(*ops, out=out, check_flags=flag), out, gemm.cfg)

            add("before", before)
            add("after", shipped, **after_config)
            if args.checked:
                add("before checked", before, checked=True)
                add("after checked", shipped, checked=True, **after_config)
            if tpe > 16:
                add("before bk128", before, block_k=128, num_stages=6)
                add("after bk128", shipped, **{**after_config, "block_k": 128, "num_stages": 6})
            if dev.type == "cuda":
                a16 = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                w16 = torch.randn(g, n, k, device=dev, dtype=torch.bfloat16)
                offs = torch.cumsum(torch.tensor(tokens, device=dev), 0).to(torch.int32)
                rows["bf16"] = (lambda: torch._grouped_mm(a16, w16.transpose(-2, -1), offs=offs), None, None)

            entry = {"N": n, "tokens_per_expert": tpe, "M": m, "rows": check_rows(rows, ref)}
            for name, (_, out, _) in rows.items():
                twin = rows.get(name.replace("after", "before")) if name.startswith("after") else None
                if out is not None and twin is not None:
                    entry["rows"][name]["identical_to_" + name.replace("after", "before")] = (
                        (out == twin[1]).double().mean().item())
            if dev.type == "cuda":
                record_graph_times(entry["rows"], {name: fn for name, (fn, _, _) in rows.items()}, args.rounds,
                                   args.rep_ms)
                del a16, w16
            entry["check_flag"] = int(flags.item())  # valid offsets: no bit may be set
            result["shapes"].append(entry)
            print(f"\nN={n}, {tpe} tokens/expert (M={m}, G={g}, K={k})")
            for name, r in entry["rows"].items():
                ident = [f"{key[13:]}: {v:.4f}" for key, v in r.items() if key.startswith("identical_to_")]
                timing = (f"{r['us']:8.1f} us [{r['us_min']:.1f}-{r['us_max']:.1f}] {r['x_bf16']:5.2f}x bf16"
                          if "us" in r else "")
                check = "" if "matches_reference" not in r else (
                    f" ref {'ok' if r['matches_reference'] else 'MISMATCH'} ({r['max_rel_err']:.1e})")
                same = f" identical to {ident[0]}" if ident else ""
                print(f"  {name:14s}{timing}{check}{same}", flush=True)
            del ops, ref, rows
            save_partial(result, args.out, t_start, dev)
    print(f"\nwrote {args.out} ({result['wall_s']} s)")
    bad = [(s["N"], s["tokens_per_expert"], name) for s in result["shapes"] for name, r in s["rows"].items()
           if r.get("matches_reference") is False or s.get("check_flag")
           or (not args.bits_may_differ and any(v != 1.0 for key, v in r.items()
                                                if key.startswith("identical_to_")))]
    if bad:
        print(f"check failures (reference mismatch or not bit-identical): {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
