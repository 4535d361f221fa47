/* What the OpenCL test programs that are not the documentation's example share: the first
 * device of the first platform, a context and a queue on it, and a cache whose disk tier is in
 * a given directory. */
#ifndef KCACHE_TEST_OPENCL_SETUP_H
#define KCACHE_TEST_OPENCL_SETUP_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <kcache.h>

#include <stdio.h>

typedef struct opencl_setup {
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    kc_opencl_cache *cache;
} opencl_setup;

/* Opens everything, saying on stderr what failed; 0 on success. */
static inline int opencl_setup_open(opencl_setup *s, const char *disk_dir) {
    cl_platform_id platform;
    cl_int err;
    if (clGetPlatformIDs(1, &platform, NULL) != CL_SUCCESS ||
        clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &s->device, NULL) != CL_SUCCESS) {
        fprintf(stderr, "no OpenCL device\n");
        return 1;
    }
    s->context = clCreateContext(NULL, 1, &s->device, NULL, NULL, &err);
    if (err != CL_SUCCESS) return 1;
    s->queue = clCreateCommandQueue(s->context, s->device, 0, &err);
    if (err != CL_SUCCESS) return 1;
    kc_opencl_options opts = kc_opencl_options_default();
    kc_persistence_options tiers_opts = kc_persistence_options_default();
    tiers_opts.dir = disk_dir;
    kc_persistence *tiers;
    if (kc_persistence_open(&tiers_opts, &tiers) != KC_OK) {
        fprintf(stderr, "kc_persistence_open: %s\n", kc_last_error_message());
        return 1;
    }
    kc_status created = kc_opencl_cache_new(&opts, tiers, &s->cache);
    kc_persistence_free(tiers); /* the cache holds a reference of its own */
    if (created != KC_OK) {
        fprintf(stderr, "kc_opencl_cache_new: %s\n", kc_last_error_message());
        return 1;
    }
    return 0;
}

/* Frees the cache (its programs hold the context: evicted first), the queue and the context. */
static inline void opencl_setup_close(opencl_setup *s) {
    kc_opencl_cache_evict_context(s->cache, s->context, NULL);
    kc_opencl_cache_free(s->cache);
    clReleaseCommandQueue(s->queue);
    clReleaseContext(s->context);
}

#endif
