/* Test programs for gpucollect, run against the fake libcuda.so.1: `scenarios NAME`.
 * Each scenario plants a known pattern (leak, teardown, failure...) that the Rust tests in
 * collector/tests/ assert on in the decoded trace. Built with -O0 -g -fno-omit-frame-pointer so
 * the call sites symbolize to the lines below. Exit code 0 unless the scenario says otherwise. */
#define _GNU_SOURCE
#include "fake_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(x)                                                                 \
    do {                                                                         \
        CUresult r_ = (x);                                                       \
        if (r_ != CUDA_SUCCESS) {                                                \
            fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, r_); \
            exit(90);                                                            \
        }                                                                        \
    } while (0)

static CUcontext use_device(int dev) {
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    return ctx;
}

static void setup(void) {
    CHECK(cuInit(0));
    use_device(0);
}

/* --- leak on an error path ------------------------------------------------ */
static jmp_buf on_error;

__attribute__((noinline)) static void load_batch(int fail) {
    CUdeviceptr buf;
    CHECK(cuMemAlloc_v2(&buf, 3 << 20)); /* LEAK_LINE */
    if (fail) longjmp(on_error, 1);       /* "throws": skips the free below */
    CHECK(cuMemFree_v2(buf));
}

static int leak_exception(void) {
    setup();
    load_batch(0);
    if (setjmp(on_error) == 0) load_batch(1);
    return 0;
}

/* --- free right after an asynchronous kernel launch ----------------------- */
static int async_free(void) {
    setup();
    CUdeviceptr buf;
    CHECK(cuMemAlloc_v2(&buf, 1 << 20));
    CHECK(cuLaunchKernel((CUfunction)0x1, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CHECK(cuMemFree_v2(buf)); /* the driver orders it after the kernel: not a leak */
    CHECK(cuCtxSynchronize());
    return 0;
}

/* --- custom allocator wrapper --------------------------------------------- */
__attribute__((noinline)) static CUdeviceptr my_pool_alloc(size_t n) {
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, n));
    return p;
}

__attribute__((noinline)) static void my_pool_free(CUdeviceptr p) { CHECK(cuMemFree_v2(p)); }

__attribute__((noinline)) static void train_step(void) {
    CUdeviceptr a = my_pool_alloc(4096); /* WRAPPER_CALLER_LINE */
    my_pool_free(a);
}

static int wrapper(void) {
    setup();
    for (int i = 0; i < 3; i++) train_step();
    return 0;
}

/* --- two devices with peer access ----------------------------------------- */
static int two_devices(void) {
    CHECK(cuInit(0));
    CUcontext c0 = use_device(0);
    CUcontext c1 = use_device(1);
    CHECK(cuCtxSetCurrent(c0));
    CHECK(cuCtxEnablePeerAccess(c1, 0));
    CUdeviceptr a, b, c;
    CHECK(cuMemAlloc_v2(&a, 1000));
    CHECK(cuMemAlloc_v2(&b, 2000));
    CHECK(cuCtxSetCurrent(c1));
    CHECK(cuCtxEnablePeerAccess(c0, 0));
    CHECK(cuMemAlloc_v2(&c, 5000));
    CHECK(cuCtxSetCurrent(c0));
    CHECK(cuMemFree_v2(a));
    return 0; /* live at exit: 2000 on device 0, 5000 on device 1 */
}

/* --- threads that allocate and exit without freeing ----------------------- */
static void *thread_body(void *arg) {
    char name[16];
    snprintf(name, sizeof name, "worker-%d", (int)(intptr_t)arg);
    prctl(PR_SET_NAME, name);
    use_device(0);
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 1000 * (1 + (size_t)(intptr_t)arg)));
    return NULL;
}

static int threads(void) {
    setup();
    pthread_t t[4];
    for (intptr_t i = 0; i < 4; i++) pthread_create(&t[i], NULL, thread_body, (void *)i);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    return 0;
}

/* --- device reset frees everything ---------------------------------------- */
static int reset(void) {
    setup();
    CUdeviceptr a, b;
    CHECK(cuMemAlloc_v2(&a, 1 << 20));
    CHECK(cuMemAllocManaged(&b, 2 << 20, 1));
    CHECK(cuDevicePrimaryCtxReset_v2(0));
    use_device(0);
    CUdeviceptr c;
    CHECK(cuMemAlloc_v2(&c, 4096));
    CHECK(cuMemFree_v2(c));
    return 0;
}

/* --- context destroy through the legacy entry points, on device 1 ---------- */
static int ctx_destroy(void) {
    CHECK(cuInit(0));
    CUcontext c1;
    CHECK(cuCtxCreate_v2(&c1, 0, 1));
    CUdeviceptr a, b;
    CHECK(cuMemAlloc_v2(&a, 5000));
    use_device(0);
    CHECK(cuMemAlloc_v2(&b, 7000));
    CHECK(cuCtxDestroy(c1)); /* frees device 1's memory only */
    CHECK(cuDevicePrimaryCtxReset(0));
    return 0;
}

/* --- stream-ordered allocation -------------------------------------------- */
static int stream_ordered(void) {
    setup();
    CUstream s;
    CHECK(cuStreamCreate(&s, 0));
    CUdeviceptr a, b;
    CUmemPoolProps props = {0};
    props.allocType = 1;
    props.location.type = 1;
    props.location.id = 0;
    CUmemoryPool pool;
    CHECK(cuMemPoolCreate(&pool, &props));
    CHECK(cuMemAllocAsync(&a, 1 << 16, s));
    CHECK(cuMemAllocFromPoolAsync(&b, 1 << 17, pool, s));
    CHECK(cuMemFreeAsync(a, s));
    CHECK(cuMemFreeAsync(b, s));
    return 0;
}

/* --- pools and graph memory: reserved vs used, polled by the injection library ----------- */
static void settle(void) {
    struct timespec t = {0, 200 * 1000 * 1000}; /* four poller intervals of 50 ms */
    nanosleep(&t, NULL);
}

static int pools(void) {
    setup(); /* device 0 is current */
    CUstream s;
    CHECK(cuStreamCreate(&s, 0));
    CUdeviceptr a, b, c;
    CHECK(cuMemAllocAsync(&a, 3 << 20, s)); /* default pool, device 0: used 3, reserved 4 MiB */
    CUmemPoolProps props = {0};
    props.allocType = 1;
    props.location.type = 1;
    props.location.id = 1; /* a pool on device 1, used from device 0's context */
    CUmemoryPool pool;
    CHECK(cuMemPoolCreate(&pool, &props));
    CHECK(cuMemAllocFromPoolAsync(&b, 5 << 20, pool, s)); /* used 5, reserved 6 MiB */
    CHECK(cuMemAllocFromPoolAsync(&c, 1 << 20, pool, s)); /* used 6, reserved 6 MiB */
    settle();
    CHECK(cuMemFreeAsync(b, s)); /* used 1, reserved 6 MiB: the pool keeps the memory */
    settle();
    CHECK(cuMemPoolTrimTo(pool, 0)); /* used 1, reserved 2 MiB */
    settle();
    CUgraph g;
    CHECK(cuGraphCreate(&g, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS np = {0};
    np.poolProps.allocType = 1;
    np.poolProps.location.type = 1;
    np.poolProps.location.id = 0;
    np.bytesize = 3 << 20;
    CUgraphNode node;
    CHECK(cuGraphAddMemAllocNode(&node, g, NULL, 0, &np)); /* graph memory: used 3, reserved 4 */
    settle();
    CHECK(fake_cuda_graph_free(0, 3 << 20));
    CHECK(cuDeviceGraphMemTrim(0)); /* graph memory: used 0, reserved 0 */
    settle();
    CHECK(cuMemFreeAsync(a, s));
    CHECK(cuMemFreeAsync(c, s));
    CHECK(cuMemPoolDestroy(pool));
    settle();
    return 0;
}

/* --- a graph captured in global mode while the injection library polls the pools --------- */
static int capture(void) {
    setup();
    CUstream s;
    CHECK(cuStreamCreate(&s, 0));
    CUdeviceptr a;
    CHECK(cuMemAllocAsync(&a, 1 << 20, s)); /* the default pool is polled from now on */
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    settle(); /* the poller queries the pool during the capture */
    CUgraph g;
    CHECK(cuStreamEndCapture(s, &g));
    printf("capture ok\n");
    fflush(stdout);
    CHECK(cuMemFreeAsync(a, s));
    return 0;
}

/* --- virtual memory management -------------------------------------------- */
static int vmm(void) {
    setup();
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.location.type = 1;
    prop.location.id = 0;
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, 8 << 20, 0, 0, 0));
    CUmemGenericAllocationHandle h1, h2;
    CHECK(cuMemCreate(&h1, 2 << 20, &prop, 0));
    CHECK(cuMemCreate(&h2, 2 << 20, &prop, 0));
    CHECK(cuMemMap(va, 2 << 20, 0, h1, 0));
    CHECK(cuMemMap(va + (2 << 20), 2 << 20, 0, h2, 0));
    CHECK(cuMemRelease(h1)); /* still mapped: memory stays */
    CHECK(cuMemRelease(h2));
    printf("released\n");
    fflush(stdout);
    CHECK(cuMemUnmap(va, 2 << 20)); /* h1 freed here */
    CHECK(cuMemAddressFree(va, 8 << 20));
    return 0; /* h2 still mapped: 2 MiB live at exit */
}

/* --- failed allocation ---------------------------------------------------- */
static int oom(void) {
    setup();
    CUdeviceptr a, b;
    CHECK(cuMemAlloc_v2(&a, 600 << 20));
    CUresult r = cuMemAlloc_v2(&b, 700 << 20); /* 1 GiB device: fails */
    printf("second allocation returned %d\n", r);
    CHECK(cuMemFree_v2(a));
    return r == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 1;
}

/* --- SIGKILL right after an allocation returns ---------------------------- */
static int sigkill(void) {
    setup();
    CUdeviceptr a;
    CHECK(cuMemAlloc_v2(&a, 12345));
    raise(SIGKILL);
    return 0;
}

/* --- other allocation kinds ----------------------------------------------- */
static int kinds(void) {
    setup();
    CUdeviceptr d, m;
    size_t pitch;
    void *h1, *h2;
    CUarray arr;
    CUDA_ARRAY_DESCRIPTOR desc = {256, 128, 0x20, 4};
    CHECK(cuMemAllocPitch_v2(&d, &pitch, 1000, 10, 4));
    CHECK(cuMemAllocManaged(&m, 1 << 20, 1));
    CHECK(cuMemAllocHost_v2(&h1, 1 << 12));
    CHECK(cuMemHostAlloc(&h2, 1 << 13, 0));
    CHECK(cuArrayCreate_v2(&arr, &desc));
    CUipcMemHandle ipc;
    memset(&ipc, 0, sizeof ipc);
    CUdeviceptr imported = 0x7e0000001000ULL;
    memcpy(ipc.reserved, &imported, sizeof imported);
    CUdeviceptr got;
    CHECK(cuIpcOpenMemHandle_v2(&got, ipc, 1));
    CHECK(cuIpcCloseMemHandle(got));
    CHECK(cuMemFree_v2(d));
    CHECK(cuMemFree_v2(m));
    CHECK(cuMemFreeHost(h1));
    CHECK(cuMemFreeHost(h2));
    CHECK(cuArrayDestroy(arr));
    return 0;
}

/* --- page-locked host memory registered by the program ---------------------- */
static int host_register(void) {
    setup();
    size_t n = 3 * 4096 + 100;
    char *buf = malloc(n);
    if (!buf) return 91;
    /* Every flag set, so a read of the size past its field would see them. */
    CHECK(cuMemHostRegister_v2(buf, n, 0xf)); /* HOST_REGISTER_LINE */
    printf("registered %p %zu\n", (void *)buf, n);
    if (cuMemHostRegister_v2(NULL, 4096, 0) != CUDA_ERROR_INVALID_VALUE) return 92;
    CHECK(cuMemHostUnregister(buf));
    free(buf);
    return 0;
}

/* --- stdout and exit code pass-through ------------------------------------ */
static int output(void) {
    setup();
    printf("hello from the traced program\n");
    CUdeviceptr a;
    CHECK(cuMemAlloc_v2(&a, 100));
    CHECK(cuMemFree_v2(a));
    return 3;
}

/* --- fork after cuInit ----------------------------------------------------- */
static int fork_child(void) {
    setup();
    CUdeviceptr a;
    CHECK(cuMemAlloc_v2(&a, 1111));
    pid_t pid = fork();
    if (pid == 0) {
        CUdeviceptr b;
        CHECK(cuMemAlloc_v2(&b, 2222));
        exit(5); /* through exit(): the exit handler reports the status */
    }
    int st;
    waitpid(pid, &st, 0);
    CUdeviceptr c;
    CHECK(cuMemAlloc_v2(&c, 3333));
    return 0;
}

/* --- more traced processes over time than the ring has slots --------------- */
static int many_children(int n) {
    setup();
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            CUdeviceptr p;
            CHECK(cuMemAlloc_v2(&p, 1000 + (size_t)i));
            _exit(0);
        }
        int st;
        waitpid(pid, &st, 0);
        usleep(20000); /* lets the collector notice the exit and recycle the slot */
    }
    return 0;
}

/* --- NVTX ranges and marks ------------------------------------------------ */
void nvtxMarkA(const char *m);
int nvtxRangePushA(const char *m);
int nvtxRangePop(void);
uint64_t nvtxRangeStartA(const char *m);
void nvtxRangeEnd(uint64_t id);
const void *nvtxDomainCreateA(const char *name);
const void *nvtxDomainRegisterStringA(const void *domain, const char *s);
int nvtxDomainRangePushRegistered(const void *domain, const void *string);
int nvtxDomainRangePop(const void *domain);

static int nvtx(void) {
    setup();
    CUdeviceptr a, b, c;
    nvtxRangePushA("epoch");
    CHECK(cuMemAlloc_v2(&a, 100));
    nvtxRangePushA("step");
    CHECK(cuMemAlloc_v2(&b, 200));
    nvtxRangePop();
    nvtxMarkA("checkpoint");
    uint64_t id = nvtxRangeStartA("load");
    CHECK(cuMemAlloc_v2(&c, 300));
    nvtxRangeEnd(id);
    nvtxRangePop();
    const void *dom = nvtxDomainCreateA("trainer");
    const void *fwd = nvtxDomainRegisterStringA(dom, "forward");
    nvtxDomainRangePushRegistered(dom, fwd);
    CUdeviceptr d;
    CHECK(cuMemAlloc_v2(&d, 400));
    CHECK(cuMemFree_v2(d));
    nvtxDomainRangePop(dom);
    CHECK(cuMemFree_v2(a));
    CHECK(cuMemFree_v2(b));
    CHECK(cuMemFree_v2(c));
    return 0;
}

/* --- fork + exec: the child is a new program that initialises CUDA itself --- */
static int fork_exec(const char *self) {
    setup();
    CUdeviceptr a;
    CHECK(cuMemAlloc_v2(&a, 1111));
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "exec_child", (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static int exec_child(void) {
    setup();
    CUdeviceptr b;
    CHECK(cuMemAlloc_v2(&b, 4444));
    return 7;
}

/* --- a module loaded after cuInit ----------------------------------------- */
static int late_dlopen(void) {
    setup();
    char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 32);
    if (n <= 0) return 1;
    path[n] = 0;
    strcpy(strrchr(path, '/') + 1, "libplugin.so");
    void *h = dlopen(path, RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    void (*f)(void) = (void (*)(void))dlsym(h, "plugin_alloc");
    f();
    return 0;
}

/* --- overhead: N alloc/free pairs at call depth D, prints ns per pair -------- */
static int bench_loop(int n);

static volatile int bench_sink;

__attribute__((noinline)) static int bench_at(int depth, int n) {
    int r = depth > 0 ? bench_at(depth - 1, n) : bench_loop(n);
    bench_sink = depth; /* not a tail call: every level keeps its frame */
    return r;
}

static int bench(int n, int depth) {
    setup();
    return bench_at(depth, n);
}

__attribute__((noinline)) static int bench_loop(int n) {
    CUdeviceptr p;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        cuMemAlloc_v2(&p, 256);
        cuMemFree_v2(p);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    printf("pairs=%d ns_per_pair=%.1f events_per_sec=%.0f\n", n, ns / n, 2.0 * n / (ns / 1e9));
    return 0;
}

/* --- endurance: alloc/free pairs at a fixed rate for a duration ------------------
 * Keeps `rate` pairs per second (2 events each) for `seconds`, in slices of 1 ms, and prints one
 * line per second: the pairs done, the slowest single pair (a program stalled by a full ring
 * shows it here) and whether the second kept its rate. Ends with a summary line. */
static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int endurance(int seconds, long rate) {
    setup();
    CUdeviceptr p;
    const long per_ms = rate / 1000 > 0 ? rate / 1000 : 1;
    const double start = now_ns();
    double worst_all = 0;
    int slow_seconds = 0;
    long total = 0;
    for (int s = 0; s < seconds; s++) {
        double worst = 0;
        long done = 0;
        const double second_end = start + (s + 1) * 1e9;
        for (int ms = 0; ms < 1000; ms++) {
            const double slice_end = start + s * 1e9 + (ms + 1) * 1e6;
            for (long i = 0; i < per_ms; i++) {
                const double t0 = now_ns();
                cuMemAlloc_v2(&p, 256);
                cuMemFree_v2(p);
                const double dt = now_ns() - t0;
                if (dt > worst) worst = dt;
            }
            done += per_ms;
            /* Wait for the slice's end: the rate is kept, not exceeded. */
            while (now_ns() < slice_end) {
            }
        }
        const double late_ms = (now_ns() - second_end) / 1e6;
        const int kept = late_ms < 50.0;
        if (!kept) slow_seconds++;
        if (worst > worst_all) worst_all = worst;
        total += done;
        printf("second=%d pairs=%ld worst_pair_us=%.1f late_ms=%.1f kept=%d\n", s + 1, done,
               worst / 1e3, late_ms > 0 ? late_ms : 0.0, kept);
        fflush(stdout);
    }
    printf("endurance seconds=%d pairs=%ld events_per_sec=%.0f worst_pair_us=%.1f slow_seconds=%d\n",
           seconds, total, 2.0 * total / ((now_ns() - start) / 1e9), worst_all / 1e3, slow_seconds);
    return slow_seconds == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: scenarios NAME\n");
        return 2;
    }
    const char *s = argv[1];
    if (!strcmp(s, "leak_exception")) return leak_exception();
    if (!strcmp(s, "async_free")) return async_free();
    if (!strcmp(s, "wrapper")) return wrapper();
    if (!strcmp(s, "two_devices")) return two_devices();
    if (!strcmp(s, "threads")) return threads();
    if (!strcmp(s, "reset")) return reset();
    if (!strcmp(s, "ctx_destroy")) return ctx_destroy();
    if (!strcmp(s, "stream_ordered")) return stream_ordered();
    if (!strcmp(s, "pools")) return pools();
    if (!strcmp(s, "capture")) return capture();
    if (!strcmp(s, "vmm")) return vmm();
    if (!strcmp(s, "oom")) return oom();
    if (!strcmp(s, "sigkill")) return sigkill();
    if (!strcmp(s, "kinds")) return kinds();
    if (!strcmp(s, "output")) return output();
    if (!strcmp(s, "host_register")) return host_register();
    if (!strcmp(s, "fork")) return fork_child();
    if (!strcmp(s, "nvtx")) return nvtx();
    if (!strcmp(s, "dlopen")) return late_dlopen();
    if (!strcmp(s, "many_children")) return many_children(argc > 2 ? atoi(argv[2]) : 100);
    if (!strcmp(s, "fork_exec")) return fork_exec(argv[0]);
    if (!strcmp(s, "exec_child")) return exec_child();
    if (!strcmp(s, "endurance"))
        return endurance(argc > 2 ? atoi(argv[2]) : 60, argc > 3 ? atol(argv[3]) : 1000000);
    if (!strcmp(s, "bench"))
        return bench(argc > 2 ? atoi(argv[2]) : 1000000, argc > 3 ? atoi(argv[3]) : 0);
    fprintf(stderr, "unknown scenario %s\n", s);
    return 2;
}
