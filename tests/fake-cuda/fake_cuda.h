/* Test double of the CUDA driver API and the CUPTI callback API, written for gpucollect's tests.
 *
 * Only what the tests use. Types, callback ids and parameter-struct layouts follow the public
 * CUDA/CUPTI documentation (see /work/shared/design/capture.md); no NVIDIA code is included.
 * The fake driver invokes the subscribed CUPTI callback at ENTER and EXIT of every API below,
 * with a CUpti_CallbackData and the documented *_params struct, like the real driver does. */
#ifndef GPUCOLLECT_FAKE_CUDA_H
#define GPUCOLLECT_FAKE_CUDA_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct fake_ctx *CUcontext;
typedef struct fake_stream *CUstream;
typedef struct fake_pool *CUmemoryPool;
typedef struct fake_array *CUarray;
typedef struct fake_func *CUfunction;
typedef unsigned long long CUmemGenericAllocationHandle;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CUDA_ERROR_STREAM_CAPTURE_IMPLICIT 906
/* CUstreamCaptureMode */
#define CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define CU_STREAM_CAPTURE_MODE_RELAXED 2

typedef struct {
    unsigned int type; /* 1 = pinned */
    unsigned int requestedHandleTypes;
    struct {
        unsigned int type; /* 1 = device, 2 = host */
        int id;
    } location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

/* CUmemPoolProps (88 bytes; location at offset 8 as in CUmemAllocationProp). */
typedef struct {
    unsigned int allocType;
    unsigned int handleTypes;
    struct {
        unsigned int type;
        int id;
    } location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* CUDA_MEM_ALLOC_NODE_PARAMS: dptr is written by cuGraphAddMemAllocNode. */
typedef struct {
    CUmemPoolProps poolProps;
    const void *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct fake_graph *CUgraph;
typedef struct fake_graph_node *CUgraphNode;

/* CUmemPool_attribute and CUgraphMem_attribute values used here. */
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH 6
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT 7
#define CU_MEMPOOL_ATTR_USED_MEM_HIGH 8
#define CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT 0
#define CU_GRAPH_MEM_ATTR_USED_MEM_HIGH 1
#define CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT 2
#define CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH 3

typedef struct {
    size_t Width;
    size_t Height;
    unsigned int Format; /* CU_AD_FORMAT_*: 0x01 u8, 0x02 u16, 0x03 u32, 0x10 half, 0x20 float */
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    char reserved[64];
} CUipcMemHandle;

/* CUPTI */
typedef int CUptiResult;
typedef uint32_t CUpti_CallbackId;
typedef void (*CUpti_CallbackFunc)(void *userdata, uint32_t domain, uint32_t cbid,
                                   const void *cbdata);
typedef struct fake_subscriber *CUpti_SubscriberHandle;
#define CUPTI_SUCCESS 0
#define CUPTI_ERROR_INVALID_PARAMETER 1
#define CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED 39

typedef struct {
    int callbackSite; /* 0 enter, 1 exit */
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    CUcontext context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} CUpti_CallbackData;

/* Driver callback ids (CUpti_driver_api_trace_cbid). */
enum {
    CBID_cuCtxDestroy = 11,
    CBID_cuDevicePrimaryCtxReset = 389,
    CBID_cuMemFreeHost = 38,
    CBID_cuMemHostAlloc = 39,
    CBID_cuArrayDestroy = 89,
    CBID_cuMemGetInfo_v2 = 242,
    CBID_cuMemAlloc_v2 = 243,
    CBID_cuMemAllocPitch_v2 = 244,
    CBID_cuMemFree_v2 = 245,
    CBID_cuArrayCreate_v2 = 272,
    CBID_cuMemAllocHost_v2 = 294,
    CBID_cuMemHostUnregister = 302,
    CBID_cuCtxDestroy_v2 = 322,
    CBID_cuIpcCloseMemHandle = 330,
    CBID_cuMemAllocManaged = 371,
    CBID_cuMemHostRegister_v2 = 379,
    CBID_cuDevicePrimaryCtxReset_v2 = 545,
    CBID_cuMemAddressReserve = 547,
    CBID_cuMemAddressFree = 548,
    CBID_cuMemCreate = 549,
    CBID_cuMemRelease = 550,
    CBID_cuMemMap = 551,
    CBID_cuMemUnmap = 552,
    CBID_cuIpcOpenMemHandle_v2 = 567,
    CBID_cuMemAllocAsync = 598,
    CBID_cuMemAllocAsync_ptsz = 599,
    CBID_cuMemFreeAsync = 600,
    CBID_cuMemFreeAsync_ptsz = 601,
    CBID_cuMemPoolTrimTo = 602,
    CBID_cuMemPoolCreate = 607,
    CBID_cuMemPoolDestroy = 608,
    CBID_cuMemAllocFromPoolAsync = 611,
    CBID_cuMemAllocFromPoolAsync_ptsz = 612,
    CBID_cuGraphAddMemAllocNode = 638,
};

#ifdef __cplusplus
extern "C" {
#endif
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *ctx);
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags);
CUresult cuCtxSynchronize(void);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned int elem);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value);
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS *params);
CUresult cuDeviceGraphMemTrim(CUdevice dev);
CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *value);
/* Stream capture, as far as it concerns other threads: while a thread captures in global mode,
 * a "potentially unsafe" call from any other thread that is not in relaxed mode fails with
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidates the capture, whose cuStreamEndCapture then
 * fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. Here the pool and graph-memory queries are
 * such calls. */
CUresult cuThreadExchangeStreamCaptureMode(int *mode);
CUresult cuStreamBeginCapture_v2(CUstream stream, int mode);
CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc);
CUresult cuArrayDestroy(CUarray arr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, CUstream stream, void **params,
                        void **extra);

/* Hooks used by the fake libcupti (not CUDA API). */
void fake_cuda_subscribe(CUpti_CallbackFunc cb, void *userdata);
void fake_cuda_enable_callback(uint32_t enable, uint32_t domain, uint32_t cbid);
int fake_cuda_context_device(CUcontext ctx);
/* Tells the fake that graph memory of `bytes` on `dev` was freed (graphs are not modelled). */
CUresult fake_cuda_graph_free(CUdevice dev, size_t bytes);
#ifdef __cplusplus
}
#endif
#endif
