/* The key builder, the disk tier and the tiered lookup through the real header and library.
 * Usage: kc_test_disk WORK_DIR (an empty private directory; the test makes its caches in it). */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "string_backend.h"

static const char *work;

static void path_in(char *out, size_t cap, const char *name) {
  int n = snprintf(out, cap, "%s/%s", work, name);
  CHECK(n > 0 && (size_t)n < cap);
}

/* A disk tier in the work directory's `name`, keyed with `operator_key` unless that is NULL. */
static kc_persistence *open_keyed(const char *name, const char *operator_key) {
  char dir[4096];
  path_in(dir, sizeof dir, name);
  kc_persistence_options opts = options_in(dir);
  if (operator_key != NULL) {
    opts.key = (const uint8_t *)operator_key;
    opts.key_len = strlen(operator_key);
  }
  kc_persistence *disk = NULL;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  return disk;
}

static kc_persistence *open_disk(const char *name) { return open_keyed(name, NULL); }

/* Puts `data` in the disk tier under the key of `entry`; the key goes in `key` unless NULL. */
static void put_entry(kc_persistence *disk, const char *entry, const char *data, uint8_t *key) {
  uint8_t k[KC_KEY_LEN];
  make_key(entry, k);
  CHECK_STATUS(kc_persistence_put(disk, k, (const uint8_t *)data, strlen(data), 0), KC_OK);
  if (key != NULL) memcpy(key, k, KC_KEY_LEN);
}

/* The path of a file named after the unkeyed entry of `key` in the work directory's `name`:
 * the entry (`prefix` and `suffix` empty) or its lock file ("." and ".lock"). Unkeyed entries
 * are named 0000000000000000-<key hex>.kce. */
static void entry_file(const char *name, const uint8_t key[KC_KEY_LEN], const char *prefix,
                       const char *suffix, char *out, size_t cap) {
  char dir[4096], hex[2 * KC_KEY_LEN + 1];
  path_in(dir, sizeof dir, name);
  for (int i = 0; i < KC_KEY_LEN; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
  int n = snprintf(out, cap, "%s/%s0000000000000000-%s.kce%s", dir, prefix, hex, suffix);
  CHECK(n > 0 && (size_t)n < cap);
}

/* kc_persistence_gc with the default age of temporary files (retaining no other key), reporting in a
 * struct of `struct_size` bytes, which an older caller's is; fields past it are left as they
 * were (0xee bytes). */
static kc_persistence_gc_report collect(kc_persistence *disk, size_t struct_size) {
  kc_persistence_gc_report r;
  memset(&r, 0xee, sizeof r);
  r.struct_size = struct_size;
  CHECK_STATUS(kc_persistence_gc(disk, NULL, 0, KC_PERSISTENCE_DEFAULT_TEMP_MAX_AGE_S, &r), KC_OK);
  CHECK(r.struct_size == struct_size);
  return r;
}

static void test_keys(void) {
  uint8_t a[KC_KEY_LEN], b[KC_KEY_LEN], c[KC_KEY_LEN];
  kc_key_builder *kb = NULL;
  CHECK_STATUS(kc_key_builder_new(&kb), KC_OK);
  CHECK_STATUS(kc_key_builder_option(kb, KEY("-DA"), KEY("1")), KC_OK);
  CHECK_STATUS(kc_key_builder_option(kb, KEY("-w"), NULL, 0), KC_OK);
  CHECK_STATUS(kc_key_builder_finish(kb, a), KC_OK);
  kc_key_builder_free(kb);

  CHECK_STATUS(kc_key_builder_new(&kb), KC_OK);
  CHECK_STATUS(kc_key_builder_option(kb, KEY("-w"), NULL, 0), KC_OK);
  CHECK_STATUS(kc_key_builder_option(kb, KEY("-DA"), KEY("1")), KC_OK);
  CHECK_STATUS(kc_key_builder_finish(kb, b), KC_OK);
  CHECK(memcmp(a, b, KC_KEY_LEN) == 0); /* option order does not matter */
  CHECK_STATUS(kc_key_builder_set(kb, KC_KEY_SOURCE, KEY("kernel")), KC_OK);
  CHECK_STATUS(kc_key_builder_finish(kb, c), KC_OK);
  CHECK(memcmp(a, c, KC_KEY_LEN) != 0);
  CHECK_STATUS(kc_key_builder_option(kb, KEY("-DA"), KEY("2")), KC_OK);
  CHECK_STATUS(kc_key_builder_finish(kb, c), KC_ERR_INVALID_ARGUMENT); /* duplicate name */
  CHECK_STATUS(kc_key_builder_set(kb, 99, KEY("x")), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_key_builder_set(kb, KC_KEY_SOURCE, NULL, 3), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_key_builder_finish(NULL, c), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_key_builder_finish(kb, NULL), KC_ERR_INVALID_ARGUMENT);
  kc_key_builder_free(kb);
  kc_key_builder_free(NULL);
}

/* Key of a source compiled with the given ordered arguments and one #included header. */
static void ordered_key(const char *first, const char *second, const char *header,
                        uint8_t out[KC_KEY_LEN]) {
  kc_key_builder *kb = NULL;
  CHECK_STATUS(kc_key_builder_new(&kb), KC_OK);
  CHECK_STATUS(kc_key_builder_set(kb, KC_KEY_SOURCE, KEY("#include \"defs.h\"")), KC_OK);
  CHECK_STATUS(kc_key_builder_ordered_option(kb, (const uint8_t *)first, strlen(first)), KC_OK);
  CHECK_STATUS(kc_key_builder_ordered_option(kb, (const uint8_t *)second, strlen(second)), KC_OK);
  CHECK_STATUS(
      kc_key_builder_dependency(kb, KEY("defs.h"), (const uint8_t *)header, strlen(header)),
      KC_OK);
  CHECK_STATUS(kc_key_builder_finish(kb, out), KC_OK);
  kc_key_builder_free(kb);
}

static void test_ordered_options_and_dependencies(void) {
  uint8_t a[KC_KEY_LEN], b[KC_KEY_LEN], c[KC_KEY_LEN], d[KC_KEY_LEN];
  kc_key_builder *kb = NULL;
  ordered_key("-DX=1", "-UX", "#define N 4", a);
  ordered_key("-UX", "-DX=1", "#define N 4", b);
  ordered_key("-DX=1", "-UX", "#define N 8", c);
  ordered_key("-DX=1", "-UX", "#define N 4", d);
  CHECK(memcmp(a, b, KC_KEY_LEN) != 0); /* the two orders compile differently */
  CHECK(memcmp(a, c, KC_KEY_LEN) != 0); /* the header changed */
  CHECK(memcmp(a, d, KC_KEY_LEN) == 0);

  CHECK_STATUS(kc_key_builder_new(&kb), KC_OK);
  CHECK_STATUS(kc_key_builder_ordered_option(kb, NULL, 0), KC_OK); /* an empty argument */
  CHECK_STATUS(kc_key_builder_ordered_option(kb, NULL, 1), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_key_builder_ordered_option(NULL, KEY("-UX")), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_key_builder_dependency(NULL, KEY("a.h"), KEY("")), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_key_builder_dependency(kb, KEY("a.h"), NULL, 2), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_key_builder_dependency(kb, KEY("a.h"), KEY("1")), KC_OK);
  CHECK_STATUS(kc_key_builder_finish(kb, a), KC_OK);
  CHECK_STATUS(kc_key_builder_dependency(kb, KEY("a.h"), KEY("2")), KC_OK);
  CHECK_STATUS(kc_key_builder_finish(kb, a), KC_ERR_INVALID_ARGUMENT); /* duplicate name */
  kc_key_builder_free(kb);
}

static void test_disk(void) {
  kc_persistence *disk = open_disk("plain");
  uint8_t k[KC_KEY_LEN];
  make_key("saxpy", k);
  kc_buffer buf;
  memset(&buf, 0, sizeof buf);
  CHECK_STATUS(kc_persistence_get(disk, k, &buf), KC_ERR_NOT_FOUND);
  CHECK(buf.data == NULL); /* out-parameters are written on success only */
  CHECK_STATUS(kc_persistence_put(disk, k, KEY("binary bytes"), 12345), KC_OK);
  CHECK_STATUS(kc_persistence_get(disk, k, &buf), KC_OK);
  CHECK(buf.len == 12 && memcmp(buf.data, "binary bytes", 12) == 0);
  CHECK_U64(buf.build_time_ns, 12345);
  kc_buffer_free(&buf);
  CHECK(buf.data == NULL && buf.len == 0);
  kc_buffer_free(&buf); /* a freed (zeroed) buffer is a no-op */
  kc_buffer_free(NULL);

  /* Tamper with the file: the read is a counted miss and the file is gone. */
  char entry_dir[4096];
  path_in(entry_dir, sizeof entry_dir, "plain");
  DIR *d = opendir(entry_dir);
  CHECK(d != NULL);
  struct dirent *e;
  char entry[8192] = "";
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n > 4 && strcmp(e->d_name + n - 4, ".kce") == 0) {
      snprintf(entry, sizeof entry, "%s/%s", entry_dir, e->d_name);
    }
  }
  closedir(d);
  CHECK(entry[0] != '\0');
  FILE *f = fopen(entry, "r+b");
  CHECK(f != NULL);
  CHECK(fseek(f, 80, SEEK_SET) == 0);
  CHECK(fputc('X', f) != EOF);
  CHECK(fclose(f) == 0);
  CHECK_STATUS(kc_persistence_get(disk, k, &buf), KC_ERR_INTEGRITY);
  struct stat st;
  CHECK(stat(entry, &st) != 0);
  kc_persistence_statistics s = disk_stats(disk);
  CHECK_U64(s.hits, 1);
  CHECK_U64(s.misses, 2);
  CHECK_U64(s.puts, 1);
  CHECK_U64(s.integrity_rejects, 1);
  CHECK(kc_hit_rate(s.hits, s.misses) == 1.0 / 3.0);

  /* A reset zeroes the event counters and keeps the gauges. */
  CHECK_STATUS(kc_persistence_reset_stats(disk), KC_OK);
  s = disk_stats(disk);
  CHECK_U64(s.hits + s.misses + s.puts + s.integrity_rejects + s.bytes_read + s.bytes_written, 0);
  CHECK_U64(s.entries, 0);
  CHECK(s.scan_complete);

  CHECK_STATUS(kc_persistence_put(disk, k, KEY("again"), 0), KC_OK);
  CHECK_STATUS(kc_persistence_remove(disk, k), KC_OK);
  CHECK_STATUS(kc_persistence_remove(disk, k), KC_ERR_NOT_FOUND);

  uint8_t fp[KC_FINGERPRINT_LEN];
  CHECK_STATUS(kc_persistence_fingerprint(disk, fp), KC_OK);
  for (int i = 0; i < KC_FINGERPRINT_LEN; i++) CHECK(fp[i] == 0); /* no operator key */

  kc_persistence_gc_report r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  CHECK_STATUS(kc_persistence_put(disk, k, KEY("kept"), 0), KC_OK);
  CHECK_STATUS(kc_persistence_gc(disk, NULL, 0, KC_PERSISTENCE_DEFAULT_TEMP_MAX_AGE_S, &r), KC_OK);
  CHECK_U64(r.kept, 1);
  CHECK_U64(r.corrupt + r.temp_files + r.stale_schema + r.stale_fingerprint, 0);
  CHECK_STATUS(kc_persistence_gc(disk, NULL, 0, 0, NULL), KC_OK);

  CHECK_STATUS(kc_persistence_put(NULL, k, KEY("x"), 0), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_persistence_put(disk, NULL, KEY("x"), 0), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_persistence_get(disk, k, NULL), KC_ERR_INVALID_ARGUMENT);
  kc_persistence_free(disk);
  kc_persistence_free(NULL);
}

static void test_keyed_and_untrusted(void) {
  char dir[4096];
  path_in(dir, sizeof dir, "keyed");
  static const uint8_t operator_key[] = "an operator key of 32 bytes!!!!";
  kc_persistence_options opts = kc_persistence_options_default();
  opts.dir = dir;
  opts.ignore_env = true;
  opts.key = operator_key;
  opts.key_len = 8;
  kc_persistence *disk = NULL;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_ERR_INVALID_ARGUMENT); /* key too short */
  CHECK(disk == NULL);
  opts.key_len = sizeof operator_key - 1;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  uint8_t fp[KC_FINGERPRINT_LEN], zero[KC_FINGERPRINT_LEN] = {0};
  CHECK_STATUS(kc_persistence_fingerprint(disk, fp), KC_OK);
  CHECK(memcmp(fp, zero, sizeof fp) != 0);
  kc_persistence_free(disk);

  path_in(dir, sizeof dir, "open-to-all");
  CHECK(mkdir(dir, 0700) == 0);
  CHECK(chmod(dir, 0777) == 0);
  opts = kc_persistence_options_default();
  opts.dir = dir;
  opts.ignore_env = true;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_ERR_UNTRUSTED);
  CHECK(strstr(kc_last_error_message(), "writable by group or others") != NULL);
}

#define CHECK_NAMES(arg) CHECK(strstr(kc_last_error_message(), arg) != NULL)

static const char *tiered_lookup(kc_cache *cache, kc_persistence *disk, backend *b, kc_lease **lease) {
  CHECK_STATUS(string_lookup(cache, disk, "value-of-tiered", "tiered", b, lease), KC_OK);
  return kc_lease_value(*lease);
}

static void test_tiered(void) {
  kc_persistence *disk = open_disk("tiered");
  backend b = {0};
  kc_lease *lease = NULL;
  kc_cache *first = new_cache();
  CHECK(strcmp(tiered_lookup(first, disk, &b, &lease), "value-of-tiered") == 0);
  kc_lease_release(lease);
  CHECK(b.builds == 1 && b.loads == 0 && b.serializes == 1);
  CHECK_STATS(first, STAT(misses, 1), STAT(builds, 1));
  /* The write happens on the disk's background writer; a flush waits for it. */
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  kc_persistence_statistics s = disk_stats(disk);
  CHECK_U64(s.puts, 1);
  CHECK_U64(s.pending_writes + s.failed_writes, 0);
  CHECK(strcmp(tiered_lookup(first, disk, &b, &lease), "value-of-tiered") == 0); /* L1 hit */
  kc_lease_release(lease);
  CHECK(b.builds == 1 && b.loads == 0);
  kc_cache_free(first);

  /* A fresh memory tier (as in a new process) loads from disk instead of building. */
  kc_cache *second = new_cache();
  CHECK(strcmp(tiered_lookup(second, disk, &b, &lease), "value-of-tiered") == 0);
  kc_lease_release(lease);
  CHECK(b.builds == 1 && b.loads == 1);
  /* A value loaded is not a build: `builds` counts build callbacks only. */
  CHECK_STATS(second, STAT(misses, 1), STAT(builds, 0), STAT(entries, 1));
  kc_cache_free(second);

  /* An entry the backend refuses to load is removed, counted and rebuilt. */
  kc_cache *third = new_cache();
  b.refuse_load = 1;
  CHECK(strcmp(tiered_lookup(third, disk, &b, &lease), "value-of-tiered") == 0);
  kc_lease_release(lease);
  CHECK(b.builds == 2 && b.loads == 2 && b.serializes == 2);
  CHECK_U64(disk_stats(disk).load_failures, 1);
  kc_cache_free(third);

  /* A load that fails for the moment keeps the entry: the lookup fails, nothing is built. */
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  kc_cache *fourth = new_cache();
  b.refuse_load = 0;
  b.load_fails_with = KC_LOAD_TRANSIENT;
  CHECK_STATUS(string_lookup(fourth, disk, "value-of-tiered", "tiered", &b, &lease),
               KC_ERR_BUILD_FAILED);
  CHECK(kc_last_build_error() == KC_LOAD_TRANSIENT);
  CHECK(b.builds == 2 && b.loads == 3);
  CHECK_U64(disk_stats(disk).load_failures, 1);
  /* The same entry loads once the failure has passed. */
  b.load_fails_with = 0;
  CHECK(strcmp(tiered_lookup(fourth, disk, &b, &lease), "value-of-tiered") == 0);
  kc_lease_release(lease);
  CHECK(b.builds == 2 && b.loads == 4);
  kc_cache_free(fourth);

  /* Without a disk: memory only. */
  kc_cache *mem = new_cache();
  CHECK(strcmp(tiered_lookup(mem, kc_persistence_none(), &b, &lease), "value-of-tiered") == 0);
  kc_lease_release(lease);
  CHECK(b.builds == 3);
  kc_tiered_callbacks no_build = {sizeof no_build, NULL, load_fn, serialize_fn, &b};
  uint8_t l2[KC_KEY_LEN];
  make_key("x", l2);
  CHECK_STATUS(kc_tiered_find_or_build(mem, KEY("y"), KC_NO_DEVICE, disk, l2, &no_build, &lease),
               KC_ERR_INVALID_ARGUMENT);
  kc_cache_free(mem);

  /* Without `load` the disk is written but never read: a fresh memory tier builds again. */
  kc_cache *write_only = new_cache();
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK); /* the rebuild's write, counted before the snapshot */
  uint64_t hits = disk_stats(disk).hits, puts = disk_stats(disk).puts;
  kc_tiered_callbacks no_load = {sizeof no_load, build_fn, NULL, serialize_fn, &b};
  make_key("tiered", l2);
  CHECK_STATUS(kc_tiered_find_or_build(write_only, KEY("value-of-tiered"), KC_NO_DEVICE, disk, l2,
                                       &no_load, &lease),
               KC_OK);
  CHECK(strcmp(kc_lease_value(lease), "value-of-tiered") == 0);
  kc_lease_release(lease);
  CHECK(b.builds == 4 && b.loads == 4 && b.serializes == 3);
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  CHECK_U64(disk_stats(disk).hits, hits);
  CHECK_U64(disk_stats(disk).puts, puts + 1);
  kc_cache_free(write_only);
  kc_persistence_free(disk);
}

static int exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* Arguments that used to be accepted (a NULL key with a length opened unkeyed; a relative
 * directory landed in the working directory) are refused, and nothing is created. */
static void test_disk_arguments(void) {
  char dir[4096];
  path_in(dir, sizeof dir, "arguments");
  kc_persistence *disk = NULL;
  kc_persistence_options opts = options_in(dir);
  opts.key_len = 32;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("opts->key");

  opts = options_in(NULL);
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("ignore_env");

  opts = options_in("");
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("empty");
  opts.ignore_env = false;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_ERR_INVALID_ARGUMENT);

  opts = options_in("kc-relative-cache/dir");
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("relative");
  opts.ignore_env = false;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_ERR_INVALID_ARGUMENT);
  CHECK(!exists("kc-relative-cache"));

  CHECK(disk == NULL);
  CHECK(!exists(dir));
}

/* require_key: no key is KC_ERR_UNTRUSTED with the reason, before anything is created. */
static void test_require_key(void) {
  static const uint8_t operator_key[] = "an operator key of 32 bytes!!!!";
  char dir[4096];
  path_in(dir, sizeof dir, "required");
  kc_persistence *disk = NULL;
  kc_persistence_options opts = options_in(dir);
  opts.require_key = true;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_ERR_UNTRUSTED);
  CHECK_NAMES("operator key is required");
  CHECK(disk == NULL && !exists(dir));
  opts.key = operator_key;
  opts.key_len = sizeof operator_key - 1;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  kc_persistence_free(disk);
}

/* Every directory kcache creates is 0700, even under a umask that would widen or narrow it. */
static void test_private_directories(void) {
  static const mode_t masks[] = {0, 0277};
  for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++) {
    char base[2048], dir[4096], sub[4096];
    int n = snprintf(base, sizeof base, "%s/umask%o", work, (unsigned)masks[m]);
    CHECK(n > 0 && (size_t)n < sizeof base);
    snprintf(dir, sizeof dir, "%s/a/b/cache", base);
    mode_t old = umask(masks[m]);
    kc_persistence *disk = NULL;
    kc_persistence_options opts = options_in(dir);
    CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
    umask(old);
    kc_persistence_free(disk);
    const char *parts[] = {"", "/a", "/a/b", "/a/b/cache"};
    for (size_t i = 0; i < 4; i++) {
      struct stat st;
      snprintf(sub, sizeof sub, "%s%s", base, parts[i]);
      CHECK(stat(sub, &st) == 0);
      CHECK((st.st_mode & 07777) == 0700);
    }
  }
}

/* A per-entry lock held by another process (here this test, through its own open file): a
 * lookup with a short lock timeout waits that long, then builds without it; gc keeps a held
 * lock file and removes one nobody holds (a dead builder's), counting it. */
static void test_locks(void) {
  char dir[4096], lock[8192];
  path_in(dir, sizeof dir, "locks");
  kc_persistence_options opts = options_in(dir);
  opts.lock_timeout_ms = 50;
  kc_persistence *disk = NULL;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  uint8_t k[KC_KEY_LEN];
  make_key("locked", k);
  entry_file("locks", k, ".", ".lock", lock, sizeof lock);
  int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  CHECK(fd >= 0);
  CHECK(flock(fd, LOCK_EX | LOCK_NB) == 0);

  kc_cache *cache = new_cache();
  backend b = {0};
  kc_lease *lease = NULL;
  struct timespec start, end;
  CHECK(clock_gettime(CLOCK_MONOTONIC, &start) == 0);
  CHECK_STATUS(string_lookup(cache, disk, "locked value", "locked", &b, &lease), KC_OK);
  CHECK(clock_gettime(CLOCK_MONOTONIC, &end) == 0);
  CHECK((end.tv_sec - start.tv_sec) * 1000 + (end.tv_nsec - start.tv_nsec) / 1000000 >= 50);
  CHECK(strcmp(kc_lease_value(lease), "locked value") == 0);
  kc_lease_release(lease);
  kc_cache_free(cache);
  CHECK(b.builds == 1 && b.loads == 0);
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  kc_persistence_statistics s = disk_stats(disk);
  CHECK_U64(s.lock_timeouts, 1);
  CHECK_U64(s.lock_waits + s.lock_takeovers, 0);
  CHECK_U64(s.puts, 1); /* written without the lock */
  CHECK_U64(s.pending_writes, 0);

  kc_persistence_gc_report r = collect(disk, sizeof r);
  CHECK_U64(r.lock_files, 0);
  CHECK_U64(r.kept, 1);
  CHECK(exists(lock));
  CHECK(close(fd) == 0); /* as if its holder had died */
  r = collect(disk, sizeof r);
  CHECK_U64(r.lock_files, 1);
  CHECK_U64(r.kept, 1);
  CHECK(!exists(lock));

  /* An older caller's report ends before lock_files: the idle lock file goes all the same. */
  fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  CHECK(fd >= 0 && close(fd) == 0);
  r = collect(disk, offsetof(kc_persistence_gc_report, lock_files));
  CHECK(r.lock_files == 0xeeeeeeeeeeeeeeeeULL);
  CHECK(!exists(lock));
  kc_persistence_free(disk);
}

/* One struct_size rule for every growing struct: a newer caller's larger struct is accepted
 * when the bytes this library does not know are zero and refused otherwise; an older caller's
 * shorter struct gets defaults for the fields it lacks; a struct shorter than the first
 * layout is refused. */
typedef struct {
  kc_persistence_options known;
  uint64_t newer_field;
} newer_disk_options;

typedef struct {
  kc_cache_options known;
  uint64_t newer_field;
} newer_cache_options;

typedef struct {
  kc_tiered_callbacks known;
  uint64_t newer_field;
} newer_callbacks;

typedef struct {
  kc_opencl_options known;
  uint64_t newer_field;
} newer_opencl_options;

/* A lock timeout however large means "as long as possible": KCACHE_LOCK_TIMEOUT=1e19 seconds,
 * past what a deadline can hold, opens and lets a cold lookup take the entry's lock and build
 * (it made every cold lookup fail with KC_ERR_PANIC). */
static void test_huge_lock_timeout(void) {
  char dir[4096];
  path_in(dir, sizeof dir, "huge-timeout");
  kc_persistence_options opts = options_in(dir);
  opts.ignore_env = false;
  CHECK(setenv("KCACHE_LOCK_TIMEOUT", "1e19", 1) == 0);
  kc_persistence *disk = NULL;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  CHECK(unsetenv("KCACHE_LOCK_TIMEOUT") == 0);
  kc_cache *cache = new_cache();
  backend b = {0};
  kc_lease *lease = NULL;
  CHECK_STATUS(string_lookup(cache, disk, "patient", "huge-timeout", &b, &lease), KC_OK);
  CHECK(strcmp(kc_lease_value(lease), "patient") == 0);
  kc_lease_release(lease);
  kc_cache_free(cache);
  CHECK(b.builds == 1 && b.loads == 0);
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  CHECK_U64(disk_stats(disk).puts, 1);
  kc_persistence_free(disk);
}

static void test_struct_size_rule(void) {
  char dir[4096];
  path_in(dir, sizeof dir, "struct-size");
  kc_persistence *disk = NULL;

  newer_disk_options disk_opts;
  memset(&disk_opts, 0, sizeof disk_opts);
  disk_opts.known = options_in(dir);
  disk_opts.known.struct_size = sizeof disk_opts;
  CHECK_STATUS(kc_persistence_open(&disk_opts.known, &disk), KC_OK);
  kc_persistence_free(disk);
  disk_opts.newer_field = 1;
  CHECK_STATUS(kc_persistence_open(&disk_opts.known, &disk), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("beyond");
  /* ABI 3.0's layout is the first: a struct that ends before its last field is refused. */
  disk_opts.known.struct_size = offsetof(kc_persistence_options, remote_key_file);
  CHECK_STATUS(kc_persistence_open(&disk_opts.known, &disk), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("struct_size");

  kc_cache *cache = NULL;
  newer_cache_options cache_opts;
  memset(&cache_opts, 0, sizeof cache_opts);
  cache_opts.known = kc_cache_options_default();
  cache_opts.known.struct_size = sizeof cache_opts;
  cache_opts.known.destroy = free_value;
  CHECK_STATUS(kc_cache_new(&cache_opts.known, &cache), KC_OK);
  cache_opts.newer_field = 1;
  kc_cache *refused = NULL;
  CHECK_STATUS(kc_cache_new(&cache_opts.known, &refused), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("beyond");

  backend b = {0};
  uint8_t l2[KC_KEY_LEN];
  make_key("struct-size", l2);
  newer_callbacks cb;
  memset(&cb, 0, sizeof cb);
  cb.known.struct_size = sizeof cb;
  cb.known.build = build_fn;
  cb.known.ctx = &b;
  kc_lease *lease = NULL;
  cb.newer_field = 1;
  CHECK_STATUS(kc_tiered_find_or_build(cache, KEY("s"), KC_NO_DEVICE, kc_persistence_none(), l2,
                                       &cb.known, &lease),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("beyond");
  CHECK(b.builds == 0);
  cb.newer_field = 0;
  CHECK_STATUS(kc_tiered_find_or_build(cache, KEY("s"), KC_NO_DEVICE, kc_persistence_none(), l2,
                                       &cb.known, &lease),
               KC_OK);
  kc_lease_release(lease);
  CHECK(b.builds == 1);
  kc_cache_free(cache);

  /* The backends' options too; they are read before any OpenCL library is loaded. */
  kc_opencl_cache *cl = NULL;
  newer_opencl_options cl_opts;
  memset(&cl_opts, 0, sizeof cl_opts);
  cl_opts.known = kc_opencl_options_default();
  cl_opts.known.struct_size = sizeof cl_opts;
  cl_opts.newer_field = 1;
  CHECK_STATUS(kc_opencl_cache_new(&cl_opts.known, kc_persistence_none(), &cl),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("beyond");
  cl_opts.known.struct_size = offsetof(kc_opencl_options, max_weight);
  CHECK_STATUS(kc_opencl_cache_new(&cl_opts.known, kc_persistence_none(), &cl),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("struct_size");
  CHECK(cl == NULL);
}

/* NULL stands for the process's default persistent tiers, opened from the environment on first
 * use and shared: a tiered lookup given NULL writes there, and kc_persistence_default hands out
 * references to that one object. */
static void test_default_persistence(void) {
  char dir[4096];
  path_in(dir, sizeof dir, "default");
  CHECK(setenv("KCACHE_DIR", dir, 1) == 0);
  kc_cache *mem = new_cache();
  backend b = {0};
  kc_lease *lease = NULL;
  CHECK(strcmp(tiered_lookup(mem, NULL, &b, &lease), "value-of-tiered") == 0);
  kc_lease_release(lease);
  kc_cache_free(mem);
  CHECK(b.builds == 1 && b.serializes == 1);
  kc_persistence *one = NULL, *two = NULL;
  CHECK_STATUS(kc_persistence_default(&one), KC_OK);
  CHECK_STATUS(kc_persistence_default(&two), KC_OK);
  CHECK_STATUS(kc_persistence_flush(one), KC_OK);
  /* One object: the lookup's write is counted through either reference. */
  CHECK_U64(disk_stats(two).puts, 1);
  CHECK(exists(dir));
  kc_persistence_free(one);
  kc_persistence_free(two);
  CHECK(unsetenv("KCACHE_DIR") == 0);
}

/* kc_persistence_none() is a marker, not an object: the kc_persistence_* functions refuse it and
 * kc_persistence_free ignores it. The file-count cap of the options reaches the tier. */
static void test_persistence_none_and_options(void) {
  kc_persistence *none = kc_persistence_none();
  uint8_t k[KC_KEY_LEN];
  make_key("none", k);
  kc_buffer buf;
  memset(&buf, 0, sizeof buf);
  CHECK(none != NULL);
  CHECK_STATUS(kc_persistence_get(none, k, &buf), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("kc_persistence_none");
  CHECK_STATUS(kc_persistence_flush(none), KC_ERR_INVALID_ARGUMENT);
  kc_persistence_free(none);

  kc_persistence_options opts = kc_persistence_options_default();
  CHECK(opts.max_files == 0 && opts.lock_liveness_ms == 0 && opts.lock_timeout_ms == 0);
  char dir[4096];
  path_in(dir, sizeof dir, "max-files");
  opts = options_in(dir);
  opts.max_files = 2;
  opts.lock_liveness_ms = 2000;
  kc_persistence *disk = NULL;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  CHECK_STATUS(kc_persistence_wait_scan(disk), KC_OK);
  put_entry(disk, "one", "1", NULL);
  put_entry(disk, "two", "2", NULL);
  put_entry(disk, "three", "3", NULL);
  kc_persistence_statistics s = {.struct_size = sizeof s};
  CHECK_STATUS(kc_persistence_stats(disk, &s), KC_OK);
  CHECK(s.puts == 3 && s.entries == 2 && s.evictions == 1);
  kc_persistence_free(disk);
}

/* Every pointer argument NULL in turn: KC_ERR_INVALID_ARGUMENT naming it, no crash, and
 * out-parameters untouched. */
static void test_null_sweep(void) {
  kc_persistence *disk = open_disk("null-sweep");
  uint8_t k[KC_KEY_LEN];
  make_key("n", k);
  kc_key_builder *b = NULL, *sentinel_b = (kc_key_builder *)&k;
  kc_persistence *sentinel_d = (kc_persistence *)&k;
  kc_buffer buf = {NULL, 7, 0, NULL};
  kc_persistence_statistics st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;

  CHECK_STATUS(kc_key_builder_new(NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("out_builder");
  CHECK_STATUS(kc_key_builder_set(NULL, KC_KEY_ENTRY, KEY("x")), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("builder");
  CHECK_STATUS(kc_key_builder_option(NULL, KEY("a"), KEY("b")), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_key_builder_extra(NULL, KEY("a"), KEY("b")), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_key_builder_new(&b), KC_OK);
  CHECK_STATUS(kc_key_builder_option(b, NULL, 1, KEY("b")), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("name");
  CHECK_STATUS(kc_key_builder_extra(b, KEY("a"), NULL, 1), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("value");
  kc_key_builder_free(b);
  CHECK(sentinel_b == (kc_key_builder *)&k);

  CHECK_STATUS(kc_persistence_open(NULL, NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("out");
  CHECK(sentinel_d == (kc_persistence *)&k);
  CHECK_STATUS(kc_persistence_get(NULL, k, &buf), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("persistence");
  CHECK_STATUS(kc_persistence_get(disk, NULL, &buf), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("key");
  CHECK(buf.len == 7);
  CHECK_STATUS(kc_persistence_put(disk, k, NULL, 5, 0), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("data");
  CHECK_STATUS(kc_persistence_remove(NULL, k), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_persistence_remove(disk, NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_persistence_gc(NULL, NULL, 0, 0, NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_persistence_gc(disk, NULL, 2, 0, NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("retain");
  CHECK_STATUS(kc_persistence_stats(NULL, &st), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_persistence_stats(disk, NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("out");
  CHECK_STATUS(kc_persistence_fingerprint(disk, NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_persistence_fingerprint(NULL, k), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_persistence_flush(NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("persistence");
  CHECK_STATUS(kc_persistence_reset_stats(NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("persistence");

  kc_cache *cache = NULL;
  kc_cache_options o = kc_cache_options_default();
  CHECK_STATUS(kc_cache_new(&o, &cache), KC_OK);
  kc_lease *sentinel_l = (kc_lease *)&k;
  kc_tiered_callbacks cb = {sizeof cb, build_fn, load_fn, serialize_fn, NULL};
  CHECK_STATUS(kc_tiered_find_or_build(NULL, KEY("a"), KC_NO_DEVICE, disk, k, &cb, &sentinel_l),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("cache");
  CHECK_STATUS(kc_tiered_find_or_build(cache, KEY("a"), KC_NO_DEVICE, disk, NULL, &cb, &sentinel_l),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("key");
  CHECK_STATUS(kc_tiered_find_or_build(cache, KEY("a"), KC_NO_DEVICE, disk, k, NULL, &sentinel_l),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("callbacks");
  CHECK_STATUS(kc_tiered_find_or_build(cache, KEY("a"), KC_NO_DEVICE, disk, k, &cb, NULL),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("out_lease");
  cb.struct_size = 8;
  CHECK_STATUS(kc_tiered_find_or_build(cache, KEY("a"), KC_NO_DEVICE, disk, k, &cb, &sentinel_l),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("struct_size");
  CHECK(sentinel_l == (kc_lease *)&k);
  kc_cache_free(cache);
  kc_persistence_free(disk);
}

/* Last, since it lowers this process's file size limit: a put that cannot be written fails
 * with KC_ERR_IO, leaves nothing behind, and reads keep working. */
static void test_full_disk(void) {
  kc_persistence *disk = open_disk("full");
  uint8_t small[KC_KEY_LEN], big[KC_KEY_LEN];
  put_entry(disk, "small", "fits", small);
  make_key("big", big);
  CHECK(signal(SIGXFSZ, SIG_IGN) != SIG_ERR);
  struct rlimit lim = {64 * 1024, 64 * 1024};
  CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
  size_t n = 1024 * 1024;
  uint8_t *payload = calloc(n, 1);
  CHECK(payload != NULL);
  CHECK_STATUS(kc_persistence_put(disk, big, payload, n, 0), KC_ERR_IO);
  free(payload);
  kc_buffer buf;
  CHECK_STATUS(kc_persistence_get(disk, big, &buf), KC_ERR_NOT_FOUND);
  CHECK_STATUS(kc_persistence_get(disk, small, &buf), KC_OK);
  CHECK(buf.len == 4 && memcmp(buf.data, "fits", 4) == 0);
  kc_buffer_free(&buf);
  char dir[4096];
  path_in(dir, sizeof dir, "full");
  DIR *d = opendir(dir);
  CHECK(d != NULL);
  struct dirent *e;
  int files = 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] != '.' || strlen(e->d_name) > 2) files++;
  }
  closedir(d);
  CHECK(files == 1); /* the small entry; no temporary file left */
  CHECK_U64(disk_stats(disk).io_errors, 1);
  kc_persistence_free(disk);
}

/* Two key generations in one directory: both fingerprints are listed, in byte order, and a
 * buffer too small for them gets what fits and the full count. */
static void test_fingerprints(void) {
  kc_persistence *old_gen = open_keyed("generations", "the old operator key, 32 bytes..");
  kc_persistence *new_gen = open_keyed("generations", "the new operator key, 32 bytes..");
  uint8_t k[KC_KEY_LEN];
  make_key("generation", k);
  CHECK_STATUS(kc_persistence_put(old_gen, k, KEY("old"), 0), KC_OK);
  CHECK_STATUS(kc_persistence_put(new_gen, k, KEY("new"), 0), KC_OK);
  uint8_t fp_old[KC_FINGERPRINT_LEN], fp_new[KC_FINGERPRINT_LEN];
  CHECK_STATUS(kc_persistence_fingerprint(old_gen, fp_old), KC_OK);
  CHECK_STATUS(kc_persistence_fingerprint(new_gen, fp_new), KC_OK);
  CHECK(memcmp(fp_old, fp_new, KC_FINGERPRINT_LEN) != 0);

  size_t count = 99;
  CHECK_STATUS(kc_persistence_fingerprints(new_gen, NULL, 0, &count), KC_OK);
  CHECK(count == 2);
  uint8_t one[KC_FINGERPRINT_LEN];
  count = 0;
  CHECK_STATUS(kc_persistence_fingerprints(new_gen, one, 1, &count), KC_OK);
  CHECK(count == 2);
  uint8_t all[4 * KC_FINGERPRINT_LEN];
  memset(all, 0xee, sizeof all);
  CHECK_STATUS(kc_persistence_fingerprints(new_gen, all, 4, &count), KC_OK);
  CHECK(count == 2);
  int old_first = memcmp(fp_old, fp_new, KC_FINGERPRINT_LEN) < 0;
  const uint8_t *first = old_first ? fp_old : fp_new, *second = old_first ? fp_new : fp_old;
  CHECK(memcmp(all, first, KC_FINGERPRINT_LEN) == 0);
  CHECK(memcmp(all + KC_FINGERPRINT_LEN, second, KC_FINGERPRINT_LEN) == 0);
  CHECK(memcmp(one, first, KC_FINGERPRINT_LEN) == 0);
  CHECK(all[2 * KC_FINGERPRINT_LEN] == 0xee); /* nothing past the count */

  /* After gc without retaining the old generation, only the new one is left. */
  CHECK_STATUS(kc_persistence_gc(new_gen, NULL, 0, KC_PERSISTENCE_DEFAULT_TEMP_MAX_AGE_S, NULL), KC_OK);
  CHECK_STATUS(kc_persistence_fingerprints(new_gen, all, 4, &count), KC_OK);
  CHECK(count == 1);
  CHECK(memcmp(all, fp_new, KC_FINGERPRINT_LEN) == 0);

  CHECK_STATUS(kc_persistence_fingerprints(NULL, all, 4, &count), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_persistence_fingerprints(new_gen, all, 4, NULL), KC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kc_persistence_fingerprints(new_gen, NULL, 1, &count), KC_ERR_INVALID_ARGUMENT);
  kc_persistence_free(old_gen);
  kc_persistence_free(new_gen);
}

/* The opening scan: once waited for, the statistics say so and count what was there. A
 * directory at an entry name is removed by a read and by gc when empty, reported by gc when
 * not. */
/* A directory tree at `path`: a file, a subdirectory holding a file, and a link to `target`. */
static void plant_tree(const char *path, const char *target) {
  char sub[8400];
  CHECK(mkdir(path, 0700) == 0);
  snprintf(sub, sizeof sub, "%s/inside", path);
  FILE *f = fopen(sub, "wb");
  CHECK(f != NULL);
  CHECK(fclose(f) == 0);
  snprintf(sub, sizeof sub, "%s/sub", path);
  CHECK(mkdir(sub, 0700) == 0);
  snprintf(sub, sizeof sub, "%s/sub/file", path);
  f = fopen(sub, "wb");
  CHECK(f != NULL);
  CHECK(fclose(f) == 0);
  snprintf(sub, sizeof sub, "%s/link", path);
  CHECK(symlink(target, sub) == 0);
}

/* The work directory's `name`, in a static buffer. */
static const char *dir_of(const char *name) {
  static char dir[4096];
  path_in(dir, sizeof dir, name);
  return dir;
}

/* Names in `dir` but `.` and `..`, the counter files `.stats-*` and lock files excepted. */
static uint64_t count_names(const char *dir) {
  DIR *d = opendir(dir);
  CHECK(d != NULL);
  uint64_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (strncmp(e->d_name, ".stats-", 7) == 0) continue;
    if (len > 5 && strcmp(e->d_name + len - 5, ".lock") == 0) continue;
    n++;
  }
  closedir(d);
  return n;
}

static void test_scan_and_directories(void) {
  kc_persistence *first = open_disk("scanned");
  put_entry(first, "scanned a", "a", NULL);
  put_entry(first, "scanned b", "b", NULL);
  kc_persistence_free(first);

  kc_persistence *disk = open_disk("scanned");
  CHECK_STATUS(kc_persistence_wait_scan(disk), KC_OK);
  kc_persistence_statistics s = disk_stats(disk);
  CHECK(s.scan_complete);
  CHECK_U64(s.entries, 2);
  /* Each entry: 1 payload byte, 118 of header (72 fixed, 2 + 12 for the default descriptor)
   * and tag (32). */
  CHECK_U64(s.bytes, 2 * (1 + 118));
  CHECK_STATUS(kc_persistence_wait_scan(NULL), KC_ERR_INVALID_ARGUMENT);

  uint8_t d[KC_KEY_LEN];
  make_key("a directory", d);
  char path[8192];
  entry_file("scanned", d, "", "", path, sizeof path);

  CHECK(mkdir(path, 0700) == 0);
  kc_buffer buf;
  CHECK_STATUS(kc_persistence_get(disk, d, &buf), KC_ERR_INTEGRITY);
  struct stat st;
  CHECK(stat(path, &st) != 0);
  CHECK_STATUS(kc_persistence_get(disk, d, &buf), KC_ERR_NOT_FOUND);

  /* A directory tree at the name (a file, a subdirectory, a link to a file outside): a read
   * removes it all, never following the link; a write takes its place (it failed, for good);
   * gc removes it (it left it as undeletable). */
  char outside[4096];
  path_in(outside, sizeof outside, "outside-file");
  FILE *f = fopen(outside, "wb");
  CHECK(f != NULL);
  CHECK(fclose(f) == 0);
  plant_tree(path, outside);
  CHECK_STATUS(kc_persistence_get(disk, d, &buf), KC_ERR_INTEGRITY);
  CHECK(lstat(path, &st) != 0);
  CHECK(stat(outside, &st) == 0);
  plant_tree(path, outside);
  uint64_t rejects = disk_stats(disk).integrity_rejects;
  CHECK_STATUS(kc_persistence_put(disk, d, KEY("a file now"), 0), KC_OK);
  CHECK_U64(disk_stats(disk).integrity_rejects, rejects + 1);
  CHECK_STATUS(kc_persistence_get(disk, d, &buf), KC_OK);
  CHECK(buf.len == strlen("a file now") && memcmp(buf.data, "a file now", buf.len) == 0);
  kc_buffer_free(&buf);
  CHECK_STATUS(kc_persistence_remove(disk, d), KC_OK);
  plant_tree(path, outside);
  kc_persistence_gc_report r = collect(disk, sizeof r);
  CHECK_U64(r.undeletable, 0);
  CHECK_U64(r.corrupt, 1);
  CHECK_U64(r.kept, 2);
  CHECK(lstat(path, &st) != 0);
  CHECK(stat(outside, &st) == 0);
  /* Nothing is left behind: the directory moved aside by the write went too. */
  CHECK_U64(count_names(dir_of("scanned")), 2);
  CHECK_STATUS(kc_persistence_put(disk, d, KEY("a file now"), 0), KC_OK);
  CHECK_U64(disk_stats(disk).entries, 3);
  kc_persistence_free(disk);
}

/* What the serialize callback below announces on its first call (buf NULL); a second call
 * fills the buffer with that many 'x'. */
static size_t announced;
static int announced_calls;

static int announcing_serialize_fn(void *ctx, void *value, uint8_t *out, size_t *len) {
  (void)ctx;
  (void)value;
  announced_calls++;
  if (out == NULL) {
    *len = announced;
    return 0;
  }
  CHECK(*len == announced);
  memset(out, 'x', announced);
  return 0;
}

/* Lengths and sizes a C caller passes are checked before a byte is read or allocated: a payload
 * length past the entry size limit over a 16-byte buffer that ends at an inaccessible page (it
 * was read and hashed whole first), a `struct_size` of SIZE_MAX (made into a slice), and a
 * serialize callback announcing 2^46 bytes (allocated first: an abort). */
static void test_lengths_checked_first(void) {
  char dir[4096];
  path_in(dir, sizeof dir, "lengths");
  kc_persistence_options opts = options_in(dir);
  /* Under the file size limit test_full_disk leaves (64 KiB). */
  opts.max_size = 32 << 10;
  kc_persistence *disk = NULL;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  /* The default descriptor's entry adds 118 bytes: 72 fixed, 2 + 12 descriptor, 32 tag. */
  const size_t largest = (32 << 10) - 118;

  long page = sysconf(_SC_PAGESIZE);
  CHECK(page > 16);
  /* A private mapping of /dev/zero: anonymous memory in POSIX terms. */
  int zero = open("/dev/zero", O_RDWR | O_CLOEXEC);
  CHECK(zero >= 0);
  uint8_t *pages = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE, zero, 0);
  CHECK(pages != MAP_FAILED);
  CHECK(close(zero) == 0);
  CHECK(mprotect(pages + page, (size_t)page, PROT_NONE) == 0);
  uint8_t *sixteen = pages + page - 16;
  memset(sixteen, 'x', 16);
  uint8_t key[KC_KEY_LEN];
  make_key("lengths", key);
  const size_t too_long[] = {largest + 1, (size_t)1 << 40, SIZE_MAX};
  for (size_t i = 0; i < sizeof too_long / sizeof too_long[0]; i++) {
    CHECK_STATUS(kc_persistence_put(disk, key, sixteen, too_long[i], 0), KC_ERR_INVALID_ARGUMENT);
    CHECK(strstr(kc_last_error_message(), "exceeds the entry size limit") != NULL);
  }
  kc_entry_descriptor named = {sizeof named, "opencl", "a device", "a kernel"};
  CHECK_STATUS(kc_persistence_put_described(disk, key, sixteen, largest, 0, &named),
               KC_ERR_INVALID_ARGUMENT);
  CHECK_U64(disk_stats(disk).puts, 0);
  CHECK(munmap(pages, 2 * (size_t)page) == 0);
  /* The largest payload that fits is written. */
  uint8_t *payload = calloc(largest, 1);
  CHECK(payload != NULL);
  CHECK_STATUS(kc_persistence_put(disk, key, payload, largest, 0), KC_OK);
  free(payload);
  CHECK_U64(disk_stats(disk).puts, 1);

  /* A struct_size no struct has: refused before anything past it is read. */
  kc_persistence_options huge = options_in(dir);
  huge.struct_size = SIZE_MAX;
  kc_persistence *none = NULL;
  CHECK_STATUS(kc_persistence_open(&huge, &none), KC_ERR_INVALID_ARGUMENT);
  CHECK(none == NULL);
  huge.struct_size = 4097;
  CHECK_STATUS(kc_persistence_open(&huge, &none), KC_ERR_INVALID_ARGUMENT);
  named.struct_size = SIZE_MAX;
  CHECK_STATUS(kc_persistence_put_described(disk, key, KEY("x"), 0, &named), KC_ERR_INVALID_ARGUMENT);
  backend b = {0};
  kc_lease *lease = NULL;
  kc_cache *cache = new_cache();
  kc_tiered_callbacks cb = {SIZE_MAX, build_fn, load_fn, announcing_serialize_fn, &b};
  CHECK_STATUS(kc_tiered_find_or_build(cache, KEY("v"), KC_NO_DEVICE, disk, key, &cb, &lease),
               KC_ERR_INVALID_ARGUMENT);
  CHECK(lease == NULL);

  /* A serialized size past the limit is never allocated nor written: the lookup has its
   * value, the disk nothing new. At the limit it is written. */
  cb.struct_size = sizeof cb;
  cb.load = NULL;
  const size_t announcements[] = {(size_t)1 << 46, SIZE_MAX, largest + 1, largest};
  for (size_t i = 0; i < sizeof announcements / sizeof announcements[0]; i++) {
    announced = announcements[i];
    announced_calls = 0;
    char value[32];
    snprintf(value, sizeof value, "announced %zu", i);
    uint8_t l2[KC_KEY_LEN];
    make_key(value, l2);
    CHECK_STATUS(kc_tiered_find_or_build(cache, (const uint8_t *)value, strlen(value),
                                         KC_NO_DEVICE, disk, l2, &cb, &lease),
                 KC_OK);
    CHECK(strcmp(kc_lease_value(lease), value) == 0);
    kc_lease_release(lease);
    CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
    int fits = announced == largest;
    CHECK(announced_calls == (fits ? 2 : 1));
    CHECK_U64(disk_stats(disk).puts, fits ? 2 : 1);
  }
  kc_cache_free(cache);
  kc_persistence_free(disk);
}

/* The remote tier's options: a usable URL with an operator key puts a remote behind the disk,
 * whose failures (nothing listens on port 1) cost the lookup nothing but counters; no remote
 * without a key, and a URL that cannot be used leaves the remote off, not the disk. */
static void test_remote_options(void) {
  char dir[4096];
  path_in(dir, sizeof dir, "remote");
  const char *operator_key = "remote-test-operator-key";
  kc_persistence_options opts = options_in(dir);
  opts.key = (const uint8_t *)operator_key;
  opts.key_len = strlen(operator_key);
  opts.remote_url = "redis://127.0.0.1:1/";
  opts.remote_timeout_ms = 100;
  opts.remote_lease_wait_ms = 100;
  kc_persistence *disk = NULL;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  CHECK(disk_stats(disk).remote);
  backend b = {0};
  kc_lease *lease = NULL;
  kc_cache *cache = new_cache();
  CHECK(strcmp(tiered_lookup(cache, disk, &b, &lease), "value-of-tiered") == 0);
  kc_lease_release(lease);
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  kc_persistence_statistics s = disk_stats(disk);
  CHECK(b.builds == 1);
  CHECK(s.remote_errors >= 1);
  CHECK_U64(s.remote_hits + s.remote_puts, 0);
  CHECK_U64(s.remote_misses, 1);
  CHECK_STATUS(kc_persistence_reset_stats(disk), KC_OK);
  CHECK_U64(disk_stats(disk).remote_errors + disk_stats(disk).remote_misses, 0);
  kc_cache_free(cache);
  kc_persistence_free(disk);

  opts.key = NULL;
  opts.key_len = 0;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  CHECK(!disk_stats(disk).remote);
  kc_persistence_free(disk);

  opts.key = (const uint8_t *)operator_key;
  opts.key_len = strlen(operator_key);
  opts.remote_url = "http://127.0.0.1:1/";
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  CHECK(!disk_stats(disk).remote);
  kc_persistence_free(disk);

  /* Mutual TLS (2.5): a client certificate without its key leaves the remote off, and so does
   * one that cannot be read; the disk works either way. */
  opts.remote_url = "rediss://127.0.0.1:1/";
  opts.remote_cert_file = "/nonexistent/client.crt";
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  CHECK(!disk_stats(disk).remote);
  kc_persistence_free(disk);
  opts.remote_key_file = "/nonexistent/client.key";
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  CHECK(!disk_stats(disk).remote);
  kc_persistence_free(disk);
  /* A relative path is refused the same way. */
  opts.remote_cert_file = NULL;
  opts.remote_key_file = NULL;
  opts.remote_ca_file = "ca.crt";
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  CHECK(!disk_stats(disk).remote);
  kc_persistence_free(disk);
}

/* The whole file at `path` into `buf` (at most `cap` bytes); returns its length. */
static size_t read_file(const char *path, uint8_t *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  size_t n = fread(buf, 1, cap, f);
  CHECK(feof(f));
  fclose(f);
  return n;
}

/* Checks that the entry file at `path` is of format 2 and describes itself as the
 * length-prefixed `expected` (backend, device, name). */
static void check_descriptor(const char *path, const uint8_t *expected, size_t expected_len) {
  uint8_t bytes[1024];
  size_t n = read_file(path, bytes, sizeof bytes);
  CHECK(n > 74 + expected_len);
  CHECK(bytes[8] == 2 && bytes[9] == 0); /* format version 2 */
  CHECK(bytes[72] == expected_len && bytes[73] == 0);
  CHECK(memcmp(bytes + 74, expected, expected_len) == 0);
}

/* Entries written through kc_persistence_put_described and kc_tiered_find_or_build_described say
 * what they hold in their header; those of kc_persistence_put and kc_tiered_find_or_build (and a NULL
 * descriptor) say `custom`. */
static void test_descriptors(void) {
  kc_persistence *disk = open_disk("described");
  uint8_t k[KC_KEY_LEN];
  char path[8192];
  static const uint8_t custom[] = "\x06\0custom\0\0\0\0";

  make_key("described put", k);
  kc_entry_descriptor d = {sizeof d, "mine", "gpu 0", "saxpy"};
  CHECK_STATUS(kc_persistence_put_described(disk, k, KEY("bytes"), 5, &d), KC_OK);
  entry_file("described", k, "", "", path, sizeof path);
  check_descriptor(path, (const uint8_t *)"\x04\0mine\x05\0gpu 0\x05\0saxpy", 20);
  kc_buffer buf;
  CHECK_STATUS(kc_persistence_get(disk, k, &buf), KC_OK);
  CHECK(buf.len == 5 && memcmp(buf.data, "bytes", 5) == 0);
  kc_buffer_free(&buf);
  /* NULL: the default descriptor, as kc_persistence_put writes it. */
  make_key("plain put", k);
  CHECK_STATUS(kc_persistence_put(disk, k, KEY("p"), 0), KC_OK);
  entry_file("described", k, "", "", path, sizeof path);
  check_descriptor(path, custom, 12);
  make_key("null descriptor", k);
  CHECK_STATUS(kc_persistence_put_described(disk, k, KEY("p"), 0, NULL), KC_OK);
  entry_file("described", k, "", "", path, sizeof path);
  check_descriptor(path, custom, 12);
  /* Text that is not UTF-8 is refused; a struct_size of 0 too. */
  kc_entry_descriptor bad = {sizeof bad, "\xff", NULL, NULL};
  CHECK_STATUS(kc_persistence_put_described(disk, k, KEY("p"), 0, &bad), KC_ERR_INVALID_ARGUMENT);
  CHECK_NAMES("UTF-8");
  bad.struct_size = 0;
  CHECK_STATUS(kc_persistence_put_described(disk, k, KEY("p"), 0, &bad), KC_ERR_INVALID_ARGUMENT);

  kc_cache *cache = new_cache();
  backend b = {0};
  kc_tiered_callbacks cb = {sizeof cb, build_fn, load_fn, serialize_fn, &b};
  kc_entry_descriptor td = {sizeof td, "mine", "gpu 1", "reduce"};
  kc_lease *lease = NULL;
  make_key("described lookup", k);
  CHECK_STATUS(kc_tiered_find_or_build_described(cache, KEY("v1"), KC_NO_DEVICE, disk, k, &cb,
                                                 &td, &lease),
               KC_OK);
  kc_lease_release(lease);
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  entry_file("described", k, "", "", path, sizeof path);
  check_descriptor(path, (const uint8_t *)"\x04\0mine\x05\0gpu 1\x06\0reduce", 21);
  make_key("plain lookup", k);
  CHECK_STATUS(kc_tiered_find_or_build(cache, KEY("v2"), KC_NO_DEVICE, disk, k, &cb, &lease),
               KC_OK);
  kc_lease_release(lease);
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  entry_file("described", k, "", "", path, sizeof path);
  check_descriptor(path, custom, 12);
  CHECK(b.builds == 2 && b.serializes == 2);
  kc_cache_free(cache);
  kc_persistence_free(disk);
}

int main(int argc, char **argv) {
  CHECK(argc == 2);
  work = argv[1];
  test_keys();
  test_ordered_options_and_dependencies();
  test_disk();
  test_keyed_and_untrusted();
  test_tiered();
  test_disk_arguments();
  test_require_key();
  test_private_directories();
  test_locks();
  test_huge_lock_timeout();
  test_struct_size_rule();
  test_default_persistence();
  test_persistence_none_and_options();
  test_null_sweep();
  test_full_disk();
  test_fingerprints();
  test_scan_and_directories();
  test_lengths_checked_first();
  test_remote_options();
  test_descriptors();
  printf("test_disk: ok\n");
  return 0;
}
