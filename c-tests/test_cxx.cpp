// The header from C++17: it compiles warning-free, its declarations have C linkage, and the API
// fits RAII ownership.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kcache.h"

static_assert(KC_OK == 0, "KC_OK is zero");
static_assert(KC_ERR_BACKEND == 13, "status codes are fixed");
static_assert(sizeof(kc_status) == sizeof(int), "kc_status is an int-sized enum");

#define EXPECT(cond)                                                                   \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "%s:%d: EXPECT(%s) failed: %s\n", __FILE__, __LINE__, #cond, \
                   kc_last_error_message());                                           \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

namespace {

struct CacheDeleter {
  void operator()(kc_cache *cache) const { kc_cache_free(cache); }
};
struct LeaseDeleter {
  void operator()(kc_lease *lease) const { kc_lease_release(lease); }
};
using Cache = std::unique_ptr<kc_cache, CacheDeleter>;
using Lease = std::unique_ptr<kc_lease, LeaseDeleter>;

std::atomic<int> builds{0};
std::atomic<int> destroys{0};

extern "C" int build_string(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                            uint64_t *out_weight) {
  (void)ctx;
  builds++;
  auto *value = new std::string(reinterpret_cast<const char *>(key), key_len);
  *out_value = value;
  *out_weight = value->size();
  return 0;
}

extern "C" int destroy_string(void *ctx, void *value) {
  (void)ctx;
  delete static_cast<std::string *>(value);
  destroys++;
  return 0;
}

Lease lookup(kc_cache *cache, const std::string &key) {
  kc_lease *raw = nullptr;
  kc_status status =
      kc_cache_find_or_build(cache, reinterpret_cast<const uint8_t *>(key.data()), key.size(),
                             KC_NO_DEVICE, build_string, nullptr, &raw);
  EXPECT(status == KC_OK);
  return Lease(raw);
}

}  // namespace

int main() {
  kc_cache_options opts = kc_cache_options_default();
  opts.destroy = destroy_string;
  kc_cache *raw = nullptr;
  EXPECT(kc_cache_new(&opts, &raw) == KC_OK);
  Cache cache(raw);

  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++) {
    threads.emplace_back([&cache] {
      for (int i = 0; i < 100; i++) {
        Lease lease = lookup(cache.get(), "kernel-" + std::to_string(i % 10));
        auto *value = static_cast<const std::string *>(kc_lease_value(lease.get()));
        EXPECT(value->compare(0, 7, "kernel-") == 0);
        EXPECT(kc_lease_weight(lease.get()) == value->size());
      }
    });
  }
  for (auto &t : threads) t.join();
  EXPECT(builds == 10);
  EXPECT(kc_cache_len(cache.get()) == 10);

  Lease kept = lookup(cache.get(), "kernel-3");
  cache.reset();  // frees the cache; the lease stays valid
  EXPECT(destroys == 9);
  EXPECT(*static_cast<const std::string *>(kc_lease_value(kept.get())) == "kernel-3");
  kept.reset();
  EXPECT(destroys == 10);
  EXPECT(std::strcmp(kc_status_name(KC_ERR_REENTRANT), "KC_ERR_REENTRANT") == 0);
  std::puts("C++17 test passed");
  return 0;
}
