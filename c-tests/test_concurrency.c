/* Races the C API is specified to win: single-flight builds, evictions and clears that land
 * while a build is in flight. Builds are parked on a gate, so every interleaving here is forced,
 * not hoped for. */
#include "harness.h"

#define THREADS 8

/* A build parked on a gate until the test opens it. */
typedef struct gated_build {
  gate g;
  pthread_mutex_t lock;
  int calls;
  int result;
  tracked *value;
} gated_build;

static void gated_build_init(gated_build *b, tracked *value, int result) {
  gate_init(&b->g);
  pthread_mutex_init(&b->lock, NULL);
  b->calls = 0;
  b->result = result;
  b->value = value;
}

static int gated_build_fn(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                          uint64_t *out_weight) {
  gated_build *b = (gated_build *)ctx;
  (void)key;
  (void)key_len;
  pthread_mutex_lock(&b->lock);
  b->calls++;
  pthread_mutex_unlock(&b->lock);
  gate_arrive_and_wait(&b->g);
  if (b->result != 0) return b->result;
  *out_value = b->value;
  *out_weight = 3;
  return 0;
}

/* One lookup on its own thread, and what it saw. */
typedef struct lookup {
  pthread_t thread;
  kc_cache *cache;
  int64_t device;
  gated_build *build;
  kc_status status;
  kc_lease *lease;
  int build_error;
  char message[128];
} lookup;

static void *lookup_main(void *arg) {
  lookup *l = (lookup *)arg;
  l->status = kc_cache_find_or_build(l->cache, KEY("kernel"), l->device, gated_build_fn, l->build,
                                     &l->lease);
  l->build_error = kc_last_build_error();
  snprintf(l->message, sizeof l->message, "%s", kc_last_error_message());
  return NULL;
}

static void start_lookups(lookup *ls, int n, kc_cache *cache, int64_t device, gated_build *b) {
  int i;
  for (i = 0; i < n; i++) {
    ls[i].cache = cache;
    ls[i].device = device;
    ls[i].build = b;
    ls[i].status = KC_ERR_PANIC;
    ls[i].lease = NULL;
    ls[i].build_error = 0;
    ls[i].message[0] = 0;
    CHECK(pthread_create(&ls[i].thread, NULL, lookup_main, &ls[i]) == 0);
  }
}

static void join_lookups(lookup *ls, int n) {
  int i;
  for (i = 0; i < n; i++) CHECK(pthread_join(ls[i].thread, NULL) == 0);
}

/* Blocks until `count` lookups wait for the parked build. */
static void wait_for_waiters(kc_cache *cache, uint64_t count) {
  while (stats_of(cache).waits < count) sleep_ms(1);
}

/* A cache and `n` lookups of one key, each on its own thread: the first builds, parked on the
 * gate, and the others wait for that build. */
typedef struct race {
  destroy_log log;
  gated_build build;
  lookup ls[THREADS];
  int n;
  kc_cache *cache;
} race;

/* Starts the lookups, for `device`, of a build that hands out `value` or fails with
 * `build_result`; returns once the build is parked and the other lookups wait for it. */
static void race_start(race *r, int n, int64_t device, tracked *value, int build_result,
                       bool invalidated_by_clear) {
  gated_build_init(&r->build, value, build_result);
  r->cache = new_tracked_cache(&r->log, 0, 0, invalidated_by_clear);
  r->n = n;
  start_lookups(r->ls, n, r->cache, device, &r->build);
  gate_wait_started(&r->build.g, 1);
  wait_for_waiters(r->cache, (uint64_t)(n - 1));
}

/* Lets the parked build finish and joins the lookups: however many there were, one build ran. */
static void race_finish(race *r) {
  gate_open(&r->build.g);
  join_lookups(r->ls, r->n);
  CHECK(r->build.calls == 1);
}

/* Every lookup of the race got `status`, and no lease. */
static void check_lookups_failed(const race *r, kc_status status) {
  int i;
  for (i = 0; i < r->n; i++) {
    CHECK_STATUS(r->ls[i].status, status);
    CHECK(r->ls[i].lease == NULL);
  }
}

/* After a race whose value `first` was discarded, the next lookup for `device` builds `fresh`
 * and caches it; freeing the cache destroys it, and `first` stays destroyed once. */
static void check_next_lookup_builds_afresh(race *r, int64_t device, tracked *fresh,
                                            const tracked *first) {
  simple_build again = {fresh, 0, 0, 0};
  kc_lease *l = NULL;
  CHECK_STATUS(build_simple(r->cache, "kernel", device, &again, &l), KC_OK);
  CHECK(again.calls == 1 && kc_lease_value(l) == fresh);
  kc_lease_release(l);
  kc_cache_free(r->cache);
  CHECK(first->destroys == 1 && fresh->destroys == 1);
}

static void single_flight_one_build_for_eight_threads(void) {
  tracked v = {1, 0};
  race r;
  int i;

  race_start(&r, THREADS, KC_NO_DEVICE, &v, 0, false);
  race_finish(&r);
  for (i = 0; i < THREADS; i++) {
    CHECK_STATUS(r.ls[i].status, KC_OK);
    CHECK(kc_lease_value(r.ls[i].lease) == &v);
  }
  CHECK_STATS(r.cache, STAT(misses, 1), STAT(builds, 1), STAT(waits, THREADS - 1), STAT(hits, 0),
              STAT(leases, THREADS), STAT(entries, 1));
  for (i = 0; i < THREADS; i++) kc_lease_release(r.ls[i].lease);
  kc_cache_free(r.cache);
  CHECK(v.destroys == 1);
}

static void single_flight_failure_is_shared(void) {
  tracked v = {1, 0};
  race r;
  int i;

  race_start(&r, THREADS, KC_NO_DEVICE, &v, -7, false);
  race_finish(&r);
  check_lookups_failed(&r, KC_ERR_BUILD_FAILED);
  for (i = 0; i < THREADS; i++) {
    CHECK(r.ls[i].build_error == -7);
    CHECK(strstr(r.ls[i].message, "-7") != NULL);
  }
  CHECK_STATS(r.cache, STAT(builds, 0), STAT(build_failures, 1), STAT(waits, THREADS - 1),
              STAT(entries, 0));
  kc_cache_free(r.cache);
  CHECK(v.destroys == 0);
}

static void evict_during_build_destroys_the_value(void) {
  tracked v = {1, 0}, w = {2, 0};
  race r;

  /* One builder and three waiters, all for device 3. */
  race_start(&r, 4, 3, &v, 0, false);
  CHECK_STATUS(kc_cache_evict_device(r.cache, 3), KC_OK);
  race_finish(&r);
  check_lookups_failed(&r, KC_ERR_DEVICE_DESTROYED);
  CHECK(v.destroys == 1);
  CHECK(kc_cache_len(r.cache) == 0);
  CHECK_STATS(r.cache, STAT(builds, 1), STAT(discarded, 1), STAT(destroys, 1), STAT(entries, 0));
  check_next_lookup_builds_afresh(&r, 3, &w, &v);
}

static void evict_of_another_device_does_not_disturb_a_build(void) {
  tracked v = {1, 0};
  race r;

  race_start(&r, 1, 1, &v, 0, false);
  CHECK_STATUS(kc_cache_evict_device(r.cache, 2), KC_OK);
  race_finish(&r);
  CHECK_STATUS(r.ls[0].status, KC_OK);
  CHECK(kc_lease_value(r.ls[0].lease) == &v && v.destroys == 0);
  release_and_free(r.ls[0].lease, r.cache, &v);
}

static void clear_during_build_installs_on_an_owning_cache(void) {
  tracked v = {1, 0};
  race r;

  race_start(&r, 1, KC_NO_DEVICE, &v, 0, false);
  CHECK_STATUS(kc_cache_clear(r.cache), KC_OK);
  race_finish(&r);
  CHECK_STATUS(r.ls[0].status, KC_OK);
  CHECK(kc_lease_value(r.ls[0].lease) == &v);
  CHECK(v.destroys == 0);
  CHECK(kc_cache_len(r.cache) == 1);
  CHECK_STATS(r.cache, STAT(clears, 1), STAT(builds, 1), STAT(discarded, 0));
  release_and_free(r.ls[0].lease, r.cache, &v);
}

static void clear_during_build_discards_on_a_borrowing_cache(void) {
  tracked v = {1, 0}, w = {2, 0};
  race r;

  race_start(&r, 1, KC_NO_DEVICE, &v, 0, true);
  CHECK_STATUS(kc_cache_clear(r.cache), KC_OK);
  race_finish(&r);
  check_lookups_failed(&r, KC_ERR_CACHE_CLEARED);
  CHECK(v.destroys == 1);
  CHECK(kc_cache_len(r.cache) == 0);
  CHECK_STATS(r.cache, STAT(discarded, 1), STAT(destroys, 1));
  /* After the clear, a build borrows live handles again and is installed. */
  check_next_lookup_builds_afresh(&r, KC_NO_DEVICE, &w, &v);
}

/* One more lookup of the race's key for `device` on its own thread, whose own build (if it runs
 * one) hands out `value` at once. */
static void start_other_lookup(race *r, lookup *l, gated_build *own, int64_t device,
                               tracked *value) {
  gated_build_init(own, value, 0);
  gate_open(&own->g);
  start_lookups(l, 1, r->cache, device, own);
}

/* The race's parked build (for device 3, value `first`) and one other lookup of its key for
 * `device`, whose own build hands out `second`. `other_joins` says whether that lookup starts
 * before device 3 is evicted (it joins the parked build) or after (it never does). Either way
 * the builder fails with KC_ERR_DEVICE_DESTROYED and the other lookup builds its own value and
 * succeeds; `first` is destroyed once. */
static void race_eviction_of_device_3(int64_t device, bool other_joins) {
  tracked first = {1, 0}, second = {2, 0};
  gated_build own;
  lookup other;
  race r;

  race_start(&r, 1, 3, &first, 0, false);
  if (other_joins) {
    start_other_lookup(&r, &other, &own, device, &second);
    wait_for_waiters(r.cache, 1);
    CHECK_STATUS(kc_cache_evict_device(r.cache, 3), KC_OK);
  } else {
    CHECK_STATUS(kc_cache_evict_device(r.cache, 3), KC_OK);
    start_other_lookup(&r, &other, &own, device, &second);
    /* The lookup either builds (a second miss) or joins the parked build (a wait). */
    while (stats_of(r.cache).misses < 2 && stats_of(r.cache).waits < 1) sleep_ms(1);
  }
  race_finish(&r);
  join_lookups(&other, 1);
  check_lookups_failed(&r, KC_ERR_DEVICE_DESTROYED);
  CHECK_STATUS(other.status, KC_OK);
  CHECK(own.calls == 1 && kc_lease_value(other.lease) == &second);
  /* A lookup that built counts as a miss, not a wait. */
  CHECK_STATS(r.cache, STAT(discarded, 1), STAT(waits, 0), STAT(misses, 2), STAT(entries, 1));
  CHECK(first.destroys == 1);
  release_and_free(other.lease, r.cache, &second);
  CHECK(first.destroys == 1);
}

/* Each lookup is judged on its own call: one that names no device never inherits the eviction
 * of the device its shared build was for; it builds again. */
static void waiter_without_device_builds_again_after_the_builders_eviction(void) {
  race_eviction_of_device_3(KC_NO_DEVICE, true);
}

/* A lookup that starts after kc_cache_evict_device returned never joins the build it doomed:
 * it builds with live handles and succeeds, while the doomed build is still parked. */
static void lookup_after_an_eviction_builds_anew(void) { race_eviction_of_device_3(3, false); }

/* A lease taken on one thread, released on another after a clear: the destroy runs there. */
typedef struct releaser {
  kc_lease *lease;
  tracked *expected;
  int destroys_before;
} releaser;

static void *release_main(void *arg) {
  releaser *r = (releaser *)arg;
  CHECK(kc_lease_value(r->lease) == r->expected);
  r->destroys_before = r->expected->destroys;
  kc_lease_release(r->lease);
  return NULL;
}

static void lease_released_on_another_thread_after_clear(void) {
  destroy_log log;
  tracked v = {1, 0};
  simple_build b = {&v, 0, 0, 0};
  releaser r;
  pthread_t t;
  kc_cache *cache = new_tracked_cache(&log, 0, 0, false);

  CHECK_STATUS(build_simple(cache, "kernel", 0, &b, &r.lease), KC_OK);
  CHECK_STATUS(kc_cache_evict_device(cache, 0), KC_OK);
  CHECK_STATUS(kc_cache_clear(cache), KC_OK);
  CHECK(v.destroys == 0);
  r.expected = &v;
  r.destroys_before = -1;
  CHECK(pthread_create(&t, NULL, release_main, &r) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(r.destroys_before == 0);
  CHECK(v.destroys == 1);
  free_tracked_cache(cache, &log, 1);
}

/* Many threads racing on a few keys with quick builds, with nothing ever evicted: however the
 * lookups interleave, each key is built exactly once and cached once. */
#define CONTENDED_KEYS 4
#define CONTENDED_ROUNDS 200

typedef struct contender {
  pthread_t thread;
  kc_cache *cache;
  pthread_barrier_t *start;
  int builds; /* builds this thread ran */
  int failures;
} contender;

static int counting_build(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                          uint64_t *out_weight) {
  contender *c = (contender *)ctx;
  (void)key_len;
  (void)out_weight;
  c->builds++;
  *out_value = (void *)(uintptr_t)(key[0] + 1);
  return 0;
}

static void *contender_main(void *arg) {
  contender *c = (contender *)arg;
  int i;
  pthread_barrier_wait(c->start);
  for (i = 0; i < 64; i++) {
    uint8_t key = (uint8_t)(i % CONTENDED_KEYS);
    kc_lease *l = NULL;
    if (kc_cache_find_or_build(c->cache, &key, 1, KC_NO_DEVICE, counting_build, c, &l) != KC_OK ||
        kc_lease_value(l) != (void *)(uintptr_t)(key + 1))
      c->failures++;
    kc_lease_release(l);
  }
  return NULL;
}

static void single_flight_under_contention(void) {
  int round, i;
  for (round = 0; round < CONTENDED_ROUNDS; round++) {
    kc_cache_options opts = kc_cache_options_default();
    contender cs[THREADS];
    pthread_barrier_t start;
    kc_cache_statistics s;
    int builds = 0;

    CHECK_STATUS(kc_cache_new(&opts, &cs[0].cache), KC_OK);
    CHECK(pthread_barrier_init(&start, NULL, THREADS) == 0);
    for (i = 0; i < THREADS; i++) {
      cs[i].cache = cs[0].cache;
      cs[i].start = &start;
      cs[i].builds = 0;
      cs[i].failures = 0;
      CHECK(pthread_create(&cs[i].thread, NULL, contender_main, &cs[i]) == 0);
    }
    for (i = 0; i < THREADS; i++) {
      CHECK(pthread_join(cs[i].thread, NULL) == 0);
      CHECK(cs[i].failures == 0);
      builds += cs[i].builds;
    }
    s = stats_of(cs[0].cache);
    if (builds != CONTENDED_KEYS || s.entries != CONTENDED_KEYS)
      fprintf(stderr, "round %d: %d builds, %llu entries for %d keys\n", round, builds,
              (unsigned long long)s.entries, CONTENDED_KEYS);
    CHECK(builds == CONTENDED_KEYS);
    CHECK_U64(s.builds, CONTENDED_KEYS);
    CHECK_U64(s.entries, CONTENDED_KEYS);
    CHECK_U64(s.hits + s.misses + s.waits, THREADS * 64);
    CHECK(pthread_barrier_destroy(&start) == 0);
    kc_cache_free(cs[0].cache);
  }
}

static const scenario scenarios[] = {
    {"single_flight_one_build_for_eight_threads", single_flight_one_build_for_eight_threads},
    {"single_flight_failure_is_shared", single_flight_failure_is_shared},
    {"evict_during_build_destroys_the_value", evict_during_build_destroys_the_value},
    {"evict_of_another_device_does_not_disturb_a_build",
     evict_of_another_device_does_not_disturb_a_build},
    {"clear_during_build_installs_on_an_owning_cache",
     clear_during_build_installs_on_an_owning_cache},
    {"clear_during_build_discards_on_a_borrowing_cache",
     clear_during_build_discards_on_a_borrowing_cache},
    {"waiter_without_device_builds_again_after_the_builders_eviction",
     waiter_without_device_builds_again_after_the_builders_eviction},
    {"lookup_after_an_eviction_builds_anew", lookup_after_an_eviction_builds_anew},
    {"lease_released_on_another_thread_after_clear", lease_released_on_another_thread_after_clear},
    {"single_flight_under_contention", single_flight_under_contention},
};

int main(int argc, char **argv) { return RUN_SCENARIOS(scenarios, argc, argv); }
