// Tensor: construction, views that alias, copies, dtype conversion, printing, errors.
#include "tensor/tensor.h"

#include "tensor/cuda_backend.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#include "gtest/gtest.h"

namespace tensor {
namespace {

std::vector<float> Iota(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

// Without a GPU (or CUDA) EmptyPinned is ordinary host memory, charged alike.
TEST(TensorTest, EmptyPinnedWithoutAGpuIsHostMemory) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "a GPU is visible (see cuda/backend_test)";
  MemoryLedger ledger;
  ScopedLedger use(&ledger);
  Tensor t = Tensor::EmptyPinned({3, 5}, Dtype::kBF16);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.dtype(), Dtype::kBF16);
  EXPECT_EQ(t.shape(), Shape({3, 5}));
  EXPECT_EQ(ledger.Total(Device::Cpu()).current, 30);
  t.CopyFrom(Tensor::Full({3, 5}, 2.0, Dtype::kF32));
  EXPECT_EQ(t.To(Dtype::kF32).ToVector<float>(), std::vector<float>(15, 2.0f));
  EXPECT_FALSE(cuda::IsPinnedHost(t.raw_data()));
}

TEST(TensorTest, EmptyZerosFull) {
  Tensor z = Tensor::Zeros({2, 3});
  EXPECT_EQ(z.shape(), Shape({2, 3}));
  EXPECT_EQ(z.numel(), 6);
  EXPECT_EQ(z.nbytes(), 24);
  EXPECT_TRUE(z.is_contiguous());
  for (float v : z.ToVector<float>()) EXPECT_EQ(v, 0.0f);
  Tensor f = Tensor::Full({4}, 2.5, Dtype::kBF16);
  EXPECT_EQ(f.dtype(), Dtype::kBF16);
  for (float v : f.ToVector<float>()) EXPECT_EQ(v, 2.5f);
  EXPECT_FALSE(Tensor().defined());
}

TEST(TensorTest, TransposeIsAViewThatAliases) {
  Tensor a = Tensor::FromVector(Iota(6), {2, 3});
  Tensor t = a.Transpose(0, 1);
  EXPECT_TRUE(t.SharesStorageWith(a));
  EXPECT_EQ(t.shape(), Shape({3, 2}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.Contiguous().ToVector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  a.data<float>()[1] = 100.0f;  // writes through the base are seen by the view
  EXPECT_EQ(t.Contiguous().ToVector<float>()[2], 100.0f);
}

TEST(TensorTest, RowStrideOfContiguousAndRowPaddedViews) {
  EXPECT_EQ(Tensor::Zeros({2, 3, 5}).RowStride(), 5);
  EXPECT_EQ(Tensor::Zeros({7}).RowStride(), 7);
  EXPECT_EQ(Tensor::Zeros({}).RowStride(), -1);
  // (N, V) rows of a (N, ld) buffer, and that view reshaped to (B, T, V).
  const Tensor padded = Tensor::Zeros({6, 8}).Narrow(1, 0, 5);
  EXPECT_EQ(padded.RowStride(), 8);
  EXPECT_EQ(padded.Reshape({2, 3, 5}).RowStride(), 8);
  EXPECT_TRUE(padded.Reshape({2, 3, 5}).SharesStorageWith(padded)) << "a view, not a copy";
  EXPECT_EQ(padded.Narrow(0, 2, 1).RowStride(), 5) << "one row";
  // Every other row is a run of rows too, 16 apart.
  EXPECT_EQ(Tensor::Zeros({6, 8}).View({3, 2, 8}).Select(1, 0).RowStride(), 16);
  // Not a run of rows: a transpose, and rows sliced out of a 3-d tensor
  // (the outer stride skips more than the rows kept).
  EXPECT_EQ(Tensor::Zeros({4, 5}).Transpose(0, 1).RowStride(), -1);
  EXPECT_EQ(Tensor::Zeros({2, 4, 8}).Narrow(1, 0, 3).RowStride(), -1);
}

TEST(TensorTest, NarrowSelectUnsqueeze) {
  Tensor a = Tensor::FromVector(Iota(24), {2, 3, 4});
  Tensor n = a.Narrow(2, 1, 2);  // (2,3,2)
  EXPECT_TRUE(n.SharesStorageWith(a));
  EXPECT_EQ(n.shape(), Shape({2, 3, 2}));
  EXPECT_EQ(n.Contiguous().ToVector<float>(),
            (std::vector<float>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22}));
  Tensor s = a.Select(1, 2);  // (2,4)
  EXPECT_EQ(s.ToVector<float>(), (std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23}));
  Tensor u = s.Unsqueeze(1);
  EXPECT_EQ(u.shape(), Shape({2, 1, 4}));
  EXPECT_EQ(u.ToVector<float>(), s.ToVector<float>());
  // Writing into a narrowed view changes the base.
  n.Select(0, 1).Select(0, 0).data<float>()[0] = -1.0f;  // element (1,0,1)
  EXPECT_EQ(a.ToVector<float>()[13], -1.0f);
  // A range past the end, also one whose start + length overflows.
  EXPECT_EQ(a.Narrow(2, 4, 0).numel(), 0);
  for (const auto& [start, length] : std::vector<std::pair<int64_t, int64_t>>{
           {3, 2}, {5, 0}, {-1, 1}, {1, INT64_MAX}, {INT64_MAX, 2}}) {
    try {
      a.Narrow(2, start, length);
      ADD_FAILURE() << "narrowed " << start << ", " << length;
    } catch (const OpError& e) {
      EXPECT_EQ(std::string(e.what()),
                absl::StrCat("[narrow] start ", start, " and length ", length,
                             " out of bounds for dimension 2 of shape (2,3,4)"));
    }
  }
}

TEST(TensorTest, ReshapeViewsWhenPossibleAndCopiesOtherwise) {
  Tensor a = Tensor::FromVector(Iota(24), {2, 3, 4});
  Tensor r = a.Reshape({6, -1});
  EXPECT_EQ(r.shape(), Shape({6, 4}));
  EXPECT_TRUE(r.SharesStorageWith(a));
  // Splitting a non-contiguous transposed dimension still views when strides allow.
  Tensor t = a.Transpose(0, 1);  // (3,2,4)
  Tensor v = t.View({3, 2, 2, 2});
  EXPECT_TRUE(v.SharesStorageWith(a));
  EXPECT_EQ(v.Contiguous().ToVector<float>(), t.Contiguous().ToVector<float>());
  // Merging the transposed dims needs a copy: View refuses, Reshape copies.
  EXPECT_THROW(t.View({6, 4}), OpError);
  Tensor c = t.Reshape({6, 4});
  EXPECT_FALSE(c.SharesStorageWith(a));
  EXPECT_EQ(c.ToVector<float>(), t.Contiguous().ToVector<float>());
  try {
    a.Reshape({5, 5});
    FAIL();
  } catch (const OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[reshape] cannot reshape (2,3,4) (24 elements) to (5,5)");
  }
}

TEST(TensorTest, ToDtypeConvertsAndCopies) {
  Tensor a = Tensor::FromVector({1.0f, -2.5f, 3.25f, 1e6f}, {4});
  Tensor b = a.To(Dtype::kBF16);
  EXPECT_EQ(b.dtype(), Dtype::kBF16);
  EXPECT_EQ(b.ToVector<float>(), (std::vector<float>{1.0f, -2.5f, 3.25f, 999424.0f}));
  Tensor i = a.To(Dtype::kI64);
  EXPECT_EQ(i.ToVector<int64_t>(), (std::vector<int64_t>{1, -2, 3, 1000000}));
  EXPECT_TRUE(a.To(Dtype::kF32).SharesStorageWith(a));
  // Converting a strided view.
  Tensor m = Tensor::FromVector(Iota(6), {2, 3}).Transpose(0, 1).To(Dtype::kF16);
  EXPECT_EQ(m.ToVector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_DOUBLE_EQ(Tensor::FromVector({7.0f}, {1}).Item(), 7.0);
}

// Floats to integers truncate toward zero and saturate at the type's range,
// NaN to 0, from f32, bf16 and f16 alike (as CUDA's conversions do; a plain
// cast is undefined there). Fill's double too.
TEST(TensorTest, FloatsToIntegersSaturate) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x = Tensor::FromVector({nan, -1.5f, 2.9f, 1e10f, -1e10f, inf, -inf, 300.f}, {8});
  for (Dtype from : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) {
    SCOPED_TRACE(DtypeName(from));
    const Tensor f = x.To(from);
    EXPECT_EQ(f.To(Dtype::kI32).ToVector<int32_t>(),
              (std::vector<int32_t>{0, -1, 2, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, 300}));
    // 1e10 as f16 is inf; as bf16 about 9.999e9.
    const int64_t big = from == Dtype::kF16 ? INT64_MAX : int64_t(f.ToVector<float>()[3]);
    EXPECT_EQ(f.To(Dtype::kI64).ToVector<int64_t>(),
              (std::vector<int64_t>{0, -1, 2, big, big == INT64_MAX ? INT64_MIN : -big,
                                    INT64_MAX, INT64_MIN, 300}));
    EXPECT_EQ(f.To(Dtype::kU8).ToVector<uint8_t>(),
              (std::vector<uint8_t>{0, 0, 2, 255, 0, 255, 0, 255}));
  }
  EXPECT_EQ(Tensor::Full({2}, 1e300, Dtype::kI32).ToVector<int32_t>(),
            (std::vector<int32_t>{INT32_MAX, INT32_MAX}));
  EXPECT_EQ(Tensor::Full({1}, std::nan(""), Dtype::kI64).ToVector<int64_t>(),
            (std::vector<int64_t>{0}));
}

TEST(TensorTest, CopyFromChecksShapes) {
  Tensor a = Tensor::Zeros({2, 2});
  Tensor b = Tensor::FromVector(Iota(4), {2, 2}, Dtype::kBF16);
  a.CopyFrom(b);
  EXPECT_EQ(a.ToVector<float>(), Iota(4));
  try {
    a.CopyFrom(Tensor::Zeros({3}));
    FAIL();
  } catch (const OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[copy] source shape (3) does not match destination shape (2,2)");
  }
}

TEST(TensorTest, BadViewsAreErrorsNotCrashes) {
  Tensor a = Tensor::Zeros({2, 3});
  EXPECT_THROW(a.Narrow(1, 2, 2), OpError);
  EXPECT_THROW(a.Transpose(0, 2), OpError);
  EXPECT_THROW(a.Select(0, 2), OpError);
  EXPECT_THROW(a.data<int32_t>(), OpError);
  EXPECT_THROW(a.Item(), OpError);
  EXPECT_THROW(Tensor::Empty({2, -1}), OpError);
}

TEST(TensorTest, SizesPast64BitsAreErrorsNotWrappedAllocations) {
  EXPECT_THROW(Tensor::Empty({int64_t{1} << 62, 8}), OpError);
  EXPECT_THROW(Tensor::EmptyPinned({int64_t{1} << 62, 8}), OpError);
  try {
    Tensor::Empty({int64_t{1} << 61}, Dtype::kF32);  // the elements fit, the bytes do not
    FAIL();
  } catch (const OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[empty] shape (2305843009213693952) of f32 is more than "
                                     "2^63-1 bytes");
  }
  EXPECT_THROW(Shape({int64_t{1} << 32, int64_t{1} << 32}).numel(), OpError);
  EXPECT_EQ(Shape({int64_t{1} << 40, 0}).numel(), 0);
  EXPECT_EQ(CheckedNumel({int64_t{1} << 32, int64_t{1} << 32}), std::nullopt);
  EXPECT_EQ(CheckedNumel({3, -1}), std::nullopt);
  EXPECT_EQ(CheckedNumel({3, 0, 5}), 0);
  EXPECT_EQ(CheckedNumel({}), 1);
}

TEST(TensorTest, RankZeroReshapesAndViews) {
  Tensor s = Tensor::Full({}, 3);
  for (const Tensor& v : {s.Reshape({1}), s.Flatten(), s.View({1, 1}), s.View({-1})}) {
    EXPECT_TRUE(v.SharesStorageWith(s));
    EXPECT_EQ(v.numel(), 1);
    EXPECT_EQ(v.Item(), 3.0);
  }
  EXPECT_EQ(s.View({1, 1}).shape(), Shape({1, 1}));
  EXPECT_THROW(s.Reshape({2}), OpError);
  Tensor m = Tensor::Full({1, 1}, 5);
  Tensor back = m.Reshape({});
  EXPECT_EQ(back.rank(), 0);
  EXPECT_TRUE(back.SharesStorageWith(m));
  EXPECT_EQ(back.Item(), 5.0);
  EXPECT_EQ(m.View({}).Item(), 5.0);
}

TEST(TensorTest, CopyFromAnOverlappingViewReadsItWholeFirst) {
  Tensor t = Tensor::FromVector({1, 2, 3, 4}, {2, 2});
  t.CopyFrom(t.Transpose(0, 1));
  EXPECT_EQ(t.ToVector<float>(), (std::vector<float>{1, 3, 2, 4}));
  const int n = 8;
  Tensor buf = Tensor::FromVector(Iota(n), {n});
  buf.Narrow(0, 1, n - 1).CopyFrom(buf.Narrow(0, 0, n - 1));  // shift right by one
  EXPECT_EQ(buf.ToVector<float>(), (std::vector<float>{0, 0, 1, 2, 3, 4, 5, 6}));
  buf = Tensor::FromVector(Iota(n), {n});
  buf.Narrow(0, 0, n - 1).CopyFrom(buf.Narrow(0, 1, n - 1));  // shift left by one
  EXPECT_EQ(buf.ToVector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 7}));
  // The same through CopyStrided.
  buf = Tensor::FromVector(Iota(n), {n});
  CopyStrided(buf.Narrow(0, 0, n - 2), buf.Narrow(0, 2, n - 2));
  EXPECT_EQ(buf.ToVector<float>(), (std::vector<float>{0, 1, 0, 1, 2, 3, 4, 5}));
  // A copy onto itself and one between disjoint halves of a storage.
  buf = Tensor::FromVector(Iota(n), {n});
  buf.CopyFrom(buf);
  buf.Narrow(0, 0, 4).CopyFrom(buf.Narrow(0, 4, 4));
  EXPECT_EQ(buf.ToVector<float>(), (std::vector<float>{4, 5, 6, 7, 4, 5, 6, 7}));
}

TEST(TensorTest, CudaTensorWithoutADeviceIsAClearError) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(Tensor::Empty({2}, Dtype::kF32, Device::Cuda(0)), std::exception);
}

TEST(TensorTest, Printing) {
  Tensor a = Tensor::FromVector(Iota(6), {2, 3});
  EXPECT_EQ(a.ToString(), "Tensor(shape=(2,3), dtype=f32, device=cpu)\n[[0, 1, 2],\n[3, 4, 5]]");
  Tensor big = Tensor::FromVector(Iota(10), {10}, Dtype::kI32);
  EXPECT_EQ(big.ToString(4), "Tensor(shape=(10), dtype=i32, device=cpu)\n[0, 1, ..., 8, 9]");
  // Fewer than 2 per dim still shows the first and the last element.
  for (int64_t max_per_dim : {0, 1, 2}) {
    EXPECT_EQ(big.ToString(max_per_dim),
              "Tensor(shape=(10), dtype=i32, device=cpu)\n[0, ..., 9]");
  }
}

}  // namespace
}  // namespace tensor

namespace tensor {
namespace {

// To(dtype) converts 8 at a time; it must agree bit for bit with the scalar
// conversions on every kind of value (NaN, inf, subnormals, ties).
TEST(TensorTest, VectorizedCastsMatchScalarConversions) {
  std::vector<float> values;
  uint32_t state = 12345;
  for (int i = 0; i < 100003; ++i) {  // not a multiple of 8: exercises the tail
    state = state * 1664525u + 1013904223u;
    float f;
    std::memcpy(&f, &state, 4);
    values.push_back(f);
  }
  Tensor x = Tensor::FromVector(values, {static_cast<int64_t>(values.size())});
  Tensor b = x.To(Dtype::kBF16);
  Tensor h = x.To(Dtype::kF16);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(b.data<bf16>()[i].bits, FloatToBf16(values[i]).bits) << i;
    ASSERT_EQ(h.data<f16>()[i].bits, FloatToF16(values[i]).bits) << i;
  }
  Tensor back = b.To(Dtype::kF32);
  for (size_t i = 0; i < values.size(); ++i) {
    const float want = Bf16ToFloat(b.data<bf16>()[i]);
    uint32_t got_bits, want_bits;
    std::memcpy(&got_bits, &back.data<float>()[i], 4);
    std::memcpy(&want_bits, &want, 4);
    ASSERT_EQ(got_bits, want_bits) << i;
  }
}

// On the CPU CastAll is To(dtype) for each: a converted copy, or the tensor
// itself when already of the dtype.
TEST(TensorTest, CastAllIsToForEach) {
  const Tensor a = Tensor::FromVector({1.5f, -2.25f, 3.0f}, {3});
  const Tensor b = Tensor::FromVector({0.1f}, {1}).To(Dtype::kBF16);
  const std::vector<Tensor> cast = CastAll({a, b}, Dtype::kBF16);
  ASSERT_EQ(cast.size(), 2u);
  EXPECT_EQ(cast[0].dtype(), Dtype::kBF16);
  EXPECT_EQ(cast[0].To(Dtype::kF32).ToVector<float>(), std::vector<float>({1.5f, -2.25f, 3.0f}));
  EXPECT_TRUE(cast[1].SharesStorageWith(b));
  EXPECT_TRUE(CastAll({}, Dtype::kF32).empty());
}

}  // namespace
}  // namespace tensor
