//! The core's kernels on the host's cores: [`Threads`] hands a kernel's independent pieces
//! (the row blocks of a large matrix product) to rayon, so that one simulated step uses every
//! core of the machine running it. Results are the same bit for bit as on one thread: each
//! piece is computed exactly as it would be alone (see [`tessera_core::kernels::Parallel`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

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
        each_in_turn(
            out.chunks_mut(piece).enumerate(),
            || (),
            |_, (i, p)| job(i, p),
        );
    }
}

/// Runs `f` on every item of `items` on the current rayon pool: the calling thread starts at
/// once and as many of the pool's other workers as there are items left join in, each taking
/// the next item left, one at a time, with a state of its own that `init` makes when it takes
/// its first. Items of very different lengths balance: a worker that finishes early takes
/// more, rather than waiting on another's share. The results come in no set order (pair them
/// with an index to put them back).
pub(crate) fn each_in_turn<I, W, R>(
    items: I,
    init: impl Fn() -> W + Sync,
    f: impl Fn(&mut W, I::Item) -> R + Sync,
) -> Vec<R>
where
    I: ExactSizeIterator + Send,
    R: Send,
{
    let helpers = rayon::current_num_threads()
        .min(items.len())
        .saturating_sub(1);
    let left = Mutex::new(items);
    let done = Mutex::new(Vec::new());
    let work = || {
        let mut state = None;
        let mut mine = Vec::new();
        loop {
            let next = left.lock().unwrap_or_else(PoisonError::into_inner).next();
            let Some(item) = next else { break };
            mine.push(f(state.get_or_insert_with(&init), item));
        }
        done.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(mine);
    };
    rayon::in_place_scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| work());
        }
        work();
    });
    done.into_inner().unwrap_or_else(PoisonError::into_inner)
}

/// How long an awake helper polls without finding a piece before it goes back to sleep: far
/// longer than the gaps between a weight update's products (tens of microseconds measured on
/// a 2-core host), short enough that a helper never holds its thread for long when nothing
/// comes. An estimate, not a tuned figure.
pub const HELPER_IDLE_MAX: Duration = Duration::from_millis(1);

thread_local! {
    /// Whether this thread is already polling for pieces (a second poller on it would only
    /// nest inside the first).
    static POLLING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `work` on the calling thread while the other workers of the current rayon pool stay
/// awake, looking for pieces to take (yielding the core to other runnable threads while none
/// are left). A sleeping worker takes tens of microseconds to wake on a virtual machine, as
/// long as a piece of a mid-sized product; awake, it takes its pieces at once. Use it around
/// a burst of work with products to share, not around waiting.
///
/// A helper stops when `work` returns, or after [`HELPER_IDLE_MAX`] without a piece: a worker
/// that picked up a helper's job while it waited for something else (a nested join, another
/// burst on the same pool) gets its thread back. The calling thread never polls.
pub fn with_helpers_awake<R>(work: impl FnOnce() -> R) -> R {
    if rayon::current_num_threads() < 2 {
        return work();
    }
    let done = AtomicBool::new(false);
    let caller = rayon::current_thread_index();
    rayon::in_place_scope(|s| {
        // One poller per worker of the pool (the caller's returns at once).
        s.spawn_broadcast(|_, _| {
            let on_caller = caller.is_some() && rayon::current_thread_index() == caller;
            if on_caller || POLLING.get() {
                return;
            }
            // Cleared however the loop ends (a piece's panic unwinds through it).
            struct Polling;
            impl Drop for Polling {
                fn drop(&mut self) {
                    POLLING.set(false);
                }
            }
            POLLING.set(true);
            let _polling = Polling;
            let mut idle_since: Option<Instant> = None;
            while !done.load(Ordering::Acquire) {
                if let Some(rayon::Yield::Executed) = rayon::yield_now() {
                    idle_since = None;
                    continue;
                }
                if idle_since.get_or_insert_with(Instant::now).elapsed() > HELPER_IDLE_MAX {
                    break;
                }
                std::thread::yield_now();
            }
        });
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
    use tessera_core::kernels::{matmul, matmul_on, store, Product, Serial};
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
    fn helpers_go_back_to_sleep_and_never_hold_up_their_caller() {
        // From a pool's worker, from outside any pool, nested, and with a rayon join inside
        // the work that keeps a worker waiting: every call returns, with the work's value.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("a pool");
        let sum = |n: u64| -> u64 {
            let (a, b) = rayon::join(|| (0..n).sum::<u64>(), || (n..2 * n).sum::<u64>());
            a + b
        };
        assert_eq!(pool.install(|| with_helpers_awake(|| sum(1000))), 1_999_000);
        assert_eq!(with_helpers_awake(|| sum(10)), 190);
        let nested = pool.install(|| with_helpers_awake(|| with_helpers_awake(|| sum(100)) + 1));
        assert_eq!(nested, 19_901);
        // Two bursts at once on one pool, each waiting inside a join.
        let (a, b) = pool.install(|| {
            rayon::join(
                || with_helpers_awake(|| sum(50)),
                || with_helpers_awake(|| sum(60)),
            )
        });
        assert_eq!((a, b), (4950, 7140));
    }

    #[test]
    fn each_in_turn_runs_every_item_once_with_a_state_per_worker() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("a pool");
        // Each worker's state counts the items it took; the counts add up to the items.
        let made = std::sync::atomic::AtomicUsize::new(0);
        let mut got = pool.install(|| {
            each_in_turn(
                (0..1000u32).enumerate(),
                || {
                    made.fetch_add(1, Ordering::Relaxed);
                    0usize
                },
                |taken, (k, x)| {
                    *taken += 1;
                    (k, x * x, *taken)
                },
            )
        });
        got.sort_unstable();
        assert_eq!(got.len(), 1000);
        assert!(got
            .iter()
            .enumerate()
            .all(|(k, &(i, sq, _))| i == k && sq == (k * k) as u32));
        assert!((1..=3).contains(&made.load(Ordering::Relaxed)));
        assert!(each_in_turn(std::iter::empty::<u8>(), || (), |_, x| x).is_empty());
    }

    #[test]
    fn threaded_products_are_the_serial_ones_bit_for_bit() {
        // The wide kernels where the CPU has them (`tests/kernels.rs` checks those against the
        // plain loop with fused terms): pieces of a transposed A read it with the whole
        // matrix's stride.
        crate::use_fast_kernels();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("a pool");
        // Large enough to be cut; rows not a multiple of the pieces or the register tile.
        for &(m, k, n) in &[(101, 64, 70), (32, 784, 256), (9, 512, 128)] {
            let (a, b) = (operand(m * k, 7919), operand(k * n, 104_729));
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let p = Product { m, k, n, ta, tb };
                let mut want = vec![0u8; 4 * m * n];
                matmul(&a, &b, DType::F32, &mut want, p);
                let mut serial = vec![0u8; 4 * m * n];
                matmul_on(&Serial, &a, &b, DType::F32, &mut serial, p);
                let mut got = vec![0u8; 4 * m * n];
                pool.install(|| {
                    matmul_on(&Threads, &a, &b, DType::F32, &mut got, p);
                });
                assert!(want == serial, "({m}, {k}, {n}) ta={ta} tb={tb}: serial");
                assert!(want == got, "({m}, {k}, {n}) ta={ta} tb={tb}: threads");
            }
        }
    }
}
