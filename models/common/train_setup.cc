// Token sources, optimizers and LR schedules from train flags.
#include "models/common/train_setup.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "models/data/byte_text.h"
#include "models/data/random_tokens.h"
#include "models/data/token_file.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tensor/cuda_backend.h"

namespace train {

absl::StatusOr<tensor::Device> ResolveDevice(const std::string& flag) {
  absl::StatusOr<tensor::Device> device = tensor::ParseDevice(flag);
  if (!device.ok()) return device.status();
  if (!device->is_cuda()) return device;
  if (!tensor::cuda::Built()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", flag, ": this binary was built without CUDA; rebuild with "
                     "--config=cuda"));
  }
  if (device->index >= tensor::cuda::DeviceCount()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=", flag, ": ", tensor::cuda::DeviceCount(), " CUDA devices are visible"));
  }
  return device;
}

absl::StatusOr<std::shared_ptr<const data::TokenSource>> OpenTokenSource(const std::string& spec,
                                                                          uint64_t seed,
                                                                          int64_t vocab_size) {
  const int64_t vocab = vocab_size > 0 ? vocab_size : data::kGpt2VocabSize;
  if (spec == "shipped") return data::ByteTextSource::OpenDefault(seed);
  if (spec == "random") return data::RandomTokenSource::Create(seed, vocab);
  if (absl::EndsWith(spec, ".bin")) return data::TokenFileSource::Open(spec, seed, vocab);
  return data::ByteTextSource::Open(spec, seed);
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>> MakeOptimizer(const OptimizerSpec& spec) {
  if (spec.name == "adamw") {
    optim::AdamWOptions o;
    o.lr = spec.lr;
    o.beta2 = spec.beta2;
    o.weight_decay = spec.weight_decay;
    auto opt = optim::AdamW::Create(o);
    if (!opt.ok()) return opt.status();
    return std::unique_ptr<optim::Optimizer>(std::move(*opt));
  }
  if (spec.name == "sgd") {
    optim::SgdOptions o;
    o.lr = spec.lr;
    o.momentum = spec.momentum;
    o.weight_decay = spec.weight_decay;
    auto opt = optim::SGD::Create(o);
    if (!opt.ok()) return opt.status();
    return std::unique_ptr<optim::Optimizer>(std::move(*opt));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--optimizer='", spec.name, "' is not one of adamw, sgd"));
}

absl::StatusOr<std::unique_ptr<optim::LrSchedule>> MakeLrSchedule(const std::string& spec,
                                                                  double lr, int64_t steps) {
  if (spec == "constant") return optim::ParseLrSchedule(absl::StrCat("constant:lr=", lr));
  if (spec == "cosine") {
    return optim::ParseLrSchedule(absl::StrCat("cosine:max_lr=", lr, ",min_lr=", lr / 10,
                                               ",warmup_steps=", std::max<int64_t>(1, steps / 10),
                                               ",total_steps=", steps));
  }
  return optim::ParseLrSchedule(spec);
}

}  // namespace train
