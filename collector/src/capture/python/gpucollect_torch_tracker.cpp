// gpucollect's PyTorch trace tracker shim. gpucollect_frameworks.py compiles it once per torch
// version and C++ ABI against the installed torch's own headers (torch/include), links it to
// torch's libc10_cuda.so and loads it into the traced program, then calls
// gpucollect_torch_tracker_attach once CUDA is initialised.
//
// The tracker runs inside the caching allocator, under its per-device lock, in the allocating
// thread. It only maps the trace entry to plain integers and calls the injection library's
// gpucollect_framework_trace (collector/inject/src/framework_tracker.rs), which captures the
// thread's native and Python stacks itself: no allocation, locks, logging, CUDA calls or GIL
// here or there. Only the names the headers give are used (TraceEntry's action_, addr_, size_,
// stream_ and, where the release has them, device_ and mempool_), never a hard-coded layout.
// Checked against PyTorch 2.15.0's headers (C++20) and the fake torch's (tests/fake-frameworks).
#include <c10/cuda/CUDACachingAllocator.h>

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <type_traits>
#include <utility>

namespace {

using c10::cuda::CUDACachingAllocator::TraceEntry;

// gpucollect_framework_trace(action, device, addr, size, stream, pool) -> 1 recorded, 0 not
// traced, -1 unknown action; its actions:
constexpr uint32_t kActionAlloc = 1;
constexpr uint32_t kActionFree = 2;
using TraceFn = int (*)(uint32_t, uint32_t, uint64_t, uint64_t, uint64_t, uint64_t);

TraceFn g_trace = nullptr;
bool g_attached = false;

// mempool_ exists from PyTorch 2.3 or so; before it every block is in the default pool.
template <typename T, typename = void>
struct HasMempool : std::false_type {};
template <typename T>
struct HasMempool<T, std::void_t<decltype(std::declval<const T&>().mempool_)>>
    : std::true_type {};

// device_ is there in every release with trackers checked (2.8-2.15); 0 where it is not.
template <typename T, typename = void>
struct HasDevice : std::false_type {};
template <typename T>
struct HasDevice<T, std::void_t<decltype(std::declval<const T&>().device_)>> : std::true_type {};

template <typename T>
uint32_t device_of(const T& e) {
  if constexpr (HasDevice<T>::value) {
    return static_cast<uint32_t>(e.device_);
  } else {
    return 0;
  }
}

// A private pool's id: graph pools are {id, 0} and user pools {0, id}; the default is {0, 0}.
template <typename T>
uint64_t pool_of(const T& e) {
  if constexpr (HasMempool<T>::value) {
    return static_cast<uint64_t>(e.mempool_.first) | static_cast<uint64_t>(e.mempool_.second);
  } else {
    return 0;
  }
}

// The block the caching allocator hands out for a request (its round_size): at least 512
// bytes, a multiple of 512. memory_allocated() counts blocks; an alloc entry carries the
// request. The collector completes a large block left unsplit (at most 1 MiB would have
// remained) from its segment's layout. Not modelled: roundup_power2_divisions
// (gpucollect_frameworks.py's torch_block_size says the same).
uint64_t block_size(uint64_t requested) {
  if (requested == 0) {
    return 0;
  }
  uint64_t rounded = (requested + 511) / 512 * 512;
  return rounded < 512 ? 512 : rounded;
}

void on_trace(const TraceEntry& e) {
  uint32_t action;
  switch (e.action_) {
    case TraceEntry::ALLOC:
      action = kActionAlloc;
      break;
    case TraceEntry::FREE_REQUESTED:
      // memory_allocated() drops here; free_completed follows once the streams that used the
      // block are done with it (at once for most blocks), when it is back in the cache.
      action = kActionFree;
      break;
    default:
      // Segments are the driver's allocations (traced through CUPTI).
      return;
  }
  g_trace(action, device_of(e), static_cast<uint64_t>(e.addr_),
          block_size(static_cast<uint64_t>(e.size_)), reinterpret_cast<uintptr_t>(e.stream_),
          pool_of(e));
}

void set_error(char* error, size_t error_len, const char* message) {
  if (error == nullptr || error_len == 0) {
    return;
  }
  std::strncpy(error, message, error_len - 1);
  error[error_len - 1] = '\0';
}

}  // namespace

// Attaches the tracker, forwarding to `injection`'s gpucollect_framework_trace (the injection
// library, already loaded by the CUDA driver: it is not loaded here). Returns 1 when attached
// (also when it already was), 0 when the library is not loaded or has no such entry (nothing
// is attached), -1 when torch refused (the reason in `error`).
extern "C" __attribute__((visibility("default"))) int gpucollect_torch_tracker_attach(
    const char* injection, char* error, size_t error_len) {
  set_error(error, error_len, "");
  if (g_attached) {
    return 1;
  }
  if (injection == nullptr) {
    set_error(error, error_len, "no injection library path");
    return 0;
  }
  void* lib = dlopen(injection, RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) {
    set_error(error, error_len, "the injection library is not loaded in this process");
    return 0;
  }
  auto trace = reinterpret_cast<TraceFn>(dlsym(lib, "gpucollect_framework_trace"));
  if (trace == nullptr) {
    set_error(error, error_len, "the injection library has no gpucollect_framework_trace");
    return 0;
  }
  g_trace = trace;
  try {
    c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(&on_trace);
  } catch (const std::exception& e) {
    set_error(error, error_len, e.what());
    return -1;
  } catch (...) {
    set_error(error, error_len, "attachAllocatorTraceTracker threw");
    return -1;
  }
  g_attached = true;
  return 1;
}
