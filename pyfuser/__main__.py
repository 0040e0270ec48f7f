"""Command line: ``python -m pyfuser <command>`` (``python -m pyfuser --help`` lists the commands)."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _demo(args: argparse.Namespace) -> int:
    from . import demo

    return demo.run(device=args.device, size=args.size, cases=args.case)


def _ops(args: argparse.Namespace) -> int:
    from .ops import all_ops

    by_kind: dict[str, list[str]] = {}
    for name, opdef in sorted(all_ops().items()):
        marks = [m for m, has in (("meta", opdef.meta), ("triton", opdef.lower), ("kernel", opdef.kernel)) if has]
        by_kind.setdefault(opdef.kind.value, []).append(name + (f" [{', '.join(marks)}]" if marks else ""))
    print("[meta]: has a meta override for layout inference; [triton]: has a Triton lowering for generated kernels; "
          "[kernel]: runs its own hand-written Triton kernel (pyfuser/nvfp4)")
    for kind, names in by_kind.items():
        print(f"{kind} ({len(names)}): {', '.join(names)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .demo import CASES, MOE_CASE

    parser = argparse.ArgumentParser(
        prog="python -m pyfuser",
        description="pyfuser: a fusion compiler for PyTorch programs with nvFuser's direct Python frontend.",
    )
    commands = parser.add_subparsers(dest="command", metavar="command", required=True)

    demo = commands.add_parser(
        "demo",
        help="build and run a few fusions, print their segments and layouts, and check them against eager PyTorch",
        description="Build, run and check example fusions against eager PyTorch. Exits 1 if any check fails.",
    )
    demo.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="default: cuda if available")
    demo.add_argument("--size", choices=["auto", "small", "large"], default="auto", help="default: large on cuda")
    demo.add_argument(
        "--case", action="append", choices=[c.key for c in CASES] + [MOE_CASE], help="run only this case (repeatable)"
    )
    demo.set_defaults(func=_demo)

    ops = commands.add_parser(
        "ops", help="list the registered ops by kind", description="List the registered ops by kind."
    )
    ops.set_defaults(func=_ops)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
