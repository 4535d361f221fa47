/* Uses the Vulkan part of kcache.h without vulkan.h: handles are void * and uint64_t. */
#include <kcache.h>

uint64_t pipeline_of(const kc_vulkan_lease *lease);

uint64_t pipeline_of(const kc_vulkan_lease *lease) {
    kc_vulkan_options opts = kc_vulkan_options_default();
    (void)opts;
    return kc_vulkan_lease_pipeline(lease);
}
