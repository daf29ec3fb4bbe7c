// Hugging Face GPT-2 folders in and out, and ReadPretrained of checkpoints.
//
// The HF folders read here are written by the tests themselves with the
// names, shapes and config keys of Hugging Face's files spelled out literally
// (GPT2Model's unprefixed names of the hub's gpt2 files, Conv1D weights
// (in, out), the attn.bias mask buffers, lm_head absent because tied), not
// with WriteHfGpt2. The PyTorch minGPT parity fixture, written in that layout,
// reads back to a model with PyTorch's loss.
#include "models/mingpt/pretrained.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/common/test_files.h"
#include "models/common/train_support.h"
#include "models/data/gpt2_tokenizer.h"
#include "models/data/runfiles.h"
#include "models/mingpt/model.h"
#include "nn/state_dict.h"
#include "tensor/json.h"
#include "tensor/memory_ledger.h"
#include "tensor/safetensors.h"

namespace mingpt {
namespace {

using tensor::NamedTensors;
using tensor::Tensor;

using train::testing::FreshTempDir;
using train::testing::WriteFile;

GptConfig Small() {
  GptConfig c;
  c.name = "small";
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.vocab_size = 13;
  c.block_size = 6;
  c.dropout = 0.0f;
  return c;
}

// Hugging Face's gpt2 config.json keys, with our sizes. `first`: fields put
// before them ("key": value, ...); tensor::Json::Get takes the first of
// repeated keys, so they override.
std::string HfConfigJson(const GptConfig& c, const std::string& first = "") {
  return absl::StrCat(
      "{", first, R"("activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
  "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
  "n_ctx": )",
      c.block_size, R"(, "n_embd": )", c.n_embd, R"(, "n_head": )", c.n_head, R"(, "n_layer": )",
      c.n_layer, R"(, "n_positions": )", c.block_size,
      R"(, "resid_pdrop": 0.1, "summary_activation": null, "vocab_size": )", c.vocab_size, "}\n");
}

std::map<std::string, Tensor> ByName(const NamedTensors& v) { return {v.begin(), v.end()}; }

// Our weights in the hub's GPT2Model layout: no "transformer." prefix, the four
// Conv1D weights transposed, a causal-mask buffer per block, and lm_head only
// when `with_lm_head`.
NamedTensors HubLayout(const GptConfig& c, const NamedTensors& ours, bool with_lm_head,
                       tensor::Dtype dtype = tensor::Dtype::kF32) {
  std::map<std::string, Tensor> w = ByName(ours);
  NamedTensors hf;
  auto add = [&](const std::string& hf_name, const std::string& our_name, bool transpose) {
    Tensor t = w.at(our_name);
    if (transpose) t = t.Transpose(0, 1).Contiguous();
    hf.emplace_back(hf_name, t.To(dtype));
  };
  add("wte.weight", "transformer.wte.weight", false);
  add("wpe.weight", "transformer.wpe.weight", false);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = absl::StrCat("h.", l, ".");
    const std::string o = absl::StrCat("transformer.h.", l, ".");
    for (const char* n : {"ln_1.weight", "ln_1.bias", "attn.c_attn.bias", "attn.c_proj.bias",
                          "ln_2.weight", "ln_2.bias", "mlp.c_fc.bias", "mlp.c_proj.bias"}) {
      add(h + n, o + n, false);
    }
    for (const char* n :
         {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}) {
      add(h + n, o + n, true);
    }
    hf.emplace_back(h + "attn.bias", Tensor::Full({1, 1, c.block_size, c.block_size}, 1.0));
  }
  add("ln_f.weight", "transformer.ln_f.weight", false);
  add("ln_f.bias", "transformer.ln_f.bias", false);
  if (with_lm_head) add("lm_head.weight", "lm_head.weight", false);
  return hf;
}

NamedTensors RandomWeights(const GptConfig& c, uint64_t seed, bool tie) {
  GPT model(c);
  model.Materialize(seed);
  if (tie) {
    auto params = model.NamedParameters();
    params.back().second->value.CopyFrom(params.front().second->value);  // lm_head = wte
  }
  NamedTensors out;
  for (auto& [n, t] : nn::StateDict(model)) out.emplace_back(n, t.Clone());
  return out;
}

void ExpectSameWeights(const NamedTensors& a, const NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.shape(), b[i].second.shape()) << a[i].first;
    EXPECT_EQ(a[i].second.ToVector<float>(), b[i].second.ToVector<float>()) << a[i].first;
  }
}

// OpenPretrained's sources (HF folders slice by slice, Conv1D weights through
// their transpose) read every range of every parameter as `weights` hold it:
// a few ranges per parameter, crossing rows, as FSDP shards cut them.
void ExpectSourcesReadLike(const std::string& path, const NamedTensors& weights) {
  absl::StatusOr<PretrainedSources> opened = OpenPretrained(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_EQ(opened->sources.size(), weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    const auto& [name, source] = opened->sources[i];
    EXPECT_EQ(name, weights[i].first);
    ASSERT_EQ(source->shape(), weights[i].second.shape()) << name;
    const std::vector<float> want = weights[i].second.ToVector<float>();
    const int64_t numel = static_cast<int64_t>(want.size());
    for (int64_t parts : {1, 2, 3, 5}) {
      for (int64_t p = 0; p < parts; ++p) {
        const int64_t begin = numel * p / parts, end = numel * (p + 1) / parts;
        Tensor out = Tensor::Empty({end - begin});
        source->Read(begin, out);
        ASSERT_EQ(out.ToVector<float>(),
                  std::vector<float>(want.begin() + begin, want.begin() + end))
            << name << " elements [" << begin << ", " << end << ")";
      }
    }
  }
}

TEST(HfGpt2Test, ReadsTheHubLayoutWithTiedHeadAndMaskBuffers) {
  const GptConfig c = Small();
  const NamedTensors ours = RandomWeights(c, 3, /*tie=*/true);
  const std::string dir = FreshTempDir("hub");
  WriteFile(dir + "/config.json", HfConfigJson(c));
  ASSERT_TRUE(tensor::WriteSafetensors(dir + "/model.safetensors",
                                       HubLayout(c, ours, /*with_lm_head=*/false),
                                       {{"format", "pt"}})
                  .ok());
  absl::StatusOr<PretrainedWeights> read = ReadHfGpt2(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->config.n_layer, c.n_layer);
  EXPECT_EQ(read->config.n_head, c.n_head);
  EXPECT_EQ(read->config.n_embd, c.n_embd);
  EXPECT_EQ(read->config.vocab_size, c.vocab_size);
  EXPECT_EQ(read->config.block_size, c.block_size);
  EXPECT_EQ(read->source, "Hugging Face GPT-2 " + dir);
  ExpectSameWeights(read->weights, ours);
  // ReadPretrained recognizes the folder by its config.json.
  absl::StatusOr<PretrainedWeights> again = ReadPretrained(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameWeights(again->weights, ours);
  ExpectSourcesReadLike(dir, ours);
}

TEST(HfGpt2Test, ReadsPrefixedNamesBf16AndShardedIndexes) {
  const GptConfig c = Small();
  const NamedTensors ours = RandomWeights(c, 4, /*tie=*/false);
  NamedTensors hf = HubLayout(c, ours, /*with_lm_head=*/true, tensor::Dtype::kBF16);
  for (auto& [n, t] : hf) {
    if (n != "lm_head.weight") n = "transformer." + n;  // GPT2LMHeadModel.save_pretrained
  }
  const std::string dir = FreshTempDir("sharded");
  WriteFile(dir + "/config.json", HfConfigJson(c));
  NamedTensors first(hf.begin(), hf.begin() + 7), second(hf.begin() + 7, hf.end());
  ASSERT_TRUE(tensor::WriteSafetensors(dir + "/model-00001-of-00002.safetensors", first).ok());
  ASSERT_TRUE(tensor::WriteSafetensors(dir + "/model-00002-of-00002.safetensors", second).ok());
  std::string index = R"({"metadata": {"total_size": 1}, "weight_map": {)";
  for (size_t i = 0; i < hf.size(); ++i) {
    absl::StrAppend(&index, i ? ", " : "", tensor::JsonQuote(hf[i].first), ": \"model-0000",
                    i < 7 ? 1 : 2, "-of-00002.safetensors\"");
  }
  WriteFile(dir + "/model.safetensors.index.json", index + "}}\n");
  absl::StatusOr<PretrainedWeights> read = ReadHfGpt2(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  NamedTensors rounded;  // ours rounded to bf16, as the files hold them
  for (auto& [n, t] : ours)
    rounded.emplace_back(n, t.To(tensor::Dtype::kBF16).To(tensor::Dtype::kF32));
  ExpectSameWeights(read->weights, rounded);
  ExpectSourcesReadLike(dir, rounded);
}

TEST(HfGpt2Test, WritesGpt2LMHeadModelsLayoutAndReadsItBack) {
  GptConfig c = Small();
  c.name = "gpt-mini";
  c.dropout = 0.1f;
  const NamedTensors ours = RandomWeights(c, 5, /*tie=*/false);
  const std::string dir = FreshTempDir("export");
  ASSERT_TRUE(WriteHfGpt2(dir, c, ours).ok());
  absl::StatusOr<tensor::SafetensorsFile> file =
      tensor::ReadSafetensors(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->header.metadata.at("format"), "pt");  // transformers refuses files without it
  std::map<std::string, Tensor> hf = ByName(file->tensors);
  std::map<std::string, Tensor> w = ByName(ours);
  ASSERT_EQ(hf.size(), ours.size());
  const Tensor c_attn = hf.at("transformer.h.1.attn.c_attn.weight");  // Conv1D: (C, 3C)
  ASSERT_EQ(c_attn.shape(), tensor::Shape({8, 24}));
  const std::vector<float> a = c_attn.ToVector<float>();
  const std::vector<float> b = w.at("transformer.h.1.attn.c_attn.weight").ToVector<float>();
  for (int64_t i = 0; i < 8; ++i) {
    for (int64_t j = 0; j < 24; ++j) ASSERT_EQ(a[i * 24 + j], b[j * 8 + i]) << i << "," << j;
  }
  EXPECT_EQ(hf.at("transformer.h.0.mlp.c_proj.weight").shape(), tensor::Shape({32, 8}));
  EXPECT_EQ(hf.at("transformer.h.0.mlp.c_fc.bias").shape(), tensor::Shape({32}));
  EXPECT_EQ(hf.at("lm_head.weight").shape(), tensor::Shape({13, 8}));

  std::ifstream in(dir + "/config.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<tensor::Json> json = tensor::ParseJson(text);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->Get("model_type")->text, "gpt2");
  EXPECT_EQ(json->Get("n_positions")->text, "6");
  EXPECT_EQ(json->Get("vocab_size")->text, "13");
  EXPECT_EQ(json->Get("activation_function")->text, "gelu_new");
  EXPECT_EQ(json->Get("tie_word_embeddings")->text, "false");  // minGPT's head is its own

  absl::StatusOr<PretrainedWeights> back = ReadHfGpt2(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->config.ToString(), c.ToString());  // name and dropout recorded too
  ExpectSameWeights(back->weights, ours);

  const std::string tied_dir = FreshTempDir("export_tied");
  ASSERT_TRUE(WriteHfGpt2(tied_dir, c, RandomWeights(c, 6, /*tie=*/true)).ok());
  std::ifstream tied_in(tied_dir + "/config.json");
  const std::string tied_text((std::istreambuf_iterator<char>(tied_in)),
                              std::istreambuf_iterator<char>());
  EXPECT_EQ(tensor::ParseJson(tied_text)->Get("tie_word_embeddings")->text, "true");
}

// config.json's bos_token_id and eos_token_id are the tokenizer's
// "<|endoftext|>": GPT-2's 50256 in a vocabulary padded to 50304 (not the
// last id, 50303), and null without a tokenizer (a byte-level model).
TEST(HfGpt2Test, EndOfTextIsTheTokenizersIdNotTheLastOne) {
  absl::StatusOr<data::Gpt2Tokenizer> gpt2 = data::Gpt2Tokenizer::Shipped();
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  ASSERT_EQ(gpt2->end_of_text(), 50256);
  auto config_json = [](const std::string& dir) {
    std::ifstream in(dir + "/config.json");
    absl::StatusOr<tensor::Json> json = tensor::ParseJson(
        std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
    EXPECT_TRUE(json.ok()) << json.status();
    return json.ok() ? *json : tensor::Json();
  };
  GptConfig c = Small();
  c.vocab_size = 50304;  // GPT-2's 50257 padded to a multiple of 64, as nanoGPT does
  const std::string padded = FreshTempDir("export_eot");
  ASSERT_TRUE(WriteHfGpt2(padded, c, RandomWeights(c, 8, /*tie=*/true), gpt2->end_of_text()).ok());
  const tensor::Json json = config_json(padded);
  ASSERT_NE(json.Get("eos_token_id"), nullptr);
  EXPECT_EQ(json.Get("eos_token_id")->text, "50256");
  EXPECT_EQ(json.Get("bos_token_id")->text, "50256");
  EXPECT_EQ(json.Get("vocab_size")->text, "50304");
  absl::StatusOr<PretrainedWeights> back = ReadHfGpt2(padded);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->config.vocab_size, 50304);

  const std::string bytes = FreshTempDir("export_no_eot");
  ASSERT_TRUE(WriteHfGpt2(bytes, Small(), RandomWeights(Small(), 9, /*tie=*/false)).ok());
  const tensor::Json none = config_json(bytes);
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    ASSERT_NE(none.Get(key), nullptr) << key;
    EXPECT_EQ(none.Get(key)->kind, tensor::Json::Kind::kNull) << key;
  }
  EXPECT_TRUE(ReadHfGpt2(bytes).ok());
}

// Exporting from sources (what `checkpoint export-hf` does) reads and writes
// one weight at a time: the same file as from the weights in memory, with
// the host holding wte and about one weight, not the model.
TEST(HfGpt2Test, ExportFromSourcesStreamsOneWeightAtATime) {
  GptConfig c = Small();
  c.n_layer = 8;
  c.n_embd = 64;
  const NamedTensors ours = RandomWeights(c, 7, /*tie=*/false);
  const std::string saved = FreshTempDir("export_sources") + "/model.safetensors";
  ASSERT_TRUE(tensor::WriteSafetensors(saved, ours).ok());
  absl::StatusOr<nn::NamedInitSources> sources = nn::SafetensorsInitSources(saved);
  ASSERT_TRUE(sources.ok()) << sources.status();
  int64_t model_bytes = 0, largest = 0;
  for (const auto& [name, t] : ours) {
    model_bytes += t.nbytes();
    largest = std::max(largest, t.nbytes());
  }
  const int64_t wte_bytes = ours.front().second.nbytes();

  tensor::MemoryLedger& ledger = tensor::MemoryLedger::Process();
  const int64_t before = ledger.Total(tensor::Device::Cpu()).current;
  ledger.ResetPeaks();
  const std::string streamed = FreshTempDir("export_streamed"),
                    whole = FreshTempDir("export_whole");
  ASSERT_TRUE(WriteHfGpt2(streamed, c, *sources).ok());
  const int64_t held = ledger.Total(tensor::Device::Cpu()).peak - before;
  // wte, the weight read and its transposed host copy.
  EXPECT_LE(held, wte_bytes + 2 * largest + 4096);
  EXPECT_LT(held, model_bytes / 4);

  ASSERT_TRUE(WriteHfGpt2(whole, c, ours).ok());
  for (const char* f : {"/model.safetensors", "/config.json"}) {
    std::ifstream a(streamed + f, std::ios::binary), b(whole + f, std::ios::binary);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}),
              std::string(std::istreambuf_iterator<char>(b), {}))
        << f;
  }
}

// PyTorch minGPT's weights (the parity fixture) in the hub's layout read back
// to a model whose loss on the fixture's batch is PyTorch's.
TEST(HfGpt2Test, TheParityFixtureInHfLayoutGivesPyTorchsLoss) {
  absl::StatusOr<std::string> path =
      data::ResolveRunfile("models/mingpt/testdata/tiny_gpt_reference.safetensors");
  ASSERT_TRUE(path.ok()) << path.status();
  absl::StatusOr<tensor::SafetensorsFile> fixture = tensor::ReadSafetensors(*path);
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  auto meta = [&](const std::string& key) {
    int64_t v = 0;
    EXPECT_TRUE(absl::SimpleAtoi(fixture->header.metadata.at(key), &v)) << key;
    return v;
  };
  GptConfig c;
  c.n_layer = meta("n_layer");
  c.n_head = meta("n_head");
  c.n_embd = meta("n_embd");
  c.vocab_size = meta("vocab_size");
  c.block_size = meta("block_size");
  c.dropout = 0.0f;
  NamedTensors weights;
  std::map<std::string, Tensor> all = ByName(fixture->tensors);
  for (const ParamShape& p : ParameterShapes(c)) weights.emplace_back(p.name, all.at(p.name));
  const std::string dir = FreshTempDir("fixture");
  WriteFile(dir + "/config.json", HfConfigJson(c));
  ASSERT_TRUE(
      tensor::WriteSafetensors(dir + "/model.safetensors", HubLayout(c, weights, true)).ok());
  absl::StatusOr<PretrainedWeights> read = ReadHfGpt2(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  GPT model(read->config);
  ASSERT_TRUE(nn::LoadStateDict(model, read->weights).ok());
  double reference = 0;
  ASSERT_TRUE(absl::SimpleAtod(fixture->header.metadata.at("ref.loss"), &reference));
  const double loss = model.Loss(all.at("idx"), all.at("targets"));
  std::printf("loss %.9f, PyTorch %.9f\n", loss, reference);
  EXPECT_NEAR(loss, reference, 1e-4 * std::fabs(reference));
}

TEST(HfGpt2Test, RefusesWhatIsNotGpt2OrDoesNotFit) {
  const GptConfig c = Small();
  const NamedTensors ours = RandomWeights(c, 7, /*tie=*/true);
  const NamedTensors hub = HubLayout(c, ours, false);
  struct Case {
    std::string name;
    std::string config;
    NamedTensors tensors;
    std::string expected;
  };
  NamedTensors missing(hub.begin() + 1, hub.end());  // no wte
  NamedTensors misshapen = hub;
  misshapen[4].second = Tensor::Zeros({24, 8}, tensor::Dtype::kF32);  // h.0.attn.c_attn.bias slot
  NamedTensors unknown = hub;
  unknown.emplace_back("h.0.attn.rotary.inv_freq", Tensor::Zeros({4}, tensor::Dtype::kF32));
  NamedTensors transposed = hub;  // a Linear-layout (out, in) c_fc weight
  for (auto& [n, t] : transposed) {
    if (n == "h.0.mlp.c_fc.weight") t = t.Transpose(0, 1).Contiguous();
  }
  const std::vector<Case> cases = {
      {"llama", HfConfigJson(c, R"("model_type": "llama", )"), hub, "model_type is 'llama'"},
      {"gelu", HfConfigJson(c, R"("activation_function": "gelu", )"), hub,
       "activation_function 'gelu' is not GPT-2's tanh GELU"},
      {"eps", HfConfigJson(c, R"("layer_norm_epsilon": 1e-06, )"), hub,
       "layer_norm_epsilon 1e-06 is not 1e-5"},
      {"inner", HfConfigJson(c, R"("n_inner": 16, )"), hub, "n_inner 16 is not 4 n_embd (32)"},
      {"sizes", R"({"model_type": "gpt2", "n_layer": 2})", hub, "no 'n_head'"},
      {"missing", HfConfigJson(c), missing, "no tensor 'wte.weight'"},
      {"misshapen", HfConfigJson(c), misshapen, "has shape (24,8); config.json's sizes need (24)"},
      {"unknown", HfConfigJson(c), unknown, "does not have: h.0.attn.rotary.inv_freq"},
      {"transposed", HfConfigJson(c), transposed,
       "'h.0.mlp.c_fc.weight' has shape (32,8); config.json's sizes need (8,32)"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const std::string dir = FreshTempDir("bad_" + k.name);
    WriteFile(dir + "/config.json", k.config);
    ASSERT_TRUE(tensor::WriteSafetensors(dir + "/model.safetensors", k.tensors).ok());
    absl::StatusOr<PretrainedWeights> read = ReadHfGpt2(dir);
    ASSERT_FALSE(read.ok());
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(read.status().message().find(k.expected), std::string::npos) << read.status();
  }
  const std::string bin_only = FreshTempDir("bin_only");
  WriteFile(bin_only + "/config.json", HfConfigJson(c));
  WriteFile(bin_only + "/pytorch_model.bin", "not read");
  absl::StatusOr<PretrainedWeights> read = ReadPretrained(bin_only);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("only safetensors weights are read"), std::string::npos)
      << read.status();
}

TEST(ReadPretrainedTest, CheckpointsComeWithTheirRecordedConfig) {
  GptConfig c = Small();
  c.dropout = 0.2f;
  const NamedTensors ours = RandomWeights(c, 8, /*tie=*/false);
  const std::string dir = FreshTempDir("run");
  const std::string step = dir + "/" + train::CheckpointStepName(40);
  std::filesystem::create_directories(step);
  train::TrainState state;
  state.step = 40;
  state.extra["config"] = c.ToString();
  ASSERT_TRUE(train::WriteCheckpointFiles(step, ours, {}, "sgd", state).ok());
  ASSERT_TRUE(train::SetLatestCheckpoint(dir, 40).ok());
  for (const std::string& path : {dir, step}) {
    absl::StatusOr<PretrainedWeights> read = ReadPretrained(path);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->config.ToString(), c.ToString());
    EXPECT_EQ(read->source, "checkpoint " + step + " (step 40)");
    ExpectSameWeights(read->weights, ours);
  }
  absl::StatusOr<PretrainedWeights> none = ReadPretrained(dir + "/nowhere");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no such folder"), std::string::npos) << none.status();
  // A file (the model's safetensors itself, say) is not taken for a missing folder.
  absl::StatusOr<PretrainedWeights> file = ReadPretrained(step + "/model.safetensors");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("/model.safetensors is a file, not a folder (a checkpoint"),
            std::string::npos)
      << file.status();
  const std::string empty = FreshTempDir("empty");
  absl::StatusOr<PretrainedWeights> neither = ReadPretrained(empty);
  ASSERT_FALSE(neither.ok());
  EXPECT_NE(neither.status().message().find("neither a checkpoint nor a Hugging Face model folder"),
            std::string::npos)
      << neither.status();
}

}  // namespace
}  // namespace mingpt
