"""Every Python spelling of every committed table, called under its device's simulated autocast:
does the op it maps to run in the dtype the table says? (#15 item 1)

    .venv/bin/python benchmarks/spelling_dtypes.py [--device mps] [--json results.json]

Prints, per device, the (op, spelling) pairs checked (those of every list: python,
python_explicit_dtype, python_float64), how many agree, and every pair that does not, with what
was seen; and the time taken. The suite (tests/test_probe_spelling_dtypes.py) runs the same
check on every table and holds the explicit list of pairs that cannot run, with why.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from amplint.probe.check_spellings import check_table  # noqa: E402

POLICY_DIR = ROOT / "policies" / f"torch-{'.'.join(torch.__version__.split('.')[:2])}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="all")
    parser.add_argument("--json", type=Path, default=None, help="write every result here")
    args = parser.parse_args()
    devices = sorted(p.stem for p in POLICY_DIR.glob("*.json")) if args.device == "all" else [args.device]
    everything, start_all = [], time.perf_counter()
    for device in devices:
        table = json.loads((POLICY_DIR / f"{device}.json").read_text())
        start = time.perf_counter()
        results = check_table(table)
        took = time.perf_counter() - start
        counts = collections.Counter(r.status for r in results)
        print(f"{device}: {len(results)} (op, spelling) pairs in {took:.1f} s: "
              + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
        for r in sorted(results, key=lambda r: (r.status, r.op, r.spelling)):
            if r.status != "ok":
                listed = "" if r.listed == "python" else f" ({r.listed})"
                print(f"  {r.status:12} {r.op:34} {r.spelling:48} {r.policy + listed:20} {r.detail}")
        everything += [r.__dict__ for r in results]
    total = collections.Counter(r["status"] for r in everything)
    print(f"all: {len(everything)} pairs in {time.perf_counter() - start_all:.1f} s: "
          + ", ".join(f"{n} {s}" for s, n in sorted(total.items())))
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
