// The train binaries' data-parallel flags (data_parallel_flags.h), read into
// DataParallelFlags.
#include "models/common/data_parallel_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, backend, "threads",
          "data-parallel engine: threads (ranks as threads of this process, --world_size of "
          "them), gloo (this process is one rank; start the job with //tools:launch) or nccl "
          "(as gloo, one GPU per rank: --device=cuda, a --config=cuda build)");
ABSL_FLAG(int, world_size, 0,
          "data-parallel ranks; threads: how many (0 = 1); gloo: 0 or WORLD_SIZE (the launcher "
          "sets it); --batch_size is per rank");
ABSL_FLAG(std::string, strategy, "",
          "ddp, zero1, shard_grad_op, full_shard, no_shard, hybrid_shard or hybrid_shard_zero2 "
          "(SHARD_GRAD_OP within the shard groups); empty: full_shard "
          "under data parallelism (--world_size > 1 or --backend=gloo), else the plain "
          "single-process loop");
ABSL_FLAG(std::string, auto_wrap, "transformer",
          "FSDP units: none (the root only), transformer (one unit per block: Block, T5Block) or "
          "size:N (a module with at least N parameters not in a unit below it)");
ABSL_FLAG(double, timeout_s, 300,
          "data parallelism: seconds a collective (and the gloo rendezvous) waits for the "
          "other ranks before it fails naming them");
ABSL_FLAG(std::string, rdzv, "",
          "--backend=gloo: where the ranks meet, redis://host:port or a directory every rank "
          "sees; empty: a directory under $TMPDIR named after MASTER_ADDR and MASTER_PORT, keys "
          "under RUN_ID and RESTART_COUNT (one node)");
ABSL_FLAG(std::string, backward_prefetch, "pre",
          "FSDP: pre (all-gather the next unit before this unit's backward), post (after it) "
          "or none");
ABSL_FLAG(bool, forward_prefetch, false, "FSDP: all-gather the next unit before this one's forward");
ABSL_FLAG(int, max_inflight_all_gathers, 2,
          "FSDP: all-gathers issued and not yet used, the running unit's included (1: no "
          "prefetch)");
ABSL_FLAG(int, prefetch_units, 0,
          "FSDP: each unit all-gathers the next N units (in the order blocks run) before its "
          "forward and the N before it before its backward, from the first step on (FSDP2's "
          "set_modules_to_forward_prefetch / set_modules_to_backward_prefetch); 0: "
          "--forward_prefetch / --backward_prefetch along the order recorded from the step before");
ABSL_FLAG(bool, keep_last_unit, false,
          "FSDP full_shard / hybrid_shard: the last unit stays gathered from its forward to its "
          "backward, which comes first (one all-gather a step fewer, for that unit's memory "
          "through the loss; FSDP2's reshard_after_forward=False on the last block)");
ABSL_FLAG(double, bucket_cap_mb, 25,
          "DDP and ZeRO-1: the largest gradient bucket, in MiB of fp32 gradients; each bucket's "
          "all-reduce (DDP) or reduce-scatter (ZeRO-1) goes out as soon as backward has "
          "finished its gradients, overlapping the rest of backward");
ABSL_FLAG(int, max_inflight_buckets, 2,
          "DDP and ZeRO-1 with bf16/fp16 gradient reduction: the most buckets whose "
          "low-precision copy is in flight at once (another waits for the oldest; 2 = "
          "DeepSpeed's double-buffered overlap_comm); 0: no bound (PyTorch DDP)");
ABSL_FLAG(bool, cpu_offload, false,
          "FSDP with --device=cuda: keep the shards, gradients and optimizer state in host "
          "memory (the GPU holds only the units in use)");
ABSL_FLAG(int, hybrid_shard_group_size, 0,
          "--strategy=hybrid_shard(_zero2): ranks per shard group (replicated across groups); 0 = "
          "LOCAL_WORLD_SIZE (the ranks of a node) with gloo");

namespace train {

DataParallelFlags DataParallelFlagsFromCommandLine() {
  DataParallelFlags f;
  f.backend = absl::GetFlag(FLAGS_backend);
  f.world_size = absl::GetFlag(FLAGS_world_size);
  f.strategy = absl::GetFlag(FLAGS_strategy);
  f.auto_wrap = absl::GetFlag(FLAGS_auto_wrap);
  f.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  f.rdzv = absl::GetFlag(FLAGS_rdzv);
  f.backward_prefetch = absl::GetFlag(FLAGS_backward_prefetch);
  f.forward_prefetch = absl::GetFlag(FLAGS_forward_prefetch);
  f.max_inflight_all_gathers = absl::GetFlag(FLAGS_max_inflight_all_gathers);
  f.prefetch_units = absl::GetFlag(FLAGS_prefetch_units);
  f.keep_last_unit = absl::GetFlag(FLAGS_keep_last_unit);
  f.hybrid_shard_group_size = absl::GetFlag(FLAGS_hybrid_shard_group_size);
  f.cpu_offload = absl::GetFlag(FLAGS_cpu_offload);
  f.bucket_cap_mb = absl::GetFlag(FLAGS_bucket_cap_mb);
  f.max_inflight_buckets = absl::GetFlag(FLAGS_max_inflight_buckets);
  return f;
}

}  // namespace train
