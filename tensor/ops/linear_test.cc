// tensor::LinearForward / LinearGeluForward / LinearGeluInputGrad on the CPU
// (Matmul followed by AddBias / Gelu / GeluBackward): the values of the unfused ops, f32 and bf16,
// and errors that name what was wrong. The GPU's fused epilogues are checked against these in
// tensor/cuda/linear_test.cc.
#include "tensor/ops/linear.h"

#include <stdexcept>
#include <string>

#include "gtest/gtest.h"
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
    const Tensor want_pre = AddBias(XwT(x, w), b);
    EXPECT_TRUE(AllClose(LinearForward(x, w, b), want_pre, 0, 0));
    const LinearGeluResult r = LinearGeluForward(x, w, b);
    EXPECT_EQ(r.out.shape(), Shape({7, 12}));
    EXPECT_EQ(r.out.dtype(), dtype);
    EXPECT_TRUE(AllClose(r.pre, want_pre, 0, 0));
    EXPECT_TRUE(AllClose(r.out, Gelu(want_pre), 0, 0));
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
  // LinearGeluInputGrad: grad_y (4, 6), w (6, 5), pre (4, 5); pre (4, 6) is wrong.
  const Tensor g = RandomTensor({4, 6}, 4);
  const std::string shapes = message([&] { LinearGeluInputGrad(g, w, RandomTensor({4, 6}, 5)); });
  EXPECT_NE(shapes.find("expected grad_y (N, M), w (M, K) and pre (N, K)"), std::string::npos)
      << shapes;
  EXPECT_NE(shapes.find("and pre (4,6)"), std::string::npos) << shapes;
  EXPECT_NE(message([&] { LinearGeluInputGrad(g, w, x.To(Dtype::kBF16)); }).find("dtypes differ"),
            std::string::npos);
}

}  // namespace
}  // namespace tensor
