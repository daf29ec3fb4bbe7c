#!/usr/bin/python3
"""PyTorch reference for the C++ minGPT (models/mingpt): writes the parity fixture.

A faithful copy of Karpathy's minGPT (mingpt/model.py: CausalSelfAttention with
c_attn/c_proj, Block with ln_1/attn/ln_2/mlp.c_fc/mlp.c_proj and NewGELU in its
tanh form, GPT with transformer.wte/wpe/drop/h/ln_f and an untied lm_head
without bias) at a tiny size, seeded, with one fixed batch. It writes one
safetensors file holding:

  <parameter name>          every weight, f32, under the model's state_dict
                            names, which are Hugging Face GPT-2's names and
                            exactly models/mingpt/config.cc ParameterShapes()
  idx, targets              the batch, (B, T) i64
  loss                      (1,) mean cross-entropy of the batch
  grad.<parameter name>     dL/dparameter for every parameter
  sgd_losses                (3,) the loss before each of three SGD steps
                            (torch.optim.SGD, options in the metadata;
                            weight decay only on nn.Linear weights, as our
                            nn::Parameter::weight_decay)
  sgd_final_loss            (1,) the loss after the third step

and, in __metadata__ (strings), the config, the SGD options, the list of
decayed parameters, how the file was made, and the three scalar results at
full precision ("ref.loss", "ref.sgd_losses", "ref.sgd_final_loss": the
tensors above hold them rounded to f32). The fixture's weights are f32;
the reference values are computed in float64 from those f32 weights
(--dtype float64, the default), so they carry no float32 rounding of their
own. The script also reruns everything in float32 and prints how far PyTorch's
own f32 results are from the f64 ones: that is the floor of what an f32
implementation (ours) can be expected to reach.

The `safetensors` package is not needed: the file is written by hand
(8-byte little-endian header length, JSON header, raw little-endian data), with
the CRC-32C of the data section in the metadata ("fsdp.crc32c") that
tensor/safetensors.cc checks on read.

Regenerate (Debian's python3-torch; /usr/bin/python3 because another python3
may come first in PATH):

  /usr/bin/python3 tools/mingpt_reference.py \
      --out models/mingpt/testdata/tiny_gpt_reference.safetensors

The output is deterministic for a given PyTorch build (CPU, seeded).
The C++ side is models/mingpt/parity_test.cc.
"""

import argparse
import json
import math
import struct
import sys

import torch
import torch.nn as nn
from torch.nn import functional as F


# ---------------------------------------------------------------------------
# minGPT (Karpathy, mingpt/model.py), unchanged in structure and names.


class NewGELU(nn.Module):
    """GELU, tanh approximation (as in Google BERT / OpenAI GPT)."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(
            math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # key, query, value projections for all heads, but in a batch
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        # output projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        # regularization
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        # causal mask to ensure that attention is only applied to the left in the input sequence
        self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size))
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        # Not minGPT's: PyTorch's fused attention (FlashAttention on a GPU) in
        # place of the four ops below, for a stronger eager baseline
        # (bench_vs_pytorch.py --torch_sdpa; PyTorch 2.0 or later).
        self.sdpa = getattr(config, "sdpa", False)

    def forward(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)
        # calculate query, key, values for all heads in batch and move head forward to be the batch dim
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        if self.sdpa:
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0, is_causal=True)
        else:
            # causal self-attention; Self-attend: (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        # output projection
        y = self.resid_dropout(self.c_proj(y))
        return y


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)  # eps 1e-5
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.ModuleDict(dict(
            c_fc=nn.Linear(config.n_embd, 4 * config.n_embd),
            c_proj=nn.Linear(4 * config.n_embd, config.n_embd),
            act=NewGELU(),
            dropout=nn.Dropout(config.resid_pdrop),
        ))
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))  # MLP forward

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlpf(self.ln_2(x))
        return x


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.block_size = config.block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.embd_pdrop),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device).unsqueeze(0)  # (1, t)
        tok_emb = self.transformer.wte(idx)  # (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # (1, t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss


class Config:
    n_layer = 2
    n_head = 2
    n_embd = 16
    vocab_size = 37
    block_size = 8
    embd_pdrop = 0.0
    resid_pdrop = 0.0
    attn_pdrop = 0.0


B, T = 3, 8
SEED = 1234
SGD_OPTIONS = dict(lr=0.1, momentum=0.9, dampening=0.0, nesterov=False, weight_decay=0.01)
SGD_STEPS = 3


def parameters(model):
    """(name, parameter) in registration order, the buffers (attn.bias) left out."""
    return list(model.named_parameters())


def decayed_names(model):
    """Weight decay only on nn.Linear weights, as our nn::Parameter::weight_decay
    (Linear weights true; biases, LayerNorm and Embedding weights false)."""
    out = set()
    for mn, m in model.named_modules():
        for pn, _ in m.named_parameters(recurse=False):
            if isinstance(m, nn.Linear) and pn == "weight":
                out.add(f"{mn}.{pn}" if mn else pn)
    return out


def make_weights(config):
    """Seeded f32 weights. Not minGPT's N(0, 0.02) init: larger, so that the
    attention is far from uniform and every parameter (biases and LayerNorm
    affine parameters included) has a visible effect on the loss."""
    model = GPT(config)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in parameters(model):
            if name.endswith("wte.weight") or name.endswith("wpe.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "ln_" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:  # Linear weights (out, in)
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
    weights = {n: p.detach().clone().float() for n, p in parameters(model)}
    idx = torch.randint(0, config.vocab_size, (B, T), generator=g, dtype=torch.long)
    targets = torch.randint(0, config.vocab_size, (B, T), generator=g, dtype=torch.long)
    return weights, idx, targets


def run(config, weights, idx, targets, dtype):
    """Loss, gradients and the SGD trajectory, computed in `dtype` from the f32 weights."""
    model = GPT(config)
    model.load_state_dict({**model.state_dict(), **weights})
    model.to(dtype)
    model.train()  # dropout is 0: train and eval mode agree

    _, loss = model(idx, targets)
    loss.backward()
    out = {"loss": loss.detach().reshape(1).clone()}
    for n, p in parameters(model):
        out["grad." + n] = p.grad.detach().clone()

    decay = decayed_names(model)
    groups = [
        {"params": [p for n, p in parameters(model) if n in decay],
         "weight_decay": SGD_OPTIONS["weight_decay"]},
        {"params": [p for n, p in parameters(model) if n not in decay], "weight_decay": 0.0},
    ]
    opt = torch.optim.SGD(groups, lr=SGD_OPTIONS["lr"], momentum=SGD_OPTIONS["momentum"],
                          dampening=SGD_OPTIONS["dampening"], nesterov=SGD_OPTIONS["nesterov"])
    losses = []
    for _ in range(SGD_STEPS):
        opt.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    with torch.no_grad():
        _, final = model(idx, targets)
    out["sgd_losses"] = torch.tensor(losses, dtype=dtype)
    out["sgd_final_loss"] = final.detach().reshape(1).clone()
    return out, sorted(decay)


# ---------------------------------------------------------------------------
# safetensors, by hand.

def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data, crc=0):
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


_DTYPES = {torch.float32: ("F32", "<f4"), torch.int64: ("I64", "<i8")}


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, tensor) (f32 or i64), written in this order."""
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        dtype_name, np_dtype = _DTYPES[t.dtype]
        raw = t.numpy().astype(np_dtype, copy=False).tobytes()  # little-endian
        header[name] = {"dtype": dtype_name, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    data = b"".join(blobs)
    meta = dict(metadata)
    meta["fsdp.crc32c"] = "%08x" % crc32c(data)
    header["__metadata__"] = {k: str(v) for k, v in sorted(meta.items())}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((-(8 + len(text))) % 8)  # align the data section to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)


# ---------------------------------------------------------------------------

RTOL, ATOL = 1e-4, 1e-6  # the C++ test's criterion: |a - b| <= ATOL + RTOL * |b|


def compare(a, b):
    """(max |a-b| / (ATOL + RTOL |b|) (<= 1 passes), max relative error over the
    elements with |b| >= 1e-3, max |a-b|), in float64."""
    a, b = a.double().flatten(), b.double().flatten()
    err = (a - b).abs()
    big = b.abs() >= 1e-3
    rel = (err[big] / b[big].abs()).max().item() if big.any() else 0.0
    return (err / (ATOL + RTOL * b.abs())).max().item(), rel, err.max().item()


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the .safetensors file to write")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                        help="precision of the reference values (the weights are f32 either way)")
    args = parser.parse_args(argv)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    config = Config()
    weights, idx, targets = make_weights(config)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    ref, decay = run(config, weights, idx, targets, dtype)
    other, _ = run(config, weights, idx, targets,
                   torch.float32 if dtype == torch.float64 else torch.float64)

    print(f"loss {ref['loss'].item():.8f}  sgd_losses {ref['sgd_losses'].tolist()}  "
          f"final {ref['sgd_final_loss'].item():.8f}")
    print("the other precision vs the reference: tolerance used (max |a-b|/(1e-6+1e-4|b|)),"
          " max rel error where |ref| >= 1e-3, max abs error:")
    for k in ref:
        used, rel, err = compare(other[k], ref[k])
        print(f"  {k:42s} {used:9.2e} {rel:9.2e} {err:9.2e}")

    tensors = [(n, w) for n, w in weights.items()]
    tensors += [("idx", idx), ("targets", targets)]
    tensors += [(k, v.float()) for k, v in ref.items()]
    metadata = {
        "format": "mingpt parity fixture; see tools/mingpt_reference.py",
        "generator": "tools/mingpt_reference.py --out <this file>",
        "torch_version": torch.__version__,
        "reference_dtype": args.dtype,
        "seed": SEED,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_embd": config.n_embd,
        "vocab_size": config.vocab_size,
        "block_size": config.block_size,
        "dropout": config.resid_pdrop,
        "batch": f"{B},{T}",
        "sgd.lr": SGD_OPTIONS["lr"],
        "sgd.momentum": SGD_OPTIONS["momentum"],
        "sgd.dampening": SGD_OPTIONS["dampening"],
        "sgd.nesterov": int(SGD_OPTIONS["nesterov"]),
        "sgd.weight_decay": SGD_OPTIONS["weight_decay"],
        "sgd.steps": SGD_STEPS,
        "sgd.decayed": ",".join(decay),
        "param_names": ",".join(weights.keys()),
        # The scalars at full precision (the tensors hold them rounded to f32).
        "ref.loss": repr(ref["loss"].item()),
        "ref.sgd_losses": ",".join(repr(x) for x in ref["sgd_losses"].tolist()),
        "ref.sgd_final_loss": repr(ref["sgd_final_loss"].item()),
    }
    write_safetensors(args.out, tensors, metadata)
    print(f"wrote {args.out}: {len(tensors)} tensors")


if __name__ == "__main__":
    main(sys.argv[1:])
