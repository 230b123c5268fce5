//! The core's kernels on the host's cores: [`Threads`] hands a kernel's independent pieces
//! (the row blocks of a large matrix product) to rayon, so that one simulated step uses every
//! core of the machine running it. Results are the same bit for bit as on one thread: each
//! piece is computed exactly as it would be alone (see [`tessera_core::kernels::Parallel`]).

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
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
