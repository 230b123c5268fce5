//! Datasets: samples of fixed shape flowing through a small, `tf.data`-like pipeline.
//!
//! A dataset is a list of named fields ([`DatasetSpec`]), each of a fixed shape
//! ([`FieldSpec`]): MNIST has `images` of shape `[28, 28]` and `labels` of shape `[]` (a
//! scalar). Values are held as `f32` whatever the field's element type; the type tag
//! ([`FieldSpec::dtype`], `F32` or `F16`) says what the feeder writes and how many bytes an
//! element counts for. An `F16` field only ever holds values that are exactly representable in
//! binary16, so writing it as `f16` loses nothing.
//!
//! Sources: [`Dataset::from_mnist_split`], [`Dataset::synthetic`] and [`Dataset::from_fields`].
//! Transformations ([`shuffle`](Dataset::shuffle), [`map`](Dataset::map),
//! [`cast`](Dataset::cast), [`batch`](Dataset::batch), [`repeat`](Dataset::repeat)) return a new
//! pipeline stage and apply in the order they are called, as in `tf.data`.
//!
//! # Lazy evaluation
//!
//! The pipeline is **lazy**: a transformation records a stage and checks it (unknown fields,
//! a batch size of zero, ...) but computes nothing. Values are computed while iterating
//! ([`Dataset::iter`]), one element at a time, from the source; every iteration runs the
//! pipeline afresh. Two stages hold more than one element in memory: `batch` (one batch) and
//! `shuffle`, which draws a permutation of one whole pass of its input (8 bytes an element), and
//! when `batch` or `repeat` comes before it also buffers that pass (as a `tf.data` shuffle with a
//! buffer as large as the dataset would).
//!
//! # Epochs and shuffling
//!
//! `shuffle(seed)` draws a fresh permutation every time its input is iterated: each pass of a
//! following `repeat`, and each epoch ([`Dataset::iter_epoch`]). The permutation depends only on
//! the seed and the pass number, so the same pipeline gives the same order on every run.
//! Iteration `e` of `d.shuffle(s).repeat(Some(c))` uses passes `e * c .. (e + 1) * c` of the
//! shuffle, so `d.shuffle(s).repeat(Some(2))` yields exactly epochs 0 and 1 of `d.shuffle(s)`.
//!
//! # Fixed shapes
//!
//! An infeed needs every element to have the same shape. `batch(n, true)` guarantees it;
//! `batch(n, false)` leaves a short last batch whenever the number of elements is not a multiple
//! of `n`, and then [`Dataset::has_fixed_shape`] is false. Unlike TensorFlow, which marks the
//! batch dimension unknown whenever `drop_remainder` is false, Tessera knows the exact number of
//! elements, so `batch(32, false)` over 8,000 samples still has a fixed shape.

mod error;
mod pipeline;
mod spec;

pub use error::DatasetError;
pub use spec::{Batch, DatasetSpec, FieldSpec};

use std::fmt;
use std::sync::Arc;

use tessera_core::rng::SplitMix64;
use tessera_core::DType;

use crate::idx::{Images, Labels};

use pipeline::{open, Column, ElemIter, MapFn, Pipeline, Source, Stage};

/// A dataset pipeline: a source and the transformations applied to it, in order.
///
/// Cloning is cheap (the source is shared). See the [module documentation](self) for the
/// lazy evaluation, shuffling and fixed-shape rules.
#[derive(Clone)]
pub struct Dataset {
    source: Arc<Source>,
    stages: Vec<Stage>,
    /// `cards[k]`: elements one iteration of the first `k` stages yields (`None`: infinite).
    cards: Vec<Option<usize>>,
    spec: DatasetSpec,
    /// Every element has the shapes in `spec` (no short batch).
    fixed: bool,
    /// Elements carry a leading batch dimension.
    batched: bool,
}

impl fmt::Debug for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dataset")
            .field("spec", &self.spec)
            .field("samples", &self.source.count)
            .field("stages", &self.stages)
            .field("epoch_len", &self.epoch_len())
            .field("fixed_shape", &self.fixed)
            .finish()
    }
}

/// Checks a spec and returns the number of values per sample of each field.
fn validate(spec: &DatasetSpec) -> Result<Vec<usize>, DatasetError> {
    if spec.fields.is_empty() {
        return Err(DatasetError::NoFields);
    }
    let mut per = Vec::with_capacity(spec.fields.len());
    for (i, f) in spec.fields.iter().enumerate() {
        if f.name.is_empty() {
            return Err(DatasetError::EmptyFieldName);
        }
        if spec.fields[..i].iter().any(|g| g.name == f.name) {
            return Err(DatasetError::DuplicateField {
                field: f.name.clone(),
            });
        }
        if !matches!(f.dtype, DType::F32 | DType::F16) {
            return Err(DatasetError::UnsupportedDType {
                field: f.name.clone(),
                dtype: f.dtype,
            });
        }
        if f.shape.contains(&0) {
            return Err(DatasetError::ZeroSizedField {
                field: f.name.clone(),
                shape: f.shape.clone(),
            });
        }
        let n = f
            .checked_elements()
            .and_then(|n| n.checked_mul(DType::F32.size()).map(|_| n))
            .ok_or_else(|| DatasetError::FieldTooLarge {
                field: f.name.clone(),
                shape: f.shape.clone(),
            })?;
        if f.classes == Some(0) {
            return Err(DatasetError::ZeroClasses {
                field: f.name.clone(),
            });
        }
        per.push(n);
    }
    Ok(per)
}

impl Dataset {
    /// A dataset from a checked spec and its source. Fields tagged `F16` in the spec are cast
    /// (rounded) at the start of the pipeline.
    fn from_source(spec: DatasetSpec, source: Source) -> Result<Self, DatasetError> {
        let mut start = spec.clone();
        for f in &mut start.fields {
            f.dtype = DType::F32;
        }
        let mut d = Dataset {
            cards: vec![Some(source.count)],
            source: Arc::new(source),
            stages: Vec::new(),
            spec: start,
            fixed: true,
            batched: false,
        };
        for f in spec.fields.iter().filter(|f| f.dtype == DType::F16) {
            d = d.cast(&f.name, DType::F16)?;
        }
        Ok(d)
    }

    /// One split of MNIST: field `images` of shape `[rows, cols]` holding the raw pixel values
    /// `0.0..=255.0`, and field `labels` of shape `[]` (class labels; 10 classes, or more if a
    /// label is 10 or above). Both `F32`. The pixels are copied (as bytes).
    ///
    /// # Errors
    ///
    /// [`DatasetError::BadImages`] if the pixel buffer does not match the dimensions,
    /// [`DatasetError::ZeroSizedField`] for empty images, and [`DatasetError::CountMismatch`]
    /// if there is not one label per image.
    pub fn from_mnist_split(images: &Images, labels: &Labels) -> Result<Self, DatasetError> {
        let shape = vec![images.rows, images.cols];
        let bad = || DatasetError::BadImages {
            count: images.count,
            rows: images.rows,
            cols: images.cols,
            pixels: images.pixels.len(),
        };
        let total = images
            .rows
            .checked_mul(images.cols)
            .and_then(|p| p.checked_mul(images.count))
            .ok_or_else(bad)?;
        if total != images.pixels.len() {
            return Err(bad());
        }
        if labels.labels.len() != images.count {
            return Err(DatasetError::CountMismatch {
                field: "labels".to_owned(),
                count: labels.labels.len(),
                expected: images.count,
            });
        }
        let classes = labels
            .labels
            .iter()
            .map(|&l| usize::from(l) + 1)
            .max()
            .unwrap_or(0)
            .max(10);
        let spec = DatasetSpec::new(vec![
            FieldSpec::new("images", &shape),
            FieldSpec::class_label("labels", classes),
        ]);
        let per = validate(&spec)?;
        let source = Source {
            count: images.count,
            per,
            columns: vec![
                Column::Bytes(images.pixels.clone()),
                Column::Bytes(labels.labels.clone()),
            ],
        };
        Dataset::from_source(spec, source)
    }

    /// `count` pseudo-random samples of `spec`, computed on demand (nothing is stored), the same
    /// for the same seed on every run: fields with [`classes`](FieldSpec::classes) get integers
    /// drawn uniformly from `0..classes`, other fields values uniform in [0, 1). Built on
    /// [`SplitMix64`]; each sample's values depend only on the seed, the field and the sample
    /// index.
    ///
    /// # Errors
    ///
    /// A [`DatasetError`] naming the field if the spec is invalid (no fields, duplicate or
    /// empty names, a zero dimension, zero classes, a dtype other than `F32`/`F16`).
    pub fn synthetic(spec: DatasetSpec, count: usize, seed: u64) -> Result<Self, DatasetError> {
        let per = validate(&spec)?;
        let columns = spec
            .fields
            .iter()
            .enumerate()
            .map(|(i, f)| Column::Random {
                key: SplitMix64::new(seed ^ (i as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f))
                    .next_u64(),
                classes: f.classes,
            })
            .collect();
        Dataset::from_source(
            spec,
            Source {
                count,
                per,
                columns,
            },
        )
    }

    /// A dataset from one vector of values per field (in spec order), each holding the samples
    /// one after another, row-major. The number of samples is taken from the first field.
    ///
    /// # Errors
    ///
    /// Besides the spec checks of [`Dataset::synthetic`]: [`DatasetError::FieldCount`] if there
    /// is not one vector per field, [`DatasetError::RaggedField`] if a vector is not a whole
    /// number of samples, [`DatasetError::CountMismatch`] if fields hold different numbers of
    /// samples, and [`DatasetError::LabelOutOfRange`] if a class-label field holds a value that
    /// is not an integer in `0..classes`.
    pub fn from_fields(spec: DatasetSpec, fields: Vec<Vec<f32>>) -> Result<Self, DatasetError> {
        let per = validate(&spec)?;
        if fields.len() != spec.fields.len() {
            return Err(DatasetError::FieldCount {
                expected: spec.fields.len(),
                found: fields.len(),
            });
        }
        let mut count = 0;
        for (i, ((f, values), &n)) in spec.fields.iter().zip(&fields).zip(&per).enumerate() {
            if values.len() % n != 0 {
                return Err(DatasetError::RaggedField {
                    field: f.name.clone(),
                    values: values.len(),
                    per_sample: n,
                });
            }
            let samples = values.len() / n;
            if i == 0 {
                count = samples;
            } else if samples != count {
                return Err(DatasetError::CountMismatch {
                    field: f.name.clone(),
                    count: samples,
                    expected: count,
                });
            }
            if let Some(classes) = f.classes {
                let bad = values
                    .iter()
                    .position(|&v| !(v >= 0.0 && v.fract() == 0.0 && (v as f64) < classes as f64));
                if let Some(at) = bad {
                    return Err(DatasetError::LabelOutOfRange {
                        field: f.name.clone(),
                        sample: at / n,
                        value: values[at],
                        classes,
                    });
                }
            }
        }
        let columns = fields.into_iter().map(Column::Floats).collect();
        Dataset::from_source(
            spec,
            Source {
                count,
                per,
                columns,
            },
        )
    }

    /// The fields of one element at this point of the pipeline (after `batch`, each shape starts
    /// with the batch size).
    #[must_use]
    pub fn spec(&self) -> &DatasetSpec {
        &self.spec
    }

    /// Number of elements (batches, once batched) one iteration yields, or `None` if the
    /// dataset repeats forever.
    #[must_use]
    pub fn epoch_len(&self) -> Option<usize> {
        self.cards.last().copied().flatten()
    }

    /// Whether every element has exactly the shapes in [`spec`](Dataset::spec): false when a
    /// `batch(n, false)` leaves a short last batch. An infeed needs a fixed shape.
    #[must_use]
    pub fn has_fixed_shape(&self) -> bool {
        self.fixed
    }

    /// Whether elements carry a leading batch dimension.
    #[must_use]
    pub fn is_batched(&self) -> bool {
        self.batched
    }

    fn push(mut self, stage: Stage, card: Option<usize>) -> Self {
        self.stages.push(stage);
        self.cards.push(card);
        self
    }

    /// Shuffles the elements: a permutation of one whole pass, drawn afresh (deterministically
    /// from `seed`) for every pass of a later `repeat` and every epoch.
    ///
    /// # Errors
    ///
    /// [`DatasetError::ShuffleInfinite`] after `repeat(None)`.
    pub fn shuffle(self, seed: u64) -> Result<Self, DatasetError> {
        let card = self.epoch_len().ok_or(DatasetError::ShuffleInfinite)?;
        Ok(self.push(Stage::Shuffle { seed }, Some(card)))
    }

    /// Applies `f` to every value of `field` (for example `|x| x / 255.0`). If the field is
    /// `F16`, the results are rounded to binary16 again.
    ///
    /// # Errors
    ///
    /// [`DatasetError::UnknownField`] if there is no such field.
    pub fn map<F>(self, field: &str, f: F) -> Result<Self, DatasetError>
    where
        F: Fn(f32) -> f32 + Send + Sync + 'static,
    {
        let i = self.spec.index(field)?;
        let card = self.epoch_len();
        let round_f16 = self.spec.fields[i].dtype == DType::F16;
        let f: MapFn = if round_f16 {
            Arc::new(move |values: &mut [f32]| {
                for v in values {
                    *v = pipeline::round_f16(f(*v));
                }
            })
        } else {
            Arc::new(move |values: &mut [f32]| {
                for v in values {
                    *v = f(*v);
                }
            })
        };
        Ok(self.push(
            Stage::Map {
                field: i,
                f,
                round_f16,
            },
            card,
        ))
    }

    /// Sets the element type of `field`. Casting to `F16` rounds its values to the nearest
    /// binary16 value (ties to even) and keeps them as `f32`; casting to `F32` only changes the
    /// tag (binary16 values are exact in `f32`).
    ///
    /// # Errors
    ///
    /// [`DatasetError::UnknownField`] if there is no such field, and
    /// [`DatasetError::UnsupportedDType`] for a type other than `F32` or `F16`.
    pub fn cast(mut self, field: &str, dtype: DType) -> Result<Self, DatasetError> {
        let i = self.spec.index(field)?;
        if !matches!(dtype, DType::F32 | DType::F16) {
            return Err(DatasetError::UnsupportedDType {
                field: field.to_owned(),
                dtype,
            });
        }
        let from = self.spec.fields[i].dtype;
        self.spec.fields[i].dtype = dtype;
        if from == DType::F32 && dtype == DType::F16 {
            let card = self.epoch_len();
            return Ok(self.push(Stage::RoundF16 { field: i }, card));
        }
        Ok(self)
    }

    /// Groups `batch_size` consecutive elements into one, adding a leading batch dimension to
    /// every field. With `drop_remainder` a last incomplete batch is dropped; without it, it is
    /// yielded short, and unless the number of elements is a multiple of `batch_size` the
    /// dataset no longer has a fixed shape (an infeed rejects it).
    ///
    /// # Errors
    ///
    /// [`DatasetError::ZeroBatchSize`], [`DatasetError::RaggedBatch`] if the elements do not
    /// all have the same shape, and [`DatasetError::FieldTooLarge`] if a batch of a field would
    /// be too large to address.
    pub fn batch(mut self, batch_size: usize, drop_remainder: bool) -> Result<Self, DatasetError> {
        if batch_size == 0 {
            return Err(DatasetError::ZeroBatchSize);
        }
        if !self.fixed {
            return Err(DatasetError::RaggedBatch {
                field: self.spec.fields[0].name.clone(),
            });
        }
        for f in &mut self.spec.fields {
            let mut shape = Vec::with_capacity(f.shape.len() + 1);
            shape.push(batch_size);
            shape.extend_from_slice(&f.shape);
            let fits = f
                .checked_elements()
                .and_then(|n| n.checked_mul(batch_size))
                .and_then(|n| n.checked_mul(DType::F32.size()))
                .is_some();
            if !fits {
                return Err(DatasetError::FieldTooLarge {
                    field: f.name.clone(),
                    shape,
                });
            }
            f.shape = shape;
        }
        let (card, fixed) = match self.epoch_len() {
            None => (None, true),
            Some(n) if drop_remainder => (Some(n / batch_size), true),
            Some(n) => (Some(n.div_ceil(batch_size)), n % batch_size == 0),
        };
        self.fixed = fixed;
        self.batched = true;
        Ok(self.push(
            Stage::Batch {
                size: batch_size,
                drop_remainder,
            },
            card,
        ))
    }

    /// Repeats the dataset `count` times, or forever with `None` (an empty dataset stays empty).
    ///
    /// # Errors
    ///
    /// [`DatasetError::CardinalityOverflow`] if the number of elements overflows `usize`.
    pub fn repeat(self, count: Option<usize>) -> Result<Self, DatasetError> {
        let card = match (count, self.epoch_len()) {
            (Some(0), _) | (_, Some(0)) => Some(0),
            (None, _) | (Some(_), None) => None,
            (Some(c), Some(n)) => Some(
                n.checked_mul(c)
                    .ok_or(DatasetError::CardinalityOverflow { count: c })?,
            ),
        };
        Ok(self.push(Stage::Repeat { count }, card))
    }

    /// Iterates over the elements of epoch 0. Same as `iter_epoch(0)`.
    #[must_use]
    pub fn iter(&self) -> DatasetIter {
        self.iter_epoch(0)
    }

    /// Iterates over the elements of epoch `epoch`: shuffles draw the permutations of that
    /// epoch, so iterating epochs 0, 1, 2, ... gives a fresh order each time.
    #[must_use]
    pub fn iter_epoch(&self, epoch: u64) -> DatasetIter {
        let pipeline = Arc::new(Pipeline {
            source: Arc::clone(&self.source),
            stages: self.stages.clone(),
            cards: self.cards.clone(),
        });
        DatasetIter {
            inner: open(&pipeline, pipeline.stages.len(), epoch),
            spec: self.spec.clone(),
            batched: self.batched,
        }
    }
}

impl IntoIterator for &Dataset {
    type Item = Batch;
    type IntoIter = DatasetIter;

    fn into_iter(self) -> DatasetIter {
        self.iter()
    }
}

/// Iterator over a dataset's elements, from [`Dataset::iter`] or [`Dataset::iter_epoch`].
pub struct DatasetIter {
    inner: ElemIter,
    spec: DatasetSpec,
    batched: bool,
}

impl fmt::Debug for DatasetIter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatasetIter")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl Iterator for DatasetIter {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        let elem = self.inner.next()?;
        let fields = self
            .spec
            .fields
            .iter()
            .zip(elem.values)
            .map(|(f, values)| {
                let mut shape = f.shape.clone();
                if self.batched {
                    shape[0] = elem.lead;
                }
                (f.name.clone(), shape, values)
            })
            .collect();
        Some(Batch {
            fields,
            dtypes: self.spec.fields.iter().map(|f| f.dtype).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tessera_core::f16::{f16_to_f32, f32_to_f16};

    /// `n` samples with an `id` field holding the sample index and a `pair` field [2] holding
    /// (index, -index).
    fn ids(n: usize) -> Dataset {
        let spec = DatasetSpec::new(vec![
            FieldSpec::new("id", &[]),
            FieldSpec::new("pair", &[2]),
        ]);
        let id: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let pair: Vec<f32> = (0..n).flat_map(|i| [i as f32, -(i as f32)]).collect();
        Dataset::from_fields(spec, vec![id, pair]).unwrap()
    }

    fn id_values(d: &Dataset, epoch: u64) -> Vec<Vec<f32>> {
        d.iter_epoch(epoch)
            .map(|b| b.field("id").unwrap().1.to_vec())
            .collect()
    }

    fn flat(batches: &[Vec<f32>]) -> Vec<usize> {
        batches.iter().flatten().map(|&x| x as usize).collect()
    }

    fn is_permutation(v: &[usize], n: usize) -> bool {
        let mut seen = vec![false; n];
        v.len() == n
            && v.iter()
                .all(|&i| i < n && !std::mem::replace(&mut seen[i], true))
    }

    #[test]
    fn datasets_and_iterators_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        fn check_send<T: Send>() {}
        check::<Dataset>();
        check_send::<DatasetIter>();
    }

    #[test]
    fn from_fields_checks_shapes() {
        let spec = || {
            DatasetSpec::new(vec![
                FieldSpec::new("x", &[3]),
                FieldSpec::class_label("y", 4),
            ])
        };
        let ok = Dataset::from_fields(spec(), vec![vec![0.0; 6], vec![1.0, 3.0]]).unwrap();
        assert_eq!(ok.epoch_len(), Some(2));
        assert_eq!(
            Dataset::from_fields(spec(), vec![vec![0.0; 6]]).unwrap_err(),
            DatasetError::FieldCount {
                expected: 2,
                found: 1
            }
        );
        assert_eq!(
            Dataset::from_fields(spec(), vec![vec![0.0; 7], vec![1.0, 3.0]]).unwrap_err(),
            DatasetError::RaggedField {
                field: "x".into(),
                values: 7,
                per_sample: 3
            }
        );
        assert_eq!(
            Dataset::from_fields(spec(), vec![vec![0.0; 6], vec![1.0]]).unwrap_err(),
            DatasetError::CountMismatch {
                field: "y".into(),
                count: 1,
                expected: 2
            }
        );
        for bad in [4.0, -1.0, 0.5, f32::NAN] {
            let e = Dataset::from_fields(spec(), vec![vec![0.0; 6], vec![1.0, bad]]).unwrap_err();
            assert!(
                matches!(e, DatasetError::LabelOutOfRange { ref field, sample: 1, classes: 4, .. } if field == "y"),
                "{e:?}"
            );
        }
        let dup = DatasetSpec::new(vec![FieldSpec::new("x", &[]), FieldSpec::new("x", &[])]);
        assert_eq!(
            Dataset::from_fields(dup, vec![vec![], vec![]]).unwrap_err(),
            DatasetError::DuplicateField { field: "x".into() }
        );
        let zero = DatasetSpec::new(vec![FieldSpec::new("x", &[2, 0])]);
        assert!(matches!(
            Dataset::from_fields(zero, vec![vec![]]).unwrap_err(),
            DatasetError::ZeroSizedField { .. }
        ));
        let huge = DatasetSpec::new(vec![FieldSpec::new("x", &[usize::MAX, 2])]);
        assert!(matches!(
            Dataset::synthetic(huge, 1, 0).unwrap_err(),
            DatasetError::FieldTooLarge { .. }
        ));
        assert_eq!(
            Dataset::from_fields(DatasetSpec::default(), vec![]).unwrap_err(),
            DatasetError::NoFields
        );
        let int = DatasetSpec::new(vec![FieldSpec::new("x", &[]).with_dtype(DType::I32)]);
        assert!(matches!(
            Dataset::from_fields(int, vec![vec![1.0]]).unwrap_err(),
            DatasetError::UnsupportedDType {
                dtype: DType::I32,
                ..
            }
        ));
        let no_classes = DatasetSpec::new(vec![FieldSpec::class_label("y", 0)]);
        assert!(matches!(
            Dataset::synthetic(no_classes, 1, 0).unwrap_err(),
            DatasetError::ZeroClasses { .. }
        ));
    }

    #[test]
    fn mnist_split_checks_its_inputs() {
        let images = Images {
            count: 2,
            rows: 2,
            cols: 2,
            pixels: vec![0, 255, 1, 2, 3, 4, 5, 6],
        };
        let labels = Labels { labels: vec![3, 9] };
        let d = Dataset::from_mnist_split(&images, &labels).unwrap();
        assert_eq!(d.spec().field("images").unwrap().shape, vec![2, 2]);
        assert_eq!(d.spec().field("labels").unwrap().classes, Some(10));
        let first = d.iter().next().unwrap();
        assert_eq!(first.field("images").unwrap().1, &[0.0, 255.0, 1.0, 2.0]);
        assert_eq!(first.field("labels").unwrap(), (&[][..], &[3.0][..]));

        let short = Labels { labels: vec![3] };
        assert!(matches!(
            Dataset::from_mnist_split(&images, &short).unwrap_err(),
            DatasetError::CountMismatch {
                count: 1,
                expected: 2,
                ..
            }
        ));
        let broken = Images {
            pixels: vec![0; 7],
            ..images
        };
        assert!(matches!(
            Dataset::from_mnist_split(&broken, &labels).unwrap_err(),
            DatasetError::BadImages { pixels: 7, .. }
        ));
    }

    #[test]
    fn synthetic_is_deterministic_with_labels_in_range() {
        let spec = DatasetSpec::new(vec![
            FieldSpec::new("x", &[4, 4]),
            FieldSpec::class_label("y", 7),
        ]);
        let a: Vec<Batch> = Dataset::synthetic(spec.clone(), 50, 9)
            .unwrap()
            .iter()
            .collect();
        let b: Vec<Batch> = Dataset::synthetic(spec.clone(), 50, 9)
            .unwrap()
            .iter()
            .collect();
        let c: Vec<Batch> = Dataset::synthetic(spec, 50, 10).unwrap().iter().collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.len(), 50);
        let mut seen = [false; 7];
        for batch in &a {
            let (shape, x) = batch.field("x").unwrap();
            assert_eq!(shape, &[4, 4]);
            assert!(x.iter().all(|v| (0.0..1.0).contains(v)));
            let y = batch.field("y").unwrap().1[0];
            assert!(y.fract() == 0.0 && (0.0..7.0).contains(&y), "{y}");
            seen[y as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        // Samples differ from one another.
        assert_ne!(a[0].fields[0].2, a[1].fields[0].2);
    }

    #[test]
    fn batches_and_short_batches() {
        let d = ids(10).batch(4, false).unwrap();
        assert!(!d.has_fixed_shape());
        assert_eq!(d.epoch_len(), Some(3));
        let batches: Vec<Batch> = d.iter().collect();
        assert_eq!(batches.len(), 3);
        assert_eq!(batches[0].field("pair").unwrap().0, &[4, 2]);
        assert_eq!(batches[2].field("pair").unwrap().0, &[2, 2]);
        assert_eq!(batches[2].field("pair").unwrap().1, &[8.0, -8.0, 9.0, -9.0]);
        assert_eq!(batches[2].field("id").unwrap(), (&[2][..], &[8.0, 9.0][..]));

        let d = ids(10).batch(4, true).unwrap();
        assert!(d.has_fixed_shape());
        assert_eq!(d.epoch_len(), Some(2));
        assert_eq!(flat(&id_values(&d, 0)), (0..8).collect::<Vec<_>>());

        // A multiple of the batch size keeps the shape fixed even without drop_remainder.
        assert!(ids(12).batch(4, false).unwrap().has_fixed_shape());
        assert_eq!(
            ids(10).batch(0, true).unwrap_err(),
            DatasetError::ZeroBatchSize
        );
        assert_eq!(
            ids(10).batch(4, false).unwrap().batch(2, true).unwrap_err(),
            DatasetError::RaggedBatch { field: "id".into() }
        );
        // Nested batches.
        let nested = ids(12).batch(2, true).unwrap().batch(3, true).unwrap();
        assert_eq!(nested.spec().field("pair").unwrap().shape, vec![3, 2, 2]);
        let b: Vec<Batch> = nested.iter().collect();
        assert_eq!(b.len(), 2);
        assert_eq!(b[1].field("id").unwrap().0, &[3, 2]);
        assert_eq!(
            b[1].field("id").unwrap().1,
            &[6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
        );
    }

    #[test]
    fn shuffle_is_a_fresh_deterministic_permutation_each_pass() {
        let d = ids(100).shuffle(5).unwrap();
        let e0 = flat(&id_values(&d, 0));
        let e1 = flat(&id_values(&d, 1));
        assert!(is_permutation(&e0, 100) && is_permutation(&e1, 100));
        assert_ne!(e0, (0..100).collect::<Vec<_>>());
        assert_ne!(e0, e1);
        assert_eq!(e0, flat(&id_values(&ids(100).shuffle(5).unwrap(), 0)));
        assert_ne!(e0, flat(&id_values(&ids(100).shuffle(6).unwrap(), 0)));

        // repeat(Some(2)) yields epochs 0 and 1 of the shuffle, and its own epoch 1 the next two.
        let r = ids(100).shuffle(5).unwrap().repeat(Some(2)).unwrap();
        assert_eq!(r.epoch_len(), Some(200));
        let both = flat(&id_values(&r, 0));
        assert_eq!(both[..100], e0[..]);
        assert_eq!(both[100..], e1[..]);
        let next = flat(&id_values(&r, 1));
        assert_eq!(next[..100], flat(&id_values(&d, 2))[..]);

        // Every field moves together.
        for b in d.iter() {
            let id = b.field("id").unwrap().1[0];
            assert_eq!(b.field("pair").unwrap().1, &[id, -id]);
        }
        assert_eq!(
            ids(3).repeat(None).unwrap().shuffle(1).unwrap_err(),
            DatasetError::ShuffleInfinite
        );
    }

    #[test]
    fn shuffling_batches_buffers_a_pass() {
        let d = ids(12).batch(3, true).unwrap().shuffle(2).unwrap();
        let batches = id_values(&d, 0);
        assert_eq!(batches.len(), 4);
        assert!(is_permutation(&flat(&batches), 12));
        let mut firsts: Vec<usize> = batches.iter().map(|b| b[0] as usize).collect();
        assert_ne!(firsts, vec![0, 3, 6, 9]);
        firsts.sort_unstable();
        assert_eq!(firsts, vec![0, 3, 6, 9]);
        for b in &batches {
            assert_eq!(b[1], b[0] + 1.0);
        }
        // Shuffling a repeated dataset permutes both passes together.
        let r = ids(5).repeat(Some(2)).unwrap().shuffle(3).unwrap();
        let mut all = flat(&id_values(&r, 0));
        all.sort_unstable();
        assert_eq!(all, vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4]);
    }

    #[test]
    fn map_and_cast() {
        let d = ids(4).map("pair", |x| x / 3.0).unwrap();
        let b: Vec<Batch> = d.iter().collect();
        assert_eq!(b[1].field("pair").unwrap().1, &[1.0 / 3.0, -1.0 / 3.0]);
        assert!(matches!(
            ids(4).map("nope", |x| x).unwrap_err(),
            DatasetError::UnknownField { ref field, ref known } if field == "nope" && known.len() == 2
        ));

        let h = d.clone().cast("pair", DType::F16).unwrap();
        assert_eq!(h.spec().field("pair").unwrap().dtype, DType::F16);
        let third = f16_to_f32(f32_to_f16(1.0 / 3.0));
        assert_ne!(third, 1.0 / 3.0);
        let b: Vec<Batch> = h.iter().collect();
        assert_eq!(b[1].field("pair").unwrap().1, &[third, -third]);
        assert_eq!(b[1].dtype("pair"), Some(DType::F16));
        assert_eq!(b[1].bytes(), 4 + 2 * 2);
        // A map on an f16 field stays in f16.
        let m = h.clone().map("pair", |x| x * 1.001).unwrap();
        for b in m.iter() {
            for &v in b.field("pair").unwrap().1 {
                assert_eq!(f16_to_f32(f32_to_f16(v)).to_bits(), v.to_bits());
            }
        }
        // Back to f32 only changes the tag.
        let back = h.cast("pair", DType::F32).unwrap();
        assert_eq!(
            back.iter().nth(1).unwrap().field("pair").unwrap().1,
            &[third, -third]
        );
        assert!(matches!(
            ids(4).cast("id", DType::I32).unwrap_err(),
            DatasetError::UnsupportedDType {
                dtype: DType::I32,
                ..
            }
        ));
        // An f16 field in the spec is rounded from the start.
        let spec = DatasetSpec::new(vec![FieldSpec::new("x", &[]).with_dtype(DType::F16)]);
        let d = Dataset::from_fields(spec, vec![vec![0.1]]).unwrap();
        let b = d.iter().next().unwrap();
        assert_eq!(b.field("x").unwrap().1, &[f16_to_f32(f32_to_f16(0.1))]);
        assert_eq!(b.dtype("x"), Some(DType::F16));
    }

    #[test]
    fn repeat_counts() {
        assert_eq!(ids(3).repeat(Some(0)).unwrap().iter().count(), 0);
        assert_eq!(ids(3).repeat(Some(4)).unwrap().iter().count(), 12);
        let forever = ids(3).repeat(None).unwrap();
        assert_eq!(forever.epoch_len(), None);
        assert_eq!(
            flat(
                &forever
                    .iter()
                    .take(7)
                    .map(|b| b.fields[0].2.clone())
                    .collect::<Vec<_>>()
            ),
            vec![0, 1, 2, 0, 1, 2, 0]
        );
        // An empty dataset repeated forever is empty, not a hang.
        let empty = ids(0).repeat(None).unwrap();
        assert_eq!(empty.epoch_len(), Some(0));
        assert_eq!(empty.iter().count(), 0);
        assert_eq!(
            ids(2).repeat(Some(usize::MAX)).unwrap_err(),
            DatasetError::CardinalityOverflow { count: usize::MAX }
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the pipeline, the number of elements is `epoch_len`, a fixed-shape dataset
        /// only yields full batches, and a shuffled pass holds every sample exactly once.
        #[test]
        fn pipelines_keep_their_promises(
            n in 0usize..40,
            size in 1usize..9,
            drop_remainder in any::<bool>(),
            repeats in 1usize..4,
            seed in proptest::option::of(any::<u64>()),
            epoch in 0u64..3,
        ) {
            let mut d = ids(n);
            if let Some(seed) = seed {
                d = d.shuffle(seed).unwrap();
            }
            let d = d.batch(size, drop_remainder).unwrap().repeat(Some(repeats)).unwrap();
            let batches = id_values(&d, epoch);
            prop_assert_eq!(Some(batches.len()), d.epoch_len());
            if d.has_fixed_shape() {
                prop_assert!(batches.iter().all(|b| b.len() == size));
            } else {
                prop_assert!(batches.iter().any(|b| b.len() < size));
            }
            let per_pass = batches.len() / repeats;
            for pass in batches.chunks(per_pass.max(1)) {
                let ids = flat(pass);
                if drop_remainder {
                    prop_assert_eq!(ids.len(), n / size * size);
                } else {
                    prop_assert!(is_permutation(&ids, n));
                }
            }
        }
    }
}
