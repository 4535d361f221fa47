/* Caches a compute pipeline with kcache: the application creates its own Vulkan instance and
 * device; kcache builds the pipeline once, serves it from memory afterwards, and keeps the
 * driver's pipeline-cache data on disk for the next process.
 * Usage: vulkan_example CACHE_DIR SHADER.spv */
#include <kcache.h>
#include <vulkan/vulkan.h>

#include <stdio.h>
#include <stdlib.h>

static uint32_t *read_spirv(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint32_t *words = n > 0 ? malloc((size_t)n) : NULL;
    if (words && fread(words, 1, (size_t)n, f) != (size_t)n) {
        free(words);
        words = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return words;
}

static int check(kc_status s, const char *what) {
    if (s != KC_OK) {
        fprintf(stderr, "%s: %s: %s\n", what, kc_status_name(s), kc_last_error_message());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s CACHE_DIR SHADER.spv\n", argv[0]);
        return 2;
    }
    size_t code_size = 0;
    uint32_t *code = read_spirv(argv[2], &code_size);
    if (!code) {
        fprintf(stderr, "cannot read %s\n", argv[2]);
        return 1;
    }

    /* The application's own instance and device, as it has them anyway. */
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.apiVersion = VK_API_VERSION_1_1;
    VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ici.pApplicationInfo = &app;
    VkInstance instance;
    if (vkCreateInstance(&ici, NULL, &instance) != VK_SUCCESS) return 1;
    uint32_t count = 1;
    VkPhysicalDevice physical;
    if (vkEnumeratePhysicalDevices(instance, &count, &physical) < 0 || count == 0) return 1;
    float priority = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qci.queueFamilyIndex = 0;
    qci.queueCount = 1;
    qci.pQueuePriorities = &priority;
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    VkDevice device;
    if (vkCreateDevice(physical, &dci, NULL, &device) != VK_SUCCESS) return 1;

    /* A cache that uses the application's loader and keeps pipeline-cache data in argv[1]. */
    kc_persistence_options tiers_opts = kc_persistence_options_default();
    tiers_opts.dir = argv[1];
    kc_persistence *tiers;
    if (check(kc_persistence_open(&tiers_opts, &tiers), "kc_persistence_open")) return 1;
    kc_vulkan_options opts = kc_vulkan_options_default();
    opts.get_instance_proc_addr = (kc_vulkan_get_instance_proc_addr_fn)vkGetInstanceProcAddr;
    kc_vulkan_cache *cache;
    kc_status created = kc_vulkan_cache_new(&opts, tiers, &cache);
    kc_persistence_free(tiers); /* the cache holds a reference of its own */
    if (check(created, "kc_vulkan_cache_new")) return 1;
    kc_vulkan_device *dev;
    if (check(kc_vulkan_cache_register_device(cache, instance, physical, device, &dev),
              "kc_vulkan_cache_register_device"))
        return 1;

    /* The pipeline: SPIR-V, entry point, one specialization constant, and its layout
     * described by content (one storage buffer, 4 bytes of push constants). */
    uint32_t mul = 3;
    kc_vulkan_spec_constant constant = {0, sizeof mul, &mul};
    kc_vulkan_binding binding = {0, 0, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1};
    kc_vulkan_pipeline_desc desc = {.struct_size = sizeof desc};
    desc.code = code;
    desc.code_size = code_size;
    desc.entry_point = "main";
    desc.constants = &constant;
    desc.constant_count = 1;
    desc.bindings = &binding;
    desc.binding_count = 1;
    desc.push_constant_size = 4;
    kc_vulkan_spec *spec;
    if (check(kc_vulkan_spec_new(&desc, &spec), "kc_vulkan_spec_new")) return 1;
    free(code);

    /* First lookup creates the pipeline; the second is a memory hit on the same VkPipeline. */
    kc_vulkan_lease *first, *second;
    if (check(kc_vulkan_cache_find_or_build(cache, dev, spec, &first), "get_pipeline")) return 1;
    if (check(kc_vulkan_cache_find_or_build(cache, dev, spec, &second), "get_pipeline")) return 1;
    VkPipeline pipeline = (VkPipeline)kc_vulkan_lease_pipeline(second);
    VkPipelineLayout layout = (VkPipelineLayout)kc_vulkan_lease_layout(second);
    int same = kc_vulkan_lease_pipeline(first) == kc_vulkan_lease_pipeline(second);
    /* ... vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline), descriptor sets
     * allocated with kc_vulkan_lease_set_layout(second, 0), push constants via layout ... */
    (void)pipeline;
    (void)layout;
    kc_vulkan_lease_release(first);
    kc_vulkan_lease_release(second);

    kc_vulkan_cache_statistics stats = {.struct_size = sizeof stats};
    if (check(kc_vulkan_cache_stats(cache, &stats), "kc_vulkan_cache_stats")) return 1;
    printf("same pipeline: %s\n", same ? "yes" : "no");
    printf("pipelines created: %llu, memory hits: %llu\n",
           (unsigned long long)stats.pipelines_created, (unsigned long long)stats.memory.hits);
    printf("pipeline-cache data from disk: loaded %llu, missing %llu, rejected %llu\n",
           (unsigned long long)stats.cache_data_loaded,
           (unsigned long long)stats.cache_data_missing,
           (unsigned long long)stats.cache_data_rejected);

    /* Teardown: unregister (writes the pipeline-cache data back), then destroy the device. */
    kc_vulkan_spec_free(spec);
    if (check(kc_vulkan_cache_unregister_device(cache, dev, NULL), "unregister")) return 1;
    kc_vulkan_cache_free(cache);
    vkDestroyDevice(device, NULL);
    vkDestroyInstance(instance, NULL);
    return same ? 0 : 1;
}
