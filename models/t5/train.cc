// Trains T5 with its pretraining objective, span corruption, in one process:
// `./bazelw run //models/t5:train` trains a small T5 ("t5-tiny") on
// span-corrupted bytes of the shipped text with the embedded defaults; every
// flag below changes one thing. Each step logs loss, ms/step, tokens/s
// (encoder + decoder tokens), the MFU when a peak is known (t5::FlopsPerExample
// against --peak_tflops or an H100's / H200's / A100's) and peak memory by category; --metrics_out
// writes the same as JSON lines; --checkpoint_dir and --resume save and continue exactly. The
// structure is minGPT's (models/mingpt/train.cc).
//
// Data: a token source (the shipped text, random tokens, a text file or a
// uint16 .bin file) -> data::SpanCorruptionLoader: each row is a window of
// raw tokens with ~15% of them dropped in spans of mean length 3; the encoder
// sees the rest with one sentinel per span, the decoder predicts each
// sentinel followed by the tokens it replaced. The model's vocabulary is the
// source's plus --num_sentinels sentinels (bytes: 256 + 100).
//
// Data parallelism (models/common/data_parallel.h), flags as minGPT's:
// --strategy=ddp|zero1|shard_grad_op|full_shard|no_shard
// --auto_wrap=none|transformer|size:N with --backend=threads --world_size=N or
// --backend=gloo under //tools:launch. The transformer policy makes every
// T5Block (encoder and decoder) an FSDP unit; the shared embedding
// (shared.weight: both stacks' lookups and the tied lm_head) always stays in
// the root unit, which FSDP keeps gathered from the root's forward to its
// backward; a policy that would move it out (a small size:N) is refused.
// --batch_size is per rank (global batch N * batch_size examples; times
// --grad_accum_steps micro-batches).
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
#include "absl/strings/str_join.h"
#include "models/common/checkpoint_convert.h"
#include "models/common/command_line.h"
#include "models/common/data_parallel.h"
#include "models/common/data_parallel_flags.h"
#include "models/common/eval_flags.h"
#include "models/common/failure_notice.h"
#include "models/common/freeze_flags.h"
#include "models/common/hf_folder.h"
#include "models/common/loss_scaling.h"
#include "models/common/loss_scaling_flags.h"
#include "models/common/mfu.h"
#include "models/common/one_process_step.h"
#include "models/common/sample_flags.h"
#include "models/common/train_setup.h"
#include "models/common/train_support.h"
#include "models/common/training_loop.h"
#include "models/data/byte_text.h"
#include "models/data/random_tokens.h"
#include "models/data/runfiles.h"
#include "models/data/span_corruption.h"
#include "models/data/token_file.h"
#include "models/t5/config.h"
#include "models/t5/model.h"
#include "models/t5/pretrained.h"
#include "models/t5/train_report.h"
#include "nn/checkpoint.h"
#include "nn/state_dict.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "precision/policy.h"
#include "tensor/memory_ledger.h"

// Optional, so that --init_from can refuse it given at all (even as t5-tiny).
ABSL_FLAG(std::optional<std::string>, preset, std::nullopt,
          "model preset (default t5-tiny): t5-tiny (this binary's: d_model 128, 4 heads of "
          "32, d_ff 512, 2+2 layers), t5-small, t5-base, t5-large, t5-3b, t5-11b; the "
          "vocabulary is always the data's plus the sentinels");
ABSL_FLAG(bool, v1_1, false, "T5 v1.1 form of the preset: gated-GELU feed-forward, untied lm_head");
ABSL_FLAG(int64_t, vocab_size, 0,
          "vocabulary of random tokens and .bin files (before sentinels); 0 = 50257 (GPT-2's); "
          "byte text is always 256");
ABSL_FLAG(int64_t, steps, 300, "optimizer steps to run (in all, counting resumed ones)");
ABSL_FLAG(int64_t, batch_size, 16, "examples per micro-batch (per rank under data parallelism)");
ABSL_FLAG(int64_t, grad_accum_steps, 1,
          "micro-batches of --batch_size whose gradients add up to one optimizer step (gradient "
          "accumulation): a step trains on grad_accum_steps x world size x batch_size examples");
ABSL_FLAG(int64_t, encoder_length, 128,
          "encoder tokens per example (S); the raw window is the longest whose corrupted form "
          "fills S, the decoder length is what its targets need");
ABSL_FLAG(int64_t, num_sentinels, 100, "sentinel ids added above the source vocabulary");
ABSL_FLAG(double, noise_density, 0.15, "fraction of raw tokens dropped");
ABSL_FLAG(double, mean_noise_span_length, 3.0, "mean length of a dropped span");
ABSL_FLAG(int64_t, eos_id, -1,
          "an id of the data's vocabulary appended to every encoder input and target (T5's "
          "</s>: 1 in its SentencePiece vocabulary); -1: none");
ABSL_FLAG(double, lr, 3e-3, "learning rate (the peak, with --lr_schedule=cosine)");
ABSL_FLAG(std::string, lr_schedule, "cosine",
          "cosine (10% warmup, decay to lr/10 at --steps; it depends on --steps, so resuming "
          "with another --steps changes it), constant, or a spec such as "
          "cosine:max_lr=1e-3,min_lr=1e-4,warmup_steps=100,total_steps=2000 (a key left out: "
          "max_lr or lr is --lr, total_steps is --steps, min_lr and warmup_steps are 0; such a "
          "spec depends on --steps too)");
ABSL_FLAG(std::string, optimizer, "adamw", "adamw or sgd");
ABSL_FLAG(std::optional<double>, momentum, std::nullopt,
          "SGD momentum (unset: 0.9); an error with --optimizer=adamw");
ABSL_FLAG(double, weight_decay, 0.01,
          "weight decay (Linear weights only: not the embedding, not the RMSNorm weights)");
ABSL_FLAG(double, grad_clip, 1.0, "clip the global gradient norm to this; 0 disables");
ABSL_FLAG(std::string, precision, "fp32",
          "fp32, bf16 or fp16 (mixed: fp32 masters and grads; fp16 on a GPU, with loss scaling)");
ABSL_FLAG(std::string, device, "cpu",
          "cpu or cuda[:N] (a --config=cuda build and a GPU; with data parallelism: "
          "--backend=threads, ranks sharing it, or nccl)");
ABSL_FLAG(uint64_t, seed, 1337, "seed of the weights, dropout, data windows and noise masks");
ABSL_FLAG(std::string, data, "shipped",
          "shipped (the text in models/data/text), random (uniform tokens), a .txt file "
          "(bytes) or a .bin file of uint16 tokens (nanoGPT / llm.c layout)");
ABSL_FLAG(double, dropout, 0.1,
          "dropout_rate: embeddings, attention probabilities, sub-layer outputs, FFN hidden");
ABSL_FLAG(bool, activation_checkpointing, false,
          "recompute each T5Block's activations (encoder and decoder) in backward");
ABSL_FLAG(std::string, checkpoint_dir, "", "where to save checkpoints; empty: none");
ABSL_FLAG(int64_t, checkpoint_every, 0, "save every N steps (and at the end); 0: at the end only");
ABSL_FLAG(std::string, resume, "",
          "'latest' (in --checkpoint_dir), a step folder, or a checkpoint directory (its latest "
          "step) to resume; 'auto': --checkpoint_dir's latest checkpoint when it has one, else a "
          "fresh start (for jobs restarted by launch --max_restarts)");
ABSL_FLAG(std::string, init_from, "",
          "a checkpoint of this binary (a step folder, or a --checkpoint_dir: its latest step; "
          "single-process or sharded) or a Hugging Face T5 folder (config.json and "
          "model.safetensors: t5-small .. t5-11b, google/t5-v1_1-*): training starts at step 0 "
          "with a fresh optimizer from its weights, and the model's configuration is theirs "
          "(--preset and --v1_1 are refused with it; --dropout still applies); with --resume "
          "(the same flags again, to continue such a run) only the configuration. Its vocabulary "
          "may be larger than the data's ids + sentinels (T5's 32128 rows for 32000 "
          "SentencePiece ids and 100 sentinels: --data=ids.bin --vocab_size=32000)");
ABSL_FLAG(double, peak_tflops, 0,
          "dense peak TFLOP/s of one device for the MFU on the step lines (model FLOPs of the "
          "encoder and decoder tokens, t5::FlopsPerExample); 0: a known GPU's bf16/fp16 peak "
          "(H100, H200, A100), else no MFU. Over every GPU with --backend=nccl, else one");
ABSL_FLAG(std::string, metrics_out, "", "append one JSON line of metrics per step to this file");
ABSL_FLAG(int64_t, log_every, 10, "print every N steps (and the first and last)");

namespace t5 {
namespace {

using tensor::MemoryLedger;

absl::StatusOr<T5Config> MakeConfig(const std::string& name) {
  absl::StatusOr<T5Config> c = Preset(name);
  if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat("--preset: ", c.status().message()));
  return c;
}

// Prefixes an error with `context` (e.g. the flags it came from), keeping its code.
absl::Status WithContext(const absl::Status& s, const std::string& context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

// Byte text (not --data=random): the start-up lines and samples show it decoded.
bool ShowsText(const data::TokenSource& source) {
  return source.vocab_size() == data::kByteVocabSize && absl::GetFlag(FLAGS_data) != "random";
}

// ---- Data parallelism ----

// The batch's tensors on the device the model computes on (on a GPU queued on
// this thread's stream: no wait for the previous step's kernels).
void MoveBatch(data::Seq2SeqBatch& batch, tensor::Device device) {
  batch.encoder_inputs = batch.encoder_inputs.ToQueued(device);
  if (batch.encoder_mask.defined()) batch.encoder_mask = batch.encoder_mask.ToQueued(device);
  batch.decoder_inputs = batch.decoder_inputs.ToQueued(device);
  batch.decoder_targets = batch.decoder_targets.ToQueued(device);
}

// Rows [m*B, (m+1)*B) of a batch of K micro-batches: micro-batch m (views).
data::Seq2SeqBatch MicroBatch(const data::Seq2SeqBatch& batch, int64_t m, int64_t B) {
  data::Seq2SeqBatch micro;
  micro.step = batch.step;
  micro.encoder_inputs = batch.encoder_inputs.Narrow(0, m * B, B);
  if (batch.encoder_mask.defined()) micro.encoder_mask = batch.encoder_mask.Narrow(0, m * B, B);
  micro.decoder_inputs = batch.decoder_inputs.Narrow(0, m * B, B);
  micro.decoder_targets = batch.decoder_targets.Narrow(0, m * B, B);
  return micro;
}

// The mean loss over `batches` batches of the evaluation data (its steps 0 ..
// batches-1: the same rows every time), micro-batch by micro-batch (K of B
// rows each), forward only. The caller sets eval mode and the precision.
double EvalLoss(T5Model& model, const data::SpanCorruptionLoader& eval, int64_t batches, int64_t K,
                int64_t B, tensor::Device device) {
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    data::Seq2SeqBatch batch = eval.Batch(i);  // (K*B, ...)
    MoveBatch(batch, device);
    for (int64_t m = 0; m < K; ++m) {
      const data::Seq2SeqBatch micro = MicroBatch(batch, m, B);
      sum += model.Loss(micro.encoder_inputs, micro.encoder_mask, micro.decoder_inputs,
                        micro.decoder_targets);
    }
  }
  return sum / static_cast<double>(batches * K);
}

// --init_from: a checkpoint's or a Hugging Face folder's weights as sources
// read slice by slice (so an FSDP rank reads only its shard), their
// configuration and what they came from.
using Init = PretrainedSources;

absl::StatusOr<Init> OpenInit(const std::string& flag) {
  absl::StatusOr<PretrainedSources> opened = OpenPretrained(flag);
  if (!opened.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--init_from=", flag, ": ", opened.status().message()));
  }
  return opened;
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

// How the training loop runs T5 on `device` with `trainer`: each batch moved
// there, micro-batch m as rows [m*B, (m+1)*B) of the encoder (K*B, S) and
// decoder (K*B, T_dec) tensors, the evaluation loss over `eval_batches` (with
// an eval_loader) and samples. What it points to must outlive the loop.
train::TrainingLoopParts<data::SpanCorruptionLoader> LoopParts(
    T5Model& model, train::Trainer& trainer, data::SpanCorruptionLoader& loader,
    const data::SpanCorruptionLoader* eval_loader, const Sampler& sampler, tensor::Device device,
    int64_t B, int64_t K, int64_t eval_batches) {
  train::TrainingLoopParts<data::SpanCorruptionLoader> parts;
  parts.model = &model;
  parts.trainer = &trainer;
  parts.loader = &loader;
  parts.to_device = [device](data::Seq2SeqBatch& batch) { MoveBatch(batch, device); };
  parts.forward_backward = [&model, B](const data::Seq2SeqBatch& batch, int64_t m,
                                       double scale) {
    const data::Seq2SeqBatch micro = MicroBatch(batch, m, B);
    return model.ForwardBackward(micro.encoder_inputs, micro.encoder_mask, micro.decoder_inputs,
                                 micro.decoder_targets, scale);
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
  T5Config config;
  train::LossScaling scaling;
  std::shared_ptr<const data::TokenSource> source;
  std::shared_ptr<const data::TokenSource> eval_source;  // null: no evaluation
  data::SpanCorruptionOptions span;
  const optim::LrSchedule* schedule = nullptr;
  train::MetricsWriter* metrics = nullptr;
  train::DataParallelConfig dp;
  const Init* init = nullptr;  // --init_from's weights, else null
  std::string init_line;       // "init_from: ..." (rank 0 prints it), or ""
  std::string freeze_line;     // "frozen: ..." (rank 0 prints it), or ""
  std::string resume;          // --resume, auto resolved: "" for a fresh start
  bool auto_fresh = false;     // --resume=auto found no checkpoint
  std::string resume_note;     // why resume is not --resume's (rank 0 says it), or ""
  std::string tokenizer;       // the data's, recorded in checkpoints; "" for none
  double peak_flops = 0;       // of the job's devices, for the MFU; 0: none
  const Sampler* sampler = nullptr;
};

// One rank's training loop (a thread of this process, or this process under
// --backend=gloo); rank 0 logs.
absl::Status TrainRank(const DpSetup& setup, train::RankContext& rank) {
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const int64_t B = absl::GetFlag(FLAGS_batch_size);
  const int64_t K = absl::GetFlag(FLAGS_grad_accum_steps);
  const int W = rank.world_size;
  absl::StatusOr<data::SpanCorruptionLoader> loader =
      data::SpanCorruptionLoader::Create(setup.source, {B, rank.rank, W, K}, setup.span);
  if (!loader.ok()) {
    return train::TrainDataFailure(loader.status(), train::EvalFlagsFromCommandLine());
  }
  std::optional<data::SpanCorruptionLoader> eval_loader;  // this rank's rows of the eval batches
  if (setup.eval_source) {
    absl::StatusOr<data::SpanCorruptionLoader> l =
        data::SpanCorruptionLoader::Create(setup.eval_source, {B, rank.rank, W, K}, setup.span);
    if (!l.ok()) return WithContext(l.status(), train::EvalFlagsFromCommandLine().SourceFlag());
    eval_loader.emplace(*std::move(l));
  }
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> optimizer = train::MakeOptimizer(
      {absl::GetFlag(FLAGS_optimizer), absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_momentum),
       0.999, absl::GetFlag(FLAGS_weight_decay)});
  if (!optimizer.ok()) return optimizer.status();

  // ---- Model: DDP / ZeRO-1 materialize and broadcast; FSDP shards (the
  // shared embedding in the root unit) ----
  T5Model model(setup.config);
  // Frozen before the wrapper is built: its buckets and units leave them out.
  absl::StatusOr<std::string> frozen = train::ApplyFreeze(model, train::FreezeFlag());
  if (!frozen.ok()) return frozen.status();
  if (setup.init != nullptr) {  // FSDP reads each rank's shard from it, DDP a whole copy
    absl::Status loaded = nn::InitFromSources(model, setup.init->sources);
    if (!loaded.ok()) return WithContext(loaded, "--init_from");
  }
  if (absl::GetFlag(FLAGS_activation_checkpointing)) {
    nn::ApplyCheckpointing(model, [](const std::string&, nn::Module& m) {
      return m.class_name() == "T5Block";
    });
  }
  absl::StatusOr<std::unique_ptr<train::DataParallelModel>> dp = train::DataParallelModel::Create(
      model, rank.pg, setup.dp, std::move(*optimizer), seed, {"shared.weight"});
  if (!dp.ok()) return dp.status();
  if (setup.init != nullptr) nn::ReleaseInitValues(model);
  optim::Optimizer& opt = (*dp)->optimizer();
  const int64_t tokens_per_step =
      K * W * B * (setup.span.encoder_length + loader->corruptor().decoder_length());
  if (rank.logs()) {
    PrintStartup(
        setup.config, *setup.source, setup.span, *loader,
        absl::StrCat(W, " ranks (", train::BackendName(setup.dp.backend), ") x ",
                     train::AccumulationPrefix(K)),
        B, tokens_per_step,
        absl::StrCat((*dp)->Describe(), " | ", opt.name(), " | ", setup.schedule->ToString(),
                     " | precision ", setup.dp.mixed_precision.ToString()),
        ShowsText(*setup.source));
    if (!setup.init_line.empty()) std::printf("%s\n", setup.init_line.c_str());
    if (!setup.freeze_line.empty()) std::printf("%s\n", setup.freeze_line.c_str());
    if (setup.eval_source) {
      std::printf("%s\n",
                  train::EvalLine(*setup.eval_source, train::EvalFlagsFromCommandLine()).c_str());
    }
  }

  // ---- Resume, then the steps (train::RunTrainingLoop: rank 0 reports) ----
  train::TrainingLoopSettings settings = LoopFlags();
  settings.rank = rank.rank;
  settings.world_size = W;
  settings.resume = setup.resume;
  settings.auto_fresh = setup.auto_fresh;
  settings.resume_note = setup.resume_note;
  settings.tokenizer = setup.tokenizer;
  settings.config = setup.config.ToString();
  settings.precision = setup.dp.mixed_precision.ToString();
  settings.tokens_per_step = static_cast<double>(tokens_per_step);
  settings.flops_per_step =
      FlopsPerExample(setup.config, setup.span.encoder_length,
                      loader->corruptor().decoder_length()) *
      static_cast<double>(K * W * B);
  settings.peak_flops = setup.peak_flops;
  settings.summary_note = " (global, encoder + decoder)";
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
  const int64_t S = absl::GetFlag(FLAGS_encoder_length);
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
  absl::Status clip_ok = train::CheckGradClip(absl::GetFlag(FLAGS_grad_clip));
  if (!clip_ok.ok()) return clip_ok;
  // The optimizer's and schedule's flags, checked before any data is read.
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> optimizer = train::MakeOptimizer(
      {absl::GetFlag(FLAGS_optimizer), absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_momentum),
       0.999, absl::GetFlag(FLAGS_weight_decay)});
  if (!optimizer.ok()) return optimizer.status();
  absl::StatusOr<std::unique_ptr<optim::LrSchedule>> schedule =
      train::MakeLrSchedule(absl::GetFlag(FLAGS_lr_schedule), absl::GetFlag(FLAGS_lr), steps,
                            train::OffDefault(absl::GetFlagReflectionHandle(FLAGS_lr)));
  if (!schedule.ok()) return schedule.status();
  const int64_t K = absl::GetFlag(FLAGS_grad_accum_steps);
  absl::Status accum_ok = train::CheckGradAccumSteps(K);
  if (!accum_ok.ok()) return accum_ok;
  if (B < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--batch_size=", B, " must be >= 1"));
  }
  if (S < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--encoder_length=", S, " must be >= 1"));
  }
  if (absl::GetFlag(FLAGS_vocab_size) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab_size=", absl::GetFlag(FLAGS_vocab_size), " must be >= 0"));
  }
  const double dropout = absl::GetFlag(FLAGS_dropout);
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("--dropout=", dropout, " is not in [0, 1)"));
  }
  absl::StatusOr<T5Config> config = MakeConfig(absl::GetFlag(FLAGS_preset).value_or("t5-tiny"));
  if (!config.ok()) return config.status();
  if (absl::GetFlag(FLAGS_v1_1)) *config = AsV1_1(*config);
  // --init_from: the weights, and the configuration that fits them.
  std::optional<Init> init;
  if (const std::string init_from = absl::GetFlag(FLAGS_init_from); !init_from.empty()) {
    // Given at all, even as its default value (--preset=t5-tiny).
    if (absl::GetFlag(FLAGS_preset).has_value() ||
        absl::GetFlag(FLAGS_v1_1)) {
      return absl::InvalidArgumentError(
          "--preset / --v1_1 with --init_from: the model's configuration comes from its weights");
    }
    absl::StatusOr<Init> opened = OpenInit(init_from);
    if (!opened.ok()) return opened.status();
    init = *std::move(opened);
    *config = init->config;
  }
  // --init_from with --resume: the run it continues started from those
  // weights; its configuration is theirs, its weights are the checkpoint's.
  const bool init_weights = init && resume.empty();
  const std::string init_line = init ? train::InitFromLine(init->source, !init_weights) : "";
  absl::StatusOr<train::DataSources> sources =
      train::OpenDataSources(absl::GetFlag(FLAGS_data), train::EvalFlagsFromCommandLine(), seed,
                             absl::GetFlag(FLAGS_vocab_size));
  if (!sources.ok()) return sources.status();
  const std::shared_ptr<const data::TokenSource>& source = sources->train;
  // The data's tokenizer as tools/spm_tokenize.py records it beside a .bin
  // ("sentencepiece:<model>"), recorded in checkpoints so that checkpoint
  // export-hf writes it beside the weights; "" for none.
  const absl::StatusOr<std::optional<std::string>> recorded =
      train::RecordedTokenizer(absl::GetFlag(FLAGS_data));
  if (!recorded.ok()) return recorded.status();  // (OpenDataSources read it already)
  const std::string data_tokenizer = recorded->value_or("");
  const int64_t source_vocab = source->vocab_size();
  if (absl::GetFlag(FLAGS_vocab_size) > 0 && absl::GetFlag(FLAGS_vocab_size) != source_vocab) {
    // Sentinels are numbered right above the data's ids, so the vocabulary of
    // byte text is 256 (+ sentinels), not a padded size.
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab_size=", absl::GetFlag(FLAGS_vocab_size), " does not apply to ",
                     source->Describe(), " (vocabulary ", source_vocab,
                     "); it sets the vocabulary of random tokens and .bin files"));
  }
  data::SpanCorruptionOptions span;
  span.encoder_length = S;
  span.noise_density = absl::GetFlag(FLAGS_noise_density);
  span.mean_noise_span_length = absl::GetFlag(FLAGS_mean_noise_span_length);
  span.eos_id = absl::GetFlag(FLAGS_eos_id);
  span.num_sentinels = absl::GetFlag(FLAGS_num_sentinels);
  span.seed = seed;
  absl::StatusOr<data::SpanCorruptionLoader> loader =
      data::SpanCorruptionLoader::Create(source, {B, 0, 1, K}, span);
  if (!loader.ok()) {
    return WithContext(
        train::TrainDataFailure(loader.status(), train::EvalFlagsFromCommandLine()),
        absl::StrCat("--encoder_length=", S, " --num_sentinels=", span.num_sentinels,
                     " --noise_density=", span.noise_density,
                     " --mean_noise_span_length=", span.mean_noise_span_length,
                     " --eos_id=", span.eos_id, " --data=", absl::GetFlag(FLAGS_data)));
  }
  const std::shared_ptr<const data::TokenSource>& eval_source = sources->eval;
  std::optional<data::SpanCorruptionLoader> eval_loader;
  if (eval_source) {
    if (eval_source->vocab_size() != source_vocab) {  // the sentinels sit right above it
      return absl::InvalidArgumentError(
          absl::StrCat("--eval_data=", train::EvalFlagsFromCommandLine().data, ": its vocabulary ",
                       eval_source->vocab_size(), " is not the training data's ", source_vocab));
    }
    absl::StatusOr<data::SpanCorruptionLoader> l =
        data::SpanCorruptionLoader::Create(eval_source, {B, 0, 1, K}, span);
    if (!l.ok()) return WithContext(l.status(), train::EvalFlagsFromCommandLine().SourceFlag());
    eval_loader.emplace(*std::move(l));
  }
  absl::StatusOr<train::SampleSchedule> sample_schedule = train::SampleScheduleFromCommandLine();
  if (!sample_schedule.ok()) return sample_schedule.status();
  absl::StatusOr<Sampler> sampler = MakeSampler(source, span, *sample_schedule, ShowsText(*source));
  if (!sampler.ok()) return sampler.status();
  // A checkpoint's rows are its data's ids and sentinels.
  if (init) {
    absl::Status same = CheckSameVocabulary(*init, source_vocab, span.num_sentinels);
    if (!same.ok()) {
      return WithContext(same, absl::StrCat("--init_from=", absl::GetFlag(FLAGS_init_from)));
    }
  }
  // The model's vocabulary: the source's plus the sentinels, which the loader
  // numbers right above the source's ids; --init_from's may be padded beyond.
  if (init && config->vocab_size < loader->vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--init_from: the model's vocabulary ", config->vocab_size, " is smaller than the data's ",
        loader->vocab_size(), " (", source_vocab, " ids + ", span.num_sentinels,
        " sentinels: --data, --vocab_size and --num_sentinels must be the weights' run's)"));
  }
  if (init && config->vocab_size > loader->vocab_size()) {
    std::printf(
        "vocabulary: %lld rows, of which the data's %lld ids and %lld sentinels (ids "
        "%lld..%lld) use the first %lld\n",
        static_cast<long long>(config->vocab_size), static_cast<long long>(source_vocab),
        static_cast<long long>(span.num_sentinels), static_cast<long long>(source_vocab),
        static_cast<long long>(loader->vocab_size() - 1),
        static_cast<long long>(loader->vocab_size()));
  }
  if (!init) config->vocab_size = loader->vocab_size();
  config->dropout_rate = static_cast<float>(dropout);
  absl::Status valid = config->Validate();
  if (!valid.ok()) return WithContext(valid, "--preset");
  absl::StatusOr<train::Compute> compute =
      train::ResolveCompute(absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_precision));
  if (!compute.ok()) return compute.status();
  const tensor::Device& device = compute->device;
  const precision::MixedPrecisionPolicy& policy = compute->policy;
  absl::StatusOr<train::LossScaling> scaling =
      train::LossScalingFromCommandLine(policy.NeedsLossScaling());
  if (!scaling.ok()) return scaling.status();
  absl::StatusOr<std::unique_ptr<train::MetricsWriter>> metrics =
      train::OpenMetrics(absl::GetFlag(FLAGS_metrics_out));
  if (!metrics.ok()) return metrics.status();

  // --freeze checked on a model with no values (nothing allocated) before any rank starts.
  absl::StatusOr<std::string> freeze_line;
  {
    T5Model probe(*config);
    freeze_line = train::ApplyFreeze(probe, train::FreezeFlag());
  }
  if (!freeze_line.ok()) return freeze_line.status();
  train::DataParallelFlags dp_flags = train::DataParallelFlagsFromCommandLine();
  dp_flags.precision = absl::GetFlag(FLAGS_precision);
  dp_flags.device = absl::GetFlag(FLAGS_device);
  if (train::WantsDataParallel(dp_flags)) {
    DpSetup setup{*config, *scaling};
    absl::StatusOr<train::DataParallelConfig> dp =
        train::ConfigureDataParallel(dp_flags, {"T5Block"});
    if (!dp.ok()) return dp.status();
    if (absl::Status s = (*sample_schedule).CheckApplies(dp->strategy); !s.ok()) return s;
    setup.dp = *std::move(dp);
    setup.config = *config;
    setup.source = source;
    setup.tokenizer = data_tokenizer;
    setup.eval_source = eval_source;
    setup.span = span;
    setup.schedule = schedule->get();
    setup.metrics = metrics->get();
    setup.init = init_weights ? &*init : nullptr;
    setup.init_line = init_line;
    setup.freeze_line = *freeze_line;
    setup.resume = resume;
    setup.auto_fresh = auto_fresh;
    setup.resume_note = plan->note;
    setup.sampler = &*sampler;
    absl::StatusOr<double> peak =
        train::PeakFlops(absl::GetFlag(FLAGS_peak_tflops), setup.dp.device, policy.param_dtype,
                         setup.dp.backend == train::Backend::kNccl ? setup.dp.world_size : 1);
    if (!peak.ok()) return peak.status();
    setup.peak_flops = *peak;
    return train::RunDataParallel(
        setup.dp, [&setup](train::RankContext& rank) { return TrainRank(setup, rank); });
  }
  // One process: the data-parallel flags go unused, but a malformed or FSDP-only one is an error.
  absl::Status dp_unused = train::CheckOneProcessFlags(dp_flags, {"T5Block"});
  if (!dp_unused.ok()) return dp_unused;
  if (absl::Status s = sample_schedule->CheckApplies(std::nullopt); !s.ok()) return s;

  absl::StatusOr<double> peak =
      train::PeakFlops(absl::GetFlag(FLAGS_peak_tflops), device, policy.param_dtype, 1);
  if (!peak.ok()) return peak.status();

  // ---- Model ----
  MemoryLedger& ledger = MemoryLedger::Process();
  T5Model model(*config);
  absl::StatusOr<std::string> frozen = train::ApplyFreeze(model, train::FreezeFlag());
  if (!frozen.ok()) return frozen.status();
  if (init_weights) {
    absl::Status loaded = nn::InitFromSources(model, init->sources);
    if (!loaded.ok()) return WithContext(loaded, "--init_from");
  }
  model.Materialize(seed, device);  // reads --init_from's weights
  if (init_weights) nn::ReleaseInitValues(model);
  if (init) init->sources.clear();
  // Tokens a step processes: every encoder and decoder position (the encoder
  // input is full; decoder rows all have the same length).
  const int64_t tokens_per_step = K * B * (S + loader->corruptor().decoder_length());
  PrintStartup(*config, *source, span, *loader, train::AccumulationPrefix(K), B, tokens_per_step,
               absl::StrCat((*optimizer)->name(), " | ", (*schedule)->ToString(), " | precision ",
                            policy.ToString()),
               ShowsText(*source));
  if (init) std::printf("%s\n", init_line.c_str());
  if (!freeze_line->empty()) std::printf("%s\n", freeze_line->c_str());
  if (eval_source) {
    std::printf("%s\n", train::EvalLine(*eval_source, train::EvalFlagsFromCommandLine()).c_str());
  }
  if (absl::GetFlag(FLAGS_activation_checkpointing)) {
    for (T5Stack* stack : {model.encoder(), model.decoder()}) {
      for (size_t l = 0; l < stack->blocks()->size(); ++l) {
        stack->blocks()->set_checkpointed(l, true);
      }
    }
  }

  // ---- Resume, then the steps (train::RunTrainingLoop) ----
  train::OneProcessModel trainer(model, **optimizer, policy);
  train::TrainingLoopSettings settings = LoopFlags();
  settings.resume = resume;
  settings.auto_fresh = auto_fresh;
  settings.resume_note = plan->note;
  settings.tokenizer = data_tokenizer;
  settings.config = config->ToString();
  settings.precision = policy.ToString();
  settings.tokens_per_step = static_cast<double>(tokens_per_step);
  settings.flops_per_step =
      FlopsPerExample(*config, S, loader->corruptor().decoder_length()) *
      static_cast<double>(K * B);
  settings.peak_flops = *peak;
  settings.summary_note = " (encoder + decoder)";
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
}  // namespace t5

int main(int argc, char** argv) {
  train::ParseCommandLineOrExit(argc, argv,
      "Trains T5 on span corruption. With no flags: t5-tiny on the shipped text.");
  data::SetProgramPath(argv[0]);
  // A rank that fails before joining its group tells the ranks waiting for it.
  return train::RunTrainMain(t5::Train, [](const absl::Status& failure) {
    train::TellPeersOfFailure(train::DataParallelFlagsFromCommandLine(), std::getenv, failure);
  });
}
