/* Threads hammering one cache with lookups, held leases, removals, device evictions and clears
 * for a few seconds, then exact accounting: every value built is destroyed exactly once, never
 * while a lease on it is held, and the cache's counters add up to what the threads did.
 *
 * Usage: kc_test_stress [SECONDS]   (default 3; half on an owning cache, half on a borrowing one) */
#include <sched.h>

#include "harness.h"

#define THREADS 8
#define KEYS 64
#define DEVICES 4
#define HELD 4
#define MAGIC 0x6b63616368655f76ULL

enum { ALIVE = 1, DEAD = 2 };

typedef struct value {
  uint64_t magic;
  int key;
  int state;  /* ALIVE until destroyed; atomic */
  int leased; /* leases the threads hold on it now; atomic */
  struct value *next;
} value;

/* Every value ever built, for the final check. */
static value *all_values;
static long destroyed;
static long destroy_faults;

static void note_fault(const char *what, const value *v) {
  __atomic_add_fetch(&destroy_faults, 1, __ATOMIC_SEQ_CST);
  fprintf(stderr, "stress: %s (key %d)\n", what, v ? v->key : -1);
}

static int destroy_value(void *ctx, void *p) {
  value *v = (value *)p;
  int expected = ALIVE;
  (void)ctx;
  if (v == NULL || v->magic != MAGIC) {
    note_fault("destroy of something that is not a built value", NULL);
    return 1;
  }
  if (__atomic_load_n(&v->leased, __ATOMIC_SEQ_CST) != 0) note_fault("destroyed while leased", v);
  if (!__atomic_compare_exchange_n(&v->state, &expected, DEAD, 0, __ATOMIC_SEQ_CST,
                                   __ATOMIC_SEQ_CST))
    note_fault("destroyed twice", v);
  __atomic_add_fetch(&destroyed, 1, __ATOMIC_SEQ_CST);
  return 0;
}

typedef struct worker {
  pthread_t thread;
  kc_cache *cache;
  uint64_t rng;
  double deadline;
  kc_lease *held[HELD];
  int held_count;
  /* What this thread did, for the accounting. */
  long finds, gets, get_misses, built, build_failures_seen, removes, evicts, clears;
} worker;

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t next_random(worker *w) {
  /* xorshift64 */
  w->rng ^= w->rng << 13;
  w->rng ^= w->rng >> 7;
  w->rng ^= w->rng << 17;
  return w->rng;
}

static int key_of(const uint8_t *key, size_t len) {
  int k = 0;
  size_t i;
  for (i = 0; i < len; i++) k = k * 10 + (key[i] - '0');
  return k;
}

/* Builds run on the calling thread, so the worker itself is the build context. */
static int build_value(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                       uint64_t *out_weight) {
  worker *w = (worker *)ctx;
  value *v;
  uint64_t r = next_random(w);
  if (r % 23 == 0) return 17; /* some builds fail */
  if (r % 7 == 0) sched_yield(); /* widen the window for evictions and clears */
  v = (value *)malloc(sizeof *v);
  CHECK(v != NULL);
  v->magic = MAGIC;
  v->key = key_of(key, key_len);
  v->state = ALIVE;
  v->leased = 0;
  v->next = __atomic_load_n(&all_values, __ATOMIC_SEQ_CST);
  while (!__atomic_compare_exchange_n(&all_values, &v->next, v, 0, __ATOMIC_SEQ_CST,
                                      __ATOMIC_SEQ_CST)) {
  }
  *out_value = v;
  *out_weight = 1 + r % 16;
  w->built++;
  return 0;
}

static void hold(worker *w, kc_lease *lease, int key) {
  value *v = (value *)kc_lease_value(lease);
  CHECK(v != NULL && v->magic == MAGIC && v->key == key);
  __atomic_add_fetch(&v->leased, 1, __ATOMIC_SEQ_CST);
  CHECK(__atomic_load_n(&v->state, __ATOMIC_SEQ_CST) == ALIVE);
  if (w->held_count == HELD) {
    kc_lease *oldest = w->held[0];
    value *old = (value *)kc_lease_value(oldest);
    CHECK(__atomic_load_n(&old->state, __ATOMIC_SEQ_CST) == ALIVE);
    __atomic_sub_fetch(&old->leased, 1, __ATOMIC_SEQ_CST);
    kc_lease_release(oldest);
    memmove(w->held, w->held + 1, (HELD - 1) * sizeof w->held[0]);
    w->held_count--;
  }
  w->held[w->held_count++] = lease;
}

static void release_all(worker *w) {
  while (w->held_count > 0) {
    kc_lease *lease = w->held[--w->held_count];
    value *v = (value *)kc_lease_value(lease);
    CHECK(__atomic_load_n(&v->state, __ATOMIC_SEQ_CST) == ALIVE);
    __atomic_sub_fetch(&v->leased, 1, __ATOMIC_SEQ_CST);
    kc_lease_release(lease);
  }
}

static void *worker_main(void *arg) {
  worker *w = (worker *)arg;
  long iteration = 0;
  while ((iteration++ & 63) != 0 || now_seconds() < w->deadline) {
    uint64_t r = next_random(w);
    int key = (int)((r >> 8) % KEYS);
    int64_t device = key % 5 == 0 ? KC_NO_DEVICE : key % DEVICES;
    char text[8];
    int len = snprintf(text, sizeof text, "%d", key);
    const uint8_t *k = (const uint8_t *)text;
    int op = (int)(r % 100);
    kc_lease *lease = NULL;
    kc_status st;

    if (op < 70) {
      w->finds++;
      st = kc_cache_find_or_build(w->cache, k, (size_t)len, device, build_value, w, &lease);
      if (st == KC_OK) {
        hold(w, lease, key);
      } else {
        CHECK(st == KC_ERR_BUILD_FAILED || st == KC_ERR_DEVICE_DESTROYED ||
              st == KC_ERR_CACHE_CLEARED);
        if (st == KC_ERR_BUILD_FAILED) {
          CHECK(kc_last_build_error() == 17);
          w->build_failures_seen++;
        }
      }
    } else if (op < 85) {
      w->gets++;
      st = kc_cache_get(w->cache, k, (size_t)len, &lease);
      if (st == KC_OK) {
        kc_lease *copy = kc_lease_clone(lease);
        hold(w, lease, key);
        kc_lease_release(copy);
      } else {
        CHECK_STATUS(st, KC_ERR_NOT_FOUND);
        w->get_misses++;
      }
    } else if (op < 93) {
      w->removes++;
      st = kc_cache_remove(w->cache, k, (size_t)len);
      CHECK(st == KC_OK || st == KC_ERR_NOT_FOUND);
    } else if (op < 98) {
      w->evicts++;
      CHECK_STATUS(kc_cache_evict_device(w->cache, (int64_t)((r >> 32) % DEVICES)), KC_OK);
    } else {
      w->clears++;
      CHECK_STATUS(kc_cache_clear(w->cache), KC_OK);
    }
  }
  release_all(w);
  return NULL;
}

static void stress(double seconds, bool invalidated_by_clear, uint64_t max_entries,
                   uint64_t max_weight) {
  kc_cache_options opts = kc_cache_options_default();
  kc_cache *cache = NULL;
  worker workers[THREADS];
  kc_cache_statistics s;
  long finds = 0, gets = 0, get_misses = 0, built = 0, failures = 0, clears = 0;
  long values = 0;
  value *v;
  int i;

  all_values = NULL;
  destroyed = 0;
  destroy_faults = 0;
  opts.max_entries = max_entries;
  opts.max_weight = max_weight;
  opts.invalidated_by_clear = invalidated_by_clear;
  opts.destroy = destroy_value;
  CHECK_STATUS(kc_cache_new(&opts, &cache), KC_OK);

  for (i = 0; i < THREADS; i++) {
    memset(&workers[i], 0, sizeof workers[i]);
    workers[i].cache = cache;
    workers[i].rng = 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1);
    workers[i].deadline = now_seconds() + seconds;
    CHECK(pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]) == 0);
  }
  for (i = 0; i < THREADS; i++) {
    CHECK(pthread_join(workers[i].thread, NULL) == 0);
    finds += workers[i].finds;
    gets += workers[i].gets;
    get_misses += workers[i].get_misses;
    built += workers[i].built;
    failures += workers[i].build_failures_seen;
    clears += workers[i].clears;
  }

  s = stats_of(cache);
  printf("  %s cache: %ld finds, %ld gets, %ld builds, %ld clears; hits %llu, waits %llu, "
         "discarded %llu, capacity evictions %llu, device evictions %llu\n",
         invalidated_by_clear ? "borrowing" : "owning", finds, gets, built, clears,
         (unsigned long long)s.hits, (unsigned long long)s.waits, (unsigned long long)s.discarded,
         (unsigned long long)s.capacity_evictions, (unsigned long long)s.device_evictions);
  CHECK(built > 0);
  /* Every lookup was a hit, a miss or a wait on another thread's build... */
  CHECK_U64(s.hits + s.misses + s.waits, finds + gets);
  /* ...every find_or_build miss ran exactly one build, and only those did. */
  CHECK_U64(s.builds, built);
  CHECK_U64(s.builds + s.build_failures, s.misses - (uint64_t)get_misses);
  /* Waiters share the builder's failure, so the callers saw at least as many as were built. */
  CHECK((uint64_t)failures >= s.build_failures);
  CHECK_U64(s.clears, clears);
  CHECK_U64(s.leases, 0);
  CHECK_U64(s.entries, kc_cache_len(cache));
  CHECK_U64(s.destroys, destroyed);
  CHECK_U64(s.destroy_errors, 0);

  kc_cache_free(cache);
  CHECK(destroy_faults == 0);
  CHECK(destroyed == built);
  while (all_values != NULL) {
    v = all_values;
    all_values = v->next;
    CHECK(v->state == DEAD && v->leased == 0);
    values++;
    free(v);
  }
  CHECK(values == built);
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 3.0;
  CHECK(seconds > 0);
  stress(seconds / 2, false, 32, 0);
  stress(seconds / 2, true, 0, 200);
  printf("stress passed\n");
  return 0;
}
