//! The examples' global allocator: every allocation aligned to a cache line, as the `kfuse`
//! binary's allocator (`kfuse::CacheAligned`) aligns large ones. A buffer 16 bytes off a line
//! (where glibc places large ones) would make every vector load of a kernel span two lines, and
//! the direct kernels stream their output only to whole aligned lines.

use std::alloc::{GlobalAlloc, Layout, System};

/// The system allocator, every layout widened to 64-byte alignment.
pub struct LineAligned;

// SAFETY: forwards to the system allocator with a stricter alignment, the same on both sides.
unsafe impl GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: a valid layout, widened to a larger power-of-two alignment.
        unsafe { System.alloc(layout.align_to(64).unwrap()) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: allocated above with this widened layout.
        unsafe { System.dealloc(ptr, layout.align_to(64).unwrap()) }
    }
}

#[global_allocator]
static ALLOC: LineAligned = LineAligned;
