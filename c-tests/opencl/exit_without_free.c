/* A program that ends without freeing its cache, as real programs do: the first run builds and
 * launches a few kernels on one cache, then returns from main (or calls exit) with the cache,
 * its context and its queue still open. On PoCL the cache holds each program's binary back until
 * a flush; kcache's exit handler writes them. The second run, a new process on the same
 * directory, loads every kernel from disk and compiles none.
 *
 *   usage: exit_without_free return|exit|check CACHE_DIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../checks.h"
#include "setup.h"

#define KERNELS 3
#define N 256

static const char *SOURCES[KERNELS] = {
    "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }\n",
    "__kernel void k(__global float *x) { x[get_global_id(0)] *= 3.0f; }\n",
    "__kernel void k(__global float *x) { x[get_global_id(0)] -= 2.0f; }\n",
};

/* Builds (or loads) every kernel through `cache` and launches each once; 0 when all ran. */
static int run_all(kc_opencl_cache *cache, cl_context context, cl_command_queue queue,
                   cl_device_id device) {
    float data[N];
    cl_int err;
    memset(data, 0, sizeof data);
    cl_mem buffer = clCreateBuffer(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                   sizeof data, data, &err);
    if (err != CL_SUCCESS) return 1;
    int failed = 0;
    for (int i = 0; i < KERNELS && !failed; i++) {
        kc_opencl_lease *lease;
        kc_status status = kc_opencl_cache_find_or_build(cache, context, device, &SOURCES[i],
                                                         NULL, 1, "", &lease);
        if (status != KC_OK) {
            fprintf(stderr, "%s: %s\n", kc_status_name(status), kc_last_error_message());
            failed = 1;
            break;
        }
        cl_kernel kernel =
            clCreateKernel((cl_program)kc_opencl_lease_program(lease), "k", &err);
        size_t global = N;
        if (err == CL_SUCCESS) err = clSetKernelArg(kernel, 0, sizeof buffer, &buffer);
        if (err == CL_SUCCESS)
            err = clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &global, NULL, 0, NULL, NULL);
        if (err == CL_SUCCESS) err = clFinish(queue);
        if (kernel) clReleaseKernel(kernel);
        kc_opencl_lease_release(lease);
        failed = err != CL_SUCCESS;
    }
    clReleaseMemObject(buffer);
    return failed;
}

int main(int argc, char **argv) {
    REQUIRE_ARGS(argc, 2, "exit_without_free return|exit|check CACHE_DIR");
    const char *mode = argv[1];
    opencl_setup cl;
    if (opencl_setup_open(&cl, argv[2])) return 1;
    if (run_all(cl.cache, cl.context, cl.queue, cl.device)) return 1;
    kc_opencl_cache_statistics stats = {.struct_size = sizeof stats};
    if (kc_opencl_cache_stats(cl.cache, &stats) != KC_OK) return 1;
    printf("%s: compiled from source: %llu, loaded from disk: %llu\n", mode,
           (unsigned long long)stats.source_builds, (unsigned long long)stats.binary_loads);
    if (strcmp(mode, "return") == 0) {
        if (stats.source_builds != KERNELS) return 1;
        return 0; /* no flush, no free: the cache is still open */
    }
    if (strcmp(mode, "exit") == 0) {
        if (stats.source_builds != KERNELS) exit(1);
        exit(0);
    }
    /* check: a new process finds every kernel on disk. */
    int warm = stats.source_builds == 0 && stats.binary_loads == KERNELS;
    opencl_setup_close(&cl);
    if (!warm) fprintf(stderr, "the earlier process left %d kernel(s) unwritten\n",
                       KERNELS - (int)stats.binary_loads);
    return warm ? 0 : 1;
}
