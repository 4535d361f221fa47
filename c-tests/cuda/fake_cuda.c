/*
 * fake_cuda.c - a test driver library that stands in for libcuda.so.1.
 *
 * No GPU is available on the build and CI machines, so kcache's CUDA tests load this library
 * instead of the real NVIDIA driver (via KCACHE_CUDA_LIBRARY or an explicit path). It exports
 * the driver entry points kcache resolves, under the same versioned names and C prototypes,
 * and behaves like the driver where kcache depends on it:
 *
 *   - contexts are bound per thread, as a stack (cuCtxPushCurrent_v2 / cuCtxPopCurrent_v2 /
 *     cuCtxSetCurrent); linking, loading and unloading need a current context;
 *   - cuLink* turns PTX into a deterministic "cubin": a header with the target compute
 *     capability, a hash of the PTX and the names of its .entry kernels;
 *   - cuModuleLoadDataEx accepts such a cubin only for a device of the same compute capability,
 *     and (for kcache's rejection path) refuses the next N cubins when told to; it takes a real
 *     cubin of NVIDIA's compilers (an ELF of EM_CUDA) for a device of its architecture, its
 *     kernels named by its sections, so that tests with the real NVRTC can load what it makes;
 *   - cuModuleUnload fails with CUDA_ERROR_INVALID_CONTEXT unless the module's own context is
 *     current, and with CUDA_ERROR_INVALID_HANDLE on a module already unloaded;
 *     cuModuleGetFunction needs a current context too;
 *   - a module whose context was destroyed (a primary context's last release included) is
 *     CUDA_ERROR_CONTEXT_IS_DESTROYED (709), and so is pushing a released primary context;
 *   - CU_JIT_TARGET takes CUjit_target values (cuda.h 12.4: CU_TARGET_COMPUTE_30 ... _90 and
 *     CU_TARGET_COMPUTE_90A = CU_COMPUTE_ACCELERATED_TARGET_BASE + 90), anything else is
 *     CUDA_ERROR_INVALID_VALUE;
 *   - cuLinkAddData refuses PTX without its terminating NUL within `size`, and per-input options
 *     that cuda.h does not list as PTX compiler options;
 *   - the IN/OUT options (CU_JIT_THREADS_PER_BLOCK, the log sizes) get their OUT value written
 *     back into the caller's option value array when the link completes or fails, as the
 *     driver does: that array must live until cuLinkDestroy;
 *   - with lazy loading (CUDA_MODULE_LOADING=LAZY at cuInit, or fakecuda_lazy_loading(1)), the
 *     failures fakecuda_fail_next_loads injects are deferred from cuModuleLoadDataEx to the
 *     module's first cuModuleGetFunction, as the driver defers loading the kernel.
 *
 * Every call is counted; tests read the counters through fakecuda_counter("name"). Controls:
 * fakecuda_reject_next_loads(n) (or FAKECUDA_REJECT_LOADS=n at cuInit), fakecuda_fail_next_loads(n,
 * code) for the failures of a good image (out of memory, ...), fakecuda_hold_links(1)
 * to park cuLinkComplete until fakecuda_hold_links(0), FAKECUDA_DRIVER_VERSION (default 12040,
 * or fakecuda_set_driver_version) and FAKECUDA_INIT_RESULT (the status cuInit returns, default 0).
 *
 * Devices: ordinal 0 is "kcache fake GPU 0" (compute capability 8.0), ordinal 1 is
 * "kcache fake GPU 1" (9.0). Tests create contexts with cuCtxCreate_v2, which kcache never calls.
 *
 * For the cuda_check example it also has host-memory "device" buffers and a CPU run of the
 * repository's saxpy kernel (see the end of this file).
 *
 * Handles other than events are never freed, so a stale handle is detected instead of being a
 * use-after-free.
 */
#define _GNU_SOURCE
#include <math.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
};

#define EXPORT __attribute__((visibility("default")))

#define CTX_MAGIC 0x43545821u
#define MOD_MAGIC 0x4d4f4421u
#define FUN_MAGIC 0x46554e21u
#define LNK_MAGIC 0x4c4e4b21u
#define DEAD_MAGIC 0xdeadbeefu

#define MAX_ENTRIES 16
#define MAX_NAME 64
#define NUM_DEVICES 2

static const char CUBIN_MAGIC[8] = {'K', 'C', 'F', 'A', 'K', 'E', 'C', 'B'};

struct fake_ctx {
    unsigned magic;
    int device;
    /* Primary contexts only: the retain count, and how many times the context was destroyed
     * (by the last release). A primary context comes back at the same address when retained
     * again, as the driver's does; its modules from before do not. */
    int retained;
    unsigned generation;
};

struct fake_function {
    unsigned magic;
    struct fake_module *module;
    char name[MAX_NAME];
};

struct fake_module {
    unsigned magic;
    struct fake_ctx *ctx;
    unsigned generation; /* the context's when loaded */
    CUresult deferred;   /* lazy loading: a load failure the first cuModuleGetFunction reports */
    int nentries;
    struct fake_function functions[MAX_ENTRIES];
};

struct fake_link {
    unsigned magic;
    struct fake_ctx *ctx;
    int target; /* compute capability, major * 10 + minor */
    char *error_log;
    size_t error_log_size;
    char *info_log;
    size_t info_log_size;
    int verbose;
    /* The caller's option value array and where the OUT values go in it (-1: not given). */
    void **values;
    int threads_index, info_size_index, error_size_index;
    unsigned threads;
    uint64_t hash;
    int added;
    int nentries;
    char entries[MAX_ENTRIES][MAX_NAME];
    unsigned char *cubin;
    size_t cubin_size;
};

/* ---- counters ---------------------------------------------------------------------------- */

enum counter {
    C_INIT, C_LINK_CREATE, C_LINK_ADD_DATA, C_LINK_COMPLETE, C_LINK_DESTROY, C_LINK_FAILED,
    C_MODULE_LOAD, C_MODULE_LOAD_PTX, C_MODULE_LOAD_REJECTED, C_MODULE_LOAD_FAILED,
    C_MODULE_UNLOAD, C_UNLOAD_WRONG_CONTEXT, C_UNLOAD_INVALID, C_GET_FUNCTION, C_CTX_PUSH,
    C_CTX_POP, C_LIVE_MODULES, C_LAST_MAX_REGISTERS, C_LINK_WAITING, C_PRIMARY_DESTROYED,
    C_MODULE_LOAD_ELF, C_LAST_ELF_ARCH, C_COUNT
};

static const char *const COUNTER_NAMES[C_COUNT] = {
    "init", "link_create", "link_add_data", "link_complete", "link_destroy", "link_failed",
    "module_load", "module_load_ptx", "module_load_rejected", "module_load_failed",
    "module_unload", "unload_wrong_context", "unload_invalid", "get_function", "ctx_push",
    "ctx_pop", "live_modules", "last_max_registers", "link_waiting", "primary_destroyed",
    "module_load_elf", "last_elf_arch",
};

static unsigned long long counters[C_COUNT];
static int initialized;
static int reject_loads;
static int reject_code = CUDA_ERROR_INVALID_IMAGE;
static int hold_links;
static int lazy_loading;

static void bump(enum counter c) { __atomic_add_fetch(&counters[c], 1, __ATOMIC_SEQ_CST); }

/* Returns a counter by name, or ~0 for an unknown name so a typo in a test cannot pass. */
EXPORT unsigned long long fakecuda_counter(const char *name) {
    for (int i = 0; i < C_COUNT; i++)
        if (name && strcmp(name, COUNTER_NAMES[i]) == 0)
            return __atomic_load_n(&counters[i], __ATOMIC_SEQ_CST);
    return ~0ull;
}

/* The next `n` cubin loads fail with `code`. cuModuleLoadDataEx documents more than image
 * refusals: CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_CONTEXT, and the sticky error of an
 * earlier asynchronous launch (CUDA_ERROR_ILLEGAL_ADDRESS, 700) all come back from a load of a
 * perfectly good image. */
EXPORT void fakecuda_fail_next_loads(int n, int code) {
    __atomic_store_n(&reject_code, code, __ATOMIC_SEQ_CST);
    __atomic_store_n(&reject_loads, n, __ATOMIC_SEQ_CST);
}

/* The next `n` cubin loads fail with CUDA_ERROR_INVALID_IMAGE, as a driver does with an image
 * it cannot use. */
EXPORT void fakecuda_reject_next_loads(int n) { fakecuda_fail_next_loads(n, CUDA_ERROR_INVALID_IMAGE); }

/* While on, loads defer the failures injected above to the module's first cuModuleGetFunction. */
EXPORT void fakecuda_lazy_loading(int on) { __atomic_store_n(&lazy_loading, on, __ATOMIC_SEQ_CST); }

/* While on, cuLinkComplete waits (counted in "link_waiting") until it is turned off. */
EXPORT void fakecuda_hold_links(int on) { __atomic_store_n(&hold_links, on, __ATOMIC_SEQ_CST); }

/* The CUDA version cuDriverGetVersion reports from now on (0: FAKECUDA_DRIVER_VERSION's), so
 * that tests of one process can pose as drivers of different releases. */
static int set_driver_version;
EXPORT void fakecuda_set_driver_version(int version) {
    __atomic_store_n(&set_driver_version, version, __ATOMIC_SEQ_CST);
}

/* ---- per-thread context stack ------------------------------------------------------------ */

#define STACK_DEPTH 32
static __thread struct fake_ctx *ctx_stack[STACK_DEPTH];
static __thread int ctx_depth;

static struct fake_ctx *current(void) { return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL; }

static int live_ctx(const struct fake_ctx *c) { return c != NULL && c->magic == CTX_MAGIC; }

/* Primary contexts: not live until retained. */
static struct fake_ctx primary[NUM_DEVICES] = {{0, 0, 0, 0}, {0, 1, 0, 0}};

/* Why `c` cannot be made current: a primary context released for good is destroyed (709), any
 * other dead or unknown context invalid. */
static CUresult unusable_ctx(const struct fake_ctx *c) {
    for (int d = 0; d < NUM_DEVICES; d++)
        if (c == &primary[d] && primary[d].retained == 0)
            return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return CUDA_ERROR_INVALID_CONTEXT;
}

#define REQUIRE_INIT()                                                                             \
    do {                                                                                           \
        if (!__atomic_load_n(&initialized, __ATOMIC_SEQ_CST))                                      \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
    } while (0)

/* Sets `handle` to a new zeroed handle stamped with `stamp`; returns CUDA_ERROR_INVALID_VALUE
 * from the caller when out of memory. */
#define NEW_HANDLE(handle, stamp)                                                                  \
    do {                                                                                           \
        (handle) = calloc(1, sizeof *(handle));                                                    \
        if (!(handle))                                                                             \
            return CUDA_ERROR_INVALID_VALUE;                                                       \
        (handle)->magic = (stamp);                                                                 \
    } while (0)

/* Marks `handle` dead, the first step of destroying it; returns CUDA_ERROR_INVALID_HANDLE from
 * the caller unless it is a live handle stamped with `stamp`. */
#define KILL_HANDLE(handle, stamp)                                                                 \
    do {                                                                                           \
        if (!(handle) || (handle)->magic != (stamp))                                               \
            return CUDA_ERROR_INVALID_HANDLE;                                                      \
        (handle)->magic = DEAD_MAGIC;                                                              \
    } while (0)

/* ---- initialisation and devices ---------------------------------------------------------- */

/* The checks of a call about `device` that writes through an out-parameter, in the driver's
 * order: CUDA_ERROR_NOT_INITIALIZED before cuInit, CUDA_ERROR_INVALID_VALUE unless `out_ok` (the
 * out-parameter is usable), CUDA_ERROR_INVALID_DEVICE for a device that does not exist. */
static CUresult check_device_call(int out_ok, CUdevice device) {
    if (!__atomic_load_n(&initialized, __ATOMIC_SEQ_CST))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!out_ok)
        return CUDA_ERROR_INVALID_VALUE;
    if (device < 0 || device >= NUM_DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

#define REQUIRE_DEVICE_CALL(out_ok, device)                                                        \
    do {                                                                                           \
        CUresult checked_ = check_device_call((out_ok), (device));                                 \
        if (checked_ != CUDA_SUCCESS)                                                              \
            return checked_;                                                                       \
    } while (0)

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

EXPORT CUresult cuInit(unsigned int flags) {
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult forced = env_int("FAKECUDA_INIT_RESULT", 0);
    if (forced != CUDA_SUCCESS)
        return forced;
    bump(C_INIT);
    if (!__atomic_exchange_n(&initialized, 1, __ATOMIC_SEQ_CST)) {
        fakecuda_reject_next_loads(env_int("FAKECUDA_REJECT_LOADS", 0));
        const char *loading = getenv("CUDA_MODULE_LOADING");
        fakecuda_lazy_loading(loading && strcmp(loading, "LAZY") == 0);
    }
    return CUDA_SUCCESS;
}

static int driver_version(void) {
    int set = __atomic_load_n(&set_driver_version, __ATOMIC_SEQ_CST);
    return set ? set : env_int("FAKECUDA_DRIVER_VERSION", 12040);
}

EXPORT CUresult cuDriverGetVersion(int *version) {
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = driver_version();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    REQUIRE_DEVICE_CALL(device != NULL, ordinal);
    *device = ordinal;
    return CUDA_SUCCESS;
}

static int capability(CUdevice d) { return d == 0 ? 80 : 90; }

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
    REQUIRE_DEVICE_CALL(name != NULL && len > 0, device);
    snprintf(name, (size_t)len, "kcache fake GPU %d", device);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device) {
    REQUIRE_DEVICE_CALL(value != NULL, device);
    switch (attribute) {
    case 75: *value = capability(device) / 10; return CUDA_SUCCESS;
    case 76: *value = capability(device) % 10; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **text) {
    if (!text)
        return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *text = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
    case CUDA_ERROR_NO_DEVICE: *text = "no CUDA-capable device is detected"; break;
    case CUDA_ERROR_INVALID_DEVICE: *text = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_IMAGE: *text = "device kernel image is invalid"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
    case CUDA_ERROR_NO_BINARY_FOR_GPU: *text = "no kernel image is available for execution on the device"; break;
    case CUDA_ERROR_INVALID_PTX: *text = "a PTX JIT compilation failed"; break;
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION: *text = "the provided PTX was compiled with an unsupported toolchain."; break;
    case CUDA_ERROR_INVALID_HANDLE: *text = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_FOUND: *text = "named symbol not found"; break;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: *text = "context is destroyed"; break;
    default: *text = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* ---- contexts ---------------------------------------------------------------------------- */

/* Test-only: kcache never creates contexts. Like the driver, the new context becomes current. */
EXPORT CUresult cuCtxCreate_v2(struct fake_ctx **out, unsigned int flags, CUdevice device) {
    (void)flags;
    REQUIRE_DEVICE_CALL(out != NULL, device);
    if (ctx_depth == STACK_DEPTH)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_ctx *c;
    NEW_HANDLE(c, CTX_MAGIC);
    c->device = device;
    ctx_stack[ctx_depth++] = c;
    *out = c;
    return CUDA_SUCCESS;
}

/* Test-only. Marks the context dead; it stays allocated so stale uses are detected. */
EXPORT CUresult cuCtxDestroy_v2(struct fake_ctx *c) {
    REQUIRE_INIT();
    if (!live_ctx(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    c->magic = DEAD_MAGIC;
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] == c) {
            memmove(&ctx_stack[i], &ctx_stack[i + 1], (size_t)(ctx_depth - i - 1) * sizeof c);
            ctx_depth--;
            i--;
        }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(struct fake_ctx **out) {
    REQUIRE_INIT();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    *out = current();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(struct fake_ctx *c) {
    REQUIRE_INIT();
    if (c == NULL) {
        if (ctx_depth > 0)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (!live_ctx(c))
        return unusable_ctx(c);
    if (ctx_depth == 0)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(struct fake_ctx *c) {
    REQUIRE_INIT();
    if (!live_ctx(c))
        return unusable_ctx(c);
    if (ctx_depth == STACK_DEPTH)
        return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = c;
    bump(C_CTX_PUSH);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(struct fake_ctx **out) {
    REQUIRE_INIT();
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fake_ctx *c = ctx_stack[--ctx_depth];
    if (out)
        *out = c;
    bump(C_CTX_POP);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
    REQUIRE_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_ctx *c = current();
    if (!live_ctx(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = c->device;
    return CUDA_SUCCESS;
}

/* ---- linking ----------------------------------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* The capability a CUjit_target value names (cuda.h 12.4), -1 for any other value. The
 * accelerated targets are CU_COMPUTE_ACCELERATED_TARGET_BASE (0x10000) plus the capability:
 * 90A compiles for a 9.0 device, it is not the capability 65626. */
static int jit_target(unsigned v) {
    static const unsigned TARGETS[] = {30, 32, 35, 37, 50, 52, 53, 60, 61, 62,
                                       70, 72, 75, 80, 86, 87, 89, 90, 0x10000 + 90};
    for (size_t i = 0; i < sizeof TARGETS / sizeof TARGETS[0]; i++)
        if (TARGETS[i] == v)
            return (int)(v & 0xffff);
    return -1;
}

/* Writes the OUT values of the IN/OUT options back into the caller's option value array, as
 * the driver does once it has compiled (or failed to): the bytes of each log filled, NUL
 * included, and the threads per block targeted. */
static size_t filled(const char *log, size_t size) {
    if (!log || size == 0)
        return 0;
    size_t n = strnlen(log, size);
    return n < size ? n + 1 : size;
}

static void write_back(struct fake_link *l) {
    if (l->info_size_index >= 0)
        l->values[l->info_size_index] = (void *)(uintptr_t)filled(l->info_log, l->info_log_size);
    if (l->error_size_index >= 0)
        l->values[l->error_size_index] = (void *)(uintptr_t)filled(l->error_log, l->error_log_size);
    if (l->threads_index >= 0)
        l->values[l->threads_index] = (void *)(uintptr_t)l->threads;
}

static void log_error(struct fake_link *l, const char *message) {
    if (l->error_log && l->error_log_size > 0)
        snprintf(l->error_log, l->error_log_size, "%s", message);
}

EXPORT CUresult cuLinkCreate_v2(unsigned int n, const unsigned int *options, void **values,
                                struct fake_link **out) {
    REQUIRE_INIT();
    if (!out || (n > 0 && (!options || !values)))
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_ctx *c = current();
    if (!live_ctx(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fake_link *l;
    NEW_HANDLE(l, LNK_MAGIC);
    l->ctx = c;
    l->target = capability(c->device);
    l->hash = 0xcbf29ce484222325ull;
    l->values = values;
    l->threads_index = l->info_size_index = l->error_size_index = -1;
    int threads_per_block = 0, target = 0;
    for (unsigned i = 0; i < n; i++) {
        uintptr_t v = (uintptr_t)values[i];
        switch (options[i]) {
        case 0: /* CU_JIT_MAX_REGISTERS */
            __atomic_store_n(&counters[C_LAST_MAX_REGISTERS], (unsigned long long)v, __ATOMIC_SEQ_CST);
            break;
        case 1: /* CU_JIT_THREADS_PER_BLOCK: IN, and OUT the number the compiler targeted */
            threads_per_block = 1;
            l->threads = (unsigned)v;
            l->threads_index = (int)i;
            break;
        case 3: l->info_log = (char *)values[i]; break;
        case 4: l->info_log_size = (size_t)v; l->info_size_index = (int)i; break;
        case 5: l->error_log = (char *)values[i]; break;
        case 6: l->error_log_size = (size_t)v; l->error_size_index = (int)i; break;
        case 9: /* CU_JIT_TARGET: a CUjit_target */
            l->target = jit_target((unsigned)v);
            if (l->target < 0) {
                free(l);
                return CUDA_ERROR_INVALID_VALUE;
            }
            target = 1;
            break;
        case 10: /* CU_JIT_FALLBACK_STRATEGY: "cannot be used with cuLink* APIs" */
            free(l);
            return CUDA_ERROR_INVALID_VALUE;
        case 12: l->verbose = v != 0; break; /* CU_JIT_LOG_VERBOSE */
        default:
            if (options[i] > 30) {
                free(l);
                return CUDA_ERROR_INVALID_VALUE;
            }
        }
        /* The hash covers the options, so different options give a different image. */
        l->hash = fnv1a(l->hash, (const unsigned char *)&options[i], sizeof options[i]);
        if (options[i] < 3 || options[i] > 6) /* not a log buffer or its size */
            l->hash = fnv1a(l->hash, (const unsigned char *)&v, sizeof v);
    }
    if (threads_per_block && target) { /* documented as not combinable */
        free(l);
        return CUDA_ERROR_INVALID_VALUE;
    }
    bump(C_LINK_CREATE);
    *out = l;
    return CUDA_SUCCESS;
}

/* Records the name after each ".entry" directive. */
static int parse_entries(struct fake_link *l, const char *ptx, size_t n) {
    const char *end = ptx + n;
    for (const char *p = ptx; p + 6 < end; p++) {
        if (memcmp(p, ".entry", 6) != 0)
            continue;
        p += 6;
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
            p++;
        size_t len = 0;
        while (p + len < end && (p[len] == '_' || p[len] == '$' || (p[len] >= '0' && p[len] <= '9') ||
                                 (p[len] >= 'a' && p[len] <= 'z') || (p[len] >= 'A' && p[len] <= 'Z')))
            len++;
        if (len == 0 || len >= MAX_NAME || l->nentries == MAX_ENTRIES)
            return 0;
        memcpy(l->entries[l->nentries], p, len);
        l->entries[l->nentries][len] = '\0';
        l->nentries++;
    }
    return 1;
}

static int contains(const char *hay, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++)
        if (memcmp(hay + i, needle, m) == 0)
            return 1;
    return 0;
}

/* The number after the first `directive` in the PTX, read as "major.minor" or "sm_NN"
 * (major * 10 + minor, or NN); -1 when absent. */
static int ptx_number(const char *ptx, size_t n, const char *directive) {
    size_t m = strlen(directive);
    for (size_t i = 0; i + m < n; i++) {
        if (memcmp(ptx + i, directive, m) != 0)
            continue;
        const char *p = ptx + i + m;
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncmp(p, "sm_", 3) == 0)
            return atoi(p + 3);
        int major = atoi(p), minor = 0;
        const char *dot = strchr(p, '.');
        if (dot && dot - p < 4)
            minor = atoi(dot + 1);
        return major * 10 + minor;
    }
    return -1;
}

/* The driver's JIT refuses PTX of a newer PTX ISA than its own CUDA release knows
 * (CUDA_ERROR_UNSUPPORTED_PTX_VERSION; the ISA approximated as major - 4 . minor: 12.4 knows
 * 8.4) and PTX whose .target is above the architecture it compiles for (CUDA_ERROR_INVALID_PTX,
 * as ptxas does). Returns 0 or that error, with the message in `*why`. */
static CUresult ptx_refusal(const char *ptx, size_t n, int target, const char **why) {
    int v = driver_version();
    int known = (v / 1000 - 4) * 10 + (v % 1000) / 10;
    if (ptx_number(ptx, n, ".version") > known) {
        *why = "ptxas application ptx input, line 1; fatal   : Unsupported .version; current version is older";
        return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    }
    if (ptx_number(ptx, n, ".target") > target) {
        *why = "ptxas fatal   : SM version specified by .target is higher than default SM version assumed";
        return CUDA_ERROR_INVALID_PTX;
    }
    return CUDA_SUCCESS;
}

/* Whether cuda.h lists `option` among the PTX compiler options, which are all a PTX input of
 * cuLinkAddData may take for itself: those that apply to the compiler ("compiler only",
 * "compiler and linker"), not CU_JIT_FALLBACK_STRATEGY (never with cuLink*), the dynamic
 * linker's (17-19, 25, 26) or link-time optimisation's (21-24, 27-29), nor unknown ones. */
static int ptx_input_option(unsigned option) {
    return option <= 16 ? option != 10 : option == 20 || (option >= 30 && option <= 33);
}

/* A failed cuLinkAddData: the log says why, the OUT values are written back. */
static CUresult add_failed(struct fake_link *l, const char *why, CUresult result) {
    log_error(l, why);
    write_back(l);
    bump(C_LINK_FAILED);
    return result;
}

EXPORT CUresult cuLinkAddData_v2(struct fake_link *l, unsigned int type, void *data, size_t size,
                                 const char *name, unsigned int n, unsigned int *options, void **values) {
    (void)name;
    REQUIRE_INIT();
    if (!l || l->magic != LNK_MAGIC || !data || size == 0 || (n > 0 && (!options || !values)))
        return CUDA_ERROR_INVALID_VALUE;
    bump(C_LINK_ADD_DATA);
    if (type != 1) /* CU_JIT_INPUT_PTX: the only input kcache links */
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++)
        if (!ptx_input_option(options[i]))
            return add_failed(l, "cuLinkAddData: option not applicable to a PTX input",
                              CUDA_ERROR_INVALID_VALUE);
    const char *ptx = data;
    /* PTX is a C string: its NUL must lie within `size`. */
    if (!memchr(ptx, 0, size))
        return add_failed(l, "ptxas fatal   : PTX input is not NUL-terminated", CUDA_ERROR_INVALID_PTX);
    size_t len = strlen(ptx);
    if (!contains(ptx, len, ".version") || !contains(ptx, len, ".target"))
        return add_failed(l, "ptxas fatal   : input is not PTX (missing .version or .target)",
                          CUDA_ERROR_INVALID_PTX);
    const char *why = NULL;
    CUresult refused = ptx_refusal(ptx, len, l->target, &why);
    if (refused != CUDA_SUCCESS)
        return add_failed(l, why, refused);
    if (!parse_entries(l, ptx, len))
        return add_failed(l, "ptxas fatal   : malformed or too many .entry directives",
                          CUDA_ERROR_INVALID_PTX);
    l->hash = fnv1a(l->hash, (const unsigned char *)ptx, len);
    l->added = 1;
    return CUDA_SUCCESS;
}

static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t get32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Cubin layout: magic[8], u32 total size, u32 target, u64 hash, u32 entry count, then per entry
 * a NUL-padded name of MAX_NAME bytes. */
#define CUBIN_HEADER 28

EXPORT CUresult cuLinkComplete(struct fake_link *l, void **cubin, size_t *size) {
    REQUIRE_INIT();
    if (!l || l->magic != LNK_MAGIC || !cubin || !size)
        return CUDA_ERROR_INVALID_VALUE;
    if (!l->added)
        return add_failed(l, "nvlink error   : no input", CUDA_ERROR_INVALID_VALUE);
    if (__atomic_load_n(&hold_links, __ATOMIC_SEQ_CST)) {
        bump(C_LINK_WAITING);
        while (__atomic_load_n(&hold_links, __ATOMIC_SEQ_CST))
            sched_yield();
    }
    size_t total = CUBIN_HEADER + (size_t)l->nentries * MAX_NAME;
    unsigned char *b = calloc(1, total);
    if (!b)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(b, CUBIN_MAGIC, 8);
    put32(b + 8, (uint32_t)total);
    put32(b + 12, (uint32_t)l->target);
    memcpy(b + 16, &l->hash, 8);
    put32(b + 24, (uint32_t)l->nentries);
    for (int i = 0; i < l->nentries; i++)
        memcpy(b + CUBIN_HEADER + (size_t)i * MAX_NAME, l->entries[i], MAX_NAME);
    free(l->cubin);
    l->cubin = b;
    l->cubin_size = total;
    *cubin = b;
    *size = total;
    /* What CU_JIT_LOG_VERBOSE adds to the information log, as ptxas words it. */
    if (l->verbose && l->info_log && l->info_log_size > 0 && l->nentries > 0)
        snprintf(l->info_log, l->info_log_size,
                 "ptxas info    : Compiling entry function '%s' for 'sm_%d'\n"
                 "ptxas info    : Used 8 registers", l->entries[0], l->target);
    write_back(l);
    bump(C_LINK_COMPLETE);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLinkDestroy(struct fake_link *l) {
    REQUIRE_INIT();
    KILL_HANDLE(l, LNK_MAGIC);
    free(l->cubin);
    l->cubin = NULL;
    bump(C_LINK_DESTROY);
    return CUDA_SUCCESS;
}

/* ---- modules ----------------------------------------------------------------------------- */

/* Counts a load that failed with `result`, and returns it. */
static CUresult load_failed(CUresult result) {
    bump(C_MODULE_LOAD_FAILED);
    return result;
}

/* A module not unloaded whose context is live and has not been destroyed since the load. */
static int live_module(const struct fake_module *m) {
    return m && m->magic == MOD_MAGIC && live_ctx(m->ctx) && m->generation == m->ctx->generation;
}

/* Why `m` cannot be used: its context was destroyed since the load (709), or it is no module
 * or one already unloaded. */
static CUresult dead_module(const struct fake_module *m) {
    if (m && m->magic == MOD_MAGIC)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return CUDA_ERROR_INVALID_HANDLE;
}

/* The results that condemn the image itself, which even lazy loading reports at load time. */
static int refuses_image(CUresult r) {
    return r == CUDA_ERROR_INVALID_IMAGE || r == CUDA_ERROR_NO_BINARY_FOR_GPU ||
           r == CUDA_ERROR_INVALID_PTX || r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
}

/* A live module of context `c` with `nentries` kernels, named by NUL-padded MAX_NAME-byte slots
 * from `names` on; counted as a load of `kind`. */
static CUresult new_module(struct fake_module **out, struct fake_ctx *c, int nentries,
                           const char *names, enum counter kind) {
    struct fake_module *m;
    NEW_HANDLE(m, MOD_MAGIC);
    m->ctx = c;
    m->generation = c->generation;
    m->nentries = nentries;
    for (int i = 0; i < nentries; i++) {
        m->functions[i].magic = FUN_MAGIC;
        m->functions[i].module = m;
        memcpy(m->functions[i].name, names + (size_t)i * MAX_NAME, MAX_NAME);
        m->functions[i].name[MAX_NAME - 1] = '\0';
    }
    bump(kind);
    bump(C_LIVE_MODULES);
    *out = m;
    return CUDA_SUCCESS;
}

/* A cubin of NVIDIA's compilers (NVRTC's nvrtcGetCUBIN, ptxas): an ELF64 whose e_machine is
 * EM_CUDA (190). Loaded as the driver would, without running anything: refused unless its
 * architecture is the device's (e_flags bits 0-7 name it up to ELF ABI version 7, CUDA 12's;
 * bits 8-15 from version 8 on, CUDA 13's); its kernels are the sections named
 * ".nv.info.<kernel>", which the compilers write for each entry. Counted in "module_load_elf",
 * with the architecture in "last_elf_arch". The size is not passed, so the section headers
 * are trusted to lie within the image, as the driver trusts them. */
static CUresult load_elf(struct fake_module **out, struct fake_ctx *c, const unsigned char *b) {
    uint16_t machine, shentsize, shnum, shstrndx;
    uint32_t flags;
    uint64_t shoff, stroff;
    memcpy(&machine, b + 18, 2);
    memcpy(&flags, b + 48, 4);
    memcpy(&shoff, b + 40, 8);
    memcpy(&shentsize, b + 58, 2);
    memcpy(&shnum, b + 60, 2);
    memcpy(&shstrndx, b + 62, 2);
    if (b[4] != 2 || machine != 190 || shentsize != 64 || shstrndx >= shnum)
        return load_failed(CUDA_ERROR_INVALID_IMAGE);
    int arch = (int)(b[8] >= 8 ? (flags >> 8) & 0xff : flags & 0xff);
    __atomic_store_n(&counters[C_LAST_ELF_ARCH], (unsigned long long)arch, __ATOMIC_SEQ_CST);
    if (arch != capability(c->device))
        return load_failed(CUDA_ERROR_NO_BINARY_FOR_GPU);
    memcpy(&stroff, b + shoff + (uint64_t)shstrndx * 64 + 24, 8);
    static const char prefix[] = ".nv.info.";
    char names[MAX_ENTRIES][MAX_NAME];
    int nentries = 0;
    memset(names, 0, sizeof names);
    for (uint16_t i = 0; i < shnum; i++) {
        uint32_t name;
        memcpy(&name, b + shoff + (uint64_t)i * 64, 4);
        const char *section = (const char *)b + stroff + name;
        if (strncmp(section, prefix, sizeof prefix - 1) != 0)
            continue;
        if (nentries == MAX_ENTRIES || strlen(section + sizeof prefix - 1) >= MAX_NAME)
            return load_failed(CUDA_ERROR_INVALID_IMAGE);
        strcpy(names[nentries++], section + sizeof prefix - 1);
    }
    bump(C_MODULE_LOAD_ELF);
    return new_module(out, c, nentries, (const char *)names, C_MODULE_LOAD);
}

EXPORT CUresult cuModuleLoadDataEx(struct fake_module **out, const void *image, unsigned int n,
                                   unsigned int *options, void **values) {
    (void)n, (void)options, (void)values;
    REQUIRE_INIT();
    if (!out || !image)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_ctx *c = current();
    if (!live_ctx(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    const unsigned char *b = image;
    if (memcmp(b, "\x7f" "ELF", 4) == 0)
        return load_elf(out, c, b);
    if (memcmp(b, CUBIN_MAGIC, 8) != 0) {
        /* PTX handed straight to the loader is JIT-compiled, as the driver does. kcache never
         * does this (it links, to keep the cubin); the cuda_check example's "jit" mode does. */
        const char *ptx = image;
        size_t len = strnlen(ptx, 1 << 24);
        struct fake_link jit = {.magic = LNK_MAGIC};
        if (!contains(ptx, len, ".version") || !contains(ptx, len, ".target") ||
            !parse_entries(&jit, ptx, len))
            return load_failed(CUDA_ERROR_INVALID_IMAGE);
        const char *why = NULL;
        CUresult refused = ptx_refusal(ptx, len, capability(c->device), &why);
        if (refused != CUDA_SUCCESS)
            return load_failed(refused);
        return new_module(out, c, jit.nentries, (const char *)jit.entries, C_MODULE_LOAD_PTX);
    }
    CUresult deferred = CUDA_SUCCESS;
    int pending = __atomic_load_n(&reject_loads, __ATOMIC_SEQ_CST);
    while (pending > 0) {
        if (__atomic_compare_exchange_n(&reject_loads, &pending, pending - 1, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST)) {
            bump(C_MODULE_LOAD_REJECTED);
            CUresult code = __atomic_load_n(&reject_code, __ATOMIC_SEQ_CST);
            if (!__atomic_load_n(&lazy_loading, __ATOMIC_SEQ_CST) || refuses_image(code))
                return code;
            deferred = code;
        }
    }
    uint32_t total = get32(b + 8), target = get32(b + 12), nentries = get32(b + 24);
    if (nentries > MAX_ENTRIES || total != CUBIN_HEADER + nentries * MAX_NAME)
        return load_failed(CUDA_ERROR_INVALID_IMAGE);
    if ((int)target != capability(c->device))
        return load_failed(CUDA_ERROR_NO_BINARY_FOR_GPU);
    CUresult loaded = new_module(out, c, (int)nentries, (const char *)b + CUBIN_HEADER, C_MODULE_LOAD);
    if (loaded == CUDA_SUCCESS)
        (*out)->deferred = deferred;
    return loaded;
}

EXPORT CUresult cuModuleUnload(struct fake_module *m) {
    REQUIRE_INIT();
    if (!live_module(m)) {
        bump(C_UNLOAD_INVALID);
        return dead_module(m);
    }
    if (current() != m->ctx) {
        bump(C_UNLOAD_WRONG_CONTEXT);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    m->magic = DEAD_MAGIC;
    bump(C_MODULE_UNLOAD);
    __atomic_sub_fetch(&counters[C_LIVE_MODULES], 1, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(struct fake_function **out, struct fake_module *m, const char *name) {
    REQUIRE_INIT();
    if (!out || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!live_ctx(current()))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!live_module(m))
        return dead_module(m);
    bump(C_GET_FUNCTION);
    /* Lazy loading loads the kernel now; a failure of the moment is reported once, and the
     * next call tries again. */
    CUresult deferred = __atomic_exchange_n(&m->deferred, CUDA_SUCCESS, __ATOMIC_SEQ_CST);
    if (deferred != CUDA_SUCCESS)
        return deferred;
    for (int i = 0; i < m->nentries; i++)
        if (strcmp(m->functions[i].name, name) == 0) {
            *out = &m->functions[i];
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_NOT_FOUND;
}

/* ---- memory and launches, for the cuda_check example ------------------------------------- */
/* Device memory is host memory. cuLaunchKernel runs the one kernel it knows, the repository's
 * saxpy.ptx (parameters: u32 n, f32 a, f32 *x, f32 *y), on the CPU, so the example's argument
 * marshalling and result check run in CI; any other kernel is CUDA_ERROR_NOT_FOUND. */

typedef unsigned long long CUdeviceptr;


EXPORT CUresult cuDevicePrimaryCtxRetain(struct fake_ctx **out, CUdevice device) {
    REQUIRE_DEVICE_CALL(out != NULL, device);
    struct fake_ctx *c = &primary[device];
    if (c->retained++ == 0)
        c->magic = CTX_MAGIC;
    *out = c;
    return CUDA_SUCCESS;
}

/* The last release destroys the primary context, as the driver documents: its modules are gone
 * (using them is CUDA_ERROR_INVALID_HANDLE here, undefined behaviour on the driver), and the
 * next retain makes a new context at the same address. */
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    REQUIRE_DEVICE_CALL(1, device);
    struct fake_ctx *c = &primary[device];
    if (c->retained == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (--c->retained == 0) {
        c->magic = DEAD_MAGIC;
        c->generation++;
        bump(C_PRIMARY_DESTROYED);
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *out, size_t bytes) {
    REQUIRE_INIT();
    if (!out || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!live_ctx(current()))
        return CUDA_ERROR_INVALID_CONTEXT;
    void *p = malloc(bytes);
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    *out = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    REQUIRE_INIT();
    free((void *)(uintptr_t)p);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
    REQUIRE_INIT();
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy((void *)(uintptr_t)dst, src, bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
    REQUIRE_INIT();
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(struct fake_function *f, unsigned gx, unsigned gy, unsigned gz,
                               unsigned bx, unsigned by, unsigned bz, unsigned shared,
                               void *stream, void **params, void **extra) {
    (void)shared, (void)stream, (void)extra;
    REQUIRE_INIT();
    if (!f || f->magic != FUN_MAGIC || !live_module(f->module))
        return CUDA_ERROR_INVALID_HANDLE;
    if (current() != f->module->ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!params || gy != 1 || gz != 1 || by != 1 || bz != 1)
        return CUDA_ERROR_INVALID_VALUE;
    if (strcmp(f->name, "saxpy") != 0)
        return CUDA_ERROR_NOT_FOUND;
    unsigned n = *(const unsigned *)params[0];
    float a = *(const float *)params[1];
    const float *x = (const float *)(uintptr_t)*(const CUdeviceptr *)params[2];
    float *y = (float *)(uintptr_t)*(const CUdeviceptr *)params[3];
    unsigned long long threads = (unsigned long long)gx * bx;
    for (unsigned long long i = 0; i < threads && i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
    return CUDA_SUCCESS;
}

/* Events, for timing kernels: launches run to completion on the CPU, so an event records the
 * time at which it is recorded. */
#define EVT_MAGIC 0x45565421u
struct fake_event {
    unsigned magic;
    int recorded;
    struct timespec at;
};

EXPORT CUresult cuEventCreate(struct fake_event **out, unsigned int flags) {
    (void)flags;
    REQUIRE_INIT();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!live_ctx(current()))
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fake_event *e;
    NEW_HANDLE(e, EVT_MAGIC);
    *out = e;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(struct fake_event *e, void *stream) {
    REQUIRE_INIT();
    if (!e || e->magic != EVT_MAGIC || stream != NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    clock_gettime(CLOCK_MONOTONIC, &e->at);
    e->recorded = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(struct fake_event *e) {
    REQUIRE_INIT();
    return e && e->magic == EVT_MAGIC ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuEventElapsedTime(float *ms, struct fake_event *start, struct fake_event *end) {
    REQUIRE_INIT();
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    if (!start || start->magic != EVT_MAGIC || !end || end->magic != EVT_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!start->recorded || !end->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)((double)(end->at.tv_sec - start->at.tv_sec) * 1e3 +
                  (double)(end->at.tv_nsec - start->at.tv_nsec) / 1e6);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(struct fake_event *e) {
    REQUIRE_INIT();
    KILL_HANDLE(e, EVT_MAGIC);
    free(e);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
    REQUIRE_INIT();
    return live_ctx(current()) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
