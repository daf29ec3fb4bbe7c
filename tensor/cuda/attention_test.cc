// The fused attention kernels against a plain-loop reference in double:
// output, logsumexp and dq, dk, dv, for both kernels (tensor cores, float),
// bf16 / f16 / f32, causal or not, T_q = T_k and not, lengths that are not
// multiples of the tiles, strided and unaligned inputs, a bias and a key
// padding mask (with the bias's gradient, summed over a shared batch in
// groups), reproducibility; plus the host-side checks and geometry, which
// run without a GPU. cuDNN's attention: attention_cudnn_test.cc; the
// reference and the shared helpers: attention_testing.h.
//
// Tolerances (|gpu - ref| <= tol * (max|ref| + |ref|), per tensor): the
// reference sees exactly the rounded inputs, so the error is the kernels'
// own roundings. bf16 has 8 significant bits (unit roundoff 2^-9 = 0.002):
// the output is rounded once, and on tensor cores each probability (and dS)
// is rounded before its product, which adds at most 2^-9 of the sum of
// |terms|; for sums of terms of random sign that stays within a few 2^-9 of
// the largest result, so 2e-2 (10 roundoffs) for bf16. f16 (2^-11): 5e-3. f32
// (float FMA, exp2f): 1e-4. lse is f32 in every case: 1e-4.
#include "tensor/cuda/attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/cuda/attention_testing.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using cuda::FlashAttentionKernel;
using cuda::FlashAttentionPass;
using cuda::FlashAttentionTilesFor;
using cuda::attention_testing::Case;
using cuda::attention_testing::Compute;
using cuda::attention_testing::ExpectNear;
using cuda::attention_testing::GpuView;
using cuda::attention_testing::Name;
using cuda::attention_testing::Reference;
using cuda::attention_testing::RunCase;
using cuda::attention_testing::Terms;
using cuda::attention_testing::Tol;
using cuda::testing::NearScaled;
using cuda::testing::ToGpu;
using testing::RandomTensor;

// With score terms: a random bias (1 or B, H, T_q, T_k) in `bias_dt` and a
// key padding mask (i64: example 0 pads its last third of keys, example 1
// none, example 2, if any, every key), against the reference; dS too.
// The reference's dS summed over the batch when the bias is shared by it:
// the bias's gradient, (bias_batch, H, T_q, T_k).
std::vector<double> BiasGrad(const Reference& ref, const Case& c, int64_t bias_batch) {
  if (bias_batch == c.b) return ref.dscores;
  const int64_t n = c.h * c.t_q * c.t_k;
  std::vector<double> sum(n, 0.0);
  for (int64_t b = 0; b < c.b; ++b) {
    for (int64_t i = 0; i < n; ++i) sum[i] += ref.dscores[b * n + i];
  }
  return sum;
}

// bias_grad_groups: FlashAttentionBackward's (0: its own choice).
// with_dbias false: the bias's gradient is not asked for.
void RunTermsCase(const Case& c, Dtype dt, FlashAttentionKernel kernel, bool bias_per_example,
                  Dtype bias_dt, bool with_mask, int64_t bias_grad_groups = 0,
                  bool with_dbias = true) {
  SCOPED_TRACE(absl::StrCat(Name(c, dt, kernel), bias_per_example ? " bias per example " : " bias ",
                            DtypeName(bias_dt), with_mask ? " key mask" : "", " groups ",
                            bias_grad_groups));
  const Tensor q = GpuView({c.b, c.h, c.t_q, c.d}, 11, dt, false);
  const Tensor k = GpuView({c.b, c.h, c.t_k, c.d}, 12, dt, false);
  const Tensor v = GpuView({c.b, c.h, c.t_k, c.d}, 13, dt, false);
  const Tensor dout = GpuView({c.b, c.h, c.t_q, c.d}, 14, dt, false);
  Terms ref_terms;
  ref_terms.bias_batch = bias_per_example ? c.b : 1;
  const Tensor bias =
      RandomTensor({ref_terms.bias_batch, c.h, c.t_q, c.t_k}, 15, -2.0f, 2.0f, bias_dt);
  ref_terms.bias = bias.ToVector<float>();
  cuda::FlashScoreTerms terms;
  terms.bias = ToGpu(bias);
  if (with_mask) {
    std::vector<int64_t> keep(c.b * c.t_k, 1);
    for (int64_t j = c.t_k - c.t_k / 3; j < c.t_k; ++j) keep[j] = 0;
    if (c.b > 2) std::fill(keep.begin() + 2 * c.t_k, keep.begin() + 3 * c.t_k, 0);
    ref_terms.keep.assign(keep.begin(), keep.end());
    terms.key_mask = ToGpu(Tensor::FromData<int64_t>(keep, {c.b, c.t_k}));
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  const Device dev = q.device();
  Tensor out = Tensor::Empty({c.b, c.h, c.t_q, c.d}, dt, dev);
  Tensor lse = Tensor::Empty({c.b, c.h, c.t_q}, Dtype::kF32, dev);
  cuda::FlashAttentionForward(q, k, v, scale, c.causal, out, lse, kernel, {}, terms);
  Tensor dq = Tensor::Empty(q.shape(), dt, dev);
  Tensor dk = Tensor::Empty(k.shape(), dt, dev);
  Tensor dv = Tensor::Empty(v.shape(), dt, dev);
  Tensor dbias = with_dbias
                     ? Tensor::Empty({ref_terms.bias_batch, c.h, c.t_q, c.t_k}, Dtype::kF32, dev)
                     : Tensor();
  cuda::FlashAttentionBackward(q, k, v, out, lse, dout, scale, c.causal, dq, dk, dv, kernel, {},
                               terms, dbias, bias_grad_groups);
  const Reference ref = Compute(c, q.ToVector<float>(), k.ToVector<float>(), v.ToVector<float>(),
                                dout.ToVector<float>(), scale, ref_terms);
  ExpectNear(ref, out, lse, dq, dk, dv, Tol(dt));
  if (with_dbias) {
    EXPECT_TRUE(NearScaled(dbias, BiasGrad(ref, c, ref_terms.bias_batch), Tol(dt))) << "dbias";
  }
}

// The atomic-dq backward (SetFlashAttentionAtomicDq) for a scope.
class ScopedAtomicDq {
 public:
  ScopedAtomicDq() : was_(cuda::FlashAttentionAtomicDq()) { cuda::SetFlashAttentionAtomicDq(true); }
  ~ScopedAtomicDq() { cuda::SetFlashAttentionAtomicDq(was_); }

 private:
  const bool was_;
};

// The narrow kernels (SetFlashAttentionNarrowDkDv, SetFlashAttentionNarrowDq)
// as given for a scope.
class ScopedNarrow {
 public:
  ScopedNarrow(bool dkdv, bool dq)
      : was_dkdv_(cuda::FlashAttentionNarrowDkDv()), was_dq_(cuda::FlashAttentionNarrowDq()) {
    cuda::SetFlashAttentionNarrowDkDv(dkdv);
    cuda::SetFlashAttentionNarrowDq(dq);
  }
  ~ScopedNarrow() {
    cuda::SetFlashAttentionNarrowDkDv(was_dkdv_);
    cuda::SetFlashAttentionNarrowDq(was_dq_);
  }

 private:
  const bool was_dkdv_, was_dq_;
};

std::vector<Case> Cases() {
  return {
      {2, 3, 1, 1, 64, true},       // one token
      {1, 2, 17, 17, 64, true},     // shorter than a tile
      {1, 2, 200, 200, 128, true},  // not a multiple of 64 (or 32)
      {1, 1, 129, 129, 32, true},   // D = 32
      {2, 1, 130, 130, 64, false},  // full attention
      {1, 2, 33, 100, 64, true},    // fewer queries than keys: query i sees j <= i + 67
      {1, 2, 100, 33, 64, true},    // more queries: the first 67 rows see no key
  };
}

TEST(CudaFlashAttentionTest, TensorCoreMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : Cases()) {
    for (Dtype dt : {Dtype::kBF16, Dtype::kF16}) RunCase(c, dt, FlashAttentionKernel::kTensorCore);
  }
}

TEST(CudaFlashAttentionTest, FloatKernelMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : Cases()) {
    for (Dtype dt : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) {
      RunCase(c, dt, FlashAttentionKernel::kFloat);
    }
  }
}

TEST(CudaFlashAttentionTest, LongSequenceBothKernels) {
  SKIP_WITHOUT_GPU();
  const Case c{1, 2, 1024, 1024, 64, true};
  RunCase(c, Dtype::kBF16, FlashAttentionKernel::kTensorCore);
  RunCase(c, Dtype::kF32, FlashAttentionKernel::kFloat);
}

// FlashAttention-2's own backward (dq by atomics from the dk / dv pass): the
// same cases against the reference, D = 128 (whose dQ tiles split the
// columns), unaligned rows, strided dq, and score terms without the bias's
// gradient (with it the deterministic kernels run, as the dS sums need).
TEST(CudaFlashAttentionTest, AtomicDqMatchesReference) {
  SKIP_WITHOUT_GPU();
  ScopedAtomicDq atomic;
  for (const Case& c : Cases()) {
    for (Dtype dt : {Dtype::kBF16, Dtype::kF16}) RunCase(c, dt, FlashAttentionKernel::kTensorCore);
  }
  RunCase({1, 2, 77, 77, 64, true}, Dtype::kBF16, FlashAttentionKernel::kTensorCore,
          /*unaligned=*/true);
  RunTermsCase({3, 2, 70, 70, 64, false}, Dtype::kBF16, FlashAttentionKernel::kTensorCore,
               /*bias_per_example=*/false, Dtype::kF32, /*with_mask=*/true, 0,
               /*with_dbias=*/false);
  RunTermsCase({3, 1, 20, 90, 128, true}, Dtype::kF16, FlashAttentionKernel::kTensorCore,
               /*bias_per_example=*/true, Dtype::kBF16, /*with_mask=*/true, 0,
               /*with_dbias=*/false);
  RunTermsCase({2, 2, 45, 45, 32, true}, Dtype::kBF16, FlashAttentionKernel::kTensorCore,
               /*bias_per_example=*/false, Dtype::kF32, /*with_mask=*/false, 0,
               /*with_dbias=*/true);
}

// The deterministic backward with the narrow kernels (32 queries a step in
// dk/dv, 32 keys in dq; built for head size 64 without dropout or score
// terms, elsewhere the switches change nothing): against the reference, and
// the same bits as the default kernels (the sums run in the same order), each
// narrow kernel alone and both, aligned rows (cp.async tiles) and not.
TEST(CudaFlashAttentionTest, NarrowKernelsMatchReferenceBitForBit) {
  SKIP_WITHOUT_GPU();
  {
    ScopedNarrow narrow(true, true);
    for (const Case& c : Cases()) {
      if (c.d == 64) RunCase(c, Dtype::kBF16, FlashAttentionKernel::kTensorCore);
    }
  }
  // (case, dtype, unaligned): partial and full tiles, causal or not, more
  // queries than keys; bf16 both ways, f16 once (the emulation's race check
  // runs this test too: kept small).
  struct BitCase {
    Case c;
    Dtype dt;
    bool unaligned;
  };
  const std::vector<BitCase> cases = {{{1, 2, 200, 200, 64, true}, Dtype::kBF16, false},
                                      {{1, 2, 200, 200, 64, true}, Dtype::kBF16, true},
                                      {{1, 2, 200, 200, 64, true}, Dtype::kF16, false},
                                      {{2, 1, 130, 130, 64, false}, Dtype::kBF16, false},
                                      {{1, 2, 100, 33, 64, true}, Dtype::kBF16, true},
                                      {{1, 1, 256, 256, 64, true}, Dtype::kBF16, false}};
  for (const BitCase& bc : cases) {
    const Case& c = bc.c;
    const Dtype dt = bc.dt;
    SCOPED_TRACE(absl::StrCat(Name(c, dt, FlashAttentionKernel::kTensorCore),
                              bc.unaligned ? " unaligned" : ""));
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    const Tensor q = GpuView({c.b, c.h, c.t_q, c.d}, 31, dt, bc.unaligned);
    const Tensor k = GpuView({c.b, c.h, c.t_k, c.d}, 32, dt, bc.unaligned);
    const Tensor v = GpuView({c.b, c.h, c.t_k, c.d}, 33, dt, bc.unaligned);
    const Tensor dout = GpuView({c.b, c.h, c.t_q, c.d}, 34, dt, bc.unaligned);
    const Device dev = q.device();
    Tensor out = Tensor::Empty(q.shape(), dt, dev);
    Tensor lse = Tensor::Empty({c.b, c.h, c.t_q}, Dtype::kF32, dev);
    cuda::FlashAttentionForward(q, k, v, scale, c.causal, out, lse);
    // dq, dk, dv with narrow (dk/dv, dq) = mode bits 1, 2.
    auto grads = [&](int mode) {
      ScopedNarrow narrow((mode & 1) != 0, (mode & 2) != 0);
      Tensor dq = Tensor::Empty(q.shape(), dt, dev);
      Tensor dk = Tensor::Empty(k.shape(), dt, dev);
      Tensor dv = Tensor::Empty(v.shape(), dt, dev);
      cuda::FlashAttentionBackward(q, k, v, out, lse, dout, scale, c.causal, dq, dk, dv);
      return std::vector<std::vector<float>>{dq.ToVector<float>(), dk.ToVector<float>(),
                                             dv.ToVector<float>()};
    };
    const std::vector<std::vector<float>> base = grads(0);
    for (int mode : {1, 2, 3}) {
      const std::vector<std::vector<float>> got = grads(mode);
      EXPECT_EQ(got[0], base[0]) << "dq, narrow mode " << mode;
      EXPECT_EQ(got[1], base[1]) << "dk, narrow mode " << mode;
      EXPECT_EQ(got[2], base[2]) << "dv, narrow mode " << mode;
    }
  }
}

// Other scales than 1 / sqrt(D): T5's 1, and a negative one (the forward
// scales a tile's scores before their max unless the scale is positive; at
// -20 the scores span hundreds, so a wrong max overflows exp2).
TEST(CudaFlashAttentionTest, AnyScaleMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (float scale : {1.0f, -20.0f}) {
    for (bool causal : {true, false}) {
      const Case c{1, 2, 150, 150, 64, causal};
      RunCase(c, Dtype::kBF16, FlashAttentionKernel::kTensorCore, /*unaligned=*/false, scale);
      RunCase(c, Dtype::kF32, FlashAttentionKernel::kFloat, /*unaligned=*/false, scale);
    }
  }
}

TEST(CudaFlashAttentionTest, UnalignedRowsTakeTheScalarLoads) {
  SKIP_WITHOUT_GPU();
  const Case c{1, 2, 77, 77, 64, true};
  RunCase(c, Dtype::kBF16, FlashAttentionKernel::kTensorCore, /*unaligned=*/true);
  RunCase(c, Dtype::kF16, FlashAttentionKernel::kFloat, /*unaligned=*/true);
}

// T5's attention: a relative position bias shared by the batch (or one per
// example), a key padding mask, causal (the decoder) or not (the encoder),
// T_q != T_k (cross-attention), a fully padded example; both kernels.
TEST(CudaFlashAttentionTest, BiasAndKeyMaskMatchReference) {
  SKIP_WITHOUT_GPU();
  const std::vector<Case> cases = {
      {3, 2, 70, 70, 64, false},  // encoder: 2 key tiles, the last one partial
      {2, 2, 45, 45, 32, true},   // decoder
      {3, 1, 20, 90, 128, false}  // cross-attention
  };
  for (const Case& c : cases) {
    for (FlashAttentionKernel kernel :
         {FlashAttentionKernel::kTensorCore, FlashAttentionKernel::kFloat}) {
      const Dtype dt = kernel == FlashAttentionKernel::kTensorCore ? Dtype::kBF16 : Dtype::kF32;
      RunTermsCase(c, dt, kernel, /*bias_per_example=*/false, Dtype::kF32, /*with_mask=*/true);
      RunTermsCase(c, dt, kernel, /*bias_per_example=*/true, Dtype::kBF16, /*with_mask=*/false);
    }
  }
  RunTermsCase({2, 2, 33, 33, 64, true}, Dtype::kF16, FlashAttentionKernel::kTensorCore, false,
               Dtype::kF16, true);
}

// A bias shared by the batch: its gradient summed over the examples in
// groups (one launch of the dq kernel per example of a group, each group's
// sum in its own slot, then the slots summed), for every grouping of 5
// examples: one group of 5 passes, 2 groups (3 + 2 examples), 3 groups (2 +
// 2 + 1), one group per example; both kernels, causal (skipped tiles) or not.
// Each grouping gives the same bits on a second run.
TEST(CudaFlashAttentionTest, SharedBiasGradientSummedInGroups) {
  SKIP_WITHOUT_GPU();
  for (FlashAttentionKernel kernel :
       {FlashAttentionKernel::kTensorCore, FlashAttentionKernel::kFloat}) {
    const Dtype dt = kernel == FlashAttentionKernel::kTensorCore ? Dtype::kBF16 : Dtype::kF32;
    for (bool causal : {true, false}) {
      for (int64_t groups : {1, 2, 3, 5}) {
        RunTermsCase({5, 2, 70, 70, 32, causal}, dt, kernel, /*bias_per_example=*/false,
                     Dtype::kF32, /*with_mask=*/!causal, groups);
      }
    }
  }
  const Case c{5, 2, 40, 40, 64, true};
  const Tensor q = GpuView({c.b, c.h, c.t_q, c.d}, 21, Dtype::kBF16, false);
  const Tensor k = GpuView({c.b, c.h, c.t_k, c.d}, 22, Dtype::kBF16, false);
  const Tensor v = GpuView({c.b, c.h, c.t_k, c.d}, 23, Dtype::kBF16, false);
  const Tensor dout = GpuView({c.b, c.h, c.t_q, c.d}, 24, Dtype::kBF16, false);
  cuda::FlashScoreTerms terms;
  terms.bias = ToGpu(RandomTensor({1, c.h, c.t_q, c.t_k}, 25, -2.0f, 2.0f, Dtype::kF32));
  Tensor out = Tensor::Empty({c.b, c.h, c.t_q, c.d}, Dtype::kBF16, q.device());
  Tensor lse = Tensor::Empty({c.b, c.h, c.t_q}, Dtype::kF32, q.device());
  cuda::FlashAttentionForward(q, k, v, 0.125f, c.causal, out, lse, FlashAttentionKernel::kAuto, {},
                              terms);
  for (int64_t groups : {2, 3}) {
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      Tensor dq = Tensor::Empty(q.shape(), Dtype::kBF16, q.device());
      Tensor dk = Tensor::Empty(k.shape(), Dtype::kBF16, q.device());
      Tensor dv = Tensor::Empty(v.shape(), Dtype::kBF16, q.device());
      Tensor dbias = Tensor::Empty({1, c.h, c.t_q, c.t_k}, Dtype::kF32, q.device());
      cuda::FlashAttentionBackward(q, k, v, out, lse, dout, 0.125f, c.causal, dq, dk, dv,
                                   FlashAttentionKernel::kAuto, {}, terms, dbias, groups);
      if (run == 0) {
        first = dbias.ToVector<float>();
      } else {
        EXPECT_EQ(dbias.ToVector<float>(), first) << groups << " groups";
      }
    }
  }
}

TEST(CudaFlashAttentionTest, BackwardIsBitwiseReproducible) {
  SKIP_WITHOUT_GPU();
  const Case c{2, 2, 300, 300, 64, true};
  const Dtype dt = Dtype::kBF16;
  const Tensor q = GpuView({c.b, c.h, c.t_q, c.d}, 5, dt, false);
  const Tensor k = GpuView({c.b, c.h, c.t_k, c.d}, 6, dt, false);
  const Tensor v = GpuView({c.b, c.h, c.t_k, c.d}, 7, dt, false);
  const Tensor dout = GpuView({c.b, c.h, c.t_q, c.d}, 8, dt, false);
  Tensor out = Tensor::Empty({c.b, c.h, c.t_q, c.d}, dt, q.device());
  Tensor lse = Tensor::Empty({c.b, c.h, c.t_q}, Dtype::kF32, q.device());
  cuda::FlashAttentionForward(q, k, v, 0.125f, true, out, lse);
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 2; ++run) {
    Tensor dq = Tensor::Empty(q.shape(), dt, q.device());
    Tensor dk = Tensor::Empty(k.shape(), dt, q.device());
    Tensor dv = Tensor::Empty(v.shape(), dt, q.device());
    cuda::FlashAttentionBackward(q, k, v, out, lse, dout, 0.125f, true, dq, dk, dv);
    const std::vector<std::vector<float>> now = {dq.ToVector<float>(), dk.ToVector<float>(),
                                                 dv.ToVector<float>()};
    if (run == 0) {
      first = now;
    } else {
      EXPECT_EQ(now, first);
    }
  }
}

// Outputs written through their strides, as the layers use them: out as a
// (B, H, T, D) view of (B, T, H, D) memory (the heads merged with no copy),
// dq / dk / dv as views into one (B, T, 3, H, D) gradient (the fused qkv
// projection's). Bit for bit the contiguous results, for both kernel families
// (the float one in f32 and bf16), causal or not, T not a tile multiple.
TEST(CudaFlashAttentionTest, StridedOutputsEqualContiguousOnes) {
  SKIP_WITHOUT_GPU();
  struct Run {
    Dtype dt;
    FlashAttentionKernel kernel;
  };
  for (const Run& r : {Run{Dtype::kBF16, FlashAttentionKernel::kTensorCore},
                       Run{Dtype::kBF16, FlashAttentionKernel::kFloat},
                       Run{Dtype::kF32, FlashAttentionKernel::kFloat}}) {
    for (bool causal : {true, false}) {
      const Case c{2, 3, 70, 70, 32, causal};
      SCOPED_TRACE(Name(c, r.dt, r.kernel));
      const Tensor q = GpuView({c.b, c.h, c.t_q, c.d}, 11, r.dt, false);
      const Tensor k = GpuView({c.b, c.h, c.t_k, c.d}, 12, r.dt, false);
      const Tensor v = GpuView({c.b, c.h, c.t_k, c.d}, 13, r.dt, false);
      const Tensor dout = GpuView({c.b, c.h, c.t_q, c.d}, 14, r.dt, false);
      const Device dev = q.device();
      const float scale = 0.2f;
      Tensor out = Tensor::Empty({c.b, c.h, c.t_q, c.d}, r.dt, dev);
      Tensor lse = Tensor::Empty({c.b, c.h, c.t_q}, Dtype::kF32, dev);
      cuda::FlashAttentionForward(q, k, v, scale, c.causal, out, lse, r.kernel);
      Tensor dq = Tensor::Empty(q.shape(), r.dt, dev);
      Tensor dk = Tensor::Empty(k.shape(), r.dt, dev);
      Tensor dv = Tensor::Empty(v.shape(), r.dt, dev);
      cuda::FlashAttentionBackward(q, k, v, out, lse, dout, scale, c.causal, dq, dk, dv, r.kernel);

      // (B, T, H, D) memory seen as (B, H, T, D).
      const Tensor out_s = ToGpu(Tensor::Full({c.b, c.t_q, c.h, c.d}, 7.0, r.dt)).Transpose(1, 2);
      Tensor lse_s = Tensor::Empty({c.b, c.h, c.t_q}, Dtype::kF32, dev);
      cuda::FlashAttentionForward(q, k, v, scale, c.causal, out_s, lse_s, r.kernel);
      // (B, T, 3, H, D): dq, dk, dv are its three (B, H, T, D) slices.
      const Tensor fused = ToGpu(Tensor::Full({c.b, c.t_q, 3, c.h, c.d}, 7.0, r.dt));
      auto slice = [&](int64_t i) { return fused.Select(2, i).Transpose(1, 2); };
      cuda::FlashAttentionBackward(q, k, v, out_s, lse_s, dout, scale, c.causal, slice(0), slice(1),
                                   slice(2), r.kernel);
      EXPECT_EQ(out_s.ToVector<float>(), out.ToVector<float>()) << "out";
      EXPECT_EQ(lse_s.ToVector<float>(), lse.ToVector<float>()) << "lse";
      EXPECT_EQ(slice(0).ToVector<float>(), dq.ToVector<float>()) << "dq";
      EXPECT_EQ(slice(1).ToVector<float>(), dk.ToVector<float>()) << "dk";
      EXPECT_EQ(slice(2).ToVector<float>(), dv.ToVector<float>()) << "dv";
    }
  }
}

TEST(CudaFlashAttentionTest, UnfusedSoftmaxMatchesReference) {
  SKIP_WITHOUT_GPU();
  // probs of the unfused baseline against the reference through out = probs @ v
  // with v = identity (T_k = D).
  const Case c{1, 2, 50, 64, 64, true};
  const Tensor q = ToGpu(RandomTensor({1, 2, 50, 64}, 9));
  const Tensor k = ToGpu(RandomTensor({1, 2, 64, 64}, 10));
  std::vector<float> eye(2 * 64 * 64, 0.0f);
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 64; ++j) eye[(h * 64 + j) * 64 + j] = 1.0f;
  }
  // scores = q k^T on the host (f32), then the kernel.
  const std::vector<float> qv = q.ToVector<float>(), kv = k.ToVector<float>();
  std::vector<float> scores(2 * 50 * 64);
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 50; ++i) {
      for (int j = 0; j < 64; ++j) {
        double s = 0;
        for (int x = 0; x < 64; ++x)
          s += double(qv[(h * 50 + i) * 64 + x]) * kv[(h * 64 + j) * 64 + x];
        scores[(h * 50 + i) * 64 + j] = static_cast<float>(s);
      }
    }
  }
  const Tensor s_gpu = ToGpu(Tensor::FromVector(scores, {1, 2, 50, 64}));
  Tensor probs = Tensor::Empty({1, 2, 50, 64}, Dtype::kF32, q.device());
  cuda::UnfusedAttentionSoftmax(s_gpu, 0.125f, true, probs);
  const std::vector<float> zeros(2 * 50 * 64, 0.0f);
  const Reference ref = Compute(c, qv, kv, eye, zeros, 0.125);
  EXPECT_TRUE(NearScaled(probs, ref.out, 1e-5));
}

// ---- Host side: runs without a GPU ----

TEST(CudaFlashAttentionHostTest, RejectsUnsupportedInputs) {
  auto expect_error = [](const Tensor& q, const Tensor& k, const Tensor& v,
                         const std::string& what) {
    try {
      cuda::CheckFlashAttentionInputs(q, k, v);
      ADD_FAILURE() << "no error; expected " << what;
    } catch (const OpError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("[flash_attention] ", 0), 0u) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  };
  const Tensor q = Tensor::Zeros({2, 3, 10, 64}, Dtype::kBF16);
  const Tensor k = Tensor::Zeros({2, 3, 12, 64}, Dtype::kBF16);
  EXPECT_NO_THROW(cuda::CheckFlashAttentionInputs(q, k, k));
  const Tensor q48 = Tensor::Zeros({2, 3, 10, 48}, Dtype::kBF16);
  expect_error(q48, q48, q48, "head size 48 is not supported (32, 64 or 128)");
  expect_error(q, k, Tensor::Zeros({2, 3, 12, 32}, Dtype::kBF16), "value head size 32");
  expect_error(q, k, Tensor::Zeros({2, 3, 11, 64}, Dtype::kBF16), "do not fit together");
  expect_error(q, k.To(Dtype::kF32), k, "must share dtype");
  const Tensor strided = Tensor::Zeros({2, 3, 64, 10}, Dtype::kBF16).Transpose(2, 3);
  expect_error(strided, k, k, "unit stride");
  expect_error(Tensor::Zeros({3, 10, 64}, Dtype::kBF16), k, k, "(B, H, T, D)");
}


TEST(CudaFlashAttentionHostTest, TilesFitSharedMemoryAndAreIndependentOfT) {
  constexpr int64_t kSm90MaxSmem = 227 * 1024;
  for (int64_t d : {32, 64, 128}) {
    for (FlashAttentionKernel k :
         {FlashAttentionKernel::kTensorCore, FlashAttentionKernel::kFloat}) {
      for (FlashAttentionPass p :
           {FlashAttentionPass::kForward, FlashAttentionPass::kBackwardDkDv,
            FlashAttentionPass::kBackwardDq, FlashAttentionPass::kBackwardDkDvDq,
            FlashAttentionPass::kBackwardDkDvNarrow, FlashAttentionPass::kBackwardDqNarrow}) {
        const cuda::FlashAttentionTiles t = FlashAttentionTilesFor(k, p, d, 2);
        EXPECT_LE(t.smem_bytes, kSm90MaxSmem) << d;
        EXPECT_GT(t.rows, 0);
        EXPECT_EQ(t.step % 16, 0);
        EXPECT_EQ(t.threads % 32, 0);
        if (k == FlashAttentionKernel::kTensorCore) {
          EXPECT_EQ(t.rows, 16 * t.threads / 32) << "16 rows per warp";
        } else {
          EXPECT_EQ(t.rows, t.threads / 32) << "a row per warp";
        }
      }
    }
  }
  // Tiles of 64 rows of D + 8 bf16: Q, and K, V in two stages.
  EXPECT_EQ(
      FlashAttentionTilesFor(FlashAttentionKernel::kTensorCore, FlashAttentionPass::kForward, 64, 2)
          .smem_bytes,
      5 * 64 * 72 * 2);
  // The only workspace: delta, 4 bytes per query row; with a shared bias's
  // gradient in G > 1 groups, their (G, H, T_q, T_k) f32 sums too.
  EXPECT_EQ(cuda::FlashAttentionBackwardWorkspaceBytes(2, 12, 1024), 2 * 12 * 1024 * 4);
  EXPECT_EQ(cuda::FlashAttentionBackwardWorkspaceBytes(16, 12, 512, 6, 512),
            16 * 12 * 512 * 4 + int64_t{6} * 12 * 512 * 512 * 4);
  // Atomic dq: the (B, H, T_q, D) f32 accumulator too; its kernel's dS tile
  // (64 or, at D = 128, 32 query rows of 64 + 8 keys) on top of kernel 2's.
  EXPECT_EQ(cuda::FlashAttentionBackwardWorkspaceBytes(2, 12, 1024, 1, 0, 64),
            2 * 12 * 1024 * 4 + 2 * 12 * 1024 * 64 * 4);
  for (int64_t d : {32, 64, 128}) {
    const int64_t step = d == 128 ? 32 : 64;
    EXPECT_EQ(FlashAttentionTilesFor(FlashAttentionKernel::kTensorCore,
                                     FlashAttentionPass::kBackwardDkDvDq, d, 2)
                      .smem_bytes -
                  FlashAttentionTilesFor(FlashAttentionKernel::kTensorCore,
                                         FlashAttentionPass::kBackwardDkDv, d, 2)
                      .smem_bytes,
              step * 72 * 2)
        << d;
  }
  // The narrow dk/dv pass: 32 queries a step, so its Q, dO stages and their
  // lse, delta take half the shared memory of the 64-query pass at D = 64.
  const cuda::FlashAttentionTiles narrow = FlashAttentionTilesFor(
      FlashAttentionKernel::kTensorCore, FlashAttentionPass::kBackwardDkDvNarrow, 64, 2);
  EXPECT_EQ(narrow.step, 32);
  EXPECT_EQ(narrow.smem_bytes, (2 * 64 + 2 * 2 * 32) * 72 * 2 + 2 * 2 * 32 * 4);
  // The narrow dq pass: the same 64 query rows a CTA, K, V stages of 32 keys.
  const cuda::FlashAttentionTiles narrow_dq = FlashAttentionTilesFor(
      FlashAttentionKernel::kTensorCore, FlashAttentionPass::kBackwardDqNarrow, 64, 2);
  EXPECT_EQ(narrow_dq.rows, 64);
  EXPECT_EQ(narrow_dq.step, 32);
  EXPECT_EQ(narrow_dq.smem_bytes, (2 * 64 + 2 * 2 * 32) * 72 * 2);
}

// The groups of a shared bias's gradient: the fewest that give each dq launch
// 512 CTAs (heads x query blocks per group), no empty group, and the plain
// launch (one example per group, one pass) without a shared bias.
TEST(CudaFlashAttentionHostTest, BiasGradGroups) {
  using cuda::FlashBiasGradGroupsFor;
  auto groups = [](cuda::FlashBiasGradGroups g) { return std::make_pair(g.groups, g.passes); };
  // T5-base's encoder, B 16, T 512: 12 heads x 8 query blocks = 96 CTAs per
  // group, 6 groups wanted: 3 passes, 6 groups (the last one of 1 example).
  EXPECT_EQ(groups(FlashBiasGradGroupsFor(16, 12, 8, true)),
            std::make_pair(int64_t{6}, int64_t{3}));
  // Enough CTAs in one group (12 x 64 = 768): one slot, 16 passes.
  EXPECT_EQ(groups(FlashBiasGradGroupsFor(16, 12, 64, true)),
            std::make_pair(int64_t{1}, int64_t{16}));
  // Tiny: every example its own group.
  EXPECT_EQ(groups(FlashBiasGradGroupsFor(4, 1, 1, true)), std::make_pair(int64_t{4}, int64_t{1}));
  // Not shared (a bias per example, or no bias's gradient): the plain launch.
  EXPECT_EQ(groups(FlashBiasGradGroupsFor(16, 12, 64, false)),
            std::make_pair(int64_t{16}, int64_t{1}));
  // Requested: 3 groups of 5 examples are 2 passes, groups of 2, 2, 1; 4
  // requested are still 2 passes, so 3 groups (no empty one); clamped to B.
  EXPECT_EQ(groups(FlashBiasGradGroupsFor(5, 2, 2, true, 3)),
            std::make_pair(int64_t{3}, int64_t{2}));
  EXPECT_EQ(groups(FlashBiasGradGroupsFor(5, 2, 2, true, 4)),
            std::make_pair(int64_t{3}, int64_t{2}));
  EXPECT_EQ(groups(FlashBiasGradGroupsFor(5, 2, 2, true, 9)),
            std::make_pair(int64_t{5}, int64_t{1}));
  EXPECT_EQ(groups(FlashBiasGradGroupsFor(0, 2, 2, true)), std::make_pair(int64_t{0}, int64_t{1}));
}

TEST(CudaFlashAttentionHostTest, CpuTensorsAreRejected) {
  const Tensor q = Tensor::Zeros({1, 1, 4, 32}, Dtype::kBF16);
  Tensor out = Tensor::Zeros({1, 1, 4, 32}, Dtype::kBF16);
  Tensor lse = Tensor::Zeros({1, 1, 4});
  try {
    cuda::FlashAttentionForward(q, q, q, 1.0f, true, out, lse);
    ADD_FAILURE() << "no error";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("not a CUDA device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tensor
