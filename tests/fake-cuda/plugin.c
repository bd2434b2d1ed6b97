/* A library the `dlopen` scenario loads after cuInit, to test symbolization of modules that
 * appear after the injection library took its module table. */
#include "fake_cuda.h"

__attribute__((noinline)) void plugin_alloc(void) {
    CUdeviceptr p;
    cuMemAlloc_v2(&p, 777); /* PLUGIN_LINE */
}
