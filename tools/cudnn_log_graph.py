#!/usr/bin/python3
"""The operation graphs in a cuDNN API log, canonical, and the differences of two logs.

cuDNN writes every backend call with CUDNN_LOGLEVEL_DBG=3 (CUDNN_LOGDEST_DBG names
the file). Each operation descriptor it finalizes is logged with its tensors in
full; this prints those operations in order, one block each: the kind, its
mode and precision lines, and per port the tensor's data type, dims, strides,
uid and by-value flag. --ops FIRST:END takes one graph's operations (the causal
SDPA forward is operations 0:14 and its backward 14:36); virtual (intermediate)
tensors are renamed v1, v2, ... by first use among them, so two logs that build
the same dataflow with other uids print the same.

  python3 tools/cudnn_log_graph.py LOG [--ops 0:14]        # print
  python3 tools/cudnn_log_graph.py LOG_A LOG_B [--ops 0:36] # the lines that differ

gpu_session.sh cudnn brings back both logs of a first run (ours and PyTorch's
SDPA at the same shapes) in cudnn_logs.tar.xz; on 2026-11-27 the host-built
graphs of attention_cudnn.cc matched PyTorch 2.11's (cuDNN 9.19) this way,
forward ops 0:14 and backward 14:36, except the gradients' strides (inputs).
"""

import argparse
import re
import sys

TENSOR_FIELDS = ("type", "nbDims", "dimA", "strideA", "uid", "alignmentInBytes", "isVirtual",
                 "isByVal")
SKIPPED_FIELDS = ("nanOpt", "reluLowerClip", "reluUpperClip", "reluLowerClipSlope", "eluAlpha",
                  "softplusBeta", "swishBeta", "alignmentInBytes", "nbDims")


def operation_blocks(text):
    """The logged cudnnBackendFinalize calls of operation descriptors, in order."""
    blocks = re.split(r"\n(?=I! CuDNN)", text)
    out = []
    for b in blocks:
        if "function cudnnBackendFinalize() called" not in b:
            continue
        if re.search(r"^i!     status: type", b, re.M):  # the call's return, not its arguments
            continue
        if re.search(r"descriptor: type=CUDNN_BACKEND_OPERATION_\w+_DESCRIPTOR:", b):
            out.append(b)
    return out


def canonical(block, names):
    """One operation as lines; `names` maps this graph's virtual uids to v1, v2, ..."""
    lines = [l[3:] if l.startswith("i! ") else l for l in block.split("\n")[1:]]
    kind = re.search(r"CUDNN_BACKEND_(\w+)_DESCRIPTOR", lines[0]).group(1)
    out = [kind]
    port, fields = None, {}

    def flush():
        uid = fields.get("uid")
        if fields.get("isVirtual") == "true":
            uid = names.setdefault(uid, f"v{len(names) + 1}")
        flag = " byval" if fields.get("isByVal") == "true" else ""
        dtype = fields.get("type", "?").split()[0]
        out.append(f"  {port}: {dtype} {fields.get('dimA')} {fields.get('strideA')} "
                   f"uid={uid}{flag}")

    for l in lines[1:]:
        if l.startswith("Time:") or l.startswith("Process="):
            continue
        m = re.match(r"\s+(\w+): type=CUDNN_BACKEND_TENSOR_DESCRIPTOR:", l)
        if m:
            if port:
                flush()
            port, fields = m.group(1), {}
            continue
        m = re.match(r"\s+(\w+): type=[^;]+; val=([^;]+);", l)
        if not m:
            continue
        key, value = m.group(1), m.group(2)
        if port and key in TENSOR_FIELDS:
            fields[key] = value
            continue
        if port:
            flush()
            port = None
        if key not in SKIPPED_FIELDS:
            out.append(f"  {key}={value}")
    if port:
        flush()
    return out


def graph(path, ops):
    """The canonical lines of operations ops[0]:ops[1] of the log at path."""
    with open(path, errors="replace") as f:
        blocks = operation_blocks(f.read())
    lo, hi = ops
    chosen = blocks[lo:hi if hi is not None else len(blocks)]
    names = {}
    return [canonical(b, names) for b in chosen], len(blocks)


def parse_ops(spec):
    m = re.fullmatch(r"(\d*):(\d*)", spec)
    if not m:
        sys.exit(f"cudnn_log_graph: --ops must be FIRST:END (e.g. 0:14), got '{spec}'")
    return int(m.group(1) or 0), int(m.group(2)) if m.group(2) else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("logs", nargs="+", help="one log to print, or two to compare")
    p.add_argument("--ops", default=":", help="FIRST:END, the operations to take (a graph)")
    args = p.parse_args()
    if len(args.logs) > 2:
        sys.exit("cudnn_log_graph: one log to print or two to compare")
    ops = parse_ops(args.ops)
    graphs = []
    for path in args.logs:
        try:
            g, total = graph(path, ops)
        except OSError as e:
            sys.exit(f"cudnn_log_graph: cannot read {path}: {e.strerror}")
        if total == 0:
            sys.exit(f"cudnn_log_graph: {path} logs no finalized operation (CUDNN_LOGLEVEL_DBG=3?)")
        graphs.append(g)
    if len(graphs) == 1:
        for op in graphs[0]:
            print("\n".join(op))
        return 0
    a, b = graphs
    differences = 0
    if len(a) != len(b):
        print(f"operations: {len(a)} in {args.logs[0]}, {len(b)} in {args.logs[1]}")
        differences += 1
    for i, (x, y) in enumerate(zip(a, b)):
        if len(x) != len(y):
            print(f"op {i} ({x[0]} / {y[0]}): {len(x)} lines against {len(y)}")
            differences += 1
            continue
        for lx, ly in zip(x, y):
            if lx != ly:
                print(f"op {i} {x[0]}:\n  < {lx.strip()}\n  > {ly.strip()}")
                differences += 1
    print(f"{min(len(a), len(b))} operations compared, {differences} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
