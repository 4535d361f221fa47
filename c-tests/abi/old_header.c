/* A program built against a released header of this ABI major (the kcache.h on its include
 * path, taken from the repository's history by run.sh) and run against the library under test.
 * Every call that takes a struct starting with struct_size gets sizeof that struct as this header
 * declares it, as a program of that release does: each must succeed, and write nothing past the
 * struct. Output structs are followed by canary bytes that must stay as they were; input structs
 * are heap copies of exactly their size, so that AddressSanitizer catches a read past them.
 * Usage: old_header CUDA_DRIVER SCRATCH_DIR SPIRV
 *   CUDA_DRIVER  the test driver library that stands in for libcuda.so.1
 *   SCRATCH_DIR  an absolute path, created for the persistent tiers
 *   SPIRV        a compute shader (c-tests/vulkan/scale.comp compiled) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../checks.h"

#define CANARY 0xA5

/* Fills `bytes` with the canary; 1 when `bytes` still hold it only. */
static void arm(void *bytes, size_t n) { memset(bytes, CANARY, n); }
static int intact(const unsigned char *bytes, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    if (bytes[i] != CANARY) {
      return 0;
    }
  }
  return 1;
}

/* Declares `name`, an output struct of type T followed by canary bytes, all set to the canary
 * but struct_size, which is sizeof(T) as this header declares it. */
#define GUARDED_OUTPUT(T, name)         \
  struct {                              \
    T s;                                \
    unsigned char canary[64];           \
  } name;                               \
  arm(&name, sizeof name);              \
  name.s.struct_size = sizeof(T)

/* After a call filled `name`: it returned KC_OK (`rc`), wrote the whole struct as this header
 * knows it, and nothing after it. */
#define EXPECT_WRITTEN(rc, name)                             \
  do {                                                       \
    EXPECT((rc) == KC_OK);                                   \
    EXPECT((name).s.struct_size == sizeof((name).s));        \
    EXPECT(intact((name).canary, sizeof (name).canary));     \
  } while (0)

/* A heap copy of exactly `size` bytes of the input struct at `p`. */
static void *input_copy(const void *p, size_t size) {
  void *copy = malloc(size);
  REQUIRE(copy != NULL);
  memcpy(copy, p, size);
  return copy;
}

static int build_one(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                     uint64_t *out_weight) {
  (void)key;
  (void)key_len;
  *out_value = ctx;
  *out_weight = 1;
  return 0;
}

/* kc_cache_options (by value and as input), kc_cache_statistics, kc_tiered_callbacks. */
static void memory_cache(void) {
  static int value = 7;
  const uint8_t key[KC_KEY_LEN] = {1};
  kc_cache_options opts = kc_cache_options_default();
  kc_cache_options *in;
  kc_tiered_callbacks callbacks, *callbacks_in;
  kc_cache *cache = NULL;
  kc_lease *lease = NULL;
  EXPECT(opts.struct_size == sizeof opts);
  in = input_copy(&opts, sizeof opts);
  REQUIRE(kc_cache_new(in, &cache) == KC_OK);
  free(in);

  memset(&callbacks, 0, sizeof callbacks);
  callbacks.struct_size = sizeof callbacks;
  callbacks.build = build_one;
  callbacks.ctx = &value;
  callbacks_in = input_copy(&callbacks, sizeof callbacks);
  EXPECT(kc_tiered_find_or_build(cache, key, sizeof key, KC_NO_DEVICE, kc_persistence_none(), key,
                                 callbacks_in, &lease) == KC_OK);
  free(callbacks_in);
  EXPECT(lease != NULL && kc_lease_value(lease) == &value);
  kc_lease_release(lease);

  {
    GUARDED_OUTPUT(kc_cache_statistics, stats);
    EXPECT_WRITTEN(kc_cache_stats(cache, &stats.s), stats);
    EXPECT(stats.s.builds == 1 && stats.s.misses == 1 && stats.s.entries == 1);
  }
  kc_cache_free(cache);
}

/* The persistent tiers in `dir`: kc_persistence_options (by value and as input),
 * kc_entry_descriptor, kc_persistence_statistics, kc_persistence_gc_report; from 3.1,
 * kc_store_options too. */
static void persistence(const char *dir) {
  const uint8_t key[KC_KEY_LEN] = {2};
  const uint8_t data[] = "entry";
  kc_persistence_options opts = kc_persistence_options_default();
  kc_persistence_options *in;
  kc_entry_descriptor descriptor, *descriptor_in;
  kc_persistence *tiers = NULL;
  EXPECT(opts.struct_size == sizeof opts);
  opts.dir = dir;
  opts.ignore_env = true;
  in = input_copy(&opts, sizeof opts);
  REQUIRE(kc_persistence_open(in, &tiers) == KC_OK);

  memset(&descriptor, 0, sizeof descriptor);
  descriptor.struct_size = sizeof descriptor;
  descriptor.backend = "abi";
  descriptor_in = input_copy(&descriptor, sizeof descriptor);
  EXPECT(kc_persistence_put_described(tiers, key, data, sizeof data, 0, descriptor_in) == KC_OK);
  free(descriptor_in);
  EXPECT(kc_persistence_flush(tiers) == KC_OK);
  {
    GUARDED_OUTPUT(kc_persistence_statistics, stats);
    EXPECT_WRITTEN(kc_persistence_stats(tiers, &stats.s), stats);
    EXPECT(stats.s.puts == 1 && stats.s.hits == 0 && !stats.s.remote);
  }
  {
    GUARDED_OUTPUT(kc_persistence_gc_report, report);
    EXPECT_WRITTEN(kc_persistence_gc(tiers, NULL, 0, KC_PERSISTENCE_DEFAULT_TEMP_MAX_AGE_S,
                                     &report.s),
                   report);
    EXPECT(report.s.kept == 1 && report.s.corrupt == 0);
  }
  kc_persistence_free(tiers);

#if KCACHE_VERSION_MINOR >= 1
  {
    kc_store_options *stores_in;
    GUARDED_OUTPUT(kc_store_options, stores);
    EXPECT_WRITTEN(kc_store_options_default(&stores.s), stores);
    EXPECT(stores.s.s3_url == NULL && !stores.s.no_backfill);
    stores_in = input_copy(&stores.s, sizeof stores.s);
    tiers = NULL;
    EXPECT(kc_persistence_open_with_stores(in, stores_in, &tiers) == KC_OK);
    free(stores_in);
    kc_persistence_free(tiers);
  }
#endif
  free(in);
}

/* kc_opencl_options (by value and as input) and kc_opencl_cache_statistics. */
static void opencl(void) {
  kc_opencl_options opts = kc_opencl_options_default();
  kc_opencl_options *in;
  kc_opencl_cache *cache = NULL;
  EXPECT(opts.struct_size == sizeof opts);
  in = input_copy(&opts, sizeof opts);
  REQUIRE(kc_opencl_cache_new(in, kc_persistence_none(), &cache) == KC_OK);
  free(in);
  {
    GUARDED_OUTPUT(kc_opencl_cache_statistics, stats);
    EXPECT_WRITTEN(kc_opencl_cache_stats(cache, &stats.s), stats);
    EXPECT(stats.s.source_builds == 0 && stats.s.memory.struct_size == sizeof stats.s.memory);
  }
  kc_opencl_cache_free(cache);
}

/* kc_cuda_options (by value and as input) and kc_cuda_cache_statistics, on the test driver. */
static void cuda(const char *driver) {
  kc_cuda_options opts = kc_cuda_options_default();
  kc_cuda_options *in;
  kc_cuda_cache *cache = NULL;
  EXPECT(opts.struct_size == sizeof opts);
  opts.driver_library = driver;
  in = input_copy(&opts, sizeof opts);
  REQUIRE(kc_cuda_cache_new(in, kc_persistence_none(), &cache) == KC_OK);
  free(in);
  {
    GUARDED_OUTPUT(kc_cuda_cache_statistics, stats);
    EXPECT_WRITTEN(kc_cuda_cache_stats(cache, &stats.s), stats);
    EXPECT(stats.s.links == 0 && stats.s.memory.struct_size == sizeof stats.s.memory);
  }
  kc_cuda_cache_free(cache);
}

/* The words of the SPIR-V file at `path`; exits with status 1 when it cannot be read. */
static uint32_t *read_spirv(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  uint32_t *code;
  long n;
  REQUIRE(f != NULL);
  REQUIRE(fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0);
  code = malloc((size_t)n);
  REQUIRE(code != NULL && fread(code, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  *size = (size_t)n;
  return code;
}

/* kc_vulkan_options (by value and as input), kc_vulkan_pipeline_desc and
 * kc_vulkan_cache_statistics, on the system's Vulkan loader. */
static void vulkan(const char *spirv) {
  kc_vulkan_options opts = kc_vulkan_options_default();
  kc_vulkan_options *in;
  kc_vulkan_pipeline_desc desc, *desc_in;
  kc_vulkan_cache *cache = NULL;
  kc_vulkan_spec *spec = NULL;
  EXPECT(opts.struct_size == sizeof opts);
  in = input_copy(&opts, sizeof opts);
  REQUIRE(kc_vulkan_cache_new(in, kc_persistence_none(), &cache) == KC_OK);
  free(in);

  memset(&desc, 0, sizeof desc);
  desc.struct_size = sizeof desc;
  desc.code = read_spirv(spirv, &desc.code_size);
  desc.entry_point = "main";
  desc_in = input_copy(&desc, sizeof desc);
  EXPECT(kc_vulkan_spec_new(desc_in, &spec) == KC_OK);
  free(desc_in);
  free((void *)desc.code);
  kc_vulkan_spec_free(spec);
  {
    GUARDED_OUTPUT(kc_vulkan_cache_statistics, stats);
    EXPECT_WRITTEN(kc_vulkan_cache_stats(cache, &stats.s), stats);
    EXPECT(stats.s.pipelines_created == 0 && stats.s.memory.struct_size == sizeof stats.s.memory);
  }
  kc_vulkan_cache_free(cache);
}

int main(int argc, char **argv) {
  REQUIRE_ARGS(argc, 3, "old_header CUDA_DRIVER SCRATCH_DIR SPIRV");
  printf("header %d.%d.%d, library %s\n", KCACHE_VERSION_MAJOR, KCACHE_VERSION_MINOR,
         KCACHE_VERSION_PATCH, kc_version());
  memory_cache();
  persistence(argv[2]);
  opencl();
  cuda(argv[1]);
  vulkan(argv[3]);
  return check_finish("old_header");
}
