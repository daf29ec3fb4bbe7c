// Tests of the matmul family against a naive triple loop in double: trans
// flags, batching and broadcast, strided views, bf16, MatmulInto's beta, empty
// dims, both GEMM backends, the backward by finite differences, and errors.
#include "tensor/ops/matmul.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "tensor/cpu/matmul.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using ::tensor::testing::AllClose;
using ::tensor::testing::Dot;
using ::tensor::testing::NumericalGradient;
using ::tensor::testing::RandomTensor;

// op(a) @ op(b) by the triple loop in double, on a's and b's values as floats
// (bf16 inputs: their rounded values), with Matmul's broadcast rule. f32 result.
Tensor Reference(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const Tensor a3 = a.To(Dtype::kF32).Contiguous().Reshape({-1, a.dim(-2), a.dim(-1)});
  const Tensor b3 = b.To(Dtype::kF32).Contiguous().Reshape({-1, b.dim(-2), b.dim(-1)});
  const std::vector<float> va = a3.ToVector<float>();
  const std::vector<float> vb = b3.ToVector<float>();
  const int64_t m = trans_a ? a.dim(-1) : a.dim(-2);
  const int64_t k = trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t n = trans_b ? b.dim(-2) : b.dim(-1);
  Shape shape;
  const Tensor& batched = a.rank() > 2 ? a : b;
  for (int i = 0; i + 2 < batched.rank(); ++i) shape.push_back(batched.dim(i));
  shape.push_back(m);
  shape.push_back(n);
  const int64_t count = std::max(a3.dim(0), b3.dim(0));
  const int64_t a_cols = a.dim(-1);
  const int64_t b_cols = b.dim(-1);
  std::vector<float> out(shape.numel());
  for (int64_t i = 0; i < count; ++i) {
    const float* pa = va.data() + (a.rank() > 2 ? i : 0) * a.dim(-2) * a.dim(-1);
    const float* pb = vb.data() + (b.rank() > 2 ? i : 0) * b.dim(-2) * b.dim(-1);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        double s = 0;
        for (int64_t j = 0; j < k; ++j) {
          const double x = trans_a ? pa[j * a_cols + r] : pa[r * a_cols + j];
          const double y = trans_b ? pb[c * b_cols + j] : pb[j * b_cols + c];
          s += x * y;
        }
        out[(i * m + r) * n + c] = static_cast<float>(s);
      }
    }
  }
  return Tensor::FromVector(out, shape);
}

// Runs the test body under one GEMM backend and restores the previous one.
class ScopedBackend {
 public:
  explicit ScopedBackend(cpu::GemmBackend backend) : previous_(cpu::GetGemmBackend()) {
    cpu::SetGemmBackend(backend);
  }
  ~ScopedBackend() { cpu::SetGemmBackend(previous_); }

 private:
  cpu::GemmBackend previous_;
};

const char* BackendName(cpu::GemmBackend backend) {
  return backend == cpu::GemmBackend::kOneDnn ? "onednn" : "openblas";
}

// Asserts that the calling thread's last GEMM ran on `backend`.
void ExpectRanOn(cpu::GemmBackend backend) {
  const std::string path = cpu::LastGemmPath();
  EXPECT_EQ(path.rfind(BackendName(backend), 0), 0u) << "last GEMM ran on " << path;
}

// oneDNN 2.6 runs bf16 fast only with AVX512-BF16 (or AMX); elsewhere (or
// under ONEDNN_MAX_CPU_ISA=AVX2) the oneDNN backend falls back to OpenBLAS on
// purpose, so only check the path where oneDNN may use those instructions.
void ExpectBf16RanOn(cpu::GemmBackend backend) {
  const unsigned isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const unsigned bf16_isa = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  if (backend == cpu::GemmBackend::kOpenBlas || (isa & bf16_isa) == bf16_isa) {
    ExpectRanOn(backend);
  }
}

constexpr double kF32Tol = 1e-4;

// ---- Forward, on both backends ----

class MatmulBackendTest : public ::testing::TestWithParam<cpu::GemmBackend> {
 protected:
  ScopedBackend backend_{GetParam()};
};

TEST_P(MatmulBackendTest, PlainAndTransposedMatchReference) {
  const int64_t m = 37, k = 53, n = 29;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      const Tensor a = RandomTensor(ta ? Shape{k, m} : Shape{m, k}, 1);
      const Tensor b = RandomTensor(tb ? Shape{n, k} : Shape{k, n}, 2);
      const Tensor c = Matmul(a, b, {ta, tb});
      ExpectRanOn(GetParam());
      EXPECT_EQ(c.shape(), Shape({m, n}));
      EXPECT_EQ(c.dtype(), Dtype::kF32);
      EXPECT_TRUE(AllClose(c, Reference(a, b, ta, tb), kF32Tol, kF32Tol));
    }
  }
}

TEST_P(MatmulBackendTest, Batched3DAnd4D) {
  const Tensor a3 = RandomTensor({3, 9, 17}, 3);
  const Tensor b3 = RandomTensor({3, 17, 11}, 4);
  EXPECT_TRUE(AllClose(Matmul(a3, b3), Reference(a3, b3, false, false), kF32Tol, kF32Tol));
  ExpectRanOn(GetParam());

  const Tensor a4 = RandomTensor({2, 3, 17, 9}, 5);   // trans_a: (..., K, M)
  const Tensor b4 = RandomTensor({2, 3, 11, 17}, 6);  // trans_b: (..., N, K)
  const Tensor c4 = Matmul(a4, b4, {true, true});
  EXPECT_EQ(c4.shape(), Shape({2, 3, 9, 11}));
  EXPECT_TRUE(AllClose(c4, Reference(a4, b4, true, true), kF32Tol, kF32Tol));
}

TEST_P(MatmulBackendTest, BroadcastsTwoDimensionalOperand) {
  // The Linear layer: x (B, T, C) @ W^T with W (C_out, C).
  const Tensor x = RandomTensor({4, 6, 32}, 7);
  const Tensor w = RandomTensor({24, 32}, 8);
  const Tensor y = Matmul(x, w, {false, true});
  EXPECT_EQ(y.shape(), Shape({4, 6, 24}));
  EXPECT_TRUE(AllClose(y, Reference(x, w, false, true), kF32Tol, kF32Tol));
  // 2-D a over b's batch.
  const Tensor a = RandomTensor({5, 32}, 9);
  const Tensor b = RandomTensor({2, 3, 32, 7}, 10);
  const Tensor c = Matmul(a, b);
  EXPECT_EQ(c.shape(), Shape({2, 3, 5, 7}));
  EXPECT_TRUE(AllClose(c, Reference(a, b, false, false), kF32Tol, kF32Tol));
  // b broadcast over a transposed (not foldable) batch.
  const Tensor at = RandomTensor({3, 32, 5}, 11);
  const Tensor c2 = Matmul(at, w, {true, true});
  EXPECT_TRUE(AllClose(c2, Reference(at, w, true, true), kF32Tol, kF32Tol));
}

TEST_P(MatmulBackendTest, StridedViews) {
  // A Transpose view is the same as trans_a.
  const Tensor base = RandomTensor({40, 30}, 12);
  const Tensor b = RandomTensor({40, 20}, 13);
  const Tensor at = base.Transpose(0, 1);  // (30, 40), column major
  EXPECT_TRUE(AllClose(Matmul(at, b), Reference(base, b, true, false), kF32Tol, kF32Tol));
  // Narrow columns: row major with a leading dimension larger than the width.
  const Tensor wide = RandomTensor({30, 64}, 14);
  const Tensor narrowed = wide.Narrow(1, 8, 40);  // (30, 40), row stride 64
  EXPECT_FALSE(narrowed.is_contiguous());
  EXPECT_TRUE(AllClose(Matmul(narrowed, b), Reference(narrowed.Contiguous(), b, false, false),
                       kF32Tol, kF32Tol));
  // Narrowed columns as an (N, K) operand with trans_b: column major, ld 64,
  // starting at an odd offset.
  const Tensor bt = RandomTensor({20, 64}, 15).Narrow(1, 3, 40);  // (20, 40)
  EXPECT_TRUE(AllClose(Matmul(narrowed, bt, {false, true}),
                       Reference(narrowed.Contiguous(), bt.Contiguous(), false, true), kF32Tol,
                       kF32Tol));
  // Attention heads: (B, T, H, D) viewed as (B, H, T, D), times its transpose.
  const Tensor q = RandomTensor({2, 8, 3, 16}, 16).Transpose(1, 2);  // (2, 3, 8, 16)
  const Tensor kk = RandomTensor({2, 8, 3, 16}, 17).Transpose(1, 2);
  EXPECT_TRUE(AllClose(Matmul(q, kk, {false, true}),
                       Reference(q.Contiguous(), kk.Contiguous(), false, true), kF32Tol, kF32Tol));
  // No unit stride at all (every other element of the last dim): copied first.
  const Tensor pairs = RandomTensor({30, 40, 2}, 18);
  const Tensor strided = pairs.Select(2, 1);  // (30, 40), strides (80, 2)
  EXPECT_TRUE(AllClose(Matmul(strided, b), Reference(strided.Contiguous(), b, false, false),
                       kF32Tol, kF32Tol));
}

TEST_P(MatmulBackendTest, Bf16InputsBf16AndF32Outputs) {
  for (bool tb : {false, true}) {
    const Tensor a = RandomTensor({2, 33, 48}, 19, -1, 1, Dtype::kBF16);
    const Tensor b = RandomTensor(tb ? Shape{40, 48} : Shape{48, 40}, 20, -1, 1, Dtype::kBF16);
    const Tensor ref = Reference(a, b, false, tb);  // on the bf16-rounded inputs
    const Tensor c16 = Matmul(a, b, {false, tb});
    ExpectBf16RanOn(GetParam());
    EXPECT_EQ(c16.dtype(), Dtype::kBF16);
    // bf16 output: one rounding to 8 significant bits.
    EXPECT_TRUE(AllClose(c16, ref, 1e-2, 8e-3));
    MatmulOptions f32_out{false, tb, Dtype::kF32};
    const Tensor c32 = Matmul(a, b, f32_out);
    EXPECT_EQ(c32.dtype(), Dtype::kF32);
    // f32 output: products of bf16 values are exact in f32; only the fp32
    // accumulation differs from the double reference.
    EXPECT_TRUE(AllClose(c32, ref, kF32Tol, kF32Tol));
  }
}

TEST_P(MatmulBackendTest, IntoWithBeta) {
  const Tensor a = RandomTensor({3, 12, 20}, 21);
  const Tensor b = RandomTensor({20, 16}, 22);
  const Tensor ref = Reference(a, b, false, false);
  // beta = 0 ignores what out held, NaN included.
  Tensor out = Tensor::Full({3, 12, 16}, std::numeric_limits<double>::quiet_NaN());
  MatmulInto(a, b, out, {}, 0.0f);
  EXPECT_TRUE(AllClose(out, ref, kF32Tol, kF32Tol));
  // beta = 1 accumulates: out = ref + ref.
  MatmulInto(a, b, out, {}, 1.0f);
  const std::vector<float> r = ref.ToVector<float>();
  std::vector<float> twice(r.size());
  for (size_t i = 0; i < r.size(); ++i) twice[i] = 2 * r[i];
  EXPECT_TRUE(AllClose(out, Tensor::FromVector(twice, ref.shape()), 2 * kF32Tol, kF32Tol));
  // beta = 0.5: out = ref + 0.5 * (2 ref) = 2 ref.
  MatmulInto(a, b, out, {}, 0.5f);
  EXPECT_TRUE(AllClose(out, Tensor::FromVector(twice, ref.shape()), 2 * kF32Tol, kF32Tol));
}

// A row-padded output (a language-model head's logits with their rows
// rounded up to an aligned length): the GEMM writes the rows in place and
// leaves the padding alone.
TEST_P(MatmulBackendTest, IntoRowPaddedView) {
  const Tensor a = RandomTensor({2, 6, 20}, 26, -1, 1, Dtype::kBF16);
  const Tensor b = RandomTensor({13, 20}, 27, -1, 1, Dtype::kBF16);
  MatmulOptions tb;
  tb.trans_b = true;
  const Tensor ref = Matmul(a, b, tb);  // (2, 6, 13), contiguous
  const Tensor buffer = Tensor::Full({12, 16}, 7.0, Dtype::kBF16);
  const Tensor out = buffer.Narrow(1, 0, 13).Reshape({2, 6, 13});  // rows 16 apart
  ASSERT_EQ(out.RowStride(), 16);
  MatmulInto(a, b, out, tb);
  EXPECT_TRUE(AllClose(out, ref, 1e-2, 1e-2));  // bf16 results: a rounding apart at most
  for (float pad : buffer.Narrow(1, 13, 3).ToVector<float>()) EXPECT_EQ(pad, 7.0f);
}

// Attention's heads written where the projection that follows reads them:
// out (B, nh, T, hs) is a view of a (B, T, nh * hs) buffer, so its batch
// items (heads) interleave along the rows. f32 and bf16, overwritten and
// accumulated (beta 1), against the contiguous product.
TEST_P(MatmulBackendTest, IntoHeadsInterleavedInTheirRows) {
  constexpr int64_t B = 2, nh = 3, T = 5, hs = 4;
  for (Dtype dt : {Dtype::kF32, Dtype::kBF16}) {
    SCOPED_TRACE(DtypeName(dt));
    const Tensor p = RandomTensor({B, nh, T, T}, 28, -1, 1, dt);
    const Tensor v = RandomTensor({B, T, 3, nh, hs}, 29, -1, 1, dt).Select(2, 1).Transpose(1, 2);
    const Tensor ref = Matmul(p, v);  // (B, nh, T, hs), contiguous
    const Tensor buffer = Tensor::Full({B, T, nh * hs}, 7.0, dt);
    const Tensor out = buffer.View({B, T, nh, hs}).Transpose(1, 2);  // (B, nh, T, hs)
    ASSERT_EQ(out.RowStride(), -1);
    MatmulInto(p, v, out);
    // oneDNN takes these strides (no fallback to OpenBLAS).
    if (dt == Dtype::kF32)
      ExpectRanOn(GetParam());
    else
      ExpectBf16RanOn(GetParam());
    const double tol = dt == Dtype::kF32 ? kF32Tol : 1e-2;
    EXPECT_TRUE(AllClose(out, ref, tol, tol));
    MatmulInto(p, v, out, {}, 1.0f);  // out = 2 ref
    std::vector<float> twice = ref.ToVector<float>();
    for (float& x : twice) x *= 2;
    EXPECT_TRUE(AllClose(out, Tensor::FromVector(twice, ref.shape()), 2 * tol, 2 * tol));
  }
}

TEST_P(MatmulBackendTest, Bf16IntoF32AccumulatesGradients) {
  // Mixed precision: bf16 products accumulated into an fp32 gradient buffer.
  const Tensor x = RandomTensor({16, 24}, 23, -1, 1, Dtype::kBF16);
  const Tensor g = RandomTensor({16, 8}, 24, -1, 1, Dtype::kBF16);
  const Tensor start = RandomTensor({24, 8}, 25);
  Tensor grad = start.Clone();
  MatmulInto(x, g, grad, {true, false}, 1.0f);
  const std::vector<float> ref = Reference(x, g, true, false).ToVector<float>();
  const std::vector<float> s = start.ToVector<float>();
  std::vector<float> expected(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) expected[i] = s[i] + ref[i];
  EXPECT_TRUE(AllClose(grad, Tensor::FromVector(expected, {24, 8}), kF32Tol, kF32Tol));
  ExpectBf16RanOn(GetParam());
  // Into a bf16 buffer with beta = 1.
  Tensor grad16 = start.To(Dtype::kBF16);
  MatmulInto(x, g, grad16, {true, false}, 1.0f);
  EXPECT_TRUE(AllClose(grad16, Tensor::FromVector(expected, {24, 8}), 2e-2, 8e-3));
}

TEST_P(MatmulBackendTest, EmptyDimensions) {
  // M = 0.
  const Tensor c0 = Matmul(RandomTensor({0, 5}, 26), RandomTensor({5, 3}, 27));
  EXPECT_EQ(c0.shape(), Shape({0, 3}));
  // Empty batch.
  EXPECT_EQ(Matmul(RandomTensor({0, 4, 5}, 28), RandomTensor({5, 3}, 29)).shape(),
            Shape({0, 4, 3}));
  // K = 0 gives zeros (out held NaN), and beta = 1 leaves out as it was.
  const Tensor a = Tensor::Empty({4, 0});
  const Tensor b = Tensor::Empty({0, 3});
  EXPECT_TRUE(AllClose(Matmul(a, b), Tensor::Zeros({4, 3}), 0, 0));
  Tensor out = Tensor::Full({4, 3}, std::numeric_limits<double>::quiet_NaN());
  MatmulInto(a, b, out);
  EXPECT_TRUE(AllClose(out, Tensor::Zeros({4, 3}), 0, 0));
  Tensor ones = Tensor::Full({4, 3}, 1.0);
  MatmulInto(a, b, ones, {}, 1.0f);
  EXPECT_TRUE(AllClose(ones, Tensor::Full({4, 3}, 1.0), 0, 0));
  EXPECT_TRUE(
      AllClose(Matmul(Tensor::Empty({2, 4, 0}, Dtype::kBF16), Tensor::Empty({0, 3}, Dtype::kBF16)),
               Tensor::Zeros({2, 4, 3}), 0, 0));
  // K = 0 into a row-padded view: its elements zeroed, the padding untouched.
  Tensor padded = Tensor::Full({4, 8}, 7.0);
  MatmulInto(a, b, padded.Narrow(1, 0, 3));
  std::vector<float> want(4 * 8, 7.0f);
  for (int r = 0; r < 4; ++r) std::fill_n(want.begin() + r * 8, 3, 0.0f);
  EXPECT_EQ(padded.ToVector<float>(), want);
  // The backward of a broadcast operand with an empty M, N or K.
  for (const auto& [as, bs] : std::vector<std::pair<Shape, Shape>>{
           {Shape({2, 4, 0}), Shape({0, 3})},   // K = 0, b broadcast
           {Shape({2, 0, 5}), Shape({5, 3})},   // M = 0, b broadcast
           {Shape({4, 0}), Shape({2, 0, 3})},   // K = 0, a broadcast
           {Shape({4, 5}), Shape({2, 5, 0})}})  // N = 0, a broadcast
  {
    SCOPED_TRACE(as.ToString() + " @ " + bs.ToString());
    const Tensor x = Tensor::Zeros(as), y = Tensor::Zeros(bs);
    const Tensor g = Tensor::Full(Matmul(x, y).shape(), 1.0);
    const MatmulGrads grads = MatmulBackward(g, x, y);
    EXPECT_TRUE(AllClose(grads.grad_a, Tensor::Zeros(as), 0, 0));
    EXPECT_TRUE(AllClose(grads.grad_b, Tensor::Zeros(bs), 0, 0));
  }
}

TEST_P(MatmulBackendTest, VectorShapedMatrices) {
  // M = 1, N = 1 and K = 1, where strides of size-1 dims are arbitrary.
  const Tensor row = RandomTensor({1, 30}, 30);
  const Tensor col = RandomTensor({30, 1}, 31);
  EXPECT_TRUE(AllClose(Matmul(row, col), Reference(row, col, false, false), kF32Tol, kF32Tol));
  EXPECT_TRUE(AllClose(Matmul(col, row), Reference(col, row, false, false), kF32Tol, kF32Tol));
  // One output column with a column stride other than 1 (a row's transpose).
  const Tensor m = RandomTensor({4, 30}, 33);
  Tensor out_row = Tensor::Empty({1, 4});
  MatmulInto(m, col, out_row.Transpose(0, 1));  // (4, 1), strides (1, 4)
  EXPECT_TRUE(AllClose(out_row.Transpose(0, 1), Reference(m, col, false, false), kF32Tol,
                       kF32Tol));
  const Tensor x = RandomTensor({5, 1, 30}, 32);  // batch of rows times a shared matrix
  const Tensor w = RandomTensor({30, 7}, 33);
  EXPECT_TRUE(AllClose(Matmul(x, w), Reference(x, w, false, false), kF32Tol, kF32Tol));
}

TEST_P(MatmulBackendTest, ConcurrentCallsFromThreads) {
  // Ranks as threads: the same primitives used from several threads at once.
  const Tensor a = RandomTensor({4, 48, 64}, 38);
  const Tensor w = RandomTensor({32, 64}, 39);
  const Tensor ref = Reference(a, w, false, true);
  const Tensor a16 = a.To(Dtype::kBF16);
  const Tensor w16 = w.To(Dtype::kBF16);
  const Tensor ref16 = Reference(a16, w16, false, true);
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      bool good = true;
      for (int i = 0; i < 20; ++i) {
        good = good && AllClose(Matmul(a, w, {false, true}), ref, kF32Tol, kF32Tol);
        good =
            good && AllClose(Matmul(a16, w16, {false, true, Dtype::kF32}), ref16, kF32Tol, kF32Tol);
      }
      ok[t] = good;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(ok[t]) << "thread " << t;
}

INSTANTIATE_TEST_SUITE_P(Backends, MatmulBackendTest,
                         ::testing::Values(cpu::GemmBackend::kOneDnn, cpu::GemmBackend::kOpenBlas),
                         [](const ::testing::TestParamInfo<cpu::GemmBackend>& info) {
                           return std::string(BackendName(info.param));
                         });

// ---- oneDNN specifics ----

TEST(MatmulOneDnnTest, CachesPrimitivesByShape) {
  ScopedBackend backend(cpu::GemmBackend::kOneDnn);
  const Tensor a = RandomTensor({19, 23}, 34);
  const Tensor b = RandomTensor({23, 31}, 35);
  Matmul(a, b);
  const cpu::GemmCacheStats before = cpu::GetGemmCacheStats();
  Matmul(RandomTensor({19, 23}, 36), RandomTensor({23, 31}, 37));
  const cpu::GemmCacheStats after = cpu::GetGemmCacheStats();
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.hits, before.hits + 1);
  EXPECT_EQ(after.entries, before.entries);
  Matmul(a, b, {false, false, std::nullopt});
  MatmulInto(a, b, Tensor::Zeros({19, 31}), {}, 1.0f);  // beta is part of the key
  EXPECT_EQ(cpu::GetGemmCacheStats().misses, after.misses + 1);
}

double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// CPU time the process uses while this thread sleeps for `ms`.
double IdleCpuMs(int ms) {
  const double start = ProcessCpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return 1e3 * (ProcessCpuSeconds() - start);
}

TEST(MatmulOneDnnTest, OpenMpWorkersDoNotSpinAfterGemm) {
  // See "OpenMP spinning" in tensor/cpu/matmul.cc: without the throttle the
  // libgomp worker keeps a core busy for 1-7 ms after every GEMM here.
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT") ||
      std::getenv("FSDP_OMP_SPIN") || std::thread::hardware_concurrency() < 2) {
    GTEST_SKIP() << "OpenMP wait policy set from outside, or a single CPU";
  }
  ScopedBackend backend(cpu::GemmBackend::kOneDnn);
  const Tensor a = RandomTensor({256, 256}, 40);
  const Tensor b = RandomTensor({256, 256}, 41);
  Tensor out = Tensor::Empty({256, 256});
  MatmulInto(a, b, out);
  // OpenBLAS's worker threads busy-wait for ~0.1 s after the library loads
  // and after each of its calls (earlier tests): wait until the process is quiet.
  bool quiet = false;
  for (int i = 0; i < 100 && !quiet; ++i) quiet = IdleCpuMs(30) < 0.3;
  if (!quiet) GTEST_SKIP() << "the process never went idle; cannot measure";
  double after_gemm = 0;
  for (int i = 0; i < 5; ++i) {
    MatmulInto(a, b, out);
    after_gemm += IdleCpuMs(30) / 5;
  }
  EXPECT_LT(after_gemm, 0.5) << "ms of CPU used per 30 ms idle right after a GEMM";
}

// ---- Backward ----

// Checks MatmulBackward against finite differences of L = <Matmul(a, b), w>.
void CheckGradients(const Shape& a_shape, const Shape& b_shape, const MatmulOptions& opts,
                    uint64_t seed) {
  const Tensor a = RandomTensor(a_shape, seed);
  const Tensor b = RandomTensor(b_shape, seed + 1);
  const Tensor out = Matmul(a, b, opts);
  const Tensor w = RandomTensor(out.shape(), seed + 2);
  const MatmulGrads grads = MatmulBackward(w, a, b, opts);
  ASSERT_EQ(grads.grad_a.shape(), a.shape());
  ASSERT_EQ(grads.grad_b.shape(), b.shape());
  const Tensor num_a =
      NumericalGradient([&](const Tensor& x) { return Dot(Matmul(x, b, opts), w); }, a);
  const Tensor num_b =
      NumericalGradient([&](const Tensor& x) { return Dot(Matmul(a, x, opts), w); }, b);
  EXPECT_TRUE(AllClose(grads.grad_a, num_a, 5e-3, 5e-3)) << "grad_a";
  EXPECT_TRUE(AllClose(grads.grad_b, num_b, 5e-3, 5e-3)) << "grad_b";
}

class MatmulBackwardTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(MatmulBackwardTest, MatchesFiniteDifferences) {
  const bool ta = std::get<0>(GetParam());
  const bool tb = std::get<1>(GetParam());
  const MatmulOptions opts{ta, tb};
  const int64_t m = 4, k = 5, n = 3;
  auto a_mat = [&](Shape batch) {
    batch.push_back(ta ? k : m);
    batch.push_back(ta ? m : k);
    return batch;
  };
  auto b_mat = [&](Shape batch) {
    batch.push_back(tb ? n : k);
    batch.push_back(tb ? k : n);
    return batch;
  };
  {
    SCOPED_TRACE("2-D");
    CheckGradients(a_mat({}), b_mat({}), opts, 100);
  }
  {
    SCOPED_TRACE("batched");
    CheckGradients(a_mat({2, 3}), b_mat({2, 3}), opts, 200);
  }
  {
    SCOPED_TRACE("b broadcast over a's batch");
    CheckGradients(a_mat({2, 3}), b_mat({}), opts, 300);
  }
  {
    SCOPED_TRACE("a broadcast over b's batch");
    CheckGradients(a_mat({}), b_mat({3}), opts, 400);
  }
}

INSTANTIATE_TEST_SUITE_P(TransFlags, MatmulBackwardTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST(MatmulBackwardTest, Bf16GradientsInRequestedDtype) {
  const Tensor x = RandomTensor({2, 8, 16}, 500, -1, 1, Dtype::kBF16);
  const Tensor w = RandomTensor({12, 16}, 501, -1, 1, Dtype::kBF16);
  const Tensor g32 = RandomTensor({2, 8, 12}, 502);  // an fp32 grad of an fp32 output
  const MatmulOptions opts{false, true, Dtype::kF32};
  const MatmulGrads grads = MatmulBackward(g32, x, w, opts);
  EXPECT_EQ(grads.grad_a.dtype(), Dtype::kF32);
  EXPECT_EQ(grads.grad_b.dtype(), Dtype::kF32);
  // Reference: the f32 backward on the same (bf16-rounded) values, with grad_out
  // rounded to bf16 as the op does.
  const Tensor g16 = g32.To(Dtype::kBF16);
  const MatmulGrads ref =
      MatmulBackward(g16.To(Dtype::kF32), x.To(Dtype::kF32), w.To(Dtype::kF32), {false, true});
  EXPECT_TRUE(AllClose(grads.grad_a, ref.grad_a, kF32Tol, kF32Tol));
  EXPECT_TRUE(AllClose(grads.grad_b, ref.grad_b, kF32Tol, kF32Tol));
  const MatmulGrads grads16 = MatmulBackward(g16, x, w, {false, true});
  EXPECT_EQ(grads16.grad_b.dtype(), Dtype::kBF16);
  EXPECT_TRUE(AllClose(grads16.grad_a, ref.grad_a, 2e-2, 8e-3));
  EXPECT_TRUE(AllClose(grads16.grad_b, ref.grad_b, 2e-2, 8e-3));
}

// ---- Errors ----

// Runs fn, expecting an OpError whose message starts with "[matmul]" and
// contains every piece; returns the message.
template <typename Fn>
std::string ExpectMatmulError(Fn fn, std::initializer_list<const char*> pieces) {
  try {
    fn();
  } catch (const OpError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[matmul] ", 0), 0u) << msg;
    for (const char* piece : pieces) EXPECT_NE(msg.find(piece), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << "no OpError thrown";
  return "";
}

TEST(MatmulErrorTest, InnerDimensionsDiffer) {
  const std::string msg = ExpectMatmulError(
      [] {
        Matmul(Tensor::Zeros({2, 3}), Tensor::Zeros({4, 5}));
      },
      {});
  EXPECT_EQ(
      msg, "[matmul] shapes (2,3) and (4,5) cannot be multiplied: inner dimensions 3 and 4 differ");
  ExpectMatmulError(
      [] {
        Matmul(Tensor::Zeros({2, 3}), Tensor::Zeros({5, 4}), {false, true});
      },
      {"(2,3) and (5,4) with trans_b", "inner dimensions 3 and 4 differ"});
}

TEST(MatmulErrorTest, BatchDimensionsDiffer) {
  ExpectMatmulError(
      [] {
        Matmul(Tensor::Zeros({2, 3, 4}), Tensor::Zeros({5, 4, 6}));
      },
      {"(2,3,4) and (5,4,6)", "batch dimensions (2) and (5) differ"});
  ExpectMatmulError(
      [] {
        Matmul(Tensor::Zeros({2, 3, 3, 4}), Tensor::Zeros({3, 4, 6}));
      },
      {"(2,3,3,4) and (3,4,6)", "batch dimensions (2,3) and (3) differ"});
}

TEST(MatmulErrorTest, RankOne) {
  ExpectMatmulError(
      [] {
        Matmul(Tensor::Zeros({3}), Tensor::Zeros({3, 4}));
      },
      {"(3) and (3,4)", "at least 2 dimensions"});
}

TEST(MatmulErrorTest, UnsupportedAndMixedDtypes) {
  ExpectMatmulError(
      [] {
        Matmul(Tensor::Zeros({2, 3}, Dtype::kI32), Tensor::Zeros({3, 4}, Dtype::kI32));
      },
      {"(2,3) and (3,4)", "dtype i32 is not supported"});
  ExpectMatmulError(
      [] {
        Matmul(Tensor::Zeros({2, 3}), Tensor::Zeros({3, 4}, Dtype::kBF16));
      },
      {"(2,3) and (3,4)", "dtypes f32 and bf16 differ"});
  ExpectMatmulError(
      [] {
        Matmul(Tensor::Zeros({2, 3}), Tensor::Zeros({3, 4}), {false, false, Dtype::kBF16});
      },
      {"(2,3) and (3,4)", "output dtype bf16 is not supported for f32 inputs"});
}

TEST(MatmulErrorTest, BadOutputs) {
  const Tensor a = Tensor::Zeros({2, 3});
  const Tensor b = Tensor::Zeros({3, 4});
  ExpectMatmulError(
      [&] {
        MatmulInto(a, b, Tensor::Zeros({2, 5}));
      },
      {"give (2,4) but out has shape (2,5)"});
  ExpectMatmulError(
      [&] {
        MatmulInto(a, b, Tensor::Zeros({4, 2}).Transpose(0, 1));
      },
      {"out (2,4) with strides (1,2) cannot be written by a GEMM: it needs a unit stride in its "
       "last dim"});
  const Tensor buffer = Tensor::Zeros({16});
  ExpectMatmulError(
      [&] {
        MatmulInto(buffer.Narrow(0, 0, 6).View({2, 3}), b, buffer.Narrow(0, 4, 8).View({2, 4}));
      },
      {"overlaps an input"});
  ExpectMatmulError(
      [&] {
        MatmulBackward(Tensor::Zeros({2, 5}), a, b);
      },
      {"grad_out has shape (2,5)", "give (2,4)"});
}

}  // namespace
}  // namespace tensor
