/* The OpenCL example of the kcache documentation, complete: compiles a kernel through the cache
 * (from source the first time, from memory the second, from disk in a later process), runs it
 * and checks the result.
 *
 *   usage: opencl_example [CACHE_DIR]    (default: KCACHE_DIR, else ~/.cache/kcache)
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <kcache.h>

#include <stdio.h>

static const char *SOURCE =
    "__kernel void twice(__global float *x) {\n"
    "    size_t i = get_global_id(0);\n"
    "    x[i] = 2.0f * x[i];\n"
    "}\n";

#define N 1024

/* Runs `twice` of `program` over N floats and checks every one. */
static int run_twice(cl_context context, cl_command_queue queue, cl_program program) {
    float data[N];
    cl_int err;
    int bad = 0;
    for (int i = 0; i < N; i++) data[i] = (float)i;
    cl_mem buffer = clCreateBuffer(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                   sizeof data, data, &err);
    if (err != CL_SUCCESS) return 1;
    cl_kernel kernel = clCreateKernel(program, "twice", &err);
    if (err != CL_SUCCESS) { clReleaseMemObject(buffer); return 1; }
    size_t global = N;
    err = clSetKernelArg(kernel, 0, sizeof buffer, &buffer);
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &global, NULL, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clEnqueueReadBuffer(queue, buffer, CL_TRUE, 0, sizeof data, data, 0, NULL, NULL);
    clReleaseKernel(kernel);
    clReleaseMemObject(buffer);
    if (err != CL_SUCCESS) return 1;
    for (int i = 0; i < N; i++) bad += data[i] != 2.0f * (float)i;
    return bad != 0;
}

int main(int argc, char **argv) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    if (clGetPlatformIDs(1, &platform, NULL) != CL_SUCCESS ||
        clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL) != CL_SUCCESS) {
        fprintf(stderr, "no OpenCL device\n");
        return 1;
    }
    cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (err != CL_SUCCESS) return 1;
    cl_command_queue queue = clCreateCommandQueue(context, device, 0, &err);
    if (err != CL_SUCCESS) return 1;

    /* One cache per process, shared by every thread. Handles go in and out as void *. */
    kc_opencl_options opts = kc_opencl_options_default();
    /* The persistent tiers: a directory of our own, or (NULL) the environment's. */
    kc_persistence *tiers = NULL;
    if (argc > 1) {
        kc_persistence_options tiers_opts = kc_persistence_options_default();
        tiers_opts.dir = argv[1];
        if (kc_persistence_open(&tiers_opts, &tiers) != KC_OK) {
            fprintf(stderr, "kc_persistence_open: %s\n", kc_last_error_message());
            return 1;
        }
    }
    kc_opencl_cache *cache;
    kc_status created = kc_opencl_cache_new(&opts, tiers, &cache);
    kc_persistence_free(tiers); /* the cache holds a reference of its own */
    if (created != KC_OK) {
        fprintf(stderr, "kc_opencl_cache_new: %s\n", kc_last_error_message());
        return 1;
    }

    int failed = 0;
    for (int round = 0; round < 2 && !failed; round++) {
        kc_opencl_lease *lease;
        kc_status status =
            kc_opencl_cache_find_or_build(cache, context, device, &SOURCE, NULL, 1, "", &lease);
        if (status != KC_OK) {
            /* On KC_ERR_BUILD_FAILED the message is the compiler's build log. */
            fprintf(stderr, "%s: %s\n", kc_status_name(status), kc_last_error_message());
            failed = 1;
            break;
        }
        /* The program belongs to the cache: use it while the lease is held, never release it. */
        cl_program program = (cl_program)kc_opencl_lease_program(lease);
        failed = run_twice(context, queue, program);
        kc_opencl_lease_release(lease);
    }

    kc_opencl_cache_statistics stats = {.struct_size = sizeof stats};
    if (!failed && kc_opencl_cache_stats(cache, &stats) == KC_OK) {
        printf("compiled from source: %llu, loaded from disk: %llu, memory hits: %llu\n",
               (unsigned long long)stats.source_builds,
               (unsigned long long)stats.binary_loads,
               (unsigned long long)stats.memory.hits);
    }

    /* Programs hold their context: evict them before releasing it. */
    kc_opencl_cache_evict_context(cache, context, NULL);
    kc_opencl_cache_free(cache);
    clReleaseCommandQueue(queue);
    clReleaseContext(context);
    if (failed) {
        fprintf(stderr, "the kernel gave wrong results\n");
        return 1;
    }
    printf("ok: %d elements checked\n", N);
    return 0;
}
