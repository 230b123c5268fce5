//! The op-level estimates against Graphcore's IPU Model: every row of a calibration set
//! (`data/calibration/ipu_model_ops.csv`, bundled) estimated as `tessera estimate-op` would,
//! and the errors of cycles, total memory and the fullest tile, with their medians.
//!
//! The set's benchmarks are poplibs' tools: `gemm_MxKxN` (`general_matrix_multiply`, half
//! precision) and `fc_layer_B_I_O_float` (`fully_connected_layer`, float, forward, backward and
//! weight-update passes). Targets `IpuModel1` and `IpuModel2` are the Mk1 and Mk2 presets.

use std::fmt;

use serde::Serialize;
use tessera_core::DType;
use tessera_sim::machine::{IpuConfig, Preset};
use tessera_sim::op_estimates::{fully_connected_training, matmul, OpError, OpEstimate};

/// The calibration set shipped with Tessera (poplibs' published IPU Model figures).
pub const BUNDLED: &str = include_str!("../../data/calibration/ipu_model_ops.csv");

/// The header a calibration file starts with.
pub const HEADER: &str = "target,benchmark,cycles,total_memory_bytes,max_tile_bytes";

/// Why a calibration file cannot be read or a row cannot be estimated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CalibrationError {
    /// The first line is not [`HEADER`].
    #[error("line 1: expected the header `{HEADER}`, found `{found}`")]
    Header {
        /// The line found.
        found: String,
    },
    /// A row has the wrong number of fields or a figure that is not a whole number.
    #[error("line {line}: {what}")]
    Row {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        what: String,
    },
    /// A target other than `IpuModel1` / `IpuModel2`.
    #[error("line {line}: unknown target `{target}` (known: IpuModel1 = Mk1, IpuModel2 = Mk2)")]
    Target {
        /// 1-based line number.
        line: usize,
        /// The target found.
        target: String,
    },
    /// A benchmark name that is neither `gemm_MxKxN` nor `fc_layer_B_I_O_float`.
    #[error("line {line}: unknown benchmark `{name}` (known: gemm_MxKxN, fc_layer_B_I_O_float)")]
    Benchmark {
        /// 1-based line number.
        line: usize,
        /// The name found.
        name: String,
    },
    /// The estimate of a row failed.
    #[error("line {line} ({benchmark}): {source}")]
    Estimate {
        /// 1-based line number.
        line: usize,
        /// The row's benchmark.
        benchmark: String,
        /// Why.
        source: OpError,
    },
}

/// What a calibration row runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Benchmark {
    /// `C = A.B + C`, A is `m x k`, B is `k x n`, half precision.
    Gemm {
        /// Rows of A.
        m: usize,
        /// Columns of A, rows of B.
        k: usize,
        /// Columns of B.
        n: usize,
    },
    /// A fully-connected layer in float: forward, backward and weight-update passes.
    FullyConnected {
        /// Batch size.
        batch: usize,
        /// Input size.
        input: usize,
        /// Output size.
        output: usize,
    },
}

/// Cycles and memory of one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Figures {
    /// Cycles.
    pub cycles: u64,
    /// Bytes over all tiles.
    pub total_memory_bytes: u64,
    /// The fullest tile's bytes.
    pub max_tile_bytes: u64,
}

/// One row of a calibration set.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// 1-based line in the file.
    pub line: usize,
    /// The IPU Model target (`IpuModel1`, `IpuModel2`).
    pub target: String,
    /// The benchmark's name in the file.
    pub benchmark: String,
    /// What it runs.
    #[serde(skip)]
    pub op: Benchmark,
    /// Our preset for the target.
    #[serde(skip)]
    pub preset: Preset,
    /// The IPU Model's figures.
    pub reference: Figures,
}

/// A row with Tessera's estimate of it.
#[derive(Clone, Debug, Serialize)]
pub struct Compared {
    /// The row.
    #[serde(flatten)]
    pub row: Row,
    /// Tessera's figures.
    pub estimate: Figures,
}

impl Compared {
    /// Ours over the IPU Model's, for cycles, total memory and the fullest tile.
    pub fn ratios(&self) -> [f64; 3] {
        let (e, r) = (&self.estimate, &self.row.reference);
        [
            ratio(e.cycles, r.cycles),
            ratio(e.total_memory_bytes, r.total_memory_bytes),
            ratio(e.max_tile_bytes, r.max_tile_bytes),
        ]
    }
}

fn ratio(ours: u64, theirs: u64) -> f64 {
    ours as f64 / theirs.max(1) as f64
}

/// Reads a calibration file's rows (header first, then `target,benchmark,cycles,
/// total_memory_bytes,max_tile_bytes`; blank lines skipped).
///
/// # Errors
///
/// [`CalibrationError`] naming the line at fault.
pub fn parse(text: &str) -> Result<Vec<Row>, CalibrationError> {
    let mut lines = text.lines().enumerate();
    let header = lines.next().map(|(_, l)| l.trim()).unwrap_or_default();
    if header != HEADER {
        return Err(CalibrationError::Header {
            found: header.to_string(),
        });
    }
    let mut rows = Vec::new();
    for (i, l) in lines {
        let line = i + 1;
        if l.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        if f.len() != 5 {
            return Err(CalibrationError::Row {
                line,
                what: format!("expected 5 fields, found {}", f.len()),
            });
        }
        let preset = match f[0] {
            "IpuModel1" => Preset::Mk1,
            "IpuModel2" => Preset::Mk2,
            t => {
                return Err(CalibrationError::Target {
                    line,
                    target: t.to_string(),
                })
            }
        };
        let op = benchmark(f[1]).ok_or_else(|| CalibrationError::Benchmark {
            line,
            name: f[1].to_string(),
        })?;
        let figure = |k: usize, what: &str| {
            f[k].parse::<u64>().map_err(|_| CalibrationError::Row {
                line,
                what: format!("{what} `{}` is not a whole number", f[k]),
            })
        };
        rows.push(Row {
            line,
            target: f[0].to_string(),
            benchmark: f[1].to_string(),
            op,
            preset,
            reference: Figures {
                cycles: figure(2, "cycles")?,
                total_memory_bytes: figure(3, "total_memory_bytes")?,
                max_tile_bytes: figure(4, "max_tile_bytes")?,
            },
        });
    }
    Ok(rows)
}

/// The benchmark a name stands for: `gemm_MxKxN` or `fc_layer_B_I_O_float`.
fn benchmark(name: &str) -> Option<Benchmark> {
    let sizes = |s: &str, sep: char| -> Option<Vec<usize>> {
        let v: Option<Vec<usize>> = s.split(sep).map(|x| x.parse().ok()).collect();
        v.filter(|v| v.len() == 3 && v.iter().all(|&x| x > 0))
    };
    if let Some(rest) = name.strip_prefix("gemm_") {
        let v = sizes(rest, 'x')?;
        return Some(Benchmark::Gemm {
            m: v[0],
            k: v[1],
            n: v[2],
        });
    }
    let rest = name.strip_prefix("fc_layer_")?.strip_suffix("_float")?;
    let v = sizes(rest, '_')?;
    Some(Benchmark::FullyConnected {
        batch: v[0],
        input: v[1],
        output: v[2],
    })
}

/// Tessera's estimate of a row, as `tessera estimate-op` makes it: `matmul M K N --data-type
/// f16`, or `fc` with its three passes (cycles summed, memory the largest pass's).
///
/// # Errors
///
/// [`CalibrationError::Estimate`] when the op cannot be estimated.
pub fn estimate(row: &Row) -> Result<Figures, CalibrationError> {
    let cfg = IpuConfig::preset(row.preset);
    let err = |source| CalibrationError::Estimate {
        line: row.line,
        benchmark: row.benchmark.clone(),
        source,
    };
    let passes = match row.op {
        Benchmark::Gemm { m, k, n } => {
            vec![matmul(&cfg, m, k, n, DType::F16, false, false).map_err(err)?]
        }
        Benchmark::FullyConnected {
            batch,
            input,
            output,
        } => fully_connected_training(&cfg, batch, input, output, 1, DType::F32).map_err(err)?,
    };
    Ok(Figures::of_passes(&passes))
}

impl Figures {
    /// The figures of an op run as `passes` one after the other: cycles summed, memory the
    /// largest pass's (as `tessera estimate-op` reports a layer's passes).
    pub fn of_passes(passes: &[OpEstimate]) -> Figures {
        Figures {
            cycles: passes.iter().map(|p| p.cycles).sum(),
            total_memory_bytes: passes
                .iter()
                .map(|p| p.total_memory_bytes)
                .max()
                .unwrap_or(0),
            max_tile_bytes: passes.iter().map(|p| p.max_tile_bytes).max().unwrap_or(0),
        }
    }
}

/// Every row estimated.
///
/// # Errors
///
/// The first row that cannot be estimated.
pub fn compare(rows: Vec<Row>) -> Result<Vec<Compared>, CalibrationError> {
    rows.into_iter()
        .map(|row| {
            let estimate = estimate(&row)?;
            Ok(Compared { row, estimate })
        })
        .collect()
}

/// The errors of a set of compared rows.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Rows.
    pub rows: usize,
    /// Median of |ours / theirs - 1| for cycles, total memory and the fullest tile.
    pub median_abs_error: [f64; 3],
    /// The row furthest off in cycles, as a factor (at least 1: 2.0 is half or twice).
    pub worst_cycles_factor: f64,
    /// Rows more than 2x off in cycles.
    pub cycles_rows_over_2x: usize,
}

/// The acceptance bounds of the calibration: medians of |error| and the worst cycles factor.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Bounds {
    /// Most median |error| of cycles, total memory and the fullest tile.
    pub median_abs_error: [f64; 3],
    /// Most factor any row's cycles may be off.
    pub worst_cycles_factor: f64,
}

impl Default for Bounds {
    /// 15% for cycles and total memory, 25% for the fullest tile, no row 2x off in cycles.
    fn default() -> Self {
        Bounds {
            median_abs_error: [0.15, 0.15, 0.25],
            worst_cycles_factor: 2.0,
        }
    }
}

/// The figures' names, in [`Compared::ratios`] order.
pub const FIGURES: [&str; 3] = ["cycles", "total memory", "fullest tile"];

impl Summary {
    /// The summary of `rows`.
    pub fn of(rows: &[Compared]) -> Summary {
        let mut median_abs_error = [0.0; 3];
        for (f, m) in median_abs_error.iter_mut().enumerate() {
            let mut e: Vec<f64> = rows.iter().map(|c| (c.ratios()[f] - 1.0).abs()).collect();
            e.sort_by(f64::total_cmp);
            *m = median(&e);
        }
        let factor = |c: &Compared| {
            let r = c.ratios()[0];
            if r > 0.0 {
                r.max(1.0 / r)
            } else {
                f64::INFINITY
            }
        };
        Summary {
            rows: rows.len(),
            median_abs_error,
            worst_cycles_factor: rows.iter().map(factor).fold(1.0, f64::max),
            cycles_rows_over_2x: rows.iter().filter(|c| factor(c) > 2.0).count(),
        }
    }

    /// The bounds this summary breaks, one line each (empty when it meets them all).
    pub fn breaks(&self, b: &Bounds) -> Vec<String> {
        let mut out = Vec::new();
        for ((name, got), most) in FIGURES
            .iter()
            .zip(self.median_abs_error)
            .zip(b.median_abs_error)
        {
            if got > most {
                out.push(format!(
                    "median |error| of {name} is {:.1}%, above {:.0}%",
                    100.0 * got,
                    100.0 * most
                ));
            }
        }
        if self.worst_cycles_factor > b.worst_cycles_factor {
            out.push(format!(
                "{} row(s) off by more than {}x in cycles (worst {:.2}x)",
                self.cycles_rows_over_2x, b.worst_cycles_factor, self.worst_cycles_factor
            ));
        }
        out
    }
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The error table: one line per row (ours, the IPU Model's and the ratio of each figure),
/// then the medians.
pub struct Table<'a>(pub &'a [Compared]);

impl fmt::Display for Table<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<10} {:<28} {:>10} {:>10} {:>6}  {:>11} {:>11} {:>6}  {:>9} {:>9} {:>6}",
            "target",
            "benchmark",
            "cycles",
            "IPU Model",
            "ratio",
            "memory",
            "IPU Model",
            "ratio",
            "tile",
            "IPU Model",
            "ratio"
        )?;
        for c in self.0 {
            let r = c.ratios();
            let (e, m) = (&c.estimate, &c.row.reference);
            writeln!(
                f,
                "{:<10} {:<28} {:>10} {:>10} {:>6.2}  {:>11} {:>11} {:>6.2}  {:>9} {:>9} {:>6.2}",
                c.row.target,
                c.row.benchmark,
                e.cycles,
                m.cycles,
                r[0],
                e.total_memory_bytes,
                m.total_memory_bytes,
                r[1],
                e.max_tile_bytes,
                m.max_tile_bytes,
                r[2]
            )?;
        }
        let s = Summary::of(self.0);
        write!(
            f,
            "{} rows; median |error|: cycles {:.1}%, total memory {:.1}%, fullest tile {:.1}%; worst cycles factor {:.2}x ({} row(s) more than 2x off)",
            s.rows,
            100.0 * s.median_abs_error[0],
            100.0 * s.median_abs_error[1],
            100.0 * s.median_abs_error[2],
            s.worst_cycles_factor,
            s.cycles_rows_over_2x
        )
    }
}

/// Everything `tessera calibrate` compares: the op table's rows with their summary and the
/// bounds they are held to, and (unless only the ops were asked for) Graphcore's published
/// whole-model runs and Poplar's memory profiles beside their estimates.
#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    /// Each op row's estimate beside the IPU Model's figures.
    pub rows: Vec<Compared>,
    /// Their medians and worst rows.
    pub summary: Summary,
    /// The bounds the op table is held to.
    pub bounds: Bounds,
    /// How the op table falls outside them.
    pub breaks: Vec<String>,
    /// The bounds of the whole models.
    pub whole_model_bounds: crate::whole_models::WholeModelBounds,
    /// How the whole models fall outside them.
    pub whole_model_breaks: Vec<String>,
    /// The published runs beside their estimates.
    pub published_runs: Vec<crate::whole_models::RunRow>,
    /// Poplar's memory profiles beside their estimates.
    pub profiles: Vec<crate::whole_models::ProfileRow>,
}

impl Calibration {
    /// Whether everything is within its bounds.
    pub fn within_bounds(&self) -> bool {
        self.breaks.is_empty() && self.whole_model_breaks.is_empty()
    }
}

/// Why a calibration could not be run: a file that cannot be read or used, named.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct CalibrateError {
    /// The file (or "the bundled ..." set).
    pub file: String,
    /// What is wrong.
    pub message: String,
}

/// Runs a calibration: the op table of `ops` (a CSV of [`HEADER`]'s form; the bundled
/// [`BUNDLED`] when `None`), and unless `ops_only` the whole models of `whole_models` (a TOML
/// of [`crate::whole_models`]' form; the bundled set when `None`).
pub fn calibrate(
    ops: Option<&std::path::Path>,
    whole_models: Option<&std::path::Path>,
    ops_only: bool,
) -> Result<Calibration, CalibrateError> {
    use crate::whole_models::{self as wm, WholeModelBounds, WholeModels};
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).map_err(|e| CalibrateError {
            file: p.display().to_string(),
            message: format!("cannot read: {e}"),
        })
    };
    let text = match ops {
        Some(p) => read(p)?,
        None => BUNDLED.to_string(),
    };
    let file = ops.map_or("the bundled calibration set".to_string(), |p| {
        p.display().to_string()
    });
    let bad = |e: CalibrationError| CalibrateError {
        file: file.clone(),
        message: e.to_string(),
    };
    let rows = compare(parse(&text).map_err(bad)?).map_err(bad)?;
    let summary = Summary::of(&rows);
    let breaks = summary.breaks(&Bounds::default());
    let (published_runs, profiles) = if ops_only {
        (Vec::new(), Vec::new())
    } else {
        let (text, dir) = match whole_models {
            Some(p) => (
                read(p)?,
                p.parent()
                    .map(std::path::Path::to_path_buf)
                    .unwrap_or_default(),
            ),
            None => (
                wm::BUNDLED.to_string(),
                std::path::PathBuf::from(wm::BUNDLED_DIR),
            ),
        };
        let w = WholeModels::parse(&text).map_err(|e| CalibrateError {
            file: whole_models.map_or("the bundled whole-model set".to_string(), |p| {
                p.display().to_string()
            }),
            message: e.to_string(),
        })?;
        wm::estimate_rows(&w, &dir)
    };
    let whole_model_bounds = WholeModelBounds::default();
    let whole_model_breaks = whole_model_bounds.breaks(&published_runs, &profiles);
    Ok(Calibration {
        rows,
        summary,
        bounds: Bounds::default(),
        breaks,
        whole_model_bounds,
        whole_model_breaks,
        published_runs,
        profiles,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_set_reads_and_every_row_estimates() {
        let rows = parse(BUNDLED).unwrap();
        assert_eq!(rows.len(), 44);
        assert_eq!(rows[0].line, 2);
        let compared = compare(rows).unwrap();
        for c in &compared {
            for r in c.ratios() {
                assert!(r.is_finite() && r > 0.0, "{:?}", c);
            }
        }
        let s = Summary::of(&compared);
        assert_eq!(s.rows, 44);
        assert!(s.worst_cycles_factor >= 1.0);
        // The model stays within the default bounds on the bundled set (median |error| 15%
        // for cycles and total memory, 25% for the fullest tile, no row 2x off in cycles).
        let breaks = s.breaks(&Bounds::default());
        assert!(breaks.is_empty(), "{breaks:?}: {s:?}");
    }

    #[test]
    fn names_parse() {
        assert_eq!(
            benchmark("gemm_200x64x10000"),
            Some(Benchmark::Gemm {
                m: 200,
                k: 64,
                n: 10000
            })
        );
        assert_eq!(
            benchmark("fc_layer_16_1000_5_float"),
            Some(Benchmark::FullyConnected {
                batch: 16,
                input: 1000,
                output: 5
            })
        );
        for bad in [
            "gemm_1x2",
            "gemm_0x1x1",
            "fc_layer_1_2_3_half",
            "conv_1x1x1",
            "gemm_axbxc",
        ] {
            assert_eq!(benchmark(bad), None, "{bad}");
        }
    }

    #[test]
    fn bad_files_name_the_line() {
        let cases = [
            ("cycles,target\n", "line 1: expected the header"),
            (
                "target,benchmark,cycles,total_memory_bytes,max_tile_bytes\nIpuModel1,gemm_1x1x1,3\n",
                "line 2: expected 5 fields, found 3",
            ),
            (
                "target,benchmark,cycles,total_memory_bytes,max_tile_bytes\n\nIpuModel9,gemm_1x1x1,1,2,3\n",
                "line 3: unknown target `IpuModel9`",
            ),
            (
                "target,benchmark,cycles,total_memory_bytes,max_tile_bytes\nIpuModel2,conv_3,1,2,3\n",
                "line 2: unknown benchmark `conv_3`",
            ),
            (
                "target,benchmark,cycles,total_memory_bytes,max_tile_bytes\nIpuModel2,gemm_1x1x1,1,-2,3\n",
                "line 2: total_memory_bytes `-2` is not a whole number",
            ),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{e} / {want}");
        }
    }

    #[test]
    fn medians_and_bounds() {
        let row = |cycles, mem, tile| Compared {
            row: Row {
                line: 2,
                target: "IpuModel2".into(),
                benchmark: "gemm_1x1x1".into(),
                op: Benchmark::Gemm { m: 1, k: 1, n: 1 },
                preset: Preset::Mk2,
                reference: Figures {
                    cycles: 100,
                    total_memory_bytes: 100,
                    max_tile_bytes: 100,
                },
            },
            estimate: Figures {
                cycles,
                total_memory_bytes: mem,
                max_tile_bytes: tile,
            },
        };
        let rows = [row(110, 100, 50), row(90, 120, 100), row(300, 100, 100)];
        let s = Summary::of(&rows);
        // |errors| of cycles 0.1, 0.1, 2.0; memory 0, 0.2, 0; tile 0.5, 0, 0.
        assert!((s.median_abs_error[0] - 0.1).abs() < 1e-12);
        assert_eq!(s.median_abs_error[1], 0.0);
        assert_eq!(s.median_abs_error[2], 0.0);
        assert_eq!(s.worst_cycles_factor, 3.0);
        assert_eq!(s.cycles_rows_over_2x, 1);
        let broken = s.breaks(&Bounds::default());
        assert_eq!(broken.len(), 1, "{broken:?}");
        assert!(broken[0].contains("more than 2x"));
        assert!(Summary::of(&rows[..2])
            .breaks(&Bounds::default())
            .is_empty());
    }
}
