// The memory ledger is exact to the byte, per category and per device, and
// follows the thread's ScopedLedger / ScopedMemoryCategory; FormatBytes; and
// the error of running out of host memory, which names what the ledger holds.
#include "tensor/memory_ledger.h"

#include <cstdio>
#include <new>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace tensor {
namespace {

const Device kCpu = Device::Cpu();

TEST(MemoryLedgerTest, ExactBytesPerCategory) {
  MemoryLedger ledger;
  ScopedLedger use(&ledger);
  {
    ScopedMemoryCategory cat(MemoryCategory::kParameters);
    Tensor p = Tensor::Empty({1000}, Dtype::kF32);  // 4000 bytes
    Tensor q = Tensor::Empty({3, 7}, Dtype::kBF16);  // 42 bytes
    EXPECT_EQ(ledger.Stats(kCpu, MemoryCategory::kParameters).current, 4042);
    {
      ScopedMemoryCategory act(MemoryCategory::kActivations);
      Tensor a = Tensor::Empty({5}, Dtype::kI64);  // 40 bytes
      EXPECT_EQ(ledger.Stats(kCpu, MemoryCategory::kActivations).current, 40);
      EXPECT_EQ(ledger.Total(kCpu).current, 4082);
    }
    EXPECT_EQ(ledger.Stats(kCpu, MemoryCategory::kActivations).current, 0);
    EXPECT_EQ(ledger.Stats(kCpu, MemoryCategory::kActivations).peak, 40);
    EXPECT_EQ(ledger.Total(kCpu).peak, 4082);
  }
  EXPECT_EQ(ledger.Total(kCpu).current, 0);
  EXPECT_EQ(ledger.Stats(kCpu, MemoryCategory::kParameters).peak, 4042);
  ledger.ResetPeaks();
  EXPECT_EQ(ledger.Total(kCpu).peak, 0);
  EXPECT_EQ(ledger.Stats(kCpu, MemoryCategory::kParameters).peak, 0);
}

TEST(MemoryLedgerTest, ViewsCostNothingAndFreeWithTheLastReference) {
  MemoryLedger ledger;
  ScopedLedger use(&ledger);
  Tensor view;
  {
    Tensor base = Tensor::Empty({10, 10});
    view = base.Transpose(0, 1).Narrow(0, 2, 3);
    EXPECT_EQ(ledger.Total(kCpu).current, 400);
  }
  EXPECT_EQ(ledger.Total(kCpu).current, 400);  // the view keeps the storage alive
  view = Tensor();
  EXPECT_EQ(ledger.Total(kCpu).current, 0);
  EXPECT_EQ(ledger.Stats(kCpu, MemoryCategory::kTemporaries).peak, 400);
}

TEST(MemoryLedgerTest, FreeIsCreditedToTheLedgerAndCategoryThatPaid) {
  MemoryLedger a, b;
  Tensor t;
  {
    ScopedLedger use(&a);
    ScopedMemoryCategory cat(MemoryCategory::kGradients);
    t = Tensor::Empty({16});
  }
  {
    ScopedLedger use(&b);  // freed while another ledger is current
    t = Tensor();
  }
  EXPECT_EQ(a.Stats(kCpu, MemoryCategory::kGradients).current, 0);
  EXPECT_EQ(a.Stats(kCpu, MemoryCategory::kGradients).peak, 64);
  EXPECT_EQ(b.Total(kCpu).peak, 0);
}

TEST(MemoryLedgerTest, PerThreadLedgersAreIndependent) {
  MemoryLedger rank0, rank1;
  auto work = [](MemoryLedger* l, int n) {
    ScopedLedger use(l);
    ScopedMemoryCategory cat(MemoryCategory::kOptimizerState);
    Tensor t = Tensor::Empty({n}, Dtype::kU8);
  };
  std::thread t0(work, &rank0, 100), t1(work, &rank1, 333);
  t0.join();
  t1.join();
  EXPECT_EQ(rank0.Stats(kCpu, MemoryCategory::kOptimizerState).peak, 100);
  EXPECT_EQ(rank1.Stats(kCpu, MemoryCategory::kOptimizerState).peak, 333);
}

TEST(MemoryLedgerTest, TotalPeakIsThePeakOfTheSum) {
  MemoryLedger ledger;
  ledger.RecordAlloc(kCpu, MemoryCategory::kParameters, 100);
  ledger.RecordFree(kCpu, MemoryCategory::kParameters, 100);
  ledger.RecordAlloc(kCpu, MemoryCategory::kGradients, 60);
  EXPECT_EQ(ledger.Total(kCpu).peak, 100);  // not 160
  ledger.RecordAlloc(Device::Cuda(1), MemoryCategory::kCommunication, 7);
  EXPECT_EQ(ledger.Total(Device::Cuda(1)).current, 7);
  EXPECT_EQ(ledger.Total(kCpu).current, 60);
  const std::string json = ledger.ToJson();
  EXPECT_NE(json.find("\"cuda:1\":{"), std::string::npos) << json;
  EXPECT_NE(json.find("\"gradients\":{\"current\":60,\"peak\":60}"), std::string::npos) << json;
  EXPECT_NE(ledger.Summary().find("communication"), std::string::npos);
}

TEST(MemoryLedgerTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB");
  EXPECT_EQ(FormatBytes(1536 << 20), "1.50 GiB");
  EXPECT_EQ(FormatBytes(int64_t{1} << 52), "4.00 PiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 61), "6.00 EiB");
  EXPECT_EQ(FormatBytes(-(3 << 20)), "-3.00 MiB");
}

// Running out of host memory throws an OutOfMemoryError (a std::bad_alloc)
// naming the device, the request and its category, what the host had, and
// what this thread's ledger holds there; the ledger is charged nothing.
TEST(MemoryLedgerTest, OutOfMemoryNamesTheRequestAndTheLedger) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocators abort on a 4 PiB request";
#endif
  MemoryLedger ledger;
  ScopedLedger use(&ledger);
  ScopedMemoryCategory params(MemoryCategory::kParameters);
  const Tensor p = Tensor::Empty({1 << 18}, Dtype::kF32);  // 1 MiB
  ScopedMemoryCategory act(MemoryCategory::kActivations);
  try {
    Tensor huge = Tensor::Empty({int64_t{1} << 50}, Dtype::kF32);  // 4 PiB
    ADD_FAILURE() << "4 PiB were allocated";
  } catch (const OutOfMemoryError& e) {
    const std::string message = e.what();
    std::printf("%s\n", message.c_str());
    EXPECT_EQ(message.rfind("[memory] out of memory on cpu: 4.00 PiB of activations asked for; "
                            "the host refused it (",
                            0),
              0u)
        << message;
    EXPECT_NE(message.find(" of RAM free); this thread's ledger holds 1.00 MiB there (parameters "
                           "1.00 MiB, gradients 0 B, optimizer_state 0 B, activations 0 B, "
                           "communication 0 B, temporaries 0 B; peak 1.00 MiB)"),
              std::string::npos)
        << message;
  }
  EXPECT_THROW(Tensor::Empty({int64_t{1} << 50}, Dtype::kF32), std::bad_alloc);
  EXPECT_EQ(ledger.Total(kCpu).current, 1 << 20);
  EXPECT_EQ(ledger.Total(kCpu).peak, 1 << 20);
}

}  // namespace
}  // namespace tensor
