//! From command-line options and a model file's defaults to a model and session options.

use std::path::{Path, PathBuf};

use crate::compile::SessionOptions;
use crate::estimation::ModelSource;
use crate::idx::{load_mnist, Mnist};
use crate::model::Model;

use super::args::ModelArgs;
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
    Ok(a.options
        .0
        .for_model(&model.training, &model.name)?
        .session_options(&model.name, model.stage_count())?)
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
    use crate::compile::onnx::LossKind;
    use crate::compile::OptimizerKind;
    use crate::names::Named;
    use clap::{CommandFactory, Parser};
    use tessera_core::schedule::Schedule;
    use tessera_core::DType;
    use tessera_sim::machine::Preset;
    use tessera_sim::planner::PartialsType;

    use super::super::args::Cli;

    /// The names and help `tessera estimate` lists for option `long`.
    fn listed(long: &str) -> Vec<(String, Option<String>)> {
        let cli = Cli::command();
        let estimate = cli.find_subcommand("estimate").unwrap();
        let arg = estimate
            .get_arguments()
            .find(|a| a.get_long() == Some(long))
            .unwrap();
        arg.get_possible_values()
            .iter()
            .map(|v| {
                (
                    v.get_name().to_string(),
                    v.get_help().map(|h| h.to_string()),
                )
            })
            .collect()
    }

    /// The library's names of choice `T`, with their help.
    fn library<T: Named>() -> Vec<(String, Option<String>)> {
        T::NAMES
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.to_string(), T::HELP.get(i).map(|h| h.to_string())))
            .collect()
    }

    #[test]
    fn the_command_line_lists_every_choice_as_the_library_does() {
        assert_eq!(listed("pipeline-schedule"), library::<Schedule>());
        assert_eq!(listed("dtype"), library::<DType>());
        assert_eq!(listed("gradient-accumulation-dtype"), library::<DType>());
        assert_eq!(listed("ipu"), library::<Preset>());
        assert_eq!(listed("partials-type"), library::<PartialsType>());
        assert_eq!(listed("optimizer"), library::<OptimizerKind>());
        assert_eq!(listed("loss"), library::<LossKind>());
    }

    #[test]
    fn a_choice_reads_as_the_library_value_and_refuses_other_names() {
        let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
        let cli = parse(&[
            "tessera",
            "estimate",
            "--pipeline-schedule",
            "interleaved",
            "--ipu",
            "bow",
        ])
        .unwrap();
        let super::super::args::Command::Estimate(a) = cli.command else {
            panic!("not an estimate")
        };
        assert_eq!(a.options.0.pipeline_schedule, Some(Schedule::Interleaved));
        assert_eq!(a.options.0.ipu, Preset::Bow);
        let e = parse(&["tessera", "estimate", "--ipu", "mk3"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("[possible values: mk1, mk2, bow, c600]"), "{e}");
    }
}
