// Prints a few decoded training samples, to look at what a model will see:
//   bazel run //models/data:print_samples                       # LM batches of the shipped text
//   bazel run //models/data:print_samples -- --task=t5          # T5 span corruption of it
//   bazel run //models/data:print_samples -- --data=/path/train.bin --vocab=50257
//   bazel run //models/data:print_samples -- --data=random
// Byte text is decoded as text; token files and random tokens print ids.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/common/command_line.h"
#include "models/data/byte_text.h"
#include "models/data/lm_loader.h"
#include "models/data/random_tokens.h"
#include "models/data/runfiles.h"
#include "models/data/span_corruption.h"
#include "models/data/token_file.h"

ABSL_FLAG(std::string, task, "lm", "lm (next-token batches) or t5 (span corruption)");
ABSL_FLAG(std::string, data, "shipped",
          "shipped (the shipped text; also 'default'), random, a text file, or a .bin token "
          "file (as the train binaries' --data)");
ABSL_FLAG(int64_t, vocab, data::kGpt2VocabSize, "vocabulary of random tokens and .bin files");
ABSL_FLAG(int64_t, seq_len, 64, "T for lm; encoder length S for t5");
ABSL_FLAG(int64_t, batch_size, 2, "rows per rank");
ABSL_FLAG(int, rank, 0, "this rank");
ABSL_FLAG(int, world_size, 1, "number of ranks");
ABSL_FLAG(int64_t, step, 0, "the step to show");
ABSL_FLAG(uint64_t, seed, 1337, "data seed (the train binaries' default --seed)");

namespace {

struct Source {
  std::shared_ptr<const data::TokenSource> source;
  bool is_text = false;
};

absl::StatusOr<Source> OpenSource() {
  const std::string spec = absl::GetFlag(FLAGS_data);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  Source s;
  if (spec == "shipped" || spec == "default") {
    auto text = data::ByteTextSource::OpenDefault(seed);
    if (!text.ok()) return text.status();
    s.source = *std::move(text);
    s.is_text = true;
  } else if (spec == "random") {
    auto random = data::RandomTokenSource::Create(seed, absl::GetFlag(FLAGS_vocab));
    if (!random.ok()) return random.status();
    s.source = *std::move(random);
  } else if (absl::EndsWith(spec, ".bin")) {
    auto file = data::TokenFileSource::Open(spec, seed, absl::GetFlag(FLAGS_vocab));
    if (!file.ok()) return file.status();
    s.source = *std::move(file);
  } else {
    auto text = data::ByteTextSource::Open(spec, seed);
    if (!text.ok()) return text.status();
    s.source = *std::move(text);
    s.is_text = true;
  }
  return s;
}

std::vector<int64_t> Row(const tensor::Tensor& t, int64_t b) {
  const int64_t n = t.dim(1);
  const int64_t* p = t.data<int64_t>() + b * n;
  return std::vector<int64_t>(p, p + n);
}

std::string Show(absl::Span<const int64_t> ids, bool is_text) {
  if (is_text) return absl::StrCat("\"", data::DecodeBytes(ids), "\"");
  return absl::StrCat("[", absl::StrJoin(ids, " "), "]");
}

int Run() {
  absl::StatusOr<Source> source = OpenSource();
  if (!source.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(source.status().message()).c_str());
    return 2;
  }
  const data::DataParallel layout{absl::GetFlag(FLAGS_batch_size), absl::GetFlag(FLAGS_rank),
                                  absl::GetFlag(FLAGS_world_size)};
  const int64_t step = absl::GetFlag(FLAGS_step);
  std::printf("source: %s\n", source->source->Describe().c_str());
  if (absl::GetFlag(FLAGS_task) == "lm") {
    auto loader = data::LmLoader::Create(source->source, layout, absl::GetFlag(FLAGS_seq_len));
    if (!loader.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(loader.status().message()).c_str());
      return 2;
    }
    const data::LmBatch batch = loader->Batch(step);
    for (int64_t b = 0; b < layout.batch_size; ++b) {
      std::printf("row %lld inputs:  %s\n", static_cast<long long>(layout.GlobalRow(b)),
                  Show(Row(batch.inputs, b), source->is_text).c_str());
      std::printf("row %lld targets: %s\n", static_cast<long long>(layout.GlobalRow(b)),
                  Show(Row(batch.targets, b), source->is_text).c_str());
    }
  } else if (absl::GetFlag(FLAGS_task) == "t5") {
    data::SpanCorruptionOptions options;
    options.encoder_length = absl::GetFlag(FLAGS_seq_len);
    options.seed = absl::GetFlag(FLAGS_seed);
    auto loader = data::SpanCorruptionLoader::Create(source->source, layout, options);
    if (!loader.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(loader.status().message()).c_str());
      return 2;
    }
    const data::SpanCorruptor& c = loader->corruptor();
    std::printf(
        "vocab %lld (source %lld + %lld sentinels), L=%lld, S=%lld, T_dec=%lld\n",
        static_cast<long long>(c.vocab_size()), static_cast<long long>(c.source_vocab_size()),
        static_cast<long long>(options.num_sentinels), static_cast<long long>(c.raw_length()),
        static_cast<long long>(c.encoder_length()), static_cast<long long>(c.decoder_length()));
    const data::Seq2SeqBatch batch = loader->Batch(step);
    auto decode = [&](absl::Span<const int64_t> ids) { return Show(ids, source->is_text); };
    for (int64_t b = 0; b < layout.batch_size; ++b) {
      std::printf("row %lld inputs:  %s\n", static_cast<long long>(layout.GlobalRow(b)),
                  c.Render(Row(batch.encoder_inputs, b), decode).c_str());
      std::printf("row %lld targets: %s\n", static_cast<long long>(layout.GlobalRow(b)),
                  c.Render(Row(batch.decoder_targets, b), decode).c_str());
    }
  } else {
    std::fprintf(stderr, "error: --task must be lm or t5, got %s\n",
                 absl::GetFlag(FLAGS_task).c_str());
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  train::ParseCommandLineOrExit(argc, argv, "Prints samples of a data loader.");
  data::SetProgramPath(argv[0]);
  return Run();
}
