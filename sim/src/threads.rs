//! The core's kernels on the host's cores: [`Threads`] hands a kernel's independent pieces
//! (the row blocks of a large matrix product) to rayon, so that one simulated step uses every
//! core of the machine running it. Results are the same bit for bit as on one thread: each
//! piece is computed exactly as it would be alone (see [`tessera_core::kernels::Parallel`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use tessera_core::kernels::Parallel;

/// Runs pieces on the current rayon pool: the pool whose worker calls it, or else the global
/// pool. The calling thread starts on the pieces at once and the pool's other workers join in
/// as they come, each taking the next piece left: a worker that wakes late (tens of
/// microseconds on a virtual machine) takes fewer pieces rather than holding up the rest.
#[derive(Clone, Copy, Debug, Default)]
pub struct Threads;

impl Parallel for Threads {
    fn threads(&self) -> usize {
        rayon::current_num_threads()
    }

    fn for_each_piece(
        &self,
        out: &mut [u8],
        piece: usize,
        job: &(dyn Fn(usize, &mut [u8]) + Sync),
    ) {
        let piece = piece.max(1);
        let helpers = self
            .threads()
            .min(out.len().div_ceil(piece))
            .saturating_sub(1);
        let left = Mutex::new(out.chunks_mut(piece).enumerate());
        let work = || loop {
            let next = left.lock().unwrap_or_else(PoisonError::into_inner).next();
            let Some((i, p)) = next else { break };
            job(i, p);
        };
        rayon::in_place_scope(|s| {
            for _ in 0..helpers {
                s.spawn(|_| work());
            }
            work();
        });
    }
}

/// Runs `work` on the calling thread while the other workers of the current rayon pool stay
/// awake, looking for pieces to take (yielding the core to other runnable threads while none
/// are left). A sleeping worker takes tens of microseconds to wake on a virtual machine, as
/// long as a piece of a mid-sized product; awake, it takes its pieces at once. Use it around
/// a burst of work with products to share, not around waiting.
pub fn with_helpers_awake<R>(work: impl FnOnce() -> R) -> R {
    let helpers = rayon::current_num_threads().saturating_sub(1);
    if helpers == 0 {
        return work();
    }
    let done = AtomicBool::new(false);
    let caller = rayon::current_thread_index();
    rayon::in_place_scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| {
                // Waiting in a nested scope, the calling thread may run a spinner itself: it
                // must not spin, or it would wait for itself.
                if caller.is_some() && rayon::current_thread_index() == caller {
                    return;
                }
                while !done.load(Ordering::Acquire) {
                    match rayon::yield_now() {
                        Some(rayon::Yield::Executed) => {}
                        _ => std::thread::yield_now(),
                    }
                }
            });
        }
        // Stop the helpers even if `work` panics.
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let _done = Done(&done);
        work()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::kernels::{matmul, matmul_on, store, Serial};
    use tessera_core::DType;

    /// Operands whose sums round differently in any other order.
    fn operand(len: usize, salt: usize) -> Vec<u8> {
        let mut v = vec![0u8; 4 * len];
        for i in 0..len {
            let x = ((i * salt) % 1000) as f32 - 500.0;
            store(&mut v, DType::F32, i, x / 97.0);
        }
        v
    }

    #[test]
    fn threaded_products_are_the_serial_ones_bit_for_bit() {
        // The wide kernels where the CPU has them (`tests/kernels.rs` checks those against the
        // portable ones): pieces of a transposed A read it with the whole matrix's stride.
        crate::use_fast_kernels();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("a pool");
        // Large enough to be cut; rows not a multiple of the pieces or the register tile.
        for &(m, k, n) in &[(101, 64, 70), (32, 784, 256), (9, 512, 128)] {
            let (a, b) = (operand(m * k, 7919), operand(k * n, 104_729));
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let mut want = vec![0u8; 4 * m * n];
                matmul(&a, &b, DType::F32, &mut want, m, k, n, ta, tb);
                let mut serial = vec![0u8; 4 * m * n];
                matmul_on(&Serial, &a, &b, DType::F32, &mut serial, m, k, n, ta, tb);
                let mut got = vec![0u8; 4 * m * n];
                pool.install(|| {
                    matmul_on(&Threads, &a, &b, DType::F32, &mut got, m, k, n, ta, tb);
                });
                assert!(want == serial, "({m}, {k}, {n}) ta={ta} tb={tb}: serial");
                assert!(want == got, "({m}, {k}, {n}) ta={ta} tb={tb}: threads");
            }
        }
    }
}
