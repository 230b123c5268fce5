//! The estimate options as a command's flags. Every flag, its help and its parser come from
//! the library's [`EstimateOptions`] (clap, from its fields); here each automatic switch gains
//! its `--no-` form, and the commands that run a model (`train`, `evaluate`, `predict`) hide
//! and refuse the options only an estimate takes ([`ESTIMATE_ONLY`]).

use crate::estimation::{EstimateOptions, ESTIMATE_ONLY};
use clap::builder::ValueRange;
use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};

/// `tessera estimate`'s options: all of them.
#[derive(Clone, Debug)]
pub struct EstimateFlags(pub EstimateOptions);

/// The options of a model that `train`, `evaluate` and `predict` run: all but the
/// estimate-only ones.
#[derive(Clone, Debug)]
pub struct ModelFlags(pub EstimateOptions);

/// Whether `a` is an automatic switch: `Some(true)` given bare, `Some(false)` by its `--no-`
/// form, the default (`None`) when absent.
fn is_switch(a: &Arg) -> bool {
    let values: Vec<String> = a
        .get_possible_values()
        .iter()
        .map(|v| v.get_name().to_string())
        .collect();
    a.get_num_args() == Some(ValueRange::new(0..=1)) && values == ["true", "false"]
}

/// The id of a switch's `--no-` form.
fn no_id(id: &str) -> String {
    format!("no_{id}")
}

/// The library's options added to `cmd` in their order, each switch followed by its `--no-`
/// form.
fn augment(mut cmd: Command) -> Command {
    // Without display orders of their own, the outer command numbers them as they come.
    let options = EstimateOptions::augment_args(Command::new("options").next_display_order(None));
    for a in options.get_arguments() {
        cmd = cmd.arg(a.clone());
        if is_switch(a) {
            let id = a.get_id().to_string();
            let long = a.get_long().unwrap_or(&id).to_string();
            cmd = cmd.arg(
                Arg::new(no_id(&id))
                    .long(format!("no-{long}"))
                    .action(ArgAction::SetTrue)
                    .conflicts_with(id)
                    .help(format!("Turn --{long} off, even where it is the default")),
            );
        }
    }
    cmd
}

/// The options `m` holds, each switch's `--no-` form read as `false`.
fn options(m: &mut ArgMatches) -> Result<EstimateOptions, clap::Error> {
    let mut o = EstimateOptions::from_arg_matches_mut(m)?;
    let all = EstimateOptions::augment_args(Command::new("options"));
    let refused: Vec<&str> = all
        .get_arguments()
        .filter(|a| is_switch(a))
        .map(|a| a.get_id().as_str())
        .filter(|id| m.get_flag(&no_id(id)))
        .collect();
    if !refused.is_empty() {
        // The field by its name, through the options' serde form (one declaration).
        let wrong = |e: serde_json::Error| clap::Error::raw(ErrorKind::InvalidValue, e);
        let mut v = serde_json::to_value(&o).map_err(wrong)?;
        for id in refused {
            v[id] = serde_json::Value::Bool(false);
        }
        o = serde_json::from_value(v).map_err(wrong)?;
    }
    Ok(o)
}

impl FromArgMatches for EstimateFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Self::from_arg_matches_mut(&mut m.clone())
    }
    fn from_arg_matches_mut(m: &mut ArgMatches) -> Result<Self, clap::Error> {
        options(m).map(EstimateFlags)
    }
    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for EstimateFlags {
    fn augment_args(cmd: Command) -> Command {
        augment(cmd)
    }
    fn augment_args_for_update(cmd: Command) -> Command {
        augment(cmd)
    }
}

impl FromArgMatches for ModelFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Self::from_arg_matches_mut(&mut m.clone())
    }
    fn from_arg_matches_mut(m: &mut ArgMatches) -> Result<Self, clap::Error> {
        let all = EstimateOptions::augment_args(Command::new("options"));
        for a in all.get_arguments() {
            let id = a.get_id().as_str();
            if ESTIMATE_ONLY.contains(&id) && m.value_source(id) == Some(ValueSource::CommandLine) {
                let long = a.get_long().unwrap_or(id);
                return Err(clap::Error::raw(
                    ErrorKind::ArgumentConflict,
                    format!("--{long} is an option of `tessera estimate` only\n"),
                ));
            }
        }
        options(m).map(ModelFlags)
    }
    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for ModelFlags {
    fn augment_args(cmd: Command) -> Command {
        augment(cmd).mut_args(|a| {
            if ESTIMATE_ONLY.contains(&a.get_id().as_str()) {
                a.hide(true)
            } else {
                a
            }
        })
    }
    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use crate::estimation::{EstimateOptions, ESTIMATE_ONLY};
    use clap::{CommandFactory, Parser};

    use super::super::args::{Cli, Command};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(["tessera"].iter().chain(args).copied())
    }

    fn estimate(args: &[&str]) -> EstimateOptions {
        let mut all = vec!["estimate"];
        all.extend(args);
        match parse(&all).unwrap().command {
            Command::Estimate(a) => a.options.0,
            _ => panic!("not an estimate"),
        }
    }

    /// The ids of the options subcommand `sub` shows (hidden ones left out).
    fn flags(sub: &str) -> Vec<String> {
        let cli = Cli::command();
        let cmd = cli.find_subcommand(sub).unwrap();
        cmd.get_arguments()
            .filter(|a| !a.is_hide_set())
            .map(|a| a.get_id().to_string())
            .collect()
    }

    #[test]
    fn every_option_is_a_flag_of_estimate_and_the_model_ones_of_train() {
        let estimate = flags("estimate");
        let train = flags("train");
        for name in EstimateOptions::names() {
            assert!(estimate.contains(&name), "estimate lacks {name}");
            let estimate_only = ESTIMATE_ONLY.contains(&name.as_str());
            assert_eq!(train.contains(&name), !estimate_only, "train and {name}");
        }
    }

    #[test]
    fn a_switch_reads_bare_with_a_value_or_by_its_no_form() {
        assert_eq!(estimate(&[]).offload_optimizer_state, None);
        let on = estimate(&["--offload-optimizer-state"]);
        assert_eq!(on.offload_optimizer_state, Some(true));
        let off = estimate(&["--no-offload-optimizer-state"]);
        assert_eq!(off.offload_optimizer_state, Some(false));
        assert_eq!(off, estimate(&["--offload-optimizer-state=false"]));
        let rts = estimate(&["--no-replicated-tensor-sharding", "--batch-size", "4"]);
        assert_eq!(rts.replicated_tensor_sharding, Some(false));
        assert_eq!(rts.batch_size, Some(4));
        let both = [
            "estimate",
            "--offload-optimizer-state",
            "--no-offload-optimizer-state",
        ];
        assert!(parse(&both).is_err());
    }

    #[test]
    fn a_command_that_runs_a_model_refuses_the_estimate_only_options() {
        let e = parse(&["train", "--inference"]).unwrap_err().to_string();
        assert!(
            e.contains("--inference is an option of `tessera estimate` only"),
            "{e}"
        );
        let e = parse(&["predict", "-o", "p.npy", "--layers-per-ipu", "1,1"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--layers-per-ipu"), "{e}");
        let Command::Train(t) = parse(&["train", "--no-offload-optimizer-state"])
            .unwrap()
            .command
        else {
            panic!("not train")
        };
        assert_eq!(t.model.options.0.offload_optimizer_state, Some(false));
    }
}
