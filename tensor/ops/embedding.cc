// Embedding ops: argument and id-range checks, then the kernels of the
// tensors' device: tensor/cpu/embedding.h, or tensor/cuda/embedding.h for
// tensors on a CUDA device (ids checked there by a kernel whose first bad
// position and id the host reads at its next wait for the GPU, a deferred
// check: the error names the same id and position, later).
#include "tensor/ops/embedding.h"

#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/embedding.h"
#include "tensor/cuda/embedding.h"
#include "tensor/ops/check.h"

namespace tensor {
namespace {

// The multi-index of flat position p in `shape`, as "[i,j,k]".
std::string PositionString(int64_t p, const Shape& shape) {
  std::vector<int64_t> index(shape.rank());
  for (int d = shape.rank() - 1; d >= 0; --d) {
    index[d] = shape[d] == 0 ? 0 : p % shape[d];
    p = shape[d] == 0 ? 0 : p / shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(index, ","), "]");
}

// What is wrong with id `id` at flat position p of ids shaped `shape`
// (without the op's name, which the thrower adds).
std::string BadIdMessage(int64_t id, int64_t p, const Shape& shape, int64_t vocab,
                         const std::string& context) {
  return absl::StrCat("id ", id, " at position ", PositionString(p, shape), " of ids ",
                      shape.ToString(), " is out of range for ", vocab, " embeddings (", context,
                      ")");
}

// Throws unless every id is in [0, vocab); names the first one that is not.
void CheckIds(const char* op, const Tensor& ids, int64_t vocab, const std::string& context) {
  if (ids.device().is_cuda()) {
    DispatchIndex(op, ids.dtype(), [](auto*) {});  // i32 or i64
    // Reported at the host's next wait for the GPU, with the CPU's message.
    const std::string where =
        absl::StrCat(context, "; checked on the GPU, reported at the next wait for it");
    cuda::CheckIdsDeferred(op, ids, vocab, [shape = ids.shape(), vocab, where](int64_t p,
                                                                             int64_t id) {
      return BadIdMessage(id, p, shape, vocab, where);
    });
    return;
  }
  DispatchIndex(op, ids.dtype(), [&](auto* tag) {
    using I = std::remove_pointer_t<decltype(tag)>;
    const I* id = ids.data<I>();
    const int64_t n = ids.numel();
    int64_t bad = -1;
    for (int64_t p = 0; p < n; ++p) {
      const int64_t v = static_cast<int64_t>(id[p]);
      if (v < 0 || v >= vocab) {
        bad = p;
        break;
      }
    }
    if (bad >= 0) {
      ThrowOpError(op, BadIdMessage(static_cast<int64_t>(id[bad]), bad, ids.shape(), vocab,
                                    context));
    }
  });
}

// grad_out must be ids.shape + (C).
void CheckGradOut(const char* op, const Tensor& grad_out, const Tensor& ids, int64_t c) {
  CheckFloating(op, grad_out);
  Shape expected = ids.shape();
  expected.push_back(c);
  OP_CHECK(grad_out.shape() == expected, op, Describe("grad_out", grad_out), " does not match ids ",
           ids.shape().ToString(), ": expected ", expected.ToString());
}

}  // namespace

Tensor Embedding(const Tensor& weight, const Tensor& ids, bool ids_checked) {
  const char* op = "embedding";
  const bool on_cuda = CheckOneDevice(op, {&weight, &ids});
  OP_CHECK(weight.rank() == 2, op, "weight must be (V, C); got ", Describe("weight", weight));
  const Tensor ids_c = ids.Contiguous();
  if (!(on_cuda && ids_checked)) CheckIds(op, ids_c, weight.dim(0), Describe("weight", weight));
  Shape out_shape = ids.shape();
  out_shape.push_back(weight.dim(1));
  Tensor out = Tensor::Empty(out_shape, weight.dtype(), weight.device());
  if (on_cuda) {
    cuda::EmbeddingForward(weight.Contiguous(), ids_c, out);
  } else {
    cpu::EmbeddingForward(weight.Contiguous(), ids_c, out);
  }
  return out;
}

Tensor EmbeddingBackward(const Tensor& grad_out, const Tensor& ids, int64_t num_embeddings) {
  const char* op = "embedding_backward";
  const bool on_cuda = CheckOneDevice(op, {&grad_out, &ids});
  OP_CHECK(num_embeddings >= 0, op, "num_embeddings must be >= 0; got ", num_embeddings);
  OP_CHECK(grad_out.rank() >= 1, op, "grad_out must be (..., C); got ",
           Describe("grad_out", grad_out));
  const int64_t c = grad_out.dim(-1);
  CheckGradOut(op, grad_out, ids, c);
  const Tensor ids_c = ids.Contiguous();
  CheckIds(op, ids_c, num_embeddings, absl::StrCat("num_embeddings ", num_embeddings));
  Tensor grad_weight = Tensor::Empty({num_embeddings, c}, grad_out.dtype(), grad_out.device());
  if (on_cuda) {
    cuda::EmbeddingBackward(grad_out.Contiguous(), ids_c, grad_weight, /*accumulate=*/false);
  } else {
    cpu::EmbeddingBackward(grad_out.Contiguous(), ids_c, grad_weight, /*accumulate=*/false);
  }
  return grad_weight;
}

void EmbeddingBackwardAccumulate(const Tensor& grad_out, const Tensor& ids,
                                 const Tensor& grad_weight, bool ids_checked) {
  const char* op = "embedding_backward";
  const bool on_cuda = CheckOneDevice(op, {&grad_out, &ids, &grad_weight});
  OP_CHECK(grad_weight.rank() == 2, op, "grad_weight must be (V, C); got ",
           Describe("grad_weight", grad_weight));
  CheckFloating(op, grad_weight);
  OP_CHECK(grad_weight.is_contiguous(), op, "grad_weight ", grad_weight.shape().ToString(),
           " must be contiguous to accumulate into");
  CheckGradOut(op, grad_out, ids, grad_weight.dim(1));
  const Tensor ids_c = ids.Contiguous();
  if (!(on_cuda && ids_checked)) {
    CheckIds(op, ids_c, grad_weight.dim(0), Describe("grad_weight", grad_weight));
  }
  if (on_cuda) {
    cuda::EmbeddingBackward(grad_out.Contiguous(), ids_c, grad_weight, /*accumulate=*/true);
  } else {
    cpu::EmbeddingBackward(grad_out.Contiguous(), ids_c, grad_weight, /*accumulate=*/true);
  }
}

}  // namespace tensor
