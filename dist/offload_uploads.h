// FSDP cpu_offload's uploads, private to //dist:fsdp: each unit's shard goes
// from page-locked host memory to the GPU for its all-gather on a stream of
// its own, into a device buffer kept for uploads (a slot), so the copy waits
// for none of the kernels the thread has queued and the host does not wait
// at all. A blocking copy into a new block of the caching allocator waited
// for the thread's queued kernels (the block may be one they still use) and
// then for the copy itself, while the GPU ran dry.
//
// The protocol of one upload (the unit's gather, fsdp_unit.cc):
//   1. TryStart: a free slot of the dtype, or none (the caller copies the
//      shard as before: every slot is in use by gathers in flight, e.g. an
//      explicit prefetch list longer than max_inflight_all_gathers, or
//      FullyShardedModel::Unshard gathering every unit); a low-precision
//      dtype is cast on the host into the slot's page-locked buffer first.
//      The copy is queued on the upload stream, and the upload's ready
//      stream waits for it and for the work the calling thread had queued
//      (the earlier users of the all-gather's output block). The all-gather
//      issued next waits for the ready stream
//      (CollectiveOptions::ready_stream), so it reads the uploaded values,
//      and the thread's later kernels (a prefetch's overlap) do not wait for
//      the copy. (Until 2026-12-01 the thread's stream waited for the copy:
//      a prefetched upload held up the kernels queued after it.)
//   2. Release, once the work that read the slot has finished on the device
//      (the all-gather's Work::Wait returned OK): the slot is free for the
//      next Start. A slot whose reader failed is never released: a
//      collective that failed may still read it (the slots are freed with
//      this object, after FSDP's units waited for their gathers).
// The host may change a shard once its upload's reader has finished: FSDP
// waits for every all-gather it issues within the pass (a gather that
// finished read its upload, which had finished before it began), so an
// optimizer step after the backward changes no shard an upload still reads.
#ifndef DIST_OFFLOAD_UPLOADS_H_
#define DIST_OFFLOAD_UPLOADS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "tensor/cuda_backend.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace dist {
namespace internal {

class OffloadUploads {
 public:
  // Uploads to cuda:`device`. Throws OpError without CUDA support.
  explicit OffloadUploads(int device);
  // Waits for the uploads queued, then frees the slots.
  ~OffloadUploads();
  OffloadUploads(const OffloadUploads&) = delete;
  OffloadUploads& operator=(const OffloadUploads&) = delete;

  // Makes `count` slots of `numel` values of `dtype` (device memory, and
  // page-locked host memory for a dtype other than f32), charged to the
  // ledger's communication. Uploads make none: no step allocates.
  void Reserve(tensor::Dtype dtype, int64_t numel, int count);

  struct Upload {
    int slot = -1;
    tensor::Tensor values;  // [shard numel] in the upload's dtype, on the GPU
    // What the reader of `values` waits for (CollectiveOptions::ready_stream):
    // the copy, and the work the calling thread had queued before it.
    tensor::cuda::StreamHandle ready_stream = nullptr;
  };
  // Queues the copy of `shard` (f32, contiguous, page-locked host memory),
  // cast to `dtype` on the host first when that differs, into a free slot
  // (step 1 above); the calling thread's stream does not wait for it.
  // Nullopt when no slot of `dtype` that holds the shard is free.
  std::optional<Upload> TryStart(const tensor::Tensor& shard, tensor::Dtype dtype);
  // Step 2 above: the reader of the slot's values has finished on the device.
  void Release(int slot);
  // The host waits until every upload queued has read its source.
  void WaitForReads();

  // Slots made.
  int slots() const { return static_cast<int>(slots_.size()); }
  int busy() const;

 private:
  struct Slot {
    tensor::Dtype dtype;
    tensor::Tensor device;  // [numel] dtype, on the GPU
    tensor::Tensor host;    // [numel] dtype, page-locked (cast dtypes only)
    bool busy = false;
  };
  // Destroys the streams and events made (the constructor's cleanup too).
  void Destroy();

  const int device_;
  tensor::cuda::StreamHandle stream_ = nullptr;   // the copies
  tensor::cuda::StreamHandle ready_ = nullptr;    // waits only: Upload::ready_stream
  tensor::cuda::EventHandle uploaded_ = nullptr;  // recorded after each copy
  tensor::cuda::EventHandle issued_ = nullptr;    // on the thread's stream at each copy
  std::vector<Slot> slots_;
};

}  // namespace internal
}  // namespace dist

#endif  // DIST_OFFLOAD_UPLOADS_H_
