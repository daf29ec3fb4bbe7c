// T5 under FSDP: the transformer policy over "T5Block" makes one unit per
// encoder and decoder block and leaves the shared embedding (read by both
// stacks' lookups and the tied lm_head) in the root unit; a policy that would
// move it out is refused; and two ranks of FULL_SHARD (threads engine, through
// models/common:data_parallel as the train binary runs them) give the losses,
// gradient norms and weights of one process on the global batch within 1e-5,
// and after training decode as that process does (the cached decoder's
// logits, greedy tokens), with every unit gathered once and unit by unit
// (DataParallelModel::ForwardOnly's two ways).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dist/fsdp.h"
#include "dist/thread_group.h"
#include "dist/wrap_policy.h"
#include "gtest/gtest.h"
#include "models/common/data_parallel.h"
#include "models/data/random_tokens.h"
#include "models/data/span_corruption.h"
#include "models/t5/generate.h"
#include "models/t5/model.h"
#include "nn/freeze.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/param_ref.h"
#include "tensor/error.h"

namespace t5 {
namespace {

constexpr uint64_t kSeed = 5;
constexpr int64_t kGlobalRows = 4;
constexpr int kSteps = 4;
constexpr double kClip = 0.5;
constexpr double kTol = 1e-5;

T5Config Tiny(bool v1_1) {
  T5Config c;
  c.name = "t5-test-tiny";
  c.vocab_size = 64 + 8;  // random tokens + sentinels (the loader's vocabulary)
  c.d_model = 16;
  c.num_heads = 2;
  c.d_kv = 8;
  c.d_ff = 32;
  c.num_layers = 2;
  c.num_decoder_layers = 2;
  c.relative_attention_num_buckets = 8;
  c.relative_attention_max_distance = 16;
  c.dropout_rate = 0.0f;
  return v1_1 ? AsV1_1(c) : c;
}

data::SpanCorruptionLoader Loader(int rank, int world) {
  auto source = data::RandomTokenSource::Create(kSeed, 64);
  EXPECT_TRUE(source.ok()) << source.status();
  data::SpanCorruptionOptions options;
  options.encoder_length = 16;
  options.num_sentinels = 8;
  options.seed = kSeed;
  auto loader = data::SpanCorruptionLoader::Create(std::move(*source),
                                                   {kGlobalRows / world, rank, world}, options);
  EXPECT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ(loader->vocab_size(), 72);
  return *std::move(loader);
}

std::unique_ptr<optim::Optimizer> AdamW() {
  optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  return *optim::AdamW::Create(o);
}

TEST(T5FsdpPlanTest, TransformerPolicyKeepsTheSharedEmbeddingInTheRoot) {
  for (bool v1_1 : {false, true}) {
    SCOPED_TRACE(v1_1 ? "v1.1 (untied lm_head)" : "v1.0 (tied)");
    T5Model model(Tiny(v1_1));
    const std::vector<dist::UnitPlan> plan =
        dist::PlanUnits(model, dist::WrapPolicy::Transformer({"T5Block"}));
    std::vector<std::string> names;
    for (const dist::UnitPlan& unit : plan) names.push_back(unit.name);
    EXPECT_EQ(names, (std::vector<std::string>{"", "encoder.block.0", "encoder.block.1",
                                               "decoder.block.0", "decoder.block.1"}));
    // Every parameter in exactly one unit, a block's parameters under its name,
    // the root holding what no block holds: shared, final norms (lm_head).
    std::map<std::string, std::string> unit_of;
    for (const dist::UnitPlan& unit : plan) {
      for (const auto& [name, param] : unit.params) {
        EXPECT_TRUE(unit_of.emplace(name, unit.name).second) << name << " in two units";
        if (!unit.name.empty()) {
          EXPECT_TRUE(absl::StartsWith(name, unit.name + ".")) << name << " in " << unit.name;
        }
      }
    }
    EXPECT_EQ(unit_of.size(), model.NamedParameters().size());
    EXPECT_EQ(unit_of.at("shared.weight"), "");
    EXPECT_EQ(unit_of.at("encoder.final_layer_norm.weight"), "");
    EXPECT_EQ(unit_of.at("decoder.final_layer_norm.weight"), "");
    EXPECT_EQ(unit_of.count("lm_head.weight"), v1_1 ? 1u : 0u);
    if (v1_1) {
      EXPECT_EQ(unit_of.at("lm_head.weight"), "");
    }
    // Block 0 owns its stack's relative position bias.
    EXPECT_EQ(unit_of.at("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
              "encoder.block.0");
  }
}

train::DataParallelConfig Config(const std::string& auto_wrap, int world) {
  train::DataParallelFlags flags;
  flags.strategy = "full_shard";
  flags.world_size = world;
  flags.auto_wrap = auto_wrap;
  absl::StatusOr<train::DataParallelConfig> config =
      train::ConfigureDataParallel(flags, {"T5Block"});
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

TEST(T5FsdpPlanTest, APolicyThatMovesTheSharedEmbeddingOutIsRefused) {
  // size:1000 wraps the shared embedding (72 x 16 = 1152 parameters) alone.
  const train::DataParallelConfig config = Config("size:1000", 1);
  absl::Status s = train::RunDataParallel(config, [&](train::RankContext& rank) {
    T5Model model(Tiny(false));
    auto dp =
        train::DataParallelModel::Create(model, rank.pg, config, AdamW(), kSeed, {"shared.weight"});
    EXPECT_FALSE(dp.ok());
    EXPECT_TRUE(absl::StrContains(dp.status().message(),
                                  "puts 'shared.weight' into the FSDP unit 'shared'"))
        << dp.status();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// The same layout through dist::FullyShard alone (a library user's policy,
// no train binary to check it): the head's read of the shared embedding says
// which unit holds it and why that cannot work, where it said "not
// materialized".
TEST(T5FsdpPlanTest, TheHeadSaysWhichUnitHoldsTheSharedEmbedding) {
  absl::Status s = dist::RunRanks(2, [&](int rank, dist::ProcessGroup& pg) {
    T5Model model(Tiny(false));
    dist::FsdpOptions options;
    options.policy = dist::WrapPolicy::SizeBased(1000);  // the shared embedding alone
    auto fsdp = dist::FullyShard(model, pg, options);
    data::SpanCorruptionLoader loader = Loader(rank, 2);
    const data::Seq2SeqBatch b = loader.Next();
    try {
      model.ForwardBackward(b.encoder_inputs, b.encoder_mask, b.decoder_inputs, b.decoder_targets);
      ADD_FAILURE() << "rank " << rank << ": no error";
    } catch (const tensor::OpError& e) {
      EXPECT_TRUE(absl::StrContains(e.what(), "shared.weight, which the tied head reads, is held "
                                              "by FSDP unit 'shared', not gathered when the head "
                                              "runs"))
          << e.what();
    }
  });
  ASSERT_TRUE(s.ok()) << s;
}

struct Decoded {
  std::vector<float> step_logits;            // DecodeStep's after training (2, 3, V)
  std::vector<std::vector<int64_t>> tokens;  // greedy Generate's after training
};

struct Trace {
  std::vector<double> losses, norms;
  std::vector<std::pair<std::string, std::vector<float>>> weights;  // after the last step
  Decoded decoded;           // one process; FSDP: every unit gathered once
  Decoded decoded_per_unit;  // FSDP: the units gathered one by one at each step
};

// After training, forward only (parameters whole): the logits of the cached
// decoder over three positions and six greedy tokens, of a batch every rank
// shares.
void DecodeAfterTraining(T5Model& model, Decoded& t) {
  const tensor::Tensor x =
      tensor::Tensor::FromData<int64_t>({3, 9, 27, 41, 5, 60, 8, 8, 13, 2, 44, 1}, {2, 6});
  const tensor::Tensor mask =
      tensor::Tensor::FromData<int64_t>({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 6});
  DecoderCache cache;
  cache.capacity = 3;
  t.step_logits =
      model
          .DecodeStep(model.Encode(x, mask), mask,
                      tensor::Tensor::FromData<int64_t>({0, 17, 4, 0, 30, 30}, {2, 3}), cache)
          .ToVector<float>();
  GenerateOptions options;
  options.max_new_tokens = 6;
  absl::StatusOr<std::vector<std::vector<int64_t>>> tokens = Generate(model, x, mask, options);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  if (tokens.ok()) t.tokens = *tokens;
}

// What each run freezes, under which wrap policy, and the FSDP units that
// gives: nothing; fine-tuning's frozen parameters (the shared embedding, kept
// in the root unit; the encoder, its final norm then a unit of its own; the
// decoder's first block); and an encoder's and a decoder's self-attention q
// and a cross-attention's q alone under no policy, each then an FSDP unit of
// its own (named as `frozen`, in order) whose weight is gathered only inside
// its Run (the attention used to read it before: "weights are not
// materialized").
struct FrozenCase {
  const char* name;
  std::vector<std::string> frozen;
  const char* auto_wrap;
  int units;
  bool units_are_frozen;  // units 1.. are the `frozen` modules, in order
};
const FrozenCase kFrozenCases[] = {
    {"", {}, "transformer", 5, false},
    {"Frozen", {"shared", "encoder", "decoder.block.0"}, "transformer", 6, false},
    {"FrozenQUnits",
     {"encoder.block.0.layer.0.SelfAttention.q", "decoder.block.0.layer.0.SelfAttention.q",
      "decoder.block.1.layer.1.EncDecAttention.q"},
     "none",
     4,
     true},
};

Trace OneProcess(bool v1_1, const FrozenCase& frozen) {
  T5Model model(Tiny(v1_1));
  if (!frozen.frozen.empty()) {
    EXPECT_TRUE(nn::FreezeParameters(model, frozen.frozen).ok());
  }
  model.Materialize(kSeed);
  data::SpanCorruptionLoader loader = Loader(0, 1);
  std::unique_ptr<optim::Optimizer> opt = AdamW();
  Trace t;
  for (int step = 0; step < kSteps; ++step) {
    const data::Seq2SeqBatch b = loader.Next();  // (4, S), (4, T_dec)
    t.losses.push_back(model.ForwardBackward(b.encoder_inputs, b.encoder_mask, b.decoder_inputs,
                                             b.decoder_targets));
    std::vector<optim::ParamRef> refs = optim::FromModule(model);
    t.norms.push_back(optim::ClipGradNorm(refs, kClip));
    opt->Step(refs);
    model.ZeroGrad();
  }
  for (auto& [name, p] : model.NamedParameters()) {
    t.weights.emplace_back(name, p->value.ToVector<float>());
  }
  model.Train(false);
  DecodeAfterTraining(model, t.decoded);
  return t;
}

// (v1_1, index into kFrozenCases): that case frozen in both runs.
class T5FullShardTest : public testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(T5FullShardTest, TwoRanksEqualOneProcess) {
  const auto [v1_1, frozen_case] = GetParam();
  const FrozenCase& frozen = kFrozenCases[frozen_case];
  const Trace reference = OneProcess(v1_1, frozen);
  ASSERT_GT(reference.norms[0], kClip);  // clipping across shards is exercised
  const train::DataParallelConfig config = Config(frozen.auto_wrap, 2);
  std::vector<Trace> traces(2);
  absl::Status s = train::RunDataParallel(config, [&](train::RankContext& rank) -> absl::Status {
    T5Model model(Tiny(v1_1));
    if (!frozen.frozen.empty()) {
      absl::StatusOr<std::vector<std::string>> f = nn::FreezeParameters(model, frozen.frozen);
      if (!f.ok()) return f.status();
    }
    data::SpanCorruptionLoader loader = Loader(rank.rank, 2);
    auto dp =
        train::DataParallelModel::Create(model, rank.pg, config, AdamW(), kSeed, {"shared.weight"});
    if (!dp.ok()) return dp.status();
    EXPECT_EQ((*dp)->fsdp()->num_units(), frozen.units);
    for (int u = 1; frozen.units_are_frozen && u < (*dp)->fsdp()->num_units(); ++u) {
      EXPECT_EQ((*dp)->fsdp()->unit_name(u), frozen.frozen.at(u - 1));
    }
    Trace& t = traces[rank.rank];
    for (int step = 0; step < kSteps; ++step) {
      const data::Seq2SeqBatch b = loader.Next();  // this rank's rows: (2, S), (2, T_dec)
      const double local = model.ForwardBackward(b.encoder_inputs, b.encoder_mask, b.decoder_inputs,
                                                 b.decoder_targets);
      absl::StatusOr<double> loss = dist::MeanOverRanks(rank.pg, local);
      if (!loss.ok()) return loss.status();
      absl::Status st = (*dp)->FinishBackward();
      if (!st.ok()) return st;
      absl::StatusOr<double> norm = (*dp)->ClipGradNorm(kClip);
      if (!norm.ok()) return norm.status();
      st = (*dp)->Step();
      if (!st.ok()) return st;
      (*dp)->ZeroGrad();
      t.losses.push_back(*loss);
      t.norms.push_back(*norm);
    }
    for (auto& [name, value] : (*dp)->fsdp()->FullStateDict()) {  // rank 0 only
      t.weights.emplace_back(name, value.ToVector<float>());
    }
    using Gather = train::DataParallelModel::Gather;
    (*dp)->ForwardOnly([&] { DecodeAfterTraining(model, t.decoded); }, Gather::kWholeModel);
    (*dp)->ForwardOnly([&] { DecodeAfterTraining(model, t.decoded_per_unit); }, Gather::kPerUnit);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    for (int step = 0; step < kSteps; ++step) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " step ", step + 1));
      EXPECT_NEAR(traces[r].losses[step], reference.losses[step], kTol);
      EXPECT_NEAR(traces[r].norms[step], reference.norms[step], kTol);
    }
  }
  ASSERT_EQ(traces[0].weights.size(), reference.weights.size());
  for (size_t i = 0; i < reference.weights.size(); ++i) {
    const auto& [name, want] = reference.weights[i];
    const auto& [got_name, got] = traces[0].weights[i];
    ASSERT_EQ(got_name, name);
    ASSERT_EQ(got.size(), want.size()) << name;
    double worst = 0;
    for (size_t k = 0; k < want.size(); ++k) {
      worst = std::max(worst, std::fabs(static_cast<double>(got[k]) - want[k]));
    }
    EXPECT_LE(worst, kTol) << name;
  }
  // Decoding, gathered either way: one process's logits and tokens on both ranks.
  for (int r = 0; r < 2; ++r) {
    for (const Decoded* d : {&traces[r].decoded, &traces[r].decoded_per_unit}) {
      SCOPED_TRACE(absl::StrCat("rank ", r, d == &traces[r].decoded ? " whole" : " per unit"));
      const Decoded& want = reference.decoded;
      ASSERT_EQ(d->step_logits.size(), want.step_logits.size());
      double worst = 0;
      for (size_t k = 0; k < want.step_logits.size(); ++k) {
        worst = std::max(worst,
                         std::fabs(static_cast<double>(d->step_logits[k]) - want.step_logits[k]));
      }
      EXPECT_LE(worst, 1e-4);
      EXPECT_EQ(d->tokens, want.tokens);
    }
  }
  // The loss moved: the comparison is over real training.
  EXPECT_NE(reference.losses.front(), reference.losses.back());
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, T5FullShardTest,
                         testing::Combine(testing::Bool(), testing::Range(0, 3)),
                         [](const testing::TestParamInfo<std::tuple<bool, int>>& info) {
                           return std::string(std::get<0>(info.param) ? "V1_1Untied"
                                                                      : "V1_0Tied") +
                                  kFrozenCases[std::get<1>(info.param)].name;
                         });

using Stats = dist::FullyShardedModel::PrefetchStats;

// Per rank, FSDP's prefetch counts under `config` (2 ranks): after each of
// `steps_before` training steps, after DecodeAfterTraining inside
// ForwardOnly (unit by unit), and after one more training step.
std::vector<std::vector<Stats>> PrefetchStatsAroundDecoding(
    const train::DataParallelConfig& config, int steps_before) {
  std::vector<std::vector<Stats>> after(2);
  absl::Status s = train::RunDataParallel(config, [&](train::RankContext& rank) -> absl::Status {
    T5Model model(Tiny(false));
    data::SpanCorruptionLoader loader = Loader(rank.rank, 2);
    auto dp =
        train::DataParallelModel::Create(model, rank.pg, config, AdamW(), kSeed, {"shared.weight"});
    if (!dp.ok()) return dp.status();
    auto train_step = [&]() -> absl::Status {
      const data::Seq2SeqBatch b = loader.Next();  // this rank's rows: (2, S), (2, T_dec)
      model.ForwardBackward(b.encoder_inputs, b.encoder_mask, b.decoder_inputs, b.decoder_targets);
      absl::Status st = (*dp)->FinishBackward();
      if (!st.ok()) return st;
      st = (*dp)->Step();
      (*dp)->ZeroGrad();
      after[rank.rank].push_back((*dp)->fsdp()->prefetch_stats());
      return st;
    };
    for (int step = 0; step < steps_before; ++step) {
      if (absl::Status st = train_step(); !st.ok()) return st;
    }
    Decoded decoded;
    (*dp)->ForwardOnly([&] { DecodeAfterTraining(model, decoded); },
                       train::DataParallelModel::Gather::kPerUnit);
    after[rank.rank].push_back((*dp)->fsdp()->prefetch_stats());
    return train_step();
  });
  EXPECT_TRUE(s.ok()) << s;
  return after;
}

// forward_prefetch follows the forward order recorded from the pass before.
// T5's decoding passes run other units (Encode the encoder, DecodeStep the
// decoder) than a training forward (both stacks): they record an order of
// their own, and the training forward after them prefetches as many units as
// the one before them did. When they overwrote the training order, the next
// training forward prefetched one unit (the root's, from the decoder's
// order) and no other. A prefetch a pass does not use is freed at the pass's
// end; before, it stayed gathered and counted against the in-flight limit,
// and the decoding steps prefetched nothing.
TEST(T5FsdpPrefetchTest, DecodingLeavesTheTrainingForwardsPrefetchAsItWas) {
  train::DataParallelConfig config = Config("transformer", 2);
  config.forward_prefetch = true;
  config.backward_prefetch = dist::BackwardPrefetch::kNone;  // forward prefetches alone
  // The first training step records the order.
  const std::vector<std::vector<Stats>> after = PrefetchStatsAroundDecoding(config, 2);
  ASSERT_FALSE(HasFailure());
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const std::vector<Stats>& a = after[r];  // step 1, step 2, decoding, step 3
    ASSERT_EQ(a.size(), 4u);
    EXPECT_EQ(a[0].issued, 0);  // nothing recorded yet
    const int64_t per_step = a[1].issued - a[0].issued;
    // Two in flight at most: each unit's hook prefetches the next unit (the
    // root the first encoder block, ..., the third decoder block the last):
    // one per non-root unit.
    EXPECT_EQ(per_step, 4);
    EXPECT_EQ(a[1].unused, 0);
    const int64_t decoding = a[2].issued - a[1].issued;
    const int64_t decoding_unused = a[2].unused - a[1].unused;
    std::printf("rank %d: prefetches per training step %lld; decoding: %lld issued, %lld unused\n",
                r, (long long)per_step, (long long)decoding, (long long)decoding_unused);
    // DecodeAfterTraining: Encode, DecodeStep, then Generate's Encode and six
    // DecodeSteps. Each pass whose entry differs from the pass before (the
    // second to fourth) prefetches one unit its root's recorded order names
    // and does not run it, freed unused at the pass's end; Generate's last
    // five DecodeSteps prefetch both decoder blocks.
    EXPECT_EQ(decoding, 3 + 5 * 2);
    EXPECT_EQ(decoding_unused, 3);
    EXPECT_EQ(a[3].issued - a[2].issued, per_step);
    EXPECT_EQ(a[3].unused, a[2].unused);
  }
}

// FSDP2's explicit prefetch (--prefetch_units=2: each unit gathers the next
// two) in decoding: each forward-only pass prefetches, after a first, only
// units the last forward-only pass ran, so a run of decoding steps
// prefetches the second decoder block alone, which it uses; before, each
// step's root also gathered the first two encoder blocks (its list), unused,
// per generated token. Passes whose kind changes from the last (an Encode
// after a DecodeStep, and back) still prefetch two units each they do not
// run. Training's prefetch is unchanged by it.
TEST(T5FsdpPrefetchTest, ExplicitPrefetchInDecodingGathersOnlyUnitsItRuns) {
  train::DataParallelConfig config = Config("transformer", 2);
  config.prefetch_units = 2;
  config.backward_prefetch = dist::BackwardPrefetch::kNone;
  const std::vector<std::vector<Stats>> after = PrefetchStatsAroundDecoding(config, 1);
  ASSERT_FALSE(HasFailure());
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const std::vector<Stats>& a = after[r];  // step 1, decoding, step 2
    ASSERT_EQ(a.size(), 3u);
    const int64_t decoding = a[1].issued - a[0].issued;
    const int64_t decoding_unused = a[1].unused - a[0].unused;
    std::printf("rank %d: training step: %lld issued, %lld unused; decoding: %lld issued, "
                "%lld unused\n",
                r, (long long)a[0].issued, (long long)a[0].unused, (long long)decoding,
                (long long)decoding_unused);
    // Units: the root, encoder blocks 1-2, decoder blocks 3-4. Lists: the
    // root {1, 2}, 1 {2, 3}, 2 {3, 4}, 3 {4}. DecodeAfterTraining: Encode
    // (no forward-only order yet: 1-4 issued, 3-4 unused), DecodeStep (after
    // an Encode: the root's 1-2, unused), Generate's Encode (after a
    // DecodeStep: 3-4, unused), its first DecodeStep (1-2, unused), five more
    // (4 each, used). Before: every DecodeStep 1, 2 and 4, the first two
    // unused (29 issued, 18 unused).
    EXPECT_EQ(decoding, 4 + 2 + 2 + 2 + 5);
    EXPECT_EQ(decoding_unused, 2 + 2 + 2 + 2);
    EXPECT_EQ(a[0].unused, 0);  // training uses what it prefetches
    EXPECT_EQ(a[2].issued - a[1].issued, a[0].issued);
    EXPECT_EQ(a[2].unused, a[1].unused);
  }
}

}  // namespace
}  // namespace t5
