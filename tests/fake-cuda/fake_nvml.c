/* Fake libnvidia-ml.so for gpucollect's tests: two devices with fixed memory figures and one
 * process (pid FAKE_NVML_PID, default 4242) using 300 MiB on each. Only the entry points the
 * collector's NVML sampler uses; struct layouts follow the public nvml.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_INSUFFICIENT_SIZE 7

typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;

static int devs[2] = {0, 1};
#define GIB (1ULL << 30)
#define MIB (1ULL << 20)

int nvmlInit_v2(void) { return NVML_SUCCESS; }
int nvmlShutdown(void) { return NVML_SUCCESS; }
int nvmlSystemGetDriverVersion(char *v, unsigned int n) { snprintf(v, n, "550.00"); return NVML_SUCCESS; }
int nvmlDeviceGetCount_v2(unsigned int *c) { *c = 2; return NVML_SUCCESS; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **d) {
    if (i > 1) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devs[i];
    return NVML_SUCCESS;
}
static int idx(void *d) { return *(int *)d; }
int nvmlDeviceGetName(void *d, char *name, unsigned int n) { snprintf(name, n, "Fake GPU %d", idx(d)); return NVML_SUCCESS; }
int nvmlDeviceGetUUID(void *d, char *uuid, unsigned int n) { snprintf(uuid, n, "GPU-fake-%d", idx(d)); return NVML_SUCCESS; }
int nvmlDeviceGetMemoryInfo_v2(void *d, nvmlMemory_v2_t *m) {
    m->total = 16 * GIB;
    m->reserved = 0;
    m->used = GIB + (unsigned long long)idx(d) * MIB;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *d, unsigned int *count, nvmlProcessInfo_t *infos) {
    (void)d;
    if (!infos || *count < 1) { *count = 1; return NVML_ERROR_INSUFFICIENT_SIZE; }
    const char *pid = getenv("FAKE_NVML_PID");
    infos[0].pid = pid ? (unsigned)atoi(pid) : 4242;
    infos[0].usedGpuMemory = 300 * MIB;
    infos[0].gpuInstanceId = 0xffffffff;
    infos[0].computeInstanceId = 0xffffffff;
    *count = 1;
    return NVML_SUCCESS;
}
