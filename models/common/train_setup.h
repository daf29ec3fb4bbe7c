// Set-up shared by the train binaries: the token source a --data flag names,
// the optimizer an --optimizer flag names, the LR schedule of --lr_schedule,
// and the device of --device.
#ifndef MODELS_COMMON_TRAIN_SETUP_H_
#define MODELS_COMMON_TRAIN_SETUP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/common/train_support.h"
#include "models/data/token_source.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "precision/policy.h"
#include "tensor/device.h"

namespace train {

// "shipped" (the text in models/data/text), "random" (uniform tokens), a .bin
// file of uint16 tokens, or any other path as byte-level text. vocab_size 0
// means the default (50257) for random and .bin data, or for a .bin file that
// //tools:tokenize recorded (data::TokenFileMeta, FILE.bin.json) its
// tokenizer's vocabulary; a record whose token count is not the file's is an
// error. Errors are InvalidArgument naming `flag` (--data, --eval_data).
absl::StatusOr<std::shared_ptr<const data::TokenSource>> OpenTokenSource(
    const std::string& spec, uint64_t seed, int64_t vocab_size, absl::string_view flag = "--data");

// The tokenizer recorded beside a .bin `data` (data::TokenFileMeta: "gpt2",
// a folder, or tools/spm_tokenize.py's "sentencepiece:<model>"); nullopt
// for other data or a .bin without a record. InvalidArgument naming --data
// for a record it cannot read.
absl::StatusOr<std::optional<std::string>> RecordedTokenizer(const std::string& data);

// The tokenizer a train binary records in its checkpoints (extra "tokenizer":
// "gpt2" or a folder's absolute path; "" for none), so that sampling and
// export know it. `flag` (--tokenizer):
//   auto: the one //tools:tokenize recorded beside a .bin --data, else
//         `from_weights` (--init_from's: a checkpoint's record, a Hugging Face
//         folder holding vocab.json + merges.txt), else none;
//   none: none;
//   gpt2 or a folder: that one (data::Gpt2Tokenizer::Open).
// Byte-level text --data (shipped, a text file) has no tokenizer: naming one
// is an error, and auto gives none. The tokenizer must open and fit the
// model's vocabulary. Errors are InvalidArgument naming --tokenizer.
absl::StatusOr<std::string> ResolveTokenizer(const std::string& flag, const std::string& data,
                                             const std::string& from_weights, int64_t model_vocab);

// --init_from's weights on byte-level text --data (shipped, a text file: its
// ids are byte values): refused when the weights' ids are a tokenizer's
// tokens, not bytes: they record a tokenizer (`weights_tokenizer`: a
// checkpoint trained on tokenized data, a Hugging Face folder holding
// vocab.json + merges.txt), or come from a Hugging Face folder
// (`hugging_face`) whose vocabulary (`model_vocab`) is not 256 (the hub's
// GPT-2: 50257). A checkpoint of ours that records none (a byte-level model,
// its vocabulary maybe padded past 256) passes, and so does everything with
// --tokenizer=none (`tokenizer_flag`: train on the bytes anyway).
// InvalidArgument naming --init_from and --data, pointing to //tools:tokenize.
absl::Status CheckInitFromData(const std::string& tokenizer_flag, const std::string& data,
                               const std::string& init_from, const std::string& weights_tokenizer,
                               bool hugging_face, int64_t model_vocab);

// --grad_clip: >= 0 (0 disables clipping); InvalidArgument naming the flag.
absl::Status CheckGradClip(double grad_clip);

// Whether `flag` holds another value than its default (set on the command
// line, or by a program, to something else).
bool OffDefault(const absl::CommandLineFlag& flag);

// --grad_accum_steps: >= 1; InvalidArgument naming the flag.
absl::Status CheckGradAccumSteps(int64_t grad_accum_steps);
// The training loop's counts: --steps >= 0 (in all, resumed ones counted),
// --log_every >= 1, --checkpoint_every >= 0 (0: at the end only), and a
// --checkpoint_every > 0 needs a --checkpoint_dir to save into. InvalidArgument
// naming the flag.
absl::Status CheckLoopFlags(int64_t steps, int64_t log_every, int64_t checkpoint_every,
                            const std::string& checkpoint_dir);
// How the start-up line shows K micro-batches: "" for 1, "4 micro-batches x "
// otherwise (before the batch size).
std::string AccumulationPrefix(int64_t grad_accum_steps);

// Evaluation flags (--eval_data, --eval_every, --eval_batches, --val_fraction).
struct EvalFlags {
  std::string data;     // empty: no evaluation (unless val_fraction > 0)
  int64_t every = 0;    // every N steps and after the last; 0: after the last
  int64_t batches = 4;  // global batches per evaluation
  double val_fraction = 0.0;  // > 0: hold out the last part of --data for evaluation
  // Whether --eval_every / --eval_batches were given: without --eval_data or
  // --val_fraction (nothing to evaluate) OpenDataSources refuses them.
  bool every_given = false;
  bool batches_given = false;
  // The flag that chose the evaluation data, for its errors: "--eval_data",
  // or "--val_fraction=F" when that held out part of --data.
  std::string SourceFlag() const;
};
// Checks every >= 0 and batches >= 1, then opens the evaluation source as
// OpenTokenSource does (errors name --eval_data), with seed + 1 so that random
// data is not the training stream. nullptr when data is empty.
absl::StatusOr<std::shared_ptr<const data::TokenSource>> OpenEvalSource(const EvalFlags& flags,
                                                                        uint64_t seed,
                                                                        int64_t vocab_size);
// The training and evaluation sources of --data and the evaluation flags:
//   --eval_data=X: training reads all of --data, evaluation X (OpenEvalSource);
//   --val_fraction=f in (0, 1): evaluation reads the last f of --data's tokens
//     (with seed + 1) and training the first 1 - f (TokenSource::Slice): a
//     held-out split of one file, as nanoGPT's prepare.py writes train.bin
//     and val.bin; random tokens have nothing to hold out;
//   neither: no evaluation (eval nullptr); --eval_every or --eval_batches
//     given (every_given, batches_given) is an error then.
// Errors are InvalidArgument naming the flag (--data, --eval_data,
// --val_fraction, --eval_every, --eval_batches; both --eval_data and
// --val_fraction is one).
struct DataSources {
  std::shared_ptr<const data::TokenSource> train;
  std::shared_ptr<const data::TokenSource> eval;
};
absl::StatusOr<DataSources> OpenDataSources(const std::string& data, const EvalFlags& flags,
                                            uint64_t seed, int64_t vocab_size);

// A failure to make the training batches from --data's training part: with
// --val_fraction and data too small for a sample, said as that flag's
// ("--val_fraction=0.99: the training part (the first 0.01 of --data): ..."),
// else as it is.
absl::Status TrainDataFailure(const absl::Status& failure, const EvalFlags& flags);

// Whether to evaluate after step_done (1-based) of `steps`.
bool EvalAfter(const EvalFlags& flags, int64_t step_done, int64_t steps);
// The start-up line naming the evaluation data and schedule:
// "eval: bytes [3750, 5000) of t.txt | 4 batches every 100 steps and after the last".
std::string EvalLine(const data::TokenSource& eval, const EvalFlags& flags);

// --metrics_out: MetricsWriter::Open, its error InvalidArgument naming the flag.
absl::StatusOr<std::unique_ptr<MetricsWriter>> OpenMetrics(const std::string& path);

// An output file written at the end of a long run (a benchmark's --json_out),
// checked before it starts: InvalidArgument "cannot write '<path>': <why>"
// unless the file can be created (or appended to) now; OK for "". Nothing is
// left behind that was not there.
absl::Status CheckWritableFile(const std::string& path);

struct OptimizerSpec {
  std::string name;  // "adamw" or "sgd"
  double lr = 1e-3;
  // sgd: --momentum, 0.9 when unset; an error with adamw (whose first
  // moment's decay is beta1 = 0.9), rather than silently ignored.
  std::optional<double> momentum;
  double beta2 = 0.999;   // adamw (minGPT uses 0.95)
  double weight_decay = 0.0;
};
absl::StatusOr<std::unique_ptr<optim::Optimizer>> MakeOptimizer(const OptimizerSpec& spec);

// What a checkpoint records of the run's settings that a resumed run may
// change on purpose: extra["lr_schedule"] (schedule.ToString()),
// extra["optimizer_settings"] (optimizer.Settings(): betas, eps, momentum,
// weight decay) and, when not empty, extra["precision"] (the mixed-precision
// policy, MixedPrecisionPolicy::ToString(): checkpoints hold fp32 weights, so
// a resume may change it).
void RecordRunSettings(const optim::LrSchedule& schedule, const optim::Optimizer& optimizer,
                       const std::string& precision, std::map<std::string, std::string>& extra);
// On resuming: a note on stderr for each setting RecordRunSettings recorded
// that differs from the run's (it continues with its own, as flags ask: a
// cosine schedule depends on --steps, a weight decay may be lowered late);
// nothing for a setting the checkpoint does not record (nor for `precision`
// when it is empty). With the model's `config` string, also what the resume
// changes of the model (the dropout: ResumedModelChanges).
void NoteRunSettingsChanges(const TrainState& resumed, const optim::LrSchedule& schedule,
                            const optim::Optimizer& optimizer, const std::string& config = "",
                            const std::string& precision = "");

// On resuming after `step` steps: MetricsWriter::DropAfter, and a warning on
// stderr (training goes on) when the file cannot be rewritten.
void DropMetricsAfter(MetricsWriter& metrics, int64_t step);

// "constant", "cosine" (10% warmup, then down to lr/10 at `steps`), or a spec
// optim::ParseLrSpec reads, whose rate (constant's lr, cosine's max_lr) is
// `lr` and whose cosine total_steps is `steps` where it leaves them out
// ("cosine:warmup_steps=100,min_lr=1e-5"). Errors name --lr_schedule, --lr
// and --steps. `lr_set`: --lr was given a value other than its default, which
// a spec with its own rate would ignore: an error.
absl::StatusOr<std::unique_ptr<optim::LrSchedule>> MakeLrSchedule(const std::string& spec,
                                                                  double lr, int64_t steps,
                                                                  bool lr_set = false);

// --device: "cpu", "cuda" or "cuda:N", checked against this binary (built
// with --config=cuda?) and machine (that many GPUs?); errors name the flag.
absl::StatusOr<tensor::Device> ResolveDevice(const std::string& flag);

// --device and --precision together: the device (ResolveDevice) and the
// mixed-precision policy by name, its dtypes checked against the device
// (fp16 on a CPU, bf16 on a GPU without it); precision errors name the flag.
struct Compute {
  tensor::Device device;
  precision::MixedPrecisionPolicy policy;
};
absl::StatusOr<Compute> ResolveCompute(const std::string& device_flag,
                                       const std::string& precision_flag);

// A train binary's main after its flags are parsed: runs `train`, turning
// exceptions into errors (running out of memory, tensor::OutOfMemoryError,
// into ResourceExhausted), prints "train: error: <message>" on stderr and,
// after running out of memory, the flags that lower what a rank needs.
// After printing, a failure goes to `on_failure` when given (the binaries:
// TellPeersOfFailure, failure_notice.h; what it throws is said as a note).
// Returns the exit code: 0, 2 for InvalidArgument (bad flags), else 1.
int RunTrainMain(const std::function<absl::Status()>& train,
                 const std::function<void(const absl::Status&)>& on_failure = nullptr);

}  // namespace train

#endif  // MODELS_COMMON_TRAIN_SETUP_H_
