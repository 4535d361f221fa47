/* One kc_persistence shared, in one process, by an OpenCL cache (on the system's OpenCL: PoCL),
 * a CUDA cache (on the stand-in driver) and kc_tiered_find_or_build lookups: every write goes
 * through one background writer thread, and the object's counters add up all three.
 *   shared_persistence FAKE_DRIVER_PATH CACHE_DIR   (CACHE_DIR must be a new, empty directory) */
#include <CL/cl.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../checks.h"

int cuInit(unsigned int flags);
int cuCtxCreate_v2(void **ctx, unsigned int flags, int dev);
int cuCtxPopCurrent_v2(void **ctx);

static const char PTX[] = ".version 7.0\n.target sm_52\n.address_size 64\n"
                          ".visible .entry twice(.param .u64 p) { ret; }\n";
static const char *CL_SOURCE = "__kernel void add_one(__global float *x) { x[0] += 1.0f; }\n";

/* The threads of this process named `name` (/proc/self/task/TID/comm). */
static int threads_named(const char *name) {
    DIR *tasks = opendir("/proc/self/task");
    struct dirent *task;
    int count = 0;
    REQUIRE(tasks != NULL);
    while ((task = readdir(tasks)) != NULL) {
        char path[300], comm[64] = {0};
        FILE *f;
        if (task->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", task->d_name);
        f = fopen(path, "r");
        if (f == NULL)
            continue; /* the thread ended meanwhile */
        if (fgets(comm, sizeof comm, f) != NULL && strncmp(comm, name, strlen(name)) == 0 &&
            (comm[strlen(name)] == '\n' || comm[strlen(name)] == '\0'))
            count++;
        fclose(f);
    }
    closedir(tasks);
    return count;
}

/* Tiered callbacks for values that are their own bytes (a heap copy). */
static void *copy_of(const uint8_t *bytes, size_t len) {
    char *copy = malloc(len + 1);
    REQUIRE(copy != NULL);
    memcpy(copy, bytes, len);
    copy[len] = '\0';
    return copy;
}
static int build_fn(void *ctx, const uint8_t *key, size_t len, void **out, uint64_t *weight) {
    (*(int *)ctx)++;
    *out = copy_of(key, len);
    *weight = len;
    return 0;
}
static int load_fn(void *ctx, const uint8_t *bytes, size_t len, void **out, uint64_t *weight) {
    (void)ctx;
    *out = copy_of(bytes, len);
    *weight = len;
    return 0;
}
static int serialize_fn(void *ctx, void *value, uint8_t *buf, size_t *len) {
    size_t n = strlen(value);
    (void)ctx;
    if (buf != NULL)
        memcpy(buf, value, n);
    *len = n;
    return 0;
}
static int destroy_fn(void *ctx, void *value) {
    (void)ctx;
    free(value);
    return 0;
}

/* One tiered lookup of `value` in a fresh memory tier over `tiers`; returns the builds. */
static int tiered_lookup(kc_persistence *tiers, const char *value) {
    kc_cache_options o = kc_cache_options_default();
    kc_cache *cache = NULL;
    kc_lease *lease = NULL;
    kc_key_builder *kb = NULL;
    uint8_t l2[KC_KEY_LEN];
    int builds = 0;
    kc_tiered_callbacks cb = {sizeof cb, build_fn, load_fn, serialize_fn, &builds};
    o.destroy = destroy_fn;
    REQUIRE(kc_cache_new(&o, &cache) == KC_OK);
    REQUIRE(kc_key_builder_new(&kb) == KC_OK);
    REQUIRE(kc_key_builder_set(kb, KC_KEY_BACKEND, (const uint8_t *)"c-test", 6) == KC_OK);
    REQUIRE(kc_key_builder_set(kb, KC_KEY_ENTRY, (const uint8_t *)value, strlen(value)) == KC_OK);
    REQUIRE(kc_key_builder_finish(kb, l2) == KC_OK);
    kc_key_builder_free(kb);
    EXPECT(kc_tiered_find_or_build(cache, (const uint8_t *)value, strlen(value), KC_NO_DEVICE,
                                   tiers, l2, &cb, &lease) == KC_OK);
    kc_lease_release(lease);
    kc_cache_free(cache);
    return builds;
}

int main(int argc, char **argv) {
    REQUIRE_ARGS(argc, 2, "shared_persistence FAKE_DRIVER_PATH CACHE_DIR");
    kc_persistence_options popts = kc_persistence_options_default();
    kc_persistence *tiers = NULL;
    popts.dir = argv[2];
    REQUIRE(kc_persistence_open(&popts, &tiers) == KC_OK);
    EXPECT(threads_named("kcache-writer") == 0);

    /* The CUDA cache on the stand-in driver. */
    void *ctx = NULL, *popped = NULL;
    kc_cuda_options copts = kc_cuda_options_default();
    kc_cuda_cache *cuda = NULL;
    kc_cuda_lease *module = NULL;
    copts.driver_library = argv[1];
    REQUIRE(cuInit(0) == 0);
    REQUIRE(cuCtxCreate_v2(&ctx, 0, 0) == 0 && cuCtxPopCurrent_v2(&popped) == 0);
    REQUIRE(kc_cuda_cache_new(&copts, tiers, &cuda) == KC_OK);

    /* The OpenCL cache. */
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    REQUIRE(clGetPlatformIDs(1, &platform, NULL) == CL_SUCCESS);
    REQUIRE(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL) == CL_SUCCESS);
    cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    REQUIRE(err == CL_SUCCESS);
    kc_opencl_options oopts = kc_opencl_options_default();
    kc_opencl_cache *opencl = NULL;
    kc_opencl_lease *program = NULL;
    REQUIRE(kc_opencl_cache_new(&oopts, tiers, &opencl) == KC_OK);

    EXPECT(kc_cuda_cache_find_or_build_ptx(cuda, ctx, PTX, 0, NULL, 0, &module) == KC_OK);
    EXPECT(kc_opencl_cache_find_or_build(opencl, context, device, &CL_SOURCE, NULL, 1, NULL,
                                         &program) == KC_OK);
    EXPECT(tiered_lookup(tiers, "first") == 1);
    EXPECT(tiered_lookup(tiers, "second") == 1);
    EXPECT(kc_cuda_cache_flush(cuda) == KC_OK);
    EXPECT(kc_opencl_cache_flush(opencl) == KC_OK);
    EXPECT(kc_persistence_flush(tiers) == KC_OK);

    /* Four entries written by three users, through one writer. */
    EXPECT(threads_named("kcache-writer") == 1);
    kc_persistence_statistics s = {.struct_size = sizeof s};
    EXPECT(kc_persistence_stats(tiers, &s) == KC_OK);
    EXPECT(s.puts == 4 && s.failed_writes == 0 && s.pending_writes == 0);
    /* What each read: a miss each, counted once in the shared counters. */
    EXPECT(s.misses == 4 && s.hits == 0);
    kc_cuda_cache_statistics cs = {.struct_size = sizeof cs};
    kc_opencl_cache_statistics os = {.struct_size = sizeof os};
    EXPECT(kc_cuda_cache_stats(cuda, &cs) == KC_OK && cs.disk_misses == 1 && cs.links == 1);
    EXPECT(kc_opencl_cache_stats(opencl, &os) == KC_OK && os.disk_misses == 1);

    /* A second tiered lookup of a value the first wrote reads it from the shared disk. */
    EXPECT(tiered_lookup(tiers, "first") == 0);
    EXPECT(kc_persistence_stats(tiers, &s) == KC_OK && s.hits == 1);

    kc_cuda_lease_release(module);
    kc_opencl_lease_release(program);
    kc_opencl_cache_evict_context(opencl, context, NULL);
    kc_cuda_cache_evict_context(cuda, ctx, NULL);
    /* Freed before the caches: they keep the tiers open. */
    kc_persistence_free(tiers);
    kc_cuda_cache_free(cuda);
    kc_opencl_cache_free(opencl);
    clReleaseContext(context);
    return check_finish("shared_persistence: one writer and one set of counters for three users");
}
