/* A setuid-root or setgid program using kcache, started by an unprivileged user whose
 * environment names their own libraries, cache directory and key file: kcache must use none of
 * them, and use the disk only in the directory the program names. Its KCACHE_LOG=debug is not
 * read either: no debug message reaches the log callback.
 *
 * Usage: kc_secure_test MODE EXPLICIT_DIR CUDA_DRIVER
 *   secure    the checks below (run setuid or setgid)
 *   disabled  with KCACHE_DISABLE=1: even an explicit directory is not used
 *   control   run without privileges: the environment's CUDA library is loaded, which shows
 *             that the marker library would reveal a load */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static void check_disk(const char *explicit_dir) {
  kc_disk *disk = NULL;
  /* The environment names a directory, but a secure-execution process does not read it. */
  REQUIRE(kc_disk_new(NULL, &disk) == KC_ERR_UNAVAILABLE);
  REQUIRE(LAST_ERROR_HAS("secure-execution process: the disk tier needs an explicit directory"));
  kc_disk_options opts = kc_disk_options_default();
  REQUIRE(kc_disk_new(&opts, &disk) == KC_ERR_UNAVAILABLE);
  REQUIRE(LAST_ERROR_HAS("secure-execution"));
  REQUIRE(disk == NULL);

  /* The program's own directory is used, without the environment's key file (which would be
   * refused, so the open would fail) and without its demand for a key. */
  opts.dir = explicit_dir;
  REQUIRE(kc_disk_new(&opts, &disk) == KC_OK);
  uint8_t fp[KC_FINGERPRINT_LEN];
  REQUIRE(kc_disk_fingerprint(disk, fp) == KC_OK);
  for (int i = 0; i < KC_FINGERPRINT_LEN; i++) REQUIRE(fp[i] == 0);
  kc_disk_free(disk);
}

static void check_backends(const char *cuda_driver) {
  /* OpenCL: the ICD loader's soname, and with use_disk but no directory, no disk. */
  kc_opencl_options cl = kc_opencl_options_default();
  cl.use_disk = true;
  kc_opencl_cache *cl_cache = NULL;
  check_default_library(kc_opencl_cache_new(&cl, &cl_cache), "libOpenCL.so.1");
  kc_opencl_cache_free(cl_cache);

  /* CUDA: the driver's soname. */
  kc_cuda_options cu = kc_cuda_options_default();
  kc_cuda_cache *cu_cache = NULL;
  check_default_library(kc_cuda_cache_new(&cu, &cu_cache), "libcuda.so.1");
  kc_cuda_cache_free(cu_cache);
  cu_cache = NULL;

  /* NVRTC, loaded on first use, through a driver the program names itself. */
  cu.driver_library = cuda_driver;
  REQUIRE(kc_cuda_cache_new(&cu, &cu_cache) == KC_OK);
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
    fprintf(stderr, "usage: %s secure|disabled|control EXPLICIT_DIR CUDA_DRIVER\n", argv[0]);
    return 2;
  }
  const char *mode = argv[1], *explicit_dir = argv[2], *cuda_driver = argv[3];
  int privileged = getuid() != geteuid() || getgid() != getegid();
  kc_set_log_callback(count_message, NULL);
  if (strcmp(mode, "control") == 0) {
    REQUIRE(!privileged);
    kc_cuda_options cu = kc_cuda_options_default();
    kc_cuda_cache *cache = NULL;
    /* The marker library is no CUDA driver: the load itself is what counts. */
    REQUIRE(kc_cuda_cache_new(&cu, &cache) != KC_OK);
    /* Without privileges KCACHE_LOG=debug is read: the refused disk tier says why. */
    kc_disk *disk = NULL;
    REQUIRE(kc_disk_new(NULL, &disk) != KC_OK);
    REQUIRE(logged[KC_LOG_DEBUG] > 0);
    printf("control: ok\n");
    return 0;
  }
  REQUIRE(privileged);
  if (strcmp(mode, "disabled") == 0) {
    kc_disk_options opts = kc_disk_options_default();
    opts.dir = explicit_dir;
    kc_disk *disk = NULL;
    REQUIRE(kc_disk_new(&opts, &disk) == KC_ERR_UNAVAILABLE);
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
