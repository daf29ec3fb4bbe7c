#!/usr/bin/python3
"""Training speed of our minGPT against PyTorch eager, side by side in one run.

The issue's setting: preset gopher-44m (8 layers, 512 wide, 16 heads), vocab 50257,
block 128, batch 8, SGD (momentum 0.9), random tokens, dropout 0, all cores.
PyTorch (Debian's python3-torch 1.13, CPU, fp32 eager, the same model as
tools/mingpt_reference.py) and our train binary (fp32 and bf16 mixed precision)
run one after the other, and the ratios of tokens/s are printed with the
absolute figures. Steps after the warm-up ones are timed.

  ./bazelw build //models/mingpt:train
  /usr/bin/python3 tools/bench_vs_pytorch.py [--steps 8] [--json_out result.json]

On a GPU (the issue's GPU setting: gpt2 124M, bf16 mixed precision, batch
16 x 1024, AdamW): PyTorch eager on cuda with torch.autocast(bf16) against our
train binary with --device=cuda:0 --precision=bf16 (built with --config=cuda
and carried with tools/gpu_bundle.sh), with model FLOPs utilization (MFU:
6 N + 12 L C T FLOPs per token, as PaLM / llm.c count, N the weights that
multiply (not the embedding lookups), over the device's dense bf16 peak) and,
with --torch_sdpa, PyTorch with its fused attention too:

  python3 tools/bench_vs_pytorch.py --device cuda --preset gpt2 --seq_len 1024 \
      --batch_size 16 --optimizer adamw --torch_sdpa \
      --train_cmd "gpu_bundle/run.sh gpu_bundle/wrap/train"
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import shlex

try:  # checked in main(), after --help
    import torch
except ImportError:
    torch = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if torch is not None:
    import mingpt_reference  # noqa: E402  (the same minGPT as the parity fixture)

PRESETS = {"gopher-44m": (8, 16, 512), "gpt-mini": (6, 6, 192), "gpt-micro": (4, 4, 128),
           "gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024)}


def flops_per_token(args):
    """6 N (forward + backward of every weight) + 12 L C T (attention scores and values).

    N counts the weights that multiply: the blocks (12 L C^2 + 13 L C), the
    final LayerNorm (2 C) and the LM head (V C; minGPT does not tie it to the
    token embedding). The token and position embedding tables are lookups,
    not products, so they are left out, as nanoGPT's estimate_mfu and llm.c
    leave out the position table and count a tied token table once, as the
    head. For gpt2 N = 123.65M (the train binary's "without embeddings").
    """
    n_layer, _, c = PRESETS[args.preset]
    n = 12 * n_layer * c * c + 13 * n_layer * c + 2 * c + args.vocab_size * c
    return 6 * n + 12 * n_layer * c * args.seq_len


# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) by device name, most
# specific first: NVIDIA's data sheets. The train binary's MFU uses the same
# table (models/common/mfu.cc) and count (mingpt::FlopsPerToken).
PEAK_BF16_TFLOPS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("GH200", 989.5),
                    ("H200", 989.5), ("H100", 989.5), ("A100", 312.0)]


def peak_tflops(args):
    """--peak_tflops, else the peak of the device's name; exits naming it if unknown."""
    if args.peak_tflops > 0:
        return args.peak_tflops
    name = torch.cuda.get_device_name()
    for key, peak in PEAK_BF16_TFLOPS:
        if key in name:
            return peak
    sys.exit(f"no known bf16 peak for '{name}': pass --peak_tflops")


# The switches of the CUDA build that --FLAG times ours with, as (flag, result name, environment,
# what the switch does (for the error without --device cuda), help).
OURS_SWITCHES = [
    ("gemm_tune", "ours_bf16_gemm_tuned", {"FSDP_CUDA_GEMM_TUNE": "1"},
     "tunes cuBLASLt's GEMMs",
     "with FSDP_CUDA_GEMM_TUNE=1: each GEMM shape runs the fastest of cuBLASLt's heuristic "
     "candidates, timed at its first call"),
    ("attention_dq_atomic", "ours_bf16_atomic_dq", {"FSDP_CUDA_ATTENTION_DQ": "atomic"},
     "switches the fused CUDA attention",
     "with FSDP_CUDA_ATTENTION_DQ=atomic: the fused attention's backward as FlashAttention-2's "
     "(5 products, dq summed by atomics, not bitwise reproducible) instead of the deterministic 7"),
    ("bias_grad_unfused", "ours_bf16_bias_grad_unfused", {"FSDP_CUDA_BIAS_GRAD_EPILOGUE": "0"},
     "switches a cuBLASLt epilogue",
     "with FSDP_CUDA_BIAS_GRAD_EPILOGUE=0: the Linear layers' bias gradients by the column-sum "
     "kernel after the dW GEMM instead of cuBLASLt's BGRADB epilogue"),
    ("dgelu_bias_grad", "ours_bf16_dgelu_bias_grad", {"FSDP_CUDA_DGELU_BIAS_GRAD": "1"},
     "switches a cuBLASLt epilogue",
     "with FSDP_CUDA_DGELU_BIAS_GRAD=1: the MLP's c_fc bias gradient out of c_proj's "
     "GELU-backward GEMM (DGELU_BGRAD) and c_fc's dW a plain GEMM, instead of BGRADB's "
     "separate reduction"),
    ("attention_narrow", "ours_bf16_attention_narrow",
     {"FSDP_CUDA_ATTENTION_DKDV": "narrow", "FSDP_CUDA_ATTENTION_DQ": "narrow"},
     "switches the fused CUDA attention",
     "with FSDP_CUDA_ATTENTION_DKDV=narrow and FSDP_CUDA_ATTENTION_DQ=narrow: the fused "
     "attention's backward kernels 32 rows a step (more CTAs an SM, the same bits)"),
    ("attention_cudnn", "ours_bf16_attention_cudnn", {"FSDP_CUDA_ATTENTION": "cudnn"},
     "switches the fused CUDA attention",
     "with FSDP_CUDA_ATTENTION=cudnn: cuDNN's fused attention (its runtime-fusion SDPA graphs, "
     "dq summed by atomics) instead of our kernels, where it takes the shapes"),
]


def sync(args):
    if args.device == "cuda":
        torch.cuda.synchronize()


def torch_tokens_per_s(args, autocast_bf16=False, sdpa=False):
    n_layer, n_head, n_embd = PRESETS[args.preset]

    class Config(mingpt_reference.Config):
        pass

    Config.n_layer, Config.n_head, Config.n_embd = n_layer, n_head, n_embd
    Config.sdpa = sdpa
    Config.vocab_size, Config.block_size = args.vocab_size, args.seq_len
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count())
    model = mingpt_reference.GPT(Config).to(args.device)
    model.train()
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    times = []
    for step in range(args.warmup + args.steps):
        idx = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len), device=args.device)
        targets = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len),
                                device=args.device)
        sync(args)
        start = time.perf_counter()
        if autocast_bf16:
            with torch.autocast(args.device, dtype=torch.bfloat16):
                _, loss = model(idx, targets)
        else:
            _, loss = model(idx, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync(args)
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(elapsed)
    return args.batch_size * args.seq_len / statistics.median(times), statistics.median(times)


def ours_tokens_per_s(args, precision, env=None):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        cmd = shlex.split(args.train_cmd) if args.train_cmd else [args.train_binary]
        cmd += [f"--preset={args.preset}", "--data=random", f"--device={args.device}",
               f"--vocab_size={args.vocab_size}", f"--seq_len={args.seq_len}",
               f"--batch_size={args.batch_size}", f"--optimizer={args.optimizer}", "--momentum=0.9",
               "--weight_decay=0", "--grad_clip=0", "--dropout=0", f"--lr={args.lr}",
               f"--precision={precision}", f"--steps={args.warmup + args.steps}",
               f"--metrics_out={metrics}", "--log_every=1000"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, **env) if env else None)
        with open(metrics) as f:
            rows = [json.loads(line) for line in f]
    ms = [r["ms"] for r in rows[args.warmup:]]
    return args.batch_size * args.seq_len / (statistics.median(ms) / 1000), statistics.median(ms) / 1000


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="gopher-44m", choices=sorted(PRESETS))
    p.add_argument("--vocab_size", type=int, default=50257)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=8, help="timed steps (median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--train_binary", default="bazel-bin/models/mingpt/train")
    p.add_argument("--train_cmd", default="",
                   help="command that runs our train binary (e.g. through gpu_bundle/run.sh)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
    p.add_argument("--peak_tflops", type=float, default=0.0,
                   help="dense bf16 peak of the GPU for MFU; 0: from the device's name "
                        "(H100/H200 SXM 989.5, H100 NVL 835, H100 PCIe 756)")
    p.add_argument("--torch_bf16", action="store_true", help="also time torch.autocast bf16")
    p.add_argument("--torch_sdpa", action="store_true",
                   help="also time PyTorch with F.scaled_dot_product_attention (FlashAttention on "
                        "a GPU) in place of minGPT's four attention ops (PyTorch >= 2.0)")
    for flag, _, _, _, help_text in OURS_SWITCHES:
        p.add_argument(f"--{flag}", action="store_true", help=f"(cuda) also time ours {help_text}")
    p.add_argument("--ours_env", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                   help="(cuda) also time ours with these environment variables set, reported as "
                        "ours_bf16_NAME, e.g. all:FSDP_CUDA_GEMM_TUNE=1,"
                        "FSDP_CUDA_BIAS_GRAD_EPILOGUE=0 (repeatable)")
    p.add_argument("--json_out", default="")
    args = p.parse_args()
    extra_runs = []  # (name, env) of --ours_env
    for spec in args.ours_env:
        name, sep, assignments = spec.partition(":")
        pairs = [a.partition("=") for a in assignments.split(",") if a]
        if not sep or not name.isidentifier() or not pairs or any(not k or not eq
                                                                  for k, eq, _ in pairs):
            sys.exit(f"--ours_env={spec}: expected NAME:KEY=VALUE[,KEY=VALUE...] with NAME a "
                     "word (letters, digits, _)")
        extra_runs.append((name, {k: v for k, _, v in pairs}))
    # Ours again with each switch given, then with each --ours_env: (result name, environment).
    ours_runs = [(name, env) for flag, name, env, _, _ in OURS_SWITCHES if getattr(args, flag)]
    ours_runs += [(f"ours_bf16_{name}", env) for name, env in extra_runs]
    if args.device != "cuda":
        for flag, _, _, what, _ in OURS_SWITCHES:
            if getattr(args, flag):
                sys.exit(f"--{flag} {what}: it needs --device cuda")
        if extra_runs:
            sys.exit("--ours_env times the CUDA build: it needs --device cuda")
    if not args.train_cmd and not os.path.exists(args.train_binary):
        sys.exit(f"{args.train_binary} not found: run ./bazelw build //models/mingpt:train first")
    if torch is None:
        sys.exit("bench_vs_pytorch times PyTorch eager beside our binary: it needs PyTorch "
                 "(Debian: apt install python3-torch; or pip install torch)")
    if args.torch_sdpa and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        sys.exit(f"--torch_sdpa needs PyTorch 2.0 or later (F.scaled_dot_product_attention); "
                 f"this is torch {torch.__version__}")

    results = {}
    mfu = {}
    if args.device == "cuda":
        # The GPU comparison: bf16 on both sides.
        peak = peak_tflops(args)  # first: an unknown device stops before the runs
        results["pytorch_autocast_bf16"] = torch_tokens_per_s(args, autocast_bf16=True)
        if args.torch_sdpa:
            results["pytorch_autocast_bf16_sdpa"] = torch_tokens_per_s(args, autocast_bf16=True,
                                                                       sdpa=True)
        results["ours_bf16"] = ours_tokens_per_s(args, "bf16")
        for name, env in ours_runs:  # GEMM tuning runs in the first (warm-up) step
            results[name] = ours_tokens_per_s(args, "bf16", env=env)
        base = results["pytorch_autocast_bf16"][0]
        print(f"device {torch.cuda.get_device_name()}, peak {peak} TFLOP/s bf16, "
              f"{flops_per_token(args) / 1e9:.3f} GFLOP per token")
        for name, (tps, _) in results.items():
            mfu[name] = tps * flops_per_token(args) / (peak * 1e12)
            print(f"{name:28s} MFU {100 * mfu[name]:5.1f}%")
    else:
        results["pytorch_fp32"] = torch_tokens_per_s(args)
        if args.torch_bf16:
            results["pytorch_autocast_bf16"] = torch_tokens_per_s(args, autocast_bf16=True)
        if args.torch_sdpa:
            results["pytorch_fp32_sdpa"] = torch_tokens_per_s(args, sdpa=True)
        results["ours_fp32"] = ours_tokens_per_s(args, "fp32")
        results["ours_bf16"] = ours_tokens_per_s(args, "bf16")
        base = results["pytorch_fp32"][0]
    print(f"{args.preset}, vocab {args.vocab_size}, block {args.seq_len}, batch {args.batch_size}, "
          f"{args.optimizer}, {os.cpu_count()} cores, torch {torch.__version__}, median of {args.steps} steps")
    # "vs PyTorch": against minGPT's eager model as written (the same model);
    # "vs SDPA": against it with PyTorch's fused attention (--torch_sdpa).
    sdpa_name = next((k for k in results if k.endswith("_sdpa")), None)
    sdpa_base = results[sdpa_name][0] if sdpa_name else None
    print(f"{'run':28s} {'s/step':>8s} {'tokens/s':>10s} {'vs PyTorch':>11s}"
          + (f" {'vs SDPA':>8s}" if sdpa_base else ""))
    for name, (tps, sec) in results.items():
        print(f"{name:28s} {sec:8.3f} {tps:10.1f} {tps / base:10.2f}x"
              + (f" {tps / sdpa_base:7.2f}x" if sdpa_base else ""))
    if args.json_out:
        with open(args.json_out, "w") as f:
            rows = {}
            for k, (tps, sec) in results.items():
                rows[k] = {"tokens_per_s": tps, "s_per_step": sec, "ratio": tps / base}
                if sdpa_base:
                    rows[k]["ratio_vs_sdpa"] = tps / sdpa_base
                if k in mfu:
                    rows[k]["mfu"] = mfu[k]
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
