//! From command-line options and a model file's defaults to a model and session options.

use std::path::{Path, PathBuf};

use tessera_host::estimation::{EstimateOptions, ModelSource};
use tessera_host::idx::{load_mnist, Mnist};
use tessera_host::model::Model;
use tessera_host::session::SessionOptions;

use super::args::{
    DTypeArg, EstimateArgs, LossArg, ModelArgs, OptimizerArg, PartialsArg, ScheduleArg,
};
use super::AnyError;

/// The digits bundled with Tessera.
pub const BUNDLED_DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mnist-binarized-10k");

/// A shipped model by name, or a model file.
pub fn load_model(name: &str) -> Result<Model, AnyError> {
    Ok(ModelSource::from_arg(name).load_model()?)
}

/// The data directory asked for, or the bundled digits.
pub fn data_dir(data: Option<&Path>) -> PathBuf {
    data.map_or_else(|| PathBuf::from(BUNDLED_DATA), Path::to_path_buf)
}

/// Loads the MNIST-format data.
pub fn load_data(dir: &Path) -> Result<Mnist, AnyError> {
    Ok(load_mnist(dir)?)
}

/// The session options: the command line's, else the model file's, else the defaults.
pub fn session_options(a: &ModelArgs, model: &Model) -> Result<SessionOptions, AnyError> {
    Ok(model_options(a)
        .for_model(&model.training, &model.name)?
        .session_options(&model.name, model.stage_count())?)
}

/// The estimate options the model options on the command line stand for.
pub fn model_options(a: &ModelArgs) -> EstimateOptions {
    let either = |yes: bool, no: bool| match (yes, no) {
        (true, _) => Some(true),
        (false, true) => Some(false),
        (false, false) => None,
    };
    EstimateOptions {
        batch_size: a.batch_size,
        gradient_accumulation_count: a.gradient_accumulation_count,
        repeat_count: a.repeat_count,
        steps_per_execution: a.steps_per_execution,
        pipeline_schedule: a.pipeline_schedule.map(ScheduleArg::schedule),
        no_pipelining: a.no_pipelining,
        replicas: a.replicas,
        ipu: a.ipu.preset(),
        optimizer: a.optimizer.map(OptimizerArg::kind),
        learning_rate: a.learning_rate,
        offload_optimizer_state: either(a.offload_optimizer_state, a.no_offload_optimizer_state),
        dtype: a.dtype.dtype(),
        partials_type: a.partials_type.map(PartialsArg::partials),
        gradient_accumulation_dtype: a.gradient_accumulation_dtype.map(DTypeArg::dtype),
        available_memory_proportion: a.available_memory_proportion.clone(),
        recompute_checkpoints: a.recompute_checkpoints.clone(),
        replicated_tensor_sharding: either(
            a.replicated_tensor_sharding,
            a.no_replicated_tensor_sharding,
        ),
        no_outlining: a.no_outlining,
        embedding_serialization: a.embedding_serialization,
        offload_activations: a.offload_activations,
        offload_gradient_accumulation_buffers: a.offload_gradient_accumulation_buffers,
        ..EstimateOptions::default()
    }
}

/// The estimate options `tessera estimate`'s command line stands for.
pub fn estimate_options(a: &EstimateArgs) -> EstimateOptions {
    EstimateOptions {
        inference: a.inference,
        recompute: a.recompute,
        pipeline_stages: a.pipeline_stages.clone(),
        device_mapping: a.device_mapping.clone(),
        pipeline_ipus: a.pipeline_ipus,
        layers_per_ipu: a.layers_per_ipu.clone(),
        input_shapes: a.input_shapes.clone(),
        no_search: a.no_search,
        loss: a.loss.map(LossArg::kind),
        mask_tokens: a.mask_tokens,
        ..model_options(&a.model)
    }
}

/// The command line as typed, with the program called `tessera`.
pub fn command_line() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut() {
        *first = "tessera".into();
    }
    args.join(" ")
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum;
    use tessera_host::names::Named;

    use super::super::args::{DTypeArg, IpuArg, LossArg, OptimizerArg, PartialsArg, ScheduleArg};

    /// The command line's names of a choice, each with the library value it maps to.
    fn names<A: ValueEnum, T: Named + std::fmt::Debug>(to: impl Fn(&A) -> T) {
        let cli: Vec<(String, T)> = A::value_variants()
            .iter()
            .map(|v| (v.to_possible_value().unwrap().get_name().to_string(), to(v)))
            .collect();
        let lib: Vec<(String, T)> = T::NAMES.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        assert_eq!(cli, lib);
    }

    #[test]
    fn the_command_line_names_every_choice_as_the_library_does() {
        names::<ScheduleArg, _>(|a| a.schedule());
        names::<DTypeArg, _>(|a| a.dtype());
        names::<IpuArg, _>(|a| a.preset());
        names::<PartialsArg, _>(|a| a.partials());
        names::<OptimizerArg, _>(|a| a.kind());
        names::<LossArg, _>(|a| a.kind());
    }
}
