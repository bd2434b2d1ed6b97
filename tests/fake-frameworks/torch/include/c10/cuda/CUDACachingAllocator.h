// The fake torch's c10/cuda/CUDACachingAllocator.h: only what gpucollect's trace tracker shim
// (collector/src/capture/python/gpucollect_torch_tracker.cpp) uses, with the namespace, names
// and signatures of PyTorch's own header (c10/cuda/CUDACachingAllocator.h and
// c10/core/CachingDeviceAllocator.h of PyTorch 2.8-2.10): TraceEntry and its actions,
// AllocatorTraceTracker, the CUDAAllocator's attachAllocatorTraceTracker, the `allocator`
// object and the inline attachAllocatorTraceTracker clients call. The CUDAAllocator here has
// only that one virtual function: the fake libc10_cuda.so (tests/fake-frameworks/
// fake_c10_cuda.cpp) is built from this header, so both sides agree on it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#define C10_CUDA_API __attribute__((visibility("default")))

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace c10 {
using DeviceIndex = int8_t;
using CaptureId_t = unsigned long long;
using MempoolId_t = std::pair<CaptureId_t, CaptureId_t>;
using approx_time_t = int64_t;
struct GatheredContext {
  virtual ~GatheredContext() = default;
};
}  // namespace c10

namespace c10::cuda::CUDACachingAllocator {

union trace_time_ {
  time_t t_;
  approx_time_t approx_t_;
};

struct TraceEntry {
  enum Action {
    ALLOC,
    FREE_REQUESTED,
    FREE_COMPLETED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    SNAPSHOT,
    OOM
  };
  TraceEntry(
      Action action,
      c10::DeviceIndex device,
      size_t addr,
      size_t size,
      cudaStream_t stream,
      MempoolId_t mempool,
      approx_time_t time,
      std::shared_ptr<GatheredContext> context = nullptr,
      std::string compile_context = "",
      std::string user_metadata = "")
      : action_(action),
        device_(device),
        addr_(addr),
        context_(std::move(context)),
        stream_(stream),
        size_(size),
        mempool_(std::move(mempool)),
        compile_context_(std::move(compile_context)),
        user_metadata_(std::move(user_metadata)) {
    time_.approx_t_ = time;
  }
  Action action_;
  c10::DeviceIndex device_;
  size_t addr_;
  std::shared_ptr<GatheredContext> context_;
  cudaStream_t stream_{};
  size_t size_;
  MempoolId_t mempool_;
  trace_time_ time_{};
  std::string compile_context_;
  std::string user_metadata_;
};

using AllocatorTraceTracker = std::function<void(const TraceEntry&)>;

class CUDAAllocator {
 public:
  virtual ~CUDAAllocator() = default;
  virtual void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) = 0;
};

C10_CUDA_API extern std::atomic<CUDAAllocator*> allocator;

inline CUDAAllocator* get() {
  return allocator.load();
}

inline void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) {
  get()->attachAllocatorTraceTracker(std::move(tracker));
}

}  // namespace c10::cuda::CUDACachingAllocator
