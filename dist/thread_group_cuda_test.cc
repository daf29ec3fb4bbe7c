// The threads engine with ranks sharing a GPU (issue 5): collectives on
// device tensors run on the ranks' communication streams with the same
// results as on the host, bit for bit, and stage nothing through host memory;
// calls whose ranks' tensors are on different devices still work (staged).
// Also the device reduction itself against the host one. Runs on a GPU
// (--config=cuda) or the CUDA emulation; skips where no device is visible.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "dist/cpu_reduce.h"
#include "dist/process_group.h"
#include "dist/thread_group.h"
#include "gtest/gtest.h"
#include "tensor/cuda/testing.h"
#include "tensor/cuda_backend.h"
#include "tensor/memory_ledger.h"
#include "tensor/ops/init.h"
#include "tensor/tensor.h"

namespace dist {
namespace {

using tensor::Device;
using tensor::Dtype;
using tensor::MemoryCategory;
using tensor::Tensor;
using tensor::cuda::testing::ToCpu;
using tensor::cuda::testing::ToGpu;

// Rank r's values: multiples of 1/4 in [-3.5, 3.5] (exact in every float
// dtype), different per rank and element; element 5 is NaN when `nan`.
Tensor RankValues(int rank, int64_t n, Dtype dtype, bool nan = false) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + rank * 13) % 29 - 14) * 0.25f;
  if (nan && n > 5) v[5] = std::numeric_limits<float>::quiet_NaN();
  if (dtype == Dtype::kI32 || dtype == Dtype::kI64 || dtype == Dtype::kU8) {
    for (float& x : v) x = std::fabs(x) * 4;  // small non-negative integers
  }
  return Tensor::FromVector(v, {n}).To(dtype);
}

// The same bytes, except that a NaN matches any NaN: a GPU rounds a NaN to
// bf16 / f16 as the canonical 0x7FFF, the host keeps the payload's top bits.
::testing::AssertionResult SameBits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.device().is_cpu() ? a.Contiguous() : ToCpu(a);
  const Tensor y = b.device().is_cpu() ? b.Contiguous() : ToCpu(b);
  if (x.dtype() != y.dtype() || x.numel() != y.numel()) {
    return ::testing::AssertionFailure() << "different dtype or size";
  }
  if (std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0) {
    return ::testing::AssertionSuccess();
  }
  const Dtype dt = x.dtype();
  if (dt != Dtype::kF32 && dt != Dtype::kBF16 && dt != Dtype::kF16) {
    return ::testing::AssertionFailure() << "integer bytes differ";
  }
  // bf16 and f16 widen to f32 exactly: compare the widened bits.
  const std::vector<float> u = x.To(Dtype::kF32).ToVector<float>();
  const std::vector<float> v = y.To(Dtype::kF32).ToVector<float>();
  for (size_t i = 0; i < u.size(); ++i) {
    if (std::isnan(u[i]) && std::isnan(v[i])) continue;
    if (std::memcmp(&u[i], &v[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": " << u[i] << " vs " << v[i];
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(DeviceReduceTest, MatchesTheHostReductionForEveryDtypeAndOp) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1000;
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16, Dtype::kF16, Dtype::kI32, Dtype::kI64,
                      Dtype::kU8}) {
    const bool floating = dtype == Dtype::kF32 || dtype == Dtype::kBF16 || dtype == Dtype::kF16;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      if (op == ReduceOp::kAvg && !floating) continue;
      SCOPED_TRACE(std::string(tensor::DtypeName(dtype)) + " " + std::string(ReduceOpName(op)));
      std::vector<Tensor> host, dev;
      for (int r = 0; r < 3; ++r) {
        host.push_back(RankValues(r, n, dtype, floating && r == 1));
        dev.push_back(ToGpu(host.back()));
      }
      // Output 0 is input 0 (in place), output 1 a buffer of its own.
      Tensor host_out = Tensor::Empty({n}, dtype);
      Tensor dev_out = Tensor::Empty({n}, dtype, Device::Cuda(0));
      internal::ReduceBuffers(dtype, op, {host[0].raw_data(), host[1].raw_data(), host[2].raw_data()},
                              {host[0].raw_data(), host_out.raw_data()}, n);
      tensor::cuda::ReduceBuffersOnDevice(
          dtype, static_cast<tensor::cuda::BufferReduceOp>(op),
          {dev[0].raw_data(), dev[1].raw_data(), dev[2].raw_data()},
          {dev[0].raw_data(), dev_out.raw_data()}, n, 0, /*stream=*/nullptr);
      EXPECT_TRUE(SameBits(dev[0], host[0]));
      EXPECT_TRUE(SameBits(dev_out, host_out));
    }
  }
}

// Each collective of `world` ranks on tensors of `device`, returning every
// rank's results in order: all_reduce per op, reduce_scatter, in-place
// reduce_scatter, all_gather, in-place all_gather, broadcast. Also checks
// the rank's ledger saw no communication buffer on the host when `device`
// is a GPU (nothing staged).
std::vector<std::vector<Tensor>> RunCollectives(int world, Device device, Dtype dtype) {
  const int64_t k = 37;  // not a multiple of the world size
  std::vector<std::vector<Tensor>> results(world);
  ThreadWorld w(world);
  const absl::Status s = RunRanks(w, [&](int rank, ProcessGroup& pg) {
    auto on = [&](const Tensor& t) { return device.is_cpu() ? t : ToGpu(t); };
    std::vector<Tensor>& mine = results[rank];
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      Tensor x = on(RankValues(rank, k * world, dtype, /*nan=*/op == ReduceOp::kMax));
      ASSERT_TRUE(pg.AllReduceSync(x, op).ok());
      mine.push_back(x);
    }
    Tensor in = on(RankValues(rank, k * world, dtype));
    Tensor out = on(Tensor::Zeros({k}, dtype));
    ASSERT_TRUE(pg.ReduceScatterSync(in, out).ok());
    mine.push_back(out);
    Tensor flat = on(RankValues(rank, k * world, dtype));
    ASSERT_TRUE(pg.ReduceScatterSync(flat, flat.Narrow(0, rank * k, k)).ok());
    mine.push_back(flat.Narrow(0, rank * k, k));
    Tensor piece = on(RankValues(rank, k, dtype));
    Tensor gathered = on(Tensor::Zeros({k * world}, dtype));
    ASSERT_TRUE(pg.AllGatherSync(piece, gathered).ok());
    mine.push_back(gathered);
    Tensor full = on(Tensor::Zeros({k * world}, dtype));
    full.Narrow(0, rank * k, k).CopyFrom(on(RankValues(rank, k, dtype)));
    ASSERT_TRUE(pg.AllGatherSync(full.Narrow(0, rank * k, k), full).ok());
    mine.push_back(full);
    Tensor b = on(RankValues(rank, k, dtype));
    ASSERT_TRUE(pg.BroadcastSync(b, world - 1).ok());
    mine.push_back(b);
    if (device.is_cuda()) {
      EXPECT_EQ(w.ledger(rank).Stats(Device::Cpu(), MemoryCategory::kCommunication).peak, 0)
          << "rank " << rank << " staged a collective through host memory";
    }
  });
  EXPECT_TRUE(s.ok()) << s;
  return results;
}

TEST(ThreadGroupCudaTest, CollectivesOnOneGpuMatchTheHostBitForBit) {
  SKIP_WITHOUT_GPU();
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    for (int world : {1, 2, 3}) {
      SCOPED_TRACE(std::string(tensor::DtypeName(dtype)) + ", world " + std::to_string(world));
      const auto host = RunCollectives(world, Device::Cpu(), dtype);
      const auto gpu = RunCollectives(world, Device::Cuda(0), dtype);
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(gpu[r].size(), host[r].size());
        for (size_t i = 0; i < host[r].size(); ++i) {
          EXPECT_TRUE(gpu[r][i].device().is_cuda());
          EXPECT_TRUE(SameBits(gpu[r][i], host[r][i])) << "rank " << r << ", result " << i;
        }
      }
    }
  }
}

// Calls in flight together: each waits for the kernels queued before it on
// the issuing thread (a device fill, then an add) and the results land in
// issue order.
TEST(ThreadGroupCudaTest, AsyncCallsSeeTheKernelsQueuedBeforeThem) {
  SKIP_WITHOUT_GPU();
  const int world = 2;
  const int64_t n = 1 << 16;
  const absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    std::vector<Tensor> xs;
    std::vector<WorkPtr> works;
    for (int i = 0; i < 4; ++i) {
      Tensor x = Tensor::Full({n}, rank + 1.0, Dtype::kF32, Device::Cuda(0));
      tensor::Fill(x, 10.0 * i + rank);  // queued on this thread's stream
      works.push_back(pg.AllReduce(x));
      xs.push_back(x);
    }
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(works[i]->Wait().ok());
      const std::vector<float> v = ToCpu(xs[i]).ToVector<float>();
      const float want = 20.0f * i + 1.0f;  // (10 i + 0) + (10 i + 1)
      EXPECT_EQ(v.front(), want);
      EXPECT_EQ(v.back(), want);
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A call given a ready stream (CollectiveOptions::ready_stream) waits for
// that stream's work, here an upload queued there, not the issuing thread's
// stream alone: created streams defer their work on the emulation, so a call
// that did not wait for it would reduce the zeros.
TEST(ThreadGroupCudaTest, ACallWaitsForItsReadyStream) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 12;
  const absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    Tensor x = Tensor::Zeros({n}, Dtype::kF32, Device::Cuda(0));
    tensor::cuda::SynchronizeStream(/*stream=*/nullptr, 0);  // the zeros are in place
    Tensor host = Tensor::EmptyPinned({n}, Dtype::kF32);
    std::fill_n(static_cast<float*>(host.raw_data()), n, rank + 1.0f);
    tensor::cuda::StreamHandle stream = tensor::cuda::CreateStream(0);
    tensor::cuda::CopyToDeviceOnStream(x.raw_data(), host.raw_data(), x.nbytes(), 0, stream);
    CollectiveOptions options;
    options.ready_stream = stream;
    ASSERT_TRUE(pg.AllReduceSync(x, ReduceOp::kSum, options).ok());
    EXPECT_EQ(ToCpu(x).ToVector<float>(), std::vector<float>(n, 3.0f));
    tensor::cuda::DestroyStream(stream, 0);
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Rank 0's tensor on the GPU, rank 1's on the host, rank 2's on the GPU but
// strided: staged through host memory, same results as all on the host.
TEST(ThreadGroupCudaTest, CallsMixingDevicesAreStagedThroughTheHost) {
  SKIP_WITHOUT_GPU();
  const int world = 3;
  const int64_t n = 12;
  std::vector<Tensor> got(world);
  const absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    const Tensor values = RankValues(rank, n, Dtype::kF32);
    Tensor x;
    if (rank == 0) x = ToGpu(values);
    if (rank == 1) x = values;
    if (rank == 2) {  // every other element of a (2n) GPU buffer
      Tensor wide = ToGpu(Tensor::Zeros({n, 2}));
      x = wide.Narrow(1, 0, 1).View({n});
      x.CopyFrom(ToGpu(values));
    }
    ASSERT_TRUE(pg.AllReduceSync(x).ok());
    got[rank] = x.device().is_cpu() ? x.Clone() : ToCpu(x);
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int64_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < world; ++r) want += RankValues(r, n, Dtype::kF32).ToVector<float>()[i];
    for (int r = 0; r < world; ++r) EXPECT_EQ(got[r].ToVector<float>()[i], want) << r << " " << i;
  }
}

}  // namespace
}  // namespace dist
