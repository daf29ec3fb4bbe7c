#!/usr/bin/python3
"""Our fused causal attention against PyTorch's, side by side in one run on a GPU.

PyTorch's F.scaled_dot_product_attention is timed per backend it offers --
flash (FlashAttention-2), cudnn (cuDNN's fused attention), efficient (the
memory-efficient kernels) -- at //tensor/cuda:attention_benchmark's shapes:
B x H 12 x T x D 64, bf16, causal, q, k, v and the output gradient contiguous
(B, H, T, D) and uniform in [-1, 1]. Each is timed as attention_benchmark
times ours: CUDA events around `iters` calls after 2 warm-up calls, the mean;
the forward, the forward + backward, and the backward alone (torch.autograd.grad
on one forward's graph, kept). TFLOP/s count the causal half as
attention_benchmark does (forward 2 B H T^2 D, backward 2.5x that). Our
figures come from running attention_benchmark (--ours_cmd) in the same call;
its fused forward, forward + backward and deterministic backward lines are
parsed into the same table.

  python3 tools/attention_vs_torch.py --ours_cmd "gpu_bundle/run.sh attention_benchmark" \\
      [--batch 8] [--iters 20] [--json_out attention_vs_torch.json]

Without --ours_cmd only PyTorch is timed; --ours_output reads a saved
attention_benchmark output instead of running it (with --backends= no PyTorch
is needed). A backend PyTorch refuses at a shape (not built, not supported on
the device) is reported as such, not timed.
"""

import argparse
import json
import re
import shlex
import subprocess
import sys

HEADS, HEAD_DIM, SEQ_LENS = 12, 64, (1024, 2048)


def causal_flops(b, t):
    """The forward's useful FLOPs: the causal half of 4 B H T^2 D."""
    return 2.0 * b * HEADS * t * t * HEAD_DIM


# attention_benchmark's lines (tensor/cuda/attention_benchmark.cc).
HEADER = re.compile(r"^B=(\d+) H=\d+ T=(\d+) D=\d+")
OURS = {
    "fwd_ms": re.compile(r"^\s*forward:\s+fused\s+([\d.]+) ms"),
    "fwd_bwd_ms": re.compile(r"^\s*fwd \+ bwd:\s+fused\s+([\d.]+) ms"),
    "bwd_ms": re.compile(r"^\s*backward: deterministic \(7 products\)\s+([\d.]+) ms"),
}


def parse_ours(text, batch):
    """{T: {fwd_ms, fwd_bwd_ms, bwd_ms}} from attention_benchmark's output at B = batch."""
    result, t = {}, None
    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            if int(m.group(1)) != batch:
                sys.exit(f"attention_vs_torch: attention_benchmark ran at B={m.group(1)}, "
                         f"not --batch {batch}")
            t = int(m.group(2))
            result[t] = {}
            continue
        for key, pattern in OURS.items():
            m = pattern.match(line)
            if m and t is not None:
                result[t][key] = float(m.group(1))
    return {t: v for t, v in result.items() if len(v) == len(OURS)}


def run_ours(cmd, batch, iters):
    argv = shlex.split(cmd) + [str(batch), str(iters)]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        sys.exit(f"attention_vs_torch: '{' '.join(argv)}' exited with {proc.returncode}")
    ours = parse_ours(proc.stdout, batch)
    if not ours:
        sys.exit("attention_vs_torch: no fused forward / fwd + bwd / backward lines in "
                 "attention_benchmark's output (its format changed?)")
    return ours


def time_torch(torch, backend, b, t, iters):
    """{fwd_ms, fwd_bwd_ms, bwd_ms} of SDPA under one backend, or {error}."""
    from torch.nn.attention import sdpa_kernel
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(t)

    def uniform():
        x = torch.rand((b, HEADS, t, HEAD_DIM), device="cuda", generator=gen) * 2 - 1
        return x.to(torch.bfloat16)

    q, k, v, dout = (uniform().requires_grad_(i < 3) for i in range(4))

    def mean_ms(fn):
        for _ in range(2):
            fn()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / iters

    with sdpa_kernel([backend]):
        try:
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(y, (q, k, v), dout, retain_graph=True)
            torch.cuda.synchronize()
        except RuntimeError as e:  # no kernel for this backend, device or shape
            return {"error": str(e).splitlines()[0][:160]}

        def forward():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def forward_backward():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(out, (q, k, v), dout)

        def backward():
            torch.autograd.grad(y, (q, k, v), dout, retain_graph=True)

        return {"fwd_ms": mean_ms(forward), "fwd_bwd_ms": mean_ms(forward_backward),
                "bwd_ms": mean_ms(backward)}


def print_table(rows, batch):
    print(f"\nfused causal attention, B {batch} H {HEADS} D {HEAD_DIM} bf16 "
          "(ms; TFLOP/s of the causal half; 'vs ours' = their time / ours, above 1: ours faster)")
    print(f"{'T':>5s} {'implementation':<18s} {'forward':>17s} {'fwd + bwd':>17s} "
          f"{'backward':>17s} {'vs ours (fwd, f+b, bwd)':>24s}")
    for row in rows:
        if "error" in row:
            print(f"{row['t']:5d} {row['impl']:<18s} not run: {row['error']}")
            continue
        fwd = causal_flops(batch, row["t"])
        cells = []
        for key, flops in (("fwd_ms", fwd), ("fwd_bwd_ms", 3.5 * fwd), ("bwd_ms", 2.5 * fwd)):
            cells.append(f"{row[key]:7.3f} ({flops / row[key] * 1e-9:6.1f})")
        ratio = ""
        if "vs_ours" in row:
            ratio = " ".join(f"{row['vs_ours'][k]:5.2f}x" for k in ("fwd_ms", "fwd_bwd_ms", "bwd_ms"))
        print(f"{row['t']:5d} {row['impl']:<18s} {' '.join(cells)} {ratio:>24s}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ours_cmd", default="",
                   help="attention_benchmark's command (B and iters are appended)")
    p.add_argument("--ours_output", default="",
                   help="a saved attention_benchmark output to read instead of --ours_cmd")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--backends", default="flash,cudnn,efficient",
                   help="PyTorch's SDPA backends to time, comma-separated")
    p.add_argument("--json_out", default="")
    args = p.parse_args()
    if args.batch <= 0 or args.iters <= 0:
        sys.exit(f"attention_vs_torch: --batch and --iters must be positive, got "
                 f"{args.batch} and {args.iters}")
    names = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
             "efficient": "EFFICIENT_ATTENTION"}
    wanted = [n for n in args.backends.split(",") if n]
    for name in wanted:
        if name not in names:
            sys.exit(f"attention_vs_torch: unknown backend '{name}' in --backends "
                     f"(known: {', '.join(names)})")
    torch, backends = None, []
    if wanted:
        import torch
        if not torch.cuda.is_available():
            sys.exit("attention_vs_torch: PyTorch sees no CUDA device")
        try:
            from torch.nn.attention import SDPBackend
        except ImportError:
            sys.exit(f"attention_vs_torch: needs PyTorch 2.3 or later (torch.nn.attention), "
                     f"found {torch.__version__}")
        for name in wanted:
            if hasattr(SDPBackend, names[name]):
                backends.append((name, getattr(SDPBackend, names[name])))
            else:
                print(f"PyTorch {torch.__version__} has no SDPBackend.{names[name]}: "
                      f"{name} not timed")

    if args.ours_output:
        with open(args.ours_output) as f:
            ours = parse_ours(f.read(), args.batch)
        if not ours:
            sys.exit(f"attention_vs_torch: no fused forward / fwd + bwd / backward lines in "
                     f"{args.ours_output}")
    elif args.ours_cmd:
        ours = run_ours(args.ours_cmd, args.batch, args.iters)
    else:
        ours = {}
    rows = []
    for t in SEQ_LENS:
        if t in ours:
            rows.append({"t": t, "impl": "ours", **ours[t]})
        for name, backend in backends:
            row = {"t": t, "impl": f"torch sdpa {name}",
                   **time_torch(torch, backend, args.batch, t, args.iters)}
            if t in ours and "error" not in row:
                row["vs_ours"] = {k: row[k] / ours[t][k] for k in ours[t]}
            rows.append(row)
    print_table(rows, args.batch)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if torch else None,
                       "torch": torch.__version__ if torch else None,
                       "batch": args.batch, "heads": HEADS, "head_dim": HEAD_DIM,
                       "iters": args.iters, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
