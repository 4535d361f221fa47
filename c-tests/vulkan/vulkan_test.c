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

#include "gpu.h"

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

/* Answers no function at all: a loader kcache cannot work with. */
static void (*no_functions(void *instance, const char *name))(void) {
    (void)instance;
    (void)name;
    return NULL;
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
    kc_persistence *tiers = persistence_in(argv[1]);
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
