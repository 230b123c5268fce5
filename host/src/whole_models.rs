//! Whole models as they really ran: Graphcore's published training runs (fits, samples per
//! second) and Poplar's memory by category for whole programs, read from
//! `data/calibration/whole_models.toml`, and the comparison of an estimate with each.
//!
//! Where [`crate::calibration`] checks single ops against the IPU Model, this checks what
//! per-op calibration never exercises: code, exchange and vertex state summed over hundreds of
//! ops, the memory techniques the runs depend on, and a whole training step's time.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::summary::EstimateSummary;
use crate::sweep::Config;

/// The bundled set (`data/calibration/whole_models.toml`).
pub const BUNDLED: &str = include_str!("../../data/calibration/whole_models.toml");

/// Where the bundled set's model paths are relative to (the repository's `data/calibration`).
pub const BUNDLED_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/calibration");

/// Why a whole-model calibration file cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WholeModelError {
    /// Not TOML of the expected form.
    #[error("{0}")]
    Parse(String),
    /// A figure that cannot be compared (zero, negative or not a number).
    #[error("`{entry}`: {field} = {value} is not a positive figure")]
    Figure {
        /// The entry.
        entry: String,
        /// The field.
        field: &'static str,
        /// Its value.
        value: f64,
    },
}

/// A published training run: the model and options it ran with, and its throughput.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Run {
    /// What it is.
    pub name: String,
    /// The model file, relative to the calibration file's folder.
    pub model: String,
    /// Published samples per second (the whole system).
    pub samples_per_second: f64,
    /// Whether the figure includes the host's input pipeline (the device alone is then at
    /// least this fast).
    pub includes_host: bool,
    /// `tessera estimate`'s options, as sweep keys.
    pub options: BTreeMap<String, serde_json::Value>,
}

/// Poplar's memory by category for one IPU of a whole program (MB = 10^6 bytes).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// What it is.
    pub name: String,
    /// The model file, relative to the calibration file's folder.
    pub model: String,
    /// The IPU of the estimate the profile is of.
    pub ipu: usize,
    /// The pipeline stage the profile is of, when it is one of several stages on its IPU
    /// (`device_mapping`): the stage's own memory, as PopLiner attributes a profiled program
    /// to a range of layers.
    #[serde(default)]
    pub stage: Option<usize>,
    /// `tessera estimate`'s options, as sweep keys.
    pub options: BTreeMap<String, serde_json::Value>,
    /// Variables at their peak (always-live and not-always-live data).
    pub variables: f64,
    /// Vertex code.
    pub vertex_code: f64,
    /// Vertex state.
    pub vertex_state: f64,
    /// Internal exchange code.
    pub exchange_code: f64,
    /// Control code.
    pub control_code: f64,
    /// The sum of the categories above.
    pub total: f64,
    /// The fullest tile's bytes.
    pub fullest_tile_bytes: u64,
}

/// A whole-model calibration file.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WholeModels {
    /// Published runs.
    #[serde(default)]
    pub run: Vec<Run>,
    /// Poplar's memory profiles.
    #[serde(default)]
    pub profile: Vec<Profile>,
}

impl WholeModels {
    /// Reads a file's text.
    ///
    /// # Errors
    ///
    /// [`WholeModelError`] naming the entry or the TOML position at fault.
    pub fn parse(text: &str) -> Result<WholeModels, WholeModelError> {
        let w: WholeModels = toml::from_str(text)
            .map_err(|e| WholeModelError::Parse(crate::report::format::one_line(&e.to_string())))?;
        for r in &w.run {
            positive(&r.name, "samples_per_second", r.samples_per_second)?;
        }
        for p in &w.profile {
            for (field, v) in p.figures() {
                positive(&p.name, field, v)?;
            }
            positive(&p.name, "fullest_tile_bytes", p.fullest_tile_bytes as f64)?;
        }
        Ok(w)
    }
}

/// Estimates every entry of `w` (model paths relative to `dir`) as `tessera estimate MODEL
/// OPTIONS --json` would, and compares each: the published runs' fit and throughput, the
/// profiles' memory by category. An entry whose options Tessera cannot express, or whose
/// estimate fails, is a row saying why.
pub fn estimate_rows(w: &WholeModels, dir: &std::path::Path) -> (Vec<RunRow>, Vec<ProfileRow>) {
    use crate::estimation::{estimate, ModelSource};
    let one_line = crate::report::format::one_line;
    // Each entry as a sweep estimates a configuration.
    let estimate = |model: &str, c: &Config| -> Result<EstimateSummary, String> {
        let source = ModelSource::from_arg(&dir.join(model).display().to_string());
        let options = c
            .estimate_options(source.is_onnx())
            .map_err(|e| one_line(&e.to_string()))?;
        estimate(&source, &options)
            .map(|e| e.summary)
            .map_err(|e| one_line(&e.to_string()))
    };
    let runs = w
        .run
        .iter()
        .map(|r| {
            let e = estimate(&r.model, &r.config());
            RunRow::of(r, e.as_ref().map_err(Clone::clone))
        })
        .collect();
    let profiles = w
        .profile
        .iter()
        .map(|p| {
            let e = estimate(&p.model, &p.config());
            ProfileRow::of(p, e.as_ref().map_err(Clone::clone))
        })
        .collect();
    (runs, profiles)
}

fn positive(entry: &str, field: &'static str, value: f64) -> Result<(), WholeModelError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(WholeModelError::Figure {
            entry: entry.to_string(),
            field,
            value,
        })
    }
}

impl Run {
    /// The options as a sweep configuration (whose `options()` are the command line's).
    pub fn config(&self) -> Config {
        Config(self.options.clone())
    }
}

impl Profile {
    /// The options as a sweep configuration.
    pub fn config(&self) -> Config {
        Config(self.options.clone())
    }

    /// Poplar's figures by category, in MB.
    pub fn figures(&self) -> [(&'static str, f64); 6] {
        [
            ("variables", self.variables),
            ("vertex_code", self.vertex_code),
            ("vertex_state", self.vertex_state),
            ("exchange_code", self.exchange_code),
            ("control_code", self.control_code),
            ("total", self.total),
        ]
    }
}

/// A published run beside its estimate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunRow {
    /// The run.
    pub name: String,
    /// Whether the estimate fits on every tile (the run did).
    pub fits: Option<bool>,
    /// Estimated samples per second.
    pub samples_per_second: Option<f64>,
    /// Published samples per second.
    pub published: f64,
    /// Estimated over published.
    pub ratio: Option<f64>,
    /// Whether the published figure includes the host.
    pub includes_host: bool,
    /// Why there is no estimate, if there is none.
    pub error: Option<String>,
}

impl RunRow {
    /// The run's row from its estimate, or from why there is none.
    pub fn of(run: &Run, estimate: Result<&EstimateSummary, String>) -> RunRow {
        match estimate {
            Ok(e) => RunRow {
                name: run.name.clone(),
                fits: Some(e.fits),
                samples_per_second: Some(e.samples_per_second),
                published: run.samples_per_second,
                ratio: Some(e.samples_per_second / run.samples_per_second),
                includes_host: run.includes_host,
                error: None,
            },
            Err(why) => RunRow {
                name: run.name.clone(),
                fits: None,
                samples_per_second: None,
                published: run.samples_per_second,
                ratio: None,
                includes_host: run.includes_host,
                error: Some(why),
            },
        }
    }
}

/// One category of a profile beside the estimate's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CategoryRow {
    /// The category (`variables`, `vertex_code`, ..., `total`, `fullest_tile`).
    pub category: &'static str,
    /// The estimate's figure (MB; bytes for the fullest tile).
    pub ours: f64,
    /// Poplar's.
    pub poplar: f64,
    /// Ours over Poplar's.
    pub ratio: f64,
}

/// A profile beside its estimate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProfileRow {
    /// The profile.
    pub name: String,
    /// Its categories, then the total and the fullest tile.
    pub categories: Vec<CategoryRow>,
    /// Why there is no estimate, if there is none.
    pub error: Option<String>,
}

/// The estimate's figure for a profile category, in MB, from one IPU's bytes by category:
/// `variables` is always-live, not-always-live, stash and exchange buffers (received data,
/// which Poplar holds in destination variables); `total` the five categories' sum, as PopLiner
/// sums them (no stack, no gaps).
pub fn category_mb(categories: &BTreeMap<&'static str, u64>, category: &str) -> f64 {
    const VARIABLES: [&str; 4] = [
        "always_live",
        "not_always_live",
        "stash",
        "exchange_buffers",
    ];
    const CODE_AND_STATE: [&str; 4] = [
        "vertex_code",
        "vertex_state",
        "exchange_code",
        "control_code",
    ];
    let sum = |keys: &[&str]| -> u64 {
        keys.iter()
            .map(|k| categories.get(k).copied().unwrap_or(0))
            .sum()
    };
    let bytes = match category {
        "variables" => sum(&VARIABLES),
        "total" => sum(&VARIABLES) + sum(&CODE_AND_STATE),
        other => sum(&[other]),
    };
    bytes as f64 / 1e6
}

impl ProfileRow {
    /// The profile's row from its estimate, or from why there is none.
    pub fn of(p: &Profile, estimate: Result<&EstimateSummary, String>) -> ProfileRow {
        let e = match estimate {
            Ok(e) => e,
            Err(why) => {
                return ProfileRow {
                    name: p.name.clone(),
                    categories: Vec::new(),
                    error: Some(why),
                }
            }
        };
        let Some(ipu) = e.ipus.iter().find(|i| i.ipu == p.ipu) else {
            return ProfileRow {
                name: p.name.clone(),
                categories: Vec::new(),
                error: Some(format!(
                    "the estimate has {} IPU(s), not IPU {}",
                    e.ipus.len(),
                    p.ipu
                )),
            };
        };
        let (categories_of, max_tile_bytes) = match p.stage {
            None => (&ipu.categories, ipu.max_tile_bytes),
            Some(k) => match e.stages.get(k).and_then(|s| s.memory.as_ref().map(|m| (s, m))) {
                Some((s, m)) if s.ipu == p.ipu => (&m.categories, m.max_tile_bytes),
                _ => {
                    return ProfileRow {
                        name: p.name.clone(),
                        categories: Vec::new(),
                        error: Some(format!(
                            "the estimate has no memory of stage {k} on IPU {} of its own (a stage's own memory is given when its IPU holds other stages too)",
                            p.ipu
                        )),
                    }
                }
            },
        };
        let mut categories: Vec<CategoryRow> = p
            .figures()
            .iter()
            .map(|&(category, poplar)| {
                let ours = category_mb(categories_of, category);
                CategoryRow {
                    category,
                    ours,
                    poplar,
                    ratio: ours / poplar,
                }
            })
            .collect();
        categories.push(CategoryRow {
            category: "fullest_tile",
            ours: max_tile_bytes as f64,
            poplar: p.fullest_tile_bytes as f64,
            ratio: max_tile_bytes as f64 / p.fullest_tile_bytes as f64,
        });
        ProfileRow {
            name: p.name.clone(),
            categories,
            error: None,
        }
    }
}

/// What `tessera calibrate --check` asks of the whole-model rows (issue-level acceptance):
/// a published run fits and is estimated within `run_tolerance` of its throughput (a figure
/// that includes the host's input pipeline between 1.0x and `1 + run_tolerance` of it, as
/// the device alone is at least that fast); each of a profile's categories within
/// `category_tolerance` of Poplar's, its total and fullest tile within `total_tolerance`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct WholeModelBounds {
    /// Relative tolerance on a published run's samples per second.
    pub run_tolerance: f64,
    /// Relative tolerance on each profile category.
    pub category_tolerance: f64,
    /// Relative tolerance on a profile's total and fullest tile.
    pub total_tolerance: f64,
}

impl Default for WholeModelBounds {
    fn default() -> Self {
        WholeModelBounds {
            run_tolerance: 0.10,
            category_tolerance: 0.25,
            total_tolerance: 0.10,
        }
    }
}

impl WholeModelBounds {
    /// Every row outside the bounds, one line each naming the row and the figure.
    pub fn breaks(&self, runs: &[RunRow], profiles: &[ProfileRow]) -> Vec<String> {
        let mut out = Vec::new();
        for r in runs {
            let (Some(fits), Some(ratio)) = (r.fits, r.ratio) else {
                out.push(format!(
                    "{}: no estimate ({})",
                    r.name,
                    r.error.as_deref().unwrap_or("unknown")
                ));
                continue;
            };
            if !fits {
                out.push(format!("{}: does not fit, but the run did", r.name));
            }
            let low = if r.includes_host {
                1.0
            } else {
                1.0 - self.run_tolerance
            };
            let high = 1.0 + self.run_tolerance;
            if !(low..=high).contains(&ratio) {
                out.push(format!(
                    "{}: {ratio:.2}x of the published throughput (bounds {low:.2}x to {high:.2}x)",
                    r.name
                ));
            }
        }
        for p in profiles {
            if let Some(why) = &p.error {
                out.push(format!("{}: no estimate ({why})", p.name));
                continue;
            }
            for c in &p.categories {
                let tolerance = if matches!(c.category, "total" | "fullest_tile") {
                    self.total_tolerance
                } else {
                    self.category_tolerance
                };
                if (c.ratio - 1.0).abs() > tolerance {
                    out.push(format!(
                        "{}: {} {:.2}x of Poplar's (bound {:.0}%)",
                        p.name,
                        c.category,
                        c.ratio,
                        tolerance * 100.0
                    ));
                }
            }
        }
        out
    }
}

/// The published runs' table.
pub struct RunTable<'a>(pub &'a [RunRow]);

impl fmt::Display for RunTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<40} {:>5} {:>12} {:>12} {:>7}",
            "published run", "fits", "samples/s", "published", "ratio"
        )?;
        for r in self.0 {
            match &r.error {
                Some(why) => writeln!(f, "{:<40} not estimated: {why}", r.name)?,
                None => writeln!(
                    f,
                    "{:<40} {:>5} {:>12.0} {:>12.0} {:>6.2}x{}",
                    r.name,
                    if r.fits == Some(true) { "yes" } else { "NO" },
                    r.samples_per_second.unwrap_or(0.0),
                    r.published,
                    r.ratio.unwrap_or(0.0),
                    if r.includes_host {
                        " (published figure includes the host)"
                    } else {
                        ""
                    }
                )?,
            }
        }
        Ok(())
    }
}

/// The profiles' table.
pub struct ProfileTable<'a>(pub &'a [ProfileRow]);

impl fmt::Display for ProfileTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in self.0 {
            writeln!(f, "{}", p.name)?;
            if let Some(why) = &p.error {
                writeln!(f, "  not estimated: {why}")?;
                continue;
            }
            writeln!(
                f,
                "  {:<14} {:>12} {:>12} {:>7}",
                "category", "Tessera", "Poplar", "ratio"
            )?;
            for c in &p.categories {
                if c.category == "fullest_tile" {
                    writeln!(
                        f,
                        "  {:<14} {:>9.0} B  {:>9.0} B  {:>6.2}x",
                        c.category, c.ours, c.poplar, c.ratio
                    )?;
                } else {
                    writeln!(
                        f,
                        "  {:<14} {:>9.2} MB {:>9.2} MB {:>6.2}x",
                        c.category, c.ours, c.poplar, c.ratio
                    )?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_model_bounds_name_each_row_outside_them() {
        let run = |name: &str, fits, ratio, includes_host| RunRow {
            name: name.into(),
            fits: Some(fits),
            samples_per_second: Some(ratio * 100.0),
            published: 100.0,
            ratio: Some(ratio),
            includes_host,
            error: None,
        };
        let b = WholeModelBounds::default();
        // Within 10%; a host-inclusive figure from 1.0x up.
        assert!(b
            .breaks(
                &[run("a", true, 0.95, false), run("b", true, 1.05, true)],
                &[]
            )
            .is_empty());
        let out = b.breaks(
            &[
                run("slow", true, 0.85, false),
                run("host", true, 0.97, true),
                run("big", false, 1.0, false),
            ],
            &[],
        );
        assert_eq!(out.len(), 3, "{out:?}");
        assert!(out[0].starts_with("slow: 0.85x"));
        assert!(out[1].starts_with("host: 0.97x"));
        assert_eq!(out[2], "big: does not fit, but the run did");
        let profile = ProfileRow {
            name: "p".into(),
            categories: vec![
                CategoryRow {
                    category: "vertex_state",
                    ours: 1.2,
                    poplar: 1.0,
                    ratio: 1.2,
                },
                CategoryRow {
                    category: "total",
                    ours: 1.2,
                    poplar: 1.0,
                    ratio: 1.2,
                },
            ],
            error: None,
        };
        // A category may be 25% off, the total only 10%.
        assert_eq!(
            b.breaks(&[], &[profile]),
            ["p: total 1.20x of Poplar's (bound 10%)"]
        );
    }

    #[test]
    fn the_bundled_set_reads_with_the_published_figures() {
        let w = WholeModels::parse(BUNDLED).unwrap();
        assert_eq!(w.run.len(), 5);
        assert_eq!(w.run[0].samples_per_second, 16391.0);
        assert_eq!(w.run[1].samples_per_second, 1470.0);
        assert!(!w.run[1].includes_host);
        assert!(w.run[1].model.ends_with("bert_large_qkv_384.stripped.onnx"));
        assert!(w.run[2].includes_host);
        assert_eq!(w.run[3].samples_per_second, 178212.0);
        assert!(w.run[3].config().options().iter().any(|o| o == "128"));
        assert_eq!(w.run[4].samples_per_second, 7062.0);
        assert!(w.run[4].config().options().iter().any(|o| o == "c600"));
        assert_eq!(w.profile.len(), 2);
        assert_eq!(w.profile[0].fullest_tile_bytes, 336_670);
        for r in &w.run {
            let dir = std::path::Path::new(BUNDLED_DIR);
            assert!(dir.join(&r.model).is_file(), "{}", r.model);
            assert!(r.config().options().iter().any(|o| o == "--batch-size"));
        }
        // The sums of the profiles' categories are their totals (to PopLiner's rounding).
        for p in &w.profile {
            let sum: f64 = p.figures()[..5].iter().map(|(_, v)| v).sum();
            assert!(
                (sum - p.total).abs() < 0.1,
                "{}: {sum} vs {}",
                p.name,
                p.total
            );
        }
    }

    #[test]
    fn bad_files_name_the_entry() {
        let e = WholeModels::parse(
            "[[run]]\nname = 'x'\nmodel = 'm'\nsamples_per_second = 0.0\nincludes_host = false\noptions = {}\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("`x`: samples_per_second"), "{e}");
        let e = WholeModels::parse("[[run]]\nname = 'x'\n").unwrap_err();
        assert!(e.to_string().contains("missing field"), "{e}");
    }

    #[test]
    fn categories_sum_as_poplar_counts_them() {
        let mut c = BTreeMap::new();
        for (k, v) in [
            ("always_live", 100_000_000u64),
            ("not_always_live", 20_000_000),
            ("stash", 5_000_000),
            ("exchange_buffers", 1_000_000),
            ("vertex_code", 2_000_000),
            ("vertex_state", 3_000_000),
            ("exchange_code", 4_000_000),
            ("control_code", 6_000_000),
            ("stack", 1_500_000),
        ] {
            c.insert(k, v);
        }
        assert_eq!(category_mb(&c, "variables"), 126.0);
        assert_eq!(category_mb(&c, "exchange_code"), 4.0);
        // No stack in the total, as PopLiner leaves it out.
        assert_eq!(category_mb(&c, "total"), 141.0);
    }
}
