// tensor::LinearForward / LinearResidualForward / LinearGeluForward /
// LinearGeluInputGrad / LinearParamGradsInto on the GPU: the bias, residual,
// GELU, GELU backward and bias gradient in cuBLASLt's epilogue, against the CPU's
// unfused ops, in f32, bf16 and f16.
// Also the cases that are not fused (an aux leading dimension that is not a
// multiple of 8, a misaligned bias, fusing switched off), which must give the
// same values, and threads fusing at once (each with its own descriptors,
// whose bias pointers are set per call). Tagged gpu; skips without a device.
#include "tensor/ops/linear.h"

#include <cmath>
#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/cuda/matmul.h"
#include "tensor/cuda/testing.h"
#include "tensor/cuda_backend.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using cuda::testing::DefaultTolerance;
using cuda::testing::FloatDtypes;
using cuda::testing::MatchesCpu;
using cuda::testing::ToGpu;
using ::tensor::testing::RandomTensor;

struct Case {
  Tensor x, w, b;   // CPU, in the case's dtype
  Tensor pre, out;  // f32 CPU reference: x @ w^T + b and its GELU
};

// x (n, k), w (m, k), b (m) in dtype; the reference in f32 from the same values.
Case MakeCase(int64_t n, int64_t k, int64_t m, Dtype dtype, uint64_t seed) {
  Case c;
  c.x = RandomTensor({n, k}, seed, -1, 1, dtype);
  c.w = RandomTensor({m, k}, seed + 1, -1, 1, dtype);
  c.b = RandomTensor({m}, seed + 2, -1, 1, dtype);
  MatmulOptions opts;
  opts.trans_b = true;
  c.pre = AddBias(Matmul(c.x.To(Dtype::kF32), c.w.To(Dtype::kF32), opts), c.b.To(Dtype::kF32));
  c.out = Gelu(c.pre);
  return c;
}

// Each dtype: (n, k, m) with m a multiple of 8 (both epilogues fuse) and not
// (the GELU's aux cannot be given to cuBLASLt; the bias still fuses).
TEST(CudaLinearTest, FusedEpiloguesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  struct Shape3 {
    int64_t n, k, m;
    bool gelu_fuses;
  };
  for (Dtype dtype : FloatDtypes()) {
    for (const Shape3& s : {Shape3{37, 24, 64, true}, Shape3{16, 40, 12, false}}) {
      SCOPED_TRACE(::testing::Message()
                   << DtypeName(dtype) << " " << s.n << "x" << s.k << " @ " << s.k << "x" << s.m);
      const Case c = MakeCase(s.n, s.k, s.m, dtype, 10 + s.m);
      const cuda::testing::Tolerance tol = DefaultTolerance(dtype, 4);
      const Tensor x = ToGpu(c.x), w = ToGpu(c.w), b = ToGpu(c.b);

      cuda::MatmulCacheStats before = cuda::GetMatmulCacheStats();
      const Tensor y = LinearForward(x, w, b);
      cuda::MatmulCacheStats after = cuda::GetMatmulCacheStats();
      EXPECT_EQ(after.epilogues_fused, before.epilogues_fused + 1) << "the bias was not fused";
      EXPECT_TRUE(MatchesCpu(y.To(Dtype::kF32), c.pre, tol));

      before = after;
      const LinearGeluResult r = LinearGeluForward(x, w, b);
      after = cuda::GetMatmulCacheStats();
      EXPECT_EQ(after.epilogues_fused, before.epilogues_fused + (s.gelu_fuses ? 1 : 0));
      EXPECT_EQ(r.out.dtype(), dtype);
      EXPECT_EQ(r.pre.dtype(), dtype);
      EXPECT_TRUE(MatchesCpu(r.pre.To(Dtype::kF32), c.pre, tol));
      EXPECT_TRUE(MatchesCpu(r.out.To(Dtype::kF32), c.out, tol));
    }
  }
}

// residual + x w^T (+ b) with the residual as cuBLASLt's C (D a new
// tensor): fused with and without a bias, the residual left as it was; with
// fusing off, the same values from the unfused path (residual + b, then the
// GEMM accumulating into it).
TEST(CudaLinearTest, ResidualInTheGemmMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (Dtype dtype : FloatDtypes()) {
    SCOPED_TRACE(DtypeName(dtype));
    const Case c = MakeCase(37, 24, 64, dtype, 60);
    const Tensor r = RandomTensor({37, 64}, 64, -1, 1, dtype);
    const cuda::testing::Tolerance tol = DefaultTolerance(dtype, 4);
    const Tensor x = ToGpu(c.x), w = ToGpu(c.w), b = ToGpu(c.b), gr = ToGpu(r);
    const Tensor want = Add(r.To(Dtype::kF32), c.pre);
    MatmulOptions opts;
    opts.trans_b = true;
    const Tensor want_no_bias =
        Add(r.To(Dtype::kF32), Matmul(c.x.To(Dtype::kF32), c.w.To(Dtype::kF32), opts));

    cuda::MatmulCacheStats before = cuda::GetMatmulCacheStats();
    const Tensor y = LinearResidualForward(x, w, b, gr);
    const Tensor y_no_bias = LinearResidualForward(x, w, Tensor(), gr);
    cuda::MatmulCacheStats after = cuda::GetMatmulCacheStats();
    EXPECT_EQ(after.epilogues_fused, before.epilogues_fused + 2) << "the residual was not fused";
    EXPECT_EQ(y.dtype(), dtype);
    EXPECT_TRUE(MatchesCpu(y.To(Dtype::kF32), want, tol));
    EXPECT_TRUE(MatchesCpu(y_no_bias.To(Dtype::kF32), want_no_bias, tol));
    EXPECT_TRUE(MatchesCpu(gr.To(Dtype::kF32), r.To(Dtype::kF32), {0, 0}));

    cuda::SetMatmulFuseEpilogues(false);
    const Tensor unfused = LinearResidualForward(x, w, b, gr);
    cuda::SetMatmulFuseEpilogues(true);
    EXPECT_TRUE(MatchesCpu(unfused.To(Dtype::kF32), want, tol));
  }
}

TEST(CudaLinearTest, AMisalignedBiasOrFusingOffGivesTheSameValuesUnfused) {
  SKIP_WITHOUT_GPU();
  const Dtype dtype = Dtype::kBF16;
  const Case c = MakeCase(33, 48, 32, dtype, 40);
  const Tensor x = ToGpu(c.x), w = ToGpu(c.w);
  // The bias one element into a larger buffer, as a flat FSDP shard may hold it.
  const Tensor padded = ToGpu(Tensor::Zeros({33}, dtype));
  Tensor b = padded.Narrow(0, 1, 32);
  b.CopyFrom(ToGpu(c.b));
  const cuda::testing::Tolerance tol = DefaultTolerance(dtype, 4);

  const cuda::MatmulCacheStats before = cuda::GetMatmulCacheStats();
  const Tensor y = LinearForward(x, w, b);
  const LinearGeluResult r = LinearGeluForward(x, w, b);
  const cuda::MatmulCacheStats after = cuda::GetMatmulCacheStats();
  EXPECT_EQ(after.epilogues_fused, before.epilogues_fused);
  EXPECT_EQ(after.epilogues_unfused, before.epilogues_unfused + 2);
  EXPECT_TRUE(MatchesCpu(y.To(Dtype::kF32), c.pre, tol));
  EXPECT_TRUE(MatchesCpu(r.out.To(Dtype::kF32), c.out, tol));

  const Tensor aligned_b = ToGpu(c.b);
  const LinearGeluResult fused = LinearGeluForward(x, w, aligned_b);
  cuda::SetMatmulFuseEpilogues(false);
  const LinearGeluResult unfused = LinearGeluForward(x, w, aligned_b);
  const Tensor unfused_y = LinearForward(x, w, aligned_b);
  cuda::SetMatmulFuseEpilogues(true);
  EXPECT_EQ(cuda::GetMatmulCacheStats().epilogues_fused, after.epilogues_fused + 1);
  EXPECT_TRUE(MatchesCpu(unfused.pre.To(Dtype::kF32), fused.pre.To(Dtype::kF32), tol));
  EXPECT_TRUE(MatchesCpu(unfused.out.To(Dtype::kF32), fused.out.To(Dtype::kF32), tol));
  EXPECT_TRUE(MatchesCpu(unfused_y.To(Dtype::kF32), c.pre, tol));
}

// cuBLASLt may refuse a fused epilogue at the call after its heuristic took
// it (it checks more there): the GEMM runs unfused, with the CPU's values, and
// that shape stays unfused. The emulation refuses with
// CUDA_EMU_LT_REFUSE_EPILOGUES=1; a GPU, which does not, skips.
TEST(CudaLinearTest, AFusedEpilogueRefusedAtTheCallRunsUnfused) {
  SKIP_WITHOUT_GPU();
  if (cuda::DeviceName(0).rfind("cuda_emu", 0) != 0) {
    GTEST_SKIP() << "the refusal is the emulation's (CUDA_EMU_LT_REFUSE_EPILOGUES)";
  }
  const Dtype dtype = Dtype::kBF16;
  const Case c = MakeCase(19, 40, 48, dtype, 70);  // a shape no other test fuses
  const Tensor x = ToGpu(c.x), w = ToGpu(c.w), b = ToGpu(c.b);
  const cuda::testing::Tolerance tol = DefaultTolerance(dtype, 4);
  struct Refusing {  // unset however the block ends, so later tests fuse again
    Refusing() { setenv("CUDA_EMU_LT_REFUSE_EPILOGUES", "1", 1); }
    ~Refusing() { unsetenv("CUDA_EMU_LT_REFUSE_EPILOGUES"); }
  };
  const cuda::MatmulCacheStats before = cuda::GetMatmulCacheStats();
  Tensor y;
  LinearGeluResult r;
  {
    Refusing refusing;
    y = LinearForward(x, w, b);      // the bias epilogue
    r = LinearGeluForward(x, w, b);  // GELU_AUX_BIAS
  }
  const LinearGeluResult again = LinearGeluForward(x, w, b);  // remembered as refused
  const cuda::MatmulCacheStats after = cuda::GetMatmulCacheStats();
  EXPECT_EQ(after.epilogues_fused, before.epilogues_fused);
  EXPECT_EQ(after.epilogues_unfused, before.epilogues_unfused + 3);
  EXPECT_TRUE(MatchesCpu(y.To(Dtype::kF32), c.pre, tol));
  EXPECT_TRUE(MatchesCpu(r.pre.To(Dtype::kF32), c.pre, tol));
  EXPECT_TRUE(MatchesCpu(r.out.To(Dtype::kF32), c.out, tol));
  EXPECT_TRUE(MatchesCpu(again.out.To(Dtype::kF32), c.out, tol));
}

// LinearGeluInputGrad: gelu'(pre) * (g @ w) with the GELU's backward in the
// GEMM's epilogue (DGELU) when pre's rows are a multiple of 8 apart, unfused
// otherwise and with fusing off; both against the f32 CPU reference.
TEST(CudaLinearTest, GeluInputGradMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  struct Shape3 {
    int64_t n, m, k;  // g (n, m), w (m, k), pre (n, k)
    bool fuses;
  };
  for (Dtype dtype : FloatDtypes()) {
    for (const Shape3& s : {Shape3{37, 24, 64, true}, Shape3{16, 40, 12, false}}) {
      SCOPED_TRACE(::testing::Message() << DtypeName(dtype) << " g " << s.n << "x" << s.m
                                        << ", pre " << s.n << "x" << s.k);
      const Tensor g = RandomTensor({s.n, s.m}, 70 + s.k, -1, 1, dtype);
      const Tensor w = RandomTensor({s.m, s.k}, 71 + s.k, -1, 1, dtype);
      const Tensor pre = RandomTensor({s.n, s.k}, 72 + s.k, -3, 3, dtype);
      const Tensor want = GeluBackward(Matmul(g.To(Dtype::kF32), w.To(Dtype::kF32)),
                                       pre.To(Dtype::kF32));  // (n, k)
      const cuda::testing::Tolerance tol = DefaultTolerance(dtype, 4);

      const cuda::MatmulCacheStats before = cuda::GetMatmulCacheStats();
      const Tensor got = LinearGeluInputGrad(ToGpu(g), ToGpu(w), ToGpu(pre));
      const cuda::MatmulCacheStats after = cuda::GetMatmulCacheStats();
      EXPECT_EQ(after.epilogues_fused, before.epilogues_fused + (s.fuses ? 1 : 0));
      EXPECT_EQ(got.dtype(), dtype);
      EXPECT_TRUE(MatchesCpu(got.To(Dtype::kF32), want, tol));

      cuda::SetMatmulFuseEpilogues(false);
      const Tensor unfused = LinearGeluInputGrad(ToGpu(g), ToGpu(w), ToGpu(pre));
      cuda::SetMatmulFuseEpilogues(true);
      EXPECT_EQ(cuda::GetMatmulCacheStats().epilogues_fused, after.epilogues_fused);
      EXPECT_TRUE(MatchesCpu(unfused.To(Dtype::kF32), want, tol));
    }
  }
}

// LinearGeluInputGrad with the bias gradient of pre's layer asked for: with
// cuda::MatmulDGeluBiasGrad on, one GEMM (DGELU_BGRAD) gives the GELU input's
// gradient and its f32 column sums, the CPU's values; with the switch off, or
// where the GEMM does not fuse (pre's rows 12 apart), the gradient alone, the
// sums left undefined for the caller.
TEST(CudaLinearTest, GeluInputGradSumsThePreLayersBiasGradient) {
  SKIP_WITHOUT_GPU();
  for (Dtype dtype : FloatDtypes()) {
    for (const auto& [k, fuses] : {std::pair<int64_t, bool>{64, true}, {12, false}}) {
      const int64_t n = 37, m = 24;  // g (n, m), w (m, k), pre (n, k)
      const Tensor g = RandomTensor({n, m}, 73 + k, -1, 1, dtype);
      const Tensor w = RandomTensor({m, k}, 74 + k, -1, 1, dtype);
      const Tensor pre = RandomTensor({n, k}, 75 + k, -3, 3, dtype);
      const Tensor want = GeluBackward(Matmul(g.To(Dtype::kF32), w.To(Dtype::kF32)),
                                       pre.To(Dtype::kF32));  // (n, k)
      const Tensor want_db = AddBiasBackward(want);            // (k)
      const cuda::testing::Tolerance tol = DefaultTolerance(dtype, 4);
      for (bool on : {true, false}) {
        SCOPED_TRACE(absl::StrCat(DtypeName(dtype), " pre ", n, "x", k,
                                  on ? ", switch on" : ", switch off"));
        cuda::SetMatmulDGeluBiasGrad(on);
        Tensor db = Tensor::Zeros({1});  // to be reset
        const cuda::MatmulCacheStats before = cuda::GetMatmulCacheStats();
        const Tensor got = LinearGeluInputGrad(ToGpu(g), ToGpu(w), ToGpu(pre), &db);
        const cuda::MatmulCacheStats after = cuda::GetMatmulCacheStats();
        cuda::SetMatmulDGeluBiasGrad(false);
        EXPECT_EQ(after.epilogues_fused, before.epilogues_fused + (fuses ? 1 : 0));
        EXPECT_TRUE(MatchesCpu(got.To(Dtype::kF32), want, tol));
        ASSERT_EQ(db.defined(), on && fuses);
        if (db.defined()) {
          EXPECT_EQ(db.dtype(), Dtype::kF32);
          EXPECT_TRUE(db.device().is_cuda());
          EXPECT_TRUE(MatchesCpu(db, want_db, tol));
        }
      }
    }
  }
  // The CPU: the sums are always the caller's.
  Tensor db = Tensor::Zeros({1});
  cuda::SetMatmulDGeluBiasGrad(true);
  LinearGeluInputGrad(RandomTensor({5, 8}, 1), RandomTensor({8, 16}, 2), RandomTensor({5, 16}, 3),
                      &db);
  cuda::SetMatmulDGeluBiasGrad(false);
  EXPECT_FALSE(db.defined());
}

// LinearParamGradsInto: the bias gradient out of the weight-gradient GEMM
// (BGRADB), accumulated into f32 buffers, against the f32 CPU sums; the weight
// gradient a view inside a larger buffer (as an FSDP flat gradient holds it),
// each gradient added to or written (over NaN);
// and the unfused path (GEMM, then the column sums: m 24 the narrow-row
// kernel, m 264 the 16-byte one) with fusing off, or only the bias gradient's.
TEST(CudaLinearTest, ParamGradsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (Dtype dtype : FloatDtypes()) {
    for (int64_t m : {24, 264}) {
      SCOPED_TRACE(absl::StrCat(DtypeName(dtype), " m ", m));
      const int64_t n = 45, k = 40;
      const Tensor g = RandomTensor({n, m}, 80, -1, 1, dtype);
      const Tensor x = RandomTensor({n, k}, 81, -1, 1, dtype);
      const Tensor w0 = RandomTensor({m, k}, 82);  // what the buffers held before
      const Tensor b0 = RandomTensor({m}, 83);
      MatmulOptions ta;
      ta.trans_a = true;
      const Tensor dw = Matmul(g.To(Dtype::kF32), x.To(Dtype::kF32), ta);
      const Tensor db = AddBiasBackward(g.To(Dtype::kF32));
      const cuda::testing::Tolerance tol = DefaultTolerance(dtype, 4);
      enum class Mode { kFused, kFusingOff, kBiasGradOff };
      for (Mode mode : {Mode::kFused, Mode::kFusingOff, Mode::kBiasGradOff}) {
        // Each gradient added to, or written over NaN (a new buffer's
        // contents): BGRADB then writes grad_b itself.
        for (const auto& [add_w, add_b] : {std::pair{true, true}, std::pair{false, false},
                                           std::pair{false, true}, std::pair{true, false}}) {
          SCOPED_TRACE(absl::StrCat(mode == Mode::kFused       ? "fused"
                                    : mode == Mode::kFusingOff ? "fusing off"
                                                               : "bias-gradient epilogue off",
                                    add_w ? ", dW added" : ", dW written",
                                    add_b ? ", db added" : ", db written"));
          // grad_w: 8 elements into a flat buffer.
          const Tensor flat = ToGpu(Tensor::Zeros({8 + m * k + 8}, Dtype::kF32));
          Tensor grad_w = flat.Narrow(0, 8, m * k).View({m, k});
          grad_w.CopyFrom(ToGpu(add_w ? w0 : Tensor::Full({m, k}, std::nan(""))));
          const Tensor grad_b = ToGpu(add_b ? b0 : Tensor::Full({m}, std::nan("")));
          cuda::SetMatmulFuseEpilogues(mode != Mode::kFusingOff);
          cuda::SetMatmulFuseBiasGrad(mode != Mode::kBiasGradOff);
          const cuda::MatmulCacheStats before = cuda::GetMatmulCacheStats();
          LinearParamGradsInto(ToGpu(g), ToGpu(x), grad_w, grad_b, add_w, add_b);
          const cuda::MatmulCacheStats after = cuda::GetMatmulCacheStats();
          cuda::SetMatmulFuseEpilogues(true);
          cuda::SetMatmulFuseBiasGrad(true);
          EXPECT_EQ(after.epilogues_fused,
                    before.epilogues_fused + (mode == Mode::kFused ? 1 : 0));
          EXPECT_TRUE(MatchesCpu(grad_w, add_w ? Add(w0, dw) : dw, tol));
          EXPECT_TRUE(MatchesCpu(grad_b, add_b ? Add(b0, db) : db, tol));
        }
      }
    }
  }
}

// A bias gradient to write that is a view 4 bytes into a flat buffer (an FSDP
// or DDP bucket's, at an offset cuBLASLt's epilogue cannot take): the GEMM
// still fuses, into a temporary copied into the view; the elements around
// the view are left alone.
TEST(CudaLinearTest, AMisalignedBiasGradientToWriteGoesThroughATemporary) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 45, m = 24, k = 40;
  const Tensor g = RandomTensor({n, m}, 90, -1, 1, Dtype::kBF16);
  const Tensor x = RandomTensor({n, k}, 91, -1, 1, Dtype::kBF16);
  MatmulOptions ta;
  ta.trans_a = true;
  const Tensor db = AddBiasBackward(g.To(Dtype::kF32));
  const Tensor flat = ToGpu(Tensor::Full({m + 2}, std::nan("")));
  const Tensor grad_b = flat.Narrow(0, 1, m);
  const Tensor grad_w = ToGpu(Tensor::Full({m, k}, std::nan("")));
  const cuda::MatmulCacheStats before = cuda::GetMatmulCacheStats();
  LinearParamGradsInto(ToGpu(g), ToGpu(x), grad_w, grad_b, /*accumulate_w=*/false,
                       /*accumulate_b=*/false);
  EXPECT_EQ(cuda::GetMatmulCacheStats().epilogues_fused, before.epilogues_fused + 1);
  const cuda::testing::Tolerance tol = DefaultTolerance(Dtype::kBF16, 4);
  EXPECT_TRUE(MatchesCpu(grad_b, db, tol));
  EXPECT_TRUE(MatchesCpu(grad_w, Matmul(g.To(Dtype::kF32), x.To(Dtype::kF32), ta), tol));
  const std::vector<float> all = cuda::testing::ToCpu(flat).ToVector<float>();
  EXPECT_TRUE(std::isnan(all.front()));
  EXPECT_TRUE(std::isnan(all.back()));
}

// Tuning the fused GEMMs: the bias, GELU (its aux written again by the real
// call), GELU backward and bias-gradient epilogues give the CPU's values.
TEST(CudaLinearTest, TunedEpiloguesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const Dtype dtype = Dtype::kBF16;
  const Case c = MakeCase(72, 56, 88, dtype, 70);  // shapes no other test uses
  const cuda::testing::Tolerance tol = DefaultTolerance(dtype, 4);
  const Tensor x = ToGpu(c.x), w = ToGpu(c.w), b = ToGpu(c.b);
  cuda::SetMatmulTuning(true);
  const cuda::MatmulCacheStats before = cuda::GetMatmulCacheStats();
  const Tensor y = LinearForward(x, w, b);
  const LinearGeluResult r = LinearGeluForward(x, w, b);
  const Tensor g = RandomTensor({72, 88}, 73, -1, 1, dtype);
  const Tensor dx = LinearGeluInputGrad(ToGpu(g), w, x);  // x as GELU's input
  Tensor grad_w = ToGpu(Tensor::Zeros({88, 56}));
  Tensor grad_b = ToGpu(Tensor::Zeros({88}));
  LinearParamGradsInto(ToGpu(g), x, grad_w, grad_b);
  const cuda::MatmulCacheStats after = cuda::GetMatmulCacheStats();
  cuda::SetMatmulTuning(false);
  EXPECT_EQ(after.epilogues_fused, before.epilogues_fused + 4);
  EXPECT_EQ(after.tuned, before.tuned + 4);
  EXPECT_TRUE(MatchesCpu(y.To(Dtype::kF32), c.pre, tol));
  EXPECT_TRUE(MatchesCpu(r.pre.To(Dtype::kF32), c.pre, tol));
  EXPECT_TRUE(MatchesCpu(r.out.To(Dtype::kF32), c.out, tol));
  // The CPU's unfused ops from the same bf16 values.
  const Tensor g32 = g.To(Dtype::kF32), x32 = c.x.To(Dtype::kF32);
  MatmulOptions tw;
  tw.trans_a = true;
  const Tensor want_w = Matmul(g32, x32, tw);  // (88, 56)
  EXPECT_TRUE(MatchesCpu(grad_w, want_w, DefaultTolerance(Dtype::kF32, 72)));
  EXPECT_TRUE(MatchesCpu(grad_b, AddBiasBackward(g32), DefaultTolerance(Dtype::kF32, 72)));
  const Tensor want_dx = GeluBackward(Matmul(g32, c.w.To(Dtype::kF32)), x32);
  EXPECT_TRUE(MatchesCpu(dx.To(Dtype::kF32), want_dx, tol));
}

// Ranks as threads: each fuses with its own bias at once.
TEST(CudaLinearTest, ThreadsFuseWithTheirOwnBias) {
  SKIP_WITHOUT_GPU();
  const Dtype dtype = Dtype::kBF16;
  constexpr int kThreads = 4;
  std::vector<Case> cases;
  for (int t = 0; t < kThreads; ++t) cases.push_back(MakeCase(29, 32, 48, dtype, 60 + 3 * t));
  std::vector<Tensor> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const Tensor x = ToGpu(cases[t].x), w = ToGpu(cases[t].w), b = ToGpu(cases[t].b);
      Tensor out;
      for (int i = 0; i < 3; ++i) out = LinearGeluForward(x, w, b).out;
      results[t] = out.To(Dtype::kF32);
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(MatchesCpu(results[t], cases[t].out, DefaultTolerance(dtype, 4))) << "thread " << t;
  }
}

}  // namespace
}  // namespace tensor
