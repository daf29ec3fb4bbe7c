// tensor::LinearForward / LinearResidualForward / LinearGeluForward / LinearGeluInputGrad /
// LinearParamGradsInto on the CPU (Matmul followed by AddBias / Gelu /
// GeluBackward / AddBiasBackwardInto): the values of the unfused ops, f32 and bf16,
// and errors that name what was wrong. The GPU's fused epilogues are checked against these in
// tensor/cuda/linear_test.cc.
#include "tensor/ops/linear.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "gtest/gtest.h"
#include "tensor/cpu/matmul.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using ::tensor::testing::AllClose;
using ::tensor::testing::RandomTensor;

Tensor XwT(const Tensor& x, const Tensor& w) {
  MatmulOptions opts;
  opts.trans_b = true;
  return Matmul(x, w, opts);
}

TEST(LinearOpsTest, EqualTheUnfusedOps) {
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    const Tensor x = RandomTensor({7, 5}, 1, -1, 1, dtype);
    const Tensor w = RandomTensor({12, 5}, 2, -1, 1, dtype);
    const Tensor b = RandomTensor({12}, 3, -1, 1, dtype);
    // f32: the same bits as the product then AddBias; bf16: the fused sum is
    // rounded once (from f32), the unfused one twice: an ulp apart at most.
    const double tol = dtype == Dtype::kF32 ? 0.0 : 8e-3;
    const Tensor want_pre = AddBias(XwT(x, w), b);
    EXPECT_TRUE(AllClose(LinearForward(x, w, b), want_pre, tol, tol));
    const LinearGeluResult r = LinearGeluForward(x, w, b);
    EXPECT_EQ(r.out.shape(), Shape({7, 12}));
    EXPECT_EQ(r.out.dtype(), dtype);
    EXPECT_TRUE(AllClose(r.pre, want_pre, tol, tol));
    EXPECT_TRUE(AllClose(r.out, Gelu(r.pre), 0, 0));
    // The product and bias in one GEMM, rounded once: the f32 sum rounded.
    const Tensor exact = AddBias(XwT(x.To(Dtype::kF32), w.To(Dtype::kF32)), b.To(Dtype::kF32));
    EXPECT_TRUE(AllClose(r.pre.To(Dtype::kF32), exact.To(dtype).To(Dtype::kF32), 1e-6, 1e-6));
  }
}

// The bias rides in the GEMM on both CPU backends: oneDNN takes it as its
// bias argument (no fallback to OpenBLAS for it), OpenBLAS's path adds it
// before rounding; both give the product then AddBias's f32 values.
TEST(LinearOpsTest, BiasInTheGemmOnBothCpuBackends) {
  const Tensor x = RandomTensor({9, 6}, 4);
  const Tensor w = RandomTensor({5, 6}, 5);
  const Tensor b = RandomTensor({5}, 6);
  const Tensor want = AddBias(XwT(x, w), b);
  for (cpu::GemmBackend backend : {cpu::GemmBackend::kOneDnn, cpu::GemmBackend::kOpenBlas}) {
    const cpu::GemmBackend before = cpu::GetGemmBackend();
    cpu::SetGemmBackend(backend);
    const Tensor got = LinearForward(x, w, b);
    const std::string path = cpu::LastGemmPath();
    cpu::SetGemmBackend(before);
    EXPECT_EQ(path.rfind(backend == cpu::GemmBackend::kOneDnn ? "onednn" : "openblas", 0), 0u)
        << path;
    EXPECT_TRUE(AllClose(got, want, 1e-6, 1e-6)) << path;
  }
}

TEST(LinearOpsTest, GeluInputGradEqualsTheUnfusedOps) {
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    const Tensor g = RandomTensor({7, 12}, 4, -1, 1, dtype);   // (N, M)
    const Tensor w = RandomTensor({12, 5}, 5, -1, 1, dtype);   // (M, K)
    const Tensor pre = RandomTensor({7, 5}, 6, -3, 3, dtype);  // (N, K)
    const Tensor got = LinearGeluInputGrad(g, w, pre);
    EXPECT_EQ(got.shape(), Shape({7, 5}));
    EXPECT_EQ(got.dtype(), dtype);
    EXPECT_TRUE(AllClose(got, GeluBackward(Matmul(g, w), pre), 0, 0));
  }
}

TEST(LinearOpsTest, ParamGradsAccumulateAsTheUnfusedOps) {
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    const Tensor g = RandomTensor({9, 6}, 7, -1, 1, dtype);  // (N, M)
    const Tensor x = RandomTensor({9, 4}, 8, -1, 1, dtype);  // (N, K)
    Tensor grad_w = RandomTensor({6, 4}, 9);                 // (M, K), f32: accumulated into
    Tensor grad_b = RandomTensor({6}, 10);
    MatmulOptions ta;
    ta.trans_a = true;
    // In fp32 from the dtype's values (a bf16 product is not rounded to bf16).
    const Tensor g32 = g.To(Dtype::kF32), x32 = x.To(Dtype::kF32);
    const Tensor want_w = Add(grad_w, Matmul(g32, x32, ta));
    const Tensor want_b = Add(grad_b, AddBiasBackward(g32));
    LinearParamGradsInto(g, x, grad_w, grad_b);
    EXPECT_TRUE(AllClose(grad_w, want_w, 1e-6, 1e-6));
    EXPECT_TRUE(AllClose(grad_b, want_b, 1e-6, 1e-6));
    // Without a bias only the weight's gradient moves.
    const Tensor before = grad_w.Clone();
    LinearParamGradsInto(g, x, grad_w, Tensor());
    EXPECT_TRUE(AllClose(grad_w, Add(before, Matmul(g32, x32, ta)), 1e-6, 1e-6));
  }
  // Gradients of another dtype: named by this op (not the GEMM inside it).
  try {
    LinearParamGradsInto(RandomTensor({9, 6}, 7), RandomTensor({9, 4}, 8),
                         Tensor::Zeros({6, 4}, Dtype::kBF16), Tensor());
    ADD_FAILURE() << "a bf16 grad_w";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "[linear_param_grads] the gradients accumulate in f32; got grad_w bf16");
  }
}

// accumulate false writes the gradients: buffers full of NaN (what a new,
// uninitialized gradient may hold) come out as the product and column sums
// alone, each flag on its own.
TEST(LinearOpsTest, ParamGradsOverwriteWithoutAccumulate) {
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    SCOPED_TRACE(DtypeName(dtype));
    const Tensor g = RandomTensor({9, 6}, 7, -1, 1, dtype);  // (N, M)
    const Tensor x = RandomTensor({9, 4}, 8, -1, 1, dtype);  // (N, K)
    MatmulOptions ta;
    ta.trans_a = true;
    const Tensor g32 = g.To(Dtype::kF32), x32 = x.To(Dtype::kF32);
    const Tensor dw = Matmul(g32, x32, ta), db = AddBiasBackward(g32);
    const Tensor nan_w = Tensor::Full({6, 4}, std::nan("")), nan_b = Tensor::Full({6}, std::nan(""));
    Tensor grad_w = nan_w.Clone(), grad_b = nan_b.Clone();
    LinearParamGradsInto(g, x, grad_w, grad_b, /*accumulate_w=*/false, /*accumulate_b=*/false);
    EXPECT_TRUE(AllClose(grad_w, dw, 1e-6, 1e-6));
    EXPECT_TRUE(AllClose(grad_b, db, 1e-6, 1e-6));
    // The weight's written, the bias's added to.
    grad_w = nan_w.Clone();
    LinearParamGradsInto(g, x, grad_w, grad_b, /*accumulate_w=*/false, /*accumulate_b=*/true);
    EXPECT_TRUE(AllClose(grad_w, dw, 1e-6, 1e-6));
    EXPECT_TRUE(AllClose(grad_b, Add(db, db), 1e-6, 1e-6));
    // The bias's written, the weight's added to; and the bias alone.
    grad_b = nan_b.Clone();
    LinearParamGradsInto(g, x, grad_w, grad_b, /*accumulate_w=*/true, /*accumulate_b=*/false);
    EXPECT_TRUE(AllClose(grad_w, Add(dw, dw), 1e-6, 1e-6));
    EXPECT_TRUE(AllClose(grad_b, db, 1e-6, 1e-6));
    grad_b = nan_b.Clone();
    AddBiasBackwardInto(g, grad_b, /*accumulate=*/false);
    EXPECT_TRUE(AllClose(grad_b, db, 1e-6, 1e-6));
  }
}

// residual + x w^T (+ b): the unfused sum up to rounding (in bf16 the
// product is not rounded before the residual is added), with and without a
// bias; the inputs are left as they were.
TEST(LinearOpsTest, ResidualForwardEqualsLinearThenAdd) {
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    SCOPED_TRACE(DtypeName(dtype));
    const Tensor x = RandomTensor({7, 5}, 1, -1, 1, dtype);
    const Tensor w = RandomTensor({12, 5}, 2, -1, 1, dtype);
    const Tensor b = RandomTensor({12}, 3, -1, 1, dtype);
    const Tensor r = RandomTensor({7, 12}, 4, -1, 1, dtype);
    const Tensor r_before = r.Clone();
    const double tol = dtype == Dtype::kF32 ? 1e-6 : 2e-2;
    const Tensor y = LinearResidualForward(x, w, b, r);
    EXPECT_EQ(y.dtype(), dtype);
    EXPECT_EQ(y.shape(), Shape({7, 12}));
    EXPECT_TRUE(AllClose(y, Add(r, AddBias(XwT(x, w), b)), tol, tol));
    EXPECT_TRUE(AllClose(LinearResidualForward(x, w, Tensor(), r), Add(r, XwT(x, w)), tol, tol));
    EXPECT_TRUE(AllClose(r, r_before, 0, 0));
  }
  // f32: the sum of the f32 products, as the unfused ops, to the last bits
  // but for the order of the two additions.
  const Tensor x = RandomTensor({3, 4}, 5), w = RandomTensor({2, 4}, 6);
  const Tensor r = RandomTensor({3, 2}, 7);
  EXPECT_TRUE(AllClose(LinearResidualForward(x, w, Tensor(), r), Add(r, XwT(x, w)), 0, 0));
}

TEST(LinearOpsTest, BadArgumentsAreNamed) {
  const Tensor x = RandomTensor({4, 5}, 1);
  const Tensor w = RandomTensor({6, 5}, 2);
  const Tensor b = RandomTensor({6}, 3);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              LinearForward(x, RandomTensor({6, 4}, 2), b);
            }).find("expected x (N, K), w (M, K) and bias (M)"),
            std::string::npos);
  EXPECT_NE(message([&] { LinearGeluForward(x, w, RandomTensor({5}, 3)); }).find("bias (5)"),
            std::string::npos);
  EXPECT_NE(message([&] { LinearForward(x, w, b.To(Dtype::kBF16)); }).find("dtypes differ"),
            std::string::npos);
  EXPECT_NE(message([&] { LinearForward(x, w, Tensor()); }).find("undefined"), std::string::npos);
  // LinearResidualForward: the residual must be (N, M) in w's dtype.
  EXPECT_NE(message([&] {
              LinearResidualForward(x, w, b, RandomTensor({4, 5}, 9));
            }).find("expected the residual (4, 6); got (4,5)"),
            std::string::npos);
  EXPECT_NE(message([&] {
              LinearResidualForward(x, w, b, RandomTensor({4, 6}, 9, -1, 1, Dtype::kBF16));
            }).find("the residual is bf16 on cpu, the weight f32 on cpu"),
            std::string::npos);
  EXPECT_NE(message([&] { LinearResidualForward(x, w, b, Tensor()); }).find("got undefined"),
            std::string::npos);
  // LinearGeluInputGrad: grad_y (4, 6), w (6, 5), pre (4, 5); pre (4, 6) is wrong.
  const Tensor g = RandomTensor({4, 6}, 4);
  const std::string shapes = message([&] { LinearGeluInputGrad(g, w, RandomTensor({4, 6}, 5)); });
  EXPECT_NE(shapes.find("expected grad_y (N, M), w (M, K) and pre (N, K)"), std::string::npos)
      << shapes;
  EXPECT_NE(shapes.find("and pre (4,6)"), std::string::npos) << shapes;
  EXPECT_NE(message([&] { LinearGeluInputGrad(g, w, x.To(Dtype::kBF16)); }).find("dtypes differ"),
            std::string::npos);
  // LinearParamGradsInto: grad_b (5) does not match g (4, 6).
  const std::string grads = message([&] {
    LinearParamGradsInto(g, RandomTensor({4, 5}, 6), RandomTensor({6, 5}, 7), RandomTensor({5}, 8));
  });
  EXPECT_NE(grads.find("expected g (N, M), x (N, K), grad_w (M, K) and grad_b (M)"),
            std::string::npos)
      << grads;
}

}  // namespace
}  // namespace tensor
