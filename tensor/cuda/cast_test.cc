// Fill, and casts / strided copies (the backend's kernel behind Tensor::To and
// Contiguous) on the GPU against the CPU.
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda_backend.h"
#include "tensor/cuda/testing.h"
#include "tensor/ops/init.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using cuda::testing::FloatDtypes;
using cuda::testing::MatchesCpu;
using cuda::testing::ToCpu;
using cuda::testing::ToGpu;

TEST(CudaCastTest, FillEveryDtype) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : {Dtype::kF32, Dtype::kBF16, Dtype::kF16, Dtype::kI32, Dtype::kI64, Dtype::kU8}) {
    Tensor cpu = Tensor::Empty({3, 1000}, d);
    Fill(cpu, 3.3);
    Tensor gpu = Tensor::Empty({3, 1000}, d, Device::Cuda(0));
    Fill(gpu, 3.3);
    EXPECT_TRUE(MatchesCpu(gpu, cpu)) << DtypeName(d);
  }
}

// Made on the device (a kernel, or a memset when every byte of the value is
// the same): the same bits as on the CPU.
TEST(CudaCastTest, FullAndZerosEveryDtype) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : {Dtype::kF32, Dtype::kBF16, Dtype::kF16, Dtype::kI32, Dtype::kI64, Dtype::kU8}) {
    for (double value : {0.0, -0.0, 1.0, -2.7, 7.0}) {
      const Tensor gpu = Tensor::Full({3, 777}, value, d, Device::Cuda(0));
      EXPECT_EQ(gpu.device(), Device::Cuda(0));
      EXPECT_TRUE(MatchesCpu(gpu, Tensor::Full({3, 777}, value, d))) << DtypeName(d) << " " << value;
    }
    EXPECT_TRUE(MatchesCpu(Tensor::Zeros({5}, d, Device::Cuda(0)), Tensor::Zeros({5}, d)));
  }
}

TEST(CudaCastTest, ArangeOnTheDevice) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : {Dtype::kI32, Dtype::kI64}) {
    for (int64_t n : {0, 1, 1000, 70000}) {
      const Tensor gpu = Arange(n, d, Device::Cuda(0));
      EXPECT_EQ(gpu.device(), Device::Cuda(0));
      EXPECT_TRUE(MatchesCpu(gpu, Arange(n, d))) << DtypeName(d) << " " << n;
    }
  }
}

// More tensors than one launch takes, of many sizes (and an empty one): the
// values To(dtype) gives, for every pair of floating dtypes.
TEST(CudaCastTest, CastAllMatchesToForEveryFloatingPair) {
  SKIP_WITHOUT_GPU();
  for (Dtype from : FloatDtypes()) {
    for (Dtype to : FloatDtypes()) {
      std::vector<Tensor> gpu;
      for (int i = 0; i < 70; ++i) {
        const int64_t n = i == 5 ? 0 : 1 + (i * 1543) % 20011;
        gpu.push_back(ToGpu(testing::RandomTensor({n}, 200 + i, -3.0f, 3.0f, from)));
      }
      const std::vector<Tensor> cast = CastAll(gpu, to);
      ASSERT_EQ(cast.size(), gpu.size());
      for (size_t i = 0; i < gpu.size(); ++i) {
        EXPECT_EQ(cast[i].dtype(), to);
        EXPECT_TRUE(MatchesCpu(cast[i], ToCpu(gpu[i].To(to)), {0, 0}))
            << DtypeName(from) << " -> " << DtypeName(to) << " [" << i << "]";
      }
    }
  }
}

// CastManyOnDevice on pointers at every alignment (0-3 elements into their
// buffers: the packed loads where both ends allow them, the element loop
// otherwise) and lengths around its chunk and vector sizes: the bits To gives.
TEST(CudaCastTest, CastManyAtEveryAlignment) {
  SKIP_WITHOUT_GPU();
  for (Dtype from : FloatDtypes()) {
    for (Dtype to : FloatDtypes()) {
      if (from == to) continue;
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8192}, int64_t{8195}, int64_t{20011}}) {
        const Tensor src = ToGpu(testing::RandomTensor({n + 3}, 300 + n, -3.0f, 3.0f, from));
        const Tensor dst = ToGpu(Tensor::Zeros({n + 3}, to));
        // (source, destination) offsets in elements: both aligned, either not.
        for (const auto& [s_off, d_off] :
             {std::pair<int64_t, int64_t>{0, 0}, {1, 0}, {0, 3}, {2, 2}}) {
          const std::vector<cuda::CastPair> pairs = {
              {static_cast<const char*>(src.raw_data()) + s_off * DtypeSize(from),
               static_cast<char*>(dst.raw_data()) + d_off * DtypeSize(to), n}};
          cuda::CastManyOnDevice(pairs, from, to, src.device().index);
          const Tensor want = ToCpu(src.Narrow(0, s_off, n)).To(to);
          EXPECT_TRUE(MatchesCpu(dst.Narrow(0, d_off, n), want, {0, 0}))
              << DtypeName(from) << " -> " << DtypeName(to) << " n " << n << " offsets " << s_off
              << ", " << d_off;
        }
      }
    }
  }
}

TEST(CudaCastTest, EveryFloatingPairAndStridedInput) {
  SKIP_WITHOUT_GPU();
  for (Dtype from : FloatDtypes()) {
    for (Dtype to : FloatDtypes()) {
      const Tensor x = testing::RandomTensor({7, 129}, 3, -2.0f, 2.0f, from);
      EXPECT_TRUE(MatchesCpu(Cast(ToGpu(x), to), Cast(x, to)))
          << DtypeName(from) << " -> " << DtypeName(to);
      const Tensor t = x.Transpose(0, 1);  // strided: copied contiguous first
      EXPECT_TRUE(MatchesCpu(Cast(ToGpu(x).Transpose(0, 1), to), Cast(t, to)));
    }
  }
}

TEST(CudaCastTest, ContiguousOfPermutedViewsAndIntegers) {
  SKIP_WITHOUT_GPU();
  const Tensor x = testing::RandomTensor({2, 3, 5, 7}, 4);
  const Tensor view = x.Transpose(1, 3).Narrow(2, 1, 3);
  EXPECT_TRUE(MatchesCpu(ToGpu(x).Transpose(1, 3).Narrow(2, 1, 3).Contiguous(), view.Contiguous()));
  Tensor ids = Tensor::Empty({4, 9}, Dtype::kI64);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = i * 1000003;
  EXPECT_TRUE(MatchesCpu(ToGpu(ids).Transpose(0, 1).Contiguous(), ids.Transpose(0, 1).Contiguous(),
                         {0, 0}));
}

}  // namespace
}  // namespace tensor
