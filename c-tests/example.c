/* Compile a kernel once, reuse it, tear its device down. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kcache.h"

/* The build callback: runs on a miss, outside every kcache lock. A real one would call
 * clBuildProgram, cuModuleLoadData, vkCreateComputePipelines... */
static int compile(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                   uint64_t *out_weight) {
  char *kernel = malloc(key_len + 1);
  (void)ctx;
  if (kernel == NULL) return 12; /* non-zero: KC_ERR_BUILD_FAILED, code in kc_last_build_error() */
  memcpy(kernel, key, key_len);
  kernel[key_len] = '\0';
  *out_value = kernel;
  *out_weight = key_len + 1;
  return 0;
}

/* The destroy callback: runs once per value, when it has left the cache and no lease holds it. */
static int release(void *ctx, void *kernel) {
  (void)ctx;
  free(kernel);
  return 0;
}

int main(void) {
  const char *source = "__kernel void scale(__global float *x) { x[get_global_id(0)] *= 2; }";
  const int64_t device = 0;
  kc_cache_options opts = kc_cache_options_default();
  kc_cache_statistics stats = {.struct_size = sizeof(kc_cache_statistics)};
  kc_cache *cache = NULL;
  kc_status status;
  int i;

  opts.max_entries = 1024;
  opts.destroy = release;
  if (kc_cache_new(&opts, &cache) != KC_OK) {
    fprintf(stderr, "kc_cache_new: %s\n", kc_last_error_message());
    return 1;
  }

  for (i = 0; i < 3; i++) {
    kc_lease *lease = NULL;
    status = kc_cache_find_or_build(cache, (const uint8_t *)source, strlen(source), device,
                                    compile, NULL, &lease);
    if (status != KC_OK) {
      fprintf(stderr, "%s: %s\n", kc_status_name(status), kc_last_error_message());
      kc_cache_free(cache);
      return 1;
    }
    /* Launch it: the lease keeps it alive even if another thread evicts it meanwhile. */
    printf("launch %.24s...\n", (const char *)kc_lease_value(lease));
    kc_lease_release(lease);
  }

  status = kc_cache_stats(cache, &stats);
  printf("%s: builds=%llu hits=%llu\n", kc_status_name(status),
         (unsigned long long)stats.builds, (unsigned long long)stats.hits);

  kc_cache_evict_device(cache, device); /* the device is going away: unload its kernels */
  kc_cache_free(cache);
  return status == KC_OK && stats.builds == 1 && stats.hits == 2 ? 0 : 1;
}
