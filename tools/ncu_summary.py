#!/usr/bin/python3
"""Per-kernel GPU time from Nsight Compute's CSV (ncu --csv --page raw --metrics
gpu__time_duration.sum), heaviest first: where a training step's time goes.

  ncu --clock-control none --target-processes all --metrics gpu__time_duration.sum \
      --csv --page raw <program> > ncu.csv
  python3 tools/ncu_summary.py ncu.csv [--top 25] [--json_out summary.json]

The program's own output may be mixed into the file: the table starts at the
header line whose first field is "ID". A units row after the header (nsecond,
usecond, msecond, second) scales the durations; without one they are taken as
nanoseconds. Kernel names are shortened to the function name (no template
arguments or parameters), so instances of one kernel add up.
"""

import argparse
import csv
import json
import sys

METRIC = "gpu__time_duration.sum"
TO_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
         "second": 1e9, "s": 1e9}


def short_name(name):
    """'void ns::Kernel<float, 4>(const float *, int)' -> 'ns::Kernel'."""
    anon = "(anonymous namespace)"
    depth = 0
    out = []
    for ch in name.replace(anon, "\x00"):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    text = "".join(out).strip().replace("\x00", anon)
    for prefix in ("void ", "__global__ "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text or name


def read_rows(lines):
    """Returns (kernel name, duration in ns) for each profiled launch."""
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        raise ValueError('no ncu CSV table (a line starting with "ID",) found')
    reader = csv.reader(lines[start:])
    header = next(reader)
    try:
        name_col = header.index("Kernel Name")
        metric_col = header.index(METRIC)
    except ValueError as e:
        raise ValueError(f"the table lacks a column: {e} (profile with --metrics {METRIC})")
    scale = 1.0
    rows = []
    for fields in reader:
        if len(fields) != len(header):
            continue  # the program's output after the table, or a broken line
        value = fields[metric_col].replace(",", "")
        try:
            ns = float(value) * scale
        except ValueError:
            if value in TO_NS and not rows:
                scale = TO_NS[value]  # the units row
                continue
            raise ValueError(f"duration '{fields[metric_col]}' of {fields[name_col]} is not a number")
        rows.append((short_name(fields[name_col]), ns))
    return rows


def summarize(rows, top):
    total = sum(ns for _, ns in rows)
    per = {}
    for name, ns in rows:
        count, sum_ns = per.get(name, (0, 0.0))
        per[name] = (count + 1, sum_ns + ns)
    ranked = sorted(per.items(), key=lambda kv: -kv[1][1])
    kernels = [{"kernel": name, "launches": count, "total_ms": sum_ns / 1e6,
                "share": sum_ns / total if total > 0 else 0.0}
               for name, (count, sum_ns) in ranked[:top]]
    return {"launches": len(rows), "total_ms": total / 1e6, "kernels": kernels}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json_out", default="")
    args = p.parse_args()
    with open(args.csv, newline="", errors="replace") as f:
        lines = f.read().splitlines()
    try:
        summary = summarize(read_rows(lines), args.top)
    except ValueError as e:
        print(f"ncu_summary: {args.csv}: {e}", file=sys.stderr)
        return 1
    print(f"{summary['launches']} kernel launches, {summary['total_ms']:.3f} ms of GPU time")
    print(f"{'share':>6} {'ms':>10} {'launches':>8}  kernel")
    for k in summary["kernels"]:
        print(f"{100 * k['share']:5.1f}% {k['total_ms']:10.3f} {k['launches']:8d}  {k['kernel']}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
