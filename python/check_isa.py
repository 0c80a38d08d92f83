"""Which vector registers roller's kernels use: build every suite workload (or ``--ops``) for a
target and count the zmm / ymm / xmm operands in each kernel's assembly. For the AVX2-only target
(``{"kind": "llvm", "mcpu": "haswell", "num-cores": 2}``, any x86 host) the check is: no zmm.

    python python/check_isa.py --target '{"kind": "llvm", "mcpu": "haswell", "num-cores": 2}'
"""
from __future__ import annotations

import argparse
import json
import re
import sys

import tvm_roller
from tvm_roller.tools.suite.workloads import create, list_workloads


def registers(asm: str) -> dict:
    return {r: len(re.findall(rf"%{r}\d+", asm)) for r in ("zmm", "ymm", "xmm")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="target as JSON")
    ap.add_argument("--ops", default=None, help="suite workloads, e.g. 'GMM,C2D:1' (default all)")
    ap.add_argument("--forbid", default="zmm", help="register class that must not appear")
    args = ap.parse_args()
    target = json.loads(args.target)
    bad = 0
    for cls, idx in list_workloads(args.ops):
        lib = tvm_roller.build(create(cls, idx), target)
        counts = registers(lib.mod.inspect_source("asm"))
        bad += counts[args.forbid] > 0
        print(f"{cls}:{idx:<3d} " + "  ".join(f"{k} {v:6d}" for k, v in counts.items()),
              flush=True)
    print(f"{bad} kernel(s) use {args.forbid}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
