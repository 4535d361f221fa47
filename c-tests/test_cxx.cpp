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

#include "checks.h"

static_assert(KC_OK == 0, "KC_OK is zero");
static_assert(KC_ERR_BACKEND == 13, "status codes are fixed");
static_assert(sizeof(kc_status) == sizeof(int), "kc_status is an int-sized enum");

namespace {

// Owns a T and gives it back with Free: a unique_ptr deleter for each handle type of the API.
template <typename T, void (*Free)(T *)>
struct Owned {
  void operator()(T *handle) const { Free(handle); }
};
using Cache = std::unique_ptr<kc_cache, Owned<kc_cache, kc_cache_free>>;
using Lease = std::unique_ptr<kc_lease, Owned<kc_lease, kc_lease_release>>;

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
  CHECK(status == KC_OK);
  return Lease(raw);
}

}  // namespace

int main() {
  kc_cache_options opts = kc_cache_options_default();
  opts.destroy = destroy_string;
  kc_cache *raw = nullptr;
  CHECK(kc_cache_new(&opts, &raw) == KC_OK);
  Cache cache(raw);

  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++) {
    threads.emplace_back([&cache] {
      for (int i = 0; i < 100; i++) {
        Lease lease = lookup(cache.get(), "kernel-" + std::to_string(i % 10));
        auto *value = static_cast<const std::string *>(kc_lease_value(lease.get()));
        CHECK(value->compare(0, 7, "kernel-") == 0);
        CHECK(kc_lease_weight(lease.get()) == value->size());
      }
    });
  }
  for (auto &t : threads) t.join();
  CHECK(builds == 10);
  CHECK(kc_cache_len(cache.get()) == 10);

  Lease kept = lookup(cache.get(), "kernel-3");
  cache.reset();  // frees the cache; the lease stays valid
  CHECK(destroys == 9);
  CHECK(*static_cast<const std::string *>(kc_lease_value(kept.get())) == "kernel-3");
  kept.reset();
  CHECK(destroys == 10);
  CHECK(std::strcmp(kc_status_name(KC_ERR_REENTRANT), "KC_ERR_REENTRANT") == 0);
  std::puts("C++17 test passed");
  return 0;
}
