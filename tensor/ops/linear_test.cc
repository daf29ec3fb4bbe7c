// tensor::LinearForward / LinearGeluForward on the CPU (Matmul followed by
// AddBias / Gelu): the values of the unfused ops, f32 and bf16, and errors
// that name what was wrong. The GPU's fused epilogues are checked against
// these in tensor/cuda/linear_test.cc.
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
}

}  // namespace
}  // namespace tensor
