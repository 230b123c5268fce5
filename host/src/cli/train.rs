//! `tessera train`: every check first (a bad option is one line and nothing else), then the
//! header, the per-epoch callbacks with a progress bar, the test evaluation and the estimate.

use crate::compile::{compile, SessionOptions};
use crate::idx::Mnist;
use crate::inspect::{epoch_report, parse_filters, GradientOutfeedMode};
use crate::report::write_report;
use crate::session::{prepare, EstimateSummary, Prepared, TrainEvent, TrainOptions, TrainReport};
use indicatif::{ProgressBar, ProgressStyle};

use super::args::TrainArgs;
use super::estimate::files_list;
use super::options::{command_line, data_dir, load_data, load_model, session_options};
use super::AnyError;
use crate::estimation::{inference_line, report as make_report};

fn train_options(a: &TrainArgs, epochs_default: Option<usize>) -> TrainOptions {
    TrainOptions {
        epochs: a.epochs.or(epochs_default).unwrap_or(3),
        run_single_step: a.run_single_step,
        gradient_outfeed_mode: if a.outfeed_pre_accumulated_gradients {
            GradientOutfeedMode::AfterCompute
        } else {
            GradientOutfeedMode::BeforeApply
        },
        gradients_filters: parse_filters(&a.gradients_filters),
        activations_filters: parse_filters(&a.activations_filters),
        seed: a.seed,
        prefetch_depth: a.prefetch_depth,
        buffer_depth: a.buffer_depth,
        checkpoint: a.checkpoint.clone(),
    }
}

fn print_header(p: &Prepared, opts: &SessionOptions, data: &Mnist, source: &str) {
    let c = p.compiled();
    let x = p.executions();
    print!("{}", c.model.summary());
    println!(
        "data: {} training and {} test digits from {source}",
        data.train_images.count, data.test_images.count,
    );
    println!(
        "{} IPU(s) of {} per replica, {} replica(s), {} schedule, batch {}, M = {}, {} at learning rate {}{}",
        c.model.ipus(),
        opts.ipu.name(),
        opts.replicas,
        c.target.options.schedule.name(),
        opts.batch_size,
        opts.gradient_accumulation_count,
        format!("{:?}", opts.optimizer).to_lowercase(),
        opts.learning_rate,
        if opts.techniques.offload.optimizer_state { ", optimizer state offloaded" } else { "" },
    );
    println!(
        "{} execution(s) of R = {} weight updates ({} samples each, {:.2} epochs) over the repeated dataset",
        x.executions,
        x.repeat,
        x.samples_per_execution(),
        x.epochs_after(1)
    );
}

fn progress_bar() -> Result<ProgressBar, AnyError> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {pos}/{len} micro-batches ({per_sec}, eta {eta})",
        )?
        .progress_chars("=> "),
    );
    Ok(bar)
}

/// Runs training with a progress bar, printing each epoch's callbacks unless `quiet`.
fn run_with_progress(p: Prepared, data: &Mnist, quiet: bool) -> Result<TrainReport, AnyError> {
    let bar = progress_bar()?;
    let (mut per_epoch, mut total) = (1u64, 1u64);
    let report = p.run(data, |ev| match ev {
        TrainEvent::Start {
            total_steps,
            steps_per_epoch,
        } => {
            (per_epoch, total) = (steps_per_epoch.max(1), total_steps);
            bar.set_length(total);
            bar.set_message("Training");
        }
        TrainEvent::Progress { steps } => bar.set_position(steps),
        TrainEvent::Epoch {
            epoch,
            epochs_seen,
            loss,
            outfeeds,
        } => bar.suspend(|| {
            if quiet {
                return;
            }
            println!(
                "Epoch {epochs_seen:.1}, Mean loss: {loss:.3} (reporting point {epoch}, every {per_epoch} micro-batches of {total})"
            );
            for (cb, data) in &outfeeds {
                println!("{}", epoch_report(cb, epoch, data));
            }
            println!();
        }),
    });
    bar.finish_and_clear();
    Ok(report?)
}

fn print_results(
    r: &TrainReport,
    opts: &SessionOptions,
    name: &str,
    machine: &tessera_sim::machine::IpuConfig,
) {
    let ev = &r.evaluation;
    println!(
        "test accuracy: {:.2}% on {} of {} digits (whole micro-batches), test loss {:.4}; final training loss {:.4}",
        r.test_accuracy * 100.0,
        ev.samples,
        ev.split_samples,
        r.test_loss,
        r.final_loss
    );
    println!(
        "{} micro-batches, {} weight updates in {} execution(s) of R = {} updates (K = {} micro-batches), {:.2} epochs; {:.1} s",
        r.steps, r.weight_updates, r.executions, r.repeat_count, r.steps_per_execution, r.epochs_seen, r.wall_seconds
    );
    for o in r.outfeeds.iter().filter(|o| o.enqueued > 0) {
        println!(
            "outfeed {}: {} elements, {} enqueues stalled waiting for the host ({:.3} s)",
            o.queue, o.enqueued, o.stalled_enqueues, o.stall_seconds
        );
    }
    println!("estimate:");
    print!(
        "{}",
        EstimateSummary::new(name, opts.ipu, machine, &r.estimate).to_text()
    );
    println!("evaluation on the device: {}", inference_line(&ev.estimate));
}

pub fn run(a: TrainArgs) -> Result<bool, AnyError> {
    // Where the checkpoint and the report go is checked before any work.
    if let Some(c) = &a.checkpoint {
        crate::output::check_output_file(c)?;
    }
    if let Some(d) = &a.report_dir {
        crate::output::check_output_dir(d)?;
    }
    let model = load_model(&a.model.model)?;
    let opts = session_options(&a.model, &model)?;
    let dir = data_dir(a.data.as_deref());
    let data = load_data(&dir)?;
    let options = train_options(&a, model.training.epochs);
    let compiled = compile(&model, &opts)?;
    let (name, machine) = (compiled.model.name.clone(), compiled.target.machine.clone());
    // Every check happens here, before anything is printed.
    let prepared = prepare(compiled, &data, &options)?;
    let quiet = a.json;
    if !quiet {
        let source = dir.canonicalize().unwrap_or_else(|_| dir.clone());
        print_header(&prepared, &opts, &data, &source.display().to_string());
    }
    let report = run_with_progress(prepared, &data, quiet)?;
    if !quiet {
        print_results(&report, &opts, &name, &machine);
        if let Some(c) = &options.checkpoint {
            println!("weights saved to {}", c.display());
        }
    }
    if let Some(dir) = &a.report_dir {
        let training = serde_json::to_value(&report)?;
        let r = make_report(
            &name,
            &opts,
            &machine,
            report.estimate.clone(),
            Some(training),
            &command_line(),
        );
        let files = write_report(dir, &r)?;
        if !quiet {
            println!("report written: {}", files_list(&files));
        }
    }
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(true)
}
