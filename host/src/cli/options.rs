//! From command-line options and a model file's defaults to a model and session options.

use std::path::{Path, PathBuf};

use clap::ValueEnum;
use tessera_host::idx::{load_mnist, Mnist};
use tessera_host::model::{shipped, Model, TrainingDefaults, SHIPPED};
use tessera_host::session::{
    default_offload, default_sharding, Checkpoints, OptimizerKind, SessionOptions,
};
use tessera_sim::machine::IpuConfig;

use super::args::{DTypeArg, ModelArgs, PartialsArg, ScheduleArg};
use super::AnyError;

/// The digits bundled with Tessera.
pub const BUNDLED_DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mnist-binarized-10k");

/// A shipped model by name, or a model file.
pub fn load_model(name: &str) -> Result<Model, AnyError> {
    if let Some(m) = shipped(name) {
        return Ok(m?);
    }
    let path = Path::new(name);
    if !path.exists() {
        let names: Vec<&str> = SHIPPED.iter().map(|(n, _)| *n).collect();
        return Err(format!(
            "model `{name}` is neither a shipped model ({}) nor a file",
            names.join(", ")
        )
        .into());
    }
    Ok(Model::from_file(path)?)
}

/// The data directory asked for, or the bundled digits.
pub fn data_dir(data: Option<&Path>) -> PathBuf {
    data.map_or_else(|| PathBuf::from(BUNDLED_DATA), Path::to_path_buf)
}

/// Loads the MNIST-format data.
pub fn load_data(dir: &Path) -> Result<Mnist, AnyError> {
    Ok(load_mnist(dir)?)
}

/// A value of a model file's `[training]` table, parsed as the command line would.
fn file_value<T: ValueEnum>(model: &str, key: &str, value: &str) -> Result<T, AnyError> {
    T::from_str(value, true).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        format!(
            "model `{model}`: {key} `{value}` is not one of {}",
            names.join(", ")
        )
        .into()
    })
}

/// The session options: the command line's, else the model file's, else the defaults.
pub fn session_options(a: &ModelArgs, model: &Model) -> Result<SessionOptions, AnyError> {
    options_with(a, &model.training, &model.name, model.stage_count())
}

/// The session options: the command line's, else the defaults `t` of model `name` (with
/// `model_stages` pipeline stages), else Tessera's.
pub fn options_with(
    a: &ModelArgs,
    t: &TrainingDefaults,
    model: &str,
    model_stages: usize,
) -> Result<SessionOptions, AnyError> {
    let schedule = match (a.pipeline_schedule, &t.pipeline_schedule) {
        (Some(s), _) => s,
        (None, Some(name)) => file_value::<ScheduleArg>(model, "pipeline_schedule", name)?,
        (None, None) => ScheduleArg::Grouped,
    };
    let file_optimizer = t
        .optimizer
        .as_deref()
        .map(|o| file_value::<OptimizerKind>(model, "optimizer", o))
        .transpose()?;
    let optimizer = a.optimizer.or(file_optimizer).unwrap_or_default();
    let accumulation = a
        .gradient_accumulation_count
        .or(t.gradient_accumulation_count)
        .unwrap_or(1);
    let stages = if a.no_pipelining { 1 } else { model_stages };
    let machine = IpuConfig::preset(a.ipu.preset());
    let offload = a.offload_optimizer_state
        || (!a.no_offload_optimizer_state && default_offload(stages, accumulation, &machine));
    Ok(SessionOptions {
        batch_size: a.batch_size.or(t.batch_size).unwrap_or(32),
        gradient_accumulation_count: accumulation,
        repeat_count: a.repeat_count,
        steps_per_execution: a.steps_per_execution,
        schedule: schedule.schedule(),
        replicas: a.replicas,
        ipu: a.ipu.preset(),
        optimizer,
        // The file's rate goes with the file's optimizer; another optimizer gets its own default.
        learning_rate: a.learning_rate.unwrap_or_else(|| match t.learning_rate {
            Some(lr) if file_optimizer.is_none_or(|o| o == optimizer) => lr,
            _ => optimizer.default_learning_rate(),
        }),
        offload_optimizer_state: offload,
        dtype: a.dtype.dtype(),
        no_pipelining: a.no_pipelining,
        partials: match (a.partials_type, &t.partials_type) {
            (Some(p), _) => p.partials(),
            (None, Some(name)) => {
                file_value::<PartialsArg>(model, "partials_type", name)?.partials()
            }
            (None, None) => PartialsArg::Float.partials(),
        },
        accumulation_dtype: match (a.gradient_accumulation_dtype, &t.gradient_accumulation_dtype) {
            (Some(d), _) => Some(d.dtype()),
            (None, Some(name)) => {
                Some(file_value::<DTypeArg>(model, "gradient_accumulation_dtype", name)?.dtype())
            }
            (None, None) => None,
        },
        replicated_tensor_sharding: a.replicated_tensor_sharding
            || (!a.no_replicated_tensor_sharding && default_sharding(offload, a.replicas)),
        outlining: !a.no_outlining && t.outlining.unwrap_or(true),
        offload_activations: a.offload_activations,
        offload_gradient_accumulation_buffers: a.offload_gradient_accumulation_buffers,
        embedding_serialization: match a.embedding_serialization.or(t.embedding_serialization) {
            Some(0) => {
                return Err(format!(
                    "{model}: embedding_serialization must be at least 1 (1 leaves the embedding whole)"
                )
                .into())
            }
            Some(n) => n,
            None => 1,
        },
        recompute_checkpoints: match a.recompute_checkpoints.as_slice() {
            [] => None,
            [one] if one == "auto" => Some(Checkpoints::Auto),
            names => {
                if names.iter().any(|n| n == "auto") {
                    return Err(
                        "--recompute-checkpoints: `auto` stands alone (or name the checkpoints)"
                            .into(),
                    );
                }
                Some(Checkpoints::Named(names.to_vec()))
            }
        },
        available_memory_proportion: if a.available_memory_proportion.is_empty() {
            let file = t.available_memory_proportion.clone().unwrap_or_default();
            for &p in &file {
                tessera_sim::matmul::check_proportion(p)
                    .map_err(|e| format!("{model}: available_memory_proportion {e}"))?;
            }
            file
        } else {
            a.available_memory_proportion.clone()
        },
    })
}

/// The command line as typed, with the program called `tessera`.
pub fn command_line() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut() {
        *first = "tessera".into();
    }
    args.join(" ")
}
