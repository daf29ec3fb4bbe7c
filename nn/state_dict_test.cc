// State dicts: round trip through safetensors, fp32 output from bf16 values,
// and errors for missing, unknown and misshapen entries that change nothing.
#include "nn/state_dict.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/linear.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::testing::AllClose;

TEST(StateDictTest, RoundTripThroughSafetensors) {
  Linear a(4, 3), b(4, 3);
  a.Materialize(1);
  b.Materialize(2);
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/linear.safetensors";
  ASSERT_TRUE(tensor::WriteSafetensors(path, StateDict(a, "layer.")).ok());
  auto file = tensor::ReadSafetensors(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->tensors[0].first, "layer.weight");
  ASSERT_TRUE(LoadStateDict(b, file->tensors, "layer.").ok());
  EXPECT_TRUE(AllClose(b.weight()->value, a.weight()->value, 0, 0));
  EXPECT_TRUE(AllClose(b.bias()->value, a.bias()->value, 0, 0));
}

// Loading from the file reads each entry straight into its parameter: the
// same values as LoadStateDict, into bf16 values too, and errors that name
// the entry and change nothing.
TEST(StateDictTest, LoadFromSafetensorsReadsEntriesIntoTheParameters) {
  Linear a(4, 3), b(4, 3), c(4, 3), small(3, 3);
  a.Materialize(1);
  b.Materialize(2);
  c.Materialize(3);
  small.Materialize(4);
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/linear_stream.safetensors";
  ASSERT_TRUE(tensor::WriteSafetensors(path, StateDict(a, "layer.")).ok());
  auto header = tensor::ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok()) << header.status();
  const Tensor weight_storage = b.weight()->value;
  ASSERT_TRUE(LoadStateDictFromSafetensors(b, path, *header, "layer.").ok());
  EXPECT_TRUE(AllClose(b.weight()->value, a.weight()->value, 0, 0));
  EXPECT_TRUE(AllClose(b.bias()->value, a.bias()->value, 0, 0));
  EXPECT_TRUE(b.weight()->value.SharesStorageWith(weight_storage));  // in place
  c.weight()->value = c.weight()->value.To(Dtype::kBF16);
  ASSERT_TRUE(LoadStateDictFromSafetensors(c, path, *header, "layer.").ok());
  EXPECT_EQ(c.weight()->value.dtype(), Dtype::kBF16);
  EXPECT_TRUE(AllClose(c.weight()->value, a.weight()->value.To(Dtype::kBF16), 0, 0));
  const std::vector<float> before = small.weight()->value.ToVector<float>();
  absl::Status s = LoadStateDictFromSafetensors(small, path, *header, "layer.");
  EXPECT_EQ(s.message(),
            "state dict entry 'layer.weight' has shape (3,4), the model expects (3,3)");
  EXPECT_EQ(small.weight()->value.ToVector<float>(), before);
}

TEST(StateDictTest, SavesFp32FromLowPrecisionValues) {
  Linear a(2, 2);
  a.Materialize(1);
  a.weight()->value = a.weight()->value.To(Dtype::kBF16);
  tensor::NamedTensors sd = StateDict(a);
  EXPECT_EQ(sd[0].second.dtype(), Dtype::kF32);
}

TEST(StateDictTest, ErrorsNameTheProblemAndChangeNothing) {
  Linear a(4, 3);
  a.Materialize(1);
  const std::vector<float> before = a.weight()->value.ToVector<float>();
  tensor::NamedTensors sd = StateDict(a);
  tensor::NamedTensors wrong_shape = sd;
  wrong_shape[1].second = Tensor::Zeros({4});
  absl::Status s = LoadStateDict(a, wrong_shape);
  EXPECT_EQ(s.message(), "state dict entry 'bias' has shape (4), the model expects (3)");
  tensor::NamedTensors missing = {sd[1]};
  missing[0].second = Tensor::Zeros({3});
  s = LoadStateDict(a, missing);
  EXPECT_EQ(s.message(), "state dict lacks 1 entries: weight");
  tensor::NamedTensors extra = sd;
  extra.emplace_back("lm_head.weight", Tensor::Zeros({1}));
  s = LoadStateDict(a, extra);
  EXPECT_EQ(s.message(), "state dict has entries the model lacks: lm_head.weight");
  EXPECT_EQ(a.weight()->value.ToVector<float>(), before);
  // CheckStateDict: the same checks, nothing loaded.
  EXPECT_EQ(CheckStateDict(a, extra).message(), s.message());
  EXPECT_EQ(CheckStateDict(a, {sd[0], sd[0], sd[1]}).message(),
            "state dict names 'weight' twice");
  EXPECT_TRUE(CheckStateDict(a, sd).ok());
  // A parameter's entry must be floating, also where the parameter has no
  // values yet (it would be converted from integers silently).
  tensor::NamedTensors integers = sd;
  integers[0].second = Tensor::Zeros({3, 4}, Dtype::kI64);
  EXPECT_EQ(LoadStateDict(a, integers).message(),
            "state dict entry 'weight' has dtype i64, expected a floating dtype");
  Linear empty(4, 3);
  EXPECT_EQ(LoadStateDict(empty, integers).message(),
            "state dict entry 'weight' has dtype i64, expected a floating dtype");
  EXPECT_EQ(CheckStateDict(empty, integers).message(),
            "state dict entry 'weight' has dtype i64, expected a floating dtype");
  // A wrapper's parameter (FSDP, ZeRO-1): refused both ways, naming the wrapper.
  a.weight()->held_by = "FSDP unit 'h.0'";
  s = LoadStateDict(a, sd);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "parameter 'weight' is held by FSDP unit 'h.0', which would replace what is loaded "
            "into it: load before wrapping (or nn::InitFromStateDict before FullyShard), or "
            "through the wrapper (FSDP's LoadFullStateDict, dist::LoadSharded)");
  EXPECT_EQ(a.weight()->value.ToVector<float>(), before);
  try {
    StateDict(a);
    ADD_FAILURE() << "StateDict of a wrapper's parameter";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'weight' is held by FSDP unit 'h.0': its "
                                         "value is the wrapper's"),
              std::string::npos)
        << e.what();
  }
}

TEST(StateDictTest, InitFromStateDictSharesTheValuesUntilMaterialized) {
  Linear a(4, 3), b(4, 3);
  a.Materialize(1);
  tensor::NamedTensors sd = StateDict(a);
  ASSERT_TRUE(InitFromStateDict(b, sd).ok());
  // Nothing is copied: the parameter's init refers to the entry's storage.
  EXPECT_FALSE(b.weight()->value.defined());
  EXPECT_EQ(b.weight()->init.kind, InitSpec::Kind::kFrom);
  auto* source = dynamic_cast<const TensorInitSource*>(b.weight()->init.from.get());
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->values().raw_data(), sd[0].second.raw_data());
  // A slice is what FSDP copies into a shard: elements [5, 9) of the weight.
  Tensor slice = Tensor::Empty({4});
  InitSlice(b.weight()->init, 0, "weight", 5, slice);
  const std::vector<float> weight = a.weight()->value.ToVector<float>();
  EXPECT_EQ(slice.ToVector<float>(), std::vector<float>(weight.begin() + 5, weight.begin() + 9));
  Tensor bf16 = Tensor::Empty({2}, Dtype::kBF16);
  InitSlice(b.weight()->init, 0, "weight", 0, bf16);
  EXPECT_TRUE(
      AllClose(bf16.To(Dtype::kF32), a.weight()->value.Reshape({12}).Narrow(0, 0, 2), 1e-2, 1e-2));
  EXPECT_THROW(InitSlice(b.weight()->init, 0, "weight", 10, slice), std::exception);

  b.Materialize(7);  // the seed does not matter: the values are the state dict's
  EXPECT_TRUE(AllClose(b.weight()->value, a.weight()->value, 0, 0));
  EXPECT_TRUE(AllClose(b.bias()->value, a.bias()->value, 0, 0));
  EXPECT_NE(b.weight()->value.raw_data(), sd[0].second.raw_data());

  // Once released, initializing from it again fails loudly instead of drawing.
  ReleaseInitValues(b);
  EXPECT_EQ(b.weight()->init.from, nullptr);
  try {
    InitSlice(b.weight()->init, 0, "weight", 0, slice);
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'weight': its loaded values were released"),
              std::string::npos)
        << e.what();
  }
  // Parameters that already have values are refused, and the usual checks apply.
  absl::Status s = InitFromStateDict(a, sd);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("parameter 'weight' already has values"), absl::string_view::npos);
  Linear c(4, 3);
  s = InitFromStateDict(c, {sd[0]});
  EXPECT_EQ(s.message(), "state dict lacks 1 entries: bias");
  EXPECT_NE(c.weight()->init.kind, InitSpec::Kind::kFrom) << "changed on error";
}

TEST(StateDictTest, SafetensorsSourcesReadSlicesOfTheFile) {
  Linear a(4, 3), b(4, 3);
  a.Materialize(1);
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/sources.safetensors";
  ASSERT_TRUE(tensor::WriteSafetensors(path, StateDict(a)).ok());
  absl::StatusOr<NamedInitSources> sources = SafetensorsInitSources(path);
  ASSERT_TRUE(sources.ok()) << sources.status();
  ASSERT_TRUE(InitFromSources(b, *sources).ok());
  Tensor slice = Tensor::Empty({4});
  InitSlice(b.weight()->init, 0, "weight", 5, slice);
  const std::vector<float> weight = a.weight()->value.ToVector<float>();
  EXPECT_EQ(slice.ToVector<float>(), std::vector<float>(weight.begin() + 5, weight.begin() + 9));
  b.Materialize(7);
  EXPECT_TRUE(AllClose(b.weight()->value, a.weight()->value, 0, 0));
  EXPECT_TRUE(AllClose(b.bias()->value, a.bias()->value, 0, 0));

  // A corrupted file is refused when opened, before any slice is read.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 2] ^= 0x40;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  sources = SafetensorsInitSources(path);
  EXPECT_EQ(sources.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(sources.status().message().find("is corrupted"), absl::string_view::npos);
  // A file that went away between opening and reading fails loudly.
  ASSERT_TRUE(tensor::WriteSafetensors(path, StateDict(a)).ok());
  sources = SafetensorsInitSources(path);
  ASSERT_TRUE(sources.ok());
  Linear c(4, 3);
  ASSERT_TRUE(InitFromSources(c, *sources).ok());
  std::remove(path.c_str());
  EXPECT_THROW(InitSlice(c.weight()->init, 0, "weight", 0, slice), std::exception);
}

// Every element range of the transpose, from memory and from a file (bf16 in
// the file, read as f32), equals the same range of the transposed tensor.
TEST(StateDictTest, TransposedSourcesReadAnyRangeOfTheTranspose) {
  const Tensor stored = tensor::testing::RandomTensor({5, 7}, 3);  // (in, out)
  const std::vector<float> want = stored.Transpose(0, 1).Contiguous().ToVector<float>();
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/conv1d.safetensors";
  ASSERT_TRUE(tensor::WriteSafetensors(path, {{"w", stored.To(tensor::Dtype::kBF16)}}).ok());
  absl::StatusOr<NamedInitSources> file = SafetensorsInitSources(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<float> want_bf16 = stored.To(tensor::Dtype::kBF16)
                                           .To(tensor::Dtype::kF32)
                                           .Transpose(0, 1)
                                           .Contiguous()
                                           .ToVector<float>();
  for (const auto& [source, expected] :
       {std::make_pair(TransposedInitSource(std::make_shared<TensorInitSource>(stored)), want),
        std::make_pair(TransposedInitSource(file->front().second), want_bf16)}) {
    EXPECT_EQ(source->shape(), tensor::Shape({7, 5}));
    for (int64_t begin = 0; begin <= 35; ++begin) {
      for (int64_t n = 0; begin + n <= 35; ++n) {
        Tensor out = Tensor::Empty({n});
        source->Read(begin, out);
        ASSERT_EQ(out.ToVector<float>(),
                  std::vector<float>(expected.begin() + begin, expected.begin() + begin + n))
            << "elements [" << begin << ", " << begin + n << ")";
      }
    }
    Tensor past = Tensor::Empty({2});
    EXPECT_THROW(source->Read(34, past), std::exception);
  }
  EXPECT_THROW(TransposedInitSource(std::make_shared<TensorInitSource>(Tensor::Empty({3}))),
               std::exception);
  // Reads of more than 2^20 elements go in blocks of whole rows.
  const Tensor tall = tensor::testing::RandomTensor({3, 400001}, 4);  // transpose: (400001, 3)
  const std::vector<float> tall_t = tall.Transpose(0, 1).Contiguous().ToVector<float>();
  const std::shared_ptr<const InitSource> source =
      TransposedInitSource(std::make_shared<TensorInitSource>(tall));
  for (const auto& [begin, n] : {std::make_pair<int64_t, int64_t>(0, 1200003),
                                 std::make_pair<int64_t, int64_t>(2, 1100000)}) {
    Tensor out = Tensor::Empty({n});
    source->Read(begin, out);
    EXPECT_TRUE(out.ToVector<float>() ==
                std::vector<float>(tall_t.begin() + begin, tall_t.begin() + begin + n))
        << "elements [" << begin << ", " << begin + n << ")";
  }
}

}  // namespace
}  // namespace nn
