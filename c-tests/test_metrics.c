/* kc_metrics_render: the size protocol (query, too small, exact fit), its argument checks, and
 * the counters of caches used by this test (a kc_cache alone, and tiered lookups through a
 * kc_persistence) in the text it writes. */
#include <stdlib.h>

#include "disk/string_backend.h"

/* The value of the sample line starting with `series` (name and labels), or -1 if absent. */
static long long sample(const char *text, const char *series) {
  size_t n = strlen(series);
  const char *line = text;
  while (line != NULL && *line != '\0') {
    if (strncmp(line, series, n) == 0 && line[n] == ' ') return atoll(line + n + 1);
    line = strchr(line, '\n');
    if (line != NULL) line++;
  }
  return -1;
}

/* The whole text, in a buffer of the size a query reported (plus slack for figures that grow
 * between the two calls). The caller frees it. */
static char *render(void) {
  size_t needed = 0, again = 0;
  char *buf;
  CHECK_STATUS(kc_metrics_render(NULL, 0, &needed), KC_OK);
  CHECK(needed > 1);
  buf = malloc(needed + 256);
  CHECK(buf != NULL);
  CHECK_STATUS(kc_metrics_render(buf, needed + 256, &again), KC_OK);
  CHECK(again == strlen(buf) + 1);
  return buf;
}

static void size_protocol(void) {
  char small[16];
  size_t needed = 0, sentinel = 12345;
  char *buf;

  CHECK_STATUS(kc_metrics_render(NULL, 0, NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kc_last_error_message(), "out_needed") != NULL);
  CHECK_STATUS(kc_metrics_render(NULL, 8, &sentinel), KC_ERR_INVALID_ARGUMENT);
  CHECK(sentinel == 12345);

  /* Too small: the size is reported, the buffer left alone. */
  memset(small, 'x', sizeof small);
  CHECK_STATUS(kc_metrics_render(small, sizeof small, &needed), KC_ERR_BUFFER_TOO_SMALL);
  CHECK(needed > sizeof small);
  CHECK(small[0] == 'x' && small[sizeof small - 1] == 'x');
  CHECK(strstr(kc_last_error_message(), "needed") != NULL);

  /* Exactly the size reported (no cache changes meanwhile in this scenario). */
  buf = malloc(needed);
  CHECK(buf != NULL);
  CHECK_STATUS(kc_metrics_render(buf, needed, &sentinel), KC_OK);
  CHECK(sentinel == needed);
  CHECK(buf[needed - 1] == '\0' && strlen(buf) == needed - 1);
  CHECK(strncmp(buf, "# HELP kcache_build_info ", 25) == 0);
  /* One byte short is too small. */
  CHECK_STATUS(kc_metrics_render(buf, needed - 1, &sentinel), KC_ERR_BUFFER_TOO_SMALL);
  CHECK(sentinel == needed);
  free(buf);
}

/* Checks the hits and the misses counted in `tier`. */
static void check_lookups(const char *text, const char *tier, long long hits, long long misses) {
  char series[96];
  snprintf(series, sizeof series, "kcache_lookups_total{tier=\"%s\",result=\"hit\"}", tier);
  CHECK_U64(sample(text, series), hits);
  snprintf(series, sizeof series, "kcache_lookups_total{tier=\"%s\",result=\"miss\"}", tier);
  CHECK_U64(sample(text, series), misses);
}

static void counters_of_a_cache(void) {
  destroy_log log;
  tracked v = {1, 0};
  simple_build ok = {&v, 10, 0, 0}, failing = {&v, 0, 7, 0};
  kc_lease *lease = NULL;
  kc_cache *cache;
  char *text;
  int i;

  text = render();
  CHECK_U64(sample(text, "kcache_caches{backend=\"c\"}"), 0);
  free(text);

  cache = new_tracked_cache(&log, 0, 0, false);
  /* One miss that builds, two hits, one failed build. */
  for (i = 0; i < 3; i++) {
    CHECK_STATUS(kc_cache_find_or_build(cache, KEY("k"), KC_NO_DEVICE, simple_build_fn, &ok, &lease),
                 KC_OK);
    kc_lease_release(lease);
  }
  CHECK_STATUS(kc_cache_find_or_build(cache, KEY("bad"), KC_NO_DEVICE, simple_build_fn, &failing,
                                      &lease),
               KC_ERR_BUILD_FAILED);

  text = render();
  CHECK_U64(sample(text, "kcache_caches{backend=\"c\"}"), 1);
  check_lookups(text, "memory", 2, 2);
  CHECK_U64(sample(text, "kcache_builds_total{backend=\"c\",result=\"ok\"}"), 1);
  CHECK_U64(sample(text, "kcache_builds_total{backend=\"c\",result=\"failed\"}"), 1);
  CHECK_U64(sample(text, "kcache_build_duration_seconds_count{backend=\"c\"}"), 2);
  CHECK_U64(sample(text, "kcache_build_duration_seconds_bucket{backend=\"c\",le=\"+Inf\"}"), 2);
  CHECK_U64(sample(text, "kcache_builds_total{backend=\"opencl\",result=\"ok\"}"), 0);
  CHECK_U64(sample(text, "kcache_entries{tier=\"memory\"}"), 1);
  CHECK_U64(sample(text, "kcache_memory_weight"), 10);
  CHECK(strstr(text, "kcache_build_info{version=\"") != NULL);
  free(text);

  /* A freed cache drops out. */
  free_tracked_cache(cache, &log, 1);
  text = render();
  CHECK_U64(sample(text, "kcache_caches{backend=\"c\"}"), 0);
  CHECK_U64(sample(text, "kcache_lookups_total{tier=\"memory\",result=\"hit\"}"), 0);
  free(text);
}

/* A cold memory tier builds and writes the entry; a second one (another process, to the disk)
 * loads it: one build, one disk miss, one disk hit, one write. */
static void tiered_lookups_through_a_disk(void) {
  char dir[] = "/tmp/kcache-metrics-XXXXXX";
  uint8_t key[KC_KEY_LEN];
  kc_persistence_options opts;
  kc_persistence *disk = NULL;
  kc_cache *cold, *warm;
  kc_lease *lease = NULL;
  backend b;
  char *text;

  CHECK(mkdtemp(dir) != NULL);
  opts = options_in(dir);
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  memset(&b, 0, sizeof b);
  cold = new_cache();
  warm = new_cache();
  CHECK_STATUS(string_lookup(cold, disk, "value", "entry", &b, &lease), KC_OK);
  kc_lease_release(lease);
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  CHECK_STATUS(string_lookup(warm, disk, "value", "entry", &b, &lease), KC_OK);
  kc_lease_release(lease);
  CHECK(b.builds == 1 && b.loads == 1);

  text = render();
  CHECK_U64(sample(text, "kcache_caches{backend=\"c\"}"), 2);
  CHECK_U64(sample(text, "kcache_builds_total{backend=\"c\",result=\"ok\"}"), 1);
  CHECK_U64(sample(text, "kcache_loads_total{backend=\"c\"}"), 1);
  CHECK_U64(sample(text, "kcache_build_duration_seconds_count{backend=\"c\"}"), 1);
  /* Two caches, a miss each. */
  check_lookups(text, "memory", 0, 2);
  check_lookups(text, "disk", 1, 1);
  CHECK_U64(sample(text, "kcache_disk_writes_total{result=\"ok\"}"), 1);
  CHECK_U64(sample(text, "kcache_disk_written_bytes_total"), disk_stats(disk).bytes_written);
  CHECK_U64(sample(text, "kcache_disk_tiers"), 1);
  CHECK_U64(sample(text, "kcache_entries{tier=\"disk\"}"), 1);
  CHECK_U64(sample(text, "kcache_entries{tier=\"memory\"}"), 2);
  free(text);

  kc_cache_free(cold);
  kc_cache_free(warm);
  make_key("entry", key);
  CHECK_STATUS(kc_persistence_remove(disk, key), KC_OK);
  CHECK_STATUS(kc_persistence_gc(disk, NULL, 0, 0, NULL), KC_OK);
  kc_persistence_free(disk);
  text = render();
  CHECK_U64(sample(text, "kcache_disk_tiers"), 0);
  CHECK_U64(sample(text, "kcache_caches{backend=\"c\"}"), 0);
  free(text);
  /* Nothing but the counter files a disk tier adds to when it is freed (docs/disk-format.md):
   * the entry is gone. */
  remove_flat_dir(dir, ".stats-");
}

static const scenario scenarios[] = {
    {"size_protocol", size_protocol},
    {"counters_of_a_cache", counters_of_a_cache},
    {"tiered_lookups_through_a_disk", tiered_lookups_through_a_disk},
};

int main(int argc, char **argv) { return RUN_SCENARIOS(scenarios, argc, argv); }
