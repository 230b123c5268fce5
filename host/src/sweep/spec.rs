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
//! The keys are `tessera estimate`'s options with underscores for dashes (see [`KEYS`]).
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

/// What a key's values are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A string (`model`, `dtype`, ...).
    Text,
    /// A whole number at least 1.
    Count,
    /// A number.
    Number,
    /// `true` or `false`.
    Flag,
    /// Node names: an array of strings, or one comma-separated string.
    Names,
    /// Whole numbers (IPU numbers, layers per IPU): an array, or one comma-separated string.
    Indices,
}

/// The keys a configuration may set, with their kinds: `tessera estimate`'s options.
pub const KEYS: &[(&str, Kind)] = &[
    ("model", Kind::Text),
    ("batch_size", Kind::Count),
    ("gradient_accumulation_count", Kind::Count),
    ("repeat_count", Kind::Count),
    ("steps_per_execution", Kind::Count),
    ("pipeline_schedule", Kind::Text),
    ("no_pipelining", Kind::Flag),
    ("replicas", Kind::Count),
    ("ipu", Kind::Text),
    ("optimizer", Kind::Text),
    ("learning_rate", Kind::Number),
    ("offload_optimizer_state", Kind::Flag),
    ("dtype", Kind::Text),
    ("inference", Kind::Flag),
    ("recompute", Kind::Flag),
    ("partials_type", Kind::Text),
    ("gradient_accumulation_dtype", Kind::Text),
    ("recompute_checkpoints", Kind::Names),
    ("replicated_tensor_sharding", Kind::Flag),
    ("no_outlining", Kind::Flag),
    ("embedding_serialization", Kind::Count),
    ("offload_activations", Kind::Flag),
    ("offload_gradient_accumulation_buffers", Kind::Flag),
    ("available_memory_proportion", Kind::Number),
    ("pipeline_ipus", Kind::Count),
    ("pipeline_stages", Kind::Names),
    ("layers_per_ipu", Kind::Indices),
    ("device_mapping", Kind::Indices),
    ("loss", Kind::Text),
];

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
    /// `offload_optimizer_state = false` and `replicated_tensor_sharding = false`, which are
    /// `--no-offload-optimizer-state` and `--no-replicated-tensor-sharding` (their defaults are
    /// automatic); `pipeline_ipus = 1` is left out (one IPU).
    pub fn options(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (k, v) in &self.0 {
            let flag = format!("--{}", k.replace('_', "-"));
            match (k.as_str(), v) {
                ("model", _) => {}
                ("offload_optimizer_state", Value::Bool(false)) => {
                    out.push("--no-offload-optimizer-state".into());
                }
                ("replicated_tensor_sharding", Value::Bool(false)) => {
                    out.push("--no-replicated-tensor-sharding".into());
                }
                ("pipeline_ipus", Value::Number(n)) if n.as_u64() == Some(1) => {}
                (_, Value::Bool(true)) => out.push(flag),
                (_, Value::Bool(false)) => {}
                (_, Value::Array(items)) => {
                    // Node names, or IPU numbers.
                    let items: Vec<String> = items
                        .iter()
                        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                        .collect();
                    out.push(flag);
                    out.push(items.join(","));
                }
                (_, Value::String(s)) => {
                    out.push(flag);
                    out.push(s.clone());
                }
                (_, other) => {
                    out.push(flag);
                    out.push(other.to_string());
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
        o.no_search = onnx;
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
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                Value::Array(a) => format!(
                    "{k}={}",
                    a.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                other => format!("{k}={other}"),
            })
            .collect();
        f.write_str(&parts.join(" "))
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
                        let kind = kind_of(key, &place, &bad)?;
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
                            .map(|i| value(key, kind, i, &place, &bad))
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

fn kind_of(key: &str, place: &str, bad: &dyn Fn(String) -> SweepError) -> Result<Kind, SweepError> {
    KEYS.iter()
        .find(|(k, _)| *k == key)
        .map(|(_, kind)| *kind)
        .ok_or_else(|| {
            bad(format!(
                "{place}: unknown key `{key}`; the keys are {}",
                KEYS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
            ))
        })
}

fn values(
    t: &toml::Table,
    place: &str,
    bad: &dyn Fn(String) -> SweepError,
) -> Result<BTreeMap<String, Value>, SweepError> {
    let mut out = BTreeMap::new();
    for (k, v) in t {
        let at = format!("{place} {k}");
        let kind = kind_of(k, &at, bad)?;
        out.insert(k.clone(), value(k, kind, v, &at, bad)?);
    }
    Ok(out)
}

/// One value of `key`, checked against its kind.
fn value(
    key: &str,
    kind: Kind,
    v: &toml::Value,
    place: &str,
    bad: &dyn Fn(String) -> SweepError,
) -> Result<Value, SweepError> {
    let wrong = |what: &str| bad(format!("{place}: `{key}` takes {what}, got {v}"));
    Ok(match (kind, v) {
        (Kind::Text, toml::Value::String(s)) => Value::String(s.clone()),
        (Kind::Text, _) => return Err(wrong("a string")),
        (Kind::Count, toml::Value::Integer(n)) if *n >= 1 => Value::from(*n as u64),
        (Kind::Count, _) => return Err(wrong("a whole number at least 1")),
        (Kind::Number, toml::Value::Float(x)) if x.is_finite() => Value::from(*x),
        (Kind::Number, toml::Value::Integer(n)) => Value::from(*n as f64),
        (Kind::Number, _) => return Err(wrong("a number")),
        (Kind::Flag, toml::Value::Boolean(b)) => Value::Bool(*b),
        (Kind::Flag, _) => return Err(wrong("true or false")),
        (Kind::Names, toml::Value::String(s)) => Value::Array(
            s.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(|n| Value::String(n.to_string()))
                .collect(),
        ),
        (Kind::Names, toml::Value::Array(a)) => {
            let mut names = Vec::new();
            for n in a {
                match n {
                    toml::Value::String(s) => names.push(Value::String(s.clone())),
                    _ => return Err(wrong("node names (strings)")),
                }
            }
            Value::Array(names)
        }
        (Kind::Names, _) => return Err(wrong("node names (an array of strings)")),
        (Kind::Indices, toml::Value::String(s)) => {
            let mut ipus = Vec::new();
            for n in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let i: u64 = n.parse().map_err(|_| wrong("whole numbers"))?;
                ipus.push(Value::from(i));
            }
            Value::Array(ipus)
        }
        (Kind::Indices, toml::Value::Array(a)) => {
            let mut ipus = Vec::new();
            for n in a {
                match n {
                    toml::Value::Integer(i) if *i >= 0 => ipus.push(Value::from(*i as u64)),
                    _ => return Err(wrong("whole numbers")),
                }
            }
            Value::Array(ipus)
        }
        (Kind::Indices, _) => return Err(wrong("an array of whole numbers")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_an_estimate_option() {
        for (key, kind) in KEYS.iter().filter(|(k, _)| *k != "model") {
            let value = match kind {
                Kind::Text => match *key {
                    "pipeline_schedule" => Value::from("sequential"),
                    "ipu" => Value::from("bow"),
                    "optimizer" => Value::from("adam"),
                    "dtype" | "gradient_accumulation_dtype" => Value::from("f16"),
                    "partials_type" => Value::from("half"),
                    "loss" => Value::from("mse"),
                    other => panic!("a text key without a test value: {other}"),
                },
                Kind::Count => Value::from(2u64),
                Kind::Number => Value::from(0.5),
                Kind::Flag => Value::Bool(true),
                Kind::Names => Value::from(vec!["n1"]),
                Kind::Indices => Value::from(vec![1u64]),
            };
            let c = Config(BTreeMap::from([(key.to_string(), value.clone())]));
            let o = c.estimate_options(false);
            // Each key sets its option (device_mapping alone is refused: it needs stages).
            match *key {
                "device_mapping" => assert!(o.is_err(), "{key}"),
                _ => {
                    let o = o.unwrap_or_else(|e| panic!("{key}: {e}"));
                    assert_ne!(o, EstimateOptions::default(), "{key} = {value} set nothing");
                }
            }
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
                "a whole number at least 1",
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
            ("[base]\nmodel = 'm'\nrecompute = 1", "true or false"),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(e.contains("dir/s.toml"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
