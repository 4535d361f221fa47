/* Single-threaded behaviour of the core C API: hits, misses, builds, failures, keys, removal,
 * device eviction, caps, leases, options and statistics, each with its counters. */
#include "harness.h"

static void hit_miss_build_counts(void) {
  destroy_log log;
  tracked a = {1, 0}, b = {2, 0};
  simple_build build_a = {&a, 10, 0, 0}, build_b = {&b, 20, 0, 0};
  kc_lease *la1 = NULL, *la2 = NULL, *lb = NULL, *lg = NULL;
  kc_lease *untouched = (kc_lease *)&log;
  kc_cache *cache = new_tracked_cache(&log, 0, 0, false);

  CHECK_STATUS(build_simple(cache, "a", KC_NO_DEVICE, &build_a, &la1), KC_OK);
  CHECK(kc_lease_value(la1) == &a);
  CHECK_U64(kc_lease_weight(la1), 10);
  CHECK(build_a.calls == 1);

  /* A hit does not build and hands out the same value. */
  CHECK_STATUS(build_simple(cache, "a", KC_NO_DEVICE, &build_a, &la2), KC_OK);
  CHECK(kc_lease_value(la2) == &a);
  CHECK(build_a.calls == 1);

  CHECK_STATUS(build_simple(cache, "b", KC_NO_DEVICE, &build_b, &lb), KC_OK);
  CHECK(kc_lease_value(lb) == &b);
  CHECK(build_b.calls == 1);

  CHECK_STATUS(kc_cache_get(cache, KEY("b"), &lg), KC_OK);
  CHECK(kc_lease_value(lg) == &b);
  /* A miss of kc_cache_get leaves the out-parameter alone. */
  CHECK_STATUS(kc_cache_get(cache, KEY("zz"), &untouched), KC_ERR_NOT_FOUND);
  CHECK(untouched == (kc_lease *)&log);
  CHECK(kc_cache_len(cache) == 2);

  /* Hits: find_or_build "a", get "b". Misses: "a", "b", get "zz". */
  CHECK_STATS(cache, STAT(hits, 2), STAT(misses, 3), STAT(builds, 2), STAT(build_failures, 0),
              STAT(entries, 2), STAT(weight, 30), STAT(leases, 4), STAT(destroys, 0));

  kc_lease_release(la1);
  kc_lease_release(la2);
  kc_lease_release(lb);
  kc_lease_release(lg);
  CHECK_STATS(cache, STAT(leases, 0), STAT(destroys, 0));

  kc_cache_free(cache);
  CHECK(a.destroys == 1 && b.destroys == 1);
  CHECK(log.total == 2);
}

static void empty_key_is_a_key(void) {
  destroy_log log;
  tracked v = {1, 0};
  simple_build build = {&v, 0, 0, 0};
  kc_lease *l1 = NULL, *l2 = NULL;
  const uint8_t empty[1] = {0};
  kc_cache *cache = new_tracked_cache(&log, 0, 0, false);

  /* NULL with length 0 and a non-NULL pointer with length 0 name the same, empty, key. */
  CHECK_STATUS(kc_cache_find_or_build(cache, NULL, 0, KC_NO_DEVICE, simple_build_fn, &build, &l1),
               KC_OK);
  CHECK_STATUS(kc_cache_find_or_build(cache, empty, 0, KC_NO_DEVICE, simple_build_fn, &build, &l2),
               KC_OK);
  CHECK(build.calls == 1);
  CHECK(kc_lease_value(l1) == &v && kc_lease_value(l2) == &v);
  kc_lease_release(l1);
  kc_lease_release(l2);
  CHECK_STATUS(kc_cache_remove(cache, NULL, 0), KC_OK);
  CHECK(v.destroys == 1);
  kc_cache_free(cache);
}

static int keys_seen_build(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                           uint64_t *out_weight) {
  /* The callback sees the caller's key; it may leave the weight alone (then 0). */
  (void)out_weight;
  CHECK(key_len == 5 && memcmp(key, "hello", 5) == 0);
  *out_value = ctx;
  return 0;
}

static void keys_are_bytes(void) {
  destroy_log log;
  tracked hello = {1, 0}, a = {2, 0}, b = {3, 0};
  simple_build build = {&a, 0, 0, 0};
  const uint8_t with_nul_a[3] = {'k', 0, 'a'};
  const uint8_t with_nul_b[3] = {'k', 0, 'b'};
  kc_lease *l = NULL, *m = NULL;
  kc_cache *cache = new_tracked_cache(&log, 0, 0, false);

  CHECK_STATUS(
      kc_cache_find_or_build(cache, KEY("hello"), KC_NO_DEVICE, keys_seen_build, &hello, &l),
      KC_OK);
  CHECK_U64(kc_lease_weight(l), 0);
  kc_lease_release(l);

  /* Keys are compared by every byte, NULs included. */
  CHECK_STATUS(
      kc_cache_find_or_build(cache, with_nul_a, 3, KC_NO_DEVICE, simple_build_fn, &build, &l),
      KC_OK);
  build.value = &b;
  CHECK_STATUS(
      kc_cache_find_or_build(cache, with_nul_b, 3, KC_NO_DEVICE, simple_build_fn, &build, &m),
      KC_OK);
  CHECK(build.calls == 2);
  CHECK(kc_lease_value(l) == &a && kc_lease_value(m) == &b);
  kc_lease_release(l);
  kc_lease_release(m);
  kc_cache_free(cache);
  CHECK(hello.destroys == 1 && a.destroys == 1 && b.destroys == 1);
}

static void build_failure_reports_its_code(void) {
  destroy_log log;
  tracked v = {1, 0};
  simple_build build = {&v, 0, -42, 0};
  kc_lease *untouched = (kc_lease *)&build;
  kc_lease *l = NULL;
  kc_cache *cache = new_tracked_cache(&log, 0, 0, false);

  CHECK_STATUS(build_simple(cache, "k", KC_NO_DEVICE, &build, &untouched), KC_ERR_BUILD_FAILED);
  CHECK(untouched == (kc_lease *)&build);
  CHECK(kc_last_build_error() == -42);
  CHECK(strstr(kc_last_error_message(), "-42") != NULL);
  CHECK(kc_cache_len(cache) == 0);

  /* A failure is not cached: the next lookup builds again. */
  build.result = 0;
  CHECK_STATUS(build_simple(cache, "k", KC_NO_DEVICE, &build, &l), KC_OK);
  CHECK(build.calls == 2);
  /* Success leaves the last build error as it was. */
  CHECK(kc_last_build_error() == -42);

  CHECK_STATS(cache, STAT(misses, 2), STAT(builds, 1), STAT(build_failures, 1), STAT(destroys, 0));
  release_and_free(l, cache, &v);
}

static void remove_destroys_now_or_on_release(void) {
  destroy_log log;
  tracked a = {1, 0}, b = {2, 0};
  simple_build build_b = {&b, 0, 0, 0};
  kc_lease *l = NULL, *untouched = (kc_lease *)&log;
  kc_cache *cache = new_tracked_cache(&log, 0, 0, false);

  cache_value(cache, "a", KC_NO_DEVICE, &a, 0);
  CHECK_STATUS(kc_cache_remove(cache, KEY("a")), KC_OK);
  CHECK(a.destroys == 1);
  CHECK_STATUS(kc_cache_remove(cache, KEY("a")), KC_ERR_NOT_FOUND);
  CHECK_STATUS(kc_cache_get(cache, KEY("a"), &untouched), KC_ERR_NOT_FOUND);

  CHECK_STATUS(build_simple(cache, "b", KC_NO_DEVICE, &build_b, &l), KC_OK);
  CHECK_STATUS(kc_cache_remove(cache, KEY("b")), KC_OK);
  CHECK(kc_cache_len(cache) == 0);
  CHECK(b.destroys == 0);
  CHECK(kc_lease_value(l) == &b);
  kc_lease_release(l);
  CHECK(b.destroys == 1);

  /* A failing destroy is reported by remove, and the entry is gone anyway. */
  fail_destroy_of(&log, 1, 5);
  a.destroys = 0;
  cache_value(cache, "a", KC_NO_DEVICE, &a, 0);
  CHECK_STATUS(kc_cache_remove(cache, KEY("a")), KC_ERR_DESTROY_FAILED);
  CHECK(a.destroys == 1);
  CHECK(kc_cache_len(cache) == 0);
  CHECK_U64(stats_of(cache).destroy_errors, 1);
  free_tracked_cache(cache, &log, 3);
}

static void device_eviction(void) {
  destroy_log log;
  tracked d0 = {1, 0}, d1 = {2, 0}, none = {3, 0};
  simple_build bn = {&none, 0, 0, 0};
  kc_lease *untouched = (kc_lease *)&log;
  kc_cache *cache = new_tracked_cache(&log, 0, 0, false);

  cache_value(cache, "k0", 0, &d0, 0);
  cache_value(cache, "k1", 1, &d1, 0);
  cache_value(cache, "kn", KC_NO_DEVICE, &none, 0);

  CHECK_STATUS(kc_cache_evict_device(cache, 0), KC_OK);
  CHECK(d0.destroys == 1 && d1.destroys == 0 && none.destroys == 0);
  CHECK(kc_cache_len(cache) == 2);
  /* Evicting a device with no entries is fine (it still invalidates its in-flight builds). */
  CHECK_STATUS(kc_cache_evict_device(cache, 7), KC_OK);

  /* KC_NO_DEVICE names no device; other negative ids are invalid everywhere. */
  CHECK_STATUS(kc_cache_evict_device(cache, KC_NO_DEVICE), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_cache_evict_device(cache, -2), KC_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kc_last_error_message(), "-2") != NULL);
  CHECK_STATUS(build_simple(cache, "bad", -5, &bn, &untouched), KC_ERR_INVALID_ARGUMENT);
  CHECK(untouched == (kc_lease *)&log);

  CHECK_STATS(cache, STAT(device_evictions, 1), STAT(destroys, 1), STAT(entries, 2));
  kc_cache_free(cache);
  CHECK(d1.destroys == 1 && none.destroys == 1);
}

static void entry_cap_evicts_and_destroys(void) {
  destroy_log log;
  tracked v[3] = {{0, 0}, {1, 0}, {2, 0}};
  const char *keys[3] = {"k0", "k1", "k2"};
  kc_cache *cache = new_tracked_cache(&log, 2, 0, false);
  int i, destroyed = 0, present = 0;

  for (i = 0; i < 3; i++) cache_value(cache, keys[i], KC_NO_DEVICE, &v[i], 1);
  CHECK(kc_cache_len(cache) == 2);
  for (i = 0; i < 3; i++) {
    kc_lease *l = NULL;
    kc_status st = kc_cache_get(cache, (const uint8_t *)keys[i], 2, &l);
    CHECK(v[i].destroys <= 1);
    destroyed += v[i].destroys;
    if (st == KC_OK) {
      present++;
      CHECK(v[i].destroys == 0);
      kc_lease_release(l);
    } else {
      CHECK(st == KC_ERR_NOT_FOUND && v[i].destroys == 1);
    }
  }
  CHECK(destroyed == 1 && present == 2);
  CHECK_STATS(cache, STAT(capacity_evictions, 1), STAT(destroys, 1), STAT(entries, 2));
  free_tracked_cache(cache, &log, 3);
}

static void weight_cap_evicts_and_admits_a_giant_alone(void) {
  destroy_log log;
  tracked a = {1, 0}, b = {2, 0}, giant = {3, 0};
  simple_build bg = {&giant, 500, 0, 0};
  kc_lease *l = NULL;
  kc_cache *cache = new_tracked_cache(&log, 0, 100, false);

  cache_value(cache, "a", KC_NO_DEVICE, &a, 60);
  cache_value(cache, "b", KC_NO_DEVICE, &b, 60);
  CHECK_STATS(cache, STAT(entries, 1), STAT(weight, 60), STAT(capacity_evictions, 1));
  CHECK(a.destroys + b.destroys == 1);

  /* Heavier than the whole cap: admitted, alone. */
  CHECK_STATUS(build_simple(cache, "g", KC_NO_DEVICE, &bg, &l), KC_OK);
  CHECK(kc_lease_value(l) == &giant);
  CHECK_STATS(cache, STAT(entries, 1), STAT(weight, 500), STAT(capacity_evictions, 2));
  CHECK(a.destroys == 1 && b.destroys == 1 && giant.destroys == 0);
  release_and_free(l, cache, &giant);
}

static void leases_outlive_clear_and_free(void) {
  destroy_log log;
  tracked v = {1, 0}, w = {2, 0};
  simple_build bv = {&v, 7, 0, 0}, bw = {&w, 0, 0, 0};
  kc_lease *l = NULL, *copy, *lw = NULL;
  kc_cache *cache = new_tracked_cache(&log, 0, 0, false);

  CHECK_STATUS(build_simple(cache, "v", KC_NO_DEVICE, &bv, &l), KC_OK);
  copy = kc_lease_clone(l);
  CHECK(copy != NULL && kc_lease_value(copy) == &v && kc_lease_weight(copy) == 7);
  CHECK_U64(stats_of(cache).leases, 2);

  /* Clear unlinks at once, but a leased value lives until its last lease goes. */
  CHECK_STATUS(kc_cache_clear(cache), KC_OK);
  CHECK(kc_cache_len(cache) == 0);
  CHECK(v.destroys == 0);
  kc_lease_release(l);
  CHECK(v.destroys == 0);
  CHECK(kc_lease_value(copy) == &v);
  kc_lease_release(copy);
  CHECK(v.destroys == 1);
  CHECK_U64(stats_of(cache).clears, 1);

  /* Freeing the cache leaves outstanding leases valid. */
  CHECK_STATUS(build_simple(cache, "w", KC_NO_DEVICE, &bw, &lw), KC_OK);
  kc_cache_free(cache);
  CHECK(w.destroys == 0);
  CHECK(kc_lease_value(lw) == &w);
  kc_lease_release(lw);
  CHECK(w.destroys == 1);
  CHECK(log.total == 2);
}

typedef struct hook_log {
  int calls;
  int last_code;
} hook_log;

static void record_destroy_error(void *ctx, int code) {
  hook_log *h = (hook_log *)ctx;
  h->calls++;
  h->last_code = code;
}

static void destroy_errors_without_a_caller_reach_the_hook(void) {
  destroy_log log;
  hook_log hook = {0, 0};
  tracked v = {1, 0};
  simple_build bv = {&v, 0, 0, 0};
  kc_cache_options opts = kc_cache_options_default();
  kc_cache *cache = NULL;
  kc_lease *l = NULL;

  destroy_log_init(&log);
  fail_destroy_of(&log, 1, 33);
  opts.destroy = tracked_destroy;
  opts.destroy_ctx = &log;
  opts.on_destroy_error = record_destroy_error;
  opts.on_destroy_error_ctx = &hook;
  CHECK_STATUS(kc_cache_new(&opts, &cache), KC_OK);
  CHECK_STATUS(build_simple(cache, "v", KC_NO_DEVICE, &bv, &l), KC_OK);
  CHECK_STATUS(kc_cache_clear(cache), KC_OK); /* leased: nothing destroyed yet */
  CHECK(hook.calls == 0);
  kc_lease_release(l); /* the destroy runs here and fails: no status to return it with */
  CHECK(v.destroys == 1);
  CHECK(hook.calls == 1 && hook.last_code == 33);
  CHECK_U64(stats_of(cache).destroy_errors, 1);
  kc_cache_free(cache);
}

static void options_struct_size(void) {
  kc_cache_options opts = kc_cache_options_default();
  struct {
    kc_cache_options known;
    uint64_t future_field;
  } bigger;
  kc_cache *cache = (kc_cache *)&opts;
  kc_cache *untouched = cache;

  CHECK(opts.struct_size == sizeof(kc_cache_options));
  CHECK(opts.max_entries == 0 && opts.max_weight == 0 && !opts.invalidated_by_clear);
  CHECK(opts.destroy == NULL && opts.on_destroy_error == NULL);

  opts.struct_size = offsetof(kc_cache_options, destroy_ctx); /* cuts the last v1 field */
  CHECK_STATUS(kc_cache_new(&opts, &untouched), KC_ERR_INVALID_ARGUMENT);
  CHECK(untouched == cache);
  CHECK(strstr(kc_last_error_message(), "struct_size") != NULL);
  opts.struct_size = 0;
  CHECK_STATUS(kc_cache_new(&opts, &untouched), KC_ERR_INVALID_ARGUMENT);

  /* The first layout (up to destroy_ctx) is accepted; what follows it is not read. */
  opts = kc_cache_options_default();
  opts.struct_size = offsetof(kc_cache_options, on_destroy_error);
  opts.on_destroy_error = record_destroy_error;
  CHECK_STATUS(kc_cache_new(&opts, &cache), KC_OK);
  kc_cache_free(cache);

  /* A bigger struct from a newer header: fine while the fields this library lacks are zero. */
  memset(&bigger, 0, sizeof bigger);
  bigger.known = kc_cache_options_default();
  bigger.known.struct_size = sizeof bigger;
  CHECK_STATUS(kc_cache_new(&bigger.known, &cache), KC_OK);
  kc_cache_free(cache);
  bigger.future_field = 1;
  untouched = (kc_cache *)&opts;
  CHECK_STATUS(kc_cache_new(&bigger.known, &untouched), KC_ERR_INVALID_ARGUMENT);
  CHECK(untouched == (kc_cache *)&opts);
}

static void stats_struct_size(void) {
  kc_cache_options opts = kc_cache_options_default();
  kc_cache *cache = NULL;
  kc_cache_statistics s;
  struct {
    kc_cache_statistics known;
    uint64_t future_field;
  } bigger;

  CHECK_STATUS(kc_cache_new(&opts, &cache), KC_OK);
  memset(&s, 0xab, sizeof s);
  s.struct_size = sizeof s - 1;
  CHECK_STATUS(kc_cache_stats(cache, &s), KC_ERR_INVALID_ARGUMENT);
  CHECK(s.hits == 0xababababababababULL); /* written only on success */

  memset(&bigger, 0xab, sizeof bigger);
  bigger.known.struct_size = sizeof bigger;
  CHECK_STATUS(kc_cache_stats(cache, &bigger.known), KC_OK);
  CHECK_U64(bigger.known.struct_size, sizeof(kc_cache_statistics));
  CHECK_U64(bigger.known.leases, 0);
  CHECK(bigger.future_field == 0xababababababababULL);
  kc_cache_free(cache);
}

/* kc_cache_reset_stats zeroes the event counters, keeps the gauges, and counts go on after it;
 * kc_hit_rate is hits / (hits + misses), 0.0 without lookups. */
static void reset_stats_and_hit_rate(void) {
  destroy_log log;
  tracked a = {1, 0};
  simple_build build_a = {&a, 10, 0, 0};
  kc_lease *l1 = NULL, *l2 = NULL, *l3 = NULL;
  kc_cache *cache = new_tracked_cache(&log, 0, 0, false);
  kc_cache_statistics s;

  CHECK(kc_hit_rate(0, 0) == 0.0);
  CHECK(kc_hit_rate(3, 1) == 0.75);
  CHECK(kc_hit_rate(0, 4) == 0.0);
  CHECK(kc_hit_rate(5, 0) == 1.0);

  CHECK_STATUS(build_simple(cache, "a", KC_NO_DEVICE, &build_a, &l1), KC_OK);
  CHECK_STATUS(build_simple(cache, "a", KC_NO_DEVICE, &build_a, &l2), KC_OK);
  CHECK_STATS(cache, STAT(hits, 1), STAT(misses, 1), STAT(builds, 1));
  s.struct_size = sizeof s;
  CHECK_STATUS(kc_cache_stats(cache, &s), KC_OK);
  CHECK(kc_hit_rate(s.hits, s.misses) == 0.5);

  CHECK_STATUS(kc_cache_reset_stats(cache), KC_OK);
  CHECK_STATS(cache, STAT(hits, 0), STAT(misses, 0), STAT(builds, 0), STAT(entries, 1),
              STAT(weight, 10), STAT(leases, 2));

  CHECK_STATUS(build_simple(cache, "a", KC_NO_DEVICE, &build_a, &l3), KC_OK);
  CHECK_STATS(cache, STAT(hits, 1), STAT(misses, 0), STAT(builds, 0), STAT(leases, 3));
  CHECK(build_a.calls == 1);

  kc_lease_release(l1);
  kc_lease_release(l2);
  kc_lease_release(l3);
  kc_cache_free(cache);
  CHECK(a.destroys == 1);
}

static void version_and_status_names(void) {
  static const char *const names[] = {
      "KC_OK",           "KC_ERR_INVALID_ARGUMENT", "KC_ERR_BUILD_FAILED", "KC_ERR_DEVICE_DESTROYED",
      "KC_ERR_CACHE_CLEARED", "KC_ERR_DESTROY_FAILED", "KC_ERR_REENTRANT", "KC_ERR_NOT_FOUND",
      "KC_ERR_PANIC",    "KC_ERR_UNAVAILABLE",      "KC_ERR_IO",           "KC_ERR_INTEGRITY",
      "KC_ERR_UNTRUSTED", "KC_ERR_BACKEND",          "KC_ERR_BUFFER_TOO_SMALL"};
  char expected[64];
  int i;

  snprintf(expected, sizeof expected, "%d.%d.%d", KCACHE_VERSION_MAJOR, KCACHE_VERSION_MINOR,
           KCACHE_VERSION_PATCH);
  CHECK(strcmp(kc_version(), expected) == 0);

  for (i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
    CHECK(strcmp(kc_status_name(i), names[i]) == 0);
  CHECK(KC_ERR_BACKEND == 13);
  CHECK(KC_ERR_BUFFER_TOO_SMALL == 14);
  CHECK(strcmp(kc_status_name(KC_ERR_CACHE_CLEARED), "KC_ERR_CACHE_CLEARED") == 0);
  CHECK(strcmp(kc_status_name(-1), "KC_UNKNOWN_STATUS") == 0);
  CHECK(strcmp(kc_status_name(15), "KC_UNKNOWN_STATUS") == 0);
  CHECK(strcmp(kc_status_name(1 << 30), "KC_UNKNOWN_STATUS") == 0);
  CHECK(KC_NO_DEVICE == -1);
}

static const scenario scenarios[] = {
    {"hit_miss_build_counts", hit_miss_build_counts},
    {"empty_key_is_a_key", empty_key_is_a_key},
    {"keys_are_bytes", keys_are_bytes},
    {"build_failure_reports_its_code", build_failure_reports_its_code},
    {"remove_destroys_now_or_on_release", remove_destroys_now_or_on_release},
    {"device_eviction", device_eviction},
    {"entry_cap_evicts_and_destroys", entry_cap_evicts_and_destroys},
    {"weight_cap_evicts_and_admits_a_giant_alone", weight_cap_evicts_and_admits_a_giant_alone},
    {"leases_outlive_clear_and_free", leases_outlive_clear_and_free},
    {"destroy_errors_without_a_caller_reach_the_hook",
     destroy_errors_without_a_caller_reach_the_hook},
    {"options_struct_size", options_struct_size},
    {"stats_struct_size", stats_struct_size},
    {"reset_stats_and_hit_rate", reset_stats_and_hit_rate},
    {"version_and_status_names", version_and_status_names},
};

int main(int argc, char **argv) { return RUN_SCENARIOS(scenarios, argc, argv); }
