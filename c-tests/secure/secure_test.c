/* A setuid-root or setgid program using kcache, started by an unprivileged user whose
 * environment names their own libraries, cache directory and key file: kcache must use none of
 * them, and use the disk only in the directory the program names. Its KCACHE_LOG=debug is not
 * read either: no debug message reaches the log callback.
 *
 * KCACHE_DISABLE=1 and KCACHE_REQUIRE_KEY=1, which can only take the disk tier away, are read.
 *
 * A process that drops privileges itself is no setuid program: it reads its environment, its
 * key file and KCACHE_LOG as usual, although it can no longer read /proc/self/auxv.
 *
 * Usage: kc_secure_test MODE EXPLICIT_DIR CUDA_DRIVER
 *   secure      the checks below (run setuid or setgid)
 *   disabled    with KCACHE_DISABLE=1: even an explicit directory is not used
 *   control     run without privileges: the environment's CUDA library is loaded, which shows
 *               that the marker library would reveal a load
 *   setuid      run as root: switches to nobody with setgid() and setuid(), then opens the
 *               disk tier its environment configures (EXPLICIT_DIR and CUDA_DRIVER unused)
 *   undumpable  run as nobody: makes itself non-dumpable, then as setuid */
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "../checks.h"

#define LAST_ERROR_HAS(text) (strstr(kc_last_error_message(), (text)) != NULL)

/* How many messages of each level the log callback received. */
static int logged[KC_LOG_DEBUG + 1];

static void count_message(void *ctx, int level, const char *message) {
  (void)ctx;
  (void)message;
  if (level >= KC_LOG_ERROR && level <= KC_LOG_DEBUG) logged[level]++;
}

/* A library that fails to load is named in the message: it must be the default soname. */
static void check_default_library(kc_status status, const char *soname) {
  REQUIRE(status == KC_OK || status == KC_ERR_UNAVAILABLE);
  if (status == KC_ERR_UNAVAILABLE) REQUIRE(LAST_ERROR_HAS(soname));
}

static int fingerprint_is_zero(const kc_persistence *disk) {
  uint8_t fp[KC_FINGERPRINT_LEN];
  REQUIRE(kc_persistence_fingerprint(disk, fp) == KC_OK);
  for (int i = 0; i < KC_FINGERPRINT_LEN; i++) {
    if (fp[i] != 0) return 0;
  }
  return 1;
}

static void check_disk(const char *explicit_dir) {
  kc_persistence *disk = NULL;
  /* The environment names a directory, but a secure-execution process does not read it. */
  REQUIRE(kc_persistence_open(NULL, &disk) == KC_ERR_UNAVAILABLE);
  REQUIRE(LAST_ERROR_HAS("secure-execution process: the disk tier needs an explicit directory"));
  kc_persistence_options opts = kc_persistence_options_default();
  REQUIRE(kc_persistence_open(&opts, &disk) == KC_ERR_UNAVAILABLE);
  REQUIRE(LAST_ERROR_HAS("secure-execution"));
  REQUIRE(disk == NULL);

  /* The program's own directory is used, without the environment's key file (which would be
   * refused, so the open would fail), but with its demand for a key, which only takes away. */
  opts.dir = explicit_dir;
  REQUIRE(kc_persistence_open(&opts, &disk) == KC_ERR_UNTRUSTED);
  REQUIRE(LAST_ERROR_HAS("operator key is required"));
  static const uint8_t own_key[] = "the program's own key, 32 bytes.";
  opts.key = own_key;
  opts.key_len = sizeof own_key - 1;
  REQUIRE(kc_persistence_open(&opts, &disk) == KC_OK);
  REQUIRE(!fingerprint_is_zero(disk));
  kc_persistence_free(disk);
}

/* A process that dropped privileges (`how`: setuid or undumpable) reads its environment: the
 * disk tier of KCACHE_DIR, keyed by KCACHE_KEY_FILE (nobody's); without the key file,
 * KCACHE_REQUIRE_KEY=1 refuses the tier, and KCACHE_LOG=debug shows why. */
static void check_dropped(const char *how) {
  if (strcmp(how, "setuid") == 0) {
    const struct passwd *nobody = getpwnam("nobody");
    REQUIRE(getuid() == 0 && nobody != NULL);
    REQUIRE(setgid(nobody->pw_gid) == 0 && setuid(nobody->pw_uid) == 0);
    REQUIRE(setuid(0) != 0); /* for good */
  } else {
    REQUIRE(getuid() != 0);
    REQUIRE(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0);
  }
  /* What made kcache take such a process for a setuid program. */
  REQUIRE(fopen("/proc/self/auxv", "rb") == NULL);
  kc_set_log_callback(count_message, NULL);
  kc_persistence *disk = NULL;
  REQUIRE(kc_persistence_open(NULL, &disk) == KC_OK);
  REQUIRE(!fingerprint_is_zero(disk));
  kc_persistence_free(disk);
  REQUIRE(logged[KC_LOG_DEBUG] == 0);
  REQUIRE(unsetenv("KCACHE_KEY_FILE") == 0);
  REQUIRE(kc_persistence_open(NULL, &disk) == KC_ERR_UNTRUSTED);
  REQUIRE(LAST_ERROR_HAS("operator key is required"));
  REQUIRE(logged[KC_LOG_DEBUG] > 0);
}

static void check_backends(const char *cuda_driver) {
  /* OpenCL: the ICD loader's soname, on the process's default persistent tiers: none here, the
   * environment naming no directory that this process may read. */
  kc_opencl_options cl = kc_opencl_options_default();
  kc_opencl_cache *cl_cache = NULL;
  check_default_library(kc_opencl_cache_new(&cl, NULL, &cl_cache), "libOpenCL.so.1");
  kc_opencl_cache_free(cl_cache);

  /* CUDA: the driver's soname. */
  kc_cuda_options cu = kc_cuda_options_default();
  kc_cuda_cache *cu_cache = NULL;
  check_default_library(kc_cuda_cache_new(&cu, NULL, &cu_cache), "libcuda.so.1");
  kc_cuda_cache_free(cu_cache);
  cu_cache = NULL;

  /* NVRTC, loaded on first use, through a driver the program names itself. */
  cu.driver_library = cuda_driver;
  REQUIRE(kc_cuda_cache_new(&cu, NULL, &cu_cache) == KC_OK);
  const char *source = "extern \"C\" __global__ void k() {}";
  kc_cuda_lease *lease = NULL;
  kc_status status = kc_cuda_cache_find_or_build_source(cu_cache, NULL, source, strlen(source),
                                                        NULL, 0, NULL, 0, &lease);
  REQUIRE(status != KC_OK || lease != NULL);
  if (status == KC_ERR_UNAVAILABLE) REQUIRE(LAST_ERROR_HAS("libnvrtc.so"));
  kc_cuda_lease_release(lease);
  kc_cuda_cache_free(cu_cache);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s secure|disabled|control|setuid|undumpable EXPLICIT_DIR CUDA_DRIVER\n",
            argv[0]);
    return 2;
  }
  const char *mode = argv[1], *explicit_dir = argv[2], *cuda_driver = argv[3];
  if (strcmp(mode, "setuid") == 0 || strcmp(mode, "undumpable") == 0) {
    check_dropped(mode);
    printf("%s: ok\n", mode);
    return 0;
  }
  int privileged = getuid() != geteuid() || getgid() != getegid();
  kc_set_log_callback(count_message, NULL);
  if (strcmp(mode, "control") == 0) {
    REQUIRE(!privileged);
    kc_cuda_options cu = kc_cuda_options_default();
    kc_cuda_cache *cache = NULL;
    /* The marker library is no CUDA driver: the load itself is what counts. */
    REQUIRE(kc_cuda_cache_new(&cu, kc_persistence_none(), &cache) != KC_OK);
    /* Without privileges KCACHE_LOG=debug is read: the refused disk tier says why. */
    kc_persistence *disk = NULL;
    REQUIRE(kc_persistence_open(NULL, &disk) != KC_OK);
    REQUIRE(logged[KC_LOG_DEBUG] > 0);
    printf("control: ok\n");
    return 0;
  }
  REQUIRE(privileged);
  if (strcmp(mode, "disabled") == 0) {
    kc_persistence_options opts = kc_persistence_options_default();
    opts.dir = explicit_dir;
    kc_persistence *disk = NULL;
    REQUIRE(kc_persistence_open(&opts, &disk) == KC_ERR_UNAVAILABLE);
    REQUIRE(LAST_ERROR_HAS("KCACHE_DISABLE=1"));
    printf("disabled: ok\n");
    return 0;
  }
  REQUIRE(strcmp(mode, "secure") == 0);
  check_disk(explicit_dir);
  check_backends(cuda_driver);
  /* The refused disk tiers above would have said why at debug, had KCACHE_LOG been read. */
  REQUIRE(logged[KC_LOG_DEBUG] == 0);
  printf("secure: ok\n");
  return 0;
}
