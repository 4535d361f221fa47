/* Builds one cache entry, hits it, and checks every count: the program each C consumer project
 * compiles against an installed kcache. Exit status 0 only if everything matched. */
#include <kcache.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int builds;
static int destroys;

/* Stands in for a JIT compile: the "kernel" is a copy of the key. */
static int build_kernel(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                        uint64_t *out_weight) {
  (void)ctx;
  char *kernel = malloc(key_len + 1);
  if (kernel == NULL) {
    return 1;
  }
  memcpy(kernel, key, key_len);
  kernel[key_len] = '\0';
  builds++;
  *out_value = kernel;
  *out_weight = key_len;
  return 0;
}

static int destroy_kernel(void *ctx, void *value) {
  (void)ctx;
  destroys++;
  free(value);
  return 0;
}

#define CHECK(cond)                                                                      \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, \
              #cond, kc_last_error_message());                                           \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

int main(void) {
  static const char source[] = "__kernel void scale(__global float *x) { x[0] *= 2.0f; }";
  const uint8_t *key = (const uint8_t *)source;
  const size_t key_len = sizeof source - 1;

  kc_cache_options options = kc_cache_options_default();
  options.destroy = destroy_kernel;
  kc_cache *cache = NULL;
  CHECK(kc_cache_new(&options, &cache) == KC_OK);

  kc_lease *built = NULL;
  kc_lease *hit = NULL;
  CHECK(kc_cache_find_or_build(cache, key, key_len, 0, build_kernel, NULL, &built) == KC_OK);
  CHECK(kc_cache_find_or_build(cache, key, key_len, 0, build_kernel, NULL, &hit) == KC_OK);
  CHECK(builds == 1);
  CHECK(kc_lease_value(hit) == kc_lease_value(built));
  CHECK(strcmp((const char *)kc_lease_value(hit), source) == 0);
  CHECK(kc_cache_len(cache) == 1);

  kc_cache_statistics stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  CHECK(kc_cache_stats(cache, &stats) == KC_OK);
  CHECK(stats.hits == 1 && stats.misses == 1 && stats.builds == 1);
  CHECK(stats.entries == 1 && stats.weight == key_len && stats.leases == 2);

  kc_lease_release(built);
  kc_lease_release(hit);
  CHECK(destroys == 0);
  kc_cache_free(cache);
  CHECK(destroys == 1);

  printf("kcache %s: 1 build, 1 hit, 1 destroy\n", kc_version());
  return 0;
}
