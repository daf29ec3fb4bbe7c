// cuDNN's fused attention (attention_cudnn.h) against the plain-loop
// reference of attention_testing.h: called directly, crossed with our forward
// and backward, and routed by SetFlashAttentionCudnn (on a GPU with cuDNN
// linked); and the host side, which runs without a GPU: what it takes, and
// the real cuDNN finalizing every descriptor of both graphs (--config=cuda;
// .ci/run runs it so). Tolerances: attention_test.cc's.
#include "tensor/cuda/attention_cudnn.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/cuda/attention.h"
#include "tensor/cuda/attention_testing.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using cuda::FlashAttentionKernel;
using cuda::attention_testing::Case;
using cuda::attention_testing::Compute;
using cuda::attention_testing::ExpectNear;
using cuda::attention_testing::GpuView;
using cuda::attention_testing::Name;
using cuda::attention_testing::Reference;
using cuda::attention_testing::RunCase;
using cuda::attention_testing::Tol;

// cuDNN's fused attention (attention_cudnn.h), called directly: the causal
// cases it takes (T_q == T_k, D 64 and 128, bf16 and f16, lengths short of and
// past its tiles, q / k / v as heads viewed out of (B, T, H, D) memory) against
// the reference, with the tolerances of our tensor-core kernels; and its lse
// and out fed to our backward, and ours to its backward (lse means the same).
// Only where cuDNN is linked (--config=cuda on a GPU; the emulation has none).
TEST(CudaCudnnAttentionTest, MatchesReference) {
  SKIP_WITHOUT_GPU();
  if (!cuda::CudnnAttentionBuilt()) GTEST_SKIP() << "cuDNN not linked (the CUDA emulation)";
  const std::vector<Case> cases = {{1, 2, 17, 17, 64, true},
                                   {1, 2, 200, 200, 128, true},
                                   {2, 3, 256, 256, 64, true},
                                   {1, 12, 1024, 1024, 64, true}};
  for (const Case& c : cases) {
    for (Dtype dt : {Dtype::kBF16, Dtype::kF16}) {
      SCOPED_TRACE(absl::StrCat(Name(c, dt, FlashAttentionKernel::kAuto), " cuDNN"));
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      const Tensor q = GpuView({c.b, c.h, c.t_q, c.d}, 41, dt, false);
      const Tensor k = GpuView({c.b, c.h, c.t_k, c.d}, 42, dt, false);
      const Tensor v = GpuView({c.b, c.h, c.t_k, c.d}, 43, dt, false);
      const Tensor dout = GpuView({c.b, c.h, c.t_q, c.d}, 44, dt, false);
      const Device dev = q.device();
      auto empty_like = [&](const Tensor& t) { return Tensor::Empty(t.shape(), dt, dev); };
      Tensor out = empty_like(q), lse = Tensor::Empty({c.b, c.h, c.t_q}, Dtype::kF32, dev);
      Tensor dq = empty_like(q), dk = empty_like(k), dv = empty_like(v);
      // A case cuDNN declines fails alone (the others still run): the first
      // run on a GPU says which shapes it takes.
      std::string why;
      if (!cuda::CudnnAttentionForward(q, k, v, scale, true, out, lse, &why)) {
        if (why == cuda::CudnnSdpaVersionDecline(cuda::CudnnRuntimeVersion(), c.t_q)) {
          std::printf("declined, as the frontend would: %s\n", why.c_str());
          continue;
        }
        ADD_FAILURE() << "forward: " << why;
        continue;
      }
      if (!cuda::CudnnAttentionBackward(q, k, v, out, lse, dout, scale, true, dq, dk, dv, &why)) {
        ADD_FAILURE() << "backward: " << why;
        continue;
      }
      const Reference ref = Compute(c, q.ToVector<float>(), k.ToVector<float>(),
                                    v.ToVector<float>(), dout.ToVector<float>(), scale);
      ExpectNear(ref, out, lse, dq, dk, dv, Tol(dt));
      // cuDNN's forward, our backward.
      Tensor dq2 = empty_like(q), dk2 = empty_like(k), dv2 = empty_like(v);
      cuda::FlashAttentionBackward(q, k, v, out, lse, dout, scale, true, dq2, dk2, dv2,
                                   FlashAttentionKernel::kTensorCore);
      ExpectNear(ref, out, lse, dq2, dk2, dv2, Tol(dt));
      // Our forward, cuDNN's backward.
      Tensor out3 = empty_like(q), lse3 = Tensor::Empty({c.b, c.h, c.t_q}, Dtype::kF32, dev);
      Tensor dq3 = empty_like(q), dk3 = empty_like(k), dv3 = empty_like(v);
      cuda::FlashAttentionForward(q, k, v, scale, true, out3, lse3,
                                  FlashAttentionKernel::kTensorCore);
      if (!cuda::CudnnAttentionBackward(q, k, v, out3, lse3, dout, scale, true, dq3, dk3, dv3,
                                        &why)) {
        ADD_FAILURE() << "backward after our forward: " << why;
        continue;
      }
      ExpectNear(ref, out3, lse3, dq3, dk3, dv3, Tol(dt));
    }
  }
}

// gpt2's layout in training: q, k and v are views of the qkv projection's
// (B, T, 3, H, D) output, dq, dk and dv of its gradient's, out and grad_out
// (B, T, H, D) memory: the strides the host test only finalizes, run (a
// review found the GPU cases above used contiguous gradients only).
TEST(CudaCudnnAttentionTest, MatchesReferenceInGpt2sLayout) {
  SKIP_WITHOUT_GPU();
  if (!cuda::CudnnAttentionBuilt()) GTEST_SKIP() << "cuDNN not linked (the CUDA emulation)";
  const Case c = {2, 4, 256, 256, 64, true};
  const Dtype dt = Dtype::kBF16;
  const float scale = 0.125f;
  auto part = [](const Tensor& x, int i) { return x.Select(2, i).Transpose(1, 2); };
  const Tensor qkv = cuda::testing::ToGpu(
      testing::RandomTensor({c.b, c.t_q, 3, c.h, c.d}, 61, -1.0f, 1.0f, dt));
  const Tensor q = part(qkv, 0), k = part(qkv, 1), v = part(qkv, 2);
  const Tensor dout = GpuView({c.b, c.h, c.t_q, c.d}, 62, dt, false);  // (B, T, H, D) memory
  const Device dev = q.device();
  Tensor out = Tensor::Empty({c.b, c.t_q, c.h, c.d}, dt, dev).Transpose(1, 2);
  Tensor lse = Tensor::Empty({c.b, c.h, c.t_q}, Dtype::kF32, dev);
  Tensor dqkv = Tensor::Empty({c.b, c.t_q, 3, c.h, c.d}, dt, dev);
  Tensor dq = part(dqkv, 0), dk = part(dqkv, 1), dv = part(dqkv, 2);
  std::string why;
  if (!cuda::CudnnAttentionForward(q, k, v, scale, true, out, lse, &why)) {
    ASSERT_EQ(why, cuda::CudnnSdpaVersionDecline(cuda::CudnnRuntimeVersion(), c.t_q))
        << "forward";
    GTEST_SKIP() << "declined, as the frontend would: " << why;
  }
  ASSERT_TRUE(cuda::CudnnAttentionBackward(q, k, v, out, lse, dout, scale, true, dq, dk, dv, &why))
      << "backward: " << why;
  const Reference ref = Compute(c, q.ToVector<float>(), k.ToVector<float>(), v.ToVector<float>(),
                                dout.ToVector<float>(), scale);
  ExpectNear(ref, out, lse, dq, dk, dv, Tol(dt));
}

// SetFlashAttentionCudnn routes what cuDNN takes to it (the same bits as the
// direct call: its forward is deterministic) and leaves the rest to our
// kernels (f32, full attention, T_q != T_k, an explicit kernel): no error.
TEST(CudaCudnnAttentionTest, SwitchRoutesWhatItTakes) {
  SKIP_WITHOUT_GPU();
  struct ScopedCudnn {
    const bool was = cuda::FlashAttentionCudnn();
    ScopedCudnn() { cuda::SetFlashAttentionCudnn(true); }
    ~ScopedCudnn() { cuda::SetFlashAttentionCudnn(was); }
  } use_cudnn;
  const Case c = {2, 3, 256, 256, 64, true};
  const float scale = 0.125f;
  const Tensor q = GpuView({c.b, c.h, c.t_q, c.d}, 51, Dtype::kBF16, false);
  const Tensor k = GpuView({c.b, c.h, c.t_k, c.d}, 52, Dtype::kBF16, false);
  const Tensor v = GpuView({c.b, c.h, c.t_k, c.d}, 53, Dtype::kBF16, false);
  const Device dev = q.device();
  Tensor out = Tensor::Empty(q.shape(), Dtype::kBF16, dev);
  Tensor lse = Tensor::Empty({c.b, c.h, c.t_q}, Dtype::kF32, dev);
  cuda::FlashAttentionForward(q, k, v, scale, true, out, lse);
  if (cuda::CudnnAttentionBuilt()) {
    Tensor direct = Tensor::Empty(q.shape(), Dtype::kBF16, dev);
    Tensor direct_lse = Tensor::Empty({c.b, c.h, c.t_q}, Dtype::kF32, dev);
    std::string why;
    ASSERT_TRUE(cuda::CudnnAttentionForward(q, k, v, scale, true, direct, direct_lse, &why))
        << why;
    EXPECT_EQ(out.ToVector<float>(), direct.ToVector<float>());
    EXPECT_EQ(lse.ToVector<float>(), direct_lse.ToVector<float>());
  }
  // What cuDNN does not take runs our kernels, as without the switch.
  RunCase({1, 2, 100, 100, 64, true}, Dtype::kF32, FlashAttentionKernel::kAuto);
  RunCase({2, 1, 130, 130, 64, false}, Dtype::kBF16, FlashAttentionKernel::kAuto);
  RunCase({1, 2, 33, 100, 64, true}, Dtype::kBF16, FlashAttentionKernel::kAuto);
  RunCase({1, 2, 100, 100, 64, true}, Dtype::kBF16, FlashAttentionKernel::kAuto, true);
  RunCase({1, 2, 100, 100, 64, true}, Dtype::kBF16, FlashAttentionKernel::kTensorCore);
}

// ---- Host side: runs without a GPU ----

// What cuDNN's attention takes, with the reason for what it does not (no
// cuDNN call but its version; the emulation's build declines everything as
// not linked).
TEST(CudaCudnnAttentionHostTest, Eligibility) {
  std::string why;
  const Tensor q = Tensor::Zeros({2, 256, 3, 64}, Dtype::kBF16).Transpose(1, 2);
  if (!cuda::CudnnAttentionBuilt()) {
    EXPECT_FALSE(cuda::CudnnAttentionEligible(q, q, q, true, &why));
    EXPECT_NE(why.find("not linked"), std::string::npos) << why;
    return;
  }
  if (const std::string d = cuda::CudnnSdpaVersionDecline(cuda::CudnnRuntimeVersion(), 256);
      !d.empty()) {
    GTEST_SKIP() << "the loaded cuDNN takes no shape: " << d;
  }
  EXPECT_TRUE(cuda::CudnnAttentionEligible(q, q, q, true, &why)) << why;
  auto expect_no = [](const Tensor& q, const Tensor& k, bool causal, const std::string& what) {
    std::string why;
    EXPECT_FALSE(cuda::CudnnAttentionEligible(q, k, k, causal, &why)) << what;
    EXPECT_NE(why.find(what), std::string::npos) << why;
  };
  expect_no(q.To(Dtype::kF32), q.To(Dtype::kF32), true, "dtype f32");
  const Tensor q32 = Tensor::Zeros({2, 3, 256, 32}, Dtype::kBF16);
  expect_no(q32, q32, true, "head size 32");
  expect_no(q, q, false, "non-causal");
  expect_no(q, Tensor::Zeros({2, 3, 255, 64}, Dtype::kBF16), true, "T_q 256 != T_k 255");
  const Tensor odd = Tensor::Zeros({2, 3, 256, 65}, Dtype::kBF16).Narrow(3, 1, 64);
  expect_no(odd, odd, true, "multiples of 8");
  const Tensor empty = Tensor::Zeros({2, 3, 0, 64}, Dtype::kBF16);
  expect_no(empty, empty, true, "empty q");
  const Tensor one = Tensor::Zeros({2, 3, 1, 64}, Dtype::kBF16);
  expect_no(one, one, true, "T 1 (cuDNN's SDPA backward takes no s_q = s_kv = 1)");
}

// The runtime versions and lengths cudnn-frontend declines, with the reason.
TEST(CudaCudnnAttentionHostTest, VersionDeclines) {
  EXPECT_EQ(cuda::CudnnSdpaVersionDecline(91900, 1024), "");
  EXPECT_EQ(cuda::CudnnSdpaVersionDecline(91900, 17), "");   // 9.16 on: any T > 1
  EXPECT_EQ(cuda::CudnnSdpaVersionDecline(91002, 1024), "");  // 9.10.2 fixed it
  EXPECT_EQ(cuda::CudnnSdpaVersionDecline(91000, 1024), "cuDNN 9.10.0 (known SDPA bugs: 9.10.2 "
                                                        "or newer)");
  EXPECT_EQ(cuda::CudnnSdpaVersionDecline(91001, 256).rfind("cuDNN 9.10.1 ", 0), 0u);
  EXPECT_EQ(cuda::CudnnSdpaVersionDecline(91900, 1),
            "T 1 (cuDNN's SDPA backward takes no s_q = s_kv = 1)");
  EXPECT_EQ(cuda::CudnnSdpaVersionDecline(91500, 200),
            "T 200 not a multiple of 128 on cuDNN 9.15.0 (up to 9.15 its backward needs a "
            "padding mask there)");
  EXPECT_EQ(cuda::CudnnSdpaVersionDecline(91500, 256), "");
  EXPECT_EQ(cuda::CudnnSdpaVersionDecline(91600, 200), "");
}

// cuDNN finalizes every tensor and operation descriptor of both graphs on
// the host (no GPU: the operation graph and plans are left to the GPU tests)
// for gpt2's layouts -- q, k, v and their gradients views of one (B, T, 3, H,
// D) buffer, out and grad_out (B, T, H, D) -- at both head sizes and dtypes;
// and refuses a k whose T differs from q's (the graphs' shapes disagree).
TEST(CudaCudnnAttentionHostTest, DescriptorsFinalizeOnTheHost) {
  if (!cuda::CudnnAttentionBuilt()) GTEST_SKIP() << "cuDNN not linked (the CUDA emulation)";
  for (Dtype dt : {Dtype::kBF16, Dtype::kF16}) {
    for (int64_t d : {64, 128}) {
      SCOPED_TRACE(absl::StrCat(DtypeName(dt), " D ", d));
      const int64_t b = 2, t = 256, h = 4;
      const Tensor qkv = Tensor::Zeros({b, t, 3, h, d}, dt);     // (B, T, 3, H, D)
      const Tensor dqkv = Tensor::Zeros({b, t, 3, h, d}, dt);
      auto part = [](const Tensor& x, int i) { return x.Select(2, i).Transpose(1, 2); };
      const Tensor out = Tensor::Zeros({b, t, h, d}, dt).Transpose(1, 2);  // (B, H, T, D)
      const Tensor dout = Tensor::Zeros({b, t, h, d}, dt).Transpose(1, 2);
      EXPECT_EQ(cuda::CudnnAttentionCheckDescriptors(part(qkv, 0), part(qkv, 1), part(qkv, 2),
                                                     out, dout, part(dqkv, 0), part(dqkv, 1),
                                                     part(dqkv, 2)),
                "");
      const Tensor short_k = Tensor::Zeros({b, h, t / 2, d}, dt);
      EXPECT_NE(cuda::CudnnAttentionCheckDescriptors(part(qkv, 0), short_k, short_k, out, dout,
                                                     part(dqkv, 0), short_k, short_k),
                "");
    }
  }
}

}  // namespace
}  // namespace tensor
