// One object per (calling thread, device), made at the thread's first use of
// that device and destroyed when the thread exits: the library handles of the
// CUDA backend (cuBLASLt's in matmul.cu, cuDNN's in attention_cudnn.cc), which
// are bound to a device and used on the thread's own stream, and the staging
// blocks of its queued uploads (streams.cu) and its unread deferred checks
// (deferred_checks.cu). Plain C++ (no CUDA types), for nvcc and host
// compilers alike.
#ifndef TENSOR_CUDA_THREAD_DEVICE_SLOT_H_
#define TENSOR_CUDA_THREAD_DEVICE_SLOT_H_

#include <memory>
#include <vector>

namespace tensor {
namespace cuda {

// This thread's T of every device, by index: one vector per T (not per
// caller), so every call site of a T finds the same objects.
template <typename T>
std::vector<std::unique_ptr<T>>& ThreadDeviceSlots() {
  thread_local std::vector<std::unique_ptr<T>> slots;
  return slots;
}

// This thread's T for `device`, made by make() (a std::unique_ptr<T>) at the
// first call; a null result is not kept, so the next call makes again.
template <typename T, typename Make>
T* ThreadDeviceSlot(int device, Make make) {
  std::vector<std::unique_ptr<T>>& slots = ThreadDeviceSlots<T>();
  if (device >= static_cast<int>(slots.size())) slots.resize(device + 1);
  std::unique_ptr<T>& slot = slots[device];
  if (slot == nullptr) slot = make();
  return slot.get();
}

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_THREAD_DEVICE_SLOT_H_
