/* Every exported function of the core API with each pointer argument NULL: the documented status
 * (or NULL/0/no-op), a message naming the argument, out-parameters untouched, no crash. */
#include "harness.h"

#define CHECK_NAMES(arg) CHECK(strstr(kc_last_error_message(), arg) != NULL)

static int null_ctx_build(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                          uint64_t *out_weight) {
  (void)key;
  (void)key_len;
  (void)out_weight;
  CHECK(ctx == NULL);
  *out_value = NULL;
  return 0;
}

static void null_sweep(void) {
  kc_cache_options opts = kc_cache_options_default();
  kc_cache *cache = NULL;
  kc_cache *sentinel_cache = (kc_cache *)&opts;
  kc_lease *lease = NULL;
  kc_lease *sentinel = (kc_lease *)&opts;
  kc_cache_statistics s;
  tracked v = {1, 0};
  simple_build b = {&v, 0, 0, 0};

  /* kc_cache_new */
  CHECK_STATUS(kc_cache_new(NULL, &sentinel_cache), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("opts");
  CHECK(sentinel_cache == (kc_cache *)&opts);
  CHECK_STATUS(kc_cache_new(&opts, NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("out_cache");
  CHECK_STATUS(kc_cache_new(&opts, &cache), KC_OK);

  /* kc_cache_find_or_build */
  CHECK_STATUS(kc_cache_find_or_build(NULL, KEY("k"), KC_NO_DEVICE, simple_build_fn, &b, &sentinel),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("cache");
  CHECK_STATUS(kc_cache_find_or_build(cache, NULL, 1, KC_NO_DEVICE, simple_build_fn, &b, &sentinel),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("key");
  CHECK_STATUS(kc_cache_find_or_build(cache, KEY("k"), KC_NO_DEVICE, NULL, &b, &sentinel),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("build");
  CHECK_STATUS(kc_cache_find_or_build(cache, KEY("k"), KC_NO_DEVICE, simple_build_fn, &b, NULL),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("out_lease");
  CHECK(sentinel == (kc_lease *)&opts);
  CHECK(b.calls == 0);

  /* kc_cache_get */
  CHECK_STATUS(kc_cache_get(NULL, KEY("k"), &sentinel), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("cache");
  CHECK_STATUS(kc_cache_get(cache, NULL, 1, &sentinel), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("key");
  CHECK_STATUS(kc_cache_get(cache, KEY("k"), NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("out_lease");
  CHECK(sentinel == (kc_lease *)&opts);

  /* kc_cache_remove */
  CHECK_STATUS(kc_cache_remove(NULL, KEY("k")), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("cache");
  CHECK_STATUS(kc_cache_remove(cache, NULL, 1), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("key");

  /* Functions without a status answer NULL or 0 and still leave a message. */
  CHECK(kc_lease_value(NULL) == NULL);
  CHECK_NAMES("lease");
  CHECK(kc_lease_weight(NULL) == 0);
  CHECK(kc_lease_clone(NULL) == NULL);
  CHECK(kc_cache_len(NULL) == 0);
  CHECK_NAMES("cache");
  kc_lease_release(NULL);
  kc_cache_free(NULL);

  /* kc_cache_evict_device, kc_cache_clear, kc_cache_statistics */
  CHECK_STATUS(kc_cache_evict_device(NULL, 0), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("cache");
  CHECK_STATUS(kc_cache_clear(NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("cache");
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  CHECK_STATUS(kc_cache_stats(NULL, &s), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("cache");
  CHECK_STATUS(kc_cache_stats(cache, NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("out");
  CHECK_STATUS(kc_cache_reset_stats(NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("cache");

  /* Never NULL, whatever came before. */
  CHECK(kc_status_name(-12345) != NULL);
  CHECK(kc_last_error_message() != NULL);
  CHECK(kc_version() != NULL);

  /* kc_metrics_render */
  CHECK_STATUS(kc_metrics_render(NULL, 0, NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("out_needed");

  /* None of the above touched the cache. */
  s = stats_of(cache);
  CHECK_U64(s.hits + s.misses + s.builds + s.clears + s.device_evictions, 0);

  /* A NULL build_ctx is the caller's choice and is handed to the callback as is; so is a
   * NULL value from a successful build. */
  CHECK_STATUS(kc_cache_find_or_build(cache, KEY("k"), KC_NO_DEVICE, null_ctx_build, NULL, &lease),
               KC_OK);
  CHECK(lease != NULL && kc_lease_value(lease) == NULL);
  kc_lease_release(lease);
  kc_cache_free(cache);
}

static const scenario scenarios[] = {
    {"null_sweep", null_sweep},
};

int main(int argc, char **argv) { return RUN_SCENARIOS(scenarios, argc, argv); }
