//! Vulkan objects a pipeline is made of: descriptor-set and pipeline layouts (one per device
//! and layout description), the shader module and the compute pipeline itself.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ash::vk;

use super::device::{DeviceFns, DeviceState};
use super::layout::LayoutDesc;
use super::spec::PipelineSpec;
use super::stats::Counters;
use crate::BuildError;
use crate::backend::handle_cache::{Compiled, Destroy};
use crate::error::DestroyError;
use crate::stats::bump;

/// Descriptor-set layouts and pipeline layout made from one [`LayoutDesc`] on one device.
pub(super) struct Layout {
    device: Arc<DeviceFns>,
    set_layouts: Vec<vk::DescriptorSetLayout>,
    pipeline_layout: vk::PipelineLayout,
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: the last pipeline referring to these layouts has been destroyed (each holds an
        // `Arc` of this) and the device's registry entry is gone, so nothing uses them.
        unsafe {
            let d = &self.device.fns;
            d.destroy_pipeline_layout(self.pipeline_layout, None);
            for &set in &self.set_layouts {
                d.destroy_descriptor_set_layout(set, None);
            }
        }
    }
}

/// A compute pipeline, its shader module and its layout. Destroyed exactly once, when it
/// leaves the cache and its last lease is released.
pub struct Pipeline {
    pipeline: vk::Pipeline,
    module: vk::ShaderModule,
    layout: Arc<Layout>,
    device: Arc<DeviceFns>,
    counters: Arc<Counters>,
}

impl Pipeline {
    pub fn pipeline(&self) -> vk::Pipeline {
        self.pipeline
    }

    pub fn shader_module(&self) -> vk::ShaderModule {
        self.module
    }

    /// The pipeline layout kcache created from the [`LayoutDesc`].
    pub fn layout(&self) -> vk::PipelineLayout {
        self.layout.pipeline_layout
    }

    /// `set_layouts()[n]` is the layout of descriptor set `n`.
    pub fn set_layouts(&self) -> &[vk::DescriptorSetLayout] {
        &self.layout.set_layouts
    }
}

debug_fields!(Pipeline {
    pipeline,
    module,
    ..
});

impl Drop for Pipeline {
    fn drop(&mut self) {
        // SAFETY: the memory tier drops a value once, after its last lease is gone; the caller
        // must not still be executing it (the lease contract) and the device is still alive
        // (callers release leases before `vkDestroyDevice`).
        unsafe {
            let d = &self.device.fns;
            d.destroy_pipeline(self.pipeline, None);
            d.destroy_shader_module(self.module, None);
        }
        self.device.live_pipelines.fetch_sub(1, Ordering::Relaxed);
        bump(&self.counters.pipelines_destroyed, 1);
    }
}

/// Vulkan's destroy calls report nothing, so destroying a pipeline is dropping it: the memory
/// tier's destroy and a drop outside the cache are the same one step.
impl Destroy for Pipeline {
    fn destroy(self) -> std::result::Result<(), DestroyError> {
        drop(self);
        Ok(())
    }
}

fn build_error(what: &str, r: vk::Result) -> BuildError {
    BuildError::new(r.as_raw(), format!("{what} failed: {r}"))
}

/// Creates the descriptor-set layouts of `desc`, then the pipeline layout over them. Each set
/// layout is pushed onto `set_layouts` as soon as it exists, so that the caller destroys what
/// was made whatever the outcome. `error` turns the failing call's name and result into `E`.
///
/// # Safety
/// `d` must be the function table of a live device.
pub(super) unsafe fn create_layouts<E>(
    d: &ash::Device,
    desc: &LayoutDesc,
    set_layouts: &mut Vec<vk::DescriptorSetLayout>,
    error: impl Fn(&'static str, vk::Result) -> E,
) -> Result<vk::PipelineLayout, E> {
    for set in &desc.sets {
        let bindings: Vec<vk::DescriptorSetLayoutBinding> = set
            .iter()
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b.binding)
                    .descriptor_type(b.descriptor_type)
                    .descriptor_count(b.count)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
        // SAFETY: live device (caller's contract); the create info outlives the call.
        let set_layout = unsafe { d.create_descriptor_set_layout(&info, None) }
            .map_err(|r| error("vkCreateDescriptorSetLayout", r))?;
        set_layouts.push(set_layout);
    }
    let ranges: Vec<vk::PushConstantRange> = desc
        .push_constants
        .iter()
        .map(|pc| vk::PushConstantRange {
            stage_flags: vk::ShaderStageFlags::COMPUTE,
            offset: pc.offset,
            size: pc.size,
        })
        .collect();
    let info = vk::PipelineLayoutCreateInfo::default()
        .set_layouts(set_layouts)
        .push_constant_ranges(&ranges);
    // SAFETY: live device; the set layouts were just created from it.
    unsafe { d.create_pipeline_layout(&info, None) }.map_err(|r| error("vkCreatePipelineLayout", r))
}

/// One `vkCreateComputePipelines` for `spec`'s entry point and specialization constants.
///
/// # Safety
/// `d` must be the function table of a live device; `module`, `layout` and `cache` (or a null
/// `cache`) must belong to it and stay alive across the call.
pub(super) unsafe fn create_pipeline(
    d: &ash::Device,
    cache: vk::PipelineCache,
    spec: &PipelineSpec,
    module: vk::ShaderModule,
    layout: vk::PipelineLayout,
) -> Result<vk::Pipeline, vk::Result> {
    let mut data = Vec::new();
    let entries: Vec<vk::SpecializationMapEntry> = spec
        .specialization
        .iter()
        .map(|c| {
            let entry = vk::SpecializationMapEntry {
                constant_id: c.id,
                offset: data.len() as u32,
                size: c.value.len(),
            };
            data.extend_from_slice(&c.value);
            entry
        })
        .collect();
    let specialization = vk::SpecializationInfo::default()
        .map_entries(&entries)
        .data(&data);
    let mut subgroup = vk::PipelineShaderStageRequiredSubgroupSizeCreateInfo::default()
        .required_subgroup_size(spec.required_subgroup_size.unwrap_or(0));
    let mut stage = vk::PipelineShaderStageCreateInfo::default()
        .stage(vk::ShaderStageFlags::COMPUTE)
        .module(module)
        .name(&spec.entry_point);
    if !entries.is_empty() {
        stage = stage.specialization_info(&specialization);
    }
    if spec.required_subgroup_size.is_some() {
        stage = stage.push_next(&mut subgroup);
    }
    let info = vk::ComputePipelineCreateInfo::default()
        .flags(spec.flags)
        .stage(stage)
        .layout(layout);
    // SAFETY: forwarded from the caller's contract; the create info outlives the call.
    unsafe { d.create_compute_pipelines(cache, &[info], None) }
        .map(|pipelines| pipelines[0])
        .map_err(|(_, r)| r)
}

/// A compute pipeline made by [`create_uncached`], with the shader module and layouts it was
/// made with. The caller owns every object and destroys them with [`UncachedPipeline::destroy`].
#[derive(Debug)]
pub struct UncachedPipeline {
    pub pipeline: vk::Pipeline,
    pub module: vk::ShaderModule,
    pub layout: vk::PipelineLayout,
    pub set_layouts: Vec<vk::DescriptorSetLayout>,
}

impl UncachedPipeline {
    /// Destroys the pipeline, its shader module and its layouts.
    ///
    /// # Safety
    /// `device` must be the live device the pipeline was created on, and no command buffer
    /// that uses the pipeline may be pending.
    pub unsafe fn destroy(self, device: &ash::Device) {
        // SAFETY: the caller's contract; each object was created from `device` and is destroyed
        // once (null handles are ignored).
        unsafe {
            device.destroy_pipeline(self.pipeline, None);
            device.destroy_shader_module(self.module, None);
            device.destroy_pipeline_layout(self.layout, None);
            for set in self.set_layouts {
                device.destroy_descriptor_set_layout(set, None);
            }
        }
    }
}

/// Creates `spec`'s pipeline on `device` without caching it: its shader module, its
/// descriptor-set and pipeline layouts, and one `vkCreateComputePipelines` with no pipeline
/// cache, exactly as a lookup that misses builds them but shared with no one, counted nowhere
/// and never stored. For a pipeline that should not stay in the cache, or to measure what a
/// cache hit saves. On failure, whatever was created is destroyed.
///
/// # Safety
/// `device` must be a live device.
pub unsafe fn create_uncached(
    device: &ash::Device,
    spec: &PipelineSpec,
) -> Result<UncachedPipeline, BuildError> {
    let mut made = UncachedPipeline {
        pipeline: vk::Pipeline::null(),
        module: vk::ShaderModule::null(),
        layout: vk::PipelineLayout::null(),
        set_layouts: Vec::with_capacity(spec.layout().sets.len()),
    };
    let result = (|| {
        // SAFETY: live device (caller's contract); the bindings were validated by
        // `PipelineSpec::new`; the set layouts are destroyed with `made` on failure.
        made.layout =
            unsafe { create_layouts(device, spec.layout(), &mut made.set_layouts, build_error) }?;
        let module_info = vk::ShaderModuleCreateInfo::default().code(&spec.spirv);
        // SAFETY: live device; the code passed the header, bounds and entry-point checks.
        made.module = unsafe { device.create_shader_module(&module_info, None) }
            .map_err(|r| build_error("vkCreateShaderModule", r))?;
        // SAFETY: live device; module and layout were just created from it; no pipeline cache.
        made.pipeline = unsafe {
            create_pipeline(
                device,
                vk::PipelineCache::null(),
                spec,
                made.module,
                made.layout,
            )
        }
        .map_err(|r| build_error("vkCreateComputePipelines", r))?;
        Ok(())
    })();
    match result {
        Ok(()) => Ok(made),
        Err(e) => {
            // SAFETY: live device; the objects were created above and nothing uses them.
            unsafe { made.destroy(device) };
            Err(e)
        }
    }
}

fn layout_for(
    counters: &Counters,
    state: &DeviceState,
    spec: &PipelineSpec,
) -> Result<Arc<Layout>, BuildError> {
    let mut layouts = state.layouts.lock();
    if let Some(layout) = layouts.get(&spec.layout_digest) {
        return Ok(layout.clone());
    }
    let d = &state.fns.fns;
    let desc = spec.layout();
    let mut layout = Layout {
        device: state.fns.clone(),
        set_layouts: Vec::with_capacity(desc.sets.len()),
        pipeline_layout: vk::PipelineLayout::null(),
    };
    // SAFETY: live device; the bindings were validated by `PipelineSpec::new`. On failure,
    // `layout`'s drop destroys the set layouts created so far.
    layout.pipeline_layout =
        unsafe { create_layouts(d, desc, &mut layout.set_layouts, build_error) }?;
    bump(&counters.layouts_created, 1);
    let layout = Arc::new(layout);
    layouts.insert(spec.layout_digest, layout.clone());
    Ok(layout)
}

/// Creates the pipeline for `spec` on the device, through the device's pipeline cache.
pub(super) fn build(
    counters: &Arc<Counters>,
    state: &DeviceState,
    spec: &PipelineSpec,
) -> Result<Compiled<Pipeline>, BuildError> {
    let layout = layout_for(counters, state, spec)?;
    let d = &state.fns.fns;
    let module_info = vk::ShaderModuleCreateInfo::default().code(&spec.spirv);
    // SAFETY: live device; the code passed the header, bounds and entry-point checks.
    let module = unsafe { d.create_shader_module(&module_info, None) }
        .map_err(|r| build_error("vkCreateShaderModule", r))?;
    let started = Instant::now();
    let created = {
        let cache = state.pipeline_cache.read();
        // SAFETY: live device; module, layout and (possibly null) pipeline cache belong to
        // it, and the read lock keeps the pipeline cache alive across the call.
        unsafe { create_pipeline(d, *cache, spec, module, layout.pipeline_layout) }
    };
    let pipeline = match created {
        Ok(p) => p,
        Err(r) => {
            // SAFETY: the module was created above and nothing else refers to it.
            unsafe { d.destroy_shader_module(module, None) };
            return Err(build_error("vkCreateComputePipelines", r));
        }
    };
    let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    state.build_nanos.fetch_add(nanos, Ordering::Relaxed);
    state.fns.live_pipelines.fetch_add(1, Ordering::Relaxed);
    state.unsaved.fetch_add(1, Ordering::Relaxed);
    bump(&counters.pipelines_created, 1);
    Ok(Compiled {
        value: Pipeline {
            pipeline,
            module,
            layout,
            device: state.fns.clone(),
            counters: counters.clone(),
        },
        weight: std::mem::size_of_val(spec.spirv.as_slice()) as u64,
        // The device's pipeline cache holds what the disk keeps, not each pipeline.
        bytes: None,
        descriptor: state.descriptor.clone(),
    })
}
