// CUDA kernels: fused (FlashAttention-2 style) attention forward and backward
// that never materialize the (T_q, T_k) scores or probabilities (see
// common.cuh for the conventions of this folder).
//
//   out = softmax(scale * q k^T, causal) @ v     (B, H, T_q, D)
//   lse = logsumexp(scale * q k^T, causal)       (B, H, T_q) f32, natural log
//
// Forward: one CTA per (batch*head, block of queries) streams the keys and
// values in tiles through shared memory with the online softmax (running row
// max and sum, output rescaled per tile); it writes the output and the
// per-row logsumexp. Backward recomputes the probabilities tile by tile as
// exp(scale * q k^T - lse) and runs three kernels, deterministic (no atomics):
//   1. delta = rowsum(grad_out * out)             (B, H, T_q) f32 workspace
//   2. dk, dv: one CTA per block of keys, looping over the queries
//   3. dq:     one CTA per block of queries, looping over the keys
// (the scores are recomputed in 2 and 3: one more q k^T than FlashAttention-2's
// atomic dq, in exchange for bitwise-reproducible gradients and no fp32 dq
// accumulator). Memory beyond the outputs: the (B, H, T_q) delta. O(T), never
// O(T^2).
// Atomic dq (SetFlashAttentionAtomicDq, environment FSDP_CUDA_ATTENTION_DQ=
// atomic; tensor-core kernels without a bias gradient): FlashAttention-2's
// own backward instead, 5 products instead of 7. Kernel 2 also forms dQ +=
// dS K for its key block (dS through shared memory) and adds it with float
// atomics into a zeroed (B, H, T_q, D) f32 accumulator, which a last kernel
// scales and rounds into dq. Faster where the products dominate, but dq's sums
// then run in the order the CTAs reach them: not bitwise reproducible (as
// PyTorch's flash backward), and the accumulator costs 4 bytes per dq element.
// Off by default.
// Narrow kernels (tensor-core kernels at head size 64 without dropout or
// score terms; off by default, not yet timed on a GPU): kernel 2 steps over 32
// queries at a time instead of 64 (SetFlashAttentionNarrowDkDv, environment
// FSDP_CUDA_ATTENTION_DKDV=narrow), kernel 3 over 32 keys instead of 64
// (SetFlashAttentionNarrowDq, FSDP_CUDA_ATTENTION_DQ=narrow), so half the
// probabilities and dS are live beside the accumulators: dk/dv 128 registers
// a thread instead of 168 (sm_90 ptxas, no spills), 4 CTAs an SM instead of
// 3; dq 96 instead of 130, 5 CTAs instead of 3; for twice the steps (a
// barrier and a stage of copies each) and the fixed operand's fragments read
// twice as often. The sums run in the same order: the same bits.
//
// Kernels (FlashAttentionKernel):
// - kTensorCore (bf16, f16): warp-level mma.sync.m16n8k16 with f32
//   accumulation, 4 warps of 16 rows each, tiles of 64 (see
//   FlashAttentionTilesFor) copied in by cp.async in two stages (the next
//   tile loads while this one is used), operands read into the fragments by
//   ldmatrix; the probabilities (and dS in the backward) are
//   rounded to the input dtype before their products, as FlashAttention does.
//   Tried and dropped: two row tiles of 16 per warp (FlashAttention-2's
//   128-row blocks: each B fragment read from shared memory feeds two
//   products, with Q's fragments kept in registers) ran at 0.85x (forward)
//   and 0.83x (backward) of these on an H200 (B 8, H 12, T 1024, D 64): 250
//   to 255 registers a thread, so half the CTAs per SM.
// - kFloat (f32, bf16, f16): plain float FMA, one warp per query (or key) row,
//   K/V (or Q/dO) tiles of 32 rows staged as float in shared memory. Slower; the
//   f32 path and a reference for the tensor-core kernel.
// Masking: causal means query i sees keys j <= i + (T_k - T_q) (as
// nn::AttentionForward). Rows that see no key get out 0, lse -inf and no
// gradient.
// Score terms (FlashScoreTerms, T5's attention): an additive bias
// (B or 1, H, T_q, T_k) read from memory as each score tile is formed, and a
// (B, T_k) key padding mask. Both are compile-time kernel flags, like
// dropout, so plain attention keeps its registers. The backward can write
// the bias's gradient: dS, the gradient of the scores, summed over the batch
// when the bias is shared by it (T5's relative positions), by the dq kernel,
// deterministically (no atomics): the examples are split into G groups
// (FlashBiasGradGroupsFor), the dq kernel runs once per example of a group,
// each CTA adding its example's dS tile into its group's (H, T_q, T_k) f32
// slot, and the G slots are summed in a fixed order. G is the fewest groups
// that keep enough CTAs per launch, so a shared bias costs G (not B) times
// (H, T_q, T_k) f32 during the backward, where PyTorch's memory-efficient
// attention returns the (B, H, T_q, T_k) dS. The forward and what it keeps
// stay O(T).
// Dropout on the probabilities (FlashDropout): the mask of tensor/ops/dropout.h
// over the (B, H, T_q, T_k) probabilities (element i = ((b H + h) T_q + query)
// T_k + key uses Philox word i % 4 of counter offset + i / 4), regenerated in
// every kernel from (seed, offset), so nothing O(T^2) is stored: the forward
// multiplies the probabilities by mask / (1 - p) before P V (the row sums and
// lse stay those of the undropped softmax), the backward applies the same
// mask to P for dV and to dP before the softmax backward (delta =
// rowsum(dO * out) already includes it). The unfused path's
// tensor::Dropout on the probabilities draws the same mask from the same
// generator state.
#ifndef TENSOR_CUDA_ATTENTION_H_
#define TENSOR_CUDA_ATTENTION_H_

#include <cstdint>

#include "tensor/error.h"
#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// Dropout of the probabilities: p in [0, 1) (0: none), the Philox key and
// first counter (tensor::DropoutState's seed and offset; the forward of a
// dropout over B H T_q T_k elements reserves ceil(B H T_q T_k / 4) counters).
struct FlashDropout {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Extra terms of the scores: scale * q k^T + bias, with the keys whose
// key_mask is 0 masked out.
struct FlashScoreTerms {
  // Undefined, or (B or 1, H, T_q, T_k), f32 / bf16 / f16, contiguous, on
  // q's device (added after the scale).
  Tensor bias;
  // Undefined, or (B, T_k), any dtype, contiguous, on q's device: nonzero
  // keeps the key.
  Tensor key_mask;
};

enum class FlashAttentionKernel {
  kAuto,        // kTensorCore for bf16 / f16, kFloat for f32
  kTensorCore,  // bf16 / f16 only
  kFloat,       // any floating dtype
};

// out (B, H, T_q, D) and lse (B, H, T_q) f32, allocated by the caller on q's
// device: lse contiguous, out with any strides that have a unit stride in D
// and (bf16 / f16) 4-byte aligned rows, e.g. (B, T_q, H, D) memory viewed as
// (B, H, T_q, D), which merges the heads with no copy. q (B, H, T_q, D), k (B, H, T_k, D), v (B, H, T_k, D):
// one dtype (f32, bf16, f16), D in {32, 64, 128}, any strides with a unit
// stride in D (e.g. heads viewed out of a fused qkv projection). Asynchronous
// on ComputeStream(). Throws OpError("[flash_attention] ...") on anything else.
void FlashAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                           bool causal, const Tensor& out, const Tensor& lse,
                           FlashAttentionKernel kernel = FlashAttentionKernel::kAuto,
                           const FlashDropout& dropout = {}, const FlashScoreTerms& terms = {});

// dq, dk, dv (shaped and typed like q, k, v; strided as out may be, e.g.
// heads viewed into one fused (B, T, 3, H, D) gradient; not overlapping) from
// the forward's inputs, out and lse, and grad_out (like out; any strides with
// unit stride in D). Allocates the (B, H, T_q) f32 delta workspace on q's device.
// `dropout` and `terms`: the forward's. dbias: undefined, or a contiguous
// (B or 1, H, T_q, T_k) f32 tensor that receives the bias's gradient, dS =
// d loss / d scores (0 where masked), summed over the batch when its first
// dimension is 1 (in FlashBiasGradGroupsFor's order; more than one group
// allocates their (G, H, T_q, T_k) f32 sums). bias_grad_groups > 0 sets G
// (at most B; tests use it to split small batches); 0 takes
// FlashBiasGradGroupsFor's.
void FlashAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& grad_out, float scale, bool causal,
                            const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            FlashAttentionKernel kernel = FlashAttentionKernel::kAuto,
                            const FlashDropout& dropout = {}, const FlashScoreTerms& terms = {},
                            const Tensor& dbias = Tensor(), int64_t bias_grad_groups = 0);

// The unfused baseline's softmax (for benchmarks and tests: it needs the whole
// (B, H, T_q, T_k) scores): probs = softmax(scale * scores, causal) with scores
// f32 and probs f32/bf16/f16, both contiguous (B, H, T_q, T_k) on one device.
void UnfusedAttentionSoftmax(const Tensor& scores, float scale, bool causal, const Tensor& probs);
// Its backward: dscores = scale * probs * (dprobs - rowsum(probs * dprobs)),
// dprobs f32, probs and dscores f32/bf16/f16, contiguous (B, H, T_q, T_k).
void UnfusedAttentionSoftmaxBackward(const Tensor& dprobs, const Tensor& probs, float scale,
                                     const Tensor& dscores);

// A (B, T_k) key padding mask as the kernels read it: u8, nonzero where the
// key is kept. A u8 mask comes back as it is; any other dtype is converted
// on its device (asynchronous). Callers that run the forward and backward
// with one mask convert it once and pass the bytes to both.
Tensor FlashKeyMaskBytes(const Tensor& key_mask);

// ---- Host-side geometry (shared by the .cu and the tests; no CUDA needed) ----

// kBackwardDkDvDq: kernel 2 of the atomic-dq backward (dk, dv and dq's atomics).
// kBackwardDkDvNarrow, kBackwardDqNarrow: kernels 2 and 3 of the
// deterministic backward with 32 queries (keys) a step (the narrow kernels).
enum class FlashAttentionPass {
  kForward,
  kBackwardDkDv,
  kBackwardDq,
  kBackwardDkDvDq,
  kBackwardDkDvNarrow,
  kBackwardDqNarrow
};

struct FlashAttentionTiles {
  int rows;            // query rows (forward, dq) or key rows (dk/dv) per CTA
  int step;            // keys (forward, dq) or queries (dk/dv) per inner step
  int threads;         // per CTA
  int64_t smem_bytes;  // dynamic shared memory per CTA
};

constexpr bool FlashAttentionHeadDimSupported(int64_t head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128;
}

// Tiles of one kernel. kernel must be resolved (not kAuto); elem_size is the
// input dtype's size. Tensor cores: shared-memory rows padded by 8 elements
// (16 bytes: no bank conflicts on the ldmatrix fragment loads, rows stay
// 16-byte aligned for them and for cp.async); the tiles of the inner loop
// have two stages, the next block's loading while this one's are used.
// Float: tiles of 32 float rows padded by 1 (conflict-free per-lane
// dot products) plus the CTA's own 8 rows unpadded.
constexpr FlashAttentionTiles FlashAttentionTilesFor(FlashAttentionKernel kernel,
                                                     FlashAttentionPass pass, int64_t head_dim,
                                                     int64_t elem_size) {
  if (kernel == FlashAttentionKernel::kTensorCore) {
    const int64_t ld = head_dim + 8;
    if (pass == FlashAttentionPass::kForward) {
      return {64, 64, 128, (64 + 2 * 2 * 64) * ld * elem_size};  // Q; 2 x (K, V)
    }
    if (pass == FlashAttentionPass::kBackwardDkDv || pass == FlashAttentionPass::kBackwardDkDvDq ||
        pass == FlashAttentionPass::kBackwardDkDvNarrow) {
      // D = 128 takes 32 queries per step to keep dK, dV, S^T and dP^T in
      // registers; so does the narrow pass.
      const int step =
          head_dim >= 128 || pass == FlashAttentionPass::kBackwardDkDvNarrow ? 32 : 64;
      // K, V; 2 stages of (Q, dO, lse, delta); with dq, dS (step x 64 keys, padded by 8).
      const int64_t ds_bytes =
          pass == FlashAttentionPass::kBackwardDkDvDq ? step * (64 + 8) * elem_size : 0;
      return {64, step, 128,
              (2 * 64 + 2 * 2 * step) * ld * elem_size + 2 * 2 * step * 4 + ds_bytes};
    }
    const int64_t step = pass == FlashAttentionPass::kBackwardDqNarrow ? 32 : 64;
    return {64, static_cast<int>(step), 128,
            (2 * 64 + 2 * 2 * step) * ld * elem_size};  // dq: Q, dO; 2 x (K, V)
  }
  const int64_t ldf = head_dim + 1;
  if (pass == FlashAttentionPass::kForward) {
    return {8, 32, 256, (8 * head_dim + 2 * 32 * ldf) * 4};  // own Q rows; K, V tiles
  }
  if (pass == FlashAttentionPass::kBackwardDkDv || pass == FlashAttentionPass::kBackwardDkDvDq) {
    return {8, 32, 256,
            (2 * 8 * head_dim + 2 * 32 * ldf + 2 * 32) * 4};  // K, V rows; Q, dO; lse, delta
  }
  return {8, 32, 256, (2 * 8 * head_dim + 2 * 32 * ldf) * 4};  // dq: Q, dO rows; K, V tiles
}

// How the backward sums the gradient of a bias shared by the batch: `groups`
// groups of `passes` consecutive examples (the last one may be short); the dq
// kernel runs `passes` times, launch i taking example g * passes + i of every
// group g and adding its dS into group g's slot, so each slot sums its
// examples in order; the slots are then summed in order. The groups are the
// fewest that give each launch at least kFlashBiasGradMinCtas CTAs (H times
// the query blocks per group), from the shapes alone, so the sums are the same
// bits on every device. A bias per example (or none) is one group per example
// and one pass: the plain dq launch.
constexpr int64_t kFlashBiasGradMinCtas = 512;

struct FlashBiasGradGroups {
  int64_t groups;
  int64_t passes;
};

// `requested` > 0 asks for that many groups (clamped to [1, batch]).
constexpr FlashBiasGradGroups FlashBiasGradGroupsFor(int64_t batch, int64_t heads,
                                                     int64_t query_blocks, bool shared_bias,
                                                     int64_t requested = 0) {
  if (batch <= 0 || !shared_bias) return {batch, 1};
  int64_t groups = batch;
  if (requested > 0) {
    groups = requested < batch ? requested : batch;
  } else {
    const int64_t per_group = heads * query_blocks > 0 ? heads * query_blocks : 1;
    const int64_t wanted = (kFlashBiasGradMinCtas + per_group - 1) / per_group;
    groups = wanted < batch ? wanted : batch;
  }
  const int64_t passes = (batch + groups - 1) / groups;
  return {(batch + passes - 1) / passes, passes};  // no empty group
}

// Bytes the backward allocates besides dq, dk, dv: delta (B, H, T_q) f32,
// and with a shared bias's gradient in more than one group, the groups' (G,
// H, T_q, T_k) f32 sums; with atomic dq (head size `atomic_dq_head_dim` > 0),
// the (B, H, T_q, D) f32 accumulator.
constexpr int64_t FlashAttentionBackwardWorkspaceBytes(int64_t batch, int64_t heads, int64_t t_q,
                                                       int64_t bias_grad_groups = 1,
                                                       int64_t t_k = 0,
                                                       int64_t atomic_dq_head_dim = 0) {
  return batch * heads * t_q * 4 +
         (bias_grad_groups > 1 ? bias_grad_groups * heads * t_q * t_k * 4 : 0) +
         batch * heads * t_q * atomic_dq_head_dim * 4;
}

// Whether FlashAttentionBackward takes the atomic-dq path (see the top of
// this file) for the tensor-core kernels when no bias gradient is asked for.
// Default off; environment FSDP_CUDA_ATTENTION_DQ=atomic at startup turns it
// on. For comparing the two backwards (attention_benchmark) and for training
// runs that trade reproducibility for speed.
void SetFlashAttentionAtomicDq(bool atomic);
bool FlashAttentionAtomicDq();

// Whether the deterministic backward's dk/dv kernel takes 32 queries a step,
// and its dq kernel 32 keys a step, where they have such kernels (see the top
// of this file): the same bits, another speed. Default off; environment
// FSDP_CUDA_ATTENTION_DKDV=narrow and FSDP_CUDA_ATTENTION_DQ=narrow at
// startup turn them on. For timing them (attention_benchmark,
// bench_vs_pytorch.py).
void SetFlashAttentionNarrowDkDv(bool narrow);
bool FlashAttentionNarrowDkDv();
void SetFlashAttentionNarrowDq(bool narrow);
bool FlashAttentionNarrowDq();

// Whether FlashAttentionForward / FlashAttentionBackward hand the tensors cuDNN
// takes (attention_cudnn.h: bf16 / f16, D 64 or 128, causal with T_q == T_k,
// no dropout, score terms or bias gradient, kernel kAuto) to cuDNN's fused
// attention instead of our kernels. lse means the same both ways, so a
// forward by one pairs with a backward by the other. cuDNN's dq is summed with
// atomics (not bitwise reproducible). Where cuDNN declines (no plan for the
// shape, no cuDNN in the build) our kernels run, and stderr says why once per
// thread and reason. Default off; environment FSDP_CUDA_ATTENTION=cudnn at
// startup turns it on.
void SetFlashAttentionCudnn(bool use);
bool FlashAttentionCudnn();

// Throws OpError("[flash_attention] ...") unless q (B, H, T_q, D), k (B, H, T_k,
// D) and v (B, H, T_k, D) fit the kernels: one floating dtype, D in {32, 64,
// 128}, unit stride in D, sizes that fit the launch geometry. Devices are
// checked by the kernels' entry points.
inline void CheckFlashAttentionInputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  constexpr char kOp[] = "flash_attention";
  OP_CHECK(q.defined() && k.defined() && v.defined(), kOp, "q, k and v must be defined");
  OP_CHECK(q.rank() == 4 && k.rank() == 4 && v.rank() == 4, kOp,
           "q, k, v must be (B, H, T, D); got ", q.shape().ToString(), ", ", k.shape().ToString(),
           ", ", v.shape().ToString());
  OP_CHECK(k.dim(0) == q.dim(0) && v.dim(0) == q.dim(0) && k.dim(1) == q.dim(1) &&
               v.dim(1) == q.dim(1) && v.dim(2) == k.dim(2) && k.dim(3) == q.dim(3),
           kOp, "q ", q.shape().ToString(), ", k ", k.shape().ToString(), " and v ",
           v.shape().ToString(), " do not fit together");
  OP_CHECK(v.dim(3) == q.dim(3), kOp, "the value head size ", v.dim(3),
           " must equal the query/key head size ", q.dim(3));
  OP_CHECK(FlashAttentionHeadDimSupported(q.dim(3)), kOp, "head size ", q.dim(3),
           " is not supported (32, 64 or 128)");
  OP_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() &&
               (q.dtype() == Dtype::kF32 || q.dtype() == Dtype::kBF16 || q.dtype() == Dtype::kF16),
           kOp, "q, k, v must share dtype f32, bf16 or f16; got ", DtypeName(q.dtype()), ", ",
           DtypeName(k.dtype()), ", ", DtypeName(v.dtype()));
  for (const Tensor* t : {&q, &k, &v}) {
    OP_CHECK(t->strides()[3] == 1, kOp, "the head dimension must have unit stride; got strides (",
             t->strides()[0], ",", t->strides()[1], ",", t->strides()[2], ",", t->strides()[3],
             ") for shape ", t->shape().ToString());
  }
  constexpr int64_t kMaxInt = 0x7fffffff;
  OP_CHECK(q.dim(0) * q.dim(1) <= kMaxInt && q.dim(2) <= (int64_t{65535} * 8) &&
               k.dim(2) <= (int64_t{65535} * 8),
           kOp, "sizes too large for the launch geometry: B*H ", q.dim(0) * q.dim(1), ", T_q ",
           q.dim(2), ", T_k ", k.dim(2), " (at most 2^31-1 and 524280)");
}

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_ATTENTION_H_
