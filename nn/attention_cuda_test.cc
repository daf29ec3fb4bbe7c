// The attention core on CUDA (the fused flash-attention kernels behind
// AttentionForward / AttentionBackward) against the CPU path: outputs and
// gradients at several (B, nh, T, hs) with q, k, v viewed out of a fused qkv
// projection as minGPT does; memory O(T) from the ledger; bias, dropout and a
// key padding mask in the fused kernels, other head sizes on the unfused GPU
// path. Tagged gpu; skips without a device.
//
// Tolerances: the CPU reference runs in f32 on exactly the rounded inputs, so
// the difference is the GPU's roundings: |gpu - cpu| <= tol * (max|cpu| +
// |cpu|) with tol 2e-2 for bf16 (unit roundoff 2^-9: one rounding of the
// result plus the probabilities and dS rounded before their tensor-core
// products, a few roundoffs of the largest value) and 5e-3 for f16 (2^-11).
#include <cmath>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nn/attention_core.h"
#include "tensor/cuda/attention.h"
#include "tensor/cuda/testing.h"
#include "tensor/memory_ledger.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Device;
using tensor::Dtype;
using tensor::MemoryCategory;
using tensor::cuda::testing::NearScaled;
using tensor::cuda::testing::ToGpu;
using tensor::testing::RandomTensor;

// q, k, v (B, nh, T, hs) as heads of a fused qkv (B, T, 3C), C = nh * hs.
struct Heads {
  Tensor q, k, v;
};
Heads SplitQkv(const Tensor& qkv, int64_t nh) {
  const int64_t c = qkv.dim(2) / 3;
  return {SplitHeads(qkv.Narrow(2, 0, c), nh), SplitHeads(qkv.Narrow(2, c, c), nh),
          SplitHeads(qkv.Narrow(2, 2 * c, c), nh)};
}

struct Case {
  int64_t b, nh, t, hs;
};

TEST(AttentionCudaTest, CausalForwardAndBackwardMatchTheCpuPath) {
  SKIP_WITHOUT_GPU();
  const std::vector<Case> cases = {
      {2, 2, 1, 64}, {1, 2, 17, 64}, {2, 2, 200, 128}, {1, 2, 1024, 64}, {1, 1, 1024, 128}};
  for (const Case& c : cases) {
    for (Dtype dt : {Dtype::kBF16, Dtype::kF16}) {
      SCOPED_TRACE(::testing::Message() << "B" << c.b << " nh" << c.nh << " T" << c.t << " hs"
                                        << c.hs << " " << DtypeName(dt));
      const int64_t cc = c.nh * c.hs;
      const Tensor qkv = RandomTensor({c.b, c.t, 3 * cc}, 11, -1.5f, 1.5f, dt);
      const Tensor dy = RandomTensor({c.b, c.t, cc}, 12, -1.0f, 1.0f, dt);
      AttentionOptions o;
      o.scale = 1.0f / std::sqrt(static_cast<float>(c.hs));
      o.causal = true;
      o.dropout = 0.1f;
      o.training = false;  // eval: no attention dropout

      // CPU reference in f32 on the same (rounded) values.
      const Heads cpu = SplitQkv(qkv.To(Dtype::kF32), c.nh);
      tensor::Generator gen(1);
      AttentionState cpu_state;
      const Tensor y_cpu =
          AttentionForward(cpu.q, cpu.k, cpu.v, Tensor(), Tensor(), o, gen, &cpu_state);
      const AttentionGrads g_cpu =
          AttentionBackward(SplitHeads(dy.To(Dtype::kF32), c.nh), cpu_state);

      const Heads gpu = SplitQkv(ToGpu(qkv), c.nh);
      AttentionState st;
      const Tensor y = AttentionForward(gpu.q, gpu.k, gpu.v, Tensor(), Tensor(), o, gen, &st);
      ASSERT_TRUE(y.device().is_cuda());
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_TRUE(st.flash);
      EXPECT_FALSE(st.probs.defined()) << "no (T, T) tensor is kept";
      EXPECT_EQ(st.lse.shape(), tensor::Shape({c.b, c.nh, c.t}));
      const AttentionGrads g = AttentionBackward(SplitHeads(ToGpu(dy), c.nh), st);
      const double tol = dt == Dtype::kBF16 ? 2e-2 : 5e-3;
      EXPECT_TRUE(NearScaled(y, y_cpu, tol)) << "y";
      EXPECT_TRUE(NearScaled(g.dq, g_cpu.dq, tol)) << "dq";
      EXPECT_TRUE(NearScaled(g.dk, g_cpu.dk, tol)) << "dk";
      EXPECT_TRUE(NearScaled(g.dv, g_cpu.dv, tol)) << "dv";
      EXPECT_FALSE(g.dbias.defined());
    }
  }
}

TEST(AttentionCudaTest, MemoryIsLinearInT) {
  SKIP_WITHOUT_GPU();
  const int64_t b = 1, nh = 2, t = 2048, hs = 64;
  tensor::MemoryLedger ledger;
  tensor::ScopedLedger use(&ledger);
  const Tensor q = ToGpu(RandomTensor({b, nh, t, hs}, 1, -1, 1, Dtype::kBF16));
  const Tensor k = ToGpu(RandomTensor({b, nh, t, hs}, 2, -1, 1, Dtype::kBF16));
  const Tensor v = ToGpu(RandomTensor({b, nh, t, hs}, 3, -1, 1, Dtype::kBF16));
  const Tensor gy = ToGpu(RandomTensor({b, nh, t, hs}, 4, -1, 1, Dtype::kBF16));
  const int64_t head_bytes = b * nh * t * hs * 2;  // one (B, nh, T, hs) bf16 tensor
  const int64_t row_bytes = b * nh * t * 4;        // one (B, nh, T) f32 tensor
  const int64_t probs_bytes = b * nh * t * t * 2;  // what the CPU path keeps
  const Device gpu = Device::Cuda(0);

  tensor::ScopedMemoryCategory act(MemoryCategory::kActivations);
  for (float dropout : {0.0f, 0.1f}) {  // training: the dropout mask is not stored either
    SCOPED_TRACE(::testing::Message() << "dropout " << dropout);
    ledger.ResetPeaks();
    AttentionOptions o;
    o.scale = 0.125f;
    o.causal = true;
    o.dropout = dropout;
    o.training = true;
    tensor::Generator gen(1);
    AttentionState st;
    const Tensor y = AttentionForward(q, k, v, Tensor(), Tensor(), o, gen, &st);
    const tensor::MemoryStats fwd = ledger.Stats(gpu, MemoryCategory::kActivations);
    EXPECT_EQ(fwd.peak, head_bytes + row_bytes) << "forward: y and lse only";
    const AttentionGrads g = AttentionBackward(gy, st);
    const tensor::MemoryStats bwd = ledger.Stats(gpu, MemoryCategory::kActivations);
    // y, lse, then dq, dk, dv and the delta workspace (B, nh, T) f32.
    EXPECT_LE(bwd.peak, 4 * head_bytes + 2 * row_bytes);
    EXPECT_LT(bwd.peak * 4, probs_bytes) << "nothing O(T^2)";
    EXPECT_EQ(g.dq.nbytes(), head_bytes);
  }
}

// Attention dropout (training) and a bias run in the fused kernels, which
// regenerate the mask the CPU's dropout draws (the device Philox stream
// equals the CPU's): the same results as the CPU path, which keeps the
// probabilities. Head sizes the fused kernels do not take run the unfused
// path on the GPU: the same results too. f32 takes the float kernels, bf16
// the tensor-core ones.
TEST(AttentionCudaTest, DropoutFusedBiasAndOtherHeadSizesUnfusedMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  struct Variant {
    const char* name;
    int64_t hs;
    bool bias;
    float dropout;
    int64_t t = 37;
    bool causal = true;
    bool fused = false;
  };
  const std::vector<Variant> variants = {
      {"bias (T5, fused)", 64, true, 0.0f, 37, true, true},
      {"bias + dropout, not causal, T 70 (fused)", 32, true, 0.2f, 70, false, true},
      {"dropout (fused)", 64, false, 0.1f, 37, true, true},
      {"dropout 0.5, T 150 (fused)", 32, false, 0.5f, 150, true, true},
      {"dropout, not causal, T 130 (fused)", 128, false, 0.2f, 130, false, true},
      {"hs 48", 48, false, 0.0f},
      {"hs 16 + bias + dropout", 16, true, 0.2f}};
  // The variants again with the atomic-dq backward where it applies (bf16 on
  // tensor cores, no bias gradient): dropout's regenerated mask in its dQ too.
  std::vector<std::pair<Variant, bool>> runs;  // (variant, atomic dq)
  for (const Variant& var : variants) {
    runs.push_back({var, false});
    if (var.fused && !var.bias) runs.push_back({var, true});
  }
  for (const auto& [var, atomic_dq] : runs) {
    const bool was_atomic = tensor::cuda::FlashAttentionAtomicDq();
    tensor::cuda::SetFlashAttentionAtomicDq(atomic_dq);
    for (Dtype dt : {Dtype::kF32, Dtype::kBF16}) {
      SCOPED_TRACE(::testing::Message()
                   << var.name << " " << DtypeName(dt) << (atomic_dq ? " atomic dq" : ""));
      const int64_t b = 2, nh = 2, t = var.t, cc = nh * var.hs;
      const Tensor qkv = RandomTensor({b, t, 3 * cc}, 21, -1.5f, 1.5f, dt);
      const Tensor dy = RandomTensor({b, t, cc}, 22, -1.0f, 1.0f, dt);
      const Tensor bias = var.bias ? RandomTensor({1, nh, t, t}, 23, -1.0f, 1.0f) : Tensor();
      AttentionOptions o;
      o.scale = 1.0f / std::sqrt(static_cast<float>(var.hs));
      o.causal = var.causal;
      o.dropout = var.dropout;
      o.training = true;

      const Heads cpu = SplitQkv(qkv.To(Dtype::kF32), nh);
      tensor::Generator cpu_gen(5);
      AttentionState cpu_state;
      const Tensor y_cpu =
          AttentionForward(cpu.q, cpu.k, cpu.v, bias, Tensor(), o, cpu_gen, &cpu_state);
      const AttentionGrads g_cpu = AttentionBackward(SplitHeads(dy.To(Dtype::kF32), nh), cpu_state);

      const Heads gpu = SplitQkv(ToGpu(qkv), nh);
      tensor::Generator gpu_gen(5);
      AttentionState st;
      const Tensor y = AttentionForward(gpu.q, gpu.k, gpu.v, var.bias ? ToGpu(bias) : Tensor(),
                                        Tensor(), o, gpu_gen, &st);
      ASSERT_TRUE(y.device().is_cuda());
      EXPECT_EQ(st.flash, var.fused);
      EXPECT_EQ(st.probs.defined(), !var.fused) << "the fused path keeps no (T, T) tensor";
      EXPECT_EQ(gpu_gen.offset(), cpu_gen.offset()) << "the same counters drawn";
      const AttentionGrads g = AttentionBackward(SplitHeads(ToGpu(dy), nh), st);
      const double tol = dt == Dtype::kBF16 ? 2e-2 : 1e-4;
      EXPECT_TRUE(NearScaled(y, y_cpu, tol)) << "y";
      EXPECT_TRUE(NearScaled(g.dq, g_cpu.dq, tol)) << "dq";
      EXPECT_TRUE(NearScaled(g.dk, g_cpu.dk, tol)) << "dk";
      EXPECT_TRUE(NearScaled(g.dv, g_cpu.dv, tol)) << "dv";
      EXPECT_EQ(g.dbias.defined(), var.bias);
      if (var.bias) {
        EXPECT_TRUE(NearScaled(g.dbias, g_cpu.dbias, tol)) << "dbias";
      }
    }
    tensor::cuda::SetFlashAttentionAtomicDq(was_atomic);
  }
}

// A key padding mask (T5's encoder), alone, with causal and with a bias, and
// with T_q > T_k: masked in the fused kernels like the CPU masks, rows left
// without a key (a fully padded example) give zeros. f32 (float kernels) and
// bf16 (tensor cores); the mask comes as T5's data gives it (i64 on the
// device) or as f32 on the host.
TEST(AttentionCudaTest, KeyPaddingMaskMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t b = 3, nh = 2, hs = 32;
  for (Dtype dt : {Dtype::kF32, Dtype::kBF16}) {
    for (int64_t t_q : {9, 12}) {
      const int64_t t_k = 9;
      for (bool causal : {false, true}) {
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << DtypeName(dt) << " T_q " << t_q << (causal ? " causal" : "")
                       << (with_bias ? " bias" : ""));
          const Tensor q = RandomTensor({b, nh, t_q, hs}, 31, -1.5f, 1.5f, dt);
          const Tensor k = RandomTensor({b, nh, t_k, hs}, 32, -1.5f, 1.5f, dt);
          const Tensor v = RandomTensor({b, nh, t_k, hs}, 33, -1.5f, 1.5f, dt);
          const Tensor dy = RandomTensor({b, nh, t_q, hs}, 34, -1.0f, 1.0f, dt);
          const Tensor bias = with_bias ? RandomTensor({1, nh, t_q, t_k}, 35) : Tensor();
          // Example 0: keys 6.. padded; example 1: nothing padded; example 2: all padded.
          std::vector<int64_t> m(b * t_k, 1);
          for (int64_t j = 6; j < t_k; ++j) m[j] = 0;
          for (int64_t j = 0; j < t_k; ++j) m[2 * t_k + j] = 0;
          const Tensor mask = Tensor::FromData<int64_t>(m, {b, t_k});
          AttentionOptions o;
          o.scale = 0.25f;
          o.causal = causal;
          tensor::Generator gen(1);
          AttentionState cpu_state, st;
          const Tensor y_cpu =
              AttentionForward(q.To(Dtype::kF32), k.To(Dtype::kF32), v.To(Dtype::kF32), bias,
                               mask.To(Dtype::kF32), o, gen, &cpu_state);
          const AttentionGrads g_cpu = AttentionBackward(dy.To(Dtype::kF32), cpu_state);
          // i64 on the device for the f32 case, f32 on the host for bf16.
          const Tensor gpu_mask = dt == Dtype::kF32 ? ToGpu(mask) : mask.To(Dtype::kF32);
          const Tensor y =
              AttentionForward(ToGpu(q), ToGpu(k), ToGpu(v), with_bias ? ToGpu(bias) : Tensor(),
                               gpu_mask, o, gen, &st);
          EXPECT_TRUE(st.flash);
          EXPECT_FALSE(st.probs.defined()) << "no (T, T) tensor is kept";
          const AttentionGrads g = AttentionBackward(ToGpu(dy), st);
          const double tol = dt == Dtype::kBF16 ? 2e-2 : 1e-4;
          EXPECT_TRUE(NearScaled(y, y_cpu, tol)) << "y";
          EXPECT_TRUE(NearScaled(g.dq, g_cpu.dq, tol)) << "dq";
          EXPECT_TRUE(NearScaled(g.dk, g_cpu.dk, tol)) << "dk";
          EXPECT_TRUE(NearScaled(g.dv, g_cpu.dv, tol)) << "dv";
          EXPECT_EQ(g.dbias.defined(), with_bias);
          if (with_bias) {
            EXPECT_EQ(g.dbias.shape(), bias.shape());
            EXPECT_TRUE(NearScaled(g.dbias, g_cpu.dbias, tol)) << "dbias";
          }
          const std::vector<float> out = y.ToVector<float>();
          for (int64_t i = 2 * nh * t_q * hs; i < b * nh * t_q * hs; ++i) {
            ASSERT_EQ(out[i], 0.0f) << "the fully padded example";
          }
        }
      }
    }
  }
}

// T5's encoder self-attention on the fused path keeps O(T) in its forward:
// a key padding mask and a bias shared by the batch add nothing (T_q, T_k)
// per example beyond the bias itself.
TEST(AttentionCudaTest, BiasAndKeyMaskKeepTheForwardLinearInT) {
  SKIP_WITHOUT_GPU();
  const int64_t b = 4, nh = 2, t = 512, hs = 64;
  const Tensor q = ToGpu(RandomTensor({b, nh, t, hs}, 1, -1, 1, Dtype::kBF16));
  const Tensor k = ToGpu(RandomTensor({b, nh, t, hs}, 2, -1, 1, Dtype::kBF16));
  const Tensor v = ToGpu(RandomTensor({b, nh, t, hs}, 3, -1, 1, Dtype::kBF16));
  const Tensor bias = ToGpu(RandomTensor({1, nh, t, t}, 4, -1, 1, Dtype::kBF16));
  const Tensor mask = ToGpu(Tensor::Full({b, t}, 1.0));
  tensor::MemoryLedger ledger;
  tensor::ScopedLedger use(&ledger);
  tensor::ScopedMemoryCategory act(MemoryCategory::kActivations);
  AttentionOptions o;
  o.dropout = 0.1f;
  tensor::Generator gen(1);
  AttentionState st;
  const Tensor y = AttentionForward(q, k, v, bias, mask, o, gen, &st);
  const tensor::MemoryStats fwd = ledger.Stats(Device::Cuda(0), MemoryCategory::kActivations);
  const int64_t head_bytes = b * nh * t * hs * 2;  // y (B, nh, T, hs) bf16
  const int64_t row_bytes = b * nh * t * 4;        // lse (B, nh, T) f32
  // y, lse and, while the kernel is queued, the mask as bytes (B, T); the
  // unfused path kept b * nh * t * t * 2 bytes of probabilities (8x y).
  EXPECT_EQ(fwd.peak, head_bytes + row_bytes + b * t) << "forward";
  EXPECT_TRUE(st.flash);
}

}  // namespace
}  // namespace nn
