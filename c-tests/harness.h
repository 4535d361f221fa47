/* Shared helpers of the core C tests: checks of statuses and counts, values whose destroys are
 * counted, builds that hand them out, and a gate that parks a build callback until the test
 * opens it. */
#ifndef KCACHE_TEST_HARNESS_H
#define KCACHE_TEST_HARNESS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checks.h"

#define CHECK_STATUS(expr, expected)                                                    \
  do {                                                                                  \
    kc_status got_ = (expr);                                                            \
    if (got_ != (expected)) {                                                           \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s; last kcache error: %s\n",    \
              __FILE__, __LINE__, #expr, kc_status_name((int)got_),                     \
              kc_status_name((int)(expected)), kc_last_error_message());                \
      abort();                                                                          \
    }                                                                                   \
  } while (0)

#define CHECK_U64(actual, expected)                                                     \
  do {                                                                                  \
    uint64_t a_ = (uint64_t)(actual), e_ = (uint64_t)(expected);                        \
    if (a_ != e_) {                                                                     \
      fprintf(stderr, "%s:%d: %s is %llu, expected %llu\n", __FILE__, __LINE__,         \
              #actual, (unsigned long long)a_, (unsigned long long)e_);                 \
      abort();                                                                          \
    }                                                                                   \
  } while (0)

#define KEY(s) ((const uint8_t *)(s)), (sizeof(s) - 1)

/* A value handed to the cache: `destroys` counts destroy callbacks run on it. */
typedef struct tracked {
  int id;
  int destroys;
} tracked;

/* The destroy_ctx of caches holding `tracked` values. */
typedef struct destroy_log {
  pthread_mutex_t lock;
  int total;
  int fail_id;   /* destroy of the value with this id returns fail_code */
  int fail_code;
} destroy_log;

static inline void destroy_log_init(destroy_log *log) {
  pthread_mutex_init(&log->lock, NULL);
  log->total = 0;
  log->fail_id = -1;
  log->fail_code = 0;
}

static inline int destroy_log_total(destroy_log *log) {
  int total;
  pthread_mutex_lock(&log->lock);
  total = log->total;
  pthread_mutex_unlock(&log->lock);
  return total;
}

static inline int tracked_destroy(void *ctx, void *value) {
  destroy_log *log = (destroy_log *)ctx;
  tracked *t = (tracked *)value;
  int rc;
  pthread_mutex_lock(&log->lock);
  t->destroys++;
  log->total++;
  rc = t->id == log->fail_id ? log->fail_code : 0;
  pthread_mutex_unlock(&log->lock);
  return rc;
}

/* build_ctx for builds that hand out a fixed value and count their calls. */
typedef struct simple_build {
  tracked *value;
  uint64_t weight;
  int result; /* returned by the callback; non-zero = failure */
  int calls;
} simple_build;

static inline int simple_build_fn(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                           uint64_t *out_weight) {
  simple_build *b = (simple_build *)ctx;
  (void)key;
  (void)key_len;
  b->calls++;
  if (b->result != 0) return b->result;
  *out_value = b->value;
  *out_weight = b->weight;
  return 0;
}

/* A cache whose values are `tracked`, their destroys counted in `log`, which starts empty. */
static inline kc_cache *new_tracked_cache(destroy_log *log, uint64_t max_entries, uint64_t max_weight,
                                   bool invalidated_by_clear) {
  kc_cache_options opts = kc_cache_options_default();
  kc_cache *cache = NULL;
  destroy_log_init(log);
  opts.max_entries = max_entries;
  opts.max_weight = max_weight;
  opts.invalidated_by_clear = invalidated_by_clear;
  opts.destroy = tracked_destroy;
  opts.destroy_ctx = log;
  CHECK_STATUS(kc_cache_new(&opts, &cache), KC_OK);
  CHECK(cache != NULL);
  return cache;
}

/* Frees a cache made by new_tracked_cache and checks that `total` destroys ran in all by then. */
static inline void free_tracked_cache(kc_cache *cache, destroy_log *log, int total) {
  kc_cache_free(cache);
  CHECK(destroy_log_total(log) == total);
}

/* From now on, the destroy of the value with this id fails with `code`. */
static inline void fail_destroy_of(destroy_log *log, int id, int code) {
  log->fail_id = id;
  log->fail_code = code;
}

/* kc_cache_find_or_build with a simple_build, under the bytes of the string `key`. */
static inline kc_status build_simple(kc_cache *cache, const char *key, int64_t device,
                                     simple_build *b, kc_lease **out_lease) {
  return kc_cache_find_or_build(cache, (const uint8_t *)key, strlen(key), device, simple_build_fn,
                                b, out_lease);
}

/* Puts `value` (of `weight`) in the cache under `key` for `device`, leasing it only meanwhile. */
static inline void cache_value(kc_cache *cache, const char *key, int64_t device, tracked *value,
                               uint64_t weight) {
  simple_build b = {value, weight, 0, 0};
  kc_lease *l = NULL;
  CHECK_STATUS(build_simple(cache, key, device, &b, &l), KC_OK);
  CHECK(kc_lease_value(l) == value);
  kc_lease_release(l);
}

static inline kc_cache_statistics stats_of(const kc_cache *cache) {
  kc_cache_statistics s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  CHECK_STATUS(kc_cache_stats(cache, &s), KC_OK);
  CHECK_U64(s.struct_size, sizeof s);
  return s;
}

/* The end of a test that holds one lease on `value` last: releases it and frees the cache, after
 * which the value has been destroyed, exactly once. */
static inline void release_and_free(kc_lease *lease, kc_cache *cache, const tracked *value) {
  kc_lease_release(lease);
  kc_cache_free(cache);
  CHECK(value->destroys == 1);
}

/* One counter of kc_cache_statistics and the value CHECK_STATS expects of it. */
typedef struct stat_expectation {
  const char *name;
  size_t offset;
  uint64_t value;
} stat_expectation;

#define STAT(field, expected) {#field, offsetof(kc_cache_statistics, field), (uint64_t)(expected)}

/* CHECK_STATS(cache, STAT(field, expected)...): one snapshot of the statistics, then each named
 * counter compared with its expected value (the others are not looked at). */
#define CHECK_STATS(cache, ...)                                                                \
  check_stats(__FILE__, __LINE__, (cache), (const stat_expectation[]){__VA_ARGS__, {NULL, 0, 0}})

static inline void check_stats(const char *file, int line, const kc_cache *cache,
                               const stat_expectation *expected) {
  kc_cache_statistics s = stats_of(cache);
  for (; expected->name != NULL; expected++) {
    uint64_t actual;
    memcpy(&actual, (const char *)&s + expected->offset, sizeof actual);
    if (actual != expected->value) {
      fprintf(stderr, "%s:%d: statistics: %s is %llu, expected %llu\n", file, line, expected->name,
              (unsigned long long)actual, (unsigned long long)expected->value);
      abort();
    }
  }
}

/* Parks a build until the test opens the gate: `started` tells the test the build is running. */
typedef struct gate {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int started;
  int open;
} gate;

static inline void gate_init(gate *g) {
  pthread_mutex_init(&g->lock, NULL);
  pthread_cond_init(&g->cond, NULL);
  g->started = 0;
  g->open = 0;
}

static inline void gate_arrive_and_wait(gate *g) {
  pthread_mutex_lock(&g->lock);
  g->started++;
  pthread_cond_broadcast(&g->cond);
  while (!g->open) pthread_cond_wait(&g->cond, &g->lock);
  pthread_mutex_unlock(&g->lock);
}

static inline void gate_wait_started(gate *g, int count) {
  pthread_mutex_lock(&g->lock);
  while (g->started < count) pthread_cond_wait(&g->cond, &g->lock);
  pthread_mutex_unlock(&g->lock);
}

static inline void gate_open(gate *g) {
  pthread_mutex_lock(&g->lock);
  g->open = 1;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->lock);
}

static inline void sleep_ms(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

/* Runs the scenarios of one test program: all of them, or those named on the command line. */
typedef struct scenario {
  const char *name;
  void (*run)(void);
} scenario;

static inline int run_scenarios(const scenario *list, size_t count, int argc, char **argv) {
  size_t i;
  int a, ran = 0;
  for (i = 0; i < count; i++) {
    int wanted = argc < 2;
    for (a = 1; a < argc; a++) wanted |= strcmp(argv[a], list[i].name) == 0;
    if (!wanted) continue;
    printf("-- %s\n", list[i].name);
    fflush(stdout);
    list[i].run();
    ran++;
  }
  if (ran == 0) {
    fprintf(stderr, "no scenario matched\n");
    return 1;
  }
  printf("%d scenario(s) passed\n", ran);
  return 0;
}

#define RUN_SCENARIOS(list, argc, argv) \
  run_scenarios((list), sizeof(list) / sizeof((list)[0]), (argc), (argv))

#endif
