/* Fake NVTX client for gpucollect's tests: the injection handshake of NVTX v3, reduced to what
 * the tests use. On the first call it loads $NVTX_INJECTION64_PATH, calls its
 * InitializeInjectionNvtx2(getExportTable), and the tool installs its hooks into the
 * function-pointer slots handed out by GetModuleFunctionTable (module CORE = 1). Without a
 * tool every call is a no-op, as in NVTX. Written for these tests; no NVIDIA code. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef void (*fn_t)(void);
static fn_t core_slots[16];
static fn_t *core_table[16];
static fn_t core2_slots[16];
static fn_t *core2_table[16];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int get_module_function_table(int module, fn_t ***out_table, unsigned *out_size) {
    if (module == 1) {
        *out_table = core_table;
    } else if (module == 5) {
        *out_table = core2_table;
    } else {
        return 0;
    }
    *out_size = 16;
    return 1;
}

static struct {
    size_t struct_size;
    int (*get_module_function_table)(int, fn_t ***, unsigned *);
} callbacks = {sizeof callbacks, get_module_function_table};

static const void *get_export_table(uint32_t id) { return id == 1 ? (const void *)&callbacks : NULL; }

static void init(void) {
    for (int i = 0; i < 16; i++) {
        core_table[i] = &core_slots[i];
        core2_table[i] = &core2_slots[i];
    }
    const char *p = getenv("NVTX_INJECTION64_PATH");
    if (!p || !*p) return;
    void *h = dlopen(p, RTLD_NOW);
    if (!h) return;
    int (*f)(const void *(*)(uint32_t)) = (int (*)(const void *(*)(uint32_t)))dlsym(h, "InitializeInjectionNvtx2");
    if (f && !f(get_export_table)) {
        for (int i = 0; i < 16; i++) core_slots[i] = NULL;
    }
}

void nvtxMarkA(const char *m) {
    pthread_once(&once, init);
    if (core_slots[2]) ((void (*)(const char *))core_slots[2])(m);
}
int nvtxRangePushA(const char *m) {
    pthread_once(&once, init);
    return core_slots[9] ? ((int (*)(const char *))core_slots[9])(m) : -2;
}
int nvtxRangePop(void) {
    pthread_once(&once, init);
    return core_slots[11] ? ((int (*)(void))core_slots[11])() : -2;
}
uint64_t nvtxRangeStartA(const char *m) {
    pthread_once(&once, init);
    return core_slots[5] ? ((uint64_t (*)(const char *))core_slots[5])(m) : 0;
}
void nvtxRangeEnd(uint64_t id) {
    pthread_once(&once, init);
    if (core_slots[7]) ((void (*)(uint64_t))core_slots[7])(id);
}

/* Domains and registered strings (module CORE2 = 5). The attributes struct follows
 * nvtxEventAttributes_v2: message type at byte 32, message at byte 40. */
typedef struct {
    uint16_t version, size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type, reserved0;
    uint64_t payload;
    int32_t message_type;
    const void *message;
} attrs_t;

const void *nvtxDomainCreateA(const char *name) {
    pthread_once(&once, init);
    return core2_slots[12] ? ((const void *(*)(const char *))core2_slots[12])(name) : NULL;
}
const void *nvtxDomainRegisterStringA(const void *domain, const char *s) {
    pthread_once(&once, init);
    return core2_slots[10] ? ((const void *(*)(const void *, const char *))core2_slots[10])(domain, s) : NULL;
}
int nvtxDomainRangePushRegistered(const void *domain, const void *string) {
    pthread_once(&once, init);
    attrs_t a = {2, sizeof(attrs_t), 0, 0, 0, 0, 0, 0, 3, string};
    return core2_slots[4] ? ((int (*)(const void *, const attrs_t *))core2_slots[4])(domain, &a) : -2;
}
int nvtxDomainRangePop(const void *domain) {
    pthread_once(&once, init);
    return core2_slots[5] ? ((int (*)(const void *))core2_slots[5])(domain) : -2;
}
