// Real-GPU counterparts of tests/fake-cuda/scenarios.c, run by scripts/gpu-check.sh.
// `scenarios NAME`; each plants a known pattern that gpu_trace_check.py asserts on.
#include <cuda.h>
#include <cuda_runtime.h>

#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <string>
#include <stdexcept>
#include <thread>
#include <vector>

#define CHECK(x)                                                                        \
    do {                                                                                \
        cudaError_t e_ = (x);                                                           \
        if (e_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(90);                                                                   \
        }                                                                               \
    } while (0)
#define DCHECK(x)                                                                \
    do {                                                                         \
        CUresult r_ = (x);                                                       \
        if (r_ != CUDA_SUCCESS) {                                                \
            fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, r_); \
            exit(91);                                                            \
        }                                                                        \
    } while (0)

__global__ void busy(float *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        for (int k = 0; k < 1000; k++) p[i] = p[i] * 0.999f + 1.0f;
}

__attribute__((noinline)) void load_batch(bool fail) {
    void *buf;
    CHECK(cudaMalloc(&buf, 3 << 20)); // LEAK_LINE
    if (fail) throw std::runtime_error("bad batch");
    CHECK(cudaFree(buf));
}

static int leak_exception() {
    load_batch(false);
    try {
        load_batch(true);
    } catch (const std::exception &) {
    }
    return 0;
}

static int async_free() {
    float *p;
    int n = 1 << 20;
    CHECK(cudaMalloc(&p, n * sizeof(float)));
    busy<<<(n + 255) / 256, 256>>>(p, n);
    CHECK(cudaFree(p)); // right after the launch: not a leak
    CHECK(cudaDeviceSynchronize());
    return 0;
}

__attribute__((noinline)) void *my_pool_alloc(size_t n) {
    void *p;
    CHECK(cudaMalloc(&p, n));
    return p;
}
__attribute__((noinline)) void my_pool_free(void *p) { CHECK(cudaFree(p)); }
__attribute__((noinline)) void train_step() {
    void *a = my_pool_alloc(1 << 20); // WRAPPER_CALLER_LINE
    my_pool_free(a);
}
static int wrapper() {
    for (int i = 0; i < 3; i++) train_step();
    return 0;
}

static int threads() {
    std::vector<std::thread> ts;
    for (int i = 0; i < 4; i++)
        ts.emplace_back([i] {
            pthread_setname_np(pthread_self(), ("worker-" + std::to_string(i)).c_str());
            void *p;
            CHECK(cudaMalloc(&p, (size_t)(i + 1) << 20));
        });
    for (auto &t : ts) t.join();
    return 0;
}

static int reset() {
    void *a, *b;
    CHECK(cudaMalloc(&a, 1 << 20));
    CHECK(cudaMallocManaged(&b, 2 << 20));
    CHECK(cudaDeviceReset());
    void *c;
    CHECK(cudaMalloc(&c, 4 << 20));
    CHECK(cudaFree(c));
    return 0;
}

static int stream_ordered() {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    void *a, *b;
    CHECK(cudaMallocAsync(&a, 1 << 20, s));
    CHECK(cudaMallocAsync(&b, 2 << 20, s));
    CHECK(cudaFreeAsync(a, s));
    CHECK(cudaFreeAsync(b, s));
    CHECK(cudaStreamSynchronize(s));
    return 0;
}

static int vmm() {
    CHECK(cudaFree(0));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    DCHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t sz = gran;
    CUdeviceptr va;
    DCHECK(cuMemAddressReserve(&va, 4 * sz, 0, 0, 0));
    CUmemGenericAllocationHandle h1, h2;
    DCHECK(cuMemCreate(&h1, sz, &prop, 0));
    DCHECK(cuMemCreate(&h2, sz, &prop, 0));
    DCHECK(cuMemMap(va, sz, 0, h1, 0));
    DCHECK(cuMemMap(va + sz, sz, 0, h2, 0));
    DCHECK(cuMemRelease(h1));
    DCHECK(cuMemRelease(h2));
    DCHECK(cuMemUnmap(va, sz)); // h1 freed here
    printf("vmm granularity %zu\n", sz);
    return 0; // h2 still mapped: live at exit
}

static int oom() {
    size_t free_b, total_b;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    void *p;
    cudaError_t e = cudaMalloc(&p, total_b * 2);
    printf("huge allocation returned %d (%s), requested %zu\n", e, cudaGetErrorName(e), total_b * 2);
    return e == cudaErrorMemoryAllocation ? 0 : 1;
}

static int sigkill() {
    void *p;
    CHECK(cudaMalloc(&p, 12345));
    raise(SIGKILL);
    return 0;
}

static int kinds() {
    void *d, *m, *h;
    size_t pitch;
    CHECK(cudaMallocPitch(&d, &pitch, 1000, 10));
    CHECK(cudaMallocManaged(&m, 1 << 20));
    CHECK(cudaMallocHost(&h, 1 << 16));
    cudaArray_t arr;
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<float4>();
    CHECK(cudaMallocArray(&arr, &desc, 256, 128));
    CHECK(cudaFree(d));
    CHECK(cudaFree(m));
    CHECK(cudaFreeHost(h));
    CHECK(cudaFreeArray(arr));
    return 0;
}

static int bench(int n) {
    CHECK(cudaFree(0));
    void *p;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; i++) {
        cudaMalloc(&p, 256);
        cudaFree(p);
    }
    auto t1 = std::chrono::steady_clock::now();
    double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    printf("pairs=%d ns_per_pair=%.1f\n", n, ns / n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    std::string s = argv[1];
    if (s == "leak_exception") return leak_exception();
    if (s == "async_free") return async_free();
    if (s == "wrapper") return wrapper();
    if (s == "threads") return threads();
    if (s == "reset") return reset();
    if (s == "stream_ordered") return stream_ordered();
    if (s == "vmm") return vmm();
    if (s == "oom") return oom();
    if (s == "sigkill") return sigkill();
    if (s == "kinds") return kinds();
    if (s == "bench") return bench(argc > 2 ? atoi(argv[2]) : 20000);
    fprintf(stderr, "unknown scenario %s\n", argv[1]);
    return 2;
}
