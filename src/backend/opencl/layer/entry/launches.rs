//! The application's launches and command queues, so that a program's binary is asked for only
//! while none of the application's work runs on the driver.
//!
//! PoCL compiles a launch's code on its device threads, after `clEnqueueNDRangeKernel` has
//! returned, and compiles too when a program's binary is asked for: the two at once abort the
//! process (PoCL 3.1, `pocl_check_kernel_disk_cache` on a device thread while the binary query
//! waits for PoCL's kernel cache lock; PyOpenCL's `test_can_build_and_run_binary` under the
//! layer, in up to one run in two on a busy machine, both at the application's release of a
//! program and at exit). So the binary of a program the application has used is taken behind
//! a gate: launches pass it shared, a binary query holds it alone, and, holding it, first
//! waits for a marker on every queue the application has, so that nothing the application
//! enqueued still runs. The application's threads that launch meanwhile wait at the gate; a
//! queue whose work does not finish within [`DRAIN_TIMEOUT`] leaves the binary untaken.

use std::ffi::c_void;
use std::ptr;
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use super::{cl_kernel, layer};
use crate::backend::opencl::sys::*;

#[allow(non_camel_case_types)]
type cl_command_queue = *mut c_void;
#[allow(non_camel_case_types)]
type cl_event = *mut c_void;

const CL_EVENT_COMMAND_EXECUTION_STATUS: cl_uint = 0x11D3;
const CL_COMPLETE: cl_int = 0;

/// How long a binary query waits for the application's queued work at most.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a drain looks at its markers again.
const POLL: Duration = Duration::from_millis(1);

pub(super) type CreateQueue =
    unsafe extern "C" fn(cl_context, cl_device_id, u64, *mut cl_int) -> cl_command_queue;
pub(super) type CreateQueueWithProperties =
    unsafe extern "C" fn(cl_context, cl_device_id, *const u64, *mut cl_int) -> cl_command_queue;
pub(super) type QueueHandleCall = unsafe extern "C" fn(cl_command_queue) -> cl_int;
pub(super) type Marker =
    unsafe extern "C" fn(cl_command_queue, cl_uint, *const cl_event, *mut cl_event) -> cl_int;
pub(super) type EventInfo =
    unsafe extern "C" fn(cl_event, cl_uint, usize, *mut c_void, *mut usize) -> cl_int;
pub(super) type ReleaseEvent = unsafe extern "C" fn(cl_event) -> cl_int;
pub(super) type NdRange = unsafe extern "C" fn(
    cl_command_queue,
    cl_kernel,
    cl_uint,
    *const usize,
    *const usize,
    *const usize,
    cl_uint,
    *const cl_event,
    *mut cl_event,
) -> cl_int;
pub(super) type Task = unsafe extern "C" fn(
    cl_command_queue,
    cl_kernel,
    cl_uint,
    *const cl_event,
    *mut cl_event,
) -> cl_int;

/// The next table's entry points for queues and launches.
pub(super) struct QueueCalls {
    pub create: CreateQueue,
    pub create_with_properties: CreateQueueWithProperties,
    pub retain: QueueHandleCall,
    pub release: QueueHandleCall,
    pub flush: QueueHandleCall,
    pub marker: Marker,
    pub event_info: EventInfo,
    pub release_event: ReleaseEvent,
    pub nd_range: NdRange,
    pub task: Task,
}

/// The gate and the application's live queues.
pub(super) struct Launches {
    calls: QueueCalls,
    /// Launches hold it shared while they enqueue; a binary query holds it alone.
    gate: RwLock<()>,
    /// The application's queues that it still holds, as addresses, with the references it
    /// holds (counted here: a driver's own references, an event's for one, hide the
    /// application's last release from the queue's reference count). The layer holds one
    /// reference of its own on each, released after the application's last, so that a drain
    /// never marks a freed queue.
    queues: Mutex<Vec<(usize, u32)>>,
}

impl Launches {
    pub(super) fn new(calls: QueueCalls) -> Self {
        Launches {
            calls,
            gate: RwLock::new(()),
            queues: Mutex::new(Vec::new()),
        }
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, Vec<(usize, u32)>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn track(&self, queue: cl_command_queue) -> cl_command_queue {
        // SAFETY: a queue just created, so live; the layer's own reference.
        if !queue.is_null() && unsafe { (self.calls.retain)(queue) } == CL_SUCCESS {
            self.queues().push((queue as usize, 1));
        }
        queue
    }

    /// Counts a reference the application took or dropped on `queue` (`by` +1 or -1);
    /// whether it was the application's last.
    fn count(&self, queues: &mut Vec<(usize, u32)>, queue: cl_command_queue, by: i32) -> bool {
        let Some(at) = queues.iter().position(|&(q, _)| q == queue as usize) else {
            return false;
        };
        let refs = &mut queues[at].1;
        *refs = refs.saturating_add_signed(by);
        if *refs > 0 {
            return false;
        }
        queues.swap_remove(at);
        true
    }

    /// Runs `query` while no launch of the application runs: the gate closed, every queue's
    /// work finished. An error (and no query) when some queue's work did not finish in time.
    pub(super) fn quiet(&self, query: &mut dyn FnMut()) -> Result<(), String> {
        let _closed = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        self.drain()?;
        query();
        Ok(())
    }

    /// Waits until the work enqueued on every queue so far has finished.
    fn drain(&self) -> Result<(), String> {
        let mut markers = Vec::new();
        for &(queue, _) in self.queues().iter() {
            let mut event: cl_event = ptr::null_mut();
            // SAFETY: a queue the application holds (its last release takes the list first);
            // no wait list, one event out.
            let code = unsafe {
                (self.calls.marker)(queue as cl_command_queue, 0, ptr::null(), &mut event)
            };
            if code != CL_SUCCESS {
                markers.into_iter().for_each(|e| self.release_event(e));
                return Err(format!(
                    "a marker on the application's queue failed: {}",
                    status_name(code)
                ));
            }
            // SAFETY: as above; a flush makes sure the marker is submitted.
            unsafe { (self.calls.flush)(queue as cl_command_queue) };
            markers.push(event);
        }
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        let mut outcome = Ok(());
        for &event in &markers {
            if let Err(e) = self.wait(event, deadline) {
                outcome = Err(e);
                break;
            }
        }
        markers.into_iter().for_each(|e| self.release_event(e));
        outcome
    }

    /// Polls `event` until it completes, fails or `deadline` passes.
    fn wait(&self, event: cl_event, deadline: Instant) -> Result<(), String> {
        loop {
            let mut status: cl_int = 0;
            // SAFETY: a live event of ours; one cl_int answer, its size passed.
            let code = unsafe {
                (self.calls.event_info)(
                    event,
                    CL_EVENT_COMMAND_EXECUTION_STATUS,
                    size_of::<cl_int>(),
                    (&raw mut status).cast(),
                    ptr::null_mut(),
                )
            };
            if code != CL_SUCCESS || status < 0 {
                return Err("the application's queued work failed".into());
            }
            if status == CL_COMPLETE {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the application's queued work did not finish within {} s",
                    DRAIN_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    fn release_event(&self, event: cl_event) {
        // SAFETY: an event of ours, released once.
        unsafe { (self.calls.release_event)(event) };
    }
}

pub(super) unsafe extern "C" fn create_command_queue(
    context: cl_context,
    device: cl_device_id,
    properties: u64,
    errcode_ret: *mut cl_int,
) -> cl_command_queue {
    let launches = &layer().launches;
    // SAFETY: the application's call, passed on.
    launches.track(unsafe { (launches.calls.create)(context, device, properties, errcode_ret) })
}

pub(super) unsafe extern "C" fn create_command_queue_with_properties(
    context: cl_context,
    device: cl_device_id,
    properties: *const u64,
    errcode_ret: *mut cl_int,
) -> cl_command_queue {
    let launches = &layer().launches;
    // SAFETY: the application's call, passed on.
    launches.track(unsafe {
        (launches.calls.create_with_properties)(context, device, properties, errcode_ret)
    })
}

pub(super) unsafe extern "C" fn retain_command_queue(queue: cl_command_queue) -> cl_int {
    let launches = &layer().launches;
    let mut queues = launches.queues();
    // SAFETY: the application's call, passed on.
    let code = unsafe { (launches.calls.retain)(queue) };
    if code == CL_SUCCESS {
        launches.count(&mut queues, queue, 1);
    }
    code
}

pub(super) unsafe extern "C" fn release_command_queue(queue: cl_command_queue) -> cl_int {
    let launches = &layer().launches;
    let mut queues = launches.queues();
    // SAFETY: the application's call, passed on.
    let code = unsafe { (launches.calls.release)(queue) };
    if code == CL_SUCCESS && launches.count(&mut queues, queue, -1) {
        // The application's last: the layer's own reference goes too (the list no longer has
        // the queue, so no drain marks it).
        // SAFETY: the reference `track` took.
        unsafe { (launches.calls.release)(queue) };
    }
    code
}

pub(super) unsafe extern "C" fn enqueue_nd_range_kernel(
    queue: cl_command_queue,
    kernel: cl_kernel,
    work_dim: cl_uint,
    offset: *const usize,
    global: *const usize,
    local: *const usize,
    num_events: cl_uint,
    wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    // SAFETY: the application's call, passed on.
    through_gate(|calls| unsafe {
        (calls.nd_range)(
            queue, kernel, work_dim, offset, global, local, num_events, wait_list, event,
        )
    })
}

pub(super) unsafe extern "C" fn enqueue_task(
    queue: cl_command_queue,
    kernel: cl_kernel,
    num_events: cl_uint,
    wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    // SAFETY: the application's call, passed on.
    through_gate(|calls| unsafe { (calls.task)(queue, kernel, num_events, wait_list, event) })
}

/// A launch: `call` on the next table, past the gate.
fn through_gate(call: impl FnOnce(&QueueCalls) -> cl_int) -> cl_int {
    let launches = &layer().launches;
    let _open = launches.gate.read().unwrap_or_else(PoisonError::into_inner);
    call(&launches.calls)
}

/// [`Launches::quiet`] of the layer, as the OpenCL cache asks for it.
pub(super) fn quiet(query: &mut dyn FnMut()) -> Result<(), String> {
    layer().launches.quiet(query)
}
