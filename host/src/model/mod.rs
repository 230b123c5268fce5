//! Models: a Keras-like builder ([`Sequential`] and [`Functional`], with pipeline stages given
//! by a list or by a stage scope) and a model file format (TOML) that says the same.
//!
//! A [`Model`] is a checked description: layer names are unique, every layer's input exists
//! and comes before it, stages follow the layers' order. [`Model::build`] turns it into a core
//! graph for a batch size and element type; widths are checked there (a Dense layer's input
//! width comes from its input, so only the output width can disagree with the data).
//!
//! The layers are those of Graphcore's tensor-inspection example: `flatten`, `dense` (units,
//! activation), `outfeed` (an `Outfeed` layer: enqueues its input under its own name on a
//! plain outfeed queue) and `maybe_outfeed` (a `MaybeOutfeed` layer: adds its input to the
//! per-micro-batch map of a queue with filters). Both outfeed layers pass their input on.
//!
//! A model file:
//!
//! ```toml
//! name = "pipelined_sequential"
//! kind = "sequential"              # or "functional": layers name their `input`
//! input = { name = "images", shape = [28, 28] }
//!
//! [[layer]]
//! type = "flatten"
//! name = "Flatten"
//!
//! [[layer]]
//! type = "dense"
//! name = "Dense_10"
//! units = 10
//! activation = "softmax"
//!
//! [pipeline]
//! stage_assignment = [0, 0]        # one stage per layer (or use [[stage]] scopes)
//!
//! [training]
//! batch_size = 32
//! gradient_accumulation_count = 4
//! ```
//!
//! Stage scopes, as `with ipu.keras.PipelineStage(k):` does, are `[[stage]]` tables holding
//! `[[stage.layer]]` lists, stage 0 first.

mod builder;
mod file;
mod graph;
mod layer;
mod shipped;

pub use builder::{Functional, Sequential, Tensor};
pub use graph::BuiltModel;
pub use layer::{Layer, LayerActivation, LayerKind, LayerPadding};
pub use shipped::{shipped, DEFAULT_MODEL, SHIPPED};

use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;
use std::io;

use tessera_core::GraphError;

/// Where a layer takes its input from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The model's input.
    Input,
    /// Layer `i`'s output.
    Layer(usize),
}

/// A layer in a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelLayer {
    /// The layer.
    pub layer: Layer,
    /// Its input.
    pub input: Source,
    /// Further inputs: an `Add`'s second operand, the tensor attention attends to.
    pub extra: Vec<Source>,
    /// Its pipeline stage.
    pub stage: usize,
}

/// What a model file's `[training]` table sets: estimate options, by the names that
/// `EstimateOptions` (and `tessera estimate`'s flags, sweep specs and Python's keyword
/// arguments) give them, each with its value as written; and the epochs `tessera train` runs.
///
/// The table's keys are checked when the file is read (an unknown key or a value of the wrong
/// type is an error at its line); the options are read into `EstimateOptions`, by the one
/// deserializer every way in shares, when a session is made, under the options the command
/// line or the request sets. The file says `outlining = false`; the options say
/// `no_outlining = true`. Names of schedules, optimizers and types are read in any letter
/// case.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainingDefaults {
    /// The options, by name.
    pub options: serde_json::Map<String, serde_json::Value>,
    /// Epochs.
    pub epochs: Option<usize>,
}

impl TrainingDefaults {
    /// The value the table sets for option `name`, if it sets one.
    pub fn get(&self, name: &str) -> Option<&serde_json::Value> {
        self.options.get(name)
    }
}

/// Whether layers are chained (Sequential) or wired by name (Functional).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// Each layer takes the previous layer's output.
    Sequential,
    /// Each layer names its input.
    Functional,
}

/// A checked model.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    /// Its name.
    pub name: String,
    /// Sequential or Functional.
    pub kind: ModelKind,
    /// The input's name.
    pub input_name: String,
    /// The input's shape per sample (no batch axis).
    pub input_shape: Vec<usize>,
    /// The layers in order.
    pub layers: Vec<ModelLayer>,
    /// The output layer.
    pub output: usize,
    /// Stage -> IPU (`None`: stage k on IPU k).
    pub device_mapping: Option<Vec<usize>>,
    /// Training settings from the file.
    pub training: TrainingDefaults,
    /// Whether the input holds integers (token ids for an `Embedding`) rather than values of
    /// the model's float type.
    pub integer_input: bool,
}

/// Why a model is not valid.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The model file could not be read.
    #[error("{file}: {source}")]
    Read {
        /// The file.
        file: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The file is not valid TOML or has an unknown or mistyped key.
    #[error("{file}{}: {message}", Location(*.line, *.column))]
    Parse {
        /// The file.
        file: String,
        /// Line (1-based), when known.
        line: Option<usize>,
        /// Column (1-based), when known.
        column: Option<usize>,
        /// What is wrong (the TOML error's message, without its location).
        message: String,
        /// The TOML error (boxed: it is large).
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A layer is wrong (unknown type, missing or misplaced field, bad width, unknown input).
    #[error("{model}: layer {index}{}: {message}", LayerName(.name))]
    Layer {
        /// The file or model.
        model: String,
        /// The layer's position (0-based).
        index: usize,
        /// The layer's name, if it has one.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The model as a whole is wrong (no layers, bad stage assignment, bad input).
    #[error("{model}: {message}")]
    Model {
        /// The file or model.
        model: String,
        /// What is wrong.
        message: String,
    },
    /// The model does not fit the data.
    #[error("{model}: {message}")]
    Data {
        /// The model.
        model: String,
        /// What is wrong.
        message: String,
    },
    /// The core graph refused the model.
    #[error("{model}: the graph cannot be built")]
    Graph {
        /// The model.
        model: String,
        /// The core's error (boxed: it carries names inline).
        #[source]
        source: Box<GraphError>,
    },
}

/// `":line:column"`, `":line"` or nothing.
struct Location(Option<usize>, Option<usize>);

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.0 {
            write!(f, ":{line}")?;
            if let Some(column) = self.1 {
                write!(f, ":{column}")?;
            }
        }
        Ok(())
    }
}

/// ``" (`name`)"``, or nothing for a layer without a name.
struct LayerName<'a>(&'a str);

impl fmt::Display for LayerName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, " (`{}`)", self.0)
        }
    }
}

/// What a builder or a model file gives [`Model::new`] to check.
struct ModelParts<'a> {
    /// The model's name.
    name: &'a str,
    /// Sequential or Functional.
    kind: ModelKind,
    /// The input's name.
    input_name: &'a str,
    /// The input's shape per sample (no batch axis).
    input_shape: &'a [usize],
    /// The layers in order.
    layers: Vec<ModelLayer>,
    /// The output layer (`None`: the last layer).
    output: Option<usize>,
    /// Stage -> IPU (`None`: stage k on IPU k).
    device_mapping: Option<Vec<usize>>,
}

impl Model {
    /// Checks a model; errors name `context` (the model or its file).
    fn new(context: &str, parts: ModelParts<'_>) -> Result<Model, ModelError> {
        let ModelParts {
            name,
            kind,
            input_name,
            input_shape,
            layers,
            output,
            device_mapping,
        } = parts;
        let model_err = |message: String| ModelError::Model {
            model: context.to_string(),
            message,
        };
        if layers.is_empty() {
            return Err(model_err("the model has no layers".into()));
        }
        check_input(input_name, input_shape).map_err(model_err)?;
        let stages = check_layers(context, input_name, &layers)?;
        check_stages(&layers, stages, device_mapping.as_deref()).map_err(model_err)?;
        let output = output.unwrap_or(layers.len() - 1);
        if output >= layers.len() {
            return Err(model_err(format!(
                "the output layer {output} does not exist"
            )));
        }
        Ok(Model {
            name: name.to_string(),
            kind,
            input_name: input_name.to_string(),
            input_shape: input_shape.to_vec(),
            layers,
            output,
            device_mapping,
            training: TrainingDefaults::default(),
            integer_input: false,
        })
    }

    /// Pipeline stages.
    pub fn stage_count(&self) -> usize {
        self.layers.iter().map(|l| l.stage).max().unwrap_or(0) + 1
    }

    /// Whether the model has more than one stage.
    pub fn is_pipelined(&self) -> bool {
        self.stage_count() > 1
    }

    /// IPUs the model's stages use.
    pub fn ipus(&self) -> usize {
        self.device_mapping
            .as_ref()
            .map_or(self.stage_count(), |m| {
                m.iter().copied().max().unwrap_or(0) + 1
            })
    }

    /// Puts every layer in stage 0 (one IPU): `--no-pipelining`.
    pub fn without_pipelining(mut self) -> Self {
        for l in &mut self.layers {
            l.stage = 0;
        }
        self.device_mapping = None;
        self
    }

    /// The layer that computes the output: the output layer, looking through outfeed layers
    /// (which pass their input on).
    pub fn output_source(&self) -> usize {
        let mut o = self.output;
        while let (LayerKind::Outfeed | LayerKind::MaybeOutfeed, Source::Layer(j)) =
            (&self.layers[o].layer.kind, self.layers[o].input)
        {
            o = j;
        }
        o
    }

    /// The output layer's width (classes for a classifier), if it is a Dense layer.
    pub fn output_units(&self) -> Option<usize> {
        match self.layers[self.output_source()].layer.kind {
            LayerKind::Dense { units, .. } => Some(units),
            _ => None,
        }
    }

    /// Checks the model against the data: sample shape and classes.
    ///
    /// # Errors
    ///
    /// [`ModelError::Data`] or [`ModelError::Layer`] saying what disagrees.
    pub fn check_data(&self, sample_shape: &[usize], classes: usize) -> Result<(), ModelError> {
        // The data's samples take the input's shape: the same sizes, up to axes of size 1
        // (a channel axis of 1, say). A flat input takes samples of any shape with as many
        // elements (Keras flattens them for a Dense input): only then does the count alone
        // decide.
        let elements = |s: &[usize]| s.iter().product::<usize>();
        let sizes = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
        let flat = self.input_shape.len() <= 1;
        let matches = if flat {
            elements(sample_shape) == elements(&self.input_shape)
        } else {
            sizes(sample_shape) == sizes(&self.input_shape)
        };
        if !matches {
            return Err(ModelError::Data {
                model: self.name.clone(),
                message: format!(
                    "input `{}` has shape {:?} but the data's samples have shape {:?}",
                    self.input_name, self.input_shape, sample_shape
                ),
            });
        }
        let index = self.output_source();
        let out = &self.layers[index];
        match out.layer.kind {
            LayerKind::Dense { units, .. } if units == classes => Ok(()),
            LayerKind::Dense { units, .. } => Err(ModelError::Layer {
                model: self.name.clone(),
                index,
                name: out.layer.name.clone(),
                message: format!(
                    "the output layer has {units} units but the data has {classes} classes"
                ),
            }),
            _ => Err(ModelError::Layer {
                model: self.name.clone(),
                index,
                name: out.layer.name.clone(),
                message: format!(
                    "the output layer must be a Dense layer with {classes} units (one per class)"
                ),
            }),
        }
    }

    /// The stage-assignment summary, as Keras' `print_pipeline_stage_assignment_summary`.
    pub fn summary(&self) -> String {
        let rows: Vec<(String, String)> = self
            .layers
            .iter()
            .map(|l| {
                (
                    format!("{} ({})", l.layer.name, l.layer.kind.type_name()),
                    l.stage.to_string(),
                )
            })
            .collect();
        let w = rows
            .iter()
            .map(|r| r.0.len())
            .max()
            .unwrap_or(0)
            .max("Layer (type)".len())
            + 4;
        let mut s = String::new();
        let _ = writeln!(s, "Model: \"{}\"", self.name);
        let rule = "_".repeat(w + "Pipeline Stage".len());
        let _ = writeln!(s, "{rule}");
        let _ = writeln!(s, "{:<w$}Pipeline Stage", "Layer (type)");
        let _ = writeln!(s, "{}", "=".repeat(w + "Pipeline Stage".len()));
        for (i, (name, stage)) in rows.iter().enumerate() {
            let _ = writeln!(s, "{name:<w$}{stage}");
            if i + 1 < rows.len() {
                let _ = writeln!(s, "{rule}");
            }
        }
        let _ = writeln!(s, "{}", "=".repeat(w + "Pipeline Stage".len()));
        s
    }
}

/// The most pipeline stages a model may have.
const MAX_STAGES: usize = 16;

/// Checks the model's input: 1 to 3 positive dimensions per sample.
fn check_input(input_name: &str, input_shape: &[usize]) -> Result<(), String> {
    if input_shape.is_empty() || input_shape.len() > 3 || input_shape.contains(&0) {
        return Err(format!(
            "input `{input_name}` has shape {input_shape:?}; give 1 to 3 positive dimensions per sample"
        ));
    }
    Ok(())
}

/// Checks every layer in order (names, widths, inputs, stages) and returns the number of
/// pipeline stages (the last layer's stage + 1).
fn check_layers(
    context: &str,
    input_name: &str,
    layers: &[ModelLayer],
) -> Result<usize, ModelError> {
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut last_stage = 0;
    for (i, l) in layers.iter().enumerate() {
        let bad = |message: String| ModelError::Layer {
            model: context.to_string(),
            index: i,
            name: l.layer.name.clone(),
            message,
        };
        let n = l.layer.name.as_str();
        check_layer_name(n, input_name).map_err(bad)?;
        if names.insert(n, i).is_some() {
            return Err(bad("two layers have this name".into()));
        }
        if let LayerKind::Dense { units: 0, .. } = l.layer.kind {
            return Err(bad("a Dense layer needs at least 1 unit".into()));
        }
        let (least, most) = l.layer.kind.inputs();
        let given = 1 + l.extra.len();
        if given < least || given > most {
            return Err(bad(format!(
                "{} takes {} input(s), this layer has {given}; list them as `inputs = [...]`",
                l.layer.kind.type_name(),
                if least == most {
                    least.to_string()
                } else {
                    format!("{least} or {most}")
                }
            )));
        }
        for source in std::iter::once(&l.input).chain(&l.extra) {
            if let Source::Layer(j) = *source {
                if j >= i {
                    return Err(bad(format!(
                        "its input `{}` comes after it; layers must follow their inputs",
                        layers.get(j).map_or("?", |x| x.layer.name.as_str())
                    )));
                }
            }
        }
        check_layer_stage(l.stage, last_stage).map_err(bad)?;
        last_stage = l.stage;
    }
    Ok(last_stage + 1)
}

/// Checks a layer's name: 1 to 40 characters, no `/` or `:` (variable names derive from it),
/// not the model input's name.
fn check_layer_name(name: &str, input_name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 40 || name.contains(['/', ':']) {
        return Err("a layer name must have 1 to 40 characters and no `/` or `:`".into());
    }
    if name == input_name {
        return Err("the layer has the same name as the model's input".into());
    }
    Ok(())
}

/// Checks a layer's stage against the supported number and the previous layer's stage.
fn check_layer_stage(stage: usize, last_stage: usize) -> Result<(), String> {
    if stage >= MAX_STAGES {
        return Err(format!(
            "stage {stage} is beyond the {MAX_STAGES} stages supported"
        ));
    }
    if stage < last_stage {
        return Err(format!(
            "it is in pipeline stage {stage} after a layer of stage {last_stage}; stages must follow the order of the layers"
        ));
    }
    Ok(())
}

/// Checks that every one of the `stages` stages has a layer and that a device mapping gives
/// one IPU per stage.
fn check_stages(
    layers: &[ModelLayer],
    stages: usize,
    device_mapping: Option<&[usize]>,
) -> Result<(), String> {
    if let Some(s) = (0..stages).find(|&s| !layers.iter().any(|l| l.stage == s)) {
        return Err(format!("pipeline stage {s} has no layers"));
    }
    if let Some(m) = device_mapping {
        if m.len() != stages {
            return Err(format!(
                "the device mapping has {} entries for {stages} pipeline stages",
                m.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::{DType, Fixed, Graph};

    #[test]
    fn summary_lists_layers_and_stages() {
        let m = shipped("pipelined_sequential").unwrap().unwrap();
        let s = m.summary();
        assert!(s.contains("Layer (type)"));
        assert!(s.contains("Pipeline Stage"));
        assert!(s
            .lines()
            .any(|l| l.starts_with("Dense_256 (Dense)") && l.ends_with('0')));
        assert!(s
            .lines()
            .any(|l| l.starts_with("Dense_10 (Dense)") && l.ends_with('1')));
    }

    #[test]
    fn errors_keep_their_source() {
        use std::error::Error as _;
        let e = Model::from_toml("input = { shape = [4] }\nbogus = 1\n", "m.toml").unwrap_err();
        assert!(matches!(e, ModelError::Parse { .. }), "{e:?}");
        let toml_error = e.source().expect("the TOML error is the source");
        assert!(toml_error.to_string().contains("bogus"), "{toml_error}");

        let missing =
            std::env::temp_dir().join(format!("tessera-missing-model-{}.toml", std::process::id()));
        let e = Model::from_file(&missing).unwrap_err();
        assert!(
            matches!(&e, ModelError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound),
            "{e:?}"
        );
        assert!(e.source().is_some());
        assert!(e
            .to_string()
            .starts_with(&format!("{}: ", missing.display())));

        let m = shipped("sequential").unwrap().unwrap();
        let mut g: Graph<Fixed<2>> = Graph::new();
        let e = m.build(&mut g, 8, DType::F32, true).unwrap_err();
        assert!(matches!(e, ModelError::Graph { .. }), "{e:?}");
        assert!(e.source().is_some());
    }

    #[test]
    fn stages_must_follow_the_layers() {
        let mut s = Sequential::new("m", "x", &[4]);
        s.add(Layer::dense("A", 4, LayerActivation::Relu))
            .add(Layer::dense("B", 4, LayerActivation::Relu))
            .set_pipeline_stage_assignment(&[1, 0]);
        assert!(s.build().unwrap_err().to_string().contains("stage 0 after"));
        s.set_pipeline_stage_assignment(&[0, 2]);
        assert!(s
            .build()
            .unwrap_err()
            .to_string()
            .contains("stage 1 has no layers"));
        s.set_pipeline_stage_assignment(&[0]);
        assert!(s
            .build()
            .unwrap_err()
            .to_string()
            .contains("1 entries for 2 layers"));
    }

    #[test]
    fn data_checks_name_the_width() {
        let m = shipped("sequential").unwrap().unwrap();
        assert!(m.check_data(&[28, 28], 10).is_ok());
        let e = m.check_data(&[28, 28], 12).unwrap_err().to_string();
        assert!(
            e.contains("Dense_10") && e.contains("10 units") && e.contains("12 classes"),
            "{e}"
        );
        let e = m.check_data(&[32, 32], 10).unwrap_err().to_string();
        assert!(e.contains("[32, 32]"), "{e}");
    }
}
