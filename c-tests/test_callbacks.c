/* Callback rules: failing destroys, callbacks that call back into the cache, re-entrant builds. */
#include "harness.h"

static void destroy_fails_on_one_of_four_during_clear(void) {
  destroy_log log;
  tracked v[4] = {{0, 0}, {1, 0}, {2, 0}, {3, 0}};
  const char *keys[4] = {"k0", "k1", "k2", "k3"};
  kc_cache *cache = new_tracked_cache(&log, 0, 0, false);
  int i;

  fail_destroy_of(&log, 2, 99);
  for (i = 0; i < 4; i++) cache_value(cache, keys[i], KC_NO_DEVICE, &v[i], 0);
  CHECK_STATUS(kc_cache_clear(cache), KC_ERR_DESTROY_FAILED);
  CHECK(strstr(kc_last_error_message(), "99") != NULL);
  for (i = 0; i < 4; i++) CHECK(v[i].destroys == 1);
  CHECK(kc_cache_len(cache) == 0);
  CHECK_STATS(cache, STAT(destroys, 4), STAT(destroy_errors, 1), STAT(entries, 0));
  free_tracked_cache(cache, &log, 4);
}

static void destroy_fails_during_device_eviction(void) {
  destroy_log log;
  tracked v[3] = {{0, 0}, {1, 0}, {2, 0}};
  const char *keys[3] = {"k0", "k1", "k2"};
  kc_cache *cache = new_tracked_cache(&log, 0, 0, false);
  int i;

  fail_destroy_of(&log, 0, 4);
  /* Two values of device 1, one of device 2. */
  for (i = 0; i < 3; i++) cache_value(cache, keys[i], i < 2 ? 1 : 2, &v[i], 0);
  CHECK_STATUS(kc_cache_evict_device(cache, 1), KC_ERR_DESTROY_FAILED);
  CHECK(v[0].destroys == 1 && v[1].destroys == 1 && v[2].destroys == 0);
  CHECK(kc_cache_len(cache) == 1);
  CHECK_U64(stats_of(cache).device_evictions, 2);
  kc_cache_free(cache);
  CHECK(v[2].destroys == 1);
}

/* A destroy callback that calls back into the cache whose value it destroys. */
typedef struct reentering_destroy {
  destroy_log log;
  kc_cache *cache;
  int armed;
  size_t len_seen;
  kc_status get_status;
  kc_status build_status;
  tracked *fresh;
} reentering_destroy;

static int reentering_destroy_fn(void *ctx, void *value) {
  reentering_destroy *r = (reentering_destroy *)ctx;
  if (r->armed) {
    simple_build b = {r->fresh, 0, 0, 0};
    kc_lease *l = NULL;
    r->armed = 0;
    r->len_seen = kc_cache_len(r->cache);
    r->get_status = kc_cache_get(r->cache, KEY("other"), &l);
    kc_lease_release(l);
    l = NULL;
    r->build_status = build_simple(r->cache, "fresh", KC_NO_DEVICE, &b, &l);
    kc_lease_release(l);
  }
  return tracked_destroy(&r->log, value);
}

static void destroy_callback_reenters_the_cache(void) {
  reentering_destroy r;
  tracked victim = {1, 0}, other = {2, 0}, fresh = {3, 0};
  kc_cache_options opts = kc_cache_options_default();

  destroy_log_init(&r.log);
  r.armed = 0;
  r.fresh = &fresh;
  opts.destroy = reentering_destroy_fn;
  opts.destroy_ctx = &r;
  CHECK_STATUS(kc_cache_new(&opts, &r.cache), KC_OK);
  cache_value(r.cache, "victim", 1, &victim, 0);
  cache_value(r.cache, "other", KC_NO_DEVICE, &other, 0);

  r.armed = 1;
  CHECK_STATUS(kc_cache_evict_device(r.cache, 1), KC_OK);
  CHECK(r.armed == 0);
  CHECK(victim.destroys == 1);
  CHECK(r.len_seen == 1);
  CHECK_STATUS(r.get_status, KC_OK);
  CHECK_STATUS(r.build_status, KC_OK);
  CHECK(kc_cache_len(r.cache) == 2);
  kc_cache_free(r.cache);
  CHECK(other.destroys == 1 && fresh.destroys == 1);
}

/* A build callback that looks up a key in the cache it is building for. */
typedef struct reentering_build {
  kc_cache *cache;
  const char *inner_key;
  tracked *value;
  tracked *inner_value;
  kc_status inner_status;
  void *inner_seen;
} reentering_build;

static int reentering_build_fn(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                               uint64_t *out_weight) {
  reentering_build *r = (reentering_build *)ctx;
  simple_build inner = {r->inner_value, 0, 0, 0};
  kc_lease *l = NULL;
  (void)key;
  (void)key_len;
  (void)out_weight;
  r->inner_status = build_simple(r->cache, r->inner_key, KC_NO_DEVICE, &inner, &l);
  r->inner_seen = kc_lease_value(l);
  kc_lease_release(l);
  *out_value = r->value;
  return 0;
}

static void build_that_reenters_its_own_key_gets_reentrant(void) {
  destroy_log log;
  tracked outer = {1, 0}, inner = {2, 0};
  reentering_build r;
  kc_lease *l = NULL;

  r.cache = new_tracked_cache(&log, 0, 0, false);
  r.inner_key = "outer";
  r.value = &outer;
  r.inner_value = &inner;
  CHECK_STATUS(kc_cache_find_or_build(r.cache, KEY("outer"), KC_NO_DEVICE, reentering_build_fn, &r,
                                      &l),
               KC_OK);
  CHECK_STATUS(r.inner_status, KC_ERR_REENTRANT);
  CHECK(r.inner_seen == NULL);
  CHECK(kc_lease_value(l) == &outer);
  CHECK(kc_cache_len(r.cache) == 1);
  kc_lease_release(l);

  /* Building another key from inside a build is allowed. */
  r.inner_key = "nested";
  CHECK_STATUS(kc_cache_find_or_build(r.cache, KEY("second"), KC_NO_DEVICE, reentering_build_fn,
                                      &r, &l),
               KC_OK);
  CHECK_STATUS(r.inner_status, KC_OK);
  CHECK(r.inner_seen == &inner);
  CHECK(kc_cache_len(r.cache) == 3);
  kc_lease_release(l);
  kc_cache_free(r.cache);
  CHECK(outer.destroys == 2 && inner.destroys == 1);
}

/* A build that tears down what it builds for: its device, or (borrowing cache) everything. */
typedef struct teardown_build {
  kc_cache *cache;
  tracked *value;
  kc_status (*teardown)(kc_cache *cache);
} teardown_build;

static kc_status evict_device_5(kc_cache *cache) { return kc_cache_evict_device(cache, 5); }

static int teardown_build_fn(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                             uint64_t *out_weight) {
  teardown_build *t = (teardown_build *)ctx;
  (void)key;
  (void)key_len;
  (void)out_weight;
  CHECK_STATUS(t->teardown(t->cache), KC_OK);
  *out_value = t->value;
  return 0;
}

static void discarded_build_reports_why_not_its_destroy_failure(void) {
  destroy_log log;
  tracked v = {1, 0}, w = {2, 0};
  teardown_build t;
  kc_lease *l = (kc_lease *)&t;

  t.cache = new_tracked_cache(&log, 0, 0, true);
  fail_destroy_of(&log, 1, 8);
  t.value = &v;
  t.teardown = evict_device_5;
  CHECK_STATUS(kc_cache_find_or_build(t.cache, KEY("k"), 5, teardown_build_fn, &t, &l),
               KC_ERR_DEVICE_DESTROYED);
  CHECK(l == (kc_lease *)&t);
  CHECK(v.destroys == 1);

  t.value = &w;
  t.teardown = kc_cache_clear;
  CHECK_STATUS(kc_cache_find_or_build(t.cache, KEY("k"), KC_NO_DEVICE, teardown_build_fn, &t, &l),
               KC_ERR_CACHE_CLEARED);
  CHECK(w.destroys == 1);
  CHECK_STATS(t.cache, STAT(builds, 2), STAT(discarded, 2), STAT(destroys, 2),
              STAT(destroy_errors, 1), STAT(entries, 0));
  free_tracked_cache(t.cache, &log, 2);
}

static void values_need_no_destroy_callback(void) {
  kc_cache_options opts = kc_cache_options_default();
  kc_cache *cache = NULL;
  tracked v = {1, 0};
  simple_build b = {&v, 0, 0, 0};
  kc_lease *l = NULL;

  CHECK_STATUS(kc_cache_new(&opts, &cache), KC_OK);
  CHECK_STATUS(build_simple(cache, "k", 0, &b, &l), KC_OK);
  CHECK_STATUS(kc_cache_clear(cache), KC_OK);
  kc_lease_release(l);
  CHECK_U64(stats_of(cache).destroys, 1);
  kc_cache_free(cache);
  CHECK(v.destroys == 0);
}

static const scenario scenarios[] = {
    {"destroy_fails_on_one_of_four_during_clear", destroy_fails_on_one_of_four_during_clear},
    {"destroy_fails_during_device_eviction", destroy_fails_during_device_eviction},
    {"destroy_callback_reenters_the_cache", destroy_callback_reenters_the_cache},
    {"build_that_reenters_its_own_key_gets_reentrant",
     build_that_reenters_its_own_key_gets_reentrant},
    {"discarded_build_reports_why_not_its_destroy_failure",
     discarded_build_reports_why_not_its_destroy_failure},
    {"values_need_no_destroy_callback", values_need_no_destroy_callback},
};

int main(int argc, char **argv) { return RUN_SCENARIOS(scenarios, argc, argv); }
