//! Tensor-inspection statistics: what the host prints about tensors drained from an outfeed
//! (typically a map from tapped tensor or gradient name to its stacked values).
//!
//! Two reports, both plain text without a trailing newline:
//!
//! - [`format_keys`]: one line per key, `key: <name> shape: <shape>`, the shape written as a
//!   Python tuple (`()`, `(5,)`, `(125, 128)`).
//! - [`format_table`]: one row per key with the mean, population standard deviation, minimum and
//!   maximum over all elements, and whether any element is NaN or infinite, laid out like a
//!   printed pandas DataFrame.
//!
//! Statistics follow numpy on the values widened to `f64`: a NaN anywhere makes the mean, std,
//! minimum and maximum NaN; infinities propagate as IEEE arithmetic says (`[1, inf]` has mean
//! `inf` and std `nan`). Numbers print like Python's `f"{x:.6f}"`: six decimals, and `nan`,
//! `inf`, `-inf`.
//!
//! ```
//! use std::collections::BTreeMap;
//! use tessera_host::tensor::HostTensor;
//! use tessera_host::stats::{format_keys, format_table};
//!
//! let mut m = BTreeMap::new();
//! m.insert("w".to_string(), HostTensor::new(vec![2], vec![1.0, 3.0]).unwrap());
//! assert_eq!(format_keys(&m), "key: w shape: (2,)");
//! assert_eq!(
//!     format_table(&m),
//!     "Index  Name      Mean       Std   Minimum   Maximum   NaNs   infs\n\
//!      \x20   0     w  2.000000  1.000000  1.000000  3.000000  False  False"
//! );
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rayon::prelude::*;

pub use crate::tensor::format_shape;
use crate::tensor::HostTensor;

/// What [`format_table`] returns for an empty map.
pub const NO_DATA: &str = "No data enqueued";

/// The column headers of [`format_table`], in order.
pub const TABLE_HEADERS: [&str; 8] = [
    "Index", "Name", "Mean", "Std", "Minimum", "Maximum", "NaNs", "infs",
];

/// Summary statistics of one tensor, computed in `f64` over all its elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorStats {
    /// Arithmetic mean (NaN if any element is NaN, or if there are no elements).
    pub mean: f64,
    /// Population standard deviation, `sqrt(mean((x - mean)^2))` (NaN as for `mean`, and
    /// whenever an element is infinite).
    pub std: f64,
    /// Smallest element (NaN if any element is NaN, or if there are no elements).
    pub min: f64,
    /// Largest element (NaN if any element is NaN, or if there are no elements).
    pub max: f64,
    /// Whether any element is NaN.
    pub has_nan: bool,
    /// Whether any element is `+inf` or `-inf`.
    pub has_inf: bool,
}

impl TensorStats {
    /// The statistics of `tensor`'s elements (its `data`; the shape plays no part).
    ///
    /// An empty tensor gives NaN for the mean, std, minimum and maximum (numpy warns and
    /// returns NaN for the mean; it raises for the minimum) and no NaN or infinity flags.
    #[must_use]
    pub fn of(tensor: &HostTensor) -> Self {
        Self::of_values(&tensor.data)
    }

    /// The statistics of `values`, as for [`TensorStats::of`].
    ///
    /// Two passes over the values: the sum, the extremes and the NaN and infinity flags in
    /// the first, the squared deviations from the mean in the second (the textbook one-pass
    /// formula loses everything to cancellation). Both sums are in `f64`, over consecutive
    /// blocks of [`BLOCK`] values: in a block, [`LANES`] interleaved partial sums (value `i`
    /// goes to sum `i % LANES`, each from `-0.0` as `Iterator::sum` starts) added pairwise;
    /// the blocks' sums then added in order, from `-0.0`. A fixed order, whatever runs it, so
    /// the figures are the same on every run and machine, a little more accurate than one
    /// running sum, and several times faster (the partial sums do not wait on each other). An
    /// epoch of tapped tensors is millions of values, summed while the device waits: tensors
    /// of more than two blocks are summed block by block on rayon's threads.
    #[must_use]
    pub fn of_values(values: &[f32]) -> Self {
        let firsts = blocks(values, first_pass);
        let has_nan = firsts.iter().any(|b| b.nan);
        let has_inf = firsts.iter().any(|b| b.inf);
        if values.is_empty() || has_nan {
            return TensorStats {
                mean: f64::NAN,
                std: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
                has_nan,
                has_inf,
            };
        }
        #[allow(clippy::cast_precision_loss)] // exact below 2^53 elements
        let n = values.len() as f64;
        let mean = firsts.iter().fold(-0.0, |s, b| s + b.sum) / n;
        let var = blocks(values, |b| squares(b, mean))
            .into_iter()
            .fold(-0.0, |s, x| s + x)
            / n;
        TensorStats {
            mean,
            std: var.sqrt(),
            min: firsts.iter().map(|b| b.min).fold(f64::INFINITY, f64::min),
            max: firsts
                .iter()
                .map(|b| b.max)
                .fold(f64::NEG_INFINITY, f64::max),
            has_nan,
            has_inf,
        }
    }
}

/// Values per block of [`TensorStats::of_values`]'s sums: a quarter of a megabyte of `f32`,
/// enough work to hand to another thread.
pub const BLOCK: usize = 1 << 16;

/// `f(block)` for each block of [`BLOCK`] values, in order; on rayon's threads when there are
/// more than two.
fn blocks<T: Send>(values: &[f32], f: impl Fn(&[f32]) -> T + Sync + Send) -> Vec<T> {
    if values.len() > 2 * BLOCK {
        values.par_chunks(BLOCK).map(f).collect()
    } else {
        values.chunks(BLOCK).map(f).collect()
    }
}

/// A block's first pass.
struct FirstPass {
    sum: f64,
    min: f64,
    max: f64,
    nan: bool,
    inf: bool,
}

/// The sum (in lanes added pairwise), extremes and flags of a block.
fn first_pass(values: &[f32]) -> FirstPass {
    let (mut sums, mut min, mut max) = (
        [-0.0f64; LANES],
        [f64::INFINITY; LANES],
        [f64::NEG_INFINITY; LANES],
    );
    let (mut nan, mut inf) = ([false; LANES], [false; LANES]);
    // Comparisons rather than `f64::min` (which minds NaN): with a NaN the figures are NaN
    // anyway.
    let mut first = |lane: usize, v: f32| {
        let x = f64::from(v);
        sums[lane] += x;
        if x < min[lane] {
            min[lane] = x;
        }
        if x > max[lane] {
            max[lane] = x;
        }
        nan[lane] |= v.is_nan();
        inf[lane] |= v.is_infinite();
    };
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in chunk.iter().enumerate() {
            first(lane, v);
        }
    }
    for (lane, &v) in tail.iter().enumerate() {
        first(lane, v);
    }
    FirstPass {
        sum: pairwise(sums),
        min: min.into_iter().fold(f64::INFINITY, f64::min),
        max: max.into_iter().fold(f64::NEG_INFINITY, f64::max),
        nan: nan.contains(&true),
        inf: inf.contains(&true),
    }
}

/// The squared deviations of a block's values from `mean`, in lanes added pairwise.
fn squares(values: &[f32], mean: f64) -> f64 {
    let mut squares = [-0.0f64; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (s, &v) in squares.iter_mut().zip(chunk) {
            let d = f64::from(v) - mean;
            *s += d * d;
        }
    }
    for (s, &v) in squares.iter_mut().zip(tail) {
        let d = f64::from(v) - mean;
        *s += d * d;
    }
    pairwise(squares)
}

/// Partial sums in [`TensorStats::of_values`].
pub const LANES: usize = 8;

/// `((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))`.
fn pairwise(s: [f64; LANES]) -> f64 {
    ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
}

/// A number as Python's `f"{x:.6f}"` writes it: six decimals, `nan`, `inf`, `-inf`.
#[must_use]
pub fn format_value(x: f64) -> String {
    if x.is_nan() {
        "nan".to_owned()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.to_owned()
    } else {
        format!("{x:.6}")
    }
}

/// Python's spelling of a bool.
fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// One line per key, in key order, `key: <name> shape: <shape>` with the shape as a Python
/// tuple, for example `key: Dense_128/bias:0_grad shape: (125, 128)`. Lines are joined by `\n`
/// with no trailing newline; an empty map gives an empty string.
#[must_use]
pub fn format_keys(map: &BTreeMap<String, HostTensor>) -> String {
    let lines: Vec<String> = map
        .iter()
        .map(|(key, t)| format!("key: {key} shape: {}", format_shape(&t.shape)))
        .collect();
    lines.join("\n")
}

/// The statistics table: a header line with [`TABLE_HEADERS`], then one row per key in key
/// order with its index (from 0), the key, mean, std, minimum and maximum (see
/// [`format_value`]) and `True`/`False` for "any NaN" and "any infinity".
///
/// Laid out like pandas' `print(df)`: every column right-aligned to the width of its longest
/// cell or header, columns separated by two spaces, lines joined by `\n` with no trailing
/// newline. The `Index` column plays the part of the DataFrame's index, so there is no second,
/// unnamed one. An empty map gives [`NO_DATA`].
#[must_use]
pub fn format_table(map: &BTreeMap<String, HostTensor>) -> String {
    if map.is_empty() {
        return NO_DATA.to_owned();
    }
    let rows: Vec<[String; 8]> = map
        .iter()
        .enumerate()
        .map(|(i, (key, t))| {
            let s = TensorStats::of(t);
            [
                i.to_string(),
                key.clone(),
                format_value(s.mean),
                format_value(s.std),
                format_value(s.min),
                format_value(s.max),
                py_bool(s.has_nan).to_owned(),
                py_bool(s.has_inf).to_owned(),
            ]
        })
        .collect();
    let mut widths = TABLE_HEADERS.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        if !out.is_empty() {
            out.push('\n');
        }
        for (col, (cell, w)) in cells.zip(widths).enumerate() {
            let sep = if col == 0 { "" } else { "  " };
            // Writing to a String cannot fail.
            let _ = write!(out, "{sep}{cell:>w$}");
        }
    };
    line(&mut TABLE_HEADERS.iter().copied());
    for row in &rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], data: &[f32]) -> HostTensor {
        HostTensor::new(shape.to_vec(), data.to_vec()).unwrap()
    }

    /// The statistics as they were first written: a pass for each figure.
    fn reference(values: &[f32]) -> TensorStats {
        let has_nan = values.iter().any(|v| v.is_nan());
        let has_inf = values.iter().any(|v| v.is_infinite());
        if values.is_empty() || has_nan {
            return TensorStats {
                mean: f64::NAN,
                std: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
                has_nan,
                has_inf,
            };
        }
        let n = values.len() as f64;
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = values
            .iter()
            .map(|&v| {
                let d = f64::from(v) - mean;
                d * d
            })
            .sum::<f64>()
            / n;
        let (min, max) = values
            .iter()
            .map(|&v| f64::from(v))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
        TensorStats {
            mean,
            std: var.sqrt(),
            min,
            max,
            has_nan,
            has_inf,
        }
    }

    /// Same figures to the bit (NaN equal to NaN).
    fn assert_same(got: TensorStats, want: TensorStats, what: &str) {
        let bits = |s: TensorStats| {
            [s.mean, s.std, s.min, s.max].map(|x| if x.is_nan() { u64::MAX } else { x.to_bits() })
        };
        assert_eq!(bits(got), bits(want), "{what}: {got:?} != {want:?}");
        assert_eq!(
            (got.has_nan, got.has_inf),
            (want.has_nan, want.has_inf),
            "{what}"
        );
    }

    /// The same extremes and flags, and a mean and deviation within `rel` of the reference's.
    fn assert_close(got: TensorStats, want: TensorStats, rel: f64, what: &str) {
        assert_eq!(
            (
                got.min.to_bits(),
                got.max.to_bits(),
                got.has_nan,
                got.has_inf
            ),
            (
                want.min.to_bits(),
                want.max.to_bits(),
                want.has_nan,
                want.has_inf
            ),
            "{what}: {got:?} != {want:?}"
        );
        for (g, w) in [(got.mean, want.mean), (got.std, want.std)] {
            let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
            assert!(
                same || (g - w).abs() <= rel * w.abs().max(f64::MIN_POSITIVE),
                "{what}: {got:?} != {want:?}"
            );
        }
    }

    fn spread(n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 % 1009) as f32 - 504.3) * scale * (1.0 + (i % 13) as f32 * 1e-4))
            .collect()
    }

    fn cases() -> Vec<(&'static str, Vec<f32>)> {
        let mut cases: Vec<(&str, Vec<f32>)> = vec![
            ("empty", vec![]),
            ("one", vec![0.25]),
            ("negative zeros", vec![-0.0; 5]),
            ("zeros of both signs", vec![0.0, -0.0, -0.0]),
            ("gradients", spread(32_768, 1e-5)),
            ("activations", spread(40_963, 3e-3)),
            // Blocks summed on several threads: an epoch's tapped gradients.
            (
                "an epoch of gradients",
                (0..1_000_003usize)
                    .map(|i| (i * 7919 % 100_003) as f32 * 1e-6 - 0.04 + i as f32 * 1e-9)
                    .collect(),
            ),
            ("large", spread(1000, 1e30)),
            ("nan", vec![1.0, f32::NAN, 2.0]),
            ("nan and inf", vec![f32::NEG_INFINITY, f32::NAN]),
            ("inf", vec![1.0, f32::INFINITY]),
            ("both infs", vec![f32::INFINITY, 3.0, f32::NEG_INFINITY]),
            ("max", vec![f32::MAX, f32::MAX, -f32::MAX]),
            ("subnormal", vec![1e-45, -1e-45, 3e-45]),
        ];
        let mut late_nan = spread(5000, 1.0);
        late_nan[4999] = f32::NAN;
        cases.push(("late nan", late_nan));
        let mut nan_in_a_late_block = spread(300_000, 1.0);
        nan_in_a_late_block[299_990] = f32::NAN;
        nan_in_a_late_block[5] = f32::INFINITY;
        cases.push(("nan in a late block", nan_in_a_late_block));
        cases
    }

    #[test]
    fn statistics_are_one_running_sums_to_twelve_digits() {
        for (what, values) in &cases() {
            assert_close(
                TensorStats::of_values(values),
                reference(values),
                1e-12,
                what,
            );
        }
    }

    #[test]
    fn sums_go_to_fixed_lanes_added_pairwise() {
        // The order spelled out: in each block of 65536 values, value i to partial sum i % 8,
        // the eight added pairwise; the blocks' sums added in order.
        let lanes = |values: &[f32], f: &dyn Fn(f32) -> f64| {
            let mut total = -0.0f64;
            for block in values.chunks(65_536) {
                let mut s = [-0.0f64; 8];
                for (i, &v) in block.iter().enumerate() {
                    s[i % 8] += f(v);
                }
                total += ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
            }
            total
        };
        for (what, values) in &cases() {
            let want = reference(values);
            if values.is_empty() || want.has_nan {
                assert_same(TensorStats::of_values(values), want, what);
                continue;
            }
            let n = values.len() as f64;
            let mean = lanes(values, &f64::from) / n;
            let var = lanes(values, &|v| (f64::from(v) - mean) * (f64::from(v) - mean)) / n;
            let spelled = TensorStats {
                mean,
                std: var.sqrt(),
                ..want
            };
            assert_same(TensorStats::of_values(values), spelled, what);
        }
    }

    #[test]
    fn values_print_like_python_six_decimals() {
        assert_eq!(format_value(1.0), "1.000000");
        assert_eq!(format_value(-0.0), "-0.000000");
        assert_eq!(format_value(0.007_812_5), "0.007812"); // a tie rounds to even, as Python
        assert_eq!(format_value(f64::NAN), "nan");
        assert_eq!(format_value(f64::INFINITY), "inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-inf");
        assert_eq!(format_value(f64::from(0.1f32)), "0.100000");
    }

    #[test]
    fn stats_of_known_values() {
        let s = TensorStats::of(&t(&[4], &[1.0, 2.0, 3.0, 4.0]));
        assert_eq!(s.mean, 2.5);
        assert!((s.std - 1.25f64.sqrt()).abs() < 1e-15);
        assert_eq!((s.min, s.max), (1.0, 4.0));
        assert!(!s.has_nan && !s.has_inf);
    }

    #[test]
    fn nan_propagates_and_inf_follows_ieee() {
        let s = TensorStats::of(&t(&[3], &[1.0, f32::NAN, f32::INFINITY]));
        assert!(s.has_nan && s.has_inf);
        assert!(s.mean.is_nan() && s.std.is_nan() && s.min.is_nan() && s.max.is_nan());

        let s = TensorStats::of(&t(&[2], &[1.0, f32::INFINITY]));
        assert!(!s.has_nan && s.has_inf);
        assert_eq!(s.mean, f64::INFINITY);
        assert!(s.std.is_nan());
        assert_eq!((s.min, s.max), (1.0, f64::INFINITY));

        let s = TensorStats::of(&t(&[2], &[f32::NEG_INFINITY, f32::INFINITY]));
        assert!(s.mean.is_nan());
        assert_eq!((s.min, s.max), (f64::NEG_INFINITY, f64::INFINITY));
    }

    #[test]
    fn empty_tensor_gives_nan_without_flags() {
        let s = TensorStats::of(&t(&[0, 3], &[]));
        assert!(s.mean.is_nan() && s.std.is_nan() && s.min.is_nan() && s.max.is_nan());
        assert!(!s.has_nan && !s.has_inf);
    }

    #[test]
    fn f64_accumulation_keeps_small_spread_of_large_values() {
        // In f32 the sum of these rounds; in f64 the mean and spread are exact.
        let v: Vec<f32> = (0..1000)
            .map(|i| 16_777_216.0 + (i % 2) as f32 * 2.0)
            .collect();
        let s = TensorStats::of_values(&v);
        assert_eq!(s.mean, 16_777_217.0);
        assert_eq!(s.std, 1.0);
    }

    #[test]
    fn table_aligns_long_names_and_wide_numbers() {
        let mut m = BTreeMap::new();
        m.insert("a".to_owned(), t(&[1], &[-1234.5]));
        m.insert("long/name:0_grad".to_owned(), t(&[1], &[0.0]));
        let table = format_table(&m);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|l| l.len() == lines[0].len()));
        assert_eq!(
            lines[1],
            "    0                 a  -1234.500000  0.000000  -1234.500000  -1234.500000  \
             False  False"
        );
    }
}
