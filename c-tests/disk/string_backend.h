/* What the disk C tests (test_disk.c) and the processes of the cross-process test
 * (flight_worker.c) share: disk keys, disk options and statistics, and a tiered backend whose
 * live value is a heap string and whose serialized form is its bytes. */
#ifndef KCACHE_TEST_STRING_BACKEND_H
#define KCACHE_TEST_STRING_BACKEND_H

#include <dirent.h>
#include <unistd.h>

#include "../harness.h"

/* The disk key of the entry named `entry`. */
static inline void make_key(const char *entry, uint8_t out[KC_KEY_LEN]) {
  kc_key_builder *b = NULL;
  CHECK_STATUS(kc_key_builder_new(&b), KC_OK);
  CHECK_STATUS(kc_key_builder_set(b, KC_KEY_BACKEND, KEY("c-test")), KC_OK);
  CHECK_STATUS(kc_key_builder_set(b, KC_KEY_ENTRY, (const uint8_t *)entry, strlen(entry)), KC_OK);
  CHECK_STATUS(kc_key_builder_finish(b, out), KC_OK);
  kc_key_builder_free(b);
}

/* Options of an unkeyed disk tier in `dir`, without the environment or fsyncs. */
static inline kc_persistence_options options_in(const char *dir) {
  kc_persistence_options opts = kc_persistence_options_default();
  opts.dir = dir;
  opts.ignore_env = true;
  opts.relaxed_durability = true;
  return opts;
}

/* Removes `dir` and the files in it (it holds no subdirectory). With a `prefix`, every file must
 * start with it: the test checks that nothing else was left behind. */
static inline void remove_flat_dir(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[4096];
  CHECK(d != NULL);
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    CHECK(prefix == NULL || strncmp(e->d_name, prefix, strlen(prefix)) == 0);
    CHECK(snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path);
    CHECK(unlink(path) == 0);
  }
  closedir(d);
  CHECK(rmdir(dir) == 0);
}

static inline kc_persistence_statistics disk_stats(const kc_persistence *disk) {
  kc_persistence_statistics s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  CHECK_STATUS(kc_persistence_stats(disk, &s), KC_OK);
  CHECK(s.struct_size == sizeof s);
  return s;
}

/* The ctx of the callbacks below: what they did, and how builds behave. */
typedef struct backend {
  int builds, loads, serializes, refuse_load;
  /* Non-zero: what load_fn returns (after refuse_load). */
  int load_fails_with;
  long build_ms;    /* each build takes this long first */
  int build_result; /* non-zero: builds fail with this code */
} backend;

/* Builds the value: a copy of the key, which is its own string. */
static inline int build_fn(void *ctx, const uint8_t *key, size_t key_len, void **out,
                           uint64_t *w) {
  backend *b = ctx;
  b->builds++;
  if (b->build_ms > 0) sleep_ms(b->build_ms);
  if (b->build_result != 0) return b->build_result;
  char *v = malloc(key_len + 1);
  memcpy(v, key, key_len);
  v[key_len] = '\0';
  *out = v;
  *w = key_len;
  return 0;
}

static inline int load_fn(void *ctx, const uint8_t *bytes, size_t len, void **out, uint64_t *w) {
  backend *b = ctx;
  b->loads++;
  if (b->refuse_load) return 17;
  if (b->load_fails_with) return b->load_fails_with;
  char *v = malloc(len + 1);
  memcpy(v, bytes, len);
  v[len] = '\0';
  *out = v;
  *w = len;
  return 0;
}

static inline int serialize_fn(void *ctx, void *value, uint8_t *out, size_t *len) {
  backend *b = ctx;
  size_t n = strlen(value);
  if (out == NULL) {
    *len = n;
    return 0;
  }
  b->serializes++;
  CHECK(*len == n);
  memcpy(out, value, n);
  return 0;
}

static inline int free_value(void *ctx, void *value) {
  (void)ctx;
  free(value);
  return 0;
}

/* A memory tier holding the backend's strings. */
static inline kc_cache *new_cache(void) {
  kc_cache_options o = kc_cache_options_default();
  o.destroy = free_value;
  kc_cache *cache = NULL;
  CHECK_STATUS(kc_cache_new(&o, &cache), KC_OK);
  return cache;
}

/* The tiered lookup of the string `value` (its own memory key) under the disk key of `entry`. */
static inline kc_status string_lookup(kc_cache *cache, kc_persistence *disk, const char *value,
                                      const char *entry, backend *b, kc_lease **lease) {
  uint8_t l2[KC_KEY_LEN];
  make_key(entry, l2);
  kc_tiered_callbacks cb = {sizeof cb, build_fn, load_fn, serialize_fn, b};
  return kc_tiered_find_or_build(cache, (const uint8_t *)value, strlen(value), KC_NO_DEVICE, disk,
                                 l2, &cb, lease);
}

#endif
