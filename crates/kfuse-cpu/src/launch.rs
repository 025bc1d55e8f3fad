//! Running a compiled kernel over the thread pool.

use std::ffi::c_void;

use kfuse_ir::Storage;
use kfuse_kernel::Kernel;

use crate::{CompiledKernel, Pool};

/// Work below this many elements runs on the calling thread: splitting costs more than it saves
/// (roughly 50 us of memory-bound work on one core).
pub const GRAIN: usize = 1 << 16;

/// A raw pointer to a buffer.
pub fn storage_ptr(s: &Storage) -> *mut c_void {
    kfuse_ir::with_storage!(s, v => v.as_ptr() as *mut c_void)
}

struct ArgPtrs(Vec<*mut c_void>);
// SAFETY: the pointers address buffers that outlive the launch; tasks write disjoint elements
// (each store writes its output at the output's own index, a one-to-one function of the loop
// indices, and tasks get disjoint index ranges).
unsafe impl Send for ArgPtrs {}
unsafe impl Sync for ArgPtrs {}

impl ArgPtrs {
    fn get(&self) -> *const *mut c_void {
        self.0.as_ptr()
    }
}

/// Runs `compiled` (rendered from `kernel`) over its whole domain on the global pool.
/// `args[i]` is the buffer of kernel argument `i`, sized as the kernel declares.
pub fn launch(kernel: &Kernel, compiled: &CompiledKernel, args: Vec<*mut c_void>) {
    launch_on(Pool::global(), kernel, compiled, args)
}

/// As [`launch`], on `pool`. Kernels without reductions split their inner range into chunks;
/// kernels with reductions split their outer range into blocks of rows.
pub fn launch_on(pool: &Pool, kernel: &Kernel, compiled: &CompiledKernel, args: Vec<*mut c_void>) {
    let f = compiled.function();
    let outer = kernel.outer_len();
    let inner = kernel.inner_len();
    let ptrs = ArgPtrs(args);
    let call = |o: std::ops::Range<usize>, j: std::ops::Range<usize>| {
        // SAFETY: see `ArgPtrs`; ranges are within the kernel's domain.
        unsafe {
            f(
                ptrs.get(),
                o.start as i64,
                o.end as i64,
                j.start as i64,
                j.end as i64,
            )
        }
    };
    let threads = pool.threads();
    let work = outer.saturating_mul(inner.max(1));
    if work < 2 * GRAIN || threads == 1 {
        call(0..outer, 0..inner);
    } else if !kernel.has_reductions() && outer == 1 {
        let chunk = (inner / (4 * threads)).max(GRAIN).next_multiple_of(64);
        pool.run(inner.div_ceil(chunk), &|t| {
            call(0..1, t * chunk..((t + 1) * chunk).min(inner))
        });
    } else {
        let rows = (outer / (4 * threads)).max(GRAIN / inner.max(1)).max(1);
        pool.run(outer.div_ceil(rows), &|t| {
            call(t * rows..((t + 1) * rows).min(outer), 0..inner)
        });
    }
}
