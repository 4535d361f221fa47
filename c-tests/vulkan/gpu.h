/* What the Vulkan C test programs share: an instance with the Khronos validation layer, whose
 * errors and warnings are counted, a device with a compute queue, and the scale.comp pipeline's
 * description, dispatch and output check. */
#ifndef KCACHE_TEST_VULKAN_GPU_H
#define KCACHE_TEST_VULKAN_GPU_H

#include <vulkan/vulkan.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../checks.h"

#define N 256u

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

static inline void gpu_create(gpu *g) {
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

/* The instance and its messenger, once the device is gone. */
static inline void gpu_destroy_instance(gpu *g) {
    PFN_vkDestroyDebugUtilsMessengerEXT destroy_messenger =
        (PFN_vkDestroyDebugUtilsMessengerEXT)vkGetInstanceProcAddr(
            g->instance, "vkDestroyDebugUtilsMessengerEXT");
    REQUIRE(destroy_messenger != NULL);
    destroy_messenger(g->instance, g->messenger, NULL);
    vkDestroyInstance(g->instance, NULL);
}

static inline void gpu_destroy(gpu *g) {
    vkDestroyDevice(g->device, NULL);
    gpu_destroy_instance(g);
}

/* Runs the leased pipeline over data[0..N) with `add` as push constant; returns 0 on success. */
static inline int dispatch(const gpu *g, const kc_vulkan_lease *lease, uint32_t *data, uint32_t add) {
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

static inline int check_output(const gpu *g, const kc_vulkan_lease *lease, uint32_t mul, uint32_t add) {
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

static inline uint32_t *read_file(const char *path, size_t *size) {
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

static inline kc_vulkan_pipeline_desc describe(const uint32_t *code, size_t size, const uint32_t *mul) {
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

/* Answers global commands (a NULL instance) like the real loader and nothing for an instance. */
static inline void (*global_functions_only(void *instance, const char *name))(void) {
    if (instance != NULL) return NULL;
    return (void (*)(void))vkGetInstanceProcAddr(NULL, name);
}

#endif
