// The C++17 consumer: owns the cache and its leases through RAII wrappers, as a C++ runtime
// would, builds one entry, hits it, and checks the counts.
#include <kcache.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace {

int builds = 0;
int destroys = 0;

struct CacheDeleter {
  void operator()(kc_cache *cache) const { kc_cache_free(cache); }
};
struct LeaseDeleter {
  void operator()(kc_lease *lease) const { kc_lease_release(lease); }
};
using Cache = std::unique_ptr<kc_cache, CacheDeleter>;
using Lease = std::unique_ptr<kc_lease, LeaseDeleter>;

// Stands in for a JIT compile: the "kernel" is a std::string copy of the key.
extern "C" int build_kernel(void *, const uint8_t *key, size_t key_len, void **out_value,
                            uint64_t *out_weight) {
  ++builds;
  *out_value = new std::string(reinterpret_cast<const char *>(key), key_len);
  *out_weight = key_len;
  return 0;
}

extern "C" int destroy_kernel(void *, void *value) {
  ++destroys;
  delete static_cast<std::string *>(value);
  return 0;
}

std::optional<Lease> find_or_build(kc_cache *cache, std::string_view key) {
  kc_lease *lease = nullptr;
  const auto status =
      kc_cache_find_or_build(cache, reinterpret_cast<const uint8_t *>(key.data()), key.size(),
                             KC_NO_DEVICE, build_kernel, nullptr, &lease);
  if (status != KC_OK) {
    std::fprintf(stderr, "find_or_build: %s: %s\n", kc_status_name(status),
                 kc_last_error_message());
    return std::nullopt;
  }
  return Lease(lease);
}

bool run() {
  constexpr std::string_view source = "__kernel void scale(__global float *x) { x[0] *= 2.0f; }";
  auto options = kc_cache_options_default();
  options.destroy = destroy_kernel;
  kc_cache *raw = nullptr;
  if (kc_cache_new(&options, &raw) != KC_OK) {
    return false;
  }
  Cache cache(raw);
  {
    auto built = find_or_build(cache.get(), source);
    auto hit = find_or_build(cache.get(), source);
    if (!built || !hit) {
      return false;
    }
    const auto *kernel = static_cast<const std::string *>(kc_lease_value(hit->get()));
    kc_cache_statistics stats{};
    stats.struct_size = sizeof stats;
    if (kc_cache_stats(cache.get(), &stats) != KC_OK || *kernel != source || builds != 1 ||
        stats.hits != 1 || stats.misses != 1 || stats.leases != 2) {
      return false;
    }
  }
  cache.reset();
  return destroys == 1;
}

}  // namespace

int main() {
  if (!run()) {
    std::fprintf(stderr, "C++ consumer: unexpected result (builds %d, destroys %d)\n", builds,
                 destroys);
    return 1;
  }
  std::printf("kcache %s from C++17: 1 build, 1 hit, 1 destroy\n", kc_version());
  return 0;
}
