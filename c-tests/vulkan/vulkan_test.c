/* The Vulkan C API on the system's Vulkan driver (lavapipe in CI): pipelines from kcache
 * dispatched and their output checked, memory hits, argument checks, malformed SPIR-V, a layout
 * derived from the shader, specialization from a VkSpecializationInfo, pipeline flags and a
 * required subgroup size, device teardown with a lease held, a loader that lacks functions, and
 * the defaults of the options' remote fields.
 * The Khronos validation layer runs throughout: any error or warning it reports fails the test.
 * Usage: vulkan_test CACHE_DIR SHADER.spv */
#include <vulkan/vulkan.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../checks.h"

#define N 256u

/* kcache's specialization structs have Vulkan's layout, so a program's own
 * VkSpecializationInfo can be passed as it is. */
_Static_assert(sizeof(kc_vulkan_specialization_info) == sizeof(VkSpecializationInfo), "size");
_Static_assert(offsetof(kc_vulkan_specialization_info, map_entries) ==
                   offsetof(VkSpecializationInfo, pMapEntries), "map entries");
_Static_assert(offsetof(kc_vulkan_specialization_info, data_size) ==
                   offsetof(VkSpecializationInfo, dataSize), "data size");
_Static_assert(offsetof(kc_vulkan_specialization_info, data) ==
                   offsetof(VkSpecializationInfo, pData), "data");
_Static_assert(sizeof(kc_vulkan_spec_map_entry) == sizeof(VkSpecializationMapEntry), "entry");
_Static_assert(offsetof(kc_vulkan_spec_map_entry, size) == offsetof(VkSpecializationMapEntry, size),
               "entry size");

/* Errors and warnings from the validation layer. */
static unsigned validation_messages;

static VKAPI_ATTR VkBool32 VKAPI_CALL on_validation(
    VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT types,
    const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    (void)severity;
    (void)types;
    (void)user;
    validation_messages++;
    fprintf(stderr, "validation: %s\n", data->pMessage);
    return VK_FALSE;
}

static const VkDebugUtilsMessengerCreateInfoEXT messenger_info = {
    .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
    .messageSeverity =
        VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT,
    .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                   VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                   VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
    .pfnUserCallback = on_validation};

typedef struct gpu {
    VkDebugUtilsMessengerEXT messenger;
    VkInstance instance;
    VkPhysicalDevice physical;
    VkDevice device;
    VkQueue queue;
    uint32_t family;
} gpu;

static void gpu_create(gpu *g) {
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                             .apiVersion = VK_API_VERSION_1_1};
    const char *layer = "VK_LAYER_KHRONOS_validation";
    const char *extension = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    /* Chained, the messenger also reports on instance creation and destruction. */
    VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                .pNext = &messenger_info,
                                .pApplicationInfo = &app,
                                .enabledLayerCount = 1,
                                .ppEnabledLayerNames = &layer,
                                .enabledExtensionCount = 1,
                                .ppEnabledExtensionNames = &extension};
    /* Without the layer (package vulkan-validationlayers) this fails. */
    REQUIRE(vkCreateInstance(&ici, NULL, &g->instance) == VK_SUCCESS);
    PFN_vkCreateDebugUtilsMessengerEXT create_messenger =
        (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(g->instance,
                                                                 "vkCreateDebugUtilsMessengerEXT");
    REQUIRE(create_messenger != NULL);
    REQUIRE(create_messenger(g->instance, &messenger_info, NULL, &g->messenger) == VK_SUCCESS);
    uint32_t count = 1;
    REQUIRE(vkEnumeratePhysicalDevices(g->instance, &count, &g->physical) >= 0 && count == 1);
    VkQueueFamilyProperties families[16];
    uint32_t nfam = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(g->physical, &nfam, families);
    g->family = nfam;
    for (uint32_t i = 0; i < nfam; i++) {
        if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            g->family = i;
            break;
        }
    }
    REQUIRE(g->family < nfam);
    float priority = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                   .queueFamilyIndex = g->family,
                                   .queueCount = 1,
                                   .pQueuePriorities = &priority};
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                              .queueCreateInfoCount = 1,
                              .pQueueCreateInfos = &qci};
    REQUIRE(vkCreateDevice(g->physical, &dci, NULL, &g->device) == VK_SUCCESS);
    vkGetDeviceQueue(g->device, g->family, 0, &g->queue);
}

static void gpu_destroy(gpu *g) {
    vkDestroyDevice(g->device, NULL);
    PFN_vkDestroyDebugUtilsMessengerEXT destroy_messenger =
        (PFN_vkDestroyDebugUtilsMessengerEXT)vkGetInstanceProcAddr(
            g->instance, "vkDestroyDebugUtilsMessengerEXT");
    REQUIRE(destroy_messenger != NULL);
    destroy_messenger(g->instance, g->messenger, NULL);
    vkDestroyInstance(g->instance, NULL);
}

/* Runs the leased pipeline over data[0..N) with `add` as push constant; returns 0 on success. */
static int dispatch(const gpu *g, const kc_vulkan_lease *lease, uint32_t *data, uint32_t add) {
    VkDevice d = g->device;
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                              .size = N * sizeof(uint32_t),
                              .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT};
    VkBuffer buffer;
    REQUIRE(vkCreateBuffer(d, &bci, NULL, &buffer) == VK_SUCCESS);
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(d, buffer, &req);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(g->physical, &mp);
    uint32_t type = mp.memoryTypeCount;
    VkMemoryPropertyFlags want =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    for (uint32_t i = 0; i < mp.memoryTypeCount; i++) {
        if ((req.memoryTypeBits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) {
            type = i;
            break;
        }
    }
    REQUIRE(type < mp.memoryTypeCount);
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                .allocationSize = req.size,
                                .memoryTypeIndex = type};
    VkDeviceMemory memory;
    REQUIRE(vkAllocateMemory(d, &mai, NULL, &memory) == VK_SUCCESS);
    REQUIRE(vkBindBufferMemory(d, buffer, memory, 0) == VK_SUCCESS);
    void *mapped;
    REQUIRE(vkMapMemory(d, memory, 0, bci.size, 0, &mapped) == VK_SUCCESS);
    memcpy(mapped, data, bci.size);

    VkDescriptorPoolSize size = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1};
    VkDescriptorPoolCreateInfo dpci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                       .maxSets = 1,
                                       .poolSizeCount = 1,
                                       .pPoolSizes = &size};
    VkDescriptorPool pool;
    REQUIRE(vkCreateDescriptorPool(d, &dpci, NULL, &pool) == VK_SUCCESS);
    VkDescriptorSetLayout set_layout = (VkDescriptorSetLayout)kc_vulkan_lease_set_layout(lease, 0);
    VkDescriptorSetAllocateInfo dsai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                        .descriptorPool = pool,
                                        .descriptorSetCount = 1,
                                        .pSetLayouts = &set_layout};
    VkDescriptorSet set;
    REQUIRE(vkAllocateDescriptorSets(d, &dsai, &set) == VK_SUCCESS);
    VkDescriptorBufferInfo dbi = {buffer, 0, bci.size};
    VkWriteDescriptorSet write = {.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                  .dstSet = set,
                                  .descriptorCount = 1,
                                  .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                  .pBufferInfo = &dbi};
    vkUpdateDescriptorSets(d, 1, &write, 0, NULL);

    VkCommandPoolCreateInfo cpci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                    .queueFamilyIndex = g->family};
    VkCommandPool cmd_pool;
    REQUIRE(vkCreateCommandPool(d, &cpci, NULL, &cmd_pool) == VK_SUCCESS);
    VkCommandBufferAllocateInfo cbai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                        .commandPool = cmd_pool,
                                        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                        .commandBufferCount = 1};
    VkCommandBuffer cmd;
    REQUIRE(vkAllocateCommandBuffers(d, &cbai, &cmd) == VK_SUCCESS);
    VkCommandBufferBeginInfo begin = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    REQUIRE(vkBeginCommandBuffer(cmd, &begin) == VK_SUCCESS);
    VkPipelineLayout layout = (VkPipelineLayout)kc_vulkan_lease_layout(lease);
    vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE,
                      (VkPipeline)kc_vulkan_lease_pipeline(lease));
    vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, &set, 0, NULL);
    vkCmdPushConstants(cmd, layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof add, &add);
    vkCmdDispatch(cmd, N / 64, 1, 1);
    VkMemoryBarrier barrier = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                               .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                               .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0,
                         1, &barrier, 0, NULL, 0, NULL);
    REQUIRE(vkEndCommandBuffer(cmd) == VK_SUCCESS);
    VkSubmitInfo submit = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                           .commandBufferCount = 1,
                           .pCommandBuffers = &cmd};
    REQUIRE(vkQueueSubmit(g->queue, 1, &submit, VK_NULL_HANDLE) == VK_SUCCESS);
    REQUIRE(vkQueueWaitIdle(g->queue) == VK_SUCCESS);
    memcpy(data, mapped, bci.size);

    vkDestroyCommandPool(d, cmd_pool, NULL);
    vkDestroyDescriptorPool(d, pool, NULL);
    vkDestroyBuffer(d, buffer, NULL);
    vkFreeMemory(d, memory, NULL);
    return 0;
}

static int check_output(const gpu *g, const kc_vulkan_lease *lease, uint32_t mul, uint32_t add) {
    uint32_t data[N];
    for (uint32_t i = 0; i < N; i++) data[i] = i;
    dispatch(g, lease, data, add);
    for (uint32_t i = 0; i < N; i++) {
        if (data[i] != i * mul + add) {
            fprintf(stderr, "data[%u] = %u, expected %u\n", i, data[i], i * mul + add);
            return 0;
        }
    }
    return 1;
}

static uint32_t *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    REQUIRE(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint32_t *words = malloc((size_t)n);
    REQUIRE(words && fread(words, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return words;
}

static kc_vulkan_pipeline_desc describe(const uint32_t *code, size_t size, const uint32_t *mul) {
    static kc_vulkan_spec_constant constant;
    static const kc_vulkan_binding binding = {0, 0, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1};
    constant.id = 0;
    constant.size = sizeof *mul;
    constant.data = mul;
    kc_vulkan_pipeline_desc desc = {.struct_size = sizeof desc,
                                    .code = code,
                                    .code_size = size,
                                    .entry_point = "main",
                                    .constants = &constant,
                                    .constant_count = 1,
                                    .bindings = &binding,
                                    .binding_count = 1,
                                    .push_constant_size = 4};
    return desc;
}

/* Answers no function at all: a loader kcache cannot work with. */
static void (*no_functions(void *instance, const char *name))(void) {
    (void)instance;
    (void)name;
    return NULL;
}

/* Answers global commands (a NULL instance) like the real loader and nothing for an instance. */
static void (*global_functions_only(void *instance, const char *name))(void) {
    if (instance != NULL) return NULL;
    return (void (*)(void))vkGetInstanceProcAddr(NULL, name);
}

/* Builds `desc` into a spec and a lease on `dev`; returns the status of the first that fails. */
static kc_status lease_of(kc_vulkan_cache *cache, kc_vulkan_device *dev,
                          const kc_vulkan_pipeline_desc *desc, kc_vulkan_lease **out) {
    kc_vulkan_spec *spec = NULL;
    kc_status status = kc_vulkan_spec_new(desc, &spec);
    if (status == KC_OK) status = kc_vulkan_cache_find_or_build(cache, dev, spec, out);
    kc_vulkan_spec_free(spec);
    return status;
}

static uint64_t pipelines_created(kc_vulkan_cache *cache) {
    kc_vulkan_cache_statistics stats = {.struct_size = sizeof stats};
    REQUIRE(kc_vulkan_cache_stats(cache, &stats) == KC_OK);
    return stats.pipelines_created;
}

/* What ABI 2.3 added to kc_vulkan_pipeline_desc, and the layout derived when none is given. */
static void test_descriptions(const gpu *g, const uint32_t *code, size_t size) {
    kc_vulkan_cache *cache = NULL;
    kc_vulkan_options opts = kc_vulkan_options_default();
    REQUIRE(kc_vulkan_cache_new(&opts, kc_persistence_none(), &cache) == KC_OK);
    kc_vulkan_device *dev = NULL;
    REQUIRE(kc_vulkan_cache_register_device(cache, g->instance, g->physical, g->device, &dev) ==
            KC_OK);
    uint32_t mul = 4;
    kc_vulkan_lease *described = NULL, *derived = NULL, *lease = NULL;
    kc_vulkan_pipeline_desc desc = describe(code, size, &mul);
    REQUIRE(lease_of(cache, dev, &desc, &described) == KC_OK);
    EXPECT(check_output(g, described, 4, 1));

    /* No bindings and no push-constant range: the layout comes from the shader, and equals the
     * described one, so the lookup is a hit on the same pipeline. */
    desc.bindings = NULL;
    desc.binding_count = 0;
    desc.push_constant_size = 0;
    REQUIRE(lease_of(cache, dev, &desc, &derived) == KC_OK);
    EXPECT(kc_vulkan_lease_pipeline(derived) == kc_vulkan_lease_pipeline(described));
    EXPECT(pipelines_created(cache) == 1);
    EXPECT(check_output(g, derived, 4, 2));
    kc_vulkan_lease_release(derived);

    /* A program's own VkSpecializationInfo, passed as it is. */
    uint32_t values[2] = {9, 6};
    VkSpecializationMapEntry entry = {.constantID = 0, .offset = 4, .size = 4};
    VkSpecializationInfo info = {
        .mapEntryCount = 1, .pMapEntries = &entry, .dataSize = sizeof values, .pData = values};
    desc = describe(code, size, &mul);
    desc.constants = NULL;
    desc.constant_count = 0;
    desc.specialization = (const kc_vulkan_specialization_info *)&info;
    REQUIRE(lease_of(cache, dev, &desc, &lease) == KC_OK);
    EXPECT(check_output(g, lease, 6, 3));
    kc_vulkan_lease_release(lease);
    lease = NULL;
    entry.offset = 6;
    EXPECT(lease_of(cache, dev, &desc, &lease) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "past the 8 bytes") != NULL);
    entry.offset = 4;
    info.pMapEntries = NULL;
    EXPECT(lease_of(cache, dev, &desc, &lease) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "specialization->map_entries") != NULL);
    info.pMapEntries = &entry;
    info.pData = NULL;
    EXPECT(lease_of(cache, dev, &desc, &lease) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "specialization->data") != NULL);
    info.pData = values;
    /* The same id in `constants` and in the specialization info is given twice. */
    desc.constants = describe(code, size, &mul).constants;
    desc.constant_count = 1;
    EXPECT(lease_of(cache, dev, &desc, &lease) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "twice") != NULL);
    EXPECT(lease == NULL);

    /* Flags are part of the key; a derivative cannot be cached. */
    uint64_t before = pipelines_created(cache);
    desc = describe(code, size, &mul);
    desc.flags = VK_PIPELINE_CREATE_DISABLE_OPTIMIZATION_BIT;
    REQUIRE(lease_of(cache, dev, &desc, &lease) == KC_OK);
    EXPECT(kc_vulkan_lease_pipeline(lease) != kc_vulkan_lease_pipeline(described));
    EXPECT(pipelines_created(cache) == before + 1);
    EXPECT(check_output(g, lease, 4, 5));
    kc_vulkan_lease_release(lease);
    lease = NULL;
    desc.flags = VK_PIPELINE_CREATE_DERIVATIVE_BIT;
    EXPECT(lease_of(cache, dev, &desc, &lease) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "flags") != NULL);

    /* A subgroup size that is no power of two, or beyond what the device can require. */
    desc.flags = 0;
    desc.required_subgroup_size = 3;
    EXPECT(lease_of(cache, dev, &desc, &lease) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "power of two") != NULL);
    desc.required_subgroup_size = 128;
    EXPECT(lease_of(cache, dev, &desc, &lease) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "subgroup") != NULL);
    EXPECT(lease == NULL);

    /* A caller compiled against ABI 2.2 passes the shorter struct: the new fields default. */
    desc = describe(code, size, &mul);
    desc.struct_size = offsetof(kc_vulkan_pipeline_desc, specialization);
    desc.flags = VK_PIPELINE_CREATE_DERIVATIVE_BIT; /* beyond its struct_size: not read */
    REQUIRE(lease_of(cache, dev, &desc, &lease) == KC_OK);
    EXPECT(kc_vulkan_lease_pipeline(lease) == kc_vulkan_lease_pipeline(described));
    kc_vulkan_lease_release(lease);
    desc.struct_size = offsetof(kc_vulkan_pipeline_desc, specialization) - 1;
    EXPECT(lease_of(cache, dev, &desc, &lease) == KC_ERR_INVALID_ARGUMENT);

    kc_vulkan_lease_release(described);
    uint64_t still_leased = 99;
    EXPECT(kc_vulkan_cache_unregister_device(cache, dev, &still_leased) == KC_OK);
    EXPECT(still_leased == 0);
    kc_vulkan_cache_free(cache);
}

/* The persistent tiers' remote fields default to "leave it to the environment", and the
 * struct a caller sets up is the one this header describes. */
static void test_remote_defaults(void) {
    kc_persistence_options opts = kc_persistence_options_default();
    EXPECT(opts.struct_size == sizeof(kc_persistence_options));
    EXPECT(opts.max_files == 0 && opts.lock_liveness_ms == 0);
    EXPECT(opts.remote_url == NULL && opts.remote_prefix == NULL);
    EXPECT(opts.remote_ca_file == NULL && opts.remote_cert_file == NULL &&
           opts.remote_key_file == NULL);
    EXPECT(!opts.remote_read_only && !opts.remote_allow_unkeyed);
    EXPECT(opts.remote_timeout_ms == 0 && opts.remote_ttl_s == 0 &&
           opts.remote_max_entry_size == 0 && opts.remote_lease_wait_ms == 0);
}

int main(int argc, char **argv) {
    REQUIRE(argc == 3);
    size_t size;
    uint32_t *code = read_file(argv[2], &size);
    EXPECT(kc_vulkan_available() == KC_OK);

    test_remote_defaults();

    gpu g;
    gpu_create(&g);

    kc_vulkan_options opts = kc_vulkan_options_default();
    kc_persistence_options tiers_opts = kc_persistence_options_default();
    kc_persistence *tiers = NULL;
    tiers_opts.dir = argv[1];
    REQUIRE(kc_persistence_open(&tiers_opts, &tiers) == KC_OK);
    kc_vulkan_cache *cache = NULL;
    EXPECT(kc_vulkan_cache_new(NULL, tiers, &cache) == KC_ERR_INVALID_ARGUMENT);
    kc_vulkan_options short_opts = opts;
    short_opts.struct_size = sizeof(size_t);
    EXPECT(kc_vulkan_cache_new(&short_opts, tiers, &cache) == KC_ERR_INVALID_ARGUMENT);
    REQUIRE(kc_vulkan_cache_new(&opts, tiers, &cache) == KC_OK);
    kc_persistence_free(tiers); /* the cache holds a reference of its own */

    kc_vulkan_device *dev = NULL;
    EXPECT(kc_vulkan_cache_register_device(cache, g.instance, NULL, g.device, &dev) ==
           KC_ERR_INVALID_ARGUMENT);
    REQUIRE(kc_vulkan_cache_register_device(cache, g.instance, g.physical, g.device, &dev) ==
            KC_OK);
    kc_vulkan_device *twice = NULL;
    EXPECT(kc_vulkan_cache_register_device(cache, g.instance, g.physical, g.device, &twice) ==
           KC_ERR_INVALID_ARGUMENT);
    EXPECT(twice == NULL);

    /* Malformed SPIR-V never reaches the driver. */
    uint32_t mul = 3;
    kc_vulkan_spec *spec = NULL;
    kc_vulkan_pipeline_desc desc = describe(code, size, &mul);
    desc.code_size = size - 2;
    EXPECT(kc_vulkan_spec_new(&desc, &spec) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "multiple of 4") != NULL);
    uint32_t magic = code[0];
    code[0] = 0x12345678u;
    desc = describe(code, size, &mul);
    EXPECT(kc_vulkan_spec_new(&desc, &spec) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "magic") != NULL);
    code[0] = magic;
    desc.entry_point = "not_there";
    EXPECT(kc_vulkan_spec_new(&desc, &spec) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "entry point") != NULL);
    EXPECT(spec == NULL);
    desc = describe(code, size, &mul);
    desc.code = NULL;
    EXPECT(kc_vulkan_spec_new(&desc, &spec) == KC_ERR_INVALID_ARGUMENT);

    /* A layout that does not cover the shader's storage buffer (lavapipe crashed creating such
     * a pipeline), or gives it the wrong type, or too few push-constant bytes, is refused. */
    desc = describe(code, size, &mul);
    desc.bindings = NULL;
    desc.binding_count = 0;
    EXPECT(kc_vulkan_spec_new(&desc, &spec) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "set 0 binding 0") != NULL);
    kc_vulkan_binding uniform = {0, 0, VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER, 1};
    desc.bindings = &uniform;
    desc.binding_count = 1;
    EXPECT(kc_vulkan_spec_new(&desc, &spec) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "storage buffer") != NULL);
    desc = describe(code, size, &mul);
    desc.push_constant_size = 0;
    EXPECT(kc_vulkan_spec_new(&desc, &spec) == KC_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kc_last_error_message(), "push") != NULL);
    EXPECT(spec == NULL);

    /* Cold, then a memory hit: the same pipeline, both dispatched and checked. */
    desc = describe(code, size, &mul);
    REQUIRE(kc_vulkan_spec_new(&desc, &spec) == KC_OK);
    kc_vulkan_lease *cold = NULL, *hit = NULL;
    EXPECT(kc_vulkan_cache_find_or_build(cache, dev, NULL, &cold) == KC_ERR_INVALID_ARGUMENT);
    REQUIRE(kc_vulkan_cache_find_or_build(cache, dev, spec, &cold) == KC_OK);
    EXPECT(check_output(&g, cold, 3, 5));
    REQUIRE(kc_vulkan_cache_find_or_build(cache, dev, spec, &hit) == KC_OK);
    EXPECT(kc_vulkan_lease_pipeline(hit) == kc_vulkan_lease_pipeline(cold));
    EXPECT(kc_vulkan_lease_shader_module(hit) != 0);
    EXPECT(kc_vulkan_lease_set_layout(hit, 1) == 0);
    EXPECT(kc_vulkan_lease_pipeline(NULL) == 0);
    EXPECT(check_output(&g, hit, 3, 11));

    kc_vulkan_cache_statistics stats = {.struct_size = sizeof stats};
    REQUIRE(kc_vulkan_cache_stats(cache, &stats) == KC_OK);
    EXPECT(stats.pipelines_created == 1);
    EXPECT(stats.memory.hits == 1);
    EXPECT(stats.memory.builds == 1);
    EXPECT(stats.layouts_created == 1);
    EXPECT(kc_hit_rate(stats.memory.hits, stats.memory.misses) == 0.5);

    /* A reset zeroes the counters and keeps the gauges; the next hit counts again. */
    EXPECT(kc_vulkan_cache_reset_stats(NULL) == KC_ERR_INVALID_ARGUMENT);
    REQUIRE(kc_vulkan_cache_reset_stats(cache) == KC_OK);
    REQUIRE(kc_vulkan_cache_stats(cache, &stats) == KC_OK);
    EXPECT(stats.pipelines_created == 0 && stats.memory.hits == 0 && stats.memory.builds == 0);
    EXPECT(stats.memory.entries == 1 && stats.memory.leases == 2);
    kc_vulkan_lease *third = NULL;
    REQUIRE(kc_vulkan_cache_find_or_build(cache, dev, spec, &third) == KC_OK);
    kc_vulkan_lease_release(third);
    REQUIRE(kc_vulkan_cache_stats(cache, &stats) == KC_OK);
    EXPECT(stats.memory.hits == 1 && stats.pipelines_created == 0);

    bool written = false;
    EXPECT(kc_vulkan_cache_flush(cache, dev, &written) == KC_OK);
    EXPECT(written);

    /* Clear unlinks every pipeline; a lease held keeps its pipeline valid. */
    EXPECT(kc_vulkan_cache_clear(NULL) == KC_ERR_INVALID_ARGUMENT);
    REQUIRE(kc_vulkan_cache_clear(cache) == KC_OK);
    REQUIRE(kc_vulkan_cache_stats(cache, &stats) == KC_OK);
    EXPECT(stats.memory.entries == 0 && stats.memory.clears == 1);
    EXPECT(stats.pipelines_destroyed == 0);
    EXPECT(check_output(&g, hit, 3, 7));

    /* Teardown with one lease held: the pipeline outlives the registration until released. */
    kc_vulkan_lease_release(cold);
    uint64_t still_leased = 99;
    EXPECT(kc_vulkan_cache_unregister_device(cache, dev, &still_leased) == KC_OK);
    EXPECT(still_leased == 1);
    EXPECT(check_output(&g, hit, 3, 1));
    kc_vulkan_lease_release(hit);
    REQUIRE(kc_vulkan_cache_stats(cache, &stats) == KC_OK);
    EXPECT(stats.pipelines_destroyed == 1);
    kc_vulkan_lease_release(NULL);
    kc_vulkan_spec_free(spec);
    kc_vulkan_cache_free(cache);

    /* A function that resolves nothing is no loader: refused when the cache is created. */
    kc_vulkan_options empty = kc_vulkan_options_default();
    empty.get_instance_proc_addr = no_functions;
    kc_vulkan_cache *untouched = (kc_vulkan_cache *)&empty;
    EXPECT(kc_vulkan_cache_new(&empty, kc_persistence_none(), &untouched) == KC_ERR_UNAVAILABLE);
    EXPECT(untouched == (kc_vulkan_cache *)&empty);
    EXPECT(strstr(kc_last_error_message(), "vkCreateInstance") != NULL);

    /* A loader that answers global commands but lacks the instance functions kcache needs is
     * reported at registration, not called. */
    kc_vulkan_options partial = kc_vulkan_options_default();
    partial.get_instance_proc_addr = global_functions_only;
    REQUIRE(kc_vulkan_cache_new(&partial, kc_persistence_none(), &cache) == KC_OK);
    dev = NULL;
    EXPECT(kc_vulkan_cache_register_device(cache, g.instance, g.physical, g.device, &dev) ==
           KC_ERR_UNAVAILABLE);
    EXPECT(dev == NULL);
    kc_vulkan_cache_free(cache);
    kc_vulkan_cache_free(NULL);

    test_descriptions(&g, code, size);

    gpu_destroy(&g);
    EXPECT(validation_messages == 0);
    free(code);
    return check_finish("vulkan_test");
}
