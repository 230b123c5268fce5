//! A cache of lowered IPU programs, for sweeps.
//!
//! A sweep estimates many configurations that lower the same IPU programs: the gradient
//! accumulation count, the schedule and the replicas change how the stages' costs combine,
//! not what each IPU runs. With the cache on ([`set_lowering_cache`]), [`estimate_system`]
//! keeps the last few lowered programs (least recently used goes first) and reuses one when
//! everything lowering reads is the same: the graph's nodes (ops, shapes, types, roles,
//! names, stages), the plan's slots, the IPU's stages, the machine and the lowering options.
//! Those are fingerprinted from their full `Debug` text with a 128-bit hash (two SipHash
//! passes with different keys), so a reused program is the one lowering would give. The
//! cache is off by default: one estimate gains nothing from it.
//!
//! [`estimate_system`]: crate::system::estimate_system

use std::collections::VecDeque;
use std::fmt::{self, Write as _};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use tessera_core::{Plan, Storage};

use crate::exchange::Summaries;
use crate::lower::LowerOptions;
use crate::machine::IpuConfig;
use crate::program::Program;

/// A lowered IPU program and its exchanges' summaries.
pub(crate) type Lowered = Arc<(Program, Summaries)>;

/// A cache entry: the program once lowered.
type Slot = Arc<OnceLock<Lowered>>;

struct Cache {
    capacity: usize,
    /// Most recently used last.
    entries: VecDeque<(u128, Slot)>,
    hits: u64,
    misses: u64,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

/// Keeps up to `capacity` lowered IPU programs for reuse by later estimates in this process;
/// 0 turns the cache off and empties it.
pub fn set_lowering_cache(capacity: usize) {
    let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    *c = (capacity > 0).then(|| Cache {
        capacity,
        entries: VecDeque::new(),
        hits: 0,
        misses: 0,
    });
}

/// How often the cache gave a program (hits) and how often one was lowered (misses) since it
/// was turned on.
pub fn lowering_cache_stats() -> (u64, u64) {
    let c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    c.as_ref().map_or((0, 0), |c| (c.hits, c.misses))
}

/// Whether the cache is on.
pub(crate) fn enabled() -> bool {
    CACHE.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}

/// Feeds `Debug` text into two hashers without building the string.
struct Feed<'a>(
    &'a mut std::hash::DefaultHasher,
    &'a mut std::hash::DefaultHasher,
);

impl fmt::Write for Feed<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        self.1.write(s.as_bytes());
        Ok(())
    }
}

/// The fingerprint of everything lowering reads of `plan` and its graph.
pub(crate) fn plan_fingerprint<S: Storage>(plan: &Plan<S>) -> (u64, u64) {
    let (mut a, mut b) = (
        std::hash::DefaultHasher::new(),
        std::hash::DefaultHasher::new(),
    );
    // A different key for the second pass: a prefix.
    b.write_u64(0x9e37_79b9_7f4a_7c15);
    let g = plan.graph();
    {
        let mut f = Feed(&mut a, &mut b);
        let _ = write!(f, "{:?}|{:?}|{}", g.nodes(), plan.slots(), g.forward_len());
    }
    (a.finish(), b.finish())
}

/// The key of one IPU's program: the plan's fingerprint, the stages on the IPU, the machine
/// and the lowering options.
pub(crate) fn key(plan: (u64, u64), stages: &[usize], cfg: &IpuConfig, opts: LowerOptions) -> u128 {
    let (mut a, mut b) = (
        std::hash::DefaultHasher::new(),
        std::hash::DefaultHasher::new(),
    );
    b.write_u64(0x9e37_79b9_7f4a_7c15);
    for h in [&mut a, &mut b] {
        plan.hash(h);
        stages.hash(h);
    }
    let mut f = Feed(&mut a, &mut b);
    let _ = write!(f, "{cfg:?}|{opts:?}");
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

/// The program under `key`, lowering it with `lower` when the cache does not have it. An
/// estimate asking for a program another is still lowering lowers it too (the same program)
/// rather than wait: a lowering runs work on the thread pool, and a thread waiting for it can
/// take up the very estimate that waits, which would then wait for itself.
pub(crate) fn get_or_lower(key: u128, lower: impl FnOnce() -> (Program, Summaries)) -> Lowered {
    let slot = {
        let mut guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        let Some(c) = guard.as_mut() else {
            drop(guard);
            return Arc::new(lower());
        };
        match c.entries.iter().position(|(k, _)| *k == key) {
            Some(i) => {
                let entry = c.entries.remove(i).expect("found above");
                let slot = Arc::clone(&entry.1);
                c.entries.push_back(entry);
                c.hits += 1;
                slot
            }
            None => {
                let slot: Slot = Arc::default();
                c.entries.push_back((key, Arc::clone(&slot)));
                while c.entries.len() > c.capacity {
                    c.entries.pop_front();
                }
                c.misses += 1;
                slot
            }
        }
    };
    if let Some(done) = slot.get() {
        return Arc::clone(done);
    }
    // Lowered outside the lock and outside the slot's initialisation: other estimates go on
    // meanwhile, and none waits on this thread.
    let lowered = Arc::new(lower());
    Arc::clone(slot.get_or_init(|| lowered))
}
