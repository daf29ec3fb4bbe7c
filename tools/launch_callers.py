#!/usr/bin/env python3
"""Who launches a kernel, under the CUDA emulation (--config=cuda_emu).

The emulation's launch census (CUDA_EMU_LAUNCH_CENSUS=1) counts launches per kernel name;
this says where they come from. It runs a binary under gdb with a breakpoint on the
emulation's count of launches of KERNEL (its census name), takes each launch's stack, drops
the emulation's, the standard library's and the module plumbing's frames, and prints the
call chains (the first --depth frames left, innermost first) with their counts, most first.
CUDA_EMU_KERNELS=skip is set, so kernels compute nothing and a gpt2 step takes about a second.

  tools/launch_callers.py StridedCopyKernel -- bazel-bin/models/t5/train --device=cuda ...
  tools/launch_callers.py StridedCopyKernel --gdb_log gdb.txt   # a saved gdb output

The binary needs its symbols (Bazel's -c opt keeps them: no -g needed), and gdb.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Frames that say nothing about the caller: the emulation, the standard library, Abseil's
# function references, the module tree's frames and the launch helpers' lambdas.
SKIPPED = [
    re.compile(p) for p in (
        r"^cuda_emu::",
        r"^std::",
        r"^absl::.*functional_internal",
        r"^nn::Module::(Run|RunBackward|RunFrame|RunBackwardFrame)$",
        r"\{lambda\(",
        r"^\?\?$",
    )
]


def function_name(frame):
    """The function of a gdb backtrace line ('#3  0x... in f(int) () at x.cc:1'), no arguments."""
    text = re.sub(r"^#\d+\s+", "", frame.strip())
    text = re.sub(r"^0x[0-9a-f]+ in ", "", text)
    text = re.sub(r" (at|from) \S+$", "", text)  # source or library
    text = re.sub(r" \((\.\.\.)?\)$", "", text)  # the frame's arguments: " ()" or " (...)"
    # The parameter list: the last balanced parenthesis group (names hold others:
    # "(anonymous namespace)", template arguments).
    if text.endswith(")") or text.endswith(") const"):
        end = text.rfind(")")
        depth = 0
        for i in range(end, -1, -1):
            if text[i] == ")":
                depth += 1
            elif text[i] == "(":
                depth -= 1
                if depth == 0:
                    text = text[:i]
                    break
    return text.strip()


def stacks(log):
    """The backtraces in gdb's output: lists of frame lines, one list per '#0' line."""
    out = []
    for line in log.splitlines():
        if re.match(r"^#0\s", line):
            out.append([line])
        elif re.match(r"^#\d+\s", line) and out:
            out[-1].append(line)
    return out


def chains(log, depth):
    counts = collections.Counter()
    for stack in stacks(log):
        names = [function_name(f) for f in stack]
        kept = [n for n in names if not any(p.search(n) for p in SKIPPED)]
        counts[" < ".join(kept[:depth]) or "(no caller outside the emulation)"] += 1
    return counts


def run_gdb(kernel, command, frames):
    gdb = shutil.which("gdb")
    if gdb is None:
        sys.exit("launch_callers: gdb is not installed (apt-get install gdb)")
    if not command:
        sys.exit("launch_callers: give the binary and its arguments after --")
    script = "\n".join([
        "set pagination off",
        "set print frame-arguments none",
        "set breakpoint pending on",
        # The first argument (the kernel's name) is in rdi: no debug info needed.
        f'break cuda_emu::CountLaunch if $_streq((char*)$rdi, "{kernel}")',
        "commands",
        "silent",
        f"bt {frames}",
        "continue",
        "end",
        "run",
        "",
    ])
    with tempfile.NamedTemporaryFile("w", suffix=".gdb", delete=False) as f:
        f.write(script)
        path = f.name
    env = dict(os.environ, CUDA_EMU_KERNELS=os.environ.get("CUDA_EMU_KERNELS", "skip"))
    try:
        done = subprocess.run([gdb, "-batch", "-x", path, "--args"] + command, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finally:
        os.unlink(path)
    if "CountLaunch" not in done.stdout and "Breakpoint 1" not in done.stdout:
        sys.exit("launch_callers: gdb found no cuda_emu::CountLaunch: is the binary built with "
                 "--config=cuda_emu?\n" + done.stdout[-2000:])
    return done.stdout


def main():
    argv = sys.argv[1:]
    command = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernel", help="the kernel's census name, e.g. StridedCopyKernel")
    parser.add_argument("--depth", type=int, default=4, help="frames of a chain (default 4)")
    parser.add_argument("--gdb_log", help="read this saved gdb output instead of running gdb")
    args = parser.parse_args(argv)
    if args.depth < 1:
        parser.error("--depth must be at least 1")
    if args.gdb_log:
        with open(args.gdb_log) as f:
            log = f.read()
    else:
        log = run_gdb(args.kernel, command, frames=args.depth + 24)
    counts = chains(log, args.depth)
    total = sum(counts.values())
    if total == 0:
        sys.exit(f"launch_callers: no launch of {args.kernel} (is it the census's name?)")
    print(f"{args.kernel}: {total} launches from {len(counts)} call chains (innermost first)")
    for chain, n in counts.most_common():
        print(f"{n:8d}  {chain}")


if __name__ == "__main__":
    main()
