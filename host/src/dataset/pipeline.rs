//! The lazy pipeline: a source, its stages, and the iterators that run them one element at
//! a time.

use std::fmt;
use std::sync::Arc;

use tessera_core::f16::{f16_to_f32, f32_to_f16};
use tessera_core::rng::SplitMix64;

#[cfg(doc)]
use super::Dataset;

/// Rows of a batch for which [`Dataset::batch`] reserves memory up front; larger batches grow.
const RESERVE_ROWS: usize = 4096;

/// Rounds `x` to the nearest binary16 value (ties to even), kept as `f32`.
pub(super) fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// Where a field's values come from.
pub(super) enum Column {
    /// Raw bytes (MNIST pixels and labels), widened to `f32` when read.
    Bytes(Vec<u8>),
    /// `f32` values.
    Floats(Vec<f32>),
    /// Pseudo-random values computed from a per-field key and the sample index.
    Random {
        /// Per-field seed.
        key: u64,
        /// `Some(n)`: integers in `0..n`; `None`: uniform in [0, 1).
        classes: Option<usize>,
    },
}

impl Column {
    /// Appends the `per` values of sample `i` (which the caller guarantees exists) to `out`.
    fn sample_into(&self, i: usize, per: usize, out: &mut Vec<f32>) {
        match self {
            Column::Bytes(b) => {
                // Over a slice of the new length, so that the conversion vectorises.
                let start = out.len();
                out.resize(start + per, 0.0);
                for (o, &x) in out[start..].iter_mut().zip(&b[i * per..(i + 1) * per]) {
                    *o = f32::from(x);
                }
            }
            Column::Floats(v) => out.extend_from_slice(&v[i * per..(i + 1) * per]),
            Column::Random { key, classes } => {
                let mut rng = SplitMix64::new(key ^ SplitMix64::new(i as u64).next_u64());
                match *classes {
                    Some(c) => out.extend((0..per).map(|_| rng.below(c) as f32)),
                    None => out.extend((0..per).map(|_| rng.next_f32())),
                }
            }
        }
    }
}

/// The samples a pipeline starts from.
pub(super) struct Source {
    /// Number of samples.
    pub(super) count: usize,
    /// Values per sample of each field.
    pub(super) per: Vec<usize>,
    /// Each field's values.
    pub(super) columns: Vec<Column>,
}

/// A value transform given to [`Dataset::map`], applied to a sample's values at once (one
/// call per sample; the loop over the values is the closure's own, so `f` is inlined in it).
pub(super) type MapFn = Arc<dyn Fn(&mut [f32]) + Send + Sync>;

/// One transformation of a pipeline.
#[derive(Clone)]
pub(super) enum Stage {
    Shuffle {
        seed: u64,
    },
    Map {
        field: usize,
        f: MapFn,
        /// The field is `F16` at this point: round the results back to binary16.
        round_f16: bool,
    },
    /// A cast from `F32` to `F16` (the only cast that changes values).
    RoundF16 {
        field: usize,
    },
    Batch {
        size: usize,
        drop_remainder: bool,
    },
    Repeat {
        count: Option<usize>,
    },
}

impl fmt::Debug for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stage::Shuffle { seed } => write!(f, "Shuffle({seed})"),
            Stage::Map {
                field, round_f16, ..
            } => write!(f, "Map(field {field}, round_f16: {round_f16})"),
            Stage::RoundF16 { field } => write!(f, "Cast(field {field}, f16)"),
            Stage::Batch {
                size,
                drop_remainder,
            } => write!(f, "Batch({size}, drop_remainder: {drop_remainder})"),
            Stage::Repeat { count } => write!(f, "Repeat({count:?})"),
        }
    }
}

/// An element inside the pipeline.
pub(super) struct Elem {
    /// The actual leading (batch) dimension, once batched.
    pub(super) lead: usize,
    /// Each field's values.
    pub(super) values: Vec<Vec<f32>>,
}

/// A stage's elements, one at a time: as whole [`Elem`]s, or appended to the buffers a batch
/// is being built in, so that a sample's values are written once, where they end up.
pub(super) trait Elements: Iterator<Item = Elem> {
    /// Appends the next element's values, field by field, to `out` (one buffer per field) and
    /// returns its leading dimension; `None` (nothing appended) at the end. The values are
    /// those [`Iterator::next`] would give.
    fn next_into(&mut self, out: &mut [Vec<f32>]) -> Option<usize> {
        let elem = self.next()?;
        for (o, v) in out.iter_mut().zip(&elem.values) {
            o.extend_from_slice(v);
        }
        Some(elem.lead)
    }
}

pub(super) type ElemIter = Box<dyn Elements + Send>;

/// Everything an iteration needs, shared by its stage iterators.
pub(super) struct Pipeline {
    pub(super) source: Arc<Source>,
    pub(super) stages: Vec<Stage>,
    pub(super) cards: Vec<Option<usize>>,
}

/// The permutation of `n` indices that a shuffle with `seed` uses in pass `pass`.
fn permutation(n: usize, seed: u64, pass: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    SplitMix64::new(seed ^ SplitMix64::new(pass).next_u64()).shuffle(&mut order);
    order
}

/// Iterates the first `upto` stages of `p` in pass `pass`.
pub(super) fn open(p: &Arc<Pipeline>, upto: usize, pass: u64) -> ElemIter {
    let Some(stage) = upto.checked_sub(1).map(|k| &p.stages[k]) else {
        return Box::new(SourceIter {
            source: Arc::clone(&p.source),
            order: None,
            pos: 0,
        });
    };
    match stage {
        Stage::Map { .. } | Stage::RoundF16 { .. } => Box::new(MapIter {
            inner: open(p, upto - 1, pass),
            stage: stage.clone(),
        }),
        Stage::Shuffle { seed } => {
            let n = p.cards[upto - 1].unwrap_or(0);
            open_ordered(p, upto - 1, pass, permutation(n, *seed, pass))
        }
        Stage::Batch {
            size,
            drop_remainder,
        } => Box::new(BatchIter {
            inner: open(p, upto - 1, pass),
            fields: p.source.columns.len(),
            size: *size,
            drop_remainder: *drop_remainder,
            done: false,
        }),
        Stage::Repeat { count } => Box::new(RepeatIter {
            pipeline: Arc::clone(p),
            upto: upto - 1,
            base: match count {
                Some(c) => pass.wrapping_mul(*c as u64),
                None => pass << 32,
            },
            count: *count,
            pass: 0,
            current: None,
            yielded: false,
            done: false,
        }),
    }
}

/// Iterates the first `upto` stages of `p` in pass `pass`, yielding the elements of one pass
/// in `order` (a permutation of their indices).
///
/// Maps, casts and shuffles keep one element per index, so the order moves up to the source
/// and nothing is buffered; after a batch or repeat, one pass is buffered and then reordered.
fn open_ordered(p: &Arc<Pipeline>, upto: usize, pass: u64, order: Vec<usize>) -> ElemIter {
    let Some(stage) = upto.checked_sub(1).map(|k| &p.stages[k]) else {
        return Box::new(SourceIter {
            source: Arc::clone(&p.source),
            order: Some(order),
            pos: 0,
        });
    };
    match stage {
        Stage::Map { .. } | Stage::RoundF16 { .. } => Box::new(MapIter {
            inner: open_ordered(p, upto - 1, pass, order),
            stage: stage.clone(),
        }),
        Stage::Shuffle { seed } => {
            let n = p.cards[upto - 1].unwrap_or(0);
            let inner = permutation(n, *seed, pass);
            let composed = order.iter().map(|&j| inner[j]).collect();
            open_ordered(p, upto - 1, pass, composed)
        }
        Stage::Batch { .. } | Stage::Repeat { .. } => {
            let items: Vec<Option<Elem>> = open(p, upto, pass).map(Some).collect();
            Box::new(ReorderIter {
                items,
                order,
                pos: 0,
            })
        }
    }
}

/// The source's samples, in index order or in a given order.
struct SourceIter {
    source: Arc<Source>,
    order: Option<Vec<usize>>,
    pos: usize,
}

impl Iterator for SourceIter {
    type Item = Elem;

    fn next(&mut self) -> Option<Elem> {
        let i = self.next_index()?;
        let values = self
            .source
            .columns
            .iter()
            .zip(&self.source.per)
            .map(|(c, &per)| {
                let mut v = Vec::with_capacity(per);
                c.sample_into(i, per, &mut v);
                v
            })
            .collect();
        Some(Elem { lead: 1, values })
    }
}

impl SourceIter {
    /// The index of the next sample, if any (and moves past it).
    fn next_index(&mut self) -> Option<usize> {
        let i = match &self.order {
            Some(order) => *order.get(self.pos)?,
            None if self.pos < self.source.count => self.pos,
            None => return None,
        };
        self.pos += 1;
        Some(i)
    }
}

impl Elements for SourceIter {
    fn next_into(&mut self, out: &mut [Vec<f32>]) -> Option<usize> {
        let i = self.next_index()?;
        for ((c, &per), o) in self.source.columns.iter().zip(&self.source.per).zip(out) {
            c.sample_into(i, per, o);
        }
        Some(1)
    }
}

/// A `map` or an f16 `cast`.
struct MapIter {
    inner: ElemIter,
    stage: Stage,
}

impl MapIter {
    /// The field the stage changes.
    fn field(&self) -> Option<usize> {
        match &self.stage {
            Stage::Map { field, .. } | Stage::RoundF16 { field } => Some(*field),
            _ => None,
        }
    }

    /// Changes one element's values of that field.
    fn apply(&self, values: &mut [f32]) {
        match &self.stage {
            Stage::Map { f, .. } => f(values),
            Stage::RoundF16 { .. } => {
                for v in values {
                    *v = round_f16(*v);
                }
            }
            _ => {}
        }
    }
}

impl Iterator for MapIter {
    type Item = Elem;

    fn next(&mut self) -> Option<Elem> {
        let mut elem = self.inner.next()?;
        if let Some(values) = self.field().and_then(|f| elem.values.get_mut(f)) {
            self.apply(values);
        }
        Some(elem)
    }
}

impl Elements for MapIter {
    fn next_into(&mut self, out: &mut [Vec<f32>]) -> Option<usize> {
        let field = self.field().filter(|&f| f < out.len());
        let start = field.map_or(0, |f| out[f].len());
        let lead = self.inner.next_into(out)?;
        if let Some(f) = field {
            self.apply(&mut out[f][start..]);
        }
        Some(lead)
    }
}

/// Batches: each batch's values are appended, element by element, to one buffer per field.
struct BatchIter {
    inner: ElemIter,
    /// Fields per element.
    fields: usize,
    size: usize,
    drop_remainder: bool,
    /// The inner iterator has ended (it is not asked again).
    done: bool,
}

impl BatchIter {
    fn next_element(&mut self, values: &mut [Vec<f32>]) -> bool {
        if !self.done && self.inner.next_into(values).is_none() {
            self.done = true;
        }
        !self.done
    }
}

impl Iterator for BatchIter {
    type Item = Elem;

    fn next(&mut self) -> Option<Elem> {
        let mut values = vec![Vec::new(); self.fields];
        if !self.next_element(&mut values) {
            return None;
        }
        let rows_reserved = self.size.min(RESERVE_ROWS) - 1;
        for v in &mut values {
            v.reserve(v.len().saturating_mul(rows_reserved));
        }
        let mut rows = 1;
        while rows < self.size && self.next_element(&mut values) {
            rows += 1;
        }
        if rows < self.size && self.drop_remainder {
            return None;
        }
        Some(Elem { lead: rows, values })
    }
}

impl Elements for BatchIter {}

struct RepeatIter {
    pipeline: Arc<Pipeline>,
    upto: usize,
    /// Upstream pass of this iteration's first repetition.
    base: u64,
    count: Option<usize>,
    /// Repetitions started so far.
    pass: usize,
    current: Option<ElemIter>,
    /// The current repetition has yielded an element.
    yielded: bool,
    done: bool,
}

impl RepeatIter {
    /// The next element as `take` reads it from the current repetition, starting the next
    /// repetition when one ends.
    fn advance<T>(&mut self, mut take: impl FnMut(&mut ElemIter) -> Option<T>) -> Option<T> {
        while !self.done {
            if let Some(it) = &mut self.current {
                if let Some(elem) = take(it) {
                    self.yielded = true;
                    return Some(elem);
                }
                self.current = None;
                if !self.yielded {
                    // An empty pass: every pass is empty, so stop rather than spin.
                    self.done = true;
                    break;
                }
            }
            if self.count.is_some_and(|c| self.pass >= c) {
                self.done = true;
                break;
            }
            let pass = self.base.wrapping_add(self.pass as u64);
            self.current = Some(open(&self.pipeline, self.upto, pass));
            self.pass += 1;
            self.yielded = false;
        }
        None
    }
}

impl Iterator for RepeatIter {
    type Item = Elem;

    fn next(&mut self) -> Option<Elem> {
        self.advance(|it| it.next())
    }
}

impl Elements for RepeatIter {
    fn next_into(&mut self, out: &mut [Vec<f32>]) -> Option<usize> {
        self.advance(|it| it.next_into(out))
    }
}

/// One buffered pass, yielded in a given order (each index once).
struct ReorderIter {
    items: Vec<Option<Elem>>,
    order: Vec<usize>,
    pos: usize,
}

impl Iterator for ReorderIter {
    type Item = Elem;

    fn next(&mut self) -> Option<Elem> {
        while let Some(&i) = self.order.get(self.pos) {
            self.pos += 1;
            if let Some(elem) = self.items.get_mut(i).and_then(Option::take) {
                return Some(elem);
            }
        }
        None
    }
}

impl Elements for ReorderIter {}
