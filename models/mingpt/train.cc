// Trains minGPT: `./bazelw run //models/mingpt:train` trains gpt-mini on the
// shipped text in one process with the embedded defaults; every flag below
// changes one thing. Each step logs loss, ms/step, tokens/s and peak memory by
// category; --metrics_out writes the same as JSON lines; --checkpoint_dir and
// --resume save and continue exactly; --init_from starts from a checkpoint's
// or a Hugging Face GPT-2 folder's weights (models/mingpt/pretrained.h).
//
// Data parallelism (models/common/data_parallel.h):
// --strategy=ddp|zero1|shard_grad_op|full_shard|no_shard
// --auto_wrap=none|transformer|size:N, and either
//   --backend=threads --world_size=N   ranks as threads of this process, or
//   --backend=gloo                     this process is one rank of a job that
//                                      //tools:launch starts (RANK, WORLD_SIZE,
//                                      MASTER_ADDR, ... from its environment):
//   bazel-bin/tools/launch --nproc_per_node=2 -- bazel-bin/models/mingpt/train
//       --backend=gloo --strategy=full_shard
// --batch_size is per rank: each rank trains on its rows of the global batch
// of N * batch_size sequences, so the losses equal those of one rank with an N
// times larger batch (dropout 0). Rank 0 logs the loss averaged over the ranks
// and global tokens/s; at the end each rank's peak memory by category is
// printed (threads: one table; gloo: one line per rank). A collective that
// waits longer than --timeout_s for a peer fails, naming the op and the ranks.
// --checkpoint_dir/--resume work under data parallelism too: FSDP and ZeRO-1
// save sharded checkpoints (a file per rank + index.json) that resume at
// another world size (the same global batch), strategy or wrap policy; DDP
// saves the single-process format from rank 0. --precision=bf16 works with
// every strategy (fp32 masters, bf16 compute, gradients reduced in bf16).
//
// A training step, top to bottom:
//   batch -> [cast params to bf16] -> forward, loss, backward (fp32 grads)
//   of each of --grad_accum_steps micro-batches (the gradients add up)
//   -> [restore fp32 masters] -> clip -> optimizer step -> zero grads
// and on each rank under data parallelism (TrainRank):
//   this rank's rows -> forward, loss, backward of each micro-batch (all but
//   the last under no_sync; DDP / FSDP communicate the last one's gradients
//   during its backward) -> loss averaged over the ranks -> finish the
//   gradient communication -> clip by the global norm -> step -> zero grads
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "models/common/command_line.h"
#include "models/common/data_parallel.h"
#include "models/common/data_parallel_flags.h"
#include "models/common/eval_flags.h"
#include "models/common/failure_notice.h"
#include "models/common/freeze_flags.h"
#include "models/common/loss_scaling.h"
#include "models/common/loss_scaling_flags.h"
#include "models/common/mfu.h"
#include "models/common/one_process_step.h"
#include "models/common/sample_flags.h"
#include "models/common/train_setup.h"
#include "models/common/train_support.h"
#include "models/common/training_loop.h"
#include "models/data/byte_text.h"
#include "models/data/lm_loader.h"
#include "models/data/random_tokens.h"
#include "models/data/runfiles.h"
#include "models/data/token_file.h"
#include "models/mingpt/config.h"
#include "models/mingpt/generate.h"
#include "models/mingpt/model.h"
#include "models/mingpt/pretrained.h"
#include "models/mingpt/text.h"
#include "nn/checkpoint.h"
#include "nn/state_dict.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "precision/policy.h"
#include "tensor/cuda_backend.h"
#include "tensor/memory_ledger.h"
#include "tensor/thread_pool.h"

// Optional, so that --init_from can refuse it given at all (even as gpt-mini).
ABSL_FLAG(std::optional<std::string>, preset, std::nullopt,
          "model preset (default gpt-mini): gpt-nano, gpt-micro, gpt-mini, gopher-44m, gpt2, "
          "gpt2-medium, gpt2-large, gpt2-xl, gpt-175b, gpt-1t");
ABSL_FLAG(int64_t, vocab_size, 0,
          "vocabulary size; 0 = the data's (256 for text, 50257 otherwise)");
ABSL_FLAG(int64_t, steps, 150, "optimizer steps to run (in all, counting resumed ones)");
ABSL_FLAG(int64_t, batch_size, 16, "sequences per micro-batch (per rank under data parallelism)");
ABSL_FLAG(int64_t, grad_accum_steps, 1,
          "micro-batches of --batch_size whose gradients add up to one optimizer step (gradient "
          "accumulation): a step trains on grad_accum_steps x world size x batch_size sequences");
ABSL_FLAG(int64_t, seq_len, 128, "tokens per sequence (at most the preset's block_size)");
ABSL_FLAG(double, lr, 1e-3, "learning rate (the peak, with --lr_schedule=cosine)");
ABSL_FLAG(std::string, lr_schedule, "constant",
          "constant, cosine (10% warmup, decay to lr/10 at --steps), or a spec such as "
          "cosine:max_lr=6e-4,min_lr=6e-5,warmup_steps=100,total_steps=2000 (a key left out: "
          "max_lr or lr is --lr, total_steps is --steps, min_lr and warmup_steps are 0). "
          "cosine, and a spec without total_steps, depend on --steps: resuming with another "
          "--steps changes the decay");
ABSL_FLAG(std::string, optimizer, "adamw", "adamw or sgd");
ABSL_FLAG(std::optional<double>, momentum, std::nullopt,
          "SGD momentum (unset: 0.9); an error with --optimizer=adamw");
ABSL_FLAG(double, weight_decay, 0.1, "weight decay (Linear weights only, as minGPT)");
ABSL_FLAG(double, grad_clip, 1.0, "clip the global gradient norm to this; 0 disables");
ABSL_FLAG(std::string, precision, "fp32",
          "fp32, bf16 or fp16 (mixed: fp32 masters and grads; fp16 on a GPU, with loss scaling)");
ABSL_FLAG(std::string, device, "cpu",
          "cpu or cuda[:N] (a --config=cuda build and a GPU; data parallelism on a GPU: an FSDP "
          "strategy, --backend=threads (ranks sharing it) or nccl)");
ABSL_FLAG(uint64_t, seed, 1337, "seed of the weights, dropout and data");
ABSL_FLAG(std::string, data, "shipped",
          "shipped (the text in models/data/text), random (uniform tokens), a .txt file "
          "(bytes) or a .bin file of uint16 tokens (nanoGPT / llm.c layout)");
ABSL_FLAG(double, dropout, 0.1, "dropout of embeddings, attention and residuals");
ABSL_FLAG(bool, activation_checkpointing, false, "recompute each Block's activations in backward");
ABSL_FLAG(std::string, checkpoint_dir, "", "where to save checkpoints; empty: none");
ABSL_FLAG(int64_t, checkpoint_every, 0, "save every N steps (and at the end); 0: at the end only");
ABSL_FLAG(std::string, resume, "",
          "'latest' (in --checkpoint_dir), a step folder, or a checkpoint directory (its latest "
          "step) to resume; 'auto': --checkpoint_dir's latest checkpoint when it has one, else a "
          "fresh start (for jobs restarted by launch --max_restarts)");
ABSL_FLAG(
    std::string, init_from, "",
    "start from these weights (a checkpoint, or a Hugging Face GPT-2 folder) at step 0 with a "
    "fresh optimizer; the model's configuration comes from them. With --resume (the same "
    "flags again, to continue such a run): only the configuration, --resume loads the weights");
ABSL_FLAG(std::string, tokenizer, "auto",
          "the tokenizer of the data, recorded in checkpoints for sample and checkpoint "
          "export-hf: auto (what //tools:tokenize recorded beside a .bin --data, else "
          "--init_from's), none, gpt2, or a folder with vocab.json + merges.txt");
ABSL_FLAG(double, peak_tflops, 0,
          "dense peak TFLOP/s of one device for the MFU on the step lines (model FLOPs as "
          "nanoGPT's estimate_mfu: 6 N + 12 L C T a token); 0: a known GPU's bf16/fp16 peak "
          "(H100, H200, A100), else no MFU. Over every GPU with --backend=nccl, else one");
ABSL_FLAG(std::string, metrics_out, "", "append one JSON line of metrics per step to this file");
ABSL_FLAG(int64_t, log_every, 10, "print every N steps (and the first and last)");
ABSL_FLAG(std::string, sample_prompt, "\n",
          "the samples' prompt: text (bytes for a byte-level model, else the --tokenizer's "
          "BPE)");
ABSL_FLAG(int64_t, sample_tokens, 100, "new tokens per sample");

namespace mingpt {
namespace {

using tensor::MemoryLedger;

// ---- Evaluation ----

// The mean loss over `batches` batches of the evaluation data (its steps 0 ..
// batches-1: the same rows every time), micro-batch by micro-batch (K of B
// rows each), forward only. The caller sets eval mode and the precision.
double EvalLoss(GPT& model, const data::LmLoader& eval, int64_t batches, int64_t K, int64_t B,
                tensor::Device device) {
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    const data::LmBatch batch = eval.Batch(i);  // (K*B, T)
    const Tensor inputs = batch.inputs.ToQueued(device), targets = batch.targets.ToQueued(device);
    for (int64_t m = 0; m < K; ++m) {
      sum += model.Loss(inputs.Narrow(0, m * B, B), targets.Narrow(0, m * B, B));
    }
  }
  return sum / static_cast<double>(batches * K);
}

// The evaluation source's vocabulary must be the training data's (byte text
// evaluated by a model of GPT-2 tokens gives a loss that means nothing); the
// training data's fits the model's.
absl::Status CheckEvalVocabulary(const data::TokenSource& eval, const data::TokenSource& train) {
  if (eval.vocab_size() == train.vocab_size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--eval_data=", train::EvalFlagsFromCommandLine().data, ": its vocabulary ",
      eval.vocab_size(), " is not the training data's ", train.vocab_size(),
      " (evaluate data tokenized as the training data is)"));
}

// ---- Data parallelism ----

// --init_from's weights for the ranks of this process (threads: all of them;
// gloo / nccl: its one): sources read slice by slice (OpenPretrained), with
// what they hold open (file headers, a sharded checkpoint's reader) freed once
// the last rank has initialized its model from them (FSDP: read its shards)
// instead of held for the whole run.
class SharedInit {
 public:
  SharedInit(PretrainedSources weights, int ranks)
      : source_(std::move(weights.source)), sources_(std::move(weights.sources)), pending_(ranks) {}
  const std::string& source() const { return source_; }
  // Valid until every rank has called Release.
  const nn::NamedInitSources& sources() const { return sources_; }
  // This rank is done with the weights; the last one frees them.
  void Release() {
    absl::MutexLock lock(&mu_);
    if (--pending_ == 0) sources_.clear();
  }

 private:
  const std::string source_;
  nn::NamedInitSources sources_;
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_);
};

// --sample_every's samples during training: one row continuing the prompt,
// printed as text (bytes, or the tokenizer's) or ids.
struct Sampler {
  train::SampleSchedule schedule;
  std::vector<int64_t> prompt;
  std::optional<data::Gpt2Tokenizer> tokenizer;
  bool text = false;
  SamplingOptions options;

  // "sample at step N:\n<prompt and new tokens>\n" from `model` (eval mode,
  // on `device`); the draws depend on the seed and the step only, so every
  // rank of a data-parallel run draws the same.
  absl::StatusOr<std::string> Draw(GPT& model, int64_t step_done, tensor::Device device) const {
    SamplingOptions o = options;
    o.seed = options.seed * 1000003 + static_cast<uint64_t>(step_done);
    absl::StatusOr<std::vector<std::vector<int64_t>>> rows = Generate(model, {prompt}, o, device);
    if (!rows.ok()) return rows.status();
    const std::vector<int64_t>& row = (*rows)[0];  // the prompt, then the new tokens
    return absl::StrCat("sample at step ", step_done, ":\n",
                        text ? DecodeText(row, tokenizer) : absl::StrJoin(row, " "), "\n");
  }
};

// The sampler of the --sample_* flags for a model of `config` whose data's
// tokenizer is `tokenizer_name` ("" for none).
absl::StatusOr<Sampler> MakeSampler(const GptConfig& config, const std::string& tokenizer_name) {
  Sampler s;
  absl::StatusOr<train::SampleSchedule> schedule = train::SampleScheduleFromCommandLine();
  if (!schedule.ok()) return schedule.status();
  s.schedule = *schedule;
  if (s.schedule.every == 0) {
    // A sample's settings without samples: named, not ignored.
    const absl::CommandLineFlag& prompt = absl::GetFlagReflectionHandle(FLAGS_sample_prompt);
    const absl::CommandLineFlag& tokens = absl::GetFlagReflectionHandle(FLAGS_sample_tokens);
    for (const absl::CommandLineFlag* flag : {&prompt, &tokens}) {
      if (!train::OffDefault(*flag)) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag->Name(), " without --sample_every: no sample is drawn"));
    }
    return s;
  }
  s.options.max_new_tokens = absl::GetFlag(FLAGS_sample_tokens);
  if (s.options.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sample_tokens must be >= 1, got ", s.options.max_new_tokens));
  }
  s.options.temperature = 0.8;
  s.options.top_k = 200;
  s.options.seed = absl::GetFlag(FLAGS_seed);
  if (!tokenizer_name.empty()) {
    absl::StatusOr<data::Gpt2Tokenizer> t =
        data::Gpt2Tokenizer::OpenForModel(tokenizer_name, config.vocab_size);
    if (!t.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--sample_every: the tokenizer ",
                                                     tokenizer_name, ": ", t.status().message()));
    }
    s.tokenizer = *std::move(t);
  }
  absl::StatusOr<std::vector<int64_t>> prompt = EncodeText(
      absl::GetFlag(FLAGS_sample_prompt), "--sample_prompt", config.vocab_size, s.tokenizer);
  if (!prompt.ok()) return prompt.status();
  s.prompt = *std::move(prompt);
  s.text = CanDecodeText(config.vocab_size, s.tokenizer);
  return s;
}

// The training loop's settings this binary's flags give, the same for the
// loop in one process and on each rank.
train::TrainingLoopSettings LoopFlags() {
  train::TrainingLoopSettings s;
  s.seed = absl::GetFlag(FLAGS_seed);
  s.steps = absl::GetFlag(FLAGS_steps);
  s.micro_batches = absl::GetFlag(FLAGS_grad_accum_steps);
  s.log_every = absl::GetFlag(FLAGS_log_every);
  s.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  s.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  s.grad_clip = absl::GetFlag(FLAGS_grad_clip);
  s.eval = train::EvalFlagsFromCommandLine();
  return s;
}

// How the training loop runs minGPT on `device` with `trainer`: each batch
// moved there queued (no wait for the previous step's kernels), micro-batch
// m as rows [m*B, (m+1)*B) of the (K*B, T) inputs and targets, the
// evaluation loss over `eval_batches` (with an eval_loader) and samples. What
// it points to must outlive the loop.
train::TrainingLoopParts<data::LmLoader> LoopParts(GPT& model, train::Trainer& trainer,
                                                   data::LmLoader& loader,
                                                   const data::LmLoader* eval_loader,
                                                   const Sampler& sampler, tensor::Device device,
                                                   int64_t B, int64_t K, int64_t eval_batches) {
  train::TrainingLoopParts<data::LmLoader> parts;
  parts.model = &model;
  parts.trainer = &trainer;
  parts.loader = &loader;
  parts.to_device = [device](data::LmBatch& batch) {  // (K*B, T) each
    batch.inputs = batch.inputs.ToQueued(device);
    batch.targets = batch.targets.ToQueued(device);
  };
  parts.forward_backward = [&model, B](const data::LmBatch& batch, int64_t m, double scale) {
    return model.ForwardBackward(batch.inputs.Narrow(0, m * B, B),
                                 batch.targets.Narrow(0, m * B, B), scale);
  };
  if (eval_loader != nullptr) {
    parts.eval_loss = [&model, eval_loader, eval_batches, K, B, device] {
      return EvalLoss(model, *eval_loader, eval_batches, K, B, device);
    };
    parts.eval_config = eval_loader->state().config;
  }
  parts.draw = [&model, &sampler, device](int64_t step_done) {
    return sampler.Draw(model, step_done, device);
  };
  return parts;
}

struct DpSetup {
  GptConfig config;
  train::LossScaling scaling;
  std::shared_ptr<const data::TokenSource> source;
  std::shared_ptr<const data::TokenSource> eval_source;  // null: no evaluation
  const optim::LrSchedule* schedule = nullptr;
  train::MetricsWriter* metrics = nullptr;
  train::DataParallelConfig dp;
  SharedInit* init = nullptr;  // --init_from's weights, else null
  const Sampler* sampler = nullptr;
  std::string init_line;       // "init_from: ..." (rank 0 prints it), or ""
  std::string freeze_line;     // "frozen: ..." (rank 0 prints it), or ""
  std::string resume;          // --resume, auto resolved: "" for a fresh start
  bool auto_fresh = false;     // --resume=auto found no checkpoint
  std::string resume_note;     // why resume is not --resume's (rank 0 says it), or ""
  std::string tokenizer;       // recorded in checkpoints; "" for none
  double peak_flops = 0;       // of the job's devices, for the MFU; 0: none
};

// One rank's training loop (a thread of this process, or this process under
// --backend=gloo); rank 0 logs.
absl::Status TrainRank(const DpSetup& setup, train::RankContext& rank) {
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const int64_t B = absl::GetFlag(FLAGS_batch_size);
  const int64_t K = absl::GetFlag(FLAGS_grad_accum_steps);
  const int64_t T = absl::GetFlag(FLAGS_seq_len);
  const int W = rank.world_size;
  absl::StatusOr<data::LmLoader> loader =
      data::LmLoader::Create(setup.source, {B, rank.rank, W, K}, T);
  if (!loader.ok()) {
    return train::TrainDataFailure(loader.status(), train::EvalFlagsFromCommandLine());
  }
  std::optional<data::LmLoader> eval_loader;  // this rank's rows of the evaluation batches
  if (setup.eval_source) {
    absl::StatusOr<data::LmLoader> l =
        data::LmLoader::Create(setup.eval_source, {B, rank.rank, W, K}, T);
    if (!l.ok())
      return absl::InvalidArgumentError(absl::StrCat(
          train::EvalFlagsFromCommandLine().SourceFlag(), ": ", l.status().message()));
    eval_loader.emplace(*std::move(l));
  }
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> optimizer = train::MakeOptimizer(
      {absl::GetFlag(FLAGS_optimizer), absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_momentum), 0.95,
       absl::GetFlag(FLAGS_weight_decay)});
  if (!optimizer.ok()) return optimizer.status();

  // ---- Model: DDP / ZeRO-1 materialize and broadcast; FSDP shards ----
  GPT model(setup.config);
  // Frozen before the wrapper is built: its buckets and units leave them out.
  absl::StatusOr<std::string> frozen = train::ApplyFreeze(model, train::FreezeFlag());
  if (!frozen.ok()) return frozen.status();
  if (setup.init != nullptr) {  // FSDP reads each rank's shard from it, DDP a whole copy
    absl::Status loaded = nn::InitFromSources(model, setup.init->sources());
    if (!loaded.ok()) return loaded;
  }
  if (absl::GetFlag(FLAGS_activation_checkpointing)) {
    nn::ApplyCheckpointing(model, [](const std::string&, nn::Module& m) {
      return m.class_name() == "Block";
    });
  }
  absl::StatusOr<std::unique_ptr<train::DataParallelModel>> dp =
      train::DataParallelModel::Create(model, rank.pg, setup.dp, std::move(*optimizer), seed);
  if (!dp.ok()) return dp.status();
  if (setup.init != nullptr) {
    nn::ReleaseInitValues(model);
    setup.init->Release();
  }
  optim::Optimizer& opt = (*dp)->optimizer();
  if (rank.logs()) {
    const ParamCount count = CountParameters(setup.config);
    std::printf("model %s: %.2fM parameters (%.2fM without embeddings)\n",
                setup.config.ToString().c_str(), count.total / 1e6, count.non_embedding / 1e6);
    if (!setup.init_line.empty()) std::printf("%s\n", setup.init_line.c_str());
    if (!setup.freeze_line.empty()) std::printf("%s\n", setup.freeze_line.c_str());
    if (!setup.tokenizer.empty()) std::printf("tokenizer: %s\n", setup.tokenizer.c_str());
    if (setup.eval_source) {
      std::printf("%s\n",
                  train::EvalLine(*setup.eval_source, train::EvalFlagsFromCommandLine()).c_str());
    }
    std::printf(
        "data: %s | %d ranks (%s) x %sbatch %lld x %lld tokens | %s | %s | %s | precision %s | "
        "%d threads\n",
        setup.source->Describe().c_str(), W,
        std::string(train::BackendName(setup.dp.backend)).c_str(),
        train::AccumulationPrefix(K).c_str(), static_cast<long long>(B), static_cast<long long>(T),
        (*dp)->Describe().c_str(), opt.name(), setup.schedule->ToString().c_str(),
        setup.dp.mixed_precision.ToString().c_str(), tensor::DefaultThreadPool().num_threads());
    if (setup.scaling.enabled()) std::printf("loss scale: %s\n", setup.scaling.Describe().c_str());
    std::fflush(stdout);
  }

  // ---- Resume, then the steps (train::RunTrainingLoop: rank 0 reports) ----
  train::TrainingLoopSettings settings = LoopFlags();
  settings.rank = rank.rank;
  settings.world_size = W;
  settings.resume = setup.resume;
  settings.auto_fresh = setup.auto_fresh;
  settings.resume_note = setup.resume_note;
  settings.config = setup.config.ToString();
  settings.precision = setup.dp.mixed_precision.ToString();
  settings.tokenizer = setup.tokenizer;
  settings.tokens_per_step = static_cast<double>(K * W * B * T);
  settings.flops_per_step = FlopsPerToken(setup.config, T) * static_cast<double>(K * W * B * T);
  settings.peak_flops = setup.peak_flops;
  settings.summary_note = " (global)";
  settings.device = setup.dp.device;
  settings.ledger = &rank.ledger;
  settings.schedule = setup.schedule;
  settings.metrics = setup.metrics;
  settings.sample_schedule = &setup.sampler->schedule;
  settings.scaling = &setup.scaling;
  return train::RunTrainingLoop(
      settings, LoopParts(model, **dp, *loader, eval_loader ? &*eval_loader : nullptr,
                          *setup.sampler, setup.dp.device, B, K, settings.eval.batches));
}

absl::Status Train() {
  // ---- Configuration ----
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const int64_t B = absl::GetFlag(FLAGS_batch_size);
  const int64_t K = absl::GetFlag(FLAGS_grad_accum_steps);
  const int64_t T = absl::GetFlag(FLAGS_seq_len);
  absl::Status loop_ok = train::CheckLoopFlags(steps, absl::GetFlag(FLAGS_log_every),
                                               absl::GetFlag(FLAGS_checkpoint_every),
                                               absl::GetFlag(FLAGS_checkpoint_dir));
  if (!loop_ok.ok()) return loop_ok;
  // --resume=auto: the folder's latest checkpoint (train::ResolveAutoResume),
  // else a fresh start; a fresh start must not replace an earlier run's
  // checkpoints.
  absl::StatusOr<train::ResumePlan> plan =
      train::PlanResume(absl::GetFlag(FLAGS_resume), absl::GetFlag(FLAGS_checkpoint_dir),
                        train::JobAttemptFromEnvironment());
  if (!plan.ok()) return plan.status();
  const std::string& resume = plan->resume;
  const bool auto_fresh = plan->auto_fresh;  // said by the loop that trains (rank 0)
  if (absl::GetFlag(FLAGS_vocab_size) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab_size=", absl::GetFlag(FLAGS_vocab_size), " must be >= 0 (0: the data's)"));
  }
  absl::Status accum_ok = train::CheckGradAccumSteps(K);
  if (!accum_ok.ok()) return accum_ok;
  absl::Status clip_ok = train::CheckGradClip(absl::GetFlag(FLAGS_grad_clip));
  if (!clip_ok.ok()) return clip_ok;
  // The optimizer's and schedule's flags, checked before any data is read.
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> optimizer = train::MakeOptimizer(
      {absl::GetFlag(FLAGS_optimizer), absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_momentum), 0.95,
       absl::GetFlag(FLAGS_weight_decay)});
  if (!optimizer.ok()) return optimizer.status();
  absl::StatusOr<std::unique_ptr<optim::LrSchedule>> schedule =
      train::MakeLrSchedule(absl::GetFlag(FLAGS_lr_schedule), absl::GetFlag(FLAGS_lr), steps,
                            train::OffDefault(absl::GetFlagReflectionHandle(FLAGS_lr)));
  if (!schedule.ok()) return schedule.status();
  // --init_from: the weights, and the configuration that fits them.
  std::optional<PretrainedSources> pretrained;
  if (const std::string init_from = absl::GetFlag(FLAGS_init_from); !init_from.empty()) {
    // Given at all, even as its default value (--preset=gpt-mini).
    if (absl::GetFlag(FLAGS_preset).has_value() ||
        absl::GetFlag(FLAGS_vocab_size) != 0) {
      return absl::InvalidArgumentError(
          "--preset / --vocab_size with --init_from: the model's configuration comes from the "
          "weights");
    }
    absl::StatusOr<PretrainedSources> read = OpenPretrained(init_from);
    if (!read.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--init_from: ", read.status().message()));
    }
    pretrained = *std::move(read);
  }
  // --init_from with --resume: the run it continues started from those
  // weights; its configuration is theirs, its weights are the checkpoint's.
  const bool init_weights = pretrained && resume.empty();
  const std::string init_line =
      pretrained ? train::InitFromLine(pretrained->source, !init_weights) : "";
  absl::StatusOr<train::DataSources> sources = train::OpenDataSources(
      absl::GetFlag(FLAGS_data), train::EvalFlagsFromCommandLine(), seed,
      pretrained ? pretrained->config.vocab_size : absl::GetFlag(FLAGS_vocab_size));
  if (!sources.ok()) return sources.status();
  const std::shared_ptr<const data::TokenSource>& source = sources->train;
  absl::StatusOr<GptConfig> config =
      pretrained ? pretrained->config : Preset(absl::GetFlag(FLAGS_preset).value_or("gpt-mini"));
  if (!config.ok()) return config.status();
  if (!pretrained) {
    config->vocab_size = absl::GetFlag(FLAGS_vocab_size) > 0 ? absl::GetFlag(FLAGS_vocab_size)
                                                             : source->vocab_size();
  }
  if (config->vocab_size < source->vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        pretrained ? "--init_from: the model's vocabulary " : "--vocab_size=", config->vocab_size,
        " is smaller than the data's vocabulary ", source->vocab_size()));
  }
  if (pretrained) {  // GPT-2's BPE ids are not bytes: refused on byte-level text
    absl::Status fits = train::CheckInitFromData(
        absl::GetFlag(FLAGS_tokenizer), absl::GetFlag(FLAGS_data), absl::GetFlag(FLAGS_init_from),
        pretrained->tokenizer, pretrained->hugging_face, config->vocab_size);
    if (!fits.ok()) return fits;
  }
  config->dropout = static_cast<float>(absl::GetFlag(FLAGS_dropout));
  if (T > config->block_size) {
    return absl::InvalidArgumentError(absl::StrCat("--seq_len=", T, " exceeds the block_size ",
                                                   config->block_size, " of ", config->name));
  }
  absl::Status valid = config->Validate();
  if (!valid.ok()) return valid;
  const absl::StatusOr<std::string> tokenizer =
      train::ResolveTokenizer(absl::GetFlag(FLAGS_tokenizer), absl::GetFlag(FLAGS_data),
                              pretrained ? pretrained->tokenizer : "", config->vocab_size);
  if (!tokenizer.ok()) return tokenizer.status();
  const absl::StatusOr<Sampler> sampler = MakeSampler(*config, *tokenizer);
  if (!sampler.ok()) return sampler.status();
  absl::StatusOr<train::Compute> compute =
      train::ResolveCompute(absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_precision));
  if (!compute.ok()) return compute.status();
  const tensor::Device& device = compute->device;
  const precision::MixedPrecisionPolicy& policy = compute->policy;
  absl::StatusOr<train::LossScaling> scaling =
      train::LossScalingFromCommandLine(policy.NeedsLossScaling());
  if (!scaling.ok()) return scaling.status();
  absl::StatusOr<data::LmLoader> loader = data::LmLoader::Create(source, {B, 0, 1, K}, T);
  if (!loader.ok()) {
    return train::TrainDataFailure(loader.status(), train::EvalFlagsFromCommandLine());
  }
  const std::shared_ptr<const data::TokenSource>& eval_source = sources->eval;
  if (eval_source) {
    absl::Status fits = CheckEvalVocabulary(*eval_source, *source);
    if (!fits.ok()) return fits;
  }
  std::optional<data::LmLoader> eval_loader;
  if (eval_source) {
    absl::StatusOr<data::LmLoader> l = data::LmLoader::Create(eval_source, {B, 0, 1, K}, T);
    if (!l.ok())
      return absl::InvalidArgumentError(absl::StrCat(
          train::EvalFlagsFromCommandLine().SourceFlag(), ": ", l.status().message()));
    eval_loader.emplace(*std::move(l));
  }
  absl::StatusOr<std::unique_ptr<train::MetricsWriter>> metrics =
      train::OpenMetrics(absl::GetFlag(FLAGS_metrics_out));
  if (!metrics.ok()) return metrics.status();
  // --freeze checked on a model with no values (nothing allocated) before any rank starts.
  absl::StatusOr<std::string> freeze_line;
  {
    GPT probe(*config);
    freeze_line = train::ApplyFreeze(probe, train::FreezeFlag());
  }
  if (!freeze_line.ok()) return freeze_line.status();
  train::DataParallelFlags dp_flags = train::DataParallelFlagsFromCommandLine();
  dp_flags.precision = absl::GetFlag(FLAGS_precision);
  dp_flags.device = absl::GetFlag(FLAGS_device);
  if (train::WantsDataParallel(dp_flags)) {
    DpSetup setup{*config, *scaling};
    absl::StatusOr<train::DataParallelConfig> dp =
        train::ConfigureDataParallel(dp_flags, {"Block"});
    if (!dp.ok()) return dp.status();
    if (absl::Status s = (sampler->schedule).CheckApplies(dp->strategy); !s.ok()) return s;
    setup.dp = *std::move(dp);
    setup.config = *config;
    setup.tokenizer = *tokenizer;
    setup.sampler = &*sampler;
    absl::StatusOr<double> peak =
        train::PeakFlops(absl::GetFlag(FLAGS_peak_tflops), setup.dp.device, policy.param_dtype,
                         setup.dp.backend == train::Backend::kNccl ? setup.dp.world_size : 1);
    if (!peak.ok()) return peak.status();
    setup.peak_flops = *peak;
    setup.init_line = init_line;
    setup.freeze_line = *freeze_line;
    setup.resume = resume;
    setup.auto_fresh = auto_fresh;
    setup.resume_note = plan->note;
    std::optional<SharedInit> init;
    if (init_weights) {
      init.emplace(*std::move(pretrained),
                   setup.dp.backend == train::Backend::kThreads ? setup.dp.world_size : 1);
      setup.init = &*init;
    }
    setup.source = source;
    setup.eval_source = eval_source;
    setup.schedule = schedule->get();
    setup.metrics = metrics->get();
    return train::RunDataParallel(
        setup.dp, [&setup](train::RankContext& rank) { return TrainRank(setup, rank); });
  }
  // One process: the data-parallel flags go unused, but a malformed or FSDP-only one is an error.
  absl::Status dp_unused = train::CheckOneProcessFlags(dp_flags, {"Block"});
  if (!dp_unused.ok()) return dp_unused;
  if (absl::Status s = sampler->schedule.CheckApplies(std::nullopt); !s.ok()) return s;

  // ---- Model ----
  MemoryLedger& ledger = MemoryLedger::Process();
  GPT model(*config);
  absl::StatusOr<std::string> frozen = train::ApplyFreeze(model, train::FreezeFlag());
  if (!frozen.ok()) return frozen.status();
  if (init_weights) {
    absl::Status loaded = nn::InitFromSources(model, pretrained->sources);
    if (!loaded.ok()) return loaded;
  }
  model.Materialize(seed, device);  // reads --init_from's weights
  if (init_weights) nn::ReleaseInitValues(model);
  if (pretrained) pretrained->sources.clear();
  const ParamCount count = CountParameters(*config);
  std::printf("model %s: %.2fM parameters (%.2fM without embeddings)\n", config->ToString().c_str(),
              count.total / 1e6, count.non_embedding / 1e6);
  if (pretrained) std::printf("%s\n", init_line.c_str());
  if (!freeze_line->empty()) std::printf("%s\n", freeze_line->c_str());
  if (!tokenizer->empty()) std::printf("tokenizer: %s\n", tokenizer->c_str());
  std::printf("data: %s | %sbatch %lld x %lld tokens | %s | %s | precision %s | %d threads\n",
              source->Describe().c_str(), train::AccumulationPrefix(K).c_str(),
              static_cast<long long>(B), static_cast<long long>(T), (*optimizer)->name(),
              (*schedule)->ToString().c_str(), policy.ToString().c_str(),
              tensor::DefaultThreadPool().num_threads());
  if (eval_source) {
    std::printf("%s\n", train::EvalLine(*eval_source, train::EvalFlagsFromCommandLine()).c_str());
  }
  if (scaling->enabled()) std::printf("loss scale: %s\n", scaling->Describe().c_str());
  if (absl::GetFlag(FLAGS_activation_checkpointing)) {
    for (size_t l = 0; l < model.transformer()->blocks()->size(); ++l) {
      model.transformer()->blocks()->set_checkpointed(l, true);
    }
  }

  // ---- Resume, then the steps (train::RunTrainingLoop) ----
  absl::StatusOr<double> peak =
      train::PeakFlops(absl::GetFlag(FLAGS_peak_tflops), device, policy.param_dtype, 1);
  if (!peak.ok()) return peak.status();
  train::OneProcessModel trainer(model, **optimizer, policy);
  train::TrainingLoopSettings settings = LoopFlags();
  settings.resume = resume;
  settings.auto_fresh = auto_fresh;
  settings.resume_note = plan->note;
  settings.config = config->ToString();
  settings.precision = policy.ToString();
  settings.tokenizer = *tokenizer;
  settings.tokens_per_step = static_cast<double>(K * B * T);
  settings.flops_per_step = FlopsPerToken(*config, T) * static_cast<double>(K * B * T);
  settings.peak_flops = *peak;
  settings.device = device;
  settings.ledger = &ledger;
  settings.schedule = schedule->get();
  settings.metrics = metrics->get();
  settings.sample_schedule = &sampler->schedule;
  settings.scaling = &*scaling;
  absl::Status trained = train::RunTrainingLoop(
      settings, LoopParts(model, trainer, *loader, eval_loader ? &*eval_loader : nullptr,
                          *sampler, device, B, K, settings.eval.batches));
  if (!trained.ok()) return trained;
  std::printf("memory (ledger):\n%s", ledger.Summary().c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace mingpt

int main(int argc, char** argv) {
  train::ParseCommandLineOrExit(
      argc, argv, "Trains minGPT. With no flags: gpt-mini on the shipped text.");
  data::SetProgramPath(argv[0]);
  // A rank that fails before joining its group tells the ranks waiting for it.
  return train::RunTrainMain(mingpt::Train, [](const absl::Status& failure) {
    train::TellPeersOfFailure(train::DataParallelFlagsFromCommandLine(), std::getenv, failure);
  });
}
