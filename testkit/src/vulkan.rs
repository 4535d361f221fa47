//! A minimal Vulkan instance/device owner and compute dispatcher for kcache's own tests and
//! benchmarks: a real caller brings its own instance and device.

use std::ffi::{CStr, c_void};
use std::sync::Mutex;

use ash::ext::debug_utils;
use ash::vk;
use kcache::backend::vulkan::{DeviceOwner, Pipeline, PipelineSpec, create_uncached};
use kcache::{Error, Result};

use crate::needs::{self, Missing};

/// `glslangValidator`, which the Vulkan tests compile their shaders with; `None` when it is not
/// installed, the test skipped ([`needs::met`]).
pub fn glslang() -> Option<std::path::PathBuf> {
    needs::met(needs::program(
        "glslangValidator",
        "apt install glslang-tools; scripts/test installs it",
    ))
}

/// A Vulkan cache's pipeline-cache data counters, `(missing, loaded, rejected)`, from its
/// statistics in Rust (`VulkanStats`) or in C (`kc_vulkan_cache_statistics`), which name them
/// alike: what a registration found on disk.
#[macro_export]
macro_rules! cache_data {
    ($stats:expr) => {{
        let s = &$stats;
        (
            s.cache_data_missing,
            s.cache_data_loaded,
            s.cache_data_rejected,
        )
    }};
}

fn vk_err(what: &str) -> impl Fn(vk::Result) -> Error + '_ {
    move |r| Error::Backend(format!("{what}: {r}"))
}

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// The errors and warnings the validation layer reported, in the order it reported them.
#[derive(Default)]
struct Messages(Mutex<Vec<String>>);

/// The debug-utils callback: records errors and warnings (not info or verbose messages).
unsafe extern "system" fn record(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _kind: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    // SAFETY: `user` is the `Messages` the messenger was created with, alive until the
    // instance is destroyed; `data` is valid for the call (Vulkan spec).
    let (messages, data) = unsafe { (&*user.cast::<Messages>(), &*data) };
    // SAFETY: as above; the message is a NUL-terminated string when not null.
    let text = unsafe { data.message_as_c_str() }
        .map(|m| m.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Ok(mut list) = messages.0.lock() {
        list.push(format!("{severity:?}: {text}"));
    }
    vk::FALSE
}

/// The validation layer with a messenger that records errors and warnings.
struct Validation {
    debug: debug_utils::Instance,
    messenger: vk::DebugUtilsMessengerEXT,
    messages: Box<Messages>,
}

fn messenger_info(messages: &Messages) -> vk::DebugUtilsMessengerCreateInfoEXT<'static> {
    vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(
            vk::DebugUtilsMessageSeverityFlagsEXT::ERROR
                | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING,
        )
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
        )
        .pfn_user_callback(Some(record))
        .user_data((messages as *const Messages).cast_mut().cast())
}

/// An instance and a device with one compute queue, destroyed on drop. Made by
/// [`TestGpu::new`], the instance runs the Khronos validation layer, and the errors and
/// warnings it reports are a test failure: [`TestGpu::validation_messages`] lists them, and
/// dropping a `TestGpu` that has any panics (unless the thread is already panicking).
pub struct TestGpu {
    validation: Option<Validation>,
    instance: ash::Instance,
    physical: vk::PhysicalDevice,
    device: ash::Device,
    queue: vk::Queue,
    queue_family: u32,
    memory: vk::PhysicalDeviceMemoryProperties,
    name: String,
    /// The compute subgroup sizes the device can require, with `subgroupSizeControl` enabled.
    subgroup_sizes: Option<(u32, u32)>,
    /// Keeps the loader library loaded while the instance's functions are in use.
    _loader: ash::Entry,
}

impl TestGpu {
    /// Creates an instance with the Khronos validation layer (Debian `vulkan-validationlayers`;
    /// without it this fails) and a device on the first physical device with a compute queue,
    /// through the system's Vulkan loader (`libvulkan.so.1`), the one kcache loads by default.
    pub fn new() -> Result<Self> {
        Self::create(true)
    }

    /// [`TestGpu::new`] for a test that needs one (and compiles its shaders with
    /// `glslangValidator`): `None` when the loader, the validation layer, a device or
    /// `glslangValidator` is not there, the test skipped ([`needs::met`]).
    pub fn for_test() -> Option<Self> {
        Self::found(true)
    }

    /// As [`TestGpu::for_test`] without the validation layer, for measurements.
    pub fn unvalidated_for_test() -> Option<Self> {
        Self::found(false)
    }

    fn found(validate: bool) -> Option<Self> {
        glslang()?;
        let missing = match Self::create(validate) {
            Err(Error::Unavailable(why)) => Missing::new(
                format!("Vulkan is not usable: {why}"),
                "apt install libvulkan1 mesa-vulkan-drivers vulkan-validationlayers; \
                 scripts/test installs them",
            ),
            found => return Some(found.unwrap()),
        };
        needs::met(Err(missing))
    }

    /// As [`TestGpu::new`] without the validation layer, for measurements: the layer's checks
    /// would be counted in every Vulkan call timed.
    pub fn unvalidated() -> Result<Self> {
        Self::create(false)
    }

    fn create(validate: bool) -> Result<Self> {
        // SAFETY: loading the Vulkan loader runs its initialisers, which have no preconditions;
        // the entry keeps the library loaded while it lives.
        let loader = unsafe { ash::Entry::load() }
            .map_err(|e| Error::Unavailable(format!("no Vulkan loader: {e}")))?;
        let app = vk::ApplicationInfo::default()
            .application_name(c"kcache-tests")
            .api_version(vk::API_VERSION_1_1);
        let messages = Box::<Messages>::default();
        // Chained to the instance's create info, it also reports on instance creation and
        // destruction.
        let mut chained = messenger_info(&messages);
        let layers = [VALIDATION_LAYER.as_ptr()];
        let extensions = [debug_utils::NAME.as_ptr()];
        let mut info = vk::InstanceCreateInfo::default().application_info(&app);
        if validate {
            info = info
                .enabled_layer_names(&layers)
                .enabled_extension_names(&extensions)
                .push_next(&mut chained);
        }
        // SAFETY: the create info and everything it points to live across the call.
        let instance = unsafe { loader.create_instance(&info, None) }.map_err(|r| {
            Error::Unavailable(format!(
                "vkCreateInstance{}: {r}",
                if validate {
                    " with VK_LAYER_KHRONOS_validation (package vulkan-validationlayers)"
                } else {
                    ""
                }
            ))
        })?;
        let validation = if validate {
            let debug = debug_utils::Instance::new(&loader, &instance);
            // SAFETY: live instance with the extension enabled; `messages` outlives the
            // messenger (both are dropped with the `TestGpu`, the messenger first).
            match unsafe { debug.create_debug_utils_messenger(&messenger_info(&messages), None) } {
                Ok(messenger) => Some(Validation {
                    debug,
                    messenger,
                    messages,
                }),
                Err(r) => {
                    // SAFETY: nothing else was created from the instance.
                    unsafe { instance.destroy_instance(None) };
                    return Err(vk_err("vkCreateDebugUtilsMessengerEXT")(r));
                }
            }
        } else {
            None
        };
        match Self::with_instance(instance.clone(), loader, validation) {
            Ok(gpu) => Ok(gpu),
            Err((e, validation)) => {
                // SAFETY: nothing was created from the instance that is still alive.
                unsafe {
                    if let Some(v) = &validation {
                        v.debug.destroy_debug_utils_messenger(v.messenger, None);
                    }
                    instance.destroy_instance(None);
                }
                Err(e)
            }
        }
    }

    /// The errors and warnings the validation layer reported so far (none without the layer).
    pub fn validation_messages(&self) -> Vec<String> {
        self.validation
            .as_ref()
            .map(|v| v.messages.0.lock().map(|m| m.clone()).unwrap_or_default())
            .unwrap_or_default()
    }

    /// Returns the messages recorded so far and forgets them: for a test that provokes one on
    /// purpose.
    pub fn take_validation_messages(&self) -> Vec<String> {
        self.validation
            .as_ref()
            .map(|v| {
                v.messages
                    .0
                    .lock()
                    .map(|mut m| std::mem::take(&mut *m))
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }

    /// Whether the device can require subgroup size `size` for compute shaders (it was created
    /// with `subgroupSizeControl` when the physical device supports it).
    pub fn supports_subgroup_size(&self, size: u32) -> bool {
        self.subgroup_sizes
            .is_some_and(|(min, max)| (min..=max).contains(&size))
    }

    #[allow(clippy::result_large_err)]
    fn with_instance(
        instance: ash::Instance,
        loader: ash::Entry,
        validation: Option<Validation>,
    ) -> std::result::Result<Self, (Error, Option<Validation>)> {
        match Self::open_device(&instance) {
            Ok((physical, device, queue, queue_family, subgroup_sizes)) => {
                // SAFETY: `physical` belongs to `instance`.
                let (memory, props) = unsafe {
                    (
                        instance.get_physical_device_memory_properties(physical),
                        instance.get_physical_device_properties(physical),
                    )
                };
                let name = device_name(&props);
                Ok(Self {
                    validation,
                    instance,
                    physical,
                    device,
                    queue,
                    queue_family,
                    memory,
                    name,
                    subgroup_sizes,
                    _loader: loader,
                })
            }
            Err(e) => Err((e, validation)),
        }
    }

    /// The compute subgroup sizes the physical device can require, when it supports
    /// `VK_EXT_subgroup_size_control` (or Vulkan 1.3) with the `subgroupSizeControl` feature.
    fn subgroup_control(
        instance: &ash::Instance,
        physical: vk::PhysicalDevice,
    ) -> Option<(u32, u32)> {
        // SAFETY: `physical` belongs to `instance`.
        let extensions =
            unsafe { instance.enumerate_device_extension_properties(physical) }.ok()?;
        let name = vk::EXT_SUBGROUP_SIZE_CONTROL_NAME;
        if !extensions
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(name))
        {
            return None;
        }
        let mut features = vk::PhysicalDeviceSubgroupSizeControlFeatures::default();
        let mut all = vk::PhysicalDeviceFeatures2::default().push_next(&mut features);
        // SAFETY: as above; the 1.1 instance provides the query.
        unsafe { instance.get_physical_device_features2(physical, &mut all) };
        let mut control = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
        let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut control);
        // SAFETY: as above.
        unsafe { instance.get_physical_device_properties2(physical, &mut props) };
        (features.subgroup_size_control == vk::TRUE
            && control
                .required_subgroup_size_stages
                .contains(vk::ShaderStageFlags::COMPUTE))
        .then_some((control.min_subgroup_size, control.max_subgroup_size))
    }

    #[allow(clippy::type_complexity)]
    fn open_device(
        instance: &ash::Instance,
    ) -> Result<(
        vk::PhysicalDevice,
        ash::Device,
        vk::Queue,
        u32,
        Option<(u32, u32)>,
    )> {
        // SAFETY: `instance` is a live instance.
        let physicals = unsafe { instance.enumerate_physical_devices() }
            .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
        for physical in physicals {
            // SAFETY: `physical` was enumerated from `instance`.
            let families =
                unsafe { instance.get_physical_device_queue_family_properties(physical) };
            let Some(family) = families
                .iter()
                .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            else {
                continue;
            };
            let family = family as u32;
            let priorities = [1.0f32];
            let queues = [vk::DeviceQueueCreateInfo::default()
                .queue_family_index(family)
                .queue_priorities(&priorities)];
            let subgroup_sizes = Self::subgroup_control(instance, physical);
            let extensions = [vk::EXT_SUBGROUP_SIZE_CONTROL_NAME.as_ptr()];
            let mut control = vk::PhysicalDeviceSubgroupSizeControlFeatures::default()
                .subgroup_size_control(true);
            let mut info = vk::DeviceCreateInfo::default().queue_create_infos(&queues);
            if subgroup_sizes.is_some() {
                info = info
                    .enabled_extension_names(&extensions)
                    .push_next(&mut control);
            }
            // SAFETY: `physical` belongs to `instance`; the create info outlives the call.
            let device = unsafe { instance.create_device(physical, &info, None) }
                .map_err(vk_err("vkCreateDevice"))?;
            // SAFETY: queue 0 of `family` was requested above.
            let queue = unsafe { device.get_device_queue(family, 0) };
            return Ok((physical, device, queue, family, subgroup_sizes));
        }
        Err(Error::Unavailable(
            "no Vulkan device with a compute queue".into(),
        ))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `pipeline` on `data`, bound as a storage buffer at set 0 binding 0, with `push` as
    /// push constants at offset 0 and `groups` workgroups along x; returns the buffer after.
    pub fn dispatch(
        &self,
        pipeline: &Pipeline,
        data: &[u32],
        push: &[u8],
        groups: u32,
    ) -> Result<Vec<u32>> {
        let mut scratch = Scratch {
            gpu: self,
            buffer: vk::Buffer::null(),
            memory: vk::DeviceMemory::null(),
            pool: vk::DescriptorPool::null(),
            commands: vk::CommandPool::null(),
            fence: vk::Fence::null(),
        };
        scratch.run(pipeline, data, push, groups)
    }

    /// What a caller without a cache does for each pipeline: shader module, layouts and one
    /// `vkCreateComputePipelines` with no pipeline cache, then destroys them all. The peer of
    /// a cache hit in the benchmarks.
    pub fn create_pipeline_uncached(&self, spec: &PipelineSpec) -> Result<()> {
        // SAFETY: the device lives as long as `self`.
        let pipeline = unsafe { create_uncached(&self.device, spec) }.map_err(Error::Build)?;
        // SAFETY: created just above on this device, and never used.
        unsafe { pipeline.destroy(&self.device) };
        Ok(())
    }

    fn memory_type(&self, bits: u32, flags: vk::MemoryPropertyFlags) -> Result<u32> {
        (0..self.memory.memory_type_count)
            .find(|&i| {
                bits & (1 << i) != 0
                    && self.memory.memory_types[i as usize]
                        .property_flags
                        .contains(flags)
            })
            .ok_or_else(|| Error::Backend("no host-visible coherent memory type".into()))
    }
}

// SAFETY: the handles are created in `TestGpu::new` and destroyed only by its drop.
unsafe impl DeviceOwner for TestGpu {
    fn instance(&self) -> vk::Instance {
        self.instance.handle()
    }

    fn physical_device(&self) -> vk::PhysicalDevice {
        self.physical
    }

    fn device(&self) -> vk::Device {
        self.device.handle()
    }
}

impl Drop for TestGpu {
    fn drop(&mut self) {
        // SAFETY: every object made from the device is gone: kcache holds the owner until its
        // last pipeline and layout are destroyed, and dispatches clean up after themselves.
        unsafe {
            let _ = self.device.device_wait_idle();
            self.device.destroy_device(None);
            if let Some(v) = &self.validation {
                v.debug.destroy_debug_utils_messenger(v.messenger, None);
            }
            self.instance.destroy_instance(None);
        }
        let messages = self.validation_messages();
        if !messages.is_empty() && !std::thread::panicking() {
            panic!("validation layer messages:\n{}", messages.join("\n"));
        }
    }
}

/// The objects of one dispatch, destroyed on every exit path.
struct Scratch<'a> {
    gpu: &'a TestGpu,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    pool: vk::DescriptorPool,
    commands: vk::CommandPool,
    fence: vk::Fence,
}

impl Scratch<'_> {
    fn run(
        &mut self,
        pipeline: &Pipeline,
        data: &[u32],
        push: &[u8],
        groups: u32,
    ) -> Result<Vec<u32>> {
        let d = &self.gpu.device;
        let size = std::mem::size_of_val(data) as u64;
        let set_layout = *pipeline
            .set_layouts()
            .first()
            .ok_or_else(|| Error::InvalidArgument("pipeline has no descriptor set".into()))?;

        // SAFETY: every call below uses objects created from `d` in this function, which stay
        // alive until `Drop for Scratch`; mapped memory is accessed only within its size.
        unsafe {
            self.buffer = d
                .create_buffer(
                    &vk::BufferCreateInfo::default()
                        .size(size)
                        .usage(vk::BufferUsageFlags::STORAGE_BUFFER),
                    None,
                )
                .map_err(vk_err("vkCreateBuffer"))?;
            let req = d.get_buffer_memory_requirements(self.buffer);
            let kind = self.gpu.memory_type(
                req.memory_type_bits,
                vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT,
            )?;
            self.memory = d
                .allocate_memory(
                    &vk::MemoryAllocateInfo::default()
                        .allocation_size(req.size)
                        .memory_type_index(kind),
                    None,
                )
                .map_err(vk_err("vkAllocateMemory"))?;
            d.bind_buffer_memory(self.buffer, self.memory, 0)
                .map_err(vk_err("vkBindBufferMemory"))?;
            let mapped = d
                .map_memory(self.memory, 0, size, vk::MemoryMapFlags::empty())
                .map_err(vk_err("vkMapMemory"))? as *mut u32;
            std::ptr::copy_nonoverlapping(data.as_ptr(), mapped, data.len());

            let sizes = [vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: 1,
            }];
            self.pool = d
                .create_descriptor_pool(
                    &vk::DescriptorPoolCreateInfo::default()
                        .max_sets(1)
                        .pool_sizes(&sizes),
                    None,
                )
                .map_err(vk_err("vkCreateDescriptorPool"))?;
            let layouts = [set_layout];
            let set = d
                .allocate_descriptor_sets(
                    &vk::DescriptorSetAllocateInfo::default()
                        .descriptor_pool(self.pool)
                        .set_layouts(&layouts),
                )
                .map_err(vk_err("vkAllocateDescriptorSets"))?[0];
            let buffers = [vk::DescriptorBufferInfo {
                buffer: self.buffer,
                offset: 0,
                range: size,
            }];
            let write = vk::WriteDescriptorSet::default()
                .dst_set(set)
                .dst_binding(0)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .buffer_info(&buffers);
            d.update_descriptor_sets(&[write], &[]);

            self.commands = d
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default().queue_family_index(self.gpu.queue_family),
                    None,
                )
                .map_err(vk_err("vkCreateCommandPool"))?;
            let cmd = d
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(self.commands)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1),
                )
                .map_err(vk_err("vkAllocateCommandBuffers"))?[0];
            d.begin_command_buffer(
                cmd,
                &vk::CommandBufferBeginInfo::default()
                    .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
            )
            .map_err(vk_err("vkBeginCommandBuffer"))?;
            d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipeline.pipeline());
            d.cmd_bind_descriptor_sets(
                cmd,
                vk::PipelineBindPoint::COMPUTE,
                pipeline.layout(),
                0,
                &[set],
                &[],
            );
            if !push.is_empty() {
                d.cmd_push_constants(
                    cmd,
                    pipeline.layout(),
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    push,
                );
            }
            d.cmd_dispatch(cmd, groups, 1, 1);
            let barrier = vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::SHADER_WRITE)
                .dst_access_mask(vk::AccessFlags::HOST_READ);
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::COMPUTE_SHADER,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &[barrier],
                &[],
                &[],
            );
            d.end_command_buffer(cmd)
                .map_err(vk_err("vkEndCommandBuffer"))?;
            self.fence = d
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .map_err(vk_err("vkCreateFence"))?;
            let cmds = [cmd];
            d.queue_submit(
                self.gpu.queue,
                &[vk::SubmitInfo::default().command_buffers(&cmds)],
                self.fence,
            )
            .map_err(vk_err("vkQueueSubmit"))?;
            d.wait_for_fences(&[self.fence], true, u64::MAX)
                .map_err(vk_err("vkWaitForFences"))?;
            let mut out = vec![0u32; data.len()];
            std::ptr::copy_nonoverlapping(mapped, out.as_mut_ptr(), data.len());
            Ok(out)
        }
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        let d = &self.gpu.device;
        // SAFETY: the submission (if any) has completed or failed to start, so nothing uses
        // these objects; destroying a null handle is a no-op.
        unsafe {
            let _ = d.queue_wait_idle(self.gpu.queue);
            d.destroy_fence(self.fence, None);
            d.destroy_command_pool(self.commands, None);
            d.destroy_descriptor_pool(self.pool, None);
            d.destroy_buffer(self.buffer, None);
            d.free_memory(self.memory, None);
        }
    }
}

fn device_name(props: &vk::PhysicalDeviceProperties) -> String {
    props
        .device_name_as_c_str()
        .map(CStr::to_string_lossy)
        .map(|s| s.into_owned())
        .unwrap_or_default()
}
