/* A device handed to kcache (kc_vulkan_cache_register_owned_device) in the teardown orders of a
 * program ported to kcache: unregistered with a lease held and the lease released afterwards,
 * the cache freed before the device is unregistered, no lease at all. With a device the program
 * destroys itself, those orders make kcache call into a dead device (vkGetPipelineCacheData or
 * vkDestroyPipeline) and crash; handed over, the device is destroyed once, by its callback,
 * after every object kcache made of it. A registration that fails leaves the device the
 * caller's. A handle outlives its registration until the cache is freed: a call that passes it
 * after the unregistration is KC_ERR_DEVICE_DESTROYED. The Khronos validation layer runs throughout: any error or warning it reports (a
 * device destroyed with live pipelines, say) fails the test.
 * Usage: vulkan_teardown SHADER.spv */
#include <vulkan/vulkan.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu.h"

/* How often the callback destroyed a device. */
static unsigned destroyed;

static void destroy_device(void *device, void *user_data) {
    EXPECT(user_data == &destroyed);
    vkDestroyDevice((VkDevice)device, NULL);
    destroyed++;
}

/* A fresh device handed to a fresh memory-only cache, with a lease on scale.comp's pipeline. */
static void start(gpu *g, kc_vulkan_cache **cache, kc_vulkan_device **dev, kc_vulkan_spec **spec,
                  kc_vulkan_lease **lease, const uint32_t *code, size_t size) {
    gpu_create(g);
    kc_vulkan_options opts = kc_vulkan_options_default();
    REQUIRE(kc_vulkan_cache_new(&opts, kc_persistence_none(), cache) == KC_OK);
    REQUIRE(kc_vulkan_cache_register_owned_device(*cache, g->instance, g->physical, g->device,
                                                  destroy_device, &destroyed, dev) == KC_OK);
    static const uint32_t mul = 3;
    kc_vulkan_pipeline_desc desc = describe(code, size, &mul);
    REQUIRE(kc_vulkan_spec_new(&desc, spec) == KC_OK);
    REQUIRE(kc_vulkan_cache_find_or_build(*cache, *dev, *spec, lease) == KC_OK);
}

int main(int argc, char **argv) {
    REQUIRE(argc == 2);
    size_t size;
    uint32_t *code = read_file(argv[1], &size);
    gpu g;
    kc_vulkan_cache *cache;
    kc_vulkan_device *dev;
    kc_vulkan_spec *spec;
    kc_vulkan_lease *lease;

    /* Unregistered with a lease held: the device lives on for the lease, and goes with it. */
    start(&g, &cache, &dev, &spec, &lease, code, size);
    uint64_t still_leased = 99;
    EXPECT(kc_vulkan_cache_unregister_device(cache, dev, &still_leased) == KC_OK);
    EXPECT(still_leased == 1);
    EXPECT(destroyed == 0);
    /* The handle outlives its registration: a call that still passes it is refused. */
    kc_vulkan_lease *again = NULL;
    EXPECT(kc_vulkan_cache_find_or_build(cache, dev, spec, &again) == KC_ERR_DEVICE_DESTROYED);
    EXPECT(again == NULL);
    EXPECT(kc_vulkan_cache_flush(cache, dev, NULL) == KC_ERR_DEVICE_DESTROYED);
    EXPECT(kc_vulkan_cache_unregister_device(cache, dev, NULL) == KC_ERR_DEVICE_DESTROYED);
    EXPECT(check_output(&g, lease, 3, 5));
    kc_vulkan_lease_release(lease);
    EXPECT(destroyed == 1);
    kc_vulkan_spec_free(spec);
    kc_vulkan_cache_free(cache);
    EXPECT(destroyed == 1);
    gpu_destroy_instance(&g);

    /* The cache freed first, then the device unregistered, then the lease released. */
    start(&g, &cache, &dev, &spec, &lease, code, size);
    kc_vulkan_cache_free(cache);
    EXPECT(destroyed == 1);
    EXPECT(check_output(&g, lease, 3, 2));
    EXPECT(kc_vulkan_cache_unregister_device(cache, dev, NULL) == KC_OK);
    EXPECT(destroyed == 1);
    kc_vulkan_lease_release(lease);
    EXPECT(destroyed == 2);
    kc_vulkan_spec_free(spec);
    gpu_destroy_instance(&g);

    /* No lease left: unregistering destroys the device. */
    start(&g, &cache, &dev, &spec, &lease, code, size);
    kc_vulkan_lease_release(lease);
    EXPECT(destroyed == 2);
    EXPECT(kc_vulkan_cache_unregister_device(cache, dev, &still_leased) == KC_OK);
    EXPECT(still_leased == 0);
    EXPECT(destroyed == 3);
    /* The device is gone: kcache refuses the handle rather than calling into it. */
    EXPECT(kc_vulkan_cache_find_or_build(cache, dev, spec, &lease) == KC_ERR_DEVICE_DESTROYED);
    kc_vulkan_spec_free(spec);
    kc_vulkan_cache_free(cache);
    gpu_destroy_instance(&g);

    /* A device the program keeps and destroys after unregistering it: calls with the handle
     * are refused until the cache is freed, which frees the handle. */
    gpu_create(&g);
    kc_vulkan_options plain = kc_vulkan_options_default();
    REQUIRE(kc_vulkan_cache_new(&plain, kc_persistence_none(), &cache) == KC_OK);
    REQUIRE(kc_vulkan_cache_register_device(cache, g.instance, g.physical, g.device, &dev) ==
            KC_OK);
    static const uint32_t twice = 2;
    kc_vulkan_pipeline_desc desc = describe(code, size, &twice);
    REQUIRE(kc_vulkan_spec_new(&desc, &spec) == KC_OK);
    REQUIRE(kc_vulkan_cache_find_or_build(cache, dev, spec, &lease) == KC_OK);
    EXPECT(check_output(&g, lease, 2, 1));
    kc_vulkan_lease_release(lease);
    EXPECT(kc_vulkan_cache_unregister_device(cache, dev, &still_leased) == KC_OK);
    EXPECT(still_leased == 0);
    gpu_destroy(&g);
    lease = NULL;
    EXPECT(kc_vulkan_cache_find_or_build(cache, dev, spec, &lease) == KC_ERR_DEVICE_DESTROYED);
    EXPECT(lease == NULL);
    EXPECT(kc_vulkan_cache_unregister_device(cache, dev, NULL) == KC_ERR_DEVICE_DESTROYED);
    kc_vulkan_spec_free(spec);
    kc_vulkan_cache_free(cache);
    EXPECT(destroyed == 3);

    /* Refused registrations leave the device the caller's: no callback. */
    gpu_create(&g);
    kc_vulkan_options opts = kc_vulkan_options_default();
    REQUIRE(kc_vulkan_cache_new(&opts, kc_persistence_none(), &cache) == KC_OK);
    dev = NULL;
    EXPECT(kc_vulkan_cache_register_owned_device(cache, g.instance, g.physical, g.device, NULL,
                                                 NULL, &dev) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(kc_vulkan_cache_register_owned_device(cache, NULL, g.physical, g.device,
                                                 destroy_device, &destroyed,
                                                 &dev) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(kc_vulkan_cache_register_owned_device(NULL, g.instance, g.physical, g.device,
                                                 destroy_device, &destroyed,
                                                 &dev) == KC_ERR_INVALID_ARGUMENT);
    kc_vulkan_cache_free(cache);
    /* A loader that lacks the instance functions kcache needs fails after the arguments
     * are taken: the device is still not destroyed. */
    opts.get_instance_proc_addr = global_functions_only;
    REQUIRE(kc_vulkan_cache_new(&opts, kc_persistence_none(), &cache) == KC_OK);
    EXPECT(kc_vulkan_cache_register_owned_device(cache, g.instance, g.physical, g.device,
                                                 destroy_device, &destroyed,
                                                 &dev) == KC_ERR_UNAVAILABLE);
    EXPECT(dev == NULL);
    EXPECT(destroyed == 3);
    kc_vulkan_cache_free(cache);
    gpu_destroy(&g);

    EXPECT(validation_messages == 0);
    free(code);
    return check_finish("vulkan_teardown");
}
