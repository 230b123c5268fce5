//! An allocator for the `tessera` command: the system's, with large blocks backed by
//! transparent huge pages where the machine offers them.
//!
//! An estimate of a large model holds gigabytes of tile mappings, vertices and lowering
//! records, most of them in blocks of megabytes. With 4 KiB pages the kernel takes one page
//! fault per 4 KiB the first time each is touched: DenseNet-121 training at batch 8 took about
//! 550,000 of them (its whole 2.1 GB peak), a fifth of the estimate's CPU time, and more on a
//! virtual machine. Transparent huge pages take one fault per 2 MiB.
//!
//! Most Linux systems set transparent huge pages to `madvise` (used only where a program
//! asks for them), so this allocator asks for them, with `madvise(MADV_HUGEPAGE)`, on the
//! whole 2 MiB pages inside every block of [`ADVISED_FROM`] bytes or more. Smaller blocks and
//! the allocator itself are the system's (glibc's malloc on Linux). Where transparent huge
//! pages are `never`, or off Linux, the advice is not given or is ignored, and this is the
//! system's allocator. The advice never changes what a program computes, only how its memory
//! is paged.
//!
//! Install it in a binary with
//! `#[global_allocator] static ALLOCATOR: HugePages = HugePages;`.

// The allocator interface (`GlobalAlloc`) and `madvise` are unsafe: the blocks are the system
// allocator's, passed through unchanged, and the advice covers only whole pages inside a
// block this allocator has just handed out. Measured need: DenseNet-121 training at batch 8,
// `tessera estimate` (with the fewest-IPUs search), 6 runs each alternated on one 2-core
// machine: median 12.28 s with 4.44 s of system time on the system allocator, 10.33 s with
// 2.60 s on this one (page faults 630,000 -> 500,000).
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};

/// A transparent huge page on x86-64 and on 4 KiB-page AArch64.
pub const HUGE_PAGE: usize = 2 << 20;

/// Blocks of this many bytes or more are advised to be backed by huge pages: one huge page,
/// so that a block always could hold a whole one (smaller blocks never do, and the advice
/// would only cost a system call).
pub const ADVISED_FROM: usize = HUGE_PAGE;

/// The system allocator, with blocks of [`ADVISED_FROM`] bytes or more advised to be backed
/// by transparent huge pages (see the module's text).
#[derive(Clone, Copy, Debug, Default)]
pub struct HugePages;

/// The whole huge pages inside `size` bytes at `at`: (first, bytes), bytes 0 when none.
fn whole_pages(at: usize, size: usize) -> (usize, usize) {
    let Some(first) = at.checked_next_multiple_of(HUGE_PAGE) else {
        return (at, 0);
    };
    let end = at.saturating_add(size) / HUGE_PAGE * HUGE_PAGE;
    (first, end.saturating_sub(first))
}

/// Advises the kernel to back the whole huge pages of the block at `p` with huge pages.
fn advise(p: *mut u8, size: usize) {
    if p.is_null() || size < ADVISED_FROM {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        let (first, bytes) = whole_pages(p as usize, size);
        if bytes > 0 {
            // SAFETY: the range lies inside the block just handed out (mapped memory of this
            // process); the advice changes how it is paged, never its contents. A failure
            // (transparent huge pages not built in, say) leaves the pages as they were.
            unsafe {
                libc::madvise(first as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
            }
        }
    }
}

// SAFETY: every block comes from `System` with the caller's layout and goes back to it with
// the same layout; `advise` does not touch the block's contents.
unsafe impl GlobalAlloc for HugePages {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let p = unsafe { System.alloc(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with `layout` (see `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on; `ptr` came from `System`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        advise(p, new_size);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::{whole_pages, HUGE_PAGE};

    #[test]
    fn whole_pages_lie_inside_the_block() {
        // Aligned: all of it.
        assert_eq!(
            whole_pages(HUGE_PAGE, 2 * HUGE_PAGE),
            (HUGE_PAGE, 2 * HUGE_PAGE)
        );
        // Unaligned start: from the next boundary to the last one inside.
        assert_eq!(
            whole_pages(HUGE_PAGE + 16, 3 * HUGE_PAGE),
            (2 * HUGE_PAGE, 2 * HUGE_PAGE)
        );
        // No whole page inside.
        assert_eq!(whole_pages(HUGE_PAGE + 16, HUGE_PAGE).1, 0);
        assert_eq!(whole_pages(16, 100).1, 0);
        // At the end of the address space: nothing, no overflow.
        assert_eq!(whole_pages(usize::MAX - 10, 100).1, 0);
    }

    /// Blocks of every size keep their contents through the allocator, growing and shrinking
    /// across the threshold, zeroed ones zero.
    #[test]
    fn blocks_keep_their_contents() {
        use std::alloc::{GlobalAlloc, Layout};
        let a = super::HugePages;
        for &size in &[8usize, 4096, HUGE_PAGE - 8, HUGE_PAGE, 3 * HUGE_PAGE + 24] {
            let layout = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: a non-zero layout; the block is written within its size, grown with
            // the same layout and freed with the grown one.
            unsafe {
                let p = a.alloc_zeroed(layout);
                assert!(!p.is_null());
                assert!(
                    (0..size).all(|i| *p.add(i) == 0),
                    "zeroed block of {size} bytes"
                );
                for i in 0..size {
                    *p.add(i) = (i % 251) as u8;
                }
                let grown = 2 * size + HUGE_PAGE;
                let q = a.realloc(p, layout, grown);
                assert!(!q.is_null());
                assert!(
                    (0..size).all(|i| *q.add(i) == (i % 251) as u8),
                    "{size} bytes kept"
                );
                a.dealloc(q, Layout::from_size_align(grown, 8).unwrap());
            }
        }
    }
}
