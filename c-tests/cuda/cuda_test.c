/*
 * The kc_cuda_* C API through the real header and the built library.
 *
 * No GPU is available in CI, so the driver here is the test driver library fake_cuda.c,
 * which stands in for libcuda.so.1: this program links it for the calls kcache never makes
 * (creating contexts, reading the call counters), and kcache loads the same library through
 * kc_cuda_options.driver_library, so both see one instance.
 *
 * kcache.h must not need cuda.h: this file includes no CUDA header and passes handles as
 * void *.
 *
 * Usage: cuda_test FAKE_DRIVER_PATH DISK_DIR     the cold and warm paths
 *        cuda_test unavailable                   no driver: KC_ERR_UNAVAILABLE
 */
#define _POSIX_C_SOURCE 200112L /* setenv */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../checks.h"

/* The fake driver's test-only entry points, declared here as no header is shipped for them. */
int cuCtxCreate_v2(void **ctx, unsigned int flags, int device);
int cuCtxPopCurrent_v2(void **ctx);
int cuInit(unsigned int flags);
unsigned long long fakecuda_counter(const char *name);

static const char PTX[] = ".version 7.0\n.target sm_52\n.address_size 64\n"
                          ".visible .entry twice(.param .u64 p) { ret; }\n";

static kc_cuda_cache *new_cache(const char *driver, kc_persistence *tiers) {
    kc_cuda_options opts = kc_cuda_options_default();
    kc_cuda_cache *cache = NULL;
    opts.driver_library = driver;
    EXPECT(kc_cuda_cache_new(&opts, tiers, &cache) == KC_OK);
    return cache;
}

/* One lookup in a fresh cache on fresh persistent tiers in disk_dir; returns the statistics
 * after it, and the persistent tiers' in *tier_stats. */
static kc_cuda_cache_statistics lookup(const char *driver, const char *disk_dir, void *ctx,
                                       kc_persistence_statistics *tier_stats) {
    kc_cuda_cache_statistics stats;
    kc_persistence_options topts = kc_persistence_options_default();
    kc_persistence *tiers = NULL;
    topts.dir = disk_dir;
    EXPECT(kc_persistence_open(&topts, &tiers) == KC_OK);
    kc_cuda_cache *cache = new_cache(driver, tiers);
    kc_cuda_lease *lease = NULL;
    void *function = NULL;
    size_t evicted = 0;

    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    if (!cache)
        return stats;
    EXPECT(kc_cuda_cache_find_or_build_ptx(cache, ctx, PTX, 0, NULL, 0, &lease) == KC_OK);
    EXPECT(lease != NULL && kc_cuda_lease_module(lease) != NULL);
    EXPECT(kc_cuda_lease_context(lease) == ctx);
    EXPECT(kc_cuda_lease_function(lease, "twice", &function) == KC_OK && function != NULL);
    EXPECT(kc_cuda_lease_function(lease, "thrice", &function) == KC_ERR_NOT_FOUND);
    /* The cubin is written on a background thread; a flush waits for that. */
    EXPECT(kc_cuda_cache_flush(cache) == KC_OK);
    EXPECT(kc_cuda_cache_stats(cache, &stats) == KC_OK);
    memset(tier_stats, 0, sizeof *tier_stats);
    tier_stats->struct_size = sizeof *tier_stats;
    EXPECT(kc_persistence_stats(tiers, tier_stats) == KC_OK);
    EXPECT(tier_stats->pending_writes == 0 && tier_stats->failed_writes == 0);
    /* A reset zeroes the counters (returned as they were before it) and keeps the gauges. */
    {
        kc_cuda_cache_statistics reset;
        memset(&reset, 0, sizeof reset);
        reset.struct_size = sizeof reset;
        EXPECT(kc_cuda_cache_reset_stats(cache) == KC_OK);
        EXPECT(kc_cuda_cache_stats(cache, &reset) == KC_OK);
        EXPECT(reset.links == 0 && reset.cubin_loads == 0 && reset.memory.misses == 0);
        EXPECT(reset.disk_hits == 0 && reset.disk_misses == 0);
        EXPECT(reset.memory.entries == 1 && reset.memory.leases == 1);
        EXPECT(kc_hit_rate(reset.memory.hits, reset.memory.misses) == 0.0);
        EXPECT(kc_cuda_cache_reset_stats(NULL) == KC_ERR_INVALID_ARGUMENT);
    }
    EXPECT(kc_cuda_cache_evict_context(cache, ctx, &evicted) == KC_OK && evicted == 1);
    /* A NULL context is refused, not taken as "evict nothing", and the count is left alone. */
    EXPECT(kc_cuda_cache_evict_context(cache, NULL, &evicted) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(evicted == 1);
    kc_cuda_lease_release(lease);
    kc_cuda_cache_free(cache);
    kc_persistence_free(tiers);
    return stats;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "unavailable") == 0) {
        kc_cuda_options opts = kc_cuda_options_default();
        kc_cuda_cache *cache = NULL;
        opts.driver_library = "/nonexistent/libcuda.so.1";
        EXPECT(kc_cuda_cache_new(&opts, kc_persistence_none(), &cache) == KC_ERR_UNAVAILABLE);
        EXPECT(cache == NULL);
        EXPECT(strstr(kc_last_error_message(), "no CUDA driver") != NULL);
        EXPECT(setenv("KCACHE_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1) == 0);
        EXPECT(kc_cuda_available() == KC_ERR_UNAVAILABLE);
        EXPECT(strstr(kc_last_error_message(), "no CUDA driver") != NULL);
        return check_finish("cuda_test unavailable");
    }
    REQUIRE_ARGS(argc, 2, "cuda_test FAKE_DRIVER_PATH DISK_DIR | cuda_test unavailable");
    const char *driver = argv[1], *disk_dir = argv[2];
    void *ctx = NULL, *popped = NULL;
    EXPECT(setenv("KCACHE_CUDA_LIBRARY", driver, 1) == 0);
    EXPECT(kc_cuda_available() == KC_OK);
    EXPECT(cuInit(0) == 0);
    EXPECT(cuCtxCreate_v2(&ctx, 0, 0) == 0 && cuCtxPopCurrent_v2(&popped) == 0 && popped == ctx);

    kc_persistence_statistics tiers;
    kc_cuda_cache_statistics cold = lookup(driver, disk_dir, ctx, &tiers);
    EXPECT(cold.links == 1 && cold.disk_misses == 1 && cold.cubin_loads == 0);
    EXPECT(tiers.puts == 1);
    EXPECT(fakecuda_counter("link_complete") == 1);

    kc_cuda_cache_statistics warm = lookup(driver, disk_dir, ctx, &tiers);
    EXPECT(warm.links == 0 && warm.disk_hits == 1 && warm.cubin_loads == 1);
    EXPECT(tiers.puts == 0 && tiers.hits == 1);
    EXPECT(kc_cuda_cache_flush(NULL) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(fakecuda_counter("link_complete") == 1);
    EXPECT(fakecuda_counter("module_load") == 2);
    EXPECT(fakecuda_counter("module_unload") == 2);
    EXPECT(fakecuda_counter("unload_wrong_context") == 0);

    return check_finish("cuda_test: cold link, warm cubin load, unload in context");
}
