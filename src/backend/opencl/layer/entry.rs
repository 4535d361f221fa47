//! The entry points the layer replaces in the dispatch table. Each does the application's call
//! on the next table, with the served build's handle in place of the application's where the
//! answer depends on the build; everything else about a program stays the driver's.

use std::ffi::{CStr, c_char, c_void};
use std::ptr;
use std::sync::{Arc, OnceLock};

mod compile;
mod kernels;
mod launches;
mod programs;

use super::answer_info;
use super::dispatch::{entry, slot};
use super::tracked::Tracked;
use crate::backend::opencl::runtime::{
    self, ContextRef, Device, DeviceIdentity, Make, options_cstring,
};
use crate::backend::opencl::sys::*;
use crate::backend::opencl::{OpenClCache, OpenClOptions, Program};
use crate::error::Error;
use crate::headers::Embedded;
use crate::log;
use crate::{Persistence, PersistenceConfig};
use compile::{compile_program, link_program};
use kernels::{
    clone_kernel, create_kernel, create_kernels_in_program, get_kernel_info, release_kernel,
};
use launches::{
    Launches, QueueCalls, create_command_queue, create_command_queue_with_properties,
    enqueue_nd_range_kernel, enqueue_task, release_command_queue, retain_command_queue,
};
use programs::{
    create_program_with_binary, create_program_with_built_ins, create_program_with_il,
    create_program_with_source,
};

#[allow(non_camel_case_types)]
type cl_kernel = *mut c_void;
type Notify = Option<unsafe extern "C" fn(cl_program, *mut c_void)>;

const CL_PROGRAM_REFERENCE_COUNT: cl_uint = 0x1160;
const CL_PROGRAM_NUM_KERNELS: cl_uint = 0x1167;
const CL_PROGRAM_SCOPE_GLOBAL_CTORS_PRESENT: cl_uint = 0x116A;
const CL_PROGRAM_SCOPE_GLOBAL_DTORS_PRESENT: cl_uint = 0x116B;
const CL_KERNEL_REFERENCE_COUNT: cl_uint = 0x1192;
const CL_KERNEL_PROGRAM: cl_uint = 0x1194;
const CL_INVALID_OPERATION: cl_int = -59;
const CL_INVALID_PROGRAM: cl_int = -44;
const CL_PROGRAM_BUILD_STATUS: cl_uint = 0x1181;
const CL_PROGRAM_BUILD_OPTIONS: cl_uint = 0x1182;
const CL_BUILD_SUCCESS: cl_int = 0;

type CreateKernel = unsafe extern "C" fn(cl_program, *const c_char, *mut cl_int) -> cl_kernel;
type CreateKernels =
    unsafe extern "C" fn(cl_program, cl_uint, *mut cl_kernel, *mut cl_uint) -> cl_int;
type ReleaseKernel = unsafe extern "C" fn(cl_kernel) -> cl_int;
type KernelInfo =
    unsafe extern "C" fn(cl_kernel, cl_uint, usize, *mut c_void, *mut usize) -> cl_int;
type CloneKernel = unsafe extern "C" fn(cl_kernel, *mut cl_int) -> cl_kernel;
type LinkProgram = unsafe extern "C" fn(
    cl_context,
    cl_uint,
    *const cl_device_id,
    *const c_char,
    cl_uint,
    *const cl_program,
    Notify,
    *mut c_void,
    *mut cl_int,
) -> cl_program;
type WithBuiltIns = unsafe extern "C" fn(
    cl_context,
    cl_uint,
    *const cl_device_id,
    *const c_char,
    *mut cl_int,
) -> cl_program;
type WithIl = unsafe extern "C" fn(cl_context, *const c_void, usize, *mut cl_int) -> cl_program;

/// The next table's entry points the layer calls beyond kcache's own ([`Api`]).
struct Next {
    create_kernel: CreateKernel,
    create_kernels: CreateKernels,
    release_kernel: ReleaseKernel,
    kernel_info: KernelInfo,
    clone_kernel: CloneKernel,
    link_program: LinkProgram,
    with_built_ins: WithBuiltIns,
    with_il: WithIl,
}

pub(super) struct Layer {
    api: &'static Api,
    next: Next,
    /// Made at the first build: opening the tiers at `clInitLayer` would do I/O inside the
    /// loader's initialisation. `None`: no disk tier, so builds go to the driver.
    cache: OnceLock<Option<OpenClCache>>,
    tracked: Tracked,
    launches: Launches,
}

static LAYER: OnceLock<Layer> = OnceLock::new();

fn layer() -> &'static Layer {
    LAYER
        .get()
        .expect("the layer's entry points are handed out only once it is set")
}

/// Sets the layer up on the next table and writes its entry points into `table` (a copy of
/// the next one). False, leaving `table` as it is, when a slot is empty or kcache's calls
/// already go elsewhere.
pub(super) fn install(table: &mut [*const c_void]) -> bool {
    macro_rules! next {
        ($slot:ident) => {
            // SAFETY: the slot is the header's for this entry point, whose prototype the
            // field's type is.
            match unsafe { entry(table, slot::$slot) } {
                Some(entry) => entry,
                None => return false,
            }
        };
    }
    let next = Next {
        create_kernel: next!(clCreateKernel),
        create_kernels: next!(clCreateKernelsInProgram),
        release_kernel: next!(clReleaseKernel),
        kernel_info: next!(clGetKernelInfo),
        clone_kernel: next!(clCloneKernel),
        link_program: next!(clLinkProgram),
        with_built_ins: next!(clCreateProgramWithBuiltInKernels),
        with_il: next!(clCreateProgramWithIL),
    };
    let queue_calls = QueueCalls {
        create: next!(clCreateCommandQueue),
        create_with_properties: next!(clCreateCommandQueueWithProperties),
        retain: next!(clRetainCommandQueue),
        release: next!(clReleaseCommandQueue),
        flush: next!(clFlush),
        marker: next!(clEnqueueMarkerWithWaitList),
        event_info: next!(clGetEventInfo),
        release_event: next!(clReleaseEvent),
        nd_range: next!(clEnqueueNDRangeKernel),
        task: next!(clEnqueueTask),
    };
    let Some(api) = super::dispatch::next_api(table) else {
        return false;
    };
    if !Api::install(api) {
        return false;
    }
    let Ok(api) = Api::get() else {
        return false;
    };
    let layer = Layer {
        api,
        next,
        cache: OnceLock::new(),
        tracked: Tracked::default(),
        launches: Launches::new(queue_calls),
    };
    if LAYER.set(layer).is_err() {
        return false;
    }
    // From here on, a binary query of a program the application uses waits for its launches.
    crate::backend::opencl::set_quiet(launches::quiet);
    let ours: [(usize, *const c_void); 20] = [
        (
            slot::clRetainCommandQueue,
            retain_command_queue as *const c_void,
        ),
        (
            slot::clCreateCommandQueue,
            create_command_queue as *const c_void,
        ),
        (
            slot::clCreateCommandQueueWithProperties,
            create_command_queue_with_properties as *const c_void,
        ),
        (
            slot::clReleaseCommandQueue,
            release_command_queue as *const c_void,
        ),
        (
            slot::clEnqueueNDRangeKernel,
            enqueue_nd_range_kernel as *const c_void,
        ),
        (slot::clEnqueueTask, enqueue_task as *const c_void),
        (
            slot::clCreateProgramWithSource,
            create_program_with_source as *const c_void,
        ),
        (
            slot::clCreateProgramWithBinary,
            create_program_with_binary as *const c_void,
        ),
        (
            slot::clCreateProgramWithBuiltInKernels,
            create_program_with_built_ins as *const c_void,
        ),
        (
            slot::clCreateProgramWithIL,
            create_program_with_il as *const c_void,
        ),
        (slot::clLinkProgram, link_program as *const c_void),
        (slot::clCompileProgram, compile_program as *const c_void),
        (slot::clBuildProgram, build_program as *const c_void),
        (slot::clReleaseProgram, release_program as *const c_void),
        (slot::clGetProgramInfo, get_program_info as *const c_void),
        (
            slot::clGetProgramBuildInfo,
            get_program_build_info as *const c_void,
        ),
        (slot::clCreateKernel, create_kernel as *const c_void),
        (
            slot::clCreateKernelsInProgram,
            create_kernels_in_program as *const c_void,
        ),
        (slot::clReleaseKernel, release_kernel as *const c_void),
        (slot::clGetKernelInfo, get_kernel_info as *const c_void),
    ];
    for (slot, entry) in ours {
        table[slot] = entry;
    }
    table[slot::clCloneKernel] = clone_kernel as *const c_void;
    true
}

impl Layer {
    fn cache(&self) -> Option<&OpenClCache> {
        self.cache
            .get_or_init(|| {
                let disk = Persistence::open(PersistenceConfig::from_env())
                    .inspect_err(|e| {
                        log::info(|| format!("OpenCL layer: builds go to the driver: {e}"))
                    })
                    .ok()?;
                OpenClCache::new(OpenClOptions {
                    memory: Default::default(),
                    persistence: Some(Arc::new(disk)),
                })
                .inspect_err(|e| {
                    log::info(|| format!("OpenCL layer: builds go to the driver: {e}"))
                })
                .ok()
            })
            .as_ref()
    }

    /// The served build of `clBuildProgram(program, devices, options)` (or of
    /// `clCompileProgram`, `make` saying which, with its `embedded` headers), or `None` to leave
    /// the build to the driver: a program not from source, options or source that are not
    /// text, a device list that is not of the program's context, inputs kcache cannot key, any
    /// error (a failing build included: the driver's own build then gives the application its
    /// error and log).
    ///
    /// A build for several devices is one entry per device (per kind of device: devices of one
    /// identity share a binary, as on disk), whose binaries make the program served.
    fn serve(
        &self,
        program: cl_program,
        num_devices: cl_uint,
        device_list: *const cl_device_id,
        options: *const c_char,
        make: Make<'_>,
        embedded: &[Embedded<'_>],
    ) -> Option<Program> {
        let (context, source) = self.tracked.source(program as usize)?;
        let options = if options.is_null() {
            ""
        } else {
            // SAFETY: the application passes options as a C string.
            unsafe { CStr::from_ptr(options) }.to_str().ok()?
        };
        // SAFETY: the program holds a reference to its context, so the context is live.
        let context = unsafe { ContextRef::from_raw(context as cl_context) };
        // SAFETY: the application's list of `num_devices` devices.
        let devices = unsafe { self.build_devices(context, num_devices, device_list) }?;
        let cache = self.cache()?;
        let built = self.served_for(cache, context, &devices, &source, options, make, embedded);
        // The program is the application's from here; the memory tier would keep its context
        // alive after the application released it.
        let _ = cache.evict_context(context.raw());
        match built {
            Ok(built) => Some(built),
            Err(Error::Build(_)) => None,
            Err(e) => {
                log::info(|| format!("OpenCL layer: build left to the driver: {e}"));
                None
            }
        }
    }

    /// The devices of `context`, in its order, when the build is for all of them: no list, or
    /// a list of each once. `None` for a build for some of them, which the driver builds: a
    /// program's binaries and build answers are per device of its context, and one served for
    /// fewer devices would answer for fewer.
    ///
    /// # Safety
    /// `device_list`, when not null, holds `num_devices` devices.
    unsafe fn build_devices(
        &self,
        context: ContextRef<'_>,
        num_devices: cl_uint,
        device_list: *const cl_device_id,
    ) -> Option<Vec<Device>> {
        let devices = context.devices(self.api).ok()?;
        let all = match (num_devices as usize, device_list.is_null()) {
            (0, true) => true,
            (count, false) if count == devices.len() => {
                // SAFETY: `num_devices` devices, as the caller promises.
                let listed = unsafe { std::slice::from_raw_parts(device_list, count) };
                devices.iter().all(|device| listed.contains(&device.raw()))
            }
            _ => false,
        };
        (all && !devices.is_empty()).then_some(devices)
    }

    /// The program built for `devices` from kcache's tiers. `Error::Unavailable` for inputs
    /// kcache cannot key (counted as passed through).
    #[allow(clippy::too_many_arguments)]
    fn served_for(
        &self,
        cache: &OpenClCache,
        context: ContextRef<'_>,
        devices: &[Device],
        source: &str,
        options: &str,
        make: Make<'_>,
        embedded: &[Embedded<'_>],
    ) -> Result<Program, Error> {
        let lookup = |device: Device| match cache.lookup(
            context,
            device,
            &[source],
            options,
            make,
            embedded,
        ) {
            Ok(found) => found,
            Err(why) => {
                cache.passed_through(&why);
                Err(Error::Unavailable(why.to_string()))
            }
        };
        if let [device] = devices[..] {
            return lookup(device)?.value().retain();
        }
        let mut binaries: Vec<(DeviceIdentity, Vec<u8>)> = Vec::new();
        let mut each = Vec::with_capacity(devices.len());
        for &device in devices {
            let identity = DeviceIdentity::query_with(self.api, device)?;
            let index = match binaries.iter().position(|(seen, _)| *seen == identity) {
                Some(index) => index,
                None => {
                    let binary = lookup(device)?.value().binary()?;
                    binaries.push((identity, binary));
                    binaries.len() - 1
                }
            };
            each.push(index);
        }
        let each: Vec<(Device, &[u8])> = devices
            .iter()
            .zip(each)
            .map(|(&device, index)| (device, &binaries[index].1[..]))
            .collect();
        let options = options_cstring(options)?;
        runtime::build_from_binaries(self.api, context, &each, &options, make).map_err(Error::Build)
    }

    /// The handle the answer about `program`'s build comes from.
    fn built_or(&self, program: cl_program) -> cl_program {
        self.tracked
            .built(program as usize)
            .map_or(program, |built| built as cl_program)
    }

    /// Links the kernels made from a served build to the application's program, which each
    /// keeps alive as a driver's kernel does; forgets links left at reused kernel handles.
    fn link(&self, program: cl_program, served: bool, kernels: &[cl_kernel]) {
        for &kernel in kernels {
            if let Some(stale) = self.tracked.unlink_kernel(kernel as usize) {
                self.release_program(stale as cl_program);
            }
            // SAFETY: the application holds `program`, so it is live.
            if served && unsafe { (self.api.clRetainProgram)(program) } == CL_SUCCESS {
                self.tracked.link_kernel(kernel as usize, program as usize);
            }
        }
    }

    fn release_program(&self, program: cl_program) -> cl_int {
        if self.tracked.is_tracked(program as usize)
            && last_reference(
                self.api.clGetProgramInfo,
                program,
                CL_PROGRAM_REFERENCE_COUNT,
            )
        {
            self.forget(program);
        }
        // SAFETY: the caller's release, passed on.
        unsafe { (self.api.clReleaseProgram)(program) }
    }

    /// Forgets `program` and drops its served build, if any.
    fn forget(&self, program: cl_program) {
        if self.tracked.forget(program as usize) {
            // The disk tier's write of a served build may hold the build (and through it
            // the application's context) until the cache is flushed, which PoCL 3.1 does
            // not survive once the application has released that context: it aborts in
            // `pocl_llvm_release_context` at a later context's release.
            if let Some(Some(cache)) = self.cache.get() {
                cache.flush();
            }
        }
    }
}

impl Layer {
    /// Runs `call` with a reference of its own on `program`, so that a release on another
    /// thread cannot free the program, and the driver hand its handle to a new program,
    /// before a served build is attached to it. Not a program: the driver's error.
    ///
    /// # Safety
    /// `program` is what the application passed to the call.
    unsafe fn held(&self, program: cl_program, call: impl FnOnce(&Layer) -> cl_int) -> cl_int {
        // As the driver: a program whose kernels are alive cannot be built again.
        if self.tracked.has_kernels(program as usize) {
            return CL_INVALID_OPERATION;
        }
        // SAFETY: the application passes a program it holds.
        if unsafe { (self.api.clRetainProgram)(program) } != CL_SUCCESS {
            return CL_INVALID_PROGRAM;
        }
        let code = call(self);
        self.release_program(program);
        code
    }
}

unsafe extern "C" fn build_program(
    program: cl_program,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    options: *const c_char,
    pfn_notify: Notify,
    user_data: *mut c_void,
) -> cl_int {
    let layer = layer();
    // SAFETY: the application's call.
    unsafe {
        layer.held(program, |layer| {
            layer.build(
                program,
                num_devices,
                device_list,
                options,
                pfn_notify,
                user_data,
            )
        })
    }
}

impl Layer {
    /// `clBuildProgram` on a program the caller holds a reference to.
    fn build(
        &self,
        program: cl_program,
        num_devices: cl_uint,
        device_list: *const cl_device_id,
        options: *const c_char,
        pfn_notify: Notify,
        user_data: *mut c_void,
    ) -> cl_int {
        let served = self.serve(
            program,
            num_devices,
            device_list,
            options,
            Make::Executable,
            &[],
        );
        let Some(served) = served else {
            // Built by the driver: the layer forgets the program now. Kernels of a driver's build
            // keep their program alive without the layer seeing their releases, so the
            // application's last release of the program may happen behind its back; what the
            // layer kept of it (its source) would then stay until the handle came back.
            self.forget(program);
            // SAFETY: the application's call, passed on.
            return unsafe {
                (self.api.clBuildProgram)(
                    program,
                    num_devices,
                    device_list,
                    options,
                    pfn_notify,
                    user_data,
                )
            };
        };
        self.tracked.set_built(program as usize, served, None);
        if let Some(notify) = pfn_notify {
            // SAFETY: the application's callback, called once the build is complete, as the
            // driver would.
            unsafe { notify(program, user_data) };
        }
        CL_SUCCESS
    }
}

/// Whether the caller's release of `handle` is its last: its reference count, read with the
/// driver's `info` query for `param`, is 1. False when the driver cannot say.
fn last_reference(
    info: unsafe extern "C" fn(*mut c_void, cl_uint, usize, *mut c_void, *mut usize) -> cl_int,
    handle: *mut c_void,
    param: cl_uint,
) -> bool {
    let mut count: cl_uint = 0;
    // SAFETY: one cl_uint answer, its size passed; the handle is the caller's, still held.
    let code = unsafe {
        info(
            handle,
            param,
            size_of::<cl_uint>(),
            (&raw mut count).cast(),
            ptr::null_mut(),
        )
    };
    code == CL_SUCCESS && count == 1
}

unsafe extern "C" fn release_program(program: cl_program) -> cl_int {
    layer().release_program(program)
}

unsafe extern "C" fn get_program_info(
    program: cl_program,
    param: cl_uint,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    let layer = layer();
    let target = match param {
        CL_PROGRAM_BINARY_SIZES
        | CL_PROGRAM_BINARIES
        | CL_PROGRAM_NUM_KERNELS
        | CL_PROGRAM_KERNEL_NAMES
        | CL_PROGRAM_SCOPE_GLOBAL_CTORS_PRESENT
        | CL_PROGRAM_SCOPE_GLOBAL_DTORS_PRESENT => layer.built_or(program),
        _ => program,
    };
    // SAFETY: the application's call, on the program that answers it.
    unsafe { (layer.api.clGetProgramInfo)(target, param, size, value, size_ret) }
}

unsafe extern "C" fn get_program_build_info(
    program: cl_program,
    device: cl_device_id,
    param: cl_uint,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    let layer = layer();
    // A compiled object served from a binary was never compiled by the driver: its status
    // and options are the compile's, as the driver's own compile would report them.
    if matches!(param, CL_PROGRAM_BUILD_STATUS | CL_PROGRAM_BUILD_OPTIONS)
        && let Some(options) = layer.tracked.object_options(program as usize)
    {
        let answer = match param {
            CL_PROGRAM_BUILD_STATUS => CL_BUILD_SUCCESS.to_ne_bytes().to_vec(),
            _ => [options.as_bytes(), b"\0"].concat(),
        };
        // SAFETY: the application's buffers, as the specification has them.
        return unsafe { answer_info(&answer, size, value, size_ret) };
    }
    // SAFETY: the application's call, on the program that answers it.
    unsafe {
        (layer.api.clGetProgramBuildInfo)(
            layer.built_or(program),
            device,
            param,
            size,
            value,
            size_ret,
        )
    }
}
