//! `tessera sweep`: many estimates from a spec, in parallel, resumable, sharded over a Slurm
//! job array when asked.

use std::collections::HashSet;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::report::format::{decimal, seconds};
use crate::report::sweep::{pareto_svg, sweep_page, PARETO_FILE};
use crate::report::INDEX_FILE;
use crate::sweep::{
    best, check, estimate_row, match_rows, merge as merge_rows, pareto_front, read_rows, replace,
    stem, write_all, Appender, Files, Row, Spec,
};
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;

use super::args::{parse_shard, SweepRunArgs};
use super::args::{MergeArgs, SubmitArgs, SweepArgs, SweepCommand};
use super::{one_line, AnyError};

pub fn run(a: SweepArgs) -> Result<bool, AnyError> {
    match a.action {
        Some(SweepCommand::Submit(s)) => submit(s),
        Some(SweepCommand::Merge(m)) => merge(m),
        None => run_sweep(a.run),
    }
}

/// The output directory: as given, else the spec's stem + `-sweep` in the working directory.
fn output_dir(spec: &Path, output: Option<&Path>) -> PathBuf {
    output.map(Path::to_path_buf).unwrap_or_else(|| {
        let stem = spec
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "sweep".into());
        PathBuf::from(format!("{stem}-sweep"))
    })
}

/// The shard Slurm gives this task of a job array, if it is one.
fn slurm_shard() -> Option<(usize, usize)> {
    let var = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
    };
    let id = var("SLURM_ARRAY_TASK_ID")?;
    let min = var("SLURM_ARRAY_TASK_MIN").unwrap_or(0);
    let count =
        var("SLURM_ARRAY_TASK_COUNT").or_else(|| Some(var("SLURM_ARRAY_TASK_MAX")? - min + 1))?;
    parse_shard(&format!("{}/{count}", id.checked_sub(min)?)).ok()
}

fn run_sweep(a: SweepRunArgs) -> Result<bool, AnyError> {
    let start = Instant::now();
    let spec_path = a.spec.clone().unwrap_or_default();
    let spec = Spec::load(&spec_path)?;
    check(&spec)?;
    let shard = a.shard.or_else(slurm_shard);
    let dir = output_dir(&spec_path, a.output.as_deref());
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let files = Files::new(&dir, &stem(shard));
    let mut rows = match_rows(&spec, &files.jsonl, read_rows(&files.jsonl)?)?;
    // Rewritten whole: a row cut short by a kill goes, the CSV matches the JSON lines.
    write_all(&files, &spec.keys, &rows)?;
    let mine = match shard {
        Some((i, n)) => spec.shard(i, n),
        None => 0..spec.configs.len(),
    };
    // The configurations to run are made one at a time as workers take them.
    let done: HashSet<usize> = rows.iter().map(|r| r.index).collect();
    let todo = Todo {
        spec: &spec,
        mine,
        done: &done,
        jobs: jobs(a.jobs)?,
        start,
    };
    let todo_len = todo.len();
    eprintln!(
        "{}: {} configurations{}, {} done already, {} to run, {} at a time; rows go to {}",
        spec.name,
        todo.mine.len(),
        shard.map_or(String::new(), |(i, n)| format!(" in shard {i} of {n}")),
        todo.mine.len() - todo_len,
        todo_len,
        todo.jobs,
        files.jsonl.display()
    );
    tessera_sim::cache::set_lowering_cache(a.lowering_cache);
    let mut appender = Appender::open(&files, &spec.keys)?;
    todo.run(&mut appender, &mut rows)?;
    rows.sort_by_key(|r| r.index);
    write_all(&files, &spec.keys, &rows)?;
    let (hits, misses) = tessera_sim::cache::lowering_cache_stats();
    eprintln!(
        "{} configurations estimated in {} ({misses} IPU programs lowered, {hits} reused)",
        todo_len,
        seconds(start.elapsed().as_secs_f64())
    );
    match shard {
        Some((i, n)) => {
            println!(
                "shard {i} of {n}: {} rows in {}; when every shard is done: tessera sweep merge {} --output {}",
                rows.len(),
                files.jsonl.display(),
                spec_path.display(),
                dir.display()
            );
            Ok(true)
        }
        None => finish(&spec, &dir, &rows, &[]),
    }
}

/// Estimates at a time: `--jobs`, else one per CPU (estimates are CPU-bound: more at a time
/// than CPUs adds only memory).
fn jobs(asked: Option<usize>) -> Result<usize, AnyError> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs = asked.unwrap_or(cpus).max(1);
    if jobs > cpus {
        return Err(format!(
            "--jobs {jobs}: this machine gives the sweep {cpus} CPU(s); more estimates at a time than CPUs only add memory"
        )
        .into());
    }
    Ok(jobs)
}

/// The configurations a run of a sweep estimates: those of its shard (`mine`) not `done`.
struct Todo<'a> {
    spec: &'a Spec,
    mine: std::ops::Range<usize>,
    done: &'a HashSet<usize>,
    /// Estimates at a time.
    jobs: usize,
    /// When the run began.
    start: Instant,
}

impl Todo<'_> {
    /// How many there are.
    fn len(&self) -> usize {
        self.mine.len() - self.done.iter().filter(|i| self.mine.contains(i)).count()
    }

    /// Estimates them, `jobs` at a time on a pool of their own, appending each row as it
    /// comes (kept if the run is killed) and adding it to `rows`; a progress bar (a line
    /// every 10 s when stderr is not a terminal) counts them, with how many fit and failed.
    fn run(&self, appender: &mut Appender, rows: &mut Vec<Row>) -> Result<(), AnyError> {
        let todo_len = self.len();
        let bar = ProgressBar::new(todo_len as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} configurations, {eta} left {msg}",
            )
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
        );
        let plain = !std::io::stderr().is_terminal();
        let stop = AtomicBool::new(false);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.jobs)
            .build()
            .map_err(|e| e.to_string())?;
        let (tx, rx) = crossbeam_channel::unbounded::<Row>();
        let mut failure: Option<AnyError> = None;
        let (mut fits, mut failed) = (0usize, 0usize);
        std::thread::scope(|scope| {
            let (done, spec, stop, mine) = (self.done, self.spec, &stop, self.mine.clone());
            let workers = std::thread::Builder::new().spawn_scoped(scope, move || {
                pool.install(|| {
                    mine.into_par_iter()
                        .filter(|i| !done.contains(i))
                        .for_each_with(tx, |tx, i| {
                            if stop.load(Ordering::Relaxed) {
                                return;
                            }
                            let Some(row) = estimate_row(spec, i) else {
                                return;
                            };
                            if tx.send(row).is_err() {
                                stop.store(true, Ordering::Relaxed);
                            }
                        });
                });
            });
            if let Err(e) = workers {
                // The sender went with the closure: the loop below ends at once.
                failure = Some(format!("cannot start the sweep's workers: {e}").into());
            }
            let mut last_line = Instant::now();
            for row in rx {
                if let Err(e) = appender.push(&row) {
                    // Nothing more can be kept: stop the workers.
                    stop.store(true, Ordering::Relaxed);
                    failure = Some(e.into());
                    break;
                }
                fits += usize::from(row.fits());
                failed += usize::from(row.error.is_some());
                rows.push(row);
                bar.inc(1);
                bar.set_message(format!("({fits} fit, {failed} failed)"));
                if plain
                    && (last_line.elapsed() >= Duration::from_secs(10)
                        || bar.position() == bar.length().unwrap_or(0))
                {
                    last_line = Instant::now();
                    eprintln!(
                        "{}/{} configurations ({fits} fit, {failed} failed), {} elapsed, {} left",
                        bar.position(),
                        todo_len,
                        seconds(self.start.elapsed().as_secs_f64()),
                        seconds(bar.eta().as_secs_f64())
                    );
                }
            }
        });
        bar.finish_and_clear();
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Writes the picture and page for `rows` and prints the best configurations.
fn finish(spec: &Spec, dir: &Path, rows: &[Row], missing: &[usize]) -> Result<bool, AnyError> {
    let title = format!("Sweep {}", spec.name);
    let svg = dir.join(PARETO_FILE);
    replace(&svg, pareto_svg(&title, rows).as_bytes())?;
    let page = dir.join(INDEX_FILE);
    replace(
        &page,
        sweep_page(
            &title,
            &spec.path.display().to_string(),
            rows,
            missing.len(),
        )
        .as_bytes(),
    )?;
    let fits = rows.iter().filter(|r| r.fits()).count();
    let failed: Vec<&Row> = rows.iter().filter(|r| r.error.is_some()).collect();
    println!(
        "{}: {} rows: {fits} fit, {} do not, {} failed",
        spec.name,
        rows.len(),
        rows.len() - fits - failed.len(),
        failed.len()
    );
    if let Some(f) = failed.first() {
        println!(
            "first failure: #{} {}: {}",
            f.index,
            f.config,
            f.error.as_deref().unwrap_or("")
        );
    }
    match best(rows) {
        Some(b) => println!(
            "best: #{} {}: {} samples/s on {} IPU(s)\n  {}",
            b.index,
            b.config,
            decimal(b.samples_per_second.unwrap_or(0.0)),
            b.ipus.unwrap_or(0),
            b.command
        ),
        None => println!("best: no configuration fits"),
    }
    let front = pareto_front(rows);
    if !front.is_empty() {
        println!("Pareto front (the most samples/s for the IPUs):");
        for r in front {
            println!(
                "  {:>4} IPU(s) {:>14} samples/s  #{} {}",
                r.ipus.unwrap_or(0),
                decimal(r.samples_per_second.unwrap_or(0.0)),
                r.index,
                r.config
            );
        }
    }
    let files = Files::new(dir, "results");
    println!(
        "written: {}, {}, {}, {}",
        files.jsonl.display(),
        files.csv.display(),
        svg.display(),
        page.display()
    );
    if !missing.is_empty() {
        eprintln!(
            "error: {} of {} configurations have no row yet (the first: #{} {}); run the missing shards (or the sweep itself, which skips finished rows) and merge again",
            missing.len(),
            spec.configs.len(),
            missing[0],
            spec.configs.get(missing[0]).unwrap_or_default()
        );
        return Ok(false);
    }
    Ok(true)
}

fn merge(m: MergeArgs) -> Result<bool, AnyError> {
    let spec = Spec::load(&m.spec)?;
    let dir = output_dir(&m.spec, m.output.as_deref());
    let (rows, missing) = merge_rows(&spec, &dir)?;
    write_all(&Files::new(&dir, "results"), &spec.keys, &rows)?;
    finish(&spec, &dir, &rows, &missing)
}

/// A word for a POSIX shell, single-quoted.
fn sh(w: &str) -> String {
    format!("'{}'", w.replace('\'', "'\\''"))
}

fn absolute(p: &Path) -> Result<PathBuf, AnyError> {
    std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display()).into())
}

fn submit(s: SubmitArgs) -> Result<bool, AnyError> {
    let spec = Spec::load(&s.spec)?;
    check(&spec)?;
    if s.array_size == 0 {
        return Err("--array-size must be at least 1".into());
    }
    let n = s.array_size.min(spec.configs.len()).max(1);
    let dir = absolute(&output_dir(&s.spec, s.output.as_deref()))?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let spec_abs = absolute(&s.spec)?;
    let mut script = String::from("#!/bin/sh\n");
    let name: String = spec
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    script.push_str(&format!("#SBATCH --job-name=tessera-sweep-{name}\n"));
    script.push_str(&format!("#SBATCH --array=0-{}\n", n - 1));
    script.push_str(&format!(
        "#SBATCH --cpus-per-task={}\n",
        s.cpus_per_task.max(1)
    ));
    script.push_str(&format!(
        "#SBATCH --output={}\n",
        dir.join("slurm-%A_%a.out").display()
    ));
    if let Some(m) = &s.mem {
        script.push_str(&format!("#SBATCH --mem={m}\n"));
    }
    if let Some(p) = &s.partition {
        script.push_str(&format!("#SBATCH --partition={p}\n"));
    }
    if let Some(t) = &s.time {
        script.push_str(&format!("#SBATCH --time={t}\n"));
    }
    script.push_str(&format!(
        "# Each task runs shard $SLURM_ARRAY_TASK_ID of {n}; then: tessera sweep merge {} --output {}\n",
        sh(&spec_abs.display().to_string()),
        sh(&dir.display().to_string())
    ));
    script.push_str(&format!(
        "exec {} sweep {} --output {} --jobs {} --shard \"$SLURM_ARRAY_TASK_ID/{n}\"\n",
        sh(&exe.display().to_string()),
        sh(&spec_abs.display().to_string()),
        sh(&dir.display().to_string()),
        s.cpus_per_task.max(1)
    ));
    let path = dir.join("sweep.sbatch");
    replace(&path, script.as_bytes())?;
    println!(
        "{}: {} configurations in {n} shards; job script {}",
        spec.name,
        spec.configs.len(),
        path.display()
    );
    if s.dry_run {
        println!("not submitted (--dry-run): sbatch {}", path.display());
        return Ok(true);
    }
    let mut cmd = std::process::Command::new("sbatch");
    cmd.arg("--parsable");
    if s.wait {
        cmd.arg("--wait");
    }
    cmd.arg(&path);
    let out = cmd.output().map_err(|e| {
        format!(
            "sbatch: {e} (is Slurm installed and its sbatch on PATH? the script is written: {})",
            path.display()
        )
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let job = stdout.trim().split(';').next().unwrap_or("").to_string();
    if !out.status.success() {
        return Err(format!(
            "sbatch {} failed ({}): {}",
            path.display(),
            out.status,
            one_line(&String::from_utf8_lossy(&out.stderr))
        )
        .into());
    }
    println!(
        "submitted job array {job} ({n} tasks); logs {}",
        dir.join(format!("slurm-{job}_*.out")).display()
    );
    if !s.wait {
        println!(
            "when it finishes: tessera sweep merge {} --output {}",
            s.spec.display(),
            dir.display()
        );
        return Ok(true);
    }
    println!("job array {job} finished; merging");
    merge(MergeArgs {
        spec: s.spec,
        output: Some(dir),
    })
}
