// LayerNorm and RMSNorm forward and backward on the GPU against the CPU: rows
// per warp and per block, vector and scalar paths (row lengths that are not
// multiples of the vector width), more than 65535 rows, parameters in f32 or
// x's dtype or absent, bit-identical parameter gradients across runs, and
// rows held in registers against rows loaded by each pass.
#include "tensor/ops/norm.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/norm.h"
#include "tensor/cuda/testing.h"
#include "tensor/ops/elementwise.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using cuda::testing::DefaultTolerance;
using cuda::testing::FloatDtypes;
using cuda::testing::MatchesCpu;
using cuda::testing::ToCpu;
using cuda::testing::ToGpu;
using cuda::testing::Tolerance;
using testing::RandomTensor;

// Shapes (rows..., C): warp rows (C <= 1024) and block rows, C a multiple of
// the vector width or not, many rows. norm_race_test (the emulation's race
// check, //:gpu_race_tests) builds this file with NORM_TEST_RACE_SHAPES: the
// same kernels and branches at fewer elements, for the check multiplies the
// emulation's time: 2100 rows where there are 70000 (more than 2048 still
// caps the backward's partial-sum blocks, so some warps sum two rows; both
// are far below the grid-stride limit), and one row of 16500 where there are
// two of 50257 (both cap the row's threads at kMaxRowThreads, each looping
// over more loads; the parameter gradients' column sums cost in C).
std::vector<Shape> Shapes() {
#ifdef NORM_TEST_RACE_SHAPES
  return {{1, 8}, {3, 77}, {4, 5, 768}, {6, 1025}, {5, 4096}, {3, 5003}, {1, 16500}, {2100, 24}};
#else
  return {{1, 8}, {3, 77}, {4, 5, 768}, {6, 1025}, {5, 4096}, {3, 5003}, {2, 50257}, {70000, 24}};
#endif
}

// Parameter dtypes to try with x's dtype d: none, f32, and d itself.
struct ParamCase {
  bool defined;
  Dtype dtype;
};
std::vector<ParamCase> ParamCases(Dtype d) {
  std::vector<ParamCase> cases = {{false, Dtype::kF32}, {true, Dtype::kF32}};
  if (d != Dtype::kF32) cases.push_back({true, d});
  return cases;
}

Tensor MaybeParam(const ParamCase& p, int64_t c, uint64_t seed, float lo, float hi) {
  return p.defined ? RandomTensor({c}, seed, lo, hi, p.dtype) : Tensor();
}

Tensor GpuOrUndefined(const Tensor& t) { return t.defined() ? ToGpu(t) : Tensor(); }

// Tolerance for results that depend on sums over a row of length n.
Tolerance RowTolerance(Dtype d, int64_t n) { return DefaultTolerance(d, n > 4096 ? 10.0 : 2.0); }

// Parameter gradients: column sums over up to 70000 rows, added in another
// order than the CPU's (f32 partial sums, then double); low-precision results
// are dominated by their final rounding.
Tolerance ParamTolerance(Dtype d) {
  return d == Dtype::kF32 ? Tolerance{1e-4, 1e-3} : DefaultTolerance(d, 2.0);
}

TEST(CudaNormTest, LayerNormForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (const Shape& shape : Shapes()) {
    const int64_t c = shape[shape.rank() - 1];
    for (Dtype d : FloatDtypes()) {
      for (const ParamCase& p : ParamCases(d)) {
        SCOPED_TRACE(shape.ToString() + " " + std::string(DtypeName(d)) + " weight " +
                     std::string(p.defined ? DtypeName(p.dtype) : "none"));
        const Tensor x = RandomTensor(shape, ++seed, -2.0f, 3.0f, d);
        const Tensor w = MaybeParam(p, c, ++seed, 0.5f, 1.5f);
        const Tensor b = MaybeParam(p, c, ++seed, -0.5f, 0.5f);
        const LayerNormResult cpu = LayerNorm(x, w, b);
        const LayerNormResult gpu = LayerNorm(ToGpu(x), GpuOrUndefined(w), GpuOrUndefined(b));
        EXPECT_TRUE(MatchesCpu(gpu.y, cpu.y, RowTolerance(d, c)));
        EXPECT_TRUE(MatchesCpu(gpu.mean, cpu.mean, RowTolerance(Dtype::kF32, c)));
        EXPECT_TRUE(MatchesCpu(gpu.rstd, cpu.rstd, RowTolerance(Dtype::kF32, c)));
      }
    }
  }
}

TEST(CudaNormTest, LayerNormBiasWithoutWeightAndEps) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    const Tensor x = RandomTensor({9, 40}, 3, -1.0f, 1.0f, d);
    const Tensor b = RandomTensor({40}, 4, -1.0f, 1.0f, d);
    const LayerNormResult cpu = LayerNorm(x, Tensor(), b, 0.1f);
    const LayerNormResult gpu = LayerNorm(ToGpu(x), Tensor(), ToGpu(b), 0.1f);
    EXPECT_TRUE(MatchesCpu(gpu.y, cpu.y)) << DtypeName(d);
    EXPECT_TRUE(MatchesCpu(gpu.rstd, cpu.rstd)) << DtypeName(d);
  }
}

TEST(CudaNormTest, LayerNormBackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (const Shape& shape : Shapes()) {
    const int64_t c = shape[shape.rank() - 1];
    for (Dtype d : FloatDtypes()) {
      for (const ParamCase& p : ParamCases(d)) {
        SCOPED_TRACE(shape.ToString() + " " + std::string(DtypeName(d)) + " weight " +
                     std::string(p.defined ? DtypeName(p.dtype) : "none"));
        const Tensor x = RandomTensor(shape, ++seed, -2.0f, 3.0f, d);
        const Tensor gy = RandomTensor(shape, ++seed, -1.0f, 1.0f, d);
        const Tensor w = MaybeParam(p, c, ++seed, 0.5f, 1.5f);
        // The same saved statistics on both sides: only the backward is compared.
        const LayerNormResult fwd = LayerNorm(x, w, Tensor());
        const LayerNormGrads cpu = LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd);
        const LayerNormGrads gpu = LayerNormBackward(ToGpu(gy), ToGpu(x), GpuOrUndefined(w),
                                                     ToGpu(fwd.mean), ToGpu(fwd.rstd));
        EXPECT_TRUE(MatchesCpu(gpu.grad_x, cpu.grad_x, RowTolerance(d, c)));
        EXPECT_EQ(gpu.grad_weight.defined(), cpu.grad_weight.defined());
        if (cpu.grad_weight.defined()) {
          EXPECT_TRUE(MatchesCpu(gpu.grad_weight, cpu.grad_weight,
                                 ParamTolerance(cpu.grad_weight.dtype())));
        }
        EXPECT_TRUE(
            MatchesCpu(gpu.grad_bias, cpu.grad_bias, ParamTolerance(cpu.grad_bias.dtype())));
      }
    }
  }
}

// grad_x_add (a residual's gradient added by the backward kernel), as the
// CPU's: a row the vector path takes and one it does not, each dtype.
TEST(CudaNormTest, BackwardAddsTheGivenGradientAsTheCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 300;
  for (const Shape& shape : {Shape{4, 5, 768}, Shape{3, 77}}) {
    const int64_t c = shape[shape.rank() - 1];
    for (Dtype d : FloatDtypes()) {
      SCOPED_TRACE(shape.ToString() + " " + std::string(DtypeName(d)));
      const Tensor x = RandomTensor(shape, ++seed, -2.0f, 3.0f, d);
      const Tensor gy = RandomTensor(shape, ++seed, -1.0f, 1.0f, d);
      const Tensor add = RandomTensor(shape, ++seed, -1.0f, 1.0f, d);
      const Tensor w = RandomTensor({c}, ++seed, 0.5f, 1.5f);
      const LayerNormResult fwd = LayerNorm(x, w, Tensor());
      const LayerNormGrads cpu = LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd, add);
      const LayerNormGrads gpu = LayerNormBackward(ToGpu(gy), ToGpu(x), ToGpu(w), ToGpu(fwd.mean),
                                                   ToGpu(fwd.rstd), ToGpu(add));
      EXPECT_TRUE(MatchesCpu(gpu.grad_x, cpu.grad_x, RowTolerance(d, c)));
      const RmsNormResult rms = RmsNorm(x, w);
      EXPECT_TRUE(MatchesCpu(
          RmsNormBackward(ToGpu(gy), ToGpu(x), ToGpu(w), ToGpu(rms.rstd), ToGpu(add)).grad_x,
          RmsNormBackward(gy, x, w, rms.rstd, add).grad_x, RowTolerance(d, c)));
    }
  }
}

// NormGradsInto on the device: the parameter gradients added into f32
// buffers by the column-sum kernel are the bits of the returned f32 gradients
// added by AddInPlace (a weight in x's dtype too: the sums are the same, only
// not rounded to it), warp rows (partial sums in the grad_x kernel) and block
// rows (the partial-sum kernel), one buffer or both; grad_x unchanged.
TEST(CudaNormTest, ParameterGradientsAddedIntoBuffersAreTheReturnedOnesAdded) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (const Shape& shape : {Shape{4, 5, 768}, Shape{3, 77}, Shape{5, 4096}}) {
    const int64_t c = shape[shape.rank() - 1];
    for (Dtype d : FloatDtypes()) {
      SCOPED_TRACE(shape.ToString() + " " + std::string(DtypeName(d)));
      const Tensor x = ToGpu(RandomTensor(shape, ++seed, -2.0f, 3.0f, d));
      const Tensor gy = ToGpu(RandomTensor(shape, ++seed, -1.0f, 1.0f, d));
      const Tensor w32 = ToGpu(RandomTensor({c}, ++seed, 0.5f, 1.5f));
      const Tensor b32 = ToGpu(RandomTensor({c}, ++seed, -0.5f, 0.5f));
      const Tensor old_w = ToGpu(RandomTensor({c}, ++seed, -1.0f, 1.0f));
      const Tensor old_b = ToGpu(RandomTensor({c}, ++seed, -1.0f, 1.0f));
      const LayerNormResult fwd = LayerNorm(x, w32, b32);
      const LayerNormGrads plain = LayerNormBackward(gy, x, w32, fwd.mean, fwd.rstd);
      Tensor want_w = old_w.Clone(), want_b = old_b.Clone();
      AddInPlace(want_w, plain.grad_weight);
      AddInPlace(want_b, plain.grad_bias);
      for (const Tensor& w : {w32, w32.To(d)}) {
        SCOPED_TRACE(std::string("weight ") + std::string(DtypeName(w.dtype())));
        NormGradsInto both{old_w.Clone(), old_b.Clone()};
        const LayerNormGrads got =
            LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd, Tensor(), both);
        EXPECT_FALSE(got.grad_weight.defined());
        EXPECT_FALSE(got.grad_bias.defined());
        // grad_x as with the weight's values in f32 (the parameter sums do not read it).
        const Tensor want_x =
            LayerNormBackward(gy, x, w.To(Dtype::kF32), fwd.mean, fwd.rstd).grad_x;
        EXPECT_EQ(ToCpu(got.grad_x).ToVector<float>(), ToCpu(want_x).ToVector<float>());
        EXPECT_EQ(ToCpu(both.weight).ToVector<float>(), ToCpu(want_w).ToVector<float>());
        EXPECT_EQ(ToCpu(both.bias).ToVector<float>(), ToCpu(want_b).ToVector<float>());
        NormGradsInto weight_only{old_w.Clone(), Tensor()};
        const LayerNormGrads some =
            LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd, Tensor(), weight_only);
        EXPECT_EQ(ToCpu(weight_only.weight).ToVector<float>(), ToCpu(want_w).ToVector<float>());
        EXPECT_EQ(some.grad_bias.dtype(), w.dtype());
        EXPECT_EQ(ToCpu(some.grad_bias).ToVector<float>(),
                  ToCpu(plain.grad_bias.To(w.dtype())).ToVector<float>());
        // Written, not added (buffers of NaN, as new gradients may hold): the
        // returned f32 gradients' bits.
        const Tensor nan = ToGpu(Tensor::Full({c}, std::nan("")));
        NormGradsInto written{nan.Clone(), nan.Clone()};
        written.add_weight = written.add_bias = false;
        LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd, Tensor(), written);
        EXPECT_EQ(ToCpu(written.weight).ToVector<float>(),
                  ToCpu(plain.grad_weight).ToVector<float>());
        EXPECT_EQ(ToCpu(written.bias).ToVector<float>(), ToCpu(plain.grad_bias).ToVector<float>());
      }
      const RmsNormResult rms = RmsNorm(x, w32);
      Tensor rwant = old_w.Clone();
      AddInPlace(rwant, RmsNormBackward(gy, x, w32, rms.rstd).grad_weight);
      NormGradsInto rinto{old_w.Clone(), Tensor()};
      EXPECT_FALSE(RmsNormBackward(gy, x, w32.To(d), rms.rstd, Tensor(), rinto)
                       .grad_weight.defined());
      EXPECT_EQ(ToCpu(rinto.weight).ToVector<float>(), ToCpu(rwant).ToVector<float>());
      NormGradsInto rwritten{ToGpu(Tensor::Full({c}, std::nan(""))), Tensor()};
      rwritten.add_weight = false;
      RmsNormBackward(gy, x, w32.To(d), rms.rstd, Tensor(), rwritten);
      EXPECT_EQ(ToCpu(rwritten.weight).ToVector<float>(),
                ToCpu(RmsNormBackward(gy, x, w32, rms.rstd).grad_weight).ToVector<float>());
    }
  }
}

TEST(CudaNormTest, RmsNormForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 200;
  for (const Shape& shape : Shapes()) {
    const int64_t c = shape[shape.rank() - 1];
    for (Dtype d : FloatDtypes()) {
      for (const ParamCase& p : ParamCases(d)) {
        SCOPED_TRACE(shape.ToString() + " " + std::string(DtypeName(d)) + " weight " +
                     std::string(p.defined ? DtypeName(p.dtype) : "none"));
        const Tensor x = RandomTensor(shape, ++seed, -2.0f, 3.0f, d);
        const Tensor gy = RandomTensor(shape, ++seed, -1.0f, 1.0f, d);
        const Tensor w = MaybeParam(p, c, ++seed, 0.5f, 1.5f);
        const RmsNormResult cpu = RmsNorm(x, w);
        const RmsNormResult gpu = RmsNorm(ToGpu(x), GpuOrUndefined(w));
        EXPECT_TRUE(MatchesCpu(gpu.y, cpu.y, RowTolerance(d, c)));
        EXPECT_TRUE(MatchesCpu(gpu.rstd, cpu.rstd, RowTolerance(Dtype::kF32, c)));
        const RmsNormGrads gcpu = RmsNormBackward(gy, x, w, cpu.rstd);
        const RmsNormGrads ggpu =
            RmsNormBackward(ToGpu(gy), ToGpu(x), GpuOrUndefined(w), ToGpu(cpu.rstd));
        EXPECT_TRUE(MatchesCpu(ggpu.grad_x, gcpu.grad_x, RowTolerance(d, c)));
        EXPECT_EQ(ggpu.grad_weight.defined(), gcpu.grad_weight.defined());
        if (gcpu.grad_weight.defined()) {
          EXPECT_TRUE(MatchesCpu(ggpu.grad_weight, gcpu.grad_weight,
                                 ParamTolerance(gcpu.grad_weight.dtype())));
        }
      }
    }
  }
}

TEST(CudaNormTest, ParameterGradientsAreBitIdenticalAcrossRuns) {
  SKIP_WITHOUT_GPU();
  const Tensor x = ToGpu(RandomTensor({3000, 768}, 7, -2.0f, 2.0f, Dtype::kBF16));
  const Tensor gy = ToGpu(RandomTensor({3000, 768}, 8, -1.0f, 1.0f, Dtype::kBF16));
  const Tensor w = ToGpu(RandomTensor({768}, 9, 0.5f, 1.5f));
  const LayerNormResult fwd = LayerNorm(x, w, Tensor());
  const LayerNormGrads a = LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd);
  const LayerNormGrads b = LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd);
  EXPECT_EQ(ToCpu(a.grad_weight).ToVector<float>(), ToCpu(b.grad_weight).ToVector<float>());
  EXPECT_EQ(ToCpu(a.grad_bias).ToVector<float>(), ToCpu(b.grad_bias).ToVector<float>());
  EXPECT_EQ(ToCpu(a.grad_x).ToVector<float>(), ToCpu(b.grad_x).ToVector<float>());
}

// The lanes' packs held in registers (cuda::NormHoldRows, the default for
// 16-bit warp rows in 16-byte packs) and loaded by each pass give the same
// bits: LayerNorm and RMSNorm, forward and backward with the residual's
// gradient and the parameter gradients (written and added into buffers), at
// rows of 1 to 4 packs a lane (C 8 .. 1024; 1000: some lanes' last pack
// missing), weights in f32 and in x's dtype.
TEST(CudaNormTest, HeldRowsGiveTheBitsOfLoadedOnes) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 700;
  auto bits = [](const Tensor& t) { return ToCpu(t.To(Dtype::kF32)).ToVector<float>(); };
  for (int64_t c : {8, 264, 512, 768, 1000, 1024}) {
    for (Dtype d : {Dtype::kBF16, Dtype::kF16}) {
      for (Dtype wd : {Dtype::kF32, d}) {
        SCOPED_TRACE("C " + std::to_string(c) + " " + std::string(DtypeName(d)) + " weight " +
                     std::string(DtypeName(wd)));
        const Tensor x = ToGpu(RandomTensor({37, c}, ++seed, -2.0f, 3.0f, d));
        const Tensor gy = ToGpu(RandomTensor({37, c}, ++seed, -1.0f, 1.0f, d));
        const Tensor add = ToGpu(RandomTensor({37, c}, ++seed, -1.0f, 1.0f, d));
        const Tensor w = ToGpu(RandomTensor({c}, ++seed, 0.5f, 1.5f, wd));
        const Tensor b = ToGpu(RandomTensor({c}, ++seed, -0.5f, 0.5f, wd));
        const Tensor old = ToGpu(RandomTensor({c}, ++seed, -1.0f, 1.0f));
        auto run = [&](bool hold) {
          cuda::SetNormHoldRows(hold);
          std::vector<std::vector<float>> out;
          const LayerNormResult ln = LayerNorm(x, w, b);
          const LayerNormGrads lg = LayerNormBackward(gy, x, w, ln.mean, ln.rstd, add);
          NormGradsInto into{old.Clone(), old.Clone()};
          const Tensor gx_into = LayerNormBackward(gy, x, w, ln.mean, ln.rstd, add, into).grad_x;
          const RmsNormResult rms = RmsNorm(x, w);
          const RmsNormGrads rg = RmsNormBackward(gy, x, w, rms.rstd);
          NormGradsInto rinto{ToGpu(Tensor::Full({c}, std::nan(""))), Tensor()};
          rinto.add_weight = false;
          const Tensor rgx_into = RmsNormBackward(gy, x, w, rms.rstd, add, rinto).grad_x;
          for (const Tensor& t : {ln.y, ln.mean, ln.rstd, lg.grad_x, lg.grad_weight, lg.grad_bias,
                                  gx_into, into.weight, into.bias, rms.y, rms.rstd, rg.grad_x,
                                  rg.grad_weight, rgx_into, rinto.weight}) {
            out.push_back(bits(t));
          }
          return out;
        };
        const std::vector<std::vector<float>> loaded = run(false), held = run(true);
        ASSERT_EQ(held.size(), loaded.size());
        for (size_t i = 0; i < held.size(); ++i) EXPECT_EQ(held[i], loaded[i]) << "result " << i;
      }
    }
  }
  cuda::SetNormHoldRows(true);
}

TEST(CudaNormTest, StridedInputAndOutputsOnTheDevice) {
  SKIP_WITHOUT_GPU();
  const Tensor x = RandomTensor({40, 6}, 11, -1.0f, 1.0f);  // normalized over 40 after transpose
  const LayerNormResult cpu = LayerNorm(x.Transpose(0, 1), Tensor(), Tensor());
  const LayerNormResult gpu = LayerNorm(ToGpu(x).Transpose(0, 1), Tensor(), Tensor());
  EXPECT_TRUE(MatchesCpu(gpu.y, cpu.y));
  EXPECT_TRUE(gpu.mean.device().is_cuda());
}

TEST(CudaNormTest, MixedDevicesAreAnError) {
  SKIP_WITHOUT_GPU();
  const Tensor x = RandomTensor({2, 8}, 12);
  EXPECT_THROW(LayerNorm(ToGpu(x), Tensor::Full({8}, 1.0), Tensor()), OpError);
  EXPECT_THROW(RmsNorm(x, ToGpu(Tensor::Full({8}, 1.0))), OpError);
  const RmsNormResult fwd = RmsNorm(ToGpu(x), Tensor());
  EXPECT_THROW(RmsNormBackward(x, ToGpu(x), Tensor(), fwd.rstd), OpError);
}

}  // namespace
}  // namespace tensor
