/* One process of the cross-process single-flight test (flight.sh). Opens an unkeyed disk tier
 * in DIR, creates the file READY, waits for the file GO, then makes one tiered lookup of a
 * string whose build takes BUILD_MS and fails with BUILD_RESULT unless that is 0, flushes the
 * disk and prints what it did:
 *   builds=B loads=L waits=W timeouts=T
 * (its build and load callbacks' calls; the disk's lock_waits and lock_timeouts). Exits 0 when
 * the lookup gave what BUILD_RESULT calls for: the value, or KC_ERR_BUILD_FAILED with that
 * code.
 * Usage: flight_worker DIR READY GO BUILD_MS BUILD_RESULT LOCK_TIMEOUT_MS [REMOTE_URL]
 * (LOCK_TIMEOUT_MS 0: the default). With REMOTE_URL the disk is keyed and has that remote tier
 * behind it (kc_persistence_options' remote fields).
 * With FLIGHT_FORK_UNTIL set to a path, the build first forks a child that does nothing until
 * that file exists (a minute at most): a process that outlives its parent, holding whatever
 * descriptors it inherited. */
#include <sys/wait.h>
#include <unistd.h>

#include "string_backend.h"

#define VALUE "the value of the flight"

/* How long a worker waits for GO before it gives up. */
#define GO_TIMEOUT_MS 60000

/* The operator key every worker with a remote tier shares. */
#define REMOTE_KEY "flight-test-operator-key"

/* The build callback: forks the child FLIGHT_FORK_UNTIL asks for, then builds. */
static int forking_build_fn(void *ctx, const uint8_t *key, size_t key_len, void **out,
                            uint64_t *w) {
  const char *until = getenv("FLIGHT_FORK_UNTIL");
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    for (long waited = 0; waited < GO_TIMEOUT_MS && access(until, F_OK) != 0; waited++) {
      sleep_ms(1);
    }
    _exit(0);
  }
  return build_fn(ctx, key, key_len, out, w);
}

int main(int argc, char **argv) {
  REQUIRE(argc == 7 || argc == 8);
  backend b = {0};
  b.build_ms = atol(argv[4]);
  b.build_result = atoi(argv[5]);
  kc_persistence_options opts = options_in(argv[1]);
  opts.lock_timeout_ms = strtoull(argv[6], NULL, 10);
  if (argc == 8) {
    opts.key = (const uint8_t *)REMOTE_KEY;
    opts.key_len = strlen(REMOTE_KEY);
    opts.remote_url = argv[7];
    opts.remote_timeout_ms = 2000;
  }
  kc_persistence *disk = NULL;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  kc_cache *cache = new_cache();

  FILE *ready = fopen(argv[2], "w");
  REQUIRE(ready != NULL && fclose(ready) == 0);
  long waited = 0;
  for (; access(argv[3], F_OK) != 0; waited++) {
    REQUIRE(waited < GO_TIMEOUT_MS);
    sleep_ms(1);
  }

  kc_lease *lease = NULL;
  kc_status status;
  if (getenv("FLIGHT_FORK_UNTIL") != NULL) {
    uint8_t l2[KC_KEY_LEN];
    make_key("flight", l2);
    kc_tiered_callbacks cb = {sizeof cb, forking_build_fn, load_fn, serialize_fn, &b};
    status = kc_tiered_find_or_build(cache, (const uint8_t *)VALUE, strlen(VALUE), KC_NO_DEVICE,
                                     disk, l2, &cb, &lease);
  } else {
    status = string_lookup(cache, disk, VALUE, "flight", &b, &lease);
  }
  if (b.build_result == 0) {
    CHECK_STATUS(status, KC_OK);
    CHECK(strcmp(kc_lease_value(lease), VALUE) == 0);
    kc_lease_release(lease);
  } else {
    CHECK_STATUS(status, KC_ERR_BUILD_FAILED);
    CHECK(kc_last_build_error() == b.build_result);
  }
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  kc_persistence_statistics s = disk_stats(disk);
  CHECK_U64(s.pending_writes + s.failed_writes, 0);
  printf("builds=%d loads=%d waits=%llu timeouts=%llu\n", b.builds, b.loads,
         (unsigned long long)s.lock_waits, (unsigned long long)s.lock_timeouts);
  kc_cache_free(cache);
  kc_persistence_free(disk);
  return 0;
}
