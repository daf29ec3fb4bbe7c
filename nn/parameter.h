// Parameter: a named trainable tensor with its fp32 gradient and the recipe
// that initializes it.
//
// The init recipe is deterministic per element: element i of a parameter is
// drawn from Philox counter i under a key made of the model seed and the
// parameter's full name. So any slice of any parameter can be materialized on
// its own, which is how FSDP initializes a shard without ever holding the full
// weights (sharded initialization).
#ifndef NN_PARAMETER_H_
#define NN_PARAMETER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "tensor/tensor.h"

namespace nn {

// Where a parameter's loaded initial values come from (InitSpec::From): any
// range of its elements, flattened, on request, so that FSDP's sharded
// initialization reads only a rank's shard.
class InitSource {
 public:
  virtual ~InitSource() = default;
  virtual const tensor::Shape& shape() const = 0;
  // Elements [begin, begin + out.numel()) into `out` (contiguous, floating,
  // CPU), converting dtype. Throws an OpError naming what failed.
  virtual void Read(int64_t begin, tensor::Tensor& out) const = 0;
};

// Values in memory (any dtype and device; read as they are asked for).
class TensorInitSource : public InitSource {
 public:
  explicit TensorInitSource(tensor::Tensor values) : values_(std::move(values)) {}
  const tensor::Shape& shape() const override { return values_.shape(); }
  void Read(int64_t begin, tensor::Tensor& out) const override;
  const tensor::Tensor& values() const { return values_; }

 private:
  tensor::Tensor values_;
};

struct InitSpec {
  enum class Kind { kZeros, kOnes, kNormal, kUniform, kTruncatedNormal, kFrom };
  Kind kind = Kind::kZeros;
  float a = 0.0f;  // normal/truncated: mean; uniform: low
  float b = 0.0f;  // normal/truncated: std; uniform: high
  // kFrom: where the parameter's values are read (loaded weights, shared, not
  // copied). Null once released (ReleaseInitValues), after which initializing
  // from it is an error.
  std::shared_ptr<const InitSource> from;

  static InitSpec Zeros() { return {Kind::kZeros, 0, 0}; }
  static InitSpec Ones() { return {Kind::kOnes, 0, 0}; }
  static InitSpec Normal(float mean, float std) { return {Kind::kNormal, mean, std}; }
  static InitSpec Uniform(float lo, float hi) { return {Kind::kUniform, lo, hi}; }
  // Normal(mean, std) truncated to [mean - 2 std, mean + 2 std].
  static InitSpec TruncatedNormal(float mean, float std) {
    return {Kind::kTruncatedNormal, mean, std};
  }
  // Element i is the source's element i (flattened): pretrained weights that
  // FSDP shards without any rank holding a whole copy.
  static InitSpec From(std::shared_ptr<const InitSource> source) {
    return {Kind::kFrom, 0, 0, std::move(source)};
  }
  static InitSpec From(tensor::Tensor values) {
    return From(std::make_shared<TensorInitSource>(std::move(values)));
  }
};

// Writes elements [begin, begin + out.numel()) of a parameter initialized by
// `spec` under (seed, full_name) into `out` (contiguous, floating, CPU); kFrom
// reads them from spec.from (converting dtype).
void InitSlice(const InitSpec& spec, uint64_t seed, absl::string_view full_name, int64_t begin,
               tensor::Tensor& out);

struct Parameter {
  tensor::Shape shape;
  InitSpec init;
  // AdamW/SGD apply weight decay (false for biases, norms and embeddings by default).
  bool weight_decay = true;
  // PyTorch's requires_grad. A frozen parameter (false) is read by the forward
  // and backward as any other, but no backward computes its gradient (grad
  // stays undefined), the optimizers never see it, and the data-parallel
  // wrappers communicate nothing for it (nn::FreezeParameters sets it by name).
  bool requires_grad = true;
  // What layers compute with: the fp32 master, a low-precision copy, or a view
  // into an FSDP unit's unsharded flat parameter. Undefined while sharded or
  // before materialization.
  tensor::Tensor value;
  // The fp32 gradient; undefined until a backward writes one. FSDP points it
  // into its flat gradient buffer.
  tensor::Tensor grad;
  // `grad` is a view its owner has not zeroed (FSDP's unsharded gradient,
  // made without a memset; a DDP / ZeRO-1 bucket view after
  // ZeroGrad(set_to_none)): its contents mean zero. The first GradToWrite
  // writes over them, GradBuffer zeroes them first; either clears the flag,
  // and the owner zeroes what no backward wrote (FSDP after the unit's
  // backward, DDP / ZeRO-1 before a bucket's collective).
  bool grad_unwritten = false;
  // The wrapper that owns value and grad while it lives, whose optimizer
  // steps on its own shards (optim::FromModule refuses the parameter): an
  // FSDP unit ("FSDP unit 'transformer.h.0'"; value and grad are its views,
  // undefined while sharded), or "ZeRO-1" (which steps on this rank's slices).
  std::string held_by;
  // How many times a backward asked for the gradient (GradToWrite, GradBuffer):
  // once per use. DDP and ZeRO-1 count a backward's writes to know when a
  // gradient is final, whichever modules use the parameter.
  int64_t grad_writes = 0;

  int64_t numel() const { return shape.numel(); }
  // The gradient, allocated as fp32 zeros (category: gradients) if undefined,
  // zeroed if unwritten. Throws tensor::OpError for a frozen parameter: a
  // layer's backward must not compute a gradient nobody asked for.
  tensor::Tensor& GradBuffer();

  // Where a backward that computes the whole gradient at once puts it. With a
  // gradient (accumulation over micro-batches or uses, DDP's views) it adds to
  // it. Without one (after ZeroGrad(set_to_none=true), PyTorch's zero_grad
  // default) it writes a new uninitialized fp32 buffer (category: gradients),
  // now `grad`; and it writes an unwritten one (grad_unwritten): no zero fill
  // and no read of zeros. The caller must then write every element. Throws as
  // GradBuffer for a frozen parameter.
  struct GradSink {
    tensor::Tensor grad;  // shares `grad`'s storage
    bool accumulate;      // false: overwrite
  };
  GradSink GradToWrite();

  // What no backward wrote: zeroes `grad` if it is marked unwritten, and
  // clears the mark (the owners of unwritten views, after a backward).
  void ZeroGradIfUnwritten();
  // Drops the gradient (undefined, unmarked).
  void DropGrad();
};

}  // namespace nn

#endif  // NN_PARAMETER_H_
