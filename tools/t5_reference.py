#!/usr/bin/python3
"""PyTorch reference for the C++ T5 (models/t5): writes the parity fixtures.

T5 as Hugging Face's T5ForConditionalGeneration computes it, written out in
plain torch operations (transformers is not a Debian package) at a tiny size,
seeded, with one fixed batch that has encoder padding and an ignored target:

  - T5LayerNorm: x * rsqrt(mean(x^2) + eps) * weight (no mean, no bias);
  - attention without the 1/sqrt(d_kv) scaling; the first block of each
    stack owns relative_attention_bias (num_buckets, n_heads), whose bias
    (bucketed memory - query position: both directions in the encoder, only
    the past in the decoder, log-spaced buckets beyond num_buckets / 2 (per
    direction) up to max_distance) every block of the stack adds; padded
    keys get the dtype's lowest value added (the extended attention mask),
    the decoder's future keys too; cross-attention adds only the mask;
  - blocks: x + SelfAttention(norm(x)) [+ EncDecAttention(norm(x), enc)]
    + DenseReluDense(norm(x)): wo(relu(wi x)) (v1.0) or
    wo(gelu_new(wi_0 x) * wi_1 x) (v1.1, gelu_new the tanh form);
  - each stack: the shared embedding, the blocks, final_layer_norm;
  - the head: (dec * d_model^-0.5) @ shared^T when tied (v1.0), lm_head
    otherwise; the loss: mean cross-entropy over the targets that are not
    -100. Dropout is off (the fixture is deterministic).

Two fixtures, one per form: v1.0 (ReLU, tied) and v1.1 (gated GELU, untied),
each a safetensors file holding

  <parameter name>          every weight, f32, under Hugging Face's names
                            (models/t5/config.h ParameterShapes())
  encoder_inputs, encoder_mask, decoder_inputs, decoder_targets
                            the batch, (B, S) / (B, T) i64
  loss                      (1,) the mean cross-entropy
  greedy                    (B, 8) greedy decoding's tokens from the encoder batch
  grad.<parameter name>     dL/dparameter for every parameter

and in __metadata__ the configuration as t5::ParseConfig reads it
("config"), the full-precision loss ("ref.loss") and how the file was made.
The reference values are computed in float64 from the f32 weights; the script
also reruns in float32 and prints how far PyTorch's own f32 results are from
them (the floor of what an f32 implementation can reach).

Regenerate (Debian's python3-torch):

  /usr/bin/python3 tools/t5_reference.py --out_dir models/t5/testdata
"""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mingpt_reference import compare, write_safetensors  # noqa: E402


class Config:
    def __init__(self, name, gated, tied):
        self.name = name
        self.vocab_size = 40
        self.d_model = 16
        self.d_kv = 4
        self.d_ff = 24
        self.num_layers = 2
        self.num_decoder_layers = 3
        self.num_heads = 3  # inner width 12, not d_model
        self.relative_attention_num_buckets = 8
        self.relative_attention_max_distance = 12
        self.layer_norm_epsilon = 1e-6
        self.gated = gated
        self.tied = tied

    def to_string(self):
        """t5::T5Config::ToString()'s form, which t5::ParseConfig reads back."""
        return (f"custom(vocab_size={self.vocab_size}, d_model={self.d_model}, d_kv={self.d_kv}, "
                f"d_ff={self.d_ff}, num_layers={self.num_layers}, "
                f"num_decoder_layers={self.num_decoder_layers}, num_heads={self.num_heads}, "
                f"buckets={self.relative_attention_num_buckets}, "
                f"max_distance={self.relative_attention_max_distance}, "
                f"dropout_rate=0, "
                f"feed_forward_proj={'gated-gelu' if self.gated else 'relu'}, "
                f"tie_word_embeddings={'true' if self.tied else 'false'})")


def parameter_shapes(c):
    """(name, shape) of every parameter in Hugging Face's named_parameters() order."""
    inner = c.num_heads * c.d_kv
    out = [("shared.weight", (c.vocab_size, c.d_model))]

    def attention(prefix, kind, first):
        for p in "qkv":
            out.append((f"{prefix}.{kind}.{p}.weight", (inner, c.d_model)))
        out.append((f"{prefix}.{kind}.o.weight", (c.d_model, inner)))
        if first:
            out.append((f"{prefix}.{kind}.relative_attention_bias.weight",
                        (c.relative_attention_num_buckets, c.num_heads)))
        out.append((f"{prefix}.layer_norm.weight", (c.d_model,)))

    def feed_forward(prefix):
        if c.gated:
            out.append((f"{prefix}.DenseReluDense.wi_0.weight", (c.d_ff, c.d_model)))
            out.append((f"{prefix}.DenseReluDense.wi_1.weight", (c.d_ff, c.d_model)))
        else:
            out.append((f"{prefix}.DenseReluDense.wi.weight", (c.d_ff, c.d_model)))
        out.append((f"{prefix}.DenseReluDense.wo.weight", (c.d_model, c.d_ff)))
        out.append((f"{prefix}.layer_norm.weight", (c.d_model,)))

    for stack, layers in (("encoder", c.num_layers), ("decoder", c.num_decoder_layers)):
        for i in range(layers):
            block = f"{stack}.block.{i}"
            attention(f"{block}.layer.0", "SelfAttention", i == 0)
            if stack == "decoder":
                attention(f"{block}.layer.1", "EncDecAttention", False)
            feed_forward(f"{block}.layer.{2 if stack == 'decoder' else 1}")
        out.append((f"{stack}.final_layer_norm.weight", (c.d_model,)))
    if not c.tied:
        out.append(("lm_head.weight", (c.vocab_size, c.d_model)))
    return out


def make_weights(c, seed):
    """Seeded f32 weights: N(0, 1/sqrt(fan_in)) matrices (lm_head too), the
    embedding and the relative biases N(0, 1) (so that they matter), norm
    weights 1 + N(0, 0.1) (so that they are not 1)."""
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in parameter_shapes(c):
        if name.endswith("layer_norm.weight"):
            w = 1 + 0.1 * torch.randn(shape, generator=g)
        elif "relative_attention_bias" in name:
            w = torch.randn(shape, generator=g)
        elif name == "shared.weight":
            w = torch.randn(shape, generator=g)
        else:
            w = torch.randn(shape, generator=g) / math.sqrt(shape[1])
        weights[name] = w.float()
    return weights


def make_batch():
    """B 2, S 9, T 6: the second example's last 3 encoder positions are padding
    (pad id 0), one decoder target is ignored (-100)."""
    g = torch.Generator().manual_seed(5)
    encoder_inputs = torch.randint(2, 40, (2, 9), generator=g)
    encoder_mask = torch.ones(2, 9, dtype=torch.long)
    encoder_mask[1, 6:] = 0
    encoder_inputs[1, 6:] = 0
    decoder_targets = torch.randint(2, 40, (2, 6), generator=g)
    decoder_inputs = torch.cat([torch.zeros(2, 1, dtype=torch.long), decoder_targets[:, :-1]], 1)
    decoder_targets[0, 4] = -100
    return encoder_inputs, encoder_mask, decoder_inputs, decoder_targets


def relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """Mesh TensorFlow's bucketing of memory_position - query_position."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets
        n = relative_position.abs()
    else:
        n = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    # float32, as Hugging Face computes it; n = 0 gives -inf here, not used.
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(n < max_exact, n, large)


def position_bias(c, table, q_len, k_len, bidirectional):
    """(1, H, q_len, k_len) from the (num_buckets, H) table."""
    rel = torch.arange(k_len)[None, :] - torch.arange(q_len)[:, None]
    b = relative_position_bucket(rel, bidirectional, c.relative_attention_num_buckets,
                                 c.relative_attention_max_distance)
    return table[b].permute(2, 0, 1).unsqueeze(0)


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def attention(c, W, prefix, x, kv, bias):
    """x (B, T, d), kv (B, S, d), bias (B or 1, H, T, S) -> (B, T, d)."""
    B, T, _ = x.shape
    S = kv.shape[1]

    def heads(t, n):  # (B, n, H * d_kv) -> (B, H, n, d_kv)
        return t.view(B, n, c.num_heads, c.d_kv).transpose(1, 2)

    q = heads(x @ W[prefix + ".q.weight"].T, T)
    k = heads(kv @ W[prefix + ".k.weight"].T, S)
    v = heads(kv @ W[prefix + ".v.weight"].T, S)
    p = torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1)  # (B, H, T, S), no scaling
    out = (p @ v).transpose(1, 2).reshape(B, T, c.num_heads * c.d_kv)
    return out @ W[prefix + ".o.weight"].T


def gelu_new(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))))


def feed_forward(c, W, prefix, x):
    d = prefix + ".DenseReluDense."
    if c.gated:
        h = gelu_new(x @ W[d + "wi_0.weight"].T) * (x @ W[d + "wi_1.weight"].T)
    else:
        h = torch.relu(x @ W[d + "wi.weight"].T)
    return h @ W[d + "wo.weight"].T


def logits_of(c, W, encoder_inputs, encoder_mask, decoder_inputs):
    """-> logits (B, T, V), in the weights' dtype."""
    eps = c.layer_norm_epsilon
    lowest = torch.finfo(W["shared.weight"].dtype).min
    S, T = encoder_inputs.shape[1], decoder_inputs.shape[1]
    # (B, 1, 1, S): 0 for a key, the lowest value for padding (Hugging Face's
    # extended attention mask).
    dtype = W["shared.weight"].dtype
    key_mask = (1 - encoder_mask[:, None, None, :]).to(dtype) * lowest
    future = torch.triu(torch.full((T, T), lowest, dtype=dtype), diagonal=1)

    h = W["shared.weight"][encoder_inputs]
    enc_bias = position_bias(c, W["encoder.block.0.layer.0.SelfAttention.relative_attention_bias"
                                  ".weight"], S, S, True) + key_mask
    for i in range(c.num_layers):
        b = f"encoder.block.{i}.layer."
        h = h + attention(c, W, b + "0.SelfAttention", *[rms_norm(h, W[b + "0.layer_norm.weight"],
                                                                  eps)] * 2, enc_bias)
        h = h + feed_forward(c, W, b + "1", rms_norm(h, W[b + "1.layer_norm.weight"], eps))
    enc = rms_norm(h, W["encoder.final_layer_norm.weight"], eps)

    h = W["shared.weight"][decoder_inputs]
    dec_bias = position_bias(c, W["decoder.block.0.layer.0.SelfAttention.relative_attention_bias"
                                  ".weight"], T, T, False) + future
    for i in range(c.num_decoder_layers):
        b = f"decoder.block.{i}.layer."
        y = rms_norm(h, W[b + "0.layer_norm.weight"], eps)
        h = h + attention(c, W, b + "0.SelfAttention", y, y, dec_bias)
        y = rms_norm(h, W[b + "1.layer_norm.weight"], eps)
        h = h + attention(c, W, b + "1.EncDecAttention", y, enc, key_mask)
        h = h + feed_forward(c, W, b + "2", rms_norm(h, W[b + "2.layer_norm.weight"], eps))
    dec = rms_norm(h, W["decoder.final_layer_norm.weight"], eps)

    if c.tied:
        return (dec * c.d_model ** -0.5) @ W["shared.weight"].T
    return dec @ W["lm_head.weight"].T


def forward(c, W, encoder_inputs, encoder_mask, decoder_inputs, decoder_targets):
    """-> (loss, logits (B, T, V)), in the weights' dtype."""
    logits = logits_of(c, W, encoder_inputs, encoder_mask, decoder_inputs)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c.vocab_size),
                                             decoder_targets.reshape(-1), ignore_index=-100)
    return loss, logits


def greedy(c, weights, encoder_inputs, encoder_mask, steps):
    """Greedy decoding (generate with num_beams=1, do_sample=False, no EOS) from
    decoder start id 0, in float64: (B, steps) new tokens, and the smallest gap
    between a step's best and second-best logit (how safe the choice is)."""
    W = {k: v.double() for k, v in weights.items()}
    dec = torch.zeros(encoder_inputs.shape[0], 1, dtype=torch.long)
    gap = float("inf")
    with torch.no_grad():
        for _ in range(steps):
            last = logits_of(c, W, encoder_inputs, encoder_mask, dec)[:, -1]  # (B, V)
            top = last.topk(2, dim=-1).values
            gap = min(gap, (top[:, 0] - top[:, 1]).min().item())
            dec = torch.cat([dec, last.argmax(-1, keepdim=True)], 1)
    return dec[:, 1:], gap


def run(c, weights, batch, dtype):
    W = {k: v.to(dtype).requires_grad_(True) for k, v in weights.items()}
    loss, logits = forward(c, W, *batch)
    loss.backward()
    return loss.detach(), logits.detach(), {k: v.grad.detach() for k, v in W.items()}


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out_dir", required=True, help="where the two .safetensors go")
    args = parser.parse_args(argv)
    batch = make_batch()
    names = ["encoder_inputs", "encoder_mask", "decoder_inputs", "decoder_targets"]
    for file_name, c in (("t5_v1_0_reference.safetensors", Config("v1.0", False, True)),
                         ("t5_v1_1_reference.safetensors", Config("v1.1", True, False))):
        weights = make_weights(c, seed=1 if c.tied else 2)
        loss, logits, grads = run(c, weights, batch, torch.float64)
        loss32, logits32, grads32 = run(c, weights, batch, torch.float32)
        worst = max([compare(loss32, loss)[0], compare(logits32, logits)[0]] +
                    [compare(grads32[k], grads[k])[0] for k in grads])
        tokens, gap = greedy(c, weights, batch[0], batch[1], 8)
        print(f"{c.name}: loss {loss.item():.10f}; PyTorch's own float32 run uses "
              f"{100 * worst:.1f}% of the C++ test's tolerance; greedy {tokens.tolist()}, "
              f"smallest logit gap {gap:.3g}")
        tensors = [(name, w) for name, w in weights.items()]
        tensors += [(name, t) for name, t in zip(names, batch)]
        tensors += [("loss", loss.float().reshape(1)), ("greedy", tokens)]
        tensors += [("grad." + name, grads[name].float()) for name in weights]
        write_safetensors(os.path.join(args.out_dir, file_name), tensors, {
            "config": c.to_string(),
            "ref.loss": repr(loss.item()),
            "made_by": "tools/t5_reference.py (float64 reference from the f32 weights, torch "
                       + torch.__version__ + ")",
        })


if __name__ == "__main__":
    main(sys.argv[1:])
