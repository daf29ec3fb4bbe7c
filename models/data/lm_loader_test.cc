// LmLoader over every source: shapes and dtype, targets = inputs shifted,
// determinism, rank split = rows of the global batch, resume equality, and
// errors for bad layouts and sources that are too small.
#include "models/data/lm_loader.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/data/byte_text.h"
#include "models/data/random_tokens.h"
#include "models/data/token_file.h"

namespace data {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::shared_ptr<const TokenSource> RandomSource(uint64_t seed) {
  return *RandomTokenSource::Create(seed);
}

std::shared_ptr<const TokenSource> TextSource(uint64_t seed) {
  auto s = ByteTextSource::OpenDefault(seed);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

std::shared_ptr<const TokenSource> FileSource(uint64_t seed) {
  const std::string path = TempPath("lm_loader_tokens.bin");
  std::vector<int64_t> tokens(20000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 2654435761u) % 50257;
  EXPECT_TRUE(WriteTokenFile(path, tokens, TokenFileFormat::kLlmc).ok());
  auto s = TokenFileSource::Open(path, seed);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

LmLoader MakeLoader(std::shared_ptr<const TokenSource> source, int64_t batch, int rank, int world,
                    int64_t seq_len) {
  auto loader = LmLoader::Create(std::move(source), {batch, rank, world}, seq_len);
  EXPECT_TRUE(loader.ok()) << loader.status();
  return *std::move(loader);
}

std::vector<int64_t> Row(const tensor::Tensor& t, int64_t b) {
  const int64_t T = t.dim(1);
  const int64_t* p = t.data<int64_t>() + b * T;
  return std::vector<int64_t>(p, p + T);
}

class LmLoaderTest : public ::testing::TestWithParam<int> {
 protected:
  std::shared_ptr<const TokenSource> Source(uint64_t seed) {
    switch (GetParam()) {
      case 0:
        return RandomSource(seed);
      case 1:
        return TextSource(seed);
      default:
        return FileSource(seed);
    }
  }
};

TEST_P(LmLoaderTest, ShapesDtypeAndTargetsAreInputsShifted) {
  LmLoader loader = MakeLoader(Source(1), 4, 0, 1, 32);
  const LmBatch batch = loader.Next();
  EXPECT_EQ(batch.step, 0);
  EXPECT_EQ(batch.inputs.shape(), tensor::Shape({4, 32}));
  EXPECT_EQ(batch.targets.shape(), tensor::Shape({4, 32}));
  EXPECT_EQ(batch.inputs.dtype(), tensor::Dtype::kI64);
  EXPECT_EQ(batch.targets.dtype(), tensor::Dtype::kI64);
  EXPECT_TRUE(batch.inputs.device().is_cpu());
  std::vector<int64_t> seq(33);
  for (int64_t b = 0; b < 4; ++b) {
    const auto in = Row(batch.inputs, b), tg = Row(batch.targets, b);
    for (int t = 0; t + 1 < 32; ++t) EXPECT_EQ(tg[t], in[t + 1]) << b << "," << t;
    // The row is the source's sequence of T + 1 tokens for (step 0, row b).
    loader.source().SampleSequence(0, b, absl::MakeSpan(seq));
    EXPECT_EQ(in, std::vector<int64_t>(seq.begin(), seq.end() - 1));
    EXPECT_EQ(tg[31], seq[32]);
    for (int64_t id : in) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, loader.vocab_size());
    }
  }
}

TEST_P(LmLoaderTest, DeterministicPerSeedStepAndRank) {
  LmLoader a = MakeLoader(Source(5), 2, 0, 2, 16);
  LmLoader b = MakeLoader(Source(5), 2, 0, 2, 16);
  LmLoader other_rank = MakeLoader(Source(5), 2, 1, 2, 16);
  LmLoader other_seed = MakeLoader(Source(6), 2, 0, 2, 16);
  for (int64_t step = 0; step < 3; ++step) {
    const LmBatch x = a.Batch(step), y = b.Batch(step);
    EXPECT_EQ(x.inputs.ToVector<int64_t>(), y.inputs.ToVector<int64_t>());
    EXPECT_EQ(x.targets.ToVector<int64_t>(), y.targets.ToVector<int64_t>());
    EXPECT_NE(x.inputs.ToVector<int64_t>(), other_rank.Batch(step).inputs.ToVector<int64_t>());
    EXPECT_NE(x.inputs.ToVector<int64_t>(), other_seed.Batch(step).inputs.ToVector<int64_t>());
    EXPECT_NE(x.inputs.ToVector<int64_t>(), a.Batch(step + 1).inputs.ToVector<int64_t>());
  }
}

TEST_P(LmLoaderTest, RankBatchesAreRowsOfTheGlobalBatch) {
  const int64_t B = 3, T = 24;
  for (int world : {2, 4}) {
    LmLoader global = MakeLoader(Source(9), B * world, 0, 1, T);
    for (int64_t step : {0, 1, 17}) {
      const LmBatch g = global.Batch(step);
      for (int rank = 0; rank < world; ++rank) {
        LmLoader local = MakeLoader(Source(9), B, rank, world, T);
        const LmBatch l = local.Batch(step);
        for (int64_t b = 0; b < B; ++b) {
          EXPECT_EQ(Row(l.inputs, b), Row(g.inputs, rank * B + b))
              << "world " << world << " rank " << rank << " row " << b;
          EXPECT_EQ(Row(l.targets, b), Row(g.targets, rank * B + b));
        }
      }
    }
  }
}

// Gradient accumulation: a rank's K micro-batches are its rows of K
// consecutive blocks of the global batch (see loader_state.h), so over the
// ranks and micro-batches a step holds exactly the global batch's rows; a
// layout with the same K*W*B resumes the same stream.
TEST_P(LmLoaderTest, MicroBatchesAreRowsOfTheGlobalBatch) {
  const int64_t B = 2, T = 16;
  const int world = 2, K = 3;
  LmLoader global = MakeLoader(Source(9), K * world * B, 0, 1, T);
  for (int64_t step : {0, 5}) {
    const LmBatch g = global.Batch(step);
    for (int rank = 0; rank < world; ++rank) {
      auto local = LmLoader::Create(Source(9), {B, rank, world, K}, T);
      ASSERT_TRUE(local.ok()) << local.status();
      const LmBatch l = local->Batch(step);
      ASSERT_EQ(l.inputs.shape(), (tensor::Shape{K * B, T}));
      for (int64_t m = 0; m < K; ++m) {
        for (int64_t b = 0; b < B; ++b) {
          const int64_t row = (m * world + rank) * B + b;
          EXPECT_EQ(Row(l.inputs, m * B + b), Row(g.inputs, row))
              << "rank " << rank << " micro-batch " << m << " row " << b;
          EXPECT_EQ(Row(l.targets, m * B + b), Row(g.targets, row));
        }
      }
    }
  }
  auto accumulating = LmLoader::Create(Source(9), {B, 1, world, K}, T);
  ASSERT_TRUE(accumulating.ok());
  accumulating->Next();
  EXPECT_TRUE(global.Restore(accumulating->state()).ok());
  EXPECT_EQ(global.step(), 1);
  auto other_global_batch = LmLoader::Create(Source(9), {B, 0, world, K + 1}, T);
  ASSERT_TRUE(other_global_batch.ok());
  EXPECT_FALSE(other_global_batch->Restore(accumulating->state()).ok());
}

TEST_P(LmLoaderTest, ResumeContinuesLikeAnUninterruptedRun) {
  LmLoader straight = MakeLoader(Source(3), 2, 1, 2, 16);
  std::vector<std::vector<int64_t>> expected;
  for (int i = 0; i < 7; ++i) expected.push_back(straight.Next().inputs.ToVector<int64_t>());

  LmLoader first = MakeLoader(Source(3), 2, 1, 2, 16);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(first.Next().inputs.ToVector<int64_t>(), expected[i]);
  }
  const std::string saved = first.state().ToString();
  EXPECT_EQ(saved.substr(0, 7), "step=4;");

  // A fresh process: new source, new loader, state from its string.
  LmLoader resumed = MakeLoader(Source(3), 2, 1, 2, 16);
  auto state = LoaderState::FromString(saved);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE(resumed.Restore(*state).ok());
  EXPECT_EQ(resumed.step(), 4);
  for (int i = 4; i < 7; ++i) {
    const LmBatch b = resumed.Next();
    EXPECT_EQ(b.step, i);
    EXPECT_EQ(b.inputs.ToVector<int64_t>(), expected[i]);
  }
  // Another layout with the same global batch may resume the same stream.
  LmLoader regrouped = MakeLoader(Source(3), 4, 0, 1, 16);
  EXPECT_TRUE(regrouped.Restore(*state).ok());
}

TEST_P(LmLoaderTest, RestoreRefusesAnotherConfiguration) {
  LmLoader a = MakeLoader(Source(3), 2, 0, 2, 16);
  a.Next();
  const LoaderState s = a.state();
  for (LmLoader other : {MakeLoader(Source(4), 2, 0, 2, 16), MakeLoader(Source(3), 2, 0, 4, 16),
                         MakeLoader(Source(3), 2, 0, 2, 17)}) {
    const absl::Status st = other.Restore(s);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("another data configuration"), absl::string_view::npos) << st;
    EXPECT_EQ(other.step(), 0);
  }
  // Another global batch (2 ranks of 4 rows, saved as 2 of 2) says which to keep.
  const absl::Status st = MakeLoader(Source(3), 4, 0, 2, 16).Restore(s);
  EXPECT_NE(st.message().find("the global batch differs (saved 4 rows, now 8): resume with 4 = "
                              "ranks x rows per rank x micro-batches"),
            absl::string_view::npos)
      << st;
  // The same global batch over another source: no word on the batch.
  EXPECT_EQ(MakeLoader(Source(4), 2, 0, 2, 16).Restore(s).message().find("global batch differs"),
            absl::string_view::npos);
}

INSTANTIATE_TEST_SUITE_P(Sources, LmLoaderTest, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == 0   ? "RandomTokens"
                                              : info.param == 1 ? "ByteText"
                                                                : "TokenFile");
                         });

TEST(LmLoaderErrorsTest, SourceTooSmallForTheSequence) {
  std::shared_ptr<const TokenSource> tiny = *ByteTextSource::FromString("0123456789", 0, "ten");
  EXPECT_TRUE(LmLoader::Create(tiny, {1, 0, 1}, 9).ok());
  auto loader = LmLoader::Create(tiny, {1, 0, 1}, 10);
  ASSERT_FALSE(loader.ok());
  EXPECT_NE(loader.status().message().find(
                "bytes of ten (10 bytes) is too small: a sample needs seq_len + 1 = 11 tokens "
                "but it has 10"),
            absl::string_view::npos)
      << loader.status();
}

TEST(LmLoaderErrorsTest, BadArguments) {
  EXPECT_FALSE(LmLoader::Create(nullptr, {1, 0, 1}, 8).ok());
  EXPECT_NE(LmLoader::Create(RandomSource(0), {1, 0, 1}, 0)
                .status()
                .message()
                .find("seq_len must be >= 1"),
            absl::string_view::npos);
  EXPECT_NE(LmLoader::Create(RandomSource(0), {2, 3, 2}, 8)
                .status()
                .message()
                .find("[lm loader] rank 3 is not in [0, world_size = 2)"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace data
