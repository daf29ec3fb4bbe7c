// What a rank holds for a sharded checkpoint: FSDP's units and ZeRO-1's
// buckets as layouts (sharded_checkpoint_participant.h).
#include "dist/sharded_checkpoint_participant.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dist/flat_param.h"

namespace dist::sharded {

Participant FromFsdp(FullyShardedModel& fsdp) {
  Participant p;
  p.writer = "fsdp";
  p.strategy = ShardingStrategyName(fsdp.strategy());
  p.writes = fsdp.replica_index() == 0;
  p.file_index = fsdp.shard_group_rank();
  p.num_files = fsdp.shard_group_size();
  p.buffers = fsdp.root().NamedBuffers();
  std::map<std::string, optim::ParamRef> refs;  // units of frozen parameters have none
  for (optim::ParamRef& r : fsdp.ParamRefs()) refs[r.name] = std::move(r);
  for (int i = 0; i < fsdp.num_units(); ++i) {
    const FlatParameter& flat = fsdp.flat_param(i);
    FlatLayout L;
    L.ref = fsdp.param_ref_name(i);
    L.trains = flat.trains();
    for (const FlatParameter::Entry& e : flat.entries()) {
      L.entries.push_back({e.name, e.param->shape, e.offset, e.numel, e.frozen});
    }
    L.shard_begin = flat.shard_begin();
    L.shard_numel = flat.shard_numel();
    L.shard = flat.shard();
    if (L.trains) L.param_ref = refs.at(L.ref);
    p.units.push_back(fsdp.unit_name(i));
    p.layouts.push_back(std::move(L));
  }
  return p;
}

absl::Status CheckFsdpGroup(FullyShardedModel& fsdp, ProcessGroup& pg) {
  if (fsdp.shard_group_size() * fsdp.num_replicas() != pg.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the process group has ", pg.size(), " ranks but the model is sharded ",
                     fsdp.shard_group_size(), " ways with ", fsdp.num_replicas(), " replicas"));
  }
  return absl::OkStatus();
}

Participant FromZero1(Zero1& zero, ProcessGroup& pg) {
  Participant p;
  p.writer = "zero1";
  p.strategy = "ZERO1";
  p.writes = true;
  p.file_index = pg.rank();
  p.num_files = pg.size();
  p.buffers = zero.model().NamedBuffers();
  std::vector<optim::ParamRef> refs = zero.ParamRefs();
  for (int b = 0; b < zero.num_buckets(); ++b) {
    const Zero1::Segment seg = zero.segment(b);
    FlatLayout L;
    L.ref = refs[b].name;
    int64_t offset = 0;
    // Frozen as wrapped: what the optimizer stepped (a flag flipped since
    // does not give a never-stepped parameter state).
    const std::vector<bool> frozen = zero.BucketFrozen(b);
    const auto params = zero.BucketParameters(b);
    for (size_t j = 0; j < params.size(); ++j) {
      const nn::Parameter& param = *params[j].second;
      L.entries.push_back({params[j].first, param.shape, offset, param.numel(), frozen[j]});
      offset += param.numel();
    }
    L.shard_begin = seg.shard_begin - seg.begin;
    L.shard_numel = seg.shard_numel;
    L.shard = zero.master_shard(b);
    L.trains = zero.bucket_trains(b);
    L.param_ref = refs[b];
    p.units.push_back(L.ref);
    p.layouts.push_back(std::move(L));
  }
  return p;
}

absl::Status CheckZero1Group(Zero1& zero, ProcessGroup& pg) {
  for (int b = 0; b < zero.num_buckets(); ++b) {
    const Zero1::Segment seg = zero.segment(b);
    if (seg.shard_numel * pg.size() != seg.padded ||
        seg.shard_begin != seg.begin + seg.shard_numel * pg.rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the process group (rank ", pg.rank(), " of ", pg.size(),
                       ") is not the one this Zero1 shards over (bucket ", b, ": slice [",
                       seg.shard_begin - seg.begin, ", ",
                       seg.shard_begin - seg.begin + seg.shard_numel, ") of ", seg.padded, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace dist::sharded
