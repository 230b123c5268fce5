//! A sweep specification: a TOML file naming the configurations to estimate.
//!
//! ```toml
//! name = "bert-base"                     # optional; the file's stem by default
//!
//! [base]                                 # what every configuration shares
//! model = "../data/onnx/bert_base.stripped.onnx"
//! dtype = "f16"
//! optimizer = "adam"
//!
//! [grid]                                 # axes: every combination is a configuration
//! batch_size = [1, 2, 4]
//! gradient_accumulation_count = [8, 16, 32]
//! pipeline_schedule = ["grouped", "interleaved", "sequential"]
//! replicas = [1, 2, 4]
//! pipeline_ipus = [1, 2, 4]
//!
//! [[configs]]                            # or a list; crossed with the grid when both
//! pipeline_stages = ["node_add_18"]
//! ```
//!
//! The keys are `model` and `tessera estimate`'s options with underscores for dashes
//! ([`EstimateOptions::names`]), each value read as the options read it.
//! A configuration is `[base]`, overridden by one `[[configs]]` entry (none when the list is
//! absent), joined with one point of `[grid]` (the last key, in sorted order, varies
//! fastest). A key both in an entry and in the grid is an error, as is an unknown key or a
//! value of the wrong type. A relative `model` path is taken from the spec file's directory
//! when a file is there (else as given: a shipped model's name, or a path from the working
//! directory).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::SweepError;
use crate::estimation::{EstimateError, EstimateOptions};

/// One configuration: option name to value, keys sorted. Its JSON text is its identity (a
/// resumed sweep skips configurations whose rows it already has).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Config(pub BTreeMap<String, Value>);

impl Config {
    /// The identity: the configuration as compact JSON with sorted keys.
    pub fn key(&self) -> String {
        serde_json::to_string(&self.0).unwrap_or_default()
    }

    /// The model, as the spec names it.
    pub fn model(&self) -> &str {
        self.0.get("model").and_then(Value::as_str).unwrap_or("")
    }

    /// The `tessera estimate` options this configuration stands for (after the model), in
    /// key order: `--batch-size 8 --dtype f16 ...`. A flag set to `false` is left out, except
    /// an option whose default is automatic (`offload_optimizer_state`,
    /// `replicated_tensor_sharding`), which is its `--no-` form; `pipeline_ipus = 1` is left
    /// out (one IPU).
    pub fn options(&self) -> Vec<String> {
        let defaults = serde_json::to_value(EstimateOptions::default()).unwrap_or_default();
        let mut out = Vec::new();
        for (k, v) in &self.0 {
            let flag = format!("--{}", k.replace('_', "-"));
            match (k.as_str(), v) {
                ("model", _) => {}
                ("pipeline_ipus", Value::Number(n)) if n.as_u64() == Some(1) => {}
                (_, Value::Bool(true)) => out.push(flag),
                (_, Value::Bool(false)) if defaults.get(k) == Some(&Value::Null) => {
                    out.push(format!("--no-{}", k.replace('_', "-")));
                }
                (_, Value::Bool(false)) => {}
                (_, v) => {
                    out.push(flag);
                    out.push(text(v));
                }
            }
        }
        out
    }

    /// The estimate options this configuration stands for: its keys but `model`, one
    /// estimate (for an ONNX model, `onnx`, no search for the fewest IPUs: a configuration is
    /// one point). `pipeline_ipus = 1` is one IPU, as [`options`](Self::options) has it.
    pub fn estimate_options(&self, onnx: bool) -> Result<EstimateOptions, EstimateError> {
        let map: serde_json::Map<String, Value> = self
            .0
            .iter()
            .filter(|(k, v)| match k.as_str() {
                "model" => false,
                "pipeline_ipus" => v.as_u64() != Some(1),
                _ => true,
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut o = EstimateOptions::from_map(&map)?;
        o.no_search |= onnx;
        Ok(o)
    }

    /// The command that estimates this configuration alone.
    pub fn command(&self) -> String {
        let mut words = vec![
            "tessera".to_string(),
            "estimate".into(),
            quote(self.model()),
        ];
        words.extend(self.options().iter().map(|w| quote(w)));
        words.join(" ")
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("{k}={}", text(v)))
            .collect();
        f.write_str(&parts.join(" "))
    }
}

/// A value as the command line writes it: a string as it is, a list comma-separated.
pub fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// A word as a shell reads it: quoted when it holds anything but safe characters.
fn quote(w: &str) -> String {
    if !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./,:=+@".contains(c))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

/// The configurations of a spec, made one at a time from `[base]`, the `[[configs]]` entries
/// and the `[grid]` axes: a grid of millions of points takes no more memory than its axes.
/// Configuration `i` is entry `i / points` at grid point `i % points`, the point in mixed
/// radix with the last axis fastest.
#[derive(Clone, Debug)]
pub struct Configs {
    base: BTreeMap<String, Value>,
    entries: Vec<BTreeMap<String, Value>>,
    grid: Vec<(String, Vec<Value>)>,
    points: usize,
    len: usize,
}

impl Configs {
    /// How many configurations.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none (never, for a parsed spec).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Configuration `i` (`None` past the end).
    pub fn get(&self, i: usize) -> Option<Config> {
        if i >= self.len {
            return None;
        }
        let mut c = self.base.clone();
        c.extend(
            self.entries[i / self.points]
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        let mut rest = i % self.points;
        for (key, vals) in self.grid.iter().rev() {
            c.insert(key.clone(), vals[rest % vals.len()].clone());
            rest /= vals.len();
        }
        Some(Config(c))
    }

    /// Every configuration, in order.
    pub fn iter(&self) -> impl Iterator<Item = Config> + '_ {
        (0..self.len).filter_map(|i| self.get(i))
    }

    /// Configurations that between them hold every value the spec names: each entry at the
    /// grid's first point and at every other value of each axis (the others at their first).
    /// A value a configuration cannot take is in one of them.
    pub fn representatives(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for e in 0..self.entries.len() {
            let first = e * self.points;
            out.push(first);
            let mut stride = 1;
            for (_, vals) in self.grid.iter().rev() {
                out.extend((1..vals.len()).map(|v| first + v * stride));
                stride *= vals.len();
            }
        }
        out
    }
}

/// A parsed sweep specification.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The sweep's name.
    pub name: String,
    /// The spec file.
    pub path: PathBuf,
    /// Every configuration, in order (a row's `index` is its place here), made on demand.
    pub configs: Configs,
    /// The keys any configuration sets, sorted: the CSV's configuration columns.
    pub keys: Vec<String>,
}

impl Spec {
    /// Reads and expands the spec file at `path`.
    pub fn load(path: &Path) -> Result<Spec, SweepError> {
        let text = std::fs::read_to_string(path).map_err(|e| SweepError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "sweep".into());
        Spec::parse(&text, path, &stem)
    }

    /// Parses spec text; `path` names the file in errors and anchors relative model paths.
    pub fn parse(text: &str, path: &Path, default_name: &str) -> Result<Spec, SweepError> {
        let bad = |message: String| SweepError::Spec {
            path: path.to_path_buf(),
            message,
        };
        let doc: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| bad(crate::report::format::one_line(&e.to_string())))?;
        Spec::from_table(&doc, path, default_name)
    }

    /// A spec from its tables already read (from TOML, or from JSON: a Python dict);
    /// `path` names it in errors and anchors relative model paths.
    pub fn from_table(
        doc: &toml::Table,
        path: &Path,
        default_name: &str,
    ) -> Result<Spec, SweepError> {
        let bad = |message: String| SweepError::Spec {
            path: path.to_path_buf(),
            message,
        };
        let mut name = default_name.to_string();
        let mut base = BTreeMap::new();
        let mut entries: Vec<BTreeMap<String, Value>> = Vec::new();
        let mut grid: Vec<(String, Vec<Value>)> = Vec::new();
        let mut has_entries = false;
        for (k, v) in doc {
            match (k.as_str(), v) {
                ("name", toml::Value::String(s)) => name = s.clone(),
                ("base", toml::Value::Table(t)) => base = values(t, "[base]", &bad)?,
                ("grid", toml::Value::Table(t)) => {
                    for (key, axis) in t {
                        let place = format!("[grid] {key}");
                        let toml::Value::Array(items) = axis else {
                            return Err(bad(format!(
                                "{place}: a grid axis is an array of values, got {axis}"
                            )));
                        };
                        if items.is_empty() {
                            return Err(bad(format!("{place}: an axis needs at least one value")));
                        }
                        let vals = items
                            .iter()
                            .map(|i| value(key, i, "[grid]", &bad))
                            .collect::<Result<Vec<_>, _>>()?;
                        grid.push((key.clone(), vals));
                    }
                }
                ("configs", toml::Value::Array(items)) => {
                    has_entries = true;
                    for (n, item) in items.iter().enumerate() {
                        let place = format!("[[configs]] entry {}", n + 1);
                        let toml::Value::Table(t) = item else {
                            return Err(bad(format!("{place}: expected a table")));
                        };
                        entries.push(values(t, &place, &bad)?);
                    }
                }
                _ => {
                    return Err(bad(format!(
                        "unknown top-level key `{k}` (or wrong type): a spec has `name` (a string), `[base]`, `[grid]` and `[[configs]]`"
                    )))
                }
            }
        }
        if !has_entries {
            entries.push(BTreeMap::new());
        }
        for (n, e) in entries.iter().enumerate() {
            if let Some((k, _)) = grid.iter().find(|(k, _)| e.contains_key(k)) {
                return Err(bad(format!(
                    "`{k}` is both in [[configs]] entry {} and in [grid]",
                    n + 1
                )));
            }
        }
        let points = grid
            .iter()
            .try_fold(1usize, |n, (_, v)| n.checked_mul(v.len()));
        let len = points.and_then(|p| p.checked_mul(entries.len()));
        let (Some(points), Some(len)) = (points, len) else {
            return Err(bad(
                "the grid has more configurations than can be counted (2^64)".into(),
            ));
        };
        let grid_model = grid.iter().any(|(k, _)| k == "model");
        for (n, e) in entries.iter().enumerate() {
            if !(grid_model || base.contains_key("model") || e.contains_key("model")) {
                return Err(bad(format!(
                    "configuration {} has no `model` (set it in [base], an entry or the grid)",
                    n * points
                )));
            }
        }
        let mut keys: Vec<String> = base
            .keys()
            .chain(entries.iter().flat_map(BTreeMap::keys))
            .chain(grid.iter().map(|(k, _)| k))
            .cloned()
            .collect();
        keys.sort();
        keys.dedup();
        Ok(Spec {
            name,
            path: path.to_path_buf(),
            configs: Configs {
                base,
                entries,
                grid,
                points,
                len,
            },
            keys,
        })
    }

    /// The model path to load for `c`: a relative path from the spec's directory when a file
    /// is there, else as the spec gives it.
    pub fn model_path(&self, c: &Config) -> String {
        let m = c.model();
        let p = Path::new(m);
        if p.is_relative() {
            if let Some(dir) = self.path.parent() {
                let joined = dir.join(p);
                if joined.is_file() {
                    return joined.to_string_lossy().into_owned();
                }
            }
        }
        m.to_string()
    }

    /// The indices of the configurations shard `shard` of `of` runs: a contiguous block,
    /// the blocks as even as can be. Neighbours in the grid (differing in the fastest axes,
    /// often ones that leave the lowered programs unchanged) stay together, so each shard
    /// reuses its programs.
    pub fn shard(&self, shard: usize, of: usize) -> std::ops::Range<usize> {
        let n = self.configs.len() as u128;
        if of == 0 {
            return 0..self.configs.len();
        }
        let at = |k: usize| (k as u128 * n / of as u128) as usize;
        at(shard)..at(shard + 1)
    }
}

fn values(
    t: &toml::Table,
    place: &str,
    bad: &dyn Fn(String) -> SweepError,
) -> Result<BTreeMap<String, Value>, SweepError> {
    let mut out = BTreeMap::new();
    for (k, v) in t {
        out.insert(k.clone(), value(k, v, place, bad)?);
    }
    Ok(out)
}

/// One value of `key` as the estimate options read it ([`EstimateOptions::value`]); `model`
/// is a string.
fn value(
    key: &str,
    v: &toml::Value,
    place: &str,
    bad: &dyn Fn(String) -> SweepError,
) -> Result<Value, SweepError> {
    if key == "model" {
        return match v {
            toml::Value::String(s) => Ok(Value::String(s.clone())),
            _ => Err(bad(format!("{place}: `model` takes a string, got {v}"))),
        };
    }
    let names = EstimateOptions::names();
    if !names.iter().any(|n| n == key) {
        return Err(bad(format!(
            "{place}: unknown key `{key}`; the keys are model, {}",
            names.join(", ")
        )));
    }
    let json = serde_json::to_value(v).map_err(|e| bad(format!("{place}: {key}: {e}")))?;
    EstimateOptions::value(key, &json).map_err(|e| bad(format!("{place}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_estimate_option_is_a_key() {
        let candidates = [
            "true",
            "2",
            "0.5",
            "'sequential'",
            "'bow'",
            "'pod16'",
            "'adam'",
            "'f16'",
            "'half'",
            "'mse'",
            "['n1']",
            "[1]",
            "[['x', [1, 2]]]",
        ];
        for key in EstimateOptions::names() {
            // Some value sets the option: the spec takes it, and the options differ.
            let set = candidates.iter().any(|v| {
                let Ok(s) = parse(&format!("[base]\nmodel = 'm'\n{key} = {v}")) else {
                    return false;
                };
                let c = s.configs.get(0).unwrap();
                match c.estimate_options(false) {
                    Ok(o) => o != EstimateOptions::default(),
                    // device_mapping alone is refused: it needs stages.
                    Err(e) => key == "device_mapping" && e.to_string().contains("pipeline_stages"),
                }
            });
            assert!(set, "no value of `{key}` sets it in a sweep");
        }
    }

    fn parse(text: &str) -> Result<Spec, SweepError> {
        Spec::parse(text, Path::new("dir/s.toml"), "s")
    }

    #[test]
    fn grid_is_crossed_with_the_list_and_the_last_key_varies_fastest() {
        let s = parse(
            r#"
            [base]
            model = "m.onnx"
            dtype = "f16"
            [grid]
            batch_size = [1, 2]
            replicas = [1, 2, 4]
            [[configs]]
            pipeline_ipus = 2
            [[configs]]
            pipeline_stages = "a, b"
            dtype = "f32"
            "#,
        )
        .unwrap();
        assert_eq!(s.configs.len(), 12);
        assert_eq!(s.name, "s");
        let first = &s.configs.get(0).unwrap();
        assert_eq!(
            first.key(),
            r#"{"batch_size":1,"dtype":"f16","model":"m.onnx","pipeline_ipus":2,"replicas":1}"#
        );
        assert_eq!(s.configs.get(1).unwrap().0["replicas"], 2);
        assert_eq!(s.configs.get(3).unwrap().0["batch_size"], 2);
        let last = &s.configs.get(11).unwrap();
        assert_eq!(last.0["dtype"], "f32");
        assert_eq!(
            last.options(),
            [
                "--batch-size",
                "2",
                "--dtype",
                "f32",
                "--pipeline-stages",
                "a,b",
                "--replicas",
                "4"
            ]
        );
        assert_eq!(
            s.keys,
            [
                "batch_size",
                "dtype",
                "model",
                "pipeline_ipus",
                "pipeline_stages",
                "replicas"
            ]
        );
        let keys: std::collections::HashSet<String> = s.configs.iter().map(|c| c.key()).collect();
        assert_eq!(keys.len(), 12, "every configuration is distinct");
    }

    #[test]
    fn flags_and_one_ipu_become_the_options_they_mean() {
        let s = parse(
            r#"
            [base]
            model = "m"
            [grid]
            offload_optimizer_state = [true, false]
            recompute = [false, true]
            pipeline_ipus = [1]
            "#,
        )
        .unwrap();
        let opts: Vec<String> = s.configs.iter().map(|c| c.options().join(" ")).collect();
        assert_eq!(
            opts,
            [
                "--offload-optimizer-state",
                "--offload-optimizer-state --recompute",
                "--no-offload-optimizer-state",
                "--no-offload-optimizer-state --recompute"
            ]
        );
        let sharding =
            parse("[base]\nmodel = 'm'\n[grid]\nreplicated_tensor_sharding = [true, false]")
                .unwrap();
        let opts: Vec<String> = sharding
            .configs
            .iter()
            .map(|c| c.options().join(" "))
            .collect();
        assert_eq!(
            opts,
            [
                "--replicated-tensor-sharding",
                "--no-replicated-tensor-sharding"
            ]
        );
        // IPU numbers, as an array or a comma-separated string.
        for mapping in ["[0, 0]", "'0,0'"] {
            let s = parse(&format!("[base]\nmodel = 'm'\ndevice_mapping = {mapping}")).unwrap();
            assert_eq!(
                s.configs.get(0).unwrap().options().join(" "),
                "--device-mapping 0,0"
            );
        }
        assert!(parse("[base]\nmodel = 'm'\ndevice_mapping = [0, -1]").is_err());
        assert_eq!(
            s.configs.get(1).unwrap().command(),
            "tessera estimate m --offload-optimizer-state --recompute"
        );
    }

    #[test]
    fn mistakes_are_named() {
        let cases = [
            ("[base]\nmodel = 'm'\nbatch = 2", "unknown key `batch`"),
            (
                "[base]\nmodel = 'm'\nbatch_size = 0",
                "[base]: batch_size: must be at least 1",
            ),
            ("[grid]\nmodel = 'm'", "a grid axis is an array"),
            ("[grid]\nmodel = []", "at least one value"),
            ("[base]\ndtype = 'f16'", "has no `model`"),
            (
                "[grid]\nmodel = ['m']\n[[configs]]\nmodel = 'n'",
                "both in [[configs]] entry 1 and in [grid]",
            ),
            ("colour = 'red'", "unknown top-level key `colour`"),
            ("[base\n", "s.toml"),
            (
                "[base]\nmodel = 'm'\nrecompute = 1",
                "recompute: invalid type",
            ),
            (
                "[grid]\nmodel = ['m']\nipu = ['mk3']",
                "`mk3` is not one of mk1, mk2, bow, c600",
            ),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(e.contains("dir/s.toml"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
