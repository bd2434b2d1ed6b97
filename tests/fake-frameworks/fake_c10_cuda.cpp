// The fake torch's libc10_cuda.so (built by the tests and scripts/bench-torch-tracker.sh into
// a copy of the fake torch, as torch/lib/libc10_cuda.so, against
// torch/include/c10/cuda/CUDACachingAllocator.h): PyTorch's `allocator` object, whose
// attachAllocatorTraceTracker keeps the trackers, and a C entry the fake torch's caching
// allocator (torch/cuda/memory.py, through ctypes) calls for every action, which calls every
// tracker under a lock in the calling thread, as PyTorch's record_trace does under its
// per-device lock. It also counts the calls and the time spent in trackers, for the
// benchmark. With FAKE_C10_CUDA_REFUSE_TRACKERS set, attaching a tracker throws.
#include <c10/cuda/CUDACachingAllocator.h>

#include <time.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace c10::cuda::CUDACachingAllocator {
namespace {

class FakeAllocator final : public CUDAAllocator {
 public:
  void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) override {
    if (std::getenv("FAKE_C10_CUDA_REFUSE_TRACKERS") != nullptr) {
      // As an allocator backend without trackers does (c10::Error is a std::exception).
      throw std::runtime_error("fake libc10_cuda: this allocator takes no trace trackers");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    trackers_.push_back(std::move(tracker));
  }

  void record(TraceEntry::Action action, int device, uint64_t addr, uint64_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (trackers_.empty()) {
      return;
    }
    TraceEntry entry(action, static_cast<c10::DeviceIndex>(device), addr, size, nullptr,
                     {0, 0}, 0);
    timespec t0{};
    timespec t1{};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (const auto& tracker : trackers_) {
      tracker(entry);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const auto nanos = static_cast<uint64_t>((t1.tv_sec - t0.tv_sec) * 1000000000LL +
                                             (t1.tv_nsec - t0.tv_nsec));
    tracker_nanos_ += nanos;
    tracker_calls_ += 1;
    if (action == TraceEntry::ALLOC) {
      alloc_nanos_ += nanos;
      alloc_calls_ += 1;
    }
  }

  int trackers() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(trackers_.size());
  }

  uint64_t tracker_nanos() {
    std::lock_guard<std::mutex> lock(mutex_);
    return tracker_nanos_;
  }

  uint64_t tracker_calls() {
    std::lock_guard<std::mutex> lock(mutex_);
    return tracker_calls_;
  }

  uint64_t alloc_nanos() {
    std::lock_guard<std::mutex> lock(mutex_);
    return alloc_nanos_;
  }

  uint64_t alloc_calls() {
    std::lock_guard<std::mutex> lock(mutex_);
    return alloc_calls_;
  }

 private:
  std::mutex mutex_;
  std::vector<AllocatorTraceTracker> trackers_;
  uint64_t tracker_nanos_ = 0;
  uint64_t tracker_calls_ = 0;
  uint64_t alloc_nanos_ = 0;
  uint64_t alloc_calls_ = 0;
};

FakeAllocator fake;

}  // namespace

std::atomic<CUDAAllocator*> allocator{&fake};

}  // namespace c10::cuda::CUDACachingAllocator

using c10::cuda::CUDACachingAllocator::fake;
using c10::cuda::CUDACachingAllocator::TraceEntry;

// `action` is TraceEntry::Action's value (0 alloc ... 8 oom).
extern "C" __attribute__((visibility("default"))) void fake_c10_cuda_record(
    int action, int device, uint64_t addr, uint64_t size) {
  fake.record(static_cast<TraceEntry::Action>(action), device, addr, size);
}

extern "C" __attribute__((visibility("default"))) int fake_c10_cuda_trackers() {
  return fake.trackers();
}

extern "C" __attribute__((visibility("default"))) uint64_t fake_c10_cuda_tracker_nanos() {
  return fake.tracker_nanos();
}

extern "C" __attribute__((visibility("default"))) uint64_t fake_c10_cuda_tracker_calls() {
  return fake.tracker_calls();
}

// Of those, the calls and time for ALLOC actions.
extern "C" __attribute__((visibility("default"))) uint64_t fake_c10_cuda_alloc_nanos() {
  return fake.alloc_nanos();
}

extern "C" __attribute__((visibility("default"))) uint64_t fake_c10_cuda_alloc_calls() {
  return fake.alloc_calls();
}
