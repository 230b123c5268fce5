//! Sweeps: many configurations of `tessera estimate`, one row each.
//!
//! A [`Spec`] (TOML) expands to configurations; each becomes a [`Row`] (fit, cycles per
//! step, samples/s, memory per IPU, the fullest tile, or the error). Rows are written as
//! JSON lines (`<stem>.jsonl`, one object per line, the record [`read_rows`] reads back) and
//! CSV (`<stem>.csv`, for spreadsheets), appended as they finish so that nothing finished is
//! lost when a run is killed; a run that finds rows already there skips their
//! configurations (matched by the configuration itself, not its place). A sweep can be cut
//! into shards (`shard-I-of-N.*`, contiguous blocks of configurations) that [`merge`] joins. [`pareto_front`] and [`best`] pick the configurations worth a look.

mod spec;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use spec::{text, Config, Spec};

use crate::estimation::{EstimateOptions, ModelSource};
use crate::report::format::one_line;

/// What goes wrong reading or writing a sweep.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SweepError {
    /// The spec file is malformed.
    #[error("{}: {message}", path.display())]
    Spec {
        /// The spec file.
        path: PathBuf,
        /// What is wrong, naming the key.
        message: String,
    },
    /// A file could not be read or written.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The system's message.
        message: String,
    },
    /// A results file holds a line that is not a row.
    #[error("{}:{line}: not a sweep row: {message}", path.display())]
    BadRow {
        /// The results file.
        path: PathBuf,
        /// The line (from 1).
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// A results file holds rows of configurations the spec does not have.
    #[error("{}: {count} row(s) are of configurations not in the spec (the first: {first}); write to a new --output or remove the file", path.display())]
    ForeignRows {
        /// The results file.
        path: PathBuf,
        /// How many.
        count: usize,
        /// The first such configuration.
        first: String,
    },
    /// Two results files disagree on a configuration's row.
    #[error("configuration {index} ({config}) has different rows in {} and {}", first.display(), second.display())]
    Conflict {
        /// The configuration's index.
        index: usize,
        /// The configuration.
        config: String,
        /// One file.
        first: PathBuf,
        /// The other.
        second: PathBuf,
    },
}

/// What configuration `index` (`c`) of `spec` estimates: its model and options.
pub fn request(
    spec: &Spec,
    index: usize,
    c: &Config,
) -> Result<(ModelSource, EstimateOptions), SweepError> {
    let source = ModelSource::from_arg(&spec.model_path(c));
    c.estimate_options(source.is_onnx())
        .map(|o| (source, o))
        .map_err(|e| SweepError::Spec {
            path: spec.path.clone(),
            message: format!("configuration {index} ({c}): {e}"),
        })
}

/// Checks a spec before any configuration runs, so that a typo fails now, not hours in:
/// every value it names (each configuration that holds a value no other checked one does,
/// see `Configs::representatives`) makes valid estimate options, and every model it names
/// is a shipped model or a file that is there.
pub fn check(spec: &Spec) -> Result<(), SweepError> {
    let mut models = std::collections::BTreeSet::new();
    for i in spec.configs.representatives() {
        let Some(c) = spec.configs.get(i) else {
            continue;
        };
        request(spec, i, &c)?;
        if models.insert(c.model().to_string()) {
            let path = spec.model_path(&c);
            let shipped = crate::model::SHIPPED
                .iter()
                .any(|(name, _)| *name == c.model());
            if !shipped && !Path::new(&path).is_file() {
                return Err(SweepError::Spec {
                    path: spec.path.clone(),
                    message: format!(
                        "configuration {i} ({c}): model `{}` is neither a shipped model ({}) nor a file (looked for {path})",
                        c.model(),
                        crate::model::SHIPPED
                            .iter()
                            .map(|(n, _)| *n)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Configuration `index` of `spec`'s row: its estimate, or the error (a panic included, as
/// an internal error) that stopped it. One estimate, no search for the fewest IPUs.
pub fn estimate_row(spec: &Spec, index: usize) -> Option<Row> {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let c = spec.configs.get(index)?;
    let (source, options) = match request(spec, index, &c) {
        Ok(r) => r,
        Err(e) => return Some(Row::failed(index, &c, &e.to_string())),
    };
    let result = catch_unwind(AssertUnwindSafe(|| {
        crate::estimation::estimate(&source, &options).map(|e| {
            let boundaries = e.boundaries().map(<[String]>::to_vec);
            Row::estimated(index, &c, &e.summary, boundaries)
        })
    }));
    Some(match result {
        Ok(Ok(row)) => row,
        Ok(Err(e)) => Row::failed(index, &c, &chain(&e)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Row::failed(index, &c, &format!("internal error (a bug): {what}"))
        }
    })
}

/// An error with its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = one_line(&e.to_string());
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&one_line(&c.to_string()));
        cause = c.source();
    }
    s
}

fn io_error(path: &Path, e: std::io::Error) -> SweepError {
    SweepError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// The fullest tile of a configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FullestTile {
    /// The IPU (of one replica).
    pub ipu: usize,
    /// The tile.
    pub tile: u32,
    /// Its bytes at its peak.
    pub bytes: u64,
}

/// One configuration's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The configuration's place in the spec.
    pub index: usize,
    /// The configuration.
    pub config: Config,
    /// The command that estimates it alone.
    pub command: String,
    /// Whether every tile fits (absent when the estimate failed).
    pub fits: Option<bool>,
    /// IPUs in all (replicas x IPUs per replica).
    pub ipus: Option<usize>,
    /// Average cycles per micro-batch step.
    pub cycles_per_step: Option<u64>,
    /// Samples per second.
    pub samples_per_second: Option<f64>,
    /// Bytes used on each IPU of one replica.
    pub memory_per_ipu: Vec<u64>,
    /// The fullest tile over the IPUs.
    pub fullest_tile: Option<FullestTile>,
    /// Stage boundaries of an automatic split.
    pub boundaries: Option<Vec<String>>,
    /// Why it does not fit, when it does not.
    pub out_of_memory: Option<String>,
    /// Why there is no estimate, when there is none.
    pub error: Option<String>,
}

impl Row {
    /// A row for a configuration whose estimate failed with `error`.
    pub fn failed(index: usize, config: &Config, error: &str) -> Row {
        Row {
            index,
            config: config.clone(),
            command: config.command(),
            fits: None,
            ipus: None,
            cycles_per_step: None,
            samples_per_second: None,
            memory_per_ipu: Vec::new(),
            fullest_tile: None,
            boundaries: None,
            out_of_memory: None,
            error: Some(one_line(error)),
        }
    }

    /// A row from an estimate's summary.
    pub fn estimated(
        index: usize,
        config: &Config,
        s: &crate::summary::EstimateSummary,
        boundaries: Option<Vec<String>>,
    ) -> Row {
        let fullest = s
            .ipus
            .iter()
            .max_by_key(|i| (i.max_tile_bytes, std::cmp::Reverse(i.ipu)));
        Row {
            index,
            config: config.clone(),
            command: config.command(),
            fits: Some(s.fits),
            ipus: Some(s.ipus_total),
            cycles_per_step: Some(s.cycles_per_step),
            samples_per_second: Some(s.samples_per_second),
            memory_per_ipu: s.ipus.iter().map(|i| i.bytes_used).collect(),
            fullest_tile: fullest.map(|i| FullestTile {
                ipu: i.ipu,
                tile: i.max_tile,
                bytes: i.max_tile_bytes,
            }),
            boundaries,
            out_of_memory: s.out_of_memory.as_ref().map(|o| one_line(o)),
            error: None,
        }
    }

    /// Whether it fits (an estimate that says so).
    pub fn fits(&self) -> bool {
        self.fits == Some(true)
    }
}

/// The files of one run: `<stem>.jsonl` and `<stem>.csv` in the output directory.
#[derive(Clone, Debug)]
pub struct Files {
    /// The JSON-lines file.
    pub jsonl: PathBuf,
    /// The CSV file.
    pub csv: PathBuf,
}

/// The stem of the results files: `results`, or `shard-I-of-N` for a shard.
pub fn stem(shard: Option<(usize, usize)>) -> String {
    match shard {
        Some((i, n)) => format!("shard-{i}-of-{n}"),
        None => "results".to_string(),
    }
}

impl Files {
    /// The files `stem.jsonl` and `stem.csv` in `dir`.
    pub fn new(dir: &Path, stem: &str) -> Files {
        Files {
            jsonl: dir.join(format!("{stem}.jsonl")),
            csv: dir.join(format!("{stem}.csv")),
        }
    }
}

/// Rows read back from JSON lines. A last line cut short (a run killed while writing it) is
/// dropped; any other line that is not a row is an error naming the file and line.
pub fn read_rows(path: &Path) -> Result<Vec<Row>, SweepError> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(path, e)),
    };
    let mut lines = Vec::new();
    let mut reader = BufReader::new(file);
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).map_err(|e| io_error(path, e))?;
        if n == 0 {
            break;
        }
        lines.push(line);
    }
    let mut rows = Vec::with_capacity(lines.len());
    let last = lines.len();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Row>(line) {
            Ok(r) => rows.push(r),
            // Cut short: the run was killed while writing it.
            Err(_) if i + 1 == last && !line.ends_with('\n') => {}
            Err(e) => {
                return Err(SweepError::BadRow {
                    path: path.to_path_buf(),
                    line: i + 1,
                    message: e.to_string(),
                })
            }
        }
    }
    Ok(rows)
}

/// Keeps the rows of `spec`'s configurations, each given its index in the spec; rows of
/// other configurations are an error (a results file of another sweep).
pub fn match_rows(spec: &Spec, path: &Path, rows: Vec<Row>) -> Result<Vec<Row>, SweepError> {
    // A row names its index; only when the spec has changed since (the index holds another
    // configuration) are all configurations indexed by identity.
    let mut index: Option<HashMap<String, usize>> = None;
    let mut out = Vec::with_capacity(rows.len());
    let mut foreign = Vec::new();
    for mut r in rows {
        let key = r.config.key();
        if spec.configs.get(r.index).is_some_and(|c| c.key() == key) {
            out.push(r);
            continue;
        }
        let index = index.get_or_insert_with(|| {
            spec.configs
                .iter()
                .enumerate()
                .map(|(i, c)| (c.key(), i))
                .collect()
        });
        match index.get(&key) {
            Some(&i) => {
                r.index = i;
                out.push(r);
            }
            None => foreign.push(r.config.to_string()),
        }
    }
    if let Some(first) = foreign.first() {
        return Err(SweepError::ForeignRows {
            path: path.to_path_buf(),
            count: foreign.len(),
            first: first.clone(),
        });
    }
    out.sort_by_key(|r| r.index);
    out.dedup_by_key(|r| r.index);
    Ok(out)
}

/// The CSV header: the index, each configuration key, then the results.
pub fn csv_header(keys: &[String]) -> Vec<String> {
    let mut h = vec!["index".to_string()];
    h.extend(keys.iter().cloned());
    h.extend(
        [
            "fits",
            "ipus",
            "cycles_per_step",
            "samples_per_second",
            "max_ipu_bytes",
            "fullest_ipu",
            "fullest_tile",
            "fullest_tile_bytes",
            "memory_per_ipu",
            "boundaries",
            "out_of_memory",
            "error",
            "command",
        ]
        .map(String::from),
    );
    h
}

/// A row's CSV fields, in [`csv_header`]'s order.
pub fn csv_record(keys: &[String], r: &Row) -> Vec<String> {
    let opt = |v: Option<String>| v.unwrap_or_default();
    let mut f = vec![r.index.to_string()];
    for k in keys {
        f.push(r.config.0.get(k).map(text).unwrap_or_default());
    }
    f.push(opt(r.fits.map(|b| b.to_string())));
    f.push(opt(r.ipus.map(|n| n.to_string())));
    f.push(opt(r.cycles_per_step.map(|n| n.to_string())));
    f.push(opt(r.samples_per_second.map(|x| x.to_string())));
    f.push(opt(r.memory_per_ipu.iter().max().map(|n| n.to_string())));
    f.push(opt(r.fullest_tile.as_ref().map(|t| t.ipu.to_string())));
    f.push(opt(r.fullest_tile.as_ref().map(|t| t.tile.to_string())));
    f.push(opt(r.fullest_tile.as_ref().map(|t| t.bytes.to_string())));
    f.push(
        r.memory_per_ipu
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(";"),
    );
    f.push(opt(r.boundaries.as_ref().map(|b| b.join(","))));
    f.push(opt(r.out_of_memory.clone()));
    f.push(opt(r.error.clone()));
    f.push(r.command.clone());
    f
}

/// Writes `rows` (sorted by index) as both files, replacing them: each written to a
/// temporary file first and renamed over, so a kill leaves the old file or the new one.
pub fn write_all(files: &Files, keys: &[String], rows: &[Row]) -> Result<(), SweepError> {
    let mut jsonl = String::new();
    for r in rows {
        jsonl.push_str(&serde_json::to_string(r).unwrap_or_default());
        jsonl.push('\n');
    }
    replace(&files.jsonl, jsonl.as_bytes())?;
    let mut w = csv::Writer::from_writer(Vec::new());
    let csv_err = |e: csv::Error| SweepError::Io {
        path: files.csv.clone(),
        message: e.to_string(),
    };
    w.write_record(csv_header(keys)).map_err(csv_err)?;
    for r in rows {
        w.write_record(csv_record(keys, r)).map_err(csv_err)?;
    }
    let bytes = w.into_inner().map_err(|e| SweepError::Io {
        path: files.csv.clone(),
        message: e.to_string(),
    })?;
    replace(&files.csv, &bytes)
}

/// Replaces `path` with `bytes` whole or not at all, through a temporary file beside it
/// (`crate::output::write_atomically`).
pub fn replace(path: &Path, bytes: &[u8]) -> Result<(), SweepError> {
    crate::output::write_bytes_atomically(path, bytes).map_err(|e| io_error(path, e))
}

/// Appends rows to both files as they finish, each flushed at once.
pub struct Appender {
    jsonl: fs::File,
    csv: csv::Writer<fs::File>,
    keys: Vec<String>,
    files: Files,
}

impl Appender {
    /// Opens both files (written whole by [`write_all`] first) for appending.
    pub fn open(files: &Files, keys: &[String]) -> Result<Appender, SweepError> {
        let open = |p: &Path| {
            fs::OpenOptions::new()
                .append(true)
                .open(p)
                .map_err(|e| io_error(p, e))
        };
        Ok(Appender {
            jsonl: open(&files.jsonl)?,
            csv: csv::Writer::from_writer(open(&files.csv)?),
            keys: keys.to_vec(),
            files: files.clone(),
        })
    }

    /// Appends one row to both files.
    pub fn push(&mut self, r: &Row) -> Result<(), SweepError> {
        let mut line = serde_json::to_string(r).unwrap_or_default();
        line.push('\n');
        self.jsonl
            .write_all(line.as_bytes())
            .and_then(|()| self.jsonl.flush())
            .map_err(|e| io_error(&self.files.jsonl, e))?;
        self.csv
            .write_record(csv_record(&self.keys, r))
            .and_then(|()| self.csv.flush().map_err(csv::Error::from))
            .map_err(|e| SweepError::Io {
                path: self.files.csv.clone(),
                message: e.to_string(),
            })
    }
}

/// Every results file in `dir` for `spec`: `results.jsonl` and the shards', joined by
/// configuration. Returns the rows (sorted by index) and the indices with no row.
pub fn merge(spec: &Spec, dir: &Path) -> Result<(Vec<Row>, Vec<usize>), SweepError> {
    let mut paths: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| io_error(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".jsonl") && (name.starts_with("shard-") || name == "results.jsonl")
        })
        .collect();
    paths.sort();
    let mut by_index: BTreeMap<usize, (Row, PathBuf)> = BTreeMap::new();
    for p in &paths {
        let rows = match_rows(spec, p, read_rows(p)?)?;
        for r in rows {
            match by_index.get(&r.index) {
                Some((have, from)) if *have != r => {
                    return Err(SweepError::Conflict {
                        index: r.index,
                        config: r.config.to_string(),
                        first: from.clone(),
                        second: p.clone(),
                    })
                }
                Some(_) => {}
                None => {
                    by_index.insert(r.index, (r, p.clone()));
                }
            }
        }
    }
    let missing = (0..spec.configs.len())
        .filter(|i| !by_index.contains_key(i))
        .collect();
    Ok((by_index.into_values().map(|(r, _)| r).collect(), missing))
}

/// The configuration with the most samples/s of those that fit; on a tie, the fewer IPUs,
/// then the earlier configuration.
pub fn best(rows: &[Row]) -> Option<&Row> {
    rows.iter()
        .filter(|r| r.fits() && r.samples_per_second.is_some())
        .min_by(|a, b| {
            let (sa, sb) = (
                a.samples_per_second.unwrap_or(0.0),
                b.samples_per_second.unwrap_or(0.0),
            );
            sb.total_cmp(&sa)
                .then(a.ipus.cmp(&b.ipus))
                .then(a.index.cmp(&b.index))
        })
}

/// The configurations that fit and that no other fitting one beats on both counts: no
/// more IPUs and more samples/s (or fewer IPUs and as many). Sorted by IPUs; for equal
/// figures the earlier configuration stands for them.
pub fn pareto_front(rows: &[Row]) -> Vec<&Row> {
    let mut fit: Vec<&Row> = rows
        .iter()
        .filter(|r| r.fits() && r.ipus.is_some() && r.samples_per_second.is_some())
        .collect();
    fit.sort_by(|a, b| {
        a.ipus
            .cmp(&b.ipus)
            .then(
                b.samples_per_second
                    .unwrap_or(0.0)
                    .total_cmp(&a.samples_per_second.unwrap_or(0.0)),
            )
            .then(a.index.cmp(&b.index))
    });
    let mut front: Vec<&Row> = Vec::new();
    for r in fit {
        let s = r.samples_per_second.unwrap_or(0.0);
        if front
            .last()
            .is_none_or(|f| s > f.samples_per_second.unwrap_or(0.0))
        {
            front.push(r);
        }
    }
    front
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn row(index: usize, fits: bool, ipus: usize, sps: f64) -> Row {
        let mut c = BTreeMap::new();
        c.insert("model".to_string(), Value::from("m"));
        c.insert("batch_size".to_string(), Value::from(index as u64 + 1));
        let config = Config(c);
        Row {
            index,
            command: config.command(),
            config,
            fits: Some(fits),
            ipus: Some(ipus),
            cycles_per_step: Some(1000),
            samples_per_second: Some(sps),
            memory_per_ipu: vec![10, 20],
            fullest_tile: Some(FullestTile {
                ipu: 1,
                tile: 7,
                bytes: 99,
            }),
            boundaries: None,
            out_of_memory: None,
            error: None,
        }
    }

    #[test]
    fn front_and_best() {
        let rows = vec![
            row(0, true, 1, 100.0),
            row(1, true, 2, 90.0),   // beaten by 0
            row(2, true, 2, 150.0),  // on the front
            row(3, false, 1, 500.0), // does not fit
            row(4, true, 4, 150.0),  // as fast with more IPUs
            row(5, true, 8, 400.0),
            row(6, true, 1, 100.0), // equal to 0: 0 stands for it
        ];
        let front: Vec<usize> = pareto_front(&rows).iter().map(|r| r.index).collect();
        assert_eq!(front, [0, 2, 5]);
        assert_eq!(best(&rows).map(|r| r.index), Some(5));
        assert!(best(&rows[3..4]).is_none());
    }

    #[test]
    fn rows_round_trip_and_a_cut_last_line_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path(), "results");
        let keys = vec!["batch_size".to_string(), "model".to_string()];
        let rows = vec![row(0, true, 1, 1.5), row(1, false, 2, 0.1 + 0.2)];
        write_all(&files, &keys, &rows).unwrap();
        let mut a = Appender::open(&files, &keys).unwrap();
        a.push(&Row::failed(
            2,
            &row(2, true, 1, 1.0).config,
            "no such\nnode",
        ))
        .unwrap();
        drop(a);
        let back = read_rows(&files.jsonl).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[..2], rows[..]);
        assert_eq!(back[2].error.as_deref(), Some("no such node"));
        // Killed mid-line: the partial row is ignored.
        let mut text = fs::read_to_string(&files.jsonl).unwrap();
        text.push_str("{\"index\":3,\"con");
        fs::write(&files.jsonl, &text).unwrap();
        assert_eq!(read_rows(&files.jsonl).unwrap().len(), 3);
        // A bad line in the middle is an error naming its line.
        let bad = text.replacen("{\"index\":1", "{\"indx\":1", 1) + "\n";
        fs::write(&files.jsonl, bad).unwrap();
        let e = read_rows(&files.jsonl).unwrap_err().to_string();
        assert!(e.contains("results.jsonl:2: not a sweep row"), "{e}");
        let csv = fs::read_to_string(&files.csv).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("index,batch_size,model,fits,ipus"));
        assert!(lines[2].contains(",0.30000000000000004,"), "{}", lines[2]);
    }

    #[test]
    fn rows_of_another_sweep_are_refused() {
        let spec = Spec::parse(
            "[base]\nmodel = 'm'\n[grid]\nbatch_size = [1, 2]",
            Path::new("s.toml"),
            "s",
        )
        .unwrap();
        let mut r = row(5, true, 1, 1.0);
        r.config = spec.configs.get(1).unwrap();
        let kept = match_rows(&spec, Path::new("x.jsonl"), vec![r]).unwrap();
        assert_eq!(kept[0].index, 1, "re-indexed by the spec");
        let e = match_rows(
            &spec,
            Path::new("x.jsonl"),
            vec![row(0, true, 1, 1.0), {
                let mut r = row(0, true, 1, 1.0);
                r.config.0.insert("dtype".into(), Value::from("f16"));
                r
            }],
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("1 row(s) are of configurations not in the spec"),
            "{e}"
        );
    }
}
