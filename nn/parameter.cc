// Parameter initialization by slice and gradient buffers.
#include "nn/parameter.h"

#include <cmath>
#include <type_traits>

#include "tensor/cpu/dispatch.h"
#include "tensor/fnv.h"
#include "tensor/memory_ledger.h"
#include "tensor/ops/check.h"
#include "tensor/ops/init.h"
#include "tensor/random.h"
#include "tensor/thread_pool.h"

namespace nn {
namespace {

// FNV-1a 64: a stable key per parameter name.
uint64_t NameKey(uint64_t seed, absl::string_view name) {
  return tensor::Fnv1a64(name, tensor::kFnv1aBasis ^ (seed * 0x9E3779B97F4A7C15ull));
}

// Normal(mean, std) redrawn until inside mean +- 2 std; each redraw uses the
// next word pair of the same counter, then further counters in a disjoint
// range, so the value still depends only on (key, element).
float TruncatedNormal(const tensor::Generator& gen, uint64_t element, float mean, float std) {
  for (uint64_t attempt = 0;; ++attempt) {
    const float z = gen.Normal(element + (attempt << 48));
    if (std::fabs(z) <= 2.0f) return mean + std * z;
  }
}

}  // namespace

void InitSlice(const InitSpec& spec, uint64_t seed, absl::string_view full_name, int64_t begin,
               tensor::Tensor& out) {
  tensor::CheckCpu("init_slice", {&out});
  OP_CHECK(out.is_contiguous(), "init_slice", "output ", out.shape().ToString(),
           " must be contiguous");
  if (spec.kind == InitSpec::Kind::kFrom) {
    OP_CHECK(spec.from != nullptr, "init_slice", "parameter '", full_name,
             "': its loaded values were released");
    const int64_t numel = spec.from->shape().numel();
    OP_CHECK(begin >= 0 && begin + out.numel() <= numel, "init_slice", "parameter '", full_name,
             "': elements [", begin, ", ", begin + out.numel(), ") of ", numel, " loaded values");
    spec.from->Read(begin, out);
    return;
  }
  const tensor::Generator gen(NameKey(seed, full_name));
  tensor::DispatchFloating("init_slice", out.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* p = static_cast<T*>(out.raw_data());
    tensor::ParallelFor(out.numel(), 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const uint64_t element = static_cast<uint64_t>(begin + i);
        float v = 0.0f;
        switch (spec.kind) {
          case InitSpec::Kind::kZeros: v = 0.0f; break;
          case InitSpec::Kind::kOnes: v = 1.0f; break;
          case InitSpec::Kind::kNormal: v = spec.a + spec.b * gen.Normal(element); break;
          case InitSpec::Kind::kUniform:
            v = spec.a + (spec.b - spec.a) * gen.Uniform(element);
            break;
          case InitSpec::Kind::kTruncatedNormal:
            v = TruncatedNormal(gen, element, spec.a, spec.b);
            break;
          case InitSpec::Kind::kFrom:
            break;  // handled above
        }
        p[i] = tensor::FromFloat<T>(v);
      }
    });
  });
}

void TensorInitSource::Read(int64_t begin, tensor::Tensor& out) const {
  const tensor::Tensor flat =
      values_.device().is_cpu() && values_.is_contiguous()
          ? values_.Reshape({values_.numel()})
          : values_.To(tensor::Device::Cpu()).Contiguous().Reshape({values_.numel()});
  out.CopyFrom(flat.Narrow(0, begin, out.numel()).To(out.dtype()).View(out.shape()));
}

tensor::Tensor& Parameter::GradBuffer() {
  if (!GradToWrite().accumulate) tensor::Zero(grad);  // new or unwritten: zeros to add to
  return grad;
}

Parameter::GradSink Parameter::GradToWrite() {
  OP_CHECK(requires_grad, "parameter", "a gradient was asked of a frozen parameter ",
           shape.ToString(), " (requires_grad is false)");
  ++grad_writes;
  if (grad.defined()) {
    const bool accumulate = !grad_unwritten;
    grad_unwritten = false;
    return {grad, accumulate};
  }
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kGradients);
  grad = tensor::Tensor::Empty(shape, tensor::Dtype::kF32,
                               value.defined() ? value.device() : tensor::Device::Cpu());
  grad_unwritten = false;
  return {grad, /*accumulate=*/false};
}

void Parameter::ZeroGradIfUnwritten() {
  if (!grad_unwritten) return;
  tensor::Zero(grad);
  grad_unwritten = false;
}

// GCC 12 warns here that moving an empty Shape (an absl::InlinedVector whose
// inline storage holds nothing) reads it uninitialized: a false positive of
// Debian's Abseil (it copies the whole inline buffer).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
void Parameter::DropGrad() {
  grad = tensor::Tensor();
  grad_unwritten = false;
}
#pragma GCC diagnostic pop

}  // namespace nn
