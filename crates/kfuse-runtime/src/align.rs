//! Cache-line alignment for large buffers.
//!
//! Tensors live in `Vec`s, which the system allocator places 16 bytes past a page boundary once
//! they are large (glibc serves them from `mmap` behind a 16-byte header). Every 64-byte vector
//! access to such a buffer then spans two cache lines. Row kernels that prefetch their next row
//! lose most of the gain.
//!
//! [`CacheAligned`] is a global allocator that aligns every allocation of 64 KiB or more to a
//! cache line, and of 4 MiB or more to 2 MiB with transparent huge pages advised, and leaves
//! the others to the system allocator as they are. Huge pages leave fused kernels in steady
//! state as fast as before, but fresh buffers fault in far fewer pages, which speeds up the
//! reference interpreter (it allocates every intermediate anew); the price is the occasional
//! first touch that waits for the kernel to compact memory. The measurements are in
//! `docs/structured-ops.md` ("Measurements behind design choices") and `docs/benchmarks.md`
//! ("How to measure", the allocator). A program opts in with
//! `#[global_allocator] static ALLOC: kfuse::CacheAligned = kfuse::CacheAligned;`; the `kfuse`
//! command-line tool does. Kernels are correct at any alignment; this is only about speed,
//! and the kernels that stream their outputs align their own stores: the generated kernels
//! after a scalar head, the direct convolution's pointwise columns after a partial block up to
//! the next line.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations from this size up are aligned to [`LINE`].
pub const LARGE: usize = 64 << 10;

/// The cache line size aligned to.
pub const LINE: usize = 64;

/// Allocations from this size up are aligned to [`HUGE_PAGE`] and asked to be backed by
/// transparent huge pages (`madvise(MADV_HUGEPAGE)`, which Linux honours where THP is set to
/// `madvise` or `always`).
pub const HUGE: usize = 4 << 20;

/// The huge page size aligned to.
pub const HUGE_PAGE: usize = 2 << 20;

/// The system allocator, with allocations of 64 KiB or more aligned to a 64-byte cache line
/// (and of 4 MiB or more to a 2 MiB huge page).
pub struct CacheAligned;

/// The layout actually requested from the system for `layout`: a pure function of it, so that
/// deallocation passes the system the layout it allocated with.
fn widened(layout: Layout) -> Layout {
    if layout.size() >= HUGE && layout.align() < HUGE_PAGE {
        // Cannot fail, as below.
        Layout::from_size_align(layout.size(), HUGE_PAGE).unwrap_or(layout)
    } else if layout.size() >= LARGE && layout.align() < LINE {
        // Cannot fail: LINE is a power of two and the size already fit a valid layout.
        Layout::from_size_align(layout.size(), LINE).unwrap_or(layout)
    } else {
        layout
    }
}

// SAFETY: every block is allocated and freed through `System` with `widened(layout)`, which
// depends only on the layout the caller passes, which Rust guarantees to be the same at
// allocation and deallocation; the widened layout has at least the requested size and alignment.
unsafe impl GlobalAlloc for CacheAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let wide = widened(layout);
        // SAFETY: forwarded with a layout of the same nonzero size.
        let block = unsafe { System.alloc(wide) };
        advise(block, wide);
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let wide = widened(layout);
        if wide.align() < HUGE_PAGE {
            // SAFETY: as `alloc`.
            return unsafe { System.alloc_zeroed(wide) };
        }
        // The advice must come before the first write, which zeroing is (the system allocator
        // zeroes blocks this aligned by writing them).
        // SAFETY: as `alloc`; the block, if any, holds `wide.size()` bytes.
        unsafe {
            let block = System.alloc(wide);
            advise(block, wide);
            if !block.is_null() {
                std::ptr::write_bytes(block, 0, wide.size());
            }
            block
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `alloc` with `widened(layout)`.
        unsafe { System.dealloc(ptr, widened(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        let (old, new) = (widened(layout), widened(new_layout));
        if old.align() == new.align() {
            // SAFETY: `ptr` was allocated with `old`; the system keeps its alignment.
            let block = unsafe { System.realloc(ptr, old, new_size) };
            advise(block, new);
            return block;
        }
        // Crossing LARGE changes the alignment the block must have: move it.
        // SAFETY: `new` has a nonzero size; both blocks are valid for the bytes copied, and
        // `ptr` was allocated with `old`.
        unsafe {
            let moved = System.alloc(new);
            advise(moved, new);
            if !moved.is_null() {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                System.dealloc(ptr, old);
            }
            moved
        }
    }
}

/// Asks Linux to back `block` (allocated with `layout`) with transparent huge pages, if the
/// layout is [`HUGE_PAGE`]-aligned; advice only, so a refusal changes nothing. A 4096 x 4096
/// f32 matrix spans 16384 pages of 4 KiB, more than the second-level TLB holds, so kernels
/// that read it across rows (a fused transpose) walked the page tables about once every 16
/// elements; in 2 MiB pages it spans 32.
fn advise(block: *mut u8, layout: Layout) {
    #[cfg(target_os = "linux")]
    if !block.is_null() && layout.align() >= HUGE_PAGE {
        // SAFETY: the range is the block just allocated; MADV_HUGEPAGE changes no contents.
        unsafe {
            libc::madvise(block.cast(), layout.size(), libc::MADV_HUGEPAGE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (block, layout);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Large blocks are line-aligned, also after growing across the threshold, and contents
    /// survive growing and shrinking across it.
    #[test]
    fn large_blocks_are_line_aligned_through_growth_and_shrinking() {
        let a = CacheAligned;
        for size in [LARGE - 1, LARGE, LARGE + 12, HUGE - 1, HUGE, 64 << 20] {
            let layout = Layout::from_size_align(size, 4).unwrap();
            // SAFETY: nonzero size; every block is freed or reallocated with its layout.
            unsafe {
                let p = a.alloc(layout);
                assert!(!p.is_null());
                if size >= LARGE {
                    assert_eq!(p as usize % LINE, 0, "{size} bytes");
                }
                if size >= HUGE {
                    assert_eq!(p as usize % HUGE_PAGE, 0, "{size} bytes");
                }
                p.write_bytes(0x5a, size);
                let grown = a.realloc(p, layout, size * 2);
                assert!(!grown.is_null());
                assert_eq!(grown as usize % LINE, 0, "{size} bytes grown");
                if size * 2 >= HUGE {
                    assert_eq!(grown as usize % HUGE_PAGE, 0, "{size} bytes grown");
                }
                assert!((0..size).all(|i| *grown.add(i) == 0x5a));
                let big = Layout::from_size_align(size * 2, 4).unwrap();
                let shrunk = a.realloc(grown, big, 100);
                assert!(!shrunk.is_null());
                assert!((0..100).all(|i| *shrunk.add(i) == 0x5a));
                a.dealloc(shrunk, Layout::from_size_align(100, 4).unwrap());
            }
        }
    }

    /// Zeroed huge blocks are zero (the advice comes before the allocator's zeroing write).
    #[test]
    fn zeroed_huge_blocks_are_zero() {
        let a = CacheAligned;
        let layout = Layout::from_size_align(HUGE + 4096, 4).unwrap();
        // SAFETY: nonzero size; freed with its layout.
        unsafe {
            let p = a.alloc_zeroed(layout);
            assert!(!p.is_null());
            assert_eq!(p as usize % HUGE_PAGE, 0);
            assert!((0..layout.size()).step_by(997).all(|i| *p.add(i) == 0));
            a.dealloc(p, layout);
        }
    }
}
