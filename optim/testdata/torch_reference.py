#!/usr/bin/env python3
"""Prints reference values for optim/{sgd,adamw}_test.cc from PyTorch.

Run with Debian's python3-torch (1.13): `python3 optim/testdata/torch_reference.py`.
A (2, 3) fp32 parameter is stepped 4 times by torch.optim.SGD / AdamW with the
gradients below; the parameter after each step is printed as C++ initializers,
which the tests hard-code (kTorch... arrays).
"""
import torch

INIT = [0.5, -1.25, 2.0, 0.0, -0.75, 1.5]
STEPS = 4


def grad_at(t):
    # Exactly representable in fp32; the C++ tests compute the same values.
    return [((i * 7 + t * 3) % 11 - 5) / 8.0 for i in range(6)]


def run(name, make_opt):
    p = torch.nn.Parameter(torch.tensor(INIT, dtype=torch.float32).reshape(2, 3))
    opt = make_opt([p])
    rows = []
    for t in range(1, STEPS + 1):
        p.grad = torch.tensor(grad_at(t), dtype=torch.float32).reshape(2, 3)
        opt.step()
        rows.append(", ".join("%.9gf" % v for v in p.detach().reshape(-1).tolist()))
    print("// %s" % name)
    print("{{" + "},\n {".join(rows) + "}},")


run("sgd lr=0.1", lambda ps: torch.optim.SGD(ps, lr=0.1))
run("sgd lr=0.1 momentum=0.9", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
run("sgd lr=0.1 momentum=0.9 dampening=0.5 weight_decay=0.01",
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.5, weight_decay=0.01))
run("sgd lr=0.1 momentum=0.9 nesterov weight_decay=0.01",
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01))
run("adamw lr=0.01 betas=(0.9,0.95) eps=1e-8 weight_decay=0.1",
    lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1))
run("adamw lr=0.05 betas=(0.8,0.99) eps=1e-3 weight_decay=0",
    lambda ps: torch.optim.AdamW(ps, lr=0.05, betas=(0.8, 0.99), eps=1e-3, weight_decay=0.0))
