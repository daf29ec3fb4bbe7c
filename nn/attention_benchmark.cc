// Benchmarks of the attention layers on the CPU: CausalSelfAttention forward
// and forward + backward at GPT-2 shapes (f32 and bf16 weights), the attention
// core alone (scores, softmax, mixing: the part beyond the projections;
// with and without attention dropout), T5 cross-attention with a padding
// mask, and the attention's dropout (forward: dense against causal
// probabilities; backward: its mask regenerated once or twice). Counters: GFLOP/s of the matmuls,
// Melem/s of the dropout.
//
//   ./bazelw run -c opt //nn:attention_benchmark -- --benchmark_min_time=0.5
#include <cstdint>

#include "benchmark/benchmark.h"
#include "nn/attention.h"
#include "nn/attention_core.h"
#include "nn/attention_t5.h"
#include "tensor/ops/dropout.h"
#include "tensor/ops/softmax.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::testing::RandomTensor;

// Matmul FLOPs of one CausalSelfAttention forward: projections 2*B*T*C*(3C + C)
// plus scores and mixing 2 * 2*B*T*T*C (the causal half is computed too).
double ForwardFlops(int64_t b, int64_t t, int64_t c) {
  return 2.0 * b * t * c * 4.0 * c + 4.0 * b * t * t * c;
}

// Args: B, T, C, n_head, bf16 (0/1), backward (0/1).
void BM_CausalSelfAttention(benchmark::State& state) {
  const int64_t b = state.range(0), t = state.range(1), c = state.range(2), nh = state.range(3);
  const bool bf16 = state.range(4) != 0, backward = state.range(5) != 0;
  CausalSelfAttention attn(c, nh, 0.0f, 0.0f);
  attn.Materialize(1);
  if (bf16) {
    for (auto& [name, p] : attn.NamedParameters()) p->value = p->value.To(Dtype::kBF16);
  }
  const Tensor x = RandomTensor({b, t, c}, 2, -1, 1, bf16 ? Dtype::kBF16 : Dtype::kF32);
  const Tensor g = RandomTensor({b, t, c}, 3, -1, 1, bf16 ? Dtype::kBF16 : Dtype::kF32);
  Context ctx;
  for (auto _ : state) {
    Tensor y = attn.Run(x, ctx);
    benchmark::DoNotOptimize(y.raw_data());
    if (backward) {
      benchmark::DoNotOptimize(attn.RunBackward(g, ctx).raw_data());
    } else {
      ctx.Clear();
    }
  }
  const double flops = ForwardFlops(b, t, c) * (backward ? 3.0 : 1.0);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_CausalSelfAttention)
    ->ArgNames({"B", "T", "C", "nh", "bf16", "bwd"})
    ->Args({4, 256, 768, 12, 0, 0})
    ->Args({4, 256, 768, 12, 0, 1})
    ->Args({4, 256, 768, 12, 1, 0})
    ->Args({4, 256, 768, 12, 1, 1})
    ->Args({1, 1024, 768, 12, 0, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The core alone on q, k, v views of a fused (B, T, 3C) tensor.
// Args: B, T, C, n_head, backward, attention dropout (percent).
void BM_AttentionCore(benchmark::State& state) {
  const int64_t b = state.range(0), t = state.range(1), c = state.range(2), nh = state.range(3);
  const bool backward = state.range(4) != 0;
  const float dropout = static_cast<float>(state.range(5)) / 100.0f;
  const Tensor qkv = RandomTensor({b, t, 3 * c}, 4);
  const Tensor q = SplitHeads(qkv.Narrow(2, 0, c), nh);
  const Tensor k = SplitHeads(qkv.Narrow(2, c, c), nh);
  const Tensor v = SplitHeads(qkv.Narrow(2, 2 * c, c), nh);
  const Tensor g = RandomTensor({b, nh, t, c / nh}, 5);
  AttentionOptions opts;
  opts.scale = 0.125f;
  opts.causal = true;
  opts.dropout = dropout;
  opts.training = true;
  tensor::Generator gen(1);
  for (auto _ : state) {
    AttentionState st;
    Tensor y = AttentionForward(q, k, v, Tensor(), Tensor(), opts, gen, &st);
    benchmark::DoNotOptimize(y.raw_data());
    if (backward) benchmark::DoNotOptimize(AttentionBackward(g, st).dq.raw_data());
  }
  const double flops = 4.0 * b * t * t * c * (backward ? 3.0 : 1.0);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionCore)
    ->ArgNames({"B", "T", "C", "nh", "bwd", "drop%"})
    ->Args({4, 256, 768, 12, 0, 0})
    ->Args({4, 256, 768, 12, 1, 0})
    ->Args({4, 256, 768, 12, 0, 10})
    ->Args({4, 256, 768, 12, 1, 10})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The attention backward's two uses of its dropout's mask (the dropped
// probabilities, the gradient through the dropout) on (B, nh, T, T) f32:
// regenerated for each (two DropoutBackward calls, as before) against once
// for both (DropoutBackwardOfBoth), on dense and on causal probabilities
// (whose +0 blocks above the diagonal still generate their mask: the
// gradient is not 0 there; not generating it measured no gain, 3.24 vs
// 3.11 ms on 2026-11-26, as the op is bound by memory). Args: B, nh, T,
// both (0/1), causal (0/1).
void BM_AttentionDropoutBackward(benchmark::State& state) {
  const int64_t b = state.range(0), nh = state.range(1), t = state.range(2);
  const bool both = state.range(3) != 0;
  Tensor probs = RandomTensor({b, nh, t, t}, 9, 0.1, 1.0);
  if (state.range(4) != 0) {
    tensor::SoftmaxOptions sm;
    sm.causal = true;
    tensor::SoftmaxInto(probs, probs, sm);
  }
  const Tensor dprobs = RandomTensor({b, nh, t, t}, 10);
  tensor::Generator gen(1);
  const tensor::DropoutState drop = tensor::DrawDropoutState(probs.numel(), 0.1f, gen, true);
  for (auto _ : state) {
    if (both) {
      const auto [a, g] = tensor::DropoutBackwardOfBoth(probs, dprobs, drop);
      benchmark::DoNotOptimize(a.raw_data());
      benchmark::DoNotOptimize(g.raw_data());
    } else {
      benchmark::DoNotOptimize(tensor::DropoutBackward(probs, drop).raw_data());
      benchmark::DoNotOptimize(tensor::DropoutBackward(dprobs, drop).raw_data());
    }
  }
  state.counters["Melem/s"] = benchmark::Counter(2e-6 * static_cast<double>(probs.numel()),
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
// The attention forward's dropout on (B, nh, T, T) f32 probabilities: dense
// against causal (zero above the diagonal, where blocks of +0 generate no
// mask). Args: B, nh, T, causal (0/1).
void BM_AttentionDropoutForward(benchmark::State& state) {
  const int64_t b = state.range(0), nh = state.range(1), t = state.range(2);
  Tensor probs = RandomTensor({b, nh, t, t}, 11, 0.1, 1.0);
  if (state.range(3) != 0) {
    tensor::SoftmaxOptions sm;
    sm.causal = true;
    tensor::SoftmaxInto(probs, probs, sm);
  }
  tensor::Generator gen(1);
  for (auto _ : state) {
    benchmark::DoNotOptimize(tensor::Dropout(probs, 0.1f, gen).y.raw_data());
  }
  state.counters["Melem/s"] = benchmark::Counter(1e-6 * static_cast<double>(probs.numel()),
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionDropoutForward)
    ->ArgNames({"B", "nh", "T", "causal"})
    ->Args({4, 12, 256, 0})
    ->Args({4, 12, 256, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_AttentionDropoutBackward)
    ->ArgNames({"B", "nh", "T", "both", "causal"})
    ->Args({4, 12, 256, 0, 0})
    ->Args({4, 12, 256, 1, 0})
    ->Args({4, 12, 256, 1, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// T5 cross-attention (t5-small: d_model 512, 8 heads of 64) with encoder padding.
void BM_T5CrossAttention(benchmark::State& state) {
  const int64_t b = 4, t = 128, s = 256, d = 512;
  T5AttentionOptions o;
  o.cross_attention = true;
  T5Attention attn(d, 8, 64, o);
  attn.Materialize(1);
  const Tensor x = RandomTensor({b, t, d}, 6);
  const Tensor enc = RandomTensor({b, s, d}, 7);
  Tensor mask = Tensor::Full({b, s}, 1.0);
  const Tensor g = RandomTensor({b, t, d}, 8);
  Context ctx;
  for (auto _ : state) {
    Tensors y = attn.Run(Tensors{x, enc, Tensor(), mask}, ctx);
    benchmark::DoNotOptimize(y[0].raw_data());
    benchmark::DoNotOptimize(attn.RunBackward(Tensors{g}, ctx)[0].raw_data());
  }
}
BENCHMARK(BM_T5CrossAttention)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace nn

BENCHMARK_MAIN();
