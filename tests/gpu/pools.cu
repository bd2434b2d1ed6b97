// Stream-ordered pools and graph memory on a real GPU, for scripts/gpu-check.sh: the injection
// library's poller must see each pool's reserved and used bytes change (see
// scripts/gpu_trace_check.py, scenario "pools"). Kept apart from scenarios.cu so that a problem
// here never stops the other scenarios from building.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(90);                                                                     \
        }                                                                                 \
    } while (0)

// Four intervals of the poller's default 50 ms.
static void settle() { usleep(200 * 1000); }

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));

    // The device's default pool, told to keep freed memory until trimmed.
    cudaMemPool_t def;
    CHECK(cudaDeviceGetDefaultMemPool(&def, 0));
    uint64_t keep = UINT64_MAX;
    CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &keep));
    void *a;
    CHECK(cudaMallocAsync(&a, 64 << 20, s));
    CHECK(cudaStreamSynchronize(s));
    settle();  // default pool: used 64 MiB
    CHECK(cudaFreeAsync(a, s));
    CHECK(cudaStreamSynchronize(s));
    settle();  // used 0, reserved still >= 64 MiB
    CHECK(cudaMemPoolTrimTo(def, 0));
    settle();  // reserved 0

    // A pool of the program's own.
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t own;
    CHECK(cudaMemPoolCreate(&own, &props));
    void *b;
    CHECK(cudaMallocFromPoolAsync(&b, 32 << 20, own, s));
    CHECK(cudaStreamSynchronize(s));
    settle();  // own pool: used 32 MiB
    CHECK(cudaFreeAsync(b, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemPoolDestroy(own));
    settle();

    // Graph memory: an allocation node captured from cudaMallocAsync, left allocated by the
    // launch, freed with cudaFree, then trimmed.
    cudaGraph_t g;
    void *c = nullptr;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMallocAsync(&c, 16 << 20, s));
    // The capture stays open while gpucollect's pool poller, woken by the allocation, queries
    // the driver from its own thread: that must not invalidate the capture (global mode).
    settle();
    CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    settle();  // graph memory: used 16 MiB
    CHECK(cudaFree(c));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaDeviceGraphMemTrim(0));
    settle();
    printf("pools done\n");
    return 0;
}
