// Whole parameters of a sharded checkpoint on one process (see
// sharded_checkpoint_offline.h).
#include "dist/sharded_checkpoint_offline.h"

#include "absl/status/statusor.h"
#include "dist/sharded_checkpoint_folder.h"
#include "dist/sharded_checkpoint_index.h"
#include "dist/sharded_checkpoint_reader.h"

namespace dist {

absl::Status ForEachWholeParameter(const std::string& dir_in, bool with_optimizer_state,
                                   const std::function<absl::Status(const WholeParameter&)>& fn) {
  const std::string dir = sharded::StripTrailingSlashes(dir_in);
  absl::StatusOr<sharded::Index> x = sharded::ReadIndex(dir);
  if (!x.ok()) return x.status();
  sharded::SliceReader reader(dir, *x);
  for (const sharded::ParamRec& r : x->params) {
    WholeParameter p;
    p.name = r.name;
    p.value = tensor::Tensor::Empty(r.shape);  // f32 (ValidateIndex: numel == shape's)
    absl::Status s = reader.ReadRange(r.value, 0, r.numel, p.value.Reshape({r.numel}));
    if (!s.ok()) return s;
    if (with_optimizer_state && r.has_state) {
      p.has_state = true;
      p.step = r.step;
      for (const std::string& key : x->buffers) {
        tensor::Tensor b = tensor::Tensor::Empty(r.shape);
        s = reader.ReadRange(r.state.at(key), 0, r.numel, b.Reshape({r.numel}));
        if (!s.ok()) return s;
        p.buffers.push_back(std::move(b));
      }
    }
    s = fn(p);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace dist
