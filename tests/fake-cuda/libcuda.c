/* Fake libcuda.so.1 for gpucollect's tests: no GPU, bookkeeping only.
 *
 * cuInit loads $CUDA_INJECTION64_PATH with dlopen and calls its InitializeInjection, as the real
 * driver does. Every memory API invokes the CUPTI callback subscribed through the fake libcupti at
 * ENTER and EXIT with a CUpti_CallbackData and the documented parameter struct.
 *
 * Environment: FAKE_CUDA_DEVICES (default 2), FAKE_CUDA_MEM_BYTES per device (default 1 GiB). */
#define _GNU_SOURCE
#include "fake_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fake_ctx {
    int device;
    uint32_t uid;
};
struct fake_stream {
    int id;
};
struct fake_array {
    size_t bytes;
    CUdeviceptr addr;
};
/* A stream-ordered memory pool: `used` is what its live allocations hold, `reserved` what it
 * holds from the device, grown in 2 MiB chunks and kept after frees until cuMemPoolTrimTo. */
struct fake_pool {
    int device;
    int live;
    size_t used, used_high, reserved, reserved_high;
};
struct fake_graph {
    int unused;
};

/* Parameter structs, as laid out in the driver's generated_cuda_meta.h. */
typedef struct { CUdeviceptr *dptr; size_t bytesize; } cuMemAlloc_v2_params;
typedef struct { CUdeviceptr *dptr; size_t *pPitch; size_t WidthInBytes; size_t Height; unsigned int ElementSizeBytes; } cuMemAllocPitch_v2_params;
typedef struct { CUdeviceptr *dptr; size_t bytesize; unsigned int flags; } cuMemAllocManaged_params;
typedef struct { CUdeviceptr dptr; } cuMemFree_v2_params;
typedef struct { void **pp; size_t bytesize; } cuMemAllocHost_v2_params;
typedef struct { void **pp; size_t bytesize; unsigned int Flags; } cuMemHostAlloc_params;
typedef struct { void *p; } cuMemFreeHost_params;
typedef struct { void *p; size_t bytesize; unsigned int Flags; } cuMemHostRegister_v2_params;
typedef struct { void *p; } cuMemHostUnregister_params;
typedef struct { CUdeviceptr *dptr; size_t bytesize; CUstream hStream; } cuMemAllocAsync_params;
typedef struct { CUdeviceptr *dptr; size_t bytesize; CUmemoryPool pool; CUstream hStream; } cuMemAllocFromPoolAsync_params;
typedef struct { CUdeviceptr dptr; CUstream hStream; } cuMemFreeAsync_params;
typedef struct { CUdeviceptr *ptr; size_t size; size_t alignment; CUdeviceptr addr; unsigned long long flags; } cuMemAddressReserve_params;
typedef struct { CUdeviceptr ptr; size_t size; } cuMemAddressFree_params;
typedef struct { CUmemGenericAllocationHandle *handle; size_t size; const CUmemAllocationProp *prop; unsigned long long flags; } cuMemCreate_params;
typedef struct { CUmemGenericAllocationHandle handle; } cuMemRelease_params;
typedef struct { CUdeviceptr ptr; size_t size; size_t offset; CUmemGenericAllocationHandle handle; unsigned long long flags; } cuMemMap_params;
typedef struct { CUdeviceptr ptr; size_t size; } cuMemUnmap_params;
typedef struct { CUarray *pHandle; const CUDA_ARRAY_DESCRIPTOR *pAllocateArray; } cuArrayCreate_v2_params;
typedef struct { CUarray hArray; } cuArrayDestroy_params;
typedef struct { CUcontext ctx; } cuCtxDestroy_v2_params;
typedef struct { CUdevice dev; } cuDevicePrimaryCtxReset_v2_params;
typedef struct { CUdeviceptr *pdptr; CUipcMemHandle handle; unsigned int Flags; } cuIpcOpenMemHandle_v2_params;
typedef struct { CUdeviceptr dptr; } cuIpcCloseMemHandle_params;
typedef struct { size_t *free; size_t *total; } cuMemGetInfo_v2_params;
typedef struct { CUmemoryPool *pool; const CUmemPoolProps *poolProps; } cuMemPoolCreate_params;
typedef struct { CUmemoryPool pool; } cuMemPoolDestroy_params;
typedef struct { CUmemoryPool pool; size_t minBytesToKeep; } cuMemPoolTrimTo_params;
typedef struct { CUgraphNode *phGraphNode; CUgraph hGraph; const CUgraphNode *dependencies; size_t numDependencies; CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams; } cuGraphAddMemAllocNode_params;

#define MAX_DEVICES 8

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_initialized;
static int g_device_count = 2;
static size_t g_mem_bytes = (size_t)1 << 30;
static size_t g_used[MAX_DEVICES];
static struct fake_ctx g_primary[MAX_DEVICES];
static uint32_t g_next_uid = 1;
static uint32_t g_next_corr = 1;
static __thread CUcontext t_current;

static CUpti_CallbackFunc g_cb;
static void *g_cb_userdata;
static unsigned char g_enabled[1024];

/* Live allocations (device memory, pinned host, VMM handles, arrays). */
struct block {
    CUdeviceptr addr;
    size_t size;
    int device;
    int live;
    struct fake_pool *pool;
};
#define POOL_CHUNK ((size_t)2 << 20)
#define MAX_POOLS 16
static struct fake_pool g_default_pool[MAX_DEVICES];
static struct fake_pool g_pools[MAX_POOLS];
/* Graph memory per device (cuGraphAddMemAllocNode), kept until cuDeviceGraphMemTrim. */
static size_t g_graph_used[MAX_DEVICES], g_graph_reserved[MAX_DEVICES];
static size_t g_graph_used_high[MAX_DEVICES], g_graph_reserved_high[MAX_DEVICES];

static size_t chunks(size_t n) { return (n + POOL_CHUNK - 1) / POOL_CHUNK * POOL_CHUNK; }
static struct block *g_blocks;
static size_t g_nblocks, g_cap;
static CUdeviceptr g_next_addr[MAX_DEVICES];

void fake_cuda_subscribe(CUpti_CallbackFunc cb, void *userdata) {
    g_cb = cb;
    g_cb_userdata = userdata;
}

void fake_cuda_enable_callback(uint32_t enable, uint32_t domain, uint32_t cbid) {
    if (domain == 1 && cbid < sizeof g_enabled)
        g_enabled[cbid] = enable ? 1 : 0;
}

int fake_cuda_context_device(CUcontext ctx) { return ctx ? ctx->device : -1; }

static void load_injection(void) {
    const char *e = getenv("FAKE_CUDA_DEVICES");
    if (e && *e) g_device_count = atoi(e);
    if (g_device_count > MAX_DEVICES) g_device_count = MAX_DEVICES;
    e = getenv("FAKE_CUDA_MEM_BYTES");
    if (e && *e) g_mem_bytes = strtoull(e, NULL, 0);
    for (int d = 0; d < MAX_DEVICES; d++) {
        g_primary[d].device = d;
        g_primary[d].uid = g_next_uid++;
        g_next_addr[d] = 0x7f0000000000ULL + ((CUdeviceptr)d << 36);
    }
    g_initialized = 1;
    const char *path = getenv("CUDA_INJECTION64_PATH");
    if (!path || !*path) return;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "fake libcuda: cannot load the injection library: %s\n", dlerror());
        return;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "InitializeInjection");
    if (!init) {
        fprintf(stderr, "fake libcuda: %s has no InitializeInjection\n", path);
        return;
    }
    init();
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    pthread_once(&g_once, load_injection);
    return CUDA_SUCCESS;
}

struct call {
    CUpti_CallbackData d;
    uint64_t corr_data;
    CUresult ret;
    uint32_t cbid;
};

static void call_enter(struct call *c, uint32_t cbid, const char *name, const void *params) {
    memset(c, 0, sizeof *c);
    c->cbid = cbid;
    c->d.callbackSite = 0;
    c->d.functionName = name;
    c->d.functionParams = params;
    c->d.functionReturnValue = &c->ret;
    c->d.context = t_current;
    c->d.contextUid = t_current ? t_current->uid : 0;
    c->d.correlationData = &c->corr_data;
    c->d.correlationId = __atomic_fetch_add(&g_next_corr, 1, __ATOMIC_RELAXED);
    if (g_cb && g_enabled[cbid]) g_cb(g_cb_userdata, 1, cbid, &c->d);
}

static CUresult call_exit(struct call *c, CUresult r) {
    c->ret = r;
    c->d.callbackSite = 1;
    if (g_cb && g_enabled[c->cbid]) g_cb(g_cb_userdata, 1, c->cbid, &c->d);
    return r;
}

#define API(cbid, params) \
    struct call c_;       \
    call_enter(&c_, CBID_##cbid, #cbid, &(params))
#define RETURN(r) return call_exit(&c_, (r))

static int cur_device(void) { return t_current ? t_current->device : -1; }

/* Allocates `size` bytes on device `dev` (dev < 0: host memory, unlimited), from `pool` if set. */
static CUresult block_alloc_in(int dev, size_t size, CUdeviceptr *out, struct fake_pool *pool) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_lock);
    int acct = dev < 0 ? 0 : dev;
    if (dev >= 0 && g_used[dev] + size > g_mem_bytes) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t rounded = (size + 511) & ~(size_t)511;
    CUdeviceptr addr = 0;
    /* Reuse a freed block of the same size and device, like a real allocator would. */
    for (size_t i = 0; i < g_nblocks; i++) {
        if (!g_blocks[i].live && g_blocks[i].device == dev && g_blocks[i].size == size) {
            g_blocks[i].live = 1;
            g_blocks[i].pool = pool;
            addr = g_blocks[i].addr;
            break;
        }
    }
    if (!addr) {
        if (g_nblocks == g_cap) {
            g_cap = g_cap ? g_cap * 2 : 1024;
            g_blocks = realloc(g_blocks, g_cap * sizeof *g_blocks);
        }
        addr = g_next_addr[acct];
        if (dev < 0) {
            static CUdeviceptr host_next = 0x500000000000ULL;
            addr = host_next;
            host_next += rounded ? rounded : 512;
        } else {
            g_next_addr[acct] += rounded ? rounded : 512;
        }
        g_blocks[g_nblocks++] = (struct block){addr, size, dev, 1, pool};
    }
    if (dev >= 0) g_used[dev] += size;
    if (pool) {
        pool->used += size;
        if (pool->used > pool->used_high) pool->used_high = pool->used;
        if (pool->used > pool->reserved) pool->reserved = chunks(pool->used);
        if (pool->reserved > pool->reserved_high) pool->reserved_high = pool->reserved;
    }
    pthread_mutex_unlock(&g_lock);
    *out = addr;
    return CUDA_SUCCESS;
}

static CUresult block_alloc(int dev, size_t size, CUdeviceptr *out) {
    return block_alloc_in(dev, size, out, NULL);
}

static CUresult block_free(CUdeviceptr addr) {
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nblocks; i++) {
        if (g_blocks[i].live && g_blocks[i].addr == addr) {
            g_blocks[i].live = 0;
            if (g_blocks[i].pool) g_blocks[i].pool->used -= g_blocks[i].size;
            if (g_blocks[i].device >= 0) g_used[g_blocks[i].device] -= g_blocks[i].size;
            pthread_mutex_unlock(&g_lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_ERROR_INVALID_VALUE;
}

static void free_device(int dev) {
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nblocks; i++)
        if (g_blocks[i].live && g_blocks[i].device == dev) g_blocks[i].live = 0;
    g_used[dev] = 0;
    pthread_mutex_unlock(&g_lock);
}

CUresult cuDeviceGetCount(int *count) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    *count = g_device_count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (ordinal < 0 || ordinal >= g_device_count) return CUDA_ERROR_INVALID_VALUE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    if (dev < 0 || dev >= g_device_count) return CUDA_ERROR_INVALID_VALUE;
    *ctx = &g_primary[dev];
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    if (dev < 0 || dev >= g_device_count) return CUDA_ERROR_INVALID_VALUE;
    struct fake_ctx *c = calloc(1, sizeof *c);
    c->device = dev;
    c->uid = __atomic_fetch_add(&g_next_uid, 1, __ATOMIC_RELAXED);
    t_current = c;
    *ctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    t_current = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
    *ctx = t_current;
    return CUDA_SUCCESS;
}

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
    (void)flags;
    return peer ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }

CUresult cuStreamCreate(CUstream *stream, unsigned int flags) {
    (void)flags;
    static int next = 1;
    struct fake_stream *s = calloc(1, sizeof *s);
    s->id = next++;
    *stream = s;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, CUstream stream, void **params,
                        void **extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem;
    (void)stream; (void)params; (void)extra;
    return t_current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT; /* "asynchronous": returns at once */
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    cuCtxDestroy_v2_params p = {ctx};
    API(cuCtxDestroy_v2, p);
    if (!ctx) RETURN(CUDA_ERROR_INVALID_CONTEXT);
    free_device(ctx->device);
    if (t_current == ctx) t_current = NULL;
    RETURN(CUDA_SUCCESS);
}

/* Legacy entry points (what old binaries resolve), with their own callback ids. */
CUresult cuCtxDestroy(CUcontext ctx) {
    cuCtxDestroy_v2_params p = {ctx};
    API(cuCtxDestroy, p);
    if (!ctx) RETURN(CUDA_ERROR_INVALID_CONTEXT);
    free_device(ctx->device);
    if (t_current == ctx) t_current = NULL;
    RETURN(CUDA_SUCCESS);
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
    cuDevicePrimaryCtxReset_v2_params p = {dev};
    API(cuDevicePrimaryCtxReset, p);
    if (dev < 0 || dev >= g_device_count) RETURN(CUDA_ERROR_INVALID_VALUE);
    free_device(dev);
    RETURN(CUDA_SUCCESS);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    cuDevicePrimaryCtxReset_v2_params p = {dev};
    API(cuDevicePrimaryCtxReset_v2, p);
    if (dev < 0 || dev >= g_device_count) RETURN(CUDA_ERROR_INVALID_VALUE);
    free_device(dev);
    RETURN(CUDA_SUCCESS);
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    cuMemGetInfo_v2_params p = {free_bytes, total_bytes};
    API(cuMemGetInfo_v2, p);
    int d = cur_device();
    if (d < 0) RETURN(CUDA_ERROR_INVALID_CONTEXT);
    *free_bytes = g_mem_bytes - g_used[d];
    *total_bytes = g_mem_bytes;
    RETURN(CUDA_SUCCESS);
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    cuMemAlloc_v2_params p = {dptr, bytesize};
    API(cuMemAlloc_v2, p);
    if (cur_device() < 0) RETURN(CUDA_ERROR_INVALID_CONTEXT);
    RETURN(block_alloc(cur_device(), bytesize, dptr));
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned int elem) {
    cuMemAllocPitch_v2_params p = {dptr, pitch, width, height, elem};
    API(cuMemAllocPitch_v2, p);
    if (cur_device() < 0) RETURN(CUDA_ERROR_INVALID_CONTEXT);
    *pitch = (width + 511) & ~(size_t)511;
    RETURN(block_alloc(cur_device(), *pitch * height, dptr));
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    cuMemAllocManaged_params p = {dptr, bytesize, flags};
    API(cuMemAllocManaged, p);
    if (cur_device() < 0) RETURN(CUDA_ERROR_INVALID_CONTEXT);
    RETURN(block_alloc(cur_device(), bytesize, dptr));
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    cuMemFree_v2_params p = {dptr};
    API(cuMemFree_v2, p);
    RETURN(block_free(dptr));
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
    cuMemAllocHost_v2_params p = {pp, bytesize};
    API(cuMemAllocHost_v2, p);
    CUdeviceptr a = 0;
    CUresult r = block_alloc(-1, bytesize, &a);
    *pp = (void *)(uintptr_t)a;
    RETURN(r);
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
    cuMemHostAlloc_params p = {pp, bytesize, flags};
    API(cuMemHostAlloc, p);
    CUdeviceptr a = 0;
    CUresult r = block_alloc(-1, bytesize, &a);
    *pp = (void *)(uintptr_t)a;
    RETURN(r);
}

CUresult cuMemFreeHost(void *ptr) {
    cuMemFreeHost_params p = {ptr};
    API(cuMemFreeHost, p);
    RETURN(block_free((CUdeviceptr)(uintptr_t)ptr));
}

/* Page-locks existing host memory: no bookkeeping, like the driver it allocates nothing. */
CUresult cuMemHostRegister_v2(void *ptr, size_t bytesize, unsigned int flags) {
    cuMemHostRegister_v2_params p = {ptr, bytesize, flags};
    API(cuMemHostRegister_v2, p);
    RETURN(ptr && bytesize ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

CUresult cuMemHostUnregister(void *ptr) {
    cuMemHostUnregister_params p = {ptr};
    API(cuMemHostUnregister, p);
    RETURN(ptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    cuMemAllocAsync_params p = {dptr, bytesize, stream};
    API(cuMemAllocAsync, p);
    if (cur_device() < 0) RETURN(CUDA_ERROR_INVALID_CONTEXT);
    RETURN(block_alloc_in(cur_device(), bytesize, dptr, &g_default_pool[cur_device()]));
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream stream) {
    cuMemAllocFromPoolAsync_params p = {dptr, bytesize, pool, stream};
    API(cuMemAllocFromPoolAsync, p);
    if (cur_device() < 0) RETURN(CUDA_ERROR_INVALID_CONTEXT);
    if (!pool || !pool->live) RETURN(CUDA_ERROR_INVALID_VALUE);
    RETURN(block_alloc_in(pool->device, bytesize, dptr, pool));
}

/* Stream capture (fake_cuda.h): global-mode captures in progress, whether one was invalidated,
 * and each thread's interaction mode and capture. */
static int g_global_captures;
static int g_capture_invalidated;
static __thread int t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static __thread int t_capturing;

/* A potentially unsafe call: nonzero (and the capture invalidated) when another thread
 * captures in global mode and this one is not relaxed. */
static int prohibited_during_capture(void) {
    pthread_mutex_lock(&g_lock);
    int no = g_global_captures > 0 && !t_capturing &&
             t_capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    if (no) g_capture_invalidated = 1;
    pthread_mutex_unlock(&g_lock);
    return no;
}

CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    if (!mode || *mode < 0 || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    int old = t_capture_mode;
    t_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2(CUstream stream, int mode) {
    (void)stream;
    if (t_capturing) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
        g_global_captures++;
        t_capturing = 1;
    }
    g_capture_invalidated = 0;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph) {
    (void)stream;
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (t_capturing) {
        g_global_captures--;
        t_capturing = 0;
    }
    int invalidated = g_capture_invalidated;
    pthread_mutex_unlock(&g_lock);
    if (invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    return cuGraphCreate(graph, 0);
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (prohibited_during_capture()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    if (dev < 0 || dev >= g_device_count) return CUDA_ERROR_INVALID_VALUE;
    g_default_pool[dev].device = dev;
    g_default_pool[dev].live = 1;
    *pool = &g_default_pool[dev];
    return CUDA_SUCCESS;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    cuMemPoolCreate_params p = {pool, props};
    API(cuMemPoolCreate, p);
    if (!props || props->location.id < 0 || props->location.id >= g_device_count)
        RETURN(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < MAX_POOLS; i++) {
        if (!g_pools[i].live) {
            g_pools[i] = (struct fake_pool){.device = props->location.id, .live = 1};
            *pool = &g_pools[i];
            pthread_mutex_unlock(&g_lock);
            RETURN(CUDA_SUCCESS);
        }
    }
    pthread_mutex_unlock(&g_lock);
    RETURN(CUDA_ERROR_OUT_OF_MEMORY);
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    cuMemPoolDestroy_params p = {pool};
    API(cuMemPoolDestroy, p);
    if (!pool || !pool->live || pool < g_pools || pool >= g_pools + MAX_POOLS)
        RETURN(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&g_lock);
    pool->live = 0;
    pthread_mutex_unlock(&g_lock);
    RETURN(CUDA_SUCCESS);
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    cuMemPoolTrimTo_params p = {pool, minBytesToKeep};
    API(cuMemPoolTrimTo, p);
    if (!pool || !pool->live) RETURN(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&g_lock);
    size_t keep = chunks(pool->used);
    if (pool->reserved > keep) {
        size_t min_keep = minBytesToKeep < pool->reserved ? chunks(minBytesToKeep) : pool->reserved;
        pool->reserved = keep > min_keep ? keep : min_keep;
    }
    pthread_mutex_unlock(&g_lock);
    RETURN(CUDA_SUCCESS);
}

/* Not a traced API (no callback): the injection library polls it from its own thread. */
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value) {
    if (!pool || !pool->live || !value) return CUDA_ERROR_INVALID_VALUE;
    if (prohibited_during_capture()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    uint64_t v;
    pthread_mutex_lock(&g_lock);
    switch (attr) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: v = pool->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: v = pool->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: v = pool->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: v = pool->used_high; break;
    default: pthread_mutex_unlock(&g_lock); return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&g_lock);
    *(uint64_t *)value = v;
    return CUDA_SUCCESS;
}

CUresult cuGraphCreate(CUgraph *graph, unsigned int flags) {
    (void)flags;
    static struct fake_graph g;
    *graph = &g;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    cuGraphAddMemAllocNode_params p = {node, graph, deps, ndeps, params};
    API(cuGraphAddMemAllocNode, p);
    if (!params || !graph) RETURN(CUDA_ERROR_INVALID_VALUE);
    int dev = params->poolProps.location.id;
    if (dev < 0 || dev >= g_device_count) RETURN(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&g_lock);
    params->dptr = g_next_addr[dev];
    g_next_addr[dev] += chunks(params->bytesize);
    g_graph_used[dev] += params->bytesize;
    if (g_graph_used[dev] > g_graph_used_high[dev]) g_graph_used_high[dev] = g_graph_used[dev];
    g_graph_reserved[dev] += chunks(params->bytesize);
    if (g_graph_reserved[dev] > g_graph_reserved_high[dev])
        g_graph_reserved_high[dev] = g_graph_reserved[dev];
    pthread_mutex_unlock(&g_lock);
    *node = (CUgraphNode)(uintptr_t)params->dptr;
    RETURN(CUDA_SUCCESS);
}

/* Graph memory is "freed" here when the program says so; reserved stays until the trim. */
CUresult fake_cuda_graph_free(CUdevice dev, size_t bytes) {
    pthread_mutex_lock(&g_lock);
    g_graph_used[dev] -= bytes < g_graph_used[dev] ? bytes : g_graph_used[dev];
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGraphMemTrim(CUdevice dev) {
    if (dev < 0 || dev >= g_device_count) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    g_graph_reserved[dev] = chunks(g_graph_used[dev]);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *value) {
    if (dev < 0 || dev >= g_device_count || !value) return CUDA_ERROR_INVALID_VALUE;
    if (prohibited_during_capture()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    uint64_t v;
    pthread_mutex_lock(&g_lock);
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: v = g_graph_used[dev]; break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: v = g_graph_used_high[dev]; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: v = g_graph_reserved[dev]; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: v = g_graph_reserved_high[dev]; break;
    default: pthread_mutex_unlock(&g_lock); return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&g_lock);
    *(uint64_t *)value = v;
    return CUDA_SUCCESS;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    cuMemFreeAsync_params p = {dptr, stream};
    API(cuMemFreeAsync, p);
    RETURN(block_free(dptr));
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    cuMemAddressReserve_params p = {ptr, size, alignment, addr, flags};
    API(cuMemAddressReserve, p);
    static CUdeviceptr next = 0x600000000000ULL;
    pthread_mutex_lock(&g_lock);
    *ptr = next;
    next += (size + 0xfffff) & ~(size_t)0xfffff;
    pthread_mutex_unlock(&g_lock);
    RETURN(CUDA_SUCCESS);
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    cuMemAddressFree_params p = {ptr, size};
    API(cuMemAddressFree, p);
    RETURN(CUDA_SUCCESS);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    cuMemCreate_params p = {handle, size, prop, flags};
    API(cuMemCreate, p);
    int dev = prop->location.type == 1 ? prop->location.id : -1;
    CUdeviceptr h = 0;
    CUresult r = block_alloc(dev, size, &h);
    *handle = h;
    RETURN(r);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    cuMemRelease_params p = {handle};
    API(cuMemRelease, p);
    RETURN(block_free(handle));
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    cuMemMap_params p = {ptr, size, offset, handle, flags};
    API(cuMemMap, p);
    RETURN(CUDA_SUCCESS);
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    cuMemUnmap_params p = {ptr, size};
    API(cuMemUnmap, p);
    RETURN(CUDA_SUCCESS);
}

static size_t format_bytes(unsigned int f) {
    switch (f) {
    case 0x01: case 0x08: return 1;
    case 0x02: case 0x09: case 0x10: return 2;
    default: return 4;
    }
}

CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc) {
    cuArrayCreate_v2_params p = {arr, desc};
    API(cuArrayCreate_v2, p);
    if (cur_device() < 0) RETURN(CUDA_ERROR_INVALID_CONTEXT);
    struct fake_array *a = calloc(1, sizeof *a);
    a->bytes = desc->Width * (desc->Height ? desc->Height : 1) * desc->NumChannels *
               format_bytes(desc->Format);
    CUresult r = block_alloc(cur_device(), a->bytes, &a->addr);
    *arr = a;
    RETURN(r);
}

CUresult cuArrayDestroy(CUarray arr) {
    cuArrayDestroy_params p = {arr};
    API(cuArrayDestroy, p);
    RETURN(block_free(arr->addr));
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
    cuIpcOpenMemHandle_v2_params p = {pdptr, handle, flags};
    API(cuIpcOpenMemHandle_v2, p);
    memcpy(pdptr, handle.reserved, sizeof *pdptr);
    RETURN(CUDA_SUCCESS);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    cuIpcCloseMemHandle_params p = {dptr};
    API(cuIpcCloseMemHandle, p);
    RETURN(CUDA_SUCCESS);
}
