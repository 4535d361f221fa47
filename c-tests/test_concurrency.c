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

static void single_flight_one_build_for_eight_threads(void) {
  destroy_log log;
  tracked v = {1, 0};
  gated_build b;
  lookup ls[THREADS];
  kc_cache *cache;
  kc_cache_statistics s;
  int i;

  destroy_log_init(&log);
  gated_build_init(&b, &v, 0);
  cache = new_tracked_cache(&log, 0, 0, false);
  start_lookups(ls, THREADS, cache, KC_NO_DEVICE, &b);
  gate_wait_started(&b.g, 1);
  wait_for_waiters(cache, THREADS - 1);
  gate_open(&b.g);
  join_lookups(ls, THREADS);

  CHECK(b.calls == 1);
  for (i = 0; i < THREADS; i++) {
    CHECK_STATUS(ls[i].status, KC_OK);
    CHECK(kc_lease_value(ls[i].lease) == &v);
  }
  s = stats_of(cache);
  CHECK_U64(s.misses, 1);
  CHECK_U64(s.builds, 1);
  CHECK_U64(s.waits, THREADS - 1);
  CHECK_U64(s.hits, 0);
  CHECK_U64(s.leases, THREADS);
  CHECK_U64(s.entries, 1);
  for (i = 0; i < THREADS; i++) kc_lease_release(ls[i].lease);
  kc_cache_free(cache);
  CHECK(v.destroys == 1);
}

static void single_flight_failure_is_shared(void) {
  destroy_log log;
  tracked v = {1, 0};
  gated_build b;
  lookup ls[THREADS];
  kc_cache *cache;
  kc_cache_statistics s;
  int i;

  destroy_log_init(&log);
  gated_build_init(&b, &v, -7);
  cache = new_tracked_cache(&log, 0, 0, false);
  start_lookups(ls, THREADS, cache, KC_NO_DEVICE, &b);
  gate_wait_started(&b.g, 1);
  wait_for_waiters(cache, THREADS - 1);
  gate_open(&b.g);
  join_lookups(ls, THREADS);

  CHECK(b.calls == 1);
  for (i = 0; i < THREADS; i++) {
    CHECK_STATUS(ls[i].status, KC_ERR_BUILD_FAILED);
    CHECK(ls[i].lease == NULL);
    CHECK(ls[i].build_error == -7);
    CHECK(strstr(ls[i].message, "-7") != NULL);
  }
  s = stats_of(cache);
  CHECK_U64(s.builds, 0);
  CHECK_U64(s.build_failures, 1);
  CHECK_U64(s.waits, THREADS - 1);
  CHECK_U64(s.entries, 0);
  kc_cache_free(cache);
  CHECK(v.destroys == 0);
}

static void evict_during_build_destroys_the_value(void) {
  destroy_log log;
  tracked v = {1, 0}, w = {2, 0};
  gated_build b;
  simple_build again = {&w, 0, 0, 0};
  lookup ls[4];
  kc_lease *l = NULL;
  kc_cache *cache;
  kc_cache_statistics s;
  int i;

  destroy_log_init(&log);
  gated_build_init(&b, &v, 0);
  cache = new_tracked_cache(&log, 0, 0, false);
  /* One builder and three waiters, all for device 3. */
  start_lookups(ls, 4, cache, 3, &b);
  gate_wait_started(&b.g, 1);
  wait_for_waiters(cache, 3);
  CHECK_STATUS(kc_cache_evict_device(cache, 3), KC_OK);
  gate_open(&b.g);
  join_lookups(ls, 4);

  CHECK(b.calls == 1);
  for (i = 0; i < 4; i++) {
    CHECK_STATUS(ls[i].status, KC_ERR_DEVICE_DESTROYED);
    CHECK(ls[i].lease == NULL);
  }
  CHECK(v.destroys == 1);
  CHECK(kc_cache_len(cache) == 0);
  s = stats_of(cache);
  CHECK_U64(s.builds, 1);
  CHECK_U64(s.discarded, 1);
  CHECK_U64(s.destroys, 1);
  CHECK_U64(s.entries, 0);

  /* The device's next lookup builds afresh. */
  CHECK_STATUS(kc_cache_find_or_build(cache, KEY("kernel"), 3, simple_build_fn, &again, &l),
               KC_OK);
  CHECK(again.calls == 1 && kc_lease_value(l) == &w);
  kc_lease_release(l);
  kc_cache_free(cache);
  CHECK(v.destroys == 1 && w.destroys == 1);
}

static void evict_of_another_device_does_not_disturb_a_build(void) {
  destroy_log log;
  tracked v = {1, 0};
  gated_build b;
  lookup ls[1];
  kc_cache *cache;

  destroy_log_init(&log);
  gated_build_init(&b, &v, 0);
  cache = new_tracked_cache(&log, 0, 0, false);
  start_lookups(ls, 1, cache, 1, &b);
  gate_wait_started(&b.g, 1);
  CHECK_STATUS(kc_cache_evict_device(cache, 2), KC_OK);
  gate_open(&b.g);
  join_lookups(ls, 1);
  CHECK_STATUS(ls[0].status, KC_OK);
  CHECK(kc_lease_value(ls[0].lease) == &v && v.destroys == 0);
  kc_lease_release(ls[0].lease);
  kc_cache_free(cache);
  CHECK(v.destroys == 1);
}

static void clear_during_build_installs_on_an_owning_cache(void) {
  destroy_log log;
  tracked v = {1, 0};
  gated_build b;
  lookup ls[1];
  kc_cache *cache;
  kc_cache_statistics s;

  destroy_log_init(&log);
  gated_build_init(&b, &v, 0);
  cache = new_tracked_cache(&log, 0, 0, false);
  start_lookups(ls, 1, cache, KC_NO_DEVICE, &b);
  gate_wait_started(&b.g, 1);
  CHECK_STATUS(kc_cache_clear(cache), KC_OK);
  gate_open(&b.g);
  join_lookups(ls, 1);

  CHECK_STATUS(ls[0].status, KC_OK);
  CHECK(kc_lease_value(ls[0].lease) == &v);
  CHECK(v.destroys == 0);
  CHECK(kc_cache_len(cache) == 1);
  s = stats_of(cache);
  CHECK_U64(s.clears, 1);
  CHECK_U64(s.builds, 1);
  CHECK_U64(s.discarded, 0);
  kc_lease_release(ls[0].lease);
  kc_cache_free(cache);
  CHECK(v.destroys == 1);
}

static void clear_during_build_discards_on_a_borrowing_cache(void) {
  destroy_log log;
  tracked v = {1, 0}, w = {2, 0};
  gated_build b;
  simple_build again = {&w, 0, 0, 0};
  lookup ls[1];
  kc_lease *l = NULL;
  kc_cache *cache;
  kc_cache_statistics s;

  destroy_log_init(&log);
  gated_build_init(&b, &v, 0);
  cache = new_tracked_cache(&log, 0, 0, true);
  start_lookups(ls, 1, cache, KC_NO_DEVICE, &b);
  gate_wait_started(&b.g, 1);
  CHECK_STATUS(kc_cache_clear(cache), KC_OK);
  gate_open(&b.g);
  join_lookups(ls, 1);

  CHECK_STATUS(ls[0].status, KC_ERR_CACHE_CLEARED);
  CHECK(ls[0].lease == NULL);
  CHECK(v.destroys == 1);
  CHECK(kc_cache_len(cache) == 0);
  s = stats_of(cache);
  CHECK_U64(s.discarded, 1);
  CHECK_U64(s.destroys, 1);

  /* After the clear, a build borrows live handles again and is installed. */
  CHECK_STATUS(
      kc_cache_find_or_build(cache, KEY("kernel"), KC_NO_DEVICE, simple_build_fn, &again, &l),
      KC_OK);
  CHECK(kc_lease_value(l) == &w);
  kc_lease_release(l);
  kc_cache_free(cache);
  CHECK(v.destroys == 1 && w.destroys == 1);
}

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
  kc_cache *cache;

  destroy_log_init(&log);
  cache = new_tracked_cache(&log, 0, 0, false);
  CHECK_STATUS(kc_cache_find_or_build(cache, KEY("kernel"), 0, simple_build_fn, &b, &r.lease),
               KC_OK);
  CHECK_STATUS(kc_cache_evict_device(cache, 0), KC_OK);
  CHECK_STATUS(kc_cache_clear(cache), KC_OK);
  CHECK(v.destroys == 0);
  r.expected = &v;
  r.destroys_before = -1;
  CHECK(pthread_create(&t, NULL, release_main, &r) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(r.destroys_before == 0);
  CHECK(v.destroys == 1);
  kc_cache_free(cache);
  CHECK(log.total == 1);
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
    {"lease_released_on_another_thread_after_clear", lease_released_on_another_thread_after_clear},
    {"single_flight_under_contention", single_flight_under_contention},
};

int main(int argc, char **argv) { return RUN_SCENARIOS(scenarios, argc, argv); }
