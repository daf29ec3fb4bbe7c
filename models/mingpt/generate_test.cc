// Generation: the sampling rule draws each token with its filtered
// probability (checked exactly over a grid of uniforms), the last-position
// logits equal the full forward's, and a model that memorized a cyclic text
// continues it greedily past block_size (the context cropped as minGPT does);
// decoding with the key/value cache equals the forward over the whole context.
#include "models/mingpt/generate.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"
#include "tensor/testing.h"

namespace mingpt {
namespace {

using tensor::Dtype;

TEST(SamplingOptionsTest, ErrorsNameWhatIsWrong) {
  SamplingOptions o;
  o.max_new_tokens = -3;
  EXPECT_NE(std::string(o.Validate(256).message()).find("max_new_tokens=-3 must be >= 0"),
            std::string::npos);
  o = {};
  o.top_k = -1;  // the sampling's own checks
  EXPECT_NE(std::string(o.Validate(256).message()).find("top_k must be >= 0"), std::string::npos);
}

GptConfig ByteModel() {
  GptConfig c;
  c.name = "bytes";
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab_size = 256;
  c.block_size = 16;
  c.dropout = 0.0f;
  return c;
}

TEST(GenerateTest, LastLogitsEqualTheFullForwardsLastPosition) {
  GPT gpt(ByteModel());
  gpt.Materialize(3);
  gpt.Train(false);
  std::vector<int64_t> ids;
  for (int i = 0; i < 3 * 9; ++i) ids.push_back((i * 37 + 11) % 256);
  const tensor::Tensor idx = tensor::Tensor::FromData<int64_t>(ids, {3, 9});  // (B, T)
  nn::Context ctx;
  const tensor::Tensor full = gpt.Run(idx, ctx);    // (3, 9, 256)
  const tensor::Tensor last = gpt.LastLogits(idx);  // (3, 256)
  ASSERT_EQ(last.shape().ToString(), "(3,256)");
  EXPECT_TRUE(tensor::testing::AllClose(last, full.Narrow(1, 8, 1).Reshape({3, 256}), 1e-5, 1e-5));
}

TEST(GenerateTest, CachedDecodingEqualsTheFullForward) {
  GPT gpt(ByteModel());
  gpt.Materialize(4);
  gpt.Train(false);
  const int64_t B = 2, L = 16;  // L = block_size
  std::vector<int64_t> ids(B * L);
  for (int64_t i = 0; i < B * L; ++i) ids[i] = (i * 53 + 7) % 256;
  const tensor::Tensor seq = tensor::Tensor::FromData<int64_t>(ids, {B, L});  // (B, L)
  std::vector<nn::KvCache> caches;
  // A 5-token prefill, 2 tokens at once, then one at a time up to block_size.
  int64_t done = 0;
  for (int64_t step : {5, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
    const tensor::Tensor last = gpt.DecodeLogits(seq.Narrow(1, done, step).Contiguous(), caches);
    done += step;
    ASSERT_EQ(caches.size(), 2u);
    EXPECT_EQ(caches[1].length, done);
    const tensor::Tensor full = gpt.LastLogits(seq.Narrow(1, 0, done).Contiguous());
    EXPECT_TRUE(tensor::testing::AllClose(last, full, 1e-5, 1e-5)) << "after " << done;
  }
  ASSERT_EQ(done, L);
  try {
    gpt.DecodeLogits(seq.Narrow(1, 0, 1).Contiguous(), caches);
    FAIL() << "decoded past block_size";
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[gpt] sequence length 17 exceeds block_size 16");
  }
}

// Rows of unequal lengths, left-padded: each row's last logits equal those of
// its sequence alone, in the prefill and in every cached step after it, and
// in a window forward (no cache) whose rows are padded.
TEST(GenerateTest, LeftPaddedRowsDecodeAsTheyWouldAlone) {
  GPT gpt(ByteModel());
  gpt.Materialize(6);
  gpt.Train(false);
  const std::vector<int64_t> lengths = {3, 9, 1, 6};  // the prompts
  const int64_t B = 4, longest = 9, steps = 5;
  std::vector<std::vector<int64_t>> seqs(B);  // each row's prompt + its next tokens
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t i = 0; i < lengths[r] + steps; ++i) seqs[r].push_back((r * 71 + i * 29 + 5) % 256);
  }
  std::vector<int64_t> pad(B);
  for (int64_t r = 0; r < B; ++r) pad[r] = longest - lengths[r];
  // Positions [from, to) of the batch, padding as id 0.
  auto batch = [&](int64_t from, int64_t to) {
    std::vector<int64_t> ids;
    for (int64_t r = 0; r < B; ++r) {
      for (int64_t p = from; p < to; ++p) ids.push_back(p < pad[r] ? 0 : seqs[r][p - pad[r]]);
    }
    return tensor::Tensor::FromData<int64_t>(ids, {B, to - from});
  };
  // Row r's last logits when its first `len` tokens run alone.
  auto alone = [&](int64_t r, int64_t len) {
    const std::vector<int64_t> ids(seqs[r].begin(), seqs[r].begin() + len);
    return gpt.LastLogits(tensor::Tensor::FromData<int64_t>(ids, {1, len}));  // (1, V)
  };
  std::vector<nn::KvCache> caches;
  for (int64_t n = 0; n <= steps; ++n) {
    const int64_t to = longest + n, from = n == 0 ? 0 : to - 1;
    const tensor::Tensor last = gpt.DecodeLogits(batch(from, to), caches, pad);  // (B, V)
    std::vector<nn::KvCache> none;
    const tensor::Tensor window = gpt.DecodeLogits(batch(0, to), none, pad);  // no cache
    for (int64_t r = 0; r < B; ++r) {
      const tensor::Tensor want = alone(r, lengths[r] + n);
      EXPECT_TRUE(tensor::testing::AllClose(last.Narrow(0, r, 1), want, 1e-5, 1e-5))
          << "row " << r << " after " << n << " steps";
      EXPECT_TRUE(tensor::testing::AllClose(window.Narrow(0, r, 1), want, 1e-5, 1e-5))
          << "row " << r << " after " << n << " steps, no cache";
    }
  }
  std::vector<nn::KvCache> fresh;
  const std::vector<int64_t> too_much = {0, 0, 9, 0};
  try {
    gpt.DecodeLogits(batch(0, longest), fresh, too_much);
    FAIL() << "a row of padding only was decoded";
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[gpt] row 2 padding 9 leaves none of its 9 positions");
  }
}

// "the quick brown fox " repeated; every window of block_size is a training row.
const std::string kCycle = "the quick brown fox ";

char CycleAt(size_t i) { return kCycle[i % kCycle.size()]; }

// Initializes `gpt` (ByteModel()) and trains it until it continues the
// cycle from any window.
void TrainOnCycle(GPT& gpt) {
  gpt.Materialize(7);
  const GptConfig& c = gpt.config();
  const int64_t B = static_cast<int64_t>(kCycle.size()), T = c.block_size;
  std::vector<int64_t> x, y;
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t t = 0; t < T; ++t) {
      x.push_back(static_cast<unsigned char>(CycleAt(r + t)));
      y.push_back(static_cast<unsigned char>(CycleAt(r + t + 1)));
    }
  }
  const tensor::Tensor idx = tensor::Tensor::FromData<int64_t>(x, {B, T});
  const tensor::Tensor targets = tensor::Tensor::FromData<int64_t>(y, {B, T});
  optim::AdamWOptions options;
  options.lr = 1e-2;
  options.weight_decay = 0.0;
  auto opt = optim::AdamW::Create(options);
  ASSERT_TRUE(opt.ok());
  double loss = 0.0;
  for (int step = 0; step < 120; ++step) {
    gpt.ZeroGrad();
    loss = gpt.ForwardBackward(idx, targets);
    std::vector<optim::ParamRef> refs = optim::FromModule(gpt);
    (*opt)->Step(refs);
  }
  ASSERT_LT(loss, 0.05);
}

// The bytes of `text`, as token ids.
std::vector<int64_t> Bytes(const std::string& text) {
  std::vector<int64_t> ids;
  for (char ch : text) ids.push_back(static_cast<unsigned char>(ch));
  return ids;
}

// Greedy decoding of `max_new_tokens` tokens.
SamplingOptions Greedy(int64_t max_new_tokens) {
  SamplingOptions greedy;
  greedy.temperature = 0.0;
  greedy.max_new_tokens = max_new_tokens;
  return greedy;
}

TEST(GenerateTest, MemorizedCycleContinuesGreedilyPastBlockSize) {
  GPT gpt(ByteModel());
  TrainOnCycle(gpt);

  // Greedy from "the q" (5 tokens) for 40 more: the context reaches 45 > 16.
  const std::vector<int64_t> prompt = Bytes("the q");
  SamplingOptions greedy = Greedy(40);
  int64_t calls = 0;
  absl::StatusOr<std::vector<std::vector<int64_t>>> rows =
      Generate(gpt, {prompt}, greedy, tensor::Device::Cpu(),
               [&calls](int64_t n, absl::Span<const int64_t> tokens) {
                 EXPECT_EQ(n, calls++);
                 EXPECT_EQ(tokens.size(), 1u);
               });
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(calls, 40);
  std::string text((*rows)[0].begin(), (*rows)[0].end());
  std::string want;
  for (size_t i = 0; i < 45; ++i) want += CycleAt(i);
  EXPECT_EQ(text, want);
  greedy.kv_cache = false;  // the whole context every token
  absl::StatusOr<std::vector<std::vector<int64_t>>> uncached =
      Generate(gpt, {prompt}, greedy, tensor::Device::Cpu());
  ASSERT_TRUE(uncached.ok());
  EXPECT_EQ(*uncached, *rows);

  // Sampling at temperature 0.5 from a model this sure also follows the cycle,
  // on every row; the draws are reproducible and a row's sample is the same
  // in a batch of three as alone.
  SamplingOptions sampled;
  sampled.temperature = 0.5;
  sampled.max_new_tokens = 20;
  sampled.seed = 42;
  absl::StatusOr<std::vector<std::vector<int64_t>>> three =
      Generate(gpt, {prompt, prompt, prompt}, sampled, tensor::Device::Cpu());
  ASSERT_TRUE(three.ok()) << three.status();
  for (const std::vector<int64_t>& row : *three) {
    EXPECT_EQ(std::string(row.begin(), row.end()), want.substr(0, 25));
  }
  absl::StatusOr<std::vector<std::vector<int64_t>>> alone =
      Generate(gpt, {prompt}, sampled, tensor::Device::Cpu());
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ((*alone)[0], (*three)[0]);

  // Prompts of unequal lengths (2, 11 and 5 tokens, from different points of
  // the cycle) in one batch: each row continues the cycle from its own end,
  // with the cache, without it, and past block_size (the batch's context, 11
  // + 30, is cropped; the shortest row's padding leaves the window).
  const std::vector<std::vector<int64_t>> prompts = {
      {'t', 'h'},
      {'u', 'i', 'c', 'k', ' ', 'b', 'r', 'o', 'w', 'n', ' '},
      {'f', 'o', 'x', ' ', 't'}};
  const std::vector<size_t> starts = {0, 5, 16};  // where each prompt sits in the cycle
  greedy.max_new_tokens = 30;
  for (bool kv_cache : {true, false}) {
    greedy.kv_cache = kv_cache;
    absl::StatusOr<std::vector<std::vector<int64_t>>> mixed =
        Generate(gpt, prompts, greedy, tensor::Device::Cpu());
    ASSERT_TRUE(mixed.ok()) << mixed.status();
    for (size_t r = 0; r < prompts.size(); ++r) {
      std::string cycle;
      for (size_t i = 0; i < prompts[r].size() + 30; ++i) cycle += CycleAt(starts[r] + i);
      EXPECT_EQ(std::string((*mixed)[r].begin(), (*mixed)[r].end()), cycle)
          << "row " << r << (kv_cache ? "" : ", no cache");
      absl::StatusOr<std::vector<std::vector<int64_t>>> single =
          Generate(gpt, {prompts[r]}, greedy, tensor::Device::Cpu());
      ASSERT_TRUE(single.ok());
      EXPECT_EQ((*single)[0], (*mixed)[r]) << "row " << r;
    }
  }
}

// The cycle "the quick brown fox " holds no 3-gram twice, so with
// no_repeat_ngram_size 3 greedy decoding follows it from "the q" until it
// would write "the" again: there it takes another token, and the row never
// holds a 3-gram twice. A repetition_penalty gives what greedy decoding of
// the penalized logits of the row's whole sequence (prompt included) gives.
TEST(GenerateTest, RepetitionControlsOnAMemorizedCycle) {
  GPT gpt(ByteModel());
  TrainOnCycle(gpt);
  const std::vector<int64_t> prompt = Bytes("the q");
  SamplingOptions greedy = Greedy(30);
  greedy.no_repeat_ngram_size = 3;
  absl::StatusOr<std::vector<std::vector<int64_t>>> rows =
      Generate(gpt, {prompt}, greedy, tensor::Device::Cpu());
  ASSERT_TRUE(rows.ok()) << rows.status();
  const std::vector<int64_t>& row = (*rows)[0];
  ASSERT_EQ(row.size(), 35u);
  std::string want;
  for (size_t i = 0; i < 22; ++i) want += CycleAt(i);  // "the quick brown fox th"
  EXPECT_EQ(std::string(row.begin(), row.begin() + 22), want);
  EXPECT_NE(row[22], 'e');
  std::set<std::vector<int64_t>> trigrams;
  for (size_t i = 0; i + 3 <= row.size(); ++i) {
    EXPECT_TRUE(trigrams.insert({row[i], row[i + 1], row[i + 2]}).second) << "at " << i;
  }

  SamplingOptions penalized = Greedy(10);  // 15 positions: within block_size
  penalized.repetition_penalty = 1.5;
  penalized.kv_cache = false;  // LastLogits over the sequence, as below
  rows = Generate(gpt, {prompt}, penalized, tensor::Device::Cpu());
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::vector<int64_t> sequence = prompt;
  for (int n = 0; n < 10; ++n) {
    const tensor::Tensor idx =
        tensor::Tensor::FromData<int64_t>(sequence, {1, static_cast<int64_t>(sequence.size())});
    std::vector<float> logits = gpt.LastLogits(idx).ToVector<float>();  // (V)
    train::ApplyRepetitionControls(absl::MakeSpan(logits), sequence, penalized);
    sequence.push_back(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  EXPECT_EQ((*rows)[0], sequence);
}

TEST(GenerateTest, HighTemperatureRowsDifferAndRepeatWithTheSeed) {
  GPT gpt(ByteModel());
  gpt.Materialize(5);
  SamplingOptions o;
  o.temperature = 1.0;
  o.max_new_tokens = 24;
  o.seed = 9;
  const std::vector<int64_t> prompt = {10};
  auto a = Generate(gpt, {prompt, prompt}, o, tensor::Device::Cpu());
  auto b = Generate(gpt, {prompt, prompt}, o, tensor::Device::Cpu());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE((*a)[0], (*a)[1]);  // an untrained model: nearly uniform over 256 ids
  o.kv_cache = false;           // the same draws from the same logits
  auto uncached = Generate(gpt, {prompt, prompt}, o, tensor::Device::Cpu());
  ASSERT_TRUE(uncached.ok());
  EXPECT_EQ(*uncached, *a);
  o.kv_cache = true;
  o.seed = 10;
  auto c = Generate(gpt, {prompt, prompt}, o, tensor::Device::Cpu());
  ASSERT_TRUE(c.ok());
  EXPECT_NE((*c)[0], (*a)[0]);
  EXPECT_EQ((*a)[0].size(), 25u);
  o.max_new_tokens = 0;
  auto none = Generate(gpt, {prompt}, o, tensor::Device::Cpu());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)[0], prompt);
}

// log softmax of one row of logits, in double.
std::vector<double> LogProbs(const tensor::Tensor& logits) {
  const std::vector<float> x = logits.ToVector<float>();
  double top = *std::max_element(x.begin(), x.end()), sum = 0.0;
  for (float v : x) sum += std::exp(v - top);
  std::vector<double> out;
  for (float v : x) out.push_back(v - top - std::log(sum));
  return out;
}

// With as many beams as ids, two steps of beam search keep every first token
// and rank every pair: the result is the likeliest two-token continuation,
// found here by running each of the V + 1 contexts alone. Prompts of unequal
// lengths in one batch, with the cache (rows reordered as beams move) and
// without.
TEST(GenerateBeamsTest, AsManyBeamsAsIdsFindTheLikeliestPair) {
  GptConfig c = ByteModel();
  c.vocab_size = 8;
  GPT gpt(c);
  gpt.Materialize(11);
  gpt.Train(false);
  const int64_t V = 8;
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {7}, {4, 0, 6, 5, 2}};
  std::vector<std::vector<int64_t>> want;
  for (const std::vector<int64_t>& p : prompts) {
    auto last = [&](const std::vector<int64_t>& ids) {
      return LogProbs(gpt.LastLogits(
          tensor::Tensor::FromData<int64_t>(ids, {1, static_cast<int64_t>(ids.size())})));
    };
    const std::vector<double> first = last(p);
    std::vector<double> sums;  // pair (a, b) at a V + b
    for (int64_t a = 0; a < V; ++a) {
      std::vector<int64_t> ids = p;
      ids.push_back(a);
      const std::vector<double> second = last(ids);
      for (int64_t b = 0; b < V; ++b) sums.push_back(first[a] + second[b]);
    }
    std::vector<double> sorted = sums;
    std::sort(sorted.rbegin(), sorted.rend());
    ASSERT_GT(sorted[0] - sorted[1], 1e-4) << "no clear best pair: pick another seed";
    const int64_t best = std::max_element(sums.begin(), sums.end()) - sums.begin();
    std::vector<int64_t> row = p;
    row.push_back(best / V);
    row.push_back(best % V);
    want.push_back(row);
  }
  SamplingOptions beams = Greedy(2);
  beams.num_beams = V;
  for (bool kv_cache : {true, false}) {
    beams.kv_cache = kv_cache;
    absl::StatusOr<std::vector<std::vector<int64_t>>> got =
        Generate(gpt, prompts, beams, tensor::Device::Cpu());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, want) << (kv_cache ? "cached" : "no cache");
  }
}

// Few beams over a nearly uniform model: beams overtake one another, so the
// cache's rows must follow them (nn::SelectKvCacheRows) for the cached
// search to give what the forward over the whole context gives.
TEST(GenerateBeamsTest, TheCacheFollowsTheBeams) {
  GptConfig c = ByteModel();
  c.vocab_size = 8;
  GPT gpt(c);
  gpt.Materialize(12);
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {7}};
  SamplingOptions beams = Greedy(8);
  beams.num_beams = 3;
  absl::StatusOr<std::vector<std::vector<int64_t>>> cached =
      Generate(gpt, prompts, beams, tensor::Device::Cpu());
  beams.kv_cache = false;
  absl::StatusOr<std::vector<std::vector<int64_t>>> uncached =
      Generate(gpt, prompts, beams, tensor::Device::Cpu());
  ASSERT_TRUE(cached.ok() && uncached.ok()) << cached.status();
  EXPECT_EQ(*cached, *uncached);
}

// Beams on the memorized cycle, past block_size (the cache left when the
// context is cropped): the same with the cache and without, a prompt's beams
// the same in a batch of prompts of unequal lengths as alone, and eos_id
// ending the hypothesis. Sampled beams repeat with their seed.
TEST(GenerateBeamsTest, CacheBatchAndEosOnAMemorizedCycle) {
  GPT gpt(ByteModel());
  TrainOnCycle(gpt);
  const std::vector<std::vector<int64_t>> prompts = {
      {'t', 'h'}, {'u', 'i', 'c', 'k', ' ', 'b', 'r', 'o', 'w', 'n', ' '}, {'f', 'o', 'x'}};
  const std::vector<size_t> starts = {0, 5, 16};  // where each prompt sits in the cycle
  SamplingOptions beams = Greedy(14);             // 11 + 14 > block_size 16
  beams.num_beams = 3;
  int64_t calls = 0;
  absl::StatusOr<std::vector<std::vector<int64_t>>> cached =
      Generate(gpt, prompts, beams, tensor::Device::Cpu(),
               [&calls](int64_t, absl::Span<const int64_t>) { ++calls; });
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ(calls, 0);  // beams are known at the end
  for (size_t r = 0; r < prompts.size(); ++r) {
    std::string cycle;
    for (size_t i = 0; i < prompts[r].size() + 14; ++i) cycle += CycleAt(starts[r] + i);
    EXPECT_EQ(std::string((*cached)[r].begin(), (*cached)[r].end()), cycle) << "row " << r;
    absl::StatusOr<std::vector<std::vector<int64_t>>> alone =
        Generate(gpt, {prompts[r]}, beams, tensor::Device::Cpu());
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ((*alone)[0], (*cached)[r]) << "row " << r;
  }
  beams.kv_cache = false;
  absl::StatusOr<std::vector<std::vector<int64_t>>> uncached =
      Generate(gpt, prompts, beams, tensor::Device::Cpu());
  ASSERT_TRUE(uncached.ok());
  EXPECT_EQ(*uncached, *cached);

  // eos_id ' ': the best hypothesis is the cycle up to its next space.
  beams.kv_cache = true;
  beams.eos_id = ' ';
  absl::StatusOr<std::vector<std::vector<int64_t>>> ended =
      Generate(gpt, prompts, beams, tensor::Device::Cpu());
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(std::string((*ended)[0].begin(), (*ended)[0].end()), "the ");
  EXPECT_EQ(std::string((*ended)[1].begin(), (*ended)[1].end()), "uick brown fox ");
  EXPECT_EQ(std::string((*ended)[2].begin(), (*ended)[2].end()), "fox ");
  // Rows drawn one token at a time stop there too.
  SamplingOptions greedy = Greedy(14);
  greedy.eos_id = ' ';
  std::vector<std::vector<int64_t>> seen;
  absl::StatusOr<std::vector<std::vector<int64_t>>> rows = Generate(
      gpt, prompts, greedy, tensor::Device::Cpu(),
      [&seen](int64_t, absl::Span<const int64_t> t) { seen.emplace_back(t.begin(), t.end()); });
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, *ended);
  ASSERT_EQ(seen.size(), 4u);  // the longest row, "uick brown " + "fox ", ends after 4
  EXPECT_EQ(seen[0], (std::vector<int64_t>{'e', 'f', ' '}));
  EXPECT_EQ(seen[1], (std::vector<int64_t>{' ', 'o', -1}));
  EXPECT_EQ(seen[3], (std::vector<int64_t>{-1, ' ', -1}));

  SamplingOptions sampled = beams;
  sampled.eos_id = -1;
  sampled.temperature = 1.5;
  sampled.seed = 3;
  auto a = Generate(gpt, prompts, sampled, tensor::Device::Cpu());
  auto b = Generate(gpt, prompts, sampled, tensor::Device::Cpu());
  sampled.kv_cache = false;
  auto c = Generate(gpt, prompts, sampled, tensor::Device::Cpu());
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status();
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(*a, *c);
  for (size_t r = 0; r < prompts.size(); ++r) EXPECT_EQ((*a)[r].size(), prompts[r].size() + 14);
}

TEST(GenerateTest, BadPromptsAreClearErrors) {
  GPT gpt(ByteModel());
  gpt.Materialize(5);
  SamplingOptions o;
  auto message = [&](const std::vector<std::vector<int64_t>>& prompts) {
    return std::string(Generate(gpt, prompts, o, tensor::Device::Cpu()).status().message());
  };
  EXPECT_EQ(message({}), "no prompt to continue");
  EXPECT_EQ(message({{}}), "prompt 0 is empty: give one token at least");
  EXPECT_EQ(message({{1, 256}}),
            "prompt 0 has token id 256 outside the model's vocabulary [0, 256)");
  o.top_p = 2.0;
  EXPECT_EQ(message({{1}}), "top_p must be in (0, 1], got 2");
}

}  // namespace
}  // namespace mingpt
