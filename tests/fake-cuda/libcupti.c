/* Fake libcupti.so for gpucollect's tests: the subset of the CUPTI callback API the injection
 * uses, forwarding to the fake libcuda.so.1 (which it links, like the real libcupti).
 * FAKE_CUPTI_BUSY=1 makes cuptiSubscribe fail with CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED,
 * as when Nsight Systems or torch.profiler already holds the subscription. */
#include "fake_cuda.h"

#include <stdlib.h>
#include <string.h>

static int g_subscribed;

CUptiResult cuptiGetVersion(uint32_t *version) {
    *version = 18;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *sub, CUpti_CallbackFunc cb, void *userdata) {
    const char *busy = getenv("FAKE_CUPTI_BUSY");
    if ((busy && strcmp(busy, "1") == 0) || g_subscribed)
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    g_subscribed = 1;
    fake_cuda_subscribe(cb, userdata);
    *sub = (CUpti_SubscriberHandle)(uintptr_t)0x5u;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle sub) {
    (void)sub;
    g_subscribed = 0;
    fake_cuda_subscribe(NULL, NULL);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle sub, uint32_t domain,
                                CUpti_CallbackId cbid) {
    if (!sub) return CUPTI_ERROR_INVALID_PARAMETER;
    fake_cuda_enable_callback(enable, domain, cbid);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle sub, uint32_t domain) {
    if (!sub) return CUPTI_ERROR_INVALID_PARAMETER;
    for (uint32_t i = 0; i < 1024; i++) fake_cuda_enable_callback(enable, domain, i);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiGetDeviceId(CUcontext ctx, uint32_t *device) {
    int d = fake_cuda_context_device(ctx);
    if (d < 0) return CUPTI_ERROR_INVALID_PARAMETER;
    *device = (uint32_t)d;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiGetResultString(CUptiResult r, const char **str) {
    *str = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
               ? "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
               : (r == 0 ? "CUPTI_SUCCESS" : "CUPTI_ERROR");
    return CUPTI_SUCCESS;
}
