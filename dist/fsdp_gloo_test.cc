// FSDP across real processes over gloo, for what threads cannot show: a rank
// that runs out of memory while FullyShard syncs rank 0's values fails every
// rank together (no peer waits in the broadcast for it), and the group stays
// usable.
#include <new>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dist/fsdp.h"
#include "dist/gloo_group.h"
#include "dist/process_testing.h"
#include "gtest/gtest.h"
#include "nn/linear.h"
#include "tensor/tensor.h"

namespace dist {
namespace {

using testing::ExpectAllOk;
using testing::LimitAddressSpace;
using testing::Outcome;
using testing::RunProcesses;
using testing::TmpDir;

TEST(FsdpGlooTest, ARankOutOfMemoryInSyncModuleStatesFailsEveryRank) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers reserve more address space than an RLIMIT_AS allows";
#endif
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(2, [&](int rank, int size) -> std::string {
    GlooGroupOptions options;
    options.store = dir;
    options.timeout = absl::Seconds(30);
    auto pg = CreateGlooProcessGroup(rank, size, options);
    if (!pg.ok()) return pg.status().ToString();
    nn::Linear layer(4096, 8192);  // 33562624 values: a 128 MiB buffer for the broadcast
    if (rank == 0) layer.Materialize(7);  // rank 1: shapes only
    if (rank == 1 && !LimitAddressSpace(int64_t{64} << 20)) return "setrlimit failed";
    FsdpOptions fsdp;
    fsdp.sync_module_states = true;
    try {
      auto model = FullyShard(layer, **pg, fsdp);
      return absl::StrCat("rank ", rank, ": no error");
    } catch (const std::bad_alloc& e) {
      const std::string expected =
          rank == 1 ? "out of memory"
                    : "[FullyShard] sync_module_states: rank 1 ran out of memory making the "
                      "buffer for rank 0's 33562624 values (see its error); no value moved";
      EXPECT_OR_MSG(absl::StrContains(e.what(), expected), e.what());
    }
    EXPECT_OR_MSG(!layer.weight()->value.defined() || rank == 0, "rank 1 got a value");
    // Still in step: a small all-reduce works on both ranks.
    tensor::Tensor small = tensor::Tensor::Full({4}, rank + 1.0);
    RETURN_IF_ERROR_MSG((*pg)->AllReduceSync(small, ReduceOp::kSum));
    EXPECT_OR_MSG(small.ToVector<float>()[3] == 3.0f, "the next all-reduce is wrong");
    return "";
  });
  ExpectAllOk(o);
}

}  // namespace
}  // namespace dist
