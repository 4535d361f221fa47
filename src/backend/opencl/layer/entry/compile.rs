//! `clCompileProgram` and `clLinkProgram`: a compile is served as a compiled object from
//! kcache's tiers (its embedded and included headers keyed), and a link takes the served
//! objects in place of the application's inputs.

use std::ffi::{CStr, c_char, c_void};

use super::programs::not_from_source;
use super::{Layer, Notify, layer};
use crate::backend::opencl::Program;
use crate::backend::opencl::runtime::{EmbeddedHeaders, Make};
use crate::backend::opencl::sys::*;
use crate::headers::Embedded;

#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn link_program(
    context: cl_context,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    options: *const c_char,
    num_inputs: cl_uint,
    inputs: *const cl_program,
    pfn_notify: Notify,
    user_data: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_program {
    let layer = layer();
    // Compiled objects kcache served are linked in place of the application's programs.
    let served: Vec<cl_program> = if inputs.is_null() {
        Vec::new()
    } else {
        // SAFETY: `num_inputs` programs, as the application says.
        unsafe { std::slice::from_raw_parts(inputs, num_inputs as usize) }
            .iter()
            .map(|&input| layer.built_or(input))
            .collect()
    };
    let inputs = if inputs.is_null() {
        inputs
    } else {
        served.as_ptr()
    };
    // SAFETY: the application's call, passed on, each input or the object served for it.
    not_from_source(unsafe {
        (layer.next.link_program)(
            context,
            num_devices,
            device_list,
            options,
            num_inputs,
            inputs,
            pfn_notify,
            user_data,
            errcode_ret,
        )
    })
}

#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn compile_program(
    program: cl_program,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    options: *const c_char,
    num_headers: cl_uint,
    headers: *const cl_program,
    header_names: *const *const c_char,
    pfn_notify: Notify,
    user_data: *mut c_void,
) -> cl_int {
    let layer = layer();
    let call = Compile {
        num_devices,
        device_list,
        options,
        num_headers,
        headers,
        header_names,
        pfn_notify,
        user_data,
    };
    // SAFETY: the application's call.
    unsafe { layer.held(program, |layer| layer.compile(program, &call)) }
}

/// The arguments of a `clCompileProgram` but its program.
struct Compile {
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    options: *const c_char,
    num_headers: cl_uint,
    headers: *const cl_program,
    header_names: *const *const c_char,
    pfn_notify: Notify,
    user_data: *mut c_void,
}

impl Layer {
    /// `clCompileProgram` on a program the caller holds a reference to: served as a compiled
    /// object from kcache's tiers, keyed by its source, options and headers (embedded and
    /// read from files), or the driver's call.
    fn compile(&self, program: cl_program, call: &Compile) -> cl_int {
        match self.serve_compile(program, call) {
            Some((served, options)) => {
                self.tracked
                    .set_built(program as usize, served, Some(options));
                if let Some(notify) = call.pfn_notify {
                    // SAFETY: the application's callback, called once the compile is
                    // complete, as the driver would.
                    unsafe { notify(program, call.user_data) };
                }
                CL_SUCCESS
            }
            None => {
                // Compiled by the driver: a served build no longer answers for it, and the
                // layer has no more use for its source (see `build`).
                self.forget(program);
                // SAFETY: the application's call, passed on.
                unsafe {
                    (self.api.clCompileProgram)(
                        program,
                        call.num_devices,
                        call.device_list,
                        call.options,
                        call.num_headers,
                        call.headers,
                        call.header_names,
                        call.pfn_notify,
                        call.user_data,
                    )
                }
            }
        }
    }

    /// The served compiled object and its options, if the compile can be served: every
    /// embedded header a source program the layer knows, under a name that is text.
    fn serve_compile(&self, program: cl_program, call: &Compile) -> Option<(Program, String)> {
        let count = call.num_headers as usize;
        let (programs, names): (&[cl_program], &[*const c_char]) = match count {
            0 => (&[], &[]),
            _ if call.headers.is_null() || call.header_names.is_null() => return None,
            // SAFETY: `count` headers and as many names, as the application says.
            _ => unsafe {
                (
                    std::slice::from_raw_parts(call.headers, count),
                    std::slice::from_raw_parts(call.header_names, count),
                )
            },
        };
        let mut texts = Vec::with_capacity(count);
        for (&header, &name) in programs.iter().zip(names) {
            let (_, text) = self.tracked.source(header as usize)?;
            if name.is_null() {
                return None;
            }
            // SAFETY: the application passes each name as a C string.
            let name = unsafe { CStr::from_ptr(name) }.to_str().ok()?;
            texts.push((name, text));
        }
        let embedded: Vec<Embedded<'_>> = texts
            .iter()
            .map(|(name, text)| Embedded { name, text })
            .collect();
        let make = Make::Object(EmbeddedHeaders { programs, names });
        let served = self.serve(
            program,
            call.num_devices,
            call.device_list,
            call.options,
            make,
            &embedded,
        )?;
        let options = if call.options.is_null() {
            String::new()
        } else {
            // SAFETY: a C string, which `serve` read as text already.
            unsafe { CStr::from_ptr(call.options) }
                .to_string_lossy()
                .into_owned()
        };
        Some((served, options))
    }
}
