/* kc_opencl_* through the real header and library, on a real OpenCL implementation.
 *
 *   opencl_test CACHE_DIR     the cache tests (CACHE_DIR must be a new, empty directory)
 *   opencl_test unavailable   run with KCACHE_OPENCL_LIBRARY naming a missing library
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../checks.h"

static const char *SOURCE =
    "__kernel void add_one(__global float *x) { x[get_global_id(0)] += 1.0f; }\n";

/* Runs the kernel add_one of `program` on 0..63: whether each element grew by `amount`. */
static int run_add(cl_context context, cl_command_queue queue, void *program, float amount) {
    float data[64];
    cl_int err;
    for (int i = 0; i < 64; i++) data[i] = (float)i;
    cl_mem buffer = clCreateBuffer(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                   sizeof data, data, &err);
    cl_kernel kernel = clCreateKernel((cl_program)program, "add_one", &err);
    if (err != CL_SUCCESS) return 0;
    size_t global = 64;
    clSetKernelArg(kernel, 0, sizeof buffer, &buffer);
    clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &global, NULL, 0, NULL, NULL);
    clEnqueueReadBuffer(queue, buffer, CL_TRUE, 0, sizeof data, data, 0, NULL, NULL);
    clReleaseKernel(kernel);
    clReleaseMemObject(buffer);
    for (int i = 0; i < 64; i++)
        if (data[i] != (float)i + amount) return 0;
    return 1;
}

static int run_add_one(cl_context context, cl_command_queue queue, void *program) {
    return run_add(context, queue, program, 1.0f);
}

static cl_uint reference_count(void *program) {
    cl_uint count = 0;
    clGetProgramInfo((cl_program)program, CL_PROGRAM_REFERENCE_COUNT, sizeof count, &count, NULL);
    return count;
}

static kc_opencl_cache_statistics stats_of(kc_opencl_cache *cache) {
    kc_opencl_cache_statistics stats = {.struct_size = sizeof stats};
    EXPECT(kc_opencl_cache_stats(cache, &stats) == KC_OK);
    return stats;
}

/* The first device of the first platform, a context on it and a queue; exits without them. */
static void open_first_device(cl_device_id *device, cl_context *context, cl_command_queue *queue) {
    cl_platform_id platform;
    cl_int err;
    REQUIRE(clGetPlatformIDs(1, &platform, NULL) == CL_SUCCESS);
    REQUIRE(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, device, NULL) == CL_SUCCESS);
    *context = clCreateContext(NULL, 1, device, NULL, NULL, &err);
    REQUIRE(err == CL_SUCCESS);
    *queue = clCreateCommandQueue(*context, *device, 0, &err);
    REQUIRE(err == CL_SUCCESS);
}

/* kc_opencl_cache_find_or_build_program: the caller's own reference (no lease), for a device
 * list or every device of the context, a build log per device. A memory-only cache, so that no
 * background writer holds references of its own. PoCL offers one device: the lists hold it. */
static void test_own_reference(cl_context context, cl_device_id device, cl_command_queue queue) {
    kc_opencl_options opts = kc_opencl_options_default();
    kc_opencl_cache *cache = NULL;
    EXPECT(kc_opencl_cache_new(&opts, kc_persistence_none(), &cache) == KC_OK);
    const char *tagged =
        "// own-reference\n"
        "__kernel void add_one(__global float *x) { x[get_global_id(0)] += 1.0f; }\n";
    cl_uint devices = 0;
    EXPECT(clGetContextInfo(context, CL_CONTEXT_NUM_DEVICES, sizeof devices, &devices, NULL) ==
           CL_SUCCESS);
    EXPECT(devices == 1);

    /* Invalid arguments never crash and never write the out-parameters. */
    cl_program sentinel = (cl_program)&opts;
    cl_program program = sentinel;
    kc_buffer log = {.len = 7};
    EXPECT(kc_opencl_cache_find_or_build_program(NULL, context, 1, &device, &tagged, NULL, 1, "",
                                                 &program, &log) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "cache") != NULL);
    EXPECT(kc_opencl_cache_find_or_build_program(cache, NULL, 1, &device, &tagged, NULL, 1, "",
                                                 &program, &log) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "context") != NULL);
    EXPECT(kc_opencl_cache_find_or_build_program(cache, context, 0, &device, &tagged, NULL, 1, "",
                                                 &program, &log) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "num_devices") != NULL);
    EXPECT(kc_opencl_cache_find_or_build_program(cache, context, 2, NULL, &tagged, NULL, 1, "",
                                                 &program, &log) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "device count is 1") != NULL);
    cl_device_id no_device = NULL;
    EXPECT(kc_opencl_cache_find_or_build_program(cache, context, 1, &no_device, &tagged, NULL, 1,
                                                 "", &program, &log) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "device_list[0]") != NULL);
    EXPECT(kc_opencl_cache_find_or_build_program(cache, context, 1, &device, NULL, NULL, 1, "",
                                                 &program, &log) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "sources") != NULL);
    EXPECT(kc_opencl_cache_find_or_build_program(cache, context, 1, &device, &tagged, NULL, 0, "",
                                                 &program, &log) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(kc_opencl_cache_find_or_build_program(cache, context, 1, &device, &tagged, NULL, 1, "",
                                                 NULL, &log) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "out_programs") != NULL);
    EXPECT(program == sentinel && log.len == 7 && log.data == NULL);

    /* The port of clCreateProgramWithSource + clBuildProgram: one call, and the program is the
     * caller's to release. */
    EXPECT(kc_opencl_cache_find_or_build_program(cache, context, 1, &device, &tagged, NULL, 1, "",
                                                 &program, &log) == KC_OK);
    EXPECT(program != sentinel && run_add_one(context, queue, program));
    EXPECT(log.data == NULL && log.len == 0 && log.owner == NULL);
    EXPECT(reference_count(program) == 2); /* the cache's and the caller's */
    clRetainProgram(program);              /* a watcher, to see the program go */
    clReleaseProgram(program);             /* the ported code's own release */
    EXPECT(reference_count(program) == 2);

    /* Every device of the context: the same cached program, from memory. */
    cl_program again = NULL;
    EXPECT(kc_opencl_cache_find_or_build_program(cache, context, devices, NULL, &tagged, NULL, 1,
                                                 NULL, &again, NULL) == KC_OK);
    EXPECT(again == program && run_add_one(context, queue, again));
    EXPECT(reference_count(program) == 3);
    clReleaseProgram(again);
    kc_opencl_cache_statistics s = stats_of(cache);
    EXPECT(s.source_builds == 1 && s.memory.hits == 1 && s.memory.leases == 0);

    /* Eviction gives up the cache's reference only: the watcher's is the last one. */
    size_t evicted = 0;
    EXPECT(kc_opencl_cache_evict_context(cache, context, &evicted) == KC_OK && evicted == 1);
    EXPECT(reference_count(program) == 1);
    EXPECT(stats_of(cache).memory.destroys == 1);
    clReleaseProgram(program);

    /* A build failure: each device's log in a buffer, no program handed out. */
    const char *broken = "__kernel void broken(__global float *x) { x[0] = log_marker; }";
    program = sentinel;
    EXPECT(kc_opencl_cache_find_or_build_program(cache, context, 1, &device, &broken, NULL, 1, "",
                                                 &program, &log) == KC_ERR_BUILD_FAILED);
    EXPECT(kc_last_build_error() == CL_BUILD_PROGRAM_FAILURE);
    EXPECT(program == sentinel);
    EXPECT(log.data != NULL && log.len > 0 && log.build_time_ns == 0);
    char *text = calloc(log.len + 1, 1);
    REQUIRE(text != NULL);
    memcpy(text, log.data, log.len);
    EXPECT(strstr(text, "CL_BUILD_PROGRAM_FAILURE") != NULL && strstr(text, "log_marker") != NULL);
    free(text);
    kc_buffer_free(&log);
    EXPECT(log.data == NULL && log.owner == NULL);
    EXPECT(stats_of(cache).memory.entries == 0);
    kc_opencl_cache_free(cache);
}

static int test_unavailable(void) {
    EXPECT(kc_opencl_available() == KC_ERR_UNAVAILABLE);
    EXPECT(strstr(kc_last_error_message(), "OpenCL") != NULL);
    kc_opencl_options opts = kc_opencl_options_default();
    kc_opencl_cache *cache = NULL;
    EXPECT(kc_opencl_cache_new(&opts, kc_persistence_none(), &cache) == KC_ERR_UNAVAILABLE);
    EXPECT(cache == NULL);
    return check_finish("opencl_test unavailable");
}

static void write_file(const char *path, const char *text) {
    FILE *file = fopen(path, "w");
    REQUIRE(file != NULL);
    REQUIRE(fputs(text, file) >= 0 && fclose(file) == 0);
}

/* A header the source includes is an input of the build: changed, the program is built again;
 * included through a computed name, kcache cannot key it, and the build is cached nowhere. */
static void test_headers(const char *dir, cl_context context, cl_device_id device,
                         cl_command_queue queue) {
    char headers[4096], header[4200], options[4200];
    snprintf(headers, sizeof headers, "%s-headers", dir);
    REQUIRE(mkdir(headers, 0700) == 0);
    snprintf(header, sizeof header, "%s/amount.h", headers);
    snprintf(options, sizeof options, "-I %s", headers);
    write_file(header, "#define AMOUNT 2.0f\n");
    const char *sources[] = {
        "#include \"amount.h\"\n"
        "__kernel void add_one(__global float *x) { x[get_global_id(0)] += AMOUNT; }\n",
        "#define HEADER \"amount.h\"\n#include HEADER\n"
        "__kernel void add_one(__global float *x) { x[get_global_id(0)] += AMOUNT; }\n",
    };
    kc_opencl_options opts = kc_opencl_options_default();
    kc_persistence *tiers = persistence_in(dir);
    kc_opencl_cache *cache = NULL;
    EXPECT(kc_opencl_cache_new(&opts, tiers, &cache) == KC_OK);
    kc_opencl_lease *lease = NULL;
    float amounts[] = {2.0f, 2.0f, 3.0f};
    for (int i = 0; i < 3; i++) {
        if (i == 2) write_file(header, "#define AMOUNT 3.0f\n");
        EXPECT(kc_opencl_cache_find_or_build(cache, context, device, &sources[0], NULL, 1,
                                             options, &lease) == KC_OK);
        EXPECT(run_add(context, queue, kc_opencl_lease_program(lease), amounts[i]));
        kc_opencl_lease_release(lease);
    }
    kc_opencl_cache_statistics s = stats_of(cache);
    EXPECT(s.source_builds == 2 && s.memory.hits == 1 && s.passed_through == 0);
    for (int i = 0; i < 2; i++) {
        EXPECT(kc_opencl_cache_find_or_build(cache, context, device, &sources[1], NULL, 1,
                                             options, &lease) == KC_OK);
        EXPECT(run_add(context, queue, kc_opencl_lease_program(lease), 3.0f));
        kc_opencl_lease_release(lease);
    }
    s = stats_of(cache);
    EXPECT(s.source_builds == 4 && s.memory.hits == 1 && s.passed_through == 2);
    kc_opencl_cache_free(cache);
    kc_persistence_free(tiers);
}

int main(int argc, char **argv) {
    REQUIRE_ARGS(argc, 1, "opencl_test CACHE_DIR | unavailable");
    if (strcmp(argv[1], "unavailable") == 0) return test_unavailable();

    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    open_first_device(&device, &context, &queue);
    EXPECT(kc_opencl_available() == KC_OK);

    kc_opencl_options opts = kc_opencl_options_default();
    kc_persistence *tiers = persistence_in(argv[1]);
    kc_opencl_cache *cache = NULL;
    EXPECT(kc_opencl_cache_new(NULL, tiers, &cache) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(kc_opencl_cache_new(&opts, tiers, &cache) == KC_OK);
    kc_persistence_statistics t = {.struct_size = sizeof t};

    /* Invalid arguments never crash and never write the out-parameter. */
    kc_opencl_lease *lease = NULL;
    EXPECT(kc_opencl_cache_find_or_build(NULL, context, device, &SOURCE, NULL, 1, "", &lease) ==
           KC_ERR_INVALID_ARGUMENT);
    EXPECT(kc_opencl_cache_find_or_build(cache, NULL, device, &SOURCE, NULL, 1, "", &lease) ==
           KC_ERR_INVALID_ARGUMENT);
    EXPECT(kc_opencl_cache_find_or_build(cache, context, device, NULL, NULL, 1, "", &lease) ==
           KC_ERR_INVALID_ARGUMENT);
    EXPECT(kc_opencl_cache_find_or_build(cache, context, device, &SOURCE, NULL, 0, "", &lease) ==
           KC_ERR_INVALID_ARGUMENT);
    EXPECT(lease == NULL);
    EXPECT(kc_opencl_lease_program(NULL) == NULL);
    kc_opencl_lease_release(NULL);
    kc_opencl_cache_free(NULL);

    /* Cold, then a memory hit: the same program, compiled once. */
    EXPECT(kc_opencl_cache_find_or_build(cache, context, device, &SOURCE, NULL, 1, NULL, &lease) ==
           KC_OK);
    void *program = kc_opencl_lease_program(lease);
    EXPECT(program != NULL && run_add_one(context, queue, program));
    kc_opencl_lease *again = NULL;
    size_t length = strlen(SOURCE);
    EXPECT(kc_opencl_cache_find_or_build(cache, context, device, &SOURCE, &length, 1, "", &again) ==
           KC_OK);
    EXPECT(kc_opencl_lease_program(again) == program);
    kc_opencl_cache_statistics s = stats_of(cache);
    EXPECT(s.source_builds == 1 && s.memory.hits == 1 && s.disk_misses == 1);
    kc_opencl_lease_release(again);

    /* The binary is written on a background thread; a flush waits for that (and on PoCL then
     * rewrites it with the work-group code the launch compiled: a second put). */
    EXPECT(kc_opencl_cache_flush(cache) == KC_OK);
    EXPECT(kc_persistence_stats(tiers, &t) == KC_OK);
    EXPECT(t.puts >= 1 && t.pending_writes == 0 && t.failed_writes == 0);
    s = stats_of(cache);
    EXPECT(kc_opencl_cache_flush(NULL) == KC_ERR_INVALID_ARGUMENT);

    /* A reset zeroes the counters, keeps the gauges; the next hit counts again. */
    EXPECT(kc_hit_rate(s.memory.hits + s.binary_loads, s.memory.misses - s.binary_loads) == 0.5);
    EXPECT(kc_opencl_cache_reset_stats(cache) == KC_OK);
    s = stats_of(cache);
    EXPECT(s.source_builds == 0 && s.memory.hits == 0 && s.memory.misses == 0);
    EXPECT(s.disk_misses == 0);
    EXPECT(kc_persistence_stats(tiers, &t) == KC_OK && t.puts == 0);
    EXPECT(s.memory.entries == 1 && s.memory.leases == 1);
    EXPECT(kc_opencl_cache_find_or_build(cache, context, device, &SOURCE, NULL, 1, "", &again) ==
           KC_OK);
    kc_opencl_lease_release(again);
    s = stats_of(cache);
    EXPECT(s.memory.hits == 1 && s.source_builds == 0);
    EXPECT(kc_opencl_cache_reset_stats(NULL) == KC_ERR_INVALID_ARGUMENT);

    /* Evicting the context releases the program exactly once, when the last lease goes. */
    clRetainProgram((cl_program)program);
    EXPECT(reference_count(program) == 2);
    size_t evicted = 0;
    EXPECT(kc_opencl_cache_evict_context(cache, context, &evicted) == KC_OK);
    EXPECT(evicted == 1);
    EXPECT(reference_count(program) == 2);
    kc_opencl_lease_release(lease);
    EXPECT(reference_count(program) == 1);
    EXPECT(stats_of(cache).memory.destroys == 1);
    EXPECT(kc_opencl_cache_evict_device(cache, device, &evicted) == KC_OK && evicted == 0);
    clReleaseProgram((cl_program)program);

    /* NULL handles are refused (they would evict nothing), and the count is left alone. */
    evicted = 7;
    EXPECT(kc_opencl_cache_evict_context(cache, NULL, &evicted) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "context") != NULL);
    EXPECT(kc_opencl_cache_evict_device(cache, NULL, &evicted) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "device") != NULL);
    EXPECT(kc_opencl_cache_evict_context(NULL, context, &evicted) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(kc_opencl_cache_evict_device(NULL, device, &evicted) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(evicted == 7);

    /* A compile error: the status, the OpenCL code and the log. */
    const char *broken = "__kernel void broken(__global float *x) { x[0] = not_declared; }";
    EXPECT(kc_opencl_cache_find_or_build(cache, context, device, &broken, NULL, 1, "", &lease) ==
           KC_ERR_BUILD_FAILED);
    EXPECT(kc_last_build_error() == CL_BUILD_PROGRAM_FAILURE);
    EXPECT(strstr(kc_last_error_message(), "not_declared") != NULL);
    kc_opencl_cache_free(cache);

    /* A new cache on the same directory (as a new process would) loads the binary from disk. */
    EXPECT(kc_opencl_cache_new(&opts, tiers, &cache) == KC_OK);
    EXPECT(kc_opencl_cache_find_or_build(cache, context, device, &SOURCE, NULL, 1, "", &lease) ==
           KC_OK);
    EXPECT(run_add_one(context, queue, kc_opencl_lease_program(lease)));
    s = stats_of(cache);
    EXPECT(s.source_builds == 0 && s.binary_loads == 1 && s.disk_hits == 1);
    kc_opencl_lease_release(lease);
    EXPECT(kc_opencl_cache_clear(cache) == KC_OK);
    EXPECT(stats_of(cache).memory.entries == 0);
    kc_opencl_cache_free(cache);
    kc_persistence_free(tiers);

    test_own_reference(context, device, queue);
    char headers_dir[4096];
    snprintf(headers_dir, sizeof headers_dir, "%s-headers-cache", argv[1]);
    test_headers(headers_dir, context, device, queue);

    clReleaseCommandQueue(queue);
    clReleaseContext(context);
    return check_finish("opencl_test");
}
