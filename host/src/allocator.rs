//! The allocator of the `tessera` command, the estimate benches and the Python package:
//! mimalloc, with large blocks backed by transparent huge pages where the machine offers
//! them.
//!
//! **mimalloc.** An estimate of a large model makes and frees tens of millions of short lists
//! on several threads at once: each vertex's regions (two lists per vertex, a vertex per tile
//! and compute set), the spans of each reduction and product, the planner's candidate splits.
//! DenseNet-121 training at batch 8 makes about 16 million allocations. Under glibc's malloc,
//! whose per-thread cache holds 7 blocks of a size, most of them go past it into its arenas'
//! bins (`_int_malloc`, `malloc_consolidate`, `unlink_chunk`: about 14 % of the estimate's
//! CPU samples); a thread-caching allocator serves them from per-thread free lists. Measured
//! on that estimate (`tessera estimate`, with the fewest-IPUs search) on one 2-core machine:
//! jemalloc took a median of 7.93 s against glibc's 9.29 s (5 alternated rounds) for 7 % more
//! peak memory; mimalloc runs within the noise of jemalloc (medians of 22.8 s and 21.5 s in a
//! test build, 4 alternated rounds, spread ±10 %) for 13 % more peak memory (2.42 against
//! 2.13 GB). mimalloc is one C file, built in seconds on every target (MSVC's included), where
//! jemalloc's `configure` and `make` took over three minutes of every fresh build of the
//! command and of the Python package.
//!
//! **Huge pages.** An estimate of a large model holds gigabytes of tile mappings, vertices and
//! lowering records, most of them in blocks of megabytes. With 4 KiB pages the kernel takes
//! one page fault per 4 KiB the first time each is touched: DenseNet-121 training at batch 8
//! took about 550,000 of them (its whole 2.1 GB peak at the time), a fifth of the estimate's
//! CPU time, and more on a virtual machine. Transparent huge pages take one fault per 2 MiB.
//! Most Linux systems set transparent huge pages to `madvise` (used only where a program asks
//! for them), so [`HugePages`] asks for them, with `madvise(MADV_HUGEPAGE)`, on the whole
//! 2 MiB pages inside every block of [`ADVISED_FROM`] bytes or more. Where transparent huge
//! pages are `never`, or off Linux, the advice is not given or is ignored. The advice never
//! changes what a program computes, only how its memory is paged.
//!
//! **Exhaustion.** When the base allocator cannot give a block (an estimate larger than the
//! memory the process may use: `ulimit -v`, a cgroup, a Slurm job's limit), Rust's default is
//! to abort with a signal. This allocator instead prints one `error:` line naming the size
//! asked for and what to do, and exits with status 1, as every other failure of the command
//! does. Code that handles a failed allocation itself (`Vec::try_reserve`) runs in
//! [`fallibly`], where a failure is returned to it as usual.
//!
//! Install it in a binary with
//! `#[global_allocator] static ALLOCATOR: Allocator = ALLOCATOR;` (this module's
//! [`Allocator`] and [`ALLOCATOR`]). A library loaded with `dlopen` (the Python package's
//! extension) builds mimalloc with local-dynamic thread-local storage (its
//! `local_dynamic_tls` feature) rather than initial-exec, as a loaded library must.

// The allocator interface (`GlobalAlloc`) and `madvise` are unsafe: the blocks are the base
// allocator's, passed through unchanged, and the advice covers only whole pages inside a
// block this allocator has just handed out. Measured need: DenseNet-121 training at batch 8,
// `tessera estimate` (with the fewest-IPUs search), 6 runs each alternated on one 2-core
// machine: median 12.28 s with 4.44 s of system time on the system allocator, 10.33 s with
// 2.60 s with the advice (page faults 630,000 -> 500,000).
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;

thread_local! {
    /// Whether this thread is in [`fallibly`]: a failed allocation is returned, not fatal.
    static FALLIBLE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with failed allocations returned to it (for `Vec::try_reserve` and the like)
/// rather than ending the process (see the module's text).
pub fn fallibly<T>(f: impl FnOnce() -> T) -> T {
    let before = FALLIBLE.with(|c| c.replace(true));
    let out = f();
    FALLIBLE.with(|c| c.set(before));
    out
}

/// Ends the process after a failed allocation of `size` bytes outside [`fallibly`]: one
/// `error:` line on stderr and exit status 1. Writes with no allocation (the allocator has
/// none to give) and exits without unwinding or running destructors that might allocate.
fn exhausted(size: usize) -> ! {
    const BEFORE: &[u8] = b"error: out of memory: an allocation of ";
    const AFTER: &[u8] = b" bytes failed; the estimate needs more memory than this process may use (ulimit -v, the job's memory limit): give it more, or estimate a smaller configuration\n";
    // The size in decimal, from the right of a stack buffer.
    let mut digits = [0u8; 20];
    let (mut n, mut at) = (size, digits.len());
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    #[cfg(unix)]
    // SAFETY: writes constant and stack buffers to the standard error descriptor, then ends
    // the process; neither touches the heap.
    unsafe {
        libc::write(2, BEFORE.as_ptr().cast(), BEFORE.len());
        libc::write(2, digits[at..].as_ptr().cast(), digits.len() - at);
        libc::write(2, AFTER.as_ptr().cast(), AFTER.len());
        libc::_exit(1);
    }
    #[cfg(not(unix))]
    std::process::abort()
}

/// `p`, checked: a null block (outside [`fallibly`]) ends the process ([`exhausted`]).
fn checked(p: *mut u8, size: usize) -> *mut u8 {
    if p.is_null() && size > 0 && !FALLIBLE.with(Cell::get) {
        exhausted(size);
    }
    p
}

/// The allocator blocks come from: mimalloc.
pub type Base = mimalloc::MiMalloc;

/// The allocator of the `tessera` command (see the module's text).
pub type Allocator = HugePages<Base>;

/// The allocator of the `tessera` command, to install as the global allocator.
pub const ALLOCATOR: Allocator = HugePages(mimalloc::MiMalloc);

/// A transparent huge page on x86-64 and on 4 KiB-page AArch64.
pub const HUGE_PAGE: usize = 2 << 20;

/// Blocks of this many bytes or more are advised to be backed by huge pages: one huge page,
/// so that a block always could hold a whole one (smaller blocks never do, and the advice
/// would only cost a system call).
pub const ADVISED_FROM: usize = HUGE_PAGE;

/// The allocator `A`, with blocks of [`ADVISED_FROM`] bytes or more advised to be backed by
/// transparent huge pages (see the module's text).
#[derive(Clone, Copy, Debug, Default)]
pub struct HugePages<A>(pub A);

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

// SAFETY: every block comes from `A` with the caller's layout and goes back to it with the
// same layout; `advise` does not touch the block's contents.
unsafe impl<A: GlobalAlloc> GlobalAlloc for HugePages<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let p = checked(unsafe { self.0.alloc(layout) }, layout.size());
        advise(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        let p = checked(unsafe { self.0.alloc_zeroed(layout) }, layout.size());
        advise(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `A` with `layout` (see `alloc`).
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on; `ptr` came from `A`.
        let p = checked(unsafe { self.0.realloc(ptr, layout, new_size) }, new_size);
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

    /// Blocks of every size keep their contents through `a`, grown across the threshold and
    /// shrunk back, zeroed ones zero.
    fn keeps_contents(a: &impl std::alloc::GlobalAlloc) {
        use std::alloc::Layout;
        for &size in &[8usize, 4096, HUGE_PAGE - 8, HUGE_PAGE, 3 * HUGE_PAGE + 24] {
            let layout = Layout::from_size_align(size, 8).unwrap();
            let grown = 2 * size + HUGE_PAGE;
            // SAFETY: a non-zero layout; the block is written within its size, grown with
            // the same layout, shrunk with the grown one and freed with its own.
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
                let q = a.realloc(p, layout, grown);
                assert!(!q.is_null());
                assert!(
                    (0..size).all(|i| *q.add(i) == (i % 251) as u8),
                    "{size} bytes kept when grown"
                );
                let r = a.realloc(q, Layout::from_size_align(grown, 8).unwrap(), size);
                assert!(!r.is_null());
                assert!(
                    (0..size).all(|i| *r.add(i) == (i % 251) as u8),
                    "{size} bytes kept when shrunk back"
                );
                a.dealloc(r, layout);
            }
        }
    }

    #[test]
    fn blocks_keep_their_contents_on_the_system_allocator() {
        keeps_contents(&super::HugePages(std::alloc::System));
    }

    #[test]
    fn blocks_keep_their_contents_on_the_commands_allocator() {
        keeps_contents(&super::ALLOCATOR);
    }
}
