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

use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;
use std::io;
use std::path::Path;

use serde::Deserialize;
use tessera_core::ops::conv::{DataLayout, Padding};
use tessera_core::ops::norm::BatchNorm;
use tessera_core::ops::pool::{PoolKind, PoolParams};
use tessera_core::ops::reduce::ReduceKind;
use tessera_core::{
    Activation, AttentionLayer, Conv2dLayer, DType, Graph, GraphError, NodeId, Storage,
};

/// A layer's activation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LayerActivation {
    /// None.
    #[default]
    Linear,
    /// ReLU.
    Relu,
    /// Sigmoid.
    Sigmoid,
    /// Tanh.
    Tanh,
    /// Softmax over the last axis.
    Softmax,
}

impl LayerActivation {
    /// Every activation with its file name.
    pub const ALL: [(&'static str, LayerActivation); 5] = [
        ("linear", LayerActivation::Linear),
        ("relu", LayerActivation::Relu),
        ("sigmoid", LayerActivation::Sigmoid),
        ("tanh", LayerActivation::Tanh),
        ("softmax", LayerActivation::Softmax),
    ];

    /// The name model files use.
    pub fn name(self) -> &'static str {
        LayerActivation::ALL
            .iter()
            .find(|(_, a)| *a == self)
            .map_or("linear", |(n, _)| n)
    }

    fn core(self) -> Activation {
        match self {
            LayerActivation::Linear => Activation::Linear,
            LayerActivation::Relu => Activation::Relu,
            LayerActivation::Sigmoid => Activation::Sigmoid,
            LayerActivation::Tanh => Activation::Tanh,
            LayerActivation::Softmax => Activation::Softmax,
        }
    }
}

/// Padding of a convolution or pooling layer (Keras' `padding`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LayerPadding {
    /// No padding.
    #[default]
    Valid,
    /// Output size `ceil(input / stride)`.
    Same,
}

impl LayerPadding {
    fn core(self) -> Padding {
        match self {
            LayerPadding::Valid => Padding::Valid,
            LayerPadding::Same => Padding::Same,
        }
    }
}

/// What a layer does.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum LayerKind {
    /// Keeps the batch axis and flattens the rest.
    Flatten,
    /// A fully-connected layer on the last axis.
    Dense {
        /// Output width.
        units: usize,
        /// Activation.
        activation: LayerActivation,
    },
    /// An `Outfeed` layer: its input, enqueued under its name on a plain outfeed.
    Outfeed,
    /// A `MaybeOutfeed` layer: its input, added to a filtered outfeed's map.
    MaybeOutfeed,
    /// Keras' `Conv2D` (channels last).
    Conv2D {
        /// Output channels.
        filters: usize,
        /// Kernel `[height, width]`.
        kernel_size: [usize; 2],
        /// Strides.
        strides: [u32; 2],
        /// Padding.
        padding: LayerPadding,
        /// Dilation.
        dilation_rate: [u32; 2],
        /// Channel groups.
        groups: u32,
        /// Activation.
        activation: LayerActivation,
        /// Whether there is a bias.
        use_bias: bool,
    },
    /// Keras' `DepthwiseConv2D`.
    DepthwiseConv2D {
        /// Kernel `[height, width]`.
        kernel_size: [usize; 2],
        /// Outputs per input channel.
        depth_multiplier: usize,
        /// Strides.
        strides: [u32; 2],
        /// Padding.
        padding: LayerPadding,
        /// Activation.
        activation: LayerActivation,
    },
    /// Keras' `MaxPooling2D` or `AveragePooling2D`.
    Pooling2D {
        /// Max (else average, padding not counted).
        max: bool,
        /// Window.
        pool_size: [u32; 2],
        /// Strides (the window by default).
        strides: [u32; 2],
        /// Padding.
        padding: LayerPadding,
    },
    /// Keras' `GlobalAveragePooling2D` (mean over height and width).
    GlobalAveragePooling2D,
    /// Keras' `GlobalAveragePooling1D` (mean over the steps of `[batch, steps, features]`).
    GlobalAveragePooling1D,
    /// Keras' `BatchNormalization` over the last axis.
    BatchNormalization {
        /// Weight of the old running average.
        momentum: f32,
        /// Added to the variance.
        epsilon: f32,
    },
    /// Keras' `LayerNormalization` over the last axis.
    LayerNormalization {
        /// Added to the variance.
        epsilon: f32,
    },
    /// Keras' `Embedding`: integer inputs to vectors.
    Embedding {
        /// Vocabulary size.
        input_dim: usize,
        /// Vector size.
        output_dim: usize,
    },
    /// Keras' `Dropout` (training only).
    Dropout {
        /// Probability of dropping an element.
        rate: f32,
        /// The mask stream's seed.
        seed: u32,
    },
    /// Keras' `Add` of two tensors (a residual connection).
    Add,
    /// Keras' `Activation`.
    Activation {
        /// The function.
        activation: LayerActivation,
    },
    /// Keras' `Reshape` (per sample).
    Reshape {
        /// The target shape, without the batch axis.
        target_shape: Vec<usize>,
    },
    /// Keras' `LSTM`.
    Lstm {
        /// Hidden size.
        units: usize,
        /// Every step's output, or only the last.
        return_sequences: bool,
    },
    /// Keras' `MultiHeadAttention` (self-attention, or attending to a second input).
    MultiHeadAttention {
        /// Heads.
        num_heads: usize,
        /// Query and key size per head.
        key_dim: usize,
        /// Value size per head (`key_dim` by default).
        value_dim: Option<usize>,
        /// Dropout on the attention probabilities in training.
        dropout: f32,
    },
}

impl LayerKind {
    /// The Keras class name.
    pub fn type_name(&self) -> &'static str {
        match self {
            LayerKind::Flatten => "Flatten",
            LayerKind::Dense { .. } => "Dense",
            LayerKind::Outfeed => "Outfeed",
            LayerKind::MaybeOutfeed => "MaybeOutfeed",
            LayerKind::Conv2D { .. } => "Conv2D",
            LayerKind::DepthwiseConv2D { .. } => "DepthwiseConv2D",
            LayerKind::Pooling2D { max: true, .. } => "MaxPooling2D",
            LayerKind::Pooling2D { .. } => "AveragePooling2D",
            LayerKind::GlobalAveragePooling2D => "GlobalAveragePooling2D",
            LayerKind::GlobalAveragePooling1D => "GlobalAveragePooling1D",
            LayerKind::BatchNormalization { .. } => "BatchNormalization",
            LayerKind::LayerNormalization { .. } => "LayerNormalization",
            LayerKind::Embedding { .. } => "Embedding",
            LayerKind::Dropout { .. } => "Dropout",
            LayerKind::Add => "Add",
            LayerKind::Activation { .. } => "Activation",
            LayerKind::Reshape { .. } => "Reshape",
            LayerKind::Lstm { .. } => "LSTM",
            LayerKind::MultiHeadAttention { .. } => "MultiHeadAttention",
        }
    }

    /// The layer's `type` in model files.
    pub fn file_name(&self) -> &'static str {
        match self {
            LayerKind::Flatten => "flatten",
            LayerKind::Dense { .. } => "dense",
            LayerKind::Outfeed => "outfeed",
            LayerKind::MaybeOutfeed => "maybe_outfeed",
            LayerKind::Conv2D { .. } => "conv2d",
            LayerKind::DepthwiseConv2D { .. } => "depthwise_conv2d",
            LayerKind::Pooling2D { max: true, .. } => "max_pooling2d",
            LayerKind::Pooling2D { .. } => "average_pooling2d",
            LayerKind::GlobalAveragePooling2D => "global_average_pooling2d",
            LayerKind::GlobalAveragePooling1D => "global_average_pooling1d",
            LayerKind::BatchNormalization { .. } => "batch_normalization",
            LayerKind::LayerNormalization { .. } => "layer_normalization",
            LayerKind::Embedding { .. } => "embedding",
            LayerKind::Dropout { .. } => "dropout",
            LayerKind::Add => "add",
            LayerKind::Activation { .. } => "activation",
            LayerKind::Reshape { .. } => "reshape",
            LayerKind::Lstm { .. } => "lstm",
            LayerKind::MultiHeadAttention { .. } => "multi_head_attention",
        }
    }

    /// How many inputs the layer takes: (at least, at most).
    pub fn inputs(&self) -> (usize, usize) {
        match self {
            LayerKind::Add => (2, 2),
            LayerKind::MultiHeadAttention { .. } => (1, 2),
            _ => (1, 1),
        }
    }
}

/// A layer before it joins a model.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    /// Its name (unique in the model; variable names derive from it).
    pub name: String,
    /// What it does.
    pub kind: LayerKind,
}

impl Layer {
    /// A Flatten layer.
    pub fn flatten(name: &str) -> Self {
        Layer {
            name: name.to_string(),
            kind: LayerKind::Flatten,
        }
    }

    /// A Dense layer.
    pub fn dense(name: &str, units: usize, activation: LayerActivation) -> Self {
        Layer {
            name: name.to_string(),
            kind: LayerKind::Dense { units, activation },
        }
    }

    /// An Outfeed layer.
    pub fn outfeed(name: &str) -> Self {
        Layer {
            name: name.to_string(),
            kind: LayerKind::Outfeed,
        }
    }

    /// A MaybeOutfeed layer.
    pub fn maybe_outfeed(name: &str) -> Self {
        Layer {
            name: name.to_string(),
            kind: LayerKind::MaybeOutfeed,
        }
    }

    /// A layer of any kind.
    pub fn new(name: &str, kind: LayerKind) -> Self {
        Layer {
            name: name.to_string(),
            kind,
        }
    }
}

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

/// A Keras-like Sequential model builder.
///
/// ```
/// use tessera_host::model::{Layer, LayerActivation, Sequential};
///
/// let mut s = Sequential::new("mlp", "images", &[28, 28]);
/// s.add(Layer::flatten("Flatten"))
///     .add(Layer::dense("Dense_256", 256, LayerActivation::Relu))
///     .add(Layer::dense("Dense_10", 10, LayerActivation::Softmax));
/// s.set_pipeline_stage_assignment(&[0, 0, 1]);
/// let model = s.build().unwrap();
/// assert_eq!(model.stage_count(), 2);
/// ```
#[derive(Clone, Debug)]
pub struct Sequential {
    name: String,
    input_name: String,
    input_shape: Vec<usize>,
    layers: Vec<Layer>,
    stages: Option<Vec<usize>>,
    device_mapping: Option<Vec<usize>>,
}

impl Sequential {
    /// An empty model taking `input_shape` (per sample) under `input_name`.
    pub fn new(name: &str, input_name: &str, input_shape: &[usize]) -> Self {
        Sequential {
            name: name.to_string(),
            input_name: input_name.to_string(),
            input_shape: input_shape.to_vec(),
            layers: Vec::new(),
            stages: None,
            device_mapping: None,
        }
    }

    /// Appends a layer.
    pub fn add(&mut self, layer: Layer) -> &mut Self {
        self.layers.push(layer);
        self
    }

    /// One pipeline stage per layer, as Keras' `set_pipeline_stage_assignment`.
    pub fn set_pipeline_stage_assignment(&mut self, stages: &[usize]) -> &mut Self {
        self.stages = Some(stages.to_vec());
        self
    }

    /// Stage -> IPU.
    pub fn set_device_mapping(&mut self, mapping: &[usize]) -> &mut Self {
        self.device_mapping = Some(mapping.to_vec());
        self
    }

    /// Checks the model.
    ///
    /// # Errors
    ///
    /// [`ModelError`] naming the layer or the assignment at fault.
    pub fn build(&self) -> Result<Model, ModelError> {
        if let Some(s) = &self.stages {
            if s.len() != self.layers.len() {
                return Err(ModelError::Model {
                    model: self.name.clone(),
                    message: format!(
                        "the pipeline stage assignment has {} entries for {} layers",
                        s.len(),
                        self.layers.len()
                    ),
                });
            }
        }
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| ModelLayer {
                layer: l.clone(),
                input: if i == 0 {
                    Source::Input
                } else {
                    Source::Layer(i - 1)
                },
                extra: Vec::new(),
                stage: self.stages.as_ref().map_or(0, |s| s[i]),
            })
            .collect();
        Model::new(
            &self.name,
            &self.name,
            ModelKind::Sequential,
            &self.input_name,
            &self.input_shape,
            layers,
            None,
            self.device_mapping.clone(),
        )
    }
}

/// A handle to a tensor in a [`Functional`] model: its input or a layer's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor(Source);

/// A Keras-like Functional model builder with stage scopes.
///
/// ```
/// use tessera_host::model::{Functional, Layer, LayerActivation};
///
/// let mut f = Functional::new("mlp", "images", &[28, 28]);
/// let x = f.input();
/// f.pipeline_stage(0);
/// let x = f.call(Layer::flatten("Flatten"), x).unwrap();
/// let x = f.call(Layer::dense("Dense_256", 256, LayerActivation::Relu), x).unwrap();
/// f.pipeline_stage(1);
/// let y = f.call(Layer::dense("Dense_10", 10, LayerActivation::Softmax), x).unwrap();
/// let model = f.build(y).unwrap();
/// assert_eq!(model.layers[2].stage, 1);
/// ```
#[derive(Clone, Debug)]
pub struct Functional {
    name: String,
    input_name: String,
    input_shape: Vec<usize>,
    layers: Vec<ModelLayer>,
    stage: usize,
    device_mapping: Option<Vec<usize>>,
}

impl Functional {
    /// An empty model taking `input_shape` (per sample) under `input_name`.
    pub fn new(name: &str, input_name: &str, input_shape: &[usize]) -> Self {
        Functional {
            name: name.to_string(),
            input_name: input_name.to_string(),
            input_shape: input_shape.to_vec(),
            layers: Vec::new(),
            stage: 0,
            device_mapping: None,
        }
    }

    /// The model's input.
    pub fn input(&self) -> Tensor {
        Tensor(Source::Input)
    }

    /// Layers called from now on go to stage `stage` (as `with PipelineStage(stage):`).
    pub fn pipeline_stage(&mut self, stage: usize) -> &mut Self {
        self.stage = stage;
        self
    }

    /// Stage -> IPU.
    pub fn set_device_mapping(&mut self, mapping: &[usize]) -> &mut Self {
        self.device_mapping = Some(mapping.to_vec());
        self
    }

    /// Calls `layer` on `x`.
    ///
    /// # Errors
    ///
    /// [`ModelError::Layer`] if `x` is not a tensor of this model.
    pub fn call(&mut self, layer: Layer, x: Tensor) -> Result<Tensor, ModelError> {
        self.call_on(layer, &[x])
    }

    /// Calls `layer` on several tensors (an `Add`, or attention with a query and a value).
    ///
    /// # Errors
    ///
    /// [`ModelError::Layer`] if a tensor is not of this model or `xs` is empty.
    pub fn call_on(&mut self, layer: Layer, xs: &[Tensor]) -> Result<Tensor, ModelError> {
        let bad = |layer: Layer, message: String| ModelError::Layer {
            model: self.name.clone(),
            index: self.layers.len(),
            name: layer.name,
            message,
        };
        let Some(first) = xs.first() else {
            return Err(bad(layer, "the layer needs an input".into()));
        };
        for x in xs {
            if let Source::Layer(i) = x.0 {
                if i >= self.layers.len() {
                    return Err(bad(
                        layer,
                        format!("its input (layer {i}) is not a layer of this model"),
                    ));
                }
            }
        }
        self.layers.push(ModelLayer {
            layer,
            input: first.0,
            extra: xs[1..].iter().map(|t| t.0).collect(),
            stage: self.stage,
        });
        Ok(Tensor(Source::Layer(self.layers.len() - 1)))
    }

    /// Checks the model with `output` as its output.
    ///
    /// # Errors
    ///
    /// [`ModelError`] naming the layer at fault.
    pub fn build(&self, output: Tensor) -> Result<Model, ModelError> {
        let out = match output.0 {
            Source::Layer(i) => Some(i),
            Source::Input => None,
        };
        Model::new(
            &self.name,
            &self.name,
            ModelKind::Functional,
            &self.input_name,
            &self.input_shape,
            self.layers.clone(),
            out,
            self.device_mapping.clone(),
        )
    }
}

/// What [`Model::build`] added to a graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltModel {
    /// The input node.
    pub input: NodeId,
    /// The output node (the last layer's output).
    pub output: NodeId,
    /// Whether the output is a softmax (probabilities) rather than logits.
    pub softmax_output: bool,
    /// Outfeed layers: (name, tap node, stage).
    pub outfeeds: Vec<(String, NodeId, usize)>,
    /// MaybeOutfeed layers: (name, tap node, stage).
    pub maybe_outfeeds: Vec<(String, NodeId, usize)>,
}

impl Model {
    /// Checks a model; errors name `context` (the model or its file).
    #[allow(clippy::too_many_arguments)]
    fn new(
        context: &str,
        name: &str,
        kind: ModelKind,
        input_name: &str,
        input_shape: &[usize],
        layers: Vec<ModelLayer>,
        output: Option<usize>,
        device_mapping: Option<Vec<usize>>,
    ) -> Result<Model, ModelError> {
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

    /// Adds the model to `g` for micro-batches of `batch` samples in `dtype`: the input node
    /// is named after the model's input. `training` builds batch normalisation with batch
    /// statistics (and running averages as state) and dropout with masks; otherwise the
    /// inference forms. The stage scope is left at the output's stage.
    ///
    /// # Errors
    ///
    /// [`ModelError::Graph`] if the core refuses a node (capacity, names, shapes).
    pub fn build<S: Storage>(
        &self,
        g: &mut Graph<S>,
        batch: usize,
        dtype: DType,
        training: bool,
    ) -> Result<BuiltModel, ModelError> {
        let ge = |source| ModelError::Graph {
            model: self.name.clone(),
            source: Box::new(source),
        };
        let mut dims = vec![batch];
        dims.extend_from_slice(&self.input_shape);
        g.set_stage(self.layers[0].stage).map_err(ge)?;
        let input_dtype = if self.integer_input {
            DType::I32
        } else {
            dtype
        };
        let input = g.input(&self.input_name, &dims, input_dtype).map_err(ge)?;
        let mut outs: Vec<NodeId> = Vec::with_capacity(self.layers.len());
        let mut built = BuiltModel {
            input,
            output: input,
            softmax_output: false,
            outfeeds: Vec::new(),
            maybe_outfeeds: Vec::new(),
        };
        for l in &self.layers {
            g.set_stage(l.stage).map_err(ge)?;
            let source = |s: Source| match s {
                Source::Input => input,
                Source::Layer(j) => outs[j],
            };
            let x = source(l.input);
            let extra: Vec<NodeId> = l.extra.iter().map(|&s| source(s)).collect();
            let y = build_layer(g, &l.layer, x, &extra, batch, dtype, training).map_err(ge)?;
            match l.layer.kind {
                LayerKind::Outfeed => built.outfeeds.push((l.layer.name.clone(), y, l.stage)),
                LayerKind::MaybeOutfeed => {
                    built
                        .maybe_outfeeds
                        .push((l.layer.name.clone(), y, l.stage))
                }
                _ => {}
            }
            outs.push(y);
        }
        let out = &self.layers[self.output];
        g.set_stage(out.stage).map_err(ge)?;
        built.output = outs[self.output];
        built.softmax_output = matches!(
            self.layers[self.output_source()].layer.kind,
            LayerKind::Dense {
                activation: LayerActivation::Softmax,
                ..
            } | LayerKind::Activation {
                activation: LayerActivation::Softmax
            }
        );
        g.mark_output(built.output).map_err(ge)?;
        Ok(built)
    }

    /// Reads and parses the model file at `path`; errors name it as `path` displays.
    ///
    /// # Errors
    ///
    /// [`ModelError::Read`] (with the I/O error as its source) if the file cannot be read as
    /// UTF-8 text, otherwise as [`Model::from_toml`].
    pub fn from_file(path: &Path) -> Result<Model, ModelError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Read {
            file: file.clone(),
            source,
        })?;
        Model::from_toml(&text, &file)
    }

    /// Parses a model file. `file` names it in errors.
    ///
    /// # Errors
    ///
    /// [`ModelError::Parse`] with line and column for TOML errors and unknown keys,
    /// [`ModelError::Layer`] / [`ModelError::Model`] for what the file says.
    pub fn from_toml(text: &str, file: &str) -> Result<Model, ModelError> {
        let parsed: FileModel = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map_or((None, None), |s| {
                let before = text.get(..s.start).unwrap_or(text);
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |p| p + 1) + 1;
                (Some(line), Some(column))
            });
            ModelError::Parse {
                file: file.to_string(),
                line,
                column,
                message: e.message().trim().to_string(),
                source: Box::new(e),
            }
        })?;
        parsed.into_model(file)
    }
}

/// Adds one layer to `g`: `x` is its input, `extra` its further inputs.
// The core's builder errors carry the node's name inline; the caller boxes them.
#[allow(clippy::result_large_err)]
fn build_layer<S: Storage>(
    g: &mut Graph<S>,
    layer: &Layer,
    x: NodeId,
    extra: &[NodeId],
    batch: usize,
    dtype: DType,
    training: bool,
) -> Result<NodeId, GraphError> {
    let name = layer.name.as_str();
    let nhwc = DataLayout::Nhwc;
    match &layer.kind {
        LayerKind::Flatten => g.flatten(name, x),
        LayerKind::Dense { units, activation } => {
            g.dense(name, x, *units, activation.core(), dtype)
        }
        LayerKind::Outfeed | LayerKind::MaybeOutfeed => g.tap(name, x),
        LayerKind::Conv2D {
            filters,
            kernel_size,
            strides,
            padding,
            dilation_rate,
            groups,
            activation,
            use_bias,
        } => {
            let mut c = Conv2dLayer::new(*filters, *kernel_size);
            c.strides = *strides;
            c.padding = padding.core();
            c.dilation = *dilation_rate;
            c.groups = *groups;
            c.activation = activation.core();
            c.use_bias = *use_bias;
            g.conv2d_layer(name, x, c, dtype)
        }
        LayerKind::DepthwiseConv2D {
            kernel_size,
            depth_multiplier,
            strides,
            padding,
            activation,
        } => {
            let mut c = Conv2dLayer::new(*depth_multiplier, *kernel_size);
            c.strides = *strides;
            c.padding = padding.core();
            c.activation = activation.core();
            g.depthwise_conv2d_layer(name, x, c, dtype)
        }
        LayerKind::Pooling2D {
            max,
            pool_size,
            strides,
            padding,
        } => {
            let kind = match max {
                true => PoolKind::Max,
                false => PoolKind::Average {
                    count_include_pad: false,
                },
            };
            let p = PoolParams::new(kind, nhwc, *pool_size, *strides);
            g.pool2d(name, x, p, padding.core())
        }
        LayerKind::GlobalAveragePooling2D => g.global_average_pool(name, x, nhwc, false),
        LayerKind::GlobalAveragePooling1D => g.reduce(name, x, &[1], false, ReduceKind::Mean),
        LayerKind::BatchNormalization { momentum, epsilon } => {
            let rank = g.node(x).shape().rank();
            let bn = BatchNorm {
                axis: rank.saturating_sub(1),
                epsilon: *epsilon,
                momentum: *momentum,
                training,
            };
            g.batch_norm(name, x, bn)
        }
        LayerKind::LayerNormalization { epsilon } => g.layer_norm(name, x, 1, *epsilon),
        LayerKind::Embedding {
            input_dim,
            output_dim,
        } => g.embedding(name, x, *input_dim, *output_dim, dtype),
        LayerKind::Dropout { rate, seed } => g.dropout(name, x, *rate, *seed, training),
        LayerKind::Add => g.add(name, x, extra[0]),
        LayerKind::Activation { activation } => activation_layer(g, name, x, *activation),
        LayerKind::Reshape { target_shape } => {
            let mut dims = vec![batch];
            dims.extend_from_slice(target_shape);
            g.reshape(name, x, &dims)
        }
        LayerKind::Lstm {
            units,
            return_sequences,
        } => g.lstm_layer(name, x, *units, *return_sequences, dtype),
        LayerKind::MultiHeadAttention {
            num_heads,
            key_dim,
            value_dim,
            dropout,
        } => {
            let value = extra.first().copied().unwrap_or(x);
            let a = AttentionLayer {
                num_heads: *num_heads,
                key_dim: *key_dim,
                value_dim: *value_dim,
                dropout: *dropout,
                use_bias: true,
            };
            g.multi_head_attention(name, x, value, a, training, dtype)
        }
    }
}

/// An Activation layer of `activation` named `name` on `x`.
#[allow(clippy::result_large_err)]
fn activation_layer<S: Storage>(
    g: &mut Graph<S>,
    name: &str,
    x: NodeId,
    activation: LayerActivation,
) -> Result<NodeId, GraphError> {
    match activation {
        LayerActivation::Linear => g.tap(name, x),
        LayerActivation::Relu => g.relu(name, x),
        LayerActivation::Sigmoid => g.sigmoid(name, x),
        LayerActivation::Tanh => g.tanh(name, x),
        LayerActivation::Softmax => g.softmax(name, x),
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileInput {
    name: Option<String>,
    shape: Vec<usize>,
    dtype: Option<String>,
}

/// One number or a `[height, width]` pair, as Keras takes sizes.
#[derive(Deserialize, Clone, Copy)]
#[serde(untagged)]
enum Pair {
    One(u32),
    Two([u32; 2]),
}

impl Pair {
    fn get(self) -> [u32; 2] {
        match self {
            Pair::One(v) => [v, v],
            Pair::Two(v) => v,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLayer {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    units: Option<usize>,
    activation: Option<String>,
    input: Option<String>,
    inputs: Option<Vec<String>>,
    filters: Option<usize>,
    kernel_size: Option<Pair>,
    strides: Option<Pair>,
    padding: Option<String>,
    dilation_rate: Option<Pair>,
    groups: Option<u32>,
    use_bias: Option<bool>,
    depth_multiplier: Option<usize>,
    pool_size: Option<Pair>,
    momentum: Option<f32>,
    epsilon: Option<f32>,
    input_dim: Option<usize>,
    output_dim: Option<usize>,
    rate: Option<f32>,
    seed: Option<u32>,
    target_shape: Option<Vec<usize>>,
    return_sequences: Option<bool>,
    num_heads: Option<usize>,
    key_dim: Option<usize>,
    value_dim: Option<usize>,
    dropout: Option<f32>,
}

impl FileLayer {
    /// The fields given, by their file names (all but `type`, `name` and the inputs).
    fn given(&self) -> Vec<&'static str> {
        let fields = [
            ("units", self.units.is_some()),
            ("activation", self.activation.is_some()),
            ("filters", self.filters.is_some()),
            ("kernel_size", self.kernel_size.is_some()),
            ("strides", self.strides.is_some()),
            ("padding", self.padding.is_some()),
            ("dilation_rate", self.dilation_rate.is_some()),
            ("groups", self.groups.is_some()),
            ("use_bias", self.use_bias.is_some()),
            ("depth_multiplier", self.depth_multiplier.is_some()),
            ("pool_size", self.pool_size.is_some()),
            ("momentum", self.momentum.is_some()),
            ("epsilon", self.epsilon.is_some()),
            ("input_dim", self.input_dim.is_some()),
            ("output_dim", self.output_dim.is_some()),
            ("rate", self.rate.is_some()),
            ("seed", self.seed.is_some()),
            ("target_shape", self.target_shape.is_some()),
            ("return_sequences", self.return_sequences.is_some()),
            ("num_heads", self.num_heads.is_some()),
            ("key_dim", self.key_dim.is_some()),
            ("value_dim", self.value_dim.is_some()),
            ("dropout", self.dropout.is_some()),
        ];
        fields.iter().filter(|f| f.1).map(|f| f.0).collect()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileStage {
    layer: Vec<FileLayer>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FilePipeline {
    stage_assignment: Option<Vec<usize>>,
    device_mapping: Option<Vec<usize>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileTraining {
    batch_size: Option<usize>,
    gradient_accumulation_count: Option<usize>,
    learning_rate: Option<f32>,
    optimizer: Option<String>,
    epochs: Option<usize>,
    pipeline_schedule: Option<String>,
    partials_type: Option<String>,
    gradient_accumulation_dtype: Option<String>,
    available_memory_proportion: Option<Proportions>,
    outlining: Option<bool>,
    embedding_serialization: Option<u64>,
}

/// `available_memory_proportion = 0.25` or `= [0.25, 0.28, 0.28, 0.28]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Proportions {
    One(f64),
    PerStage(Vec<f64>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileModel {
    name: Option<String>,
    kind: Option<String>,
    input: FileInput,
    output: Option<String>,
    #[serde(default)]
    layer: Vec<FileLayer>,
    #[serde(default)]
    stage: Vec<FileStage>,
    #[serde(default)]
    pipeline: FilePipeline,
    #[serde(default)]
    training: FileTraining,
}

impl FileModel {
    /// The model the file describes; errors name `file`. The checks run in the order of the
    /// file: the model's kind, how layers are given stages, each layer, the output, and then
    /// the model as a whole.
    fn into_model(self, file: &str) -> Result<Model, ModelError> {
        let model_err = |message: String| ModelError::Model {
            model: file.to_string(),
            message,
        };
        let kind = file_model_kind(self.kind.as_deref()).map_err(model_err)?;
        let name = self.name.unwrap_or_else(|| file.to_string());
        let input_name = self.input.name.unwrap_or_else(|| "images".to_string());
        let integer_input = match self.input.dtype.as_deref() {
            None | Some("float") => false,
            Some("int32") => true,
            Some(t) => {
                return Err(model_err(format!(
                "unknown input dtype `{t}`; use `float` (the model's type) or `int32` (token ids)"
            )))
            }
        };
        let staged = staged_layers(
            self.layer,
            self.stage,
            self.pipeline.stage_assignment.as_deref(),
        )
        .map_err(model_err)?;
        let (layers, names) = file_layers(file, kind, &input_name, staged)?;
        let output = match self.output.as_deref() {
            None => None,
            Some(o) => Some(*names.get(o).ok_or_else(|| {
                model_err(format!("the output `{o}` is not a layer of the model"))
            })?),
        };
        let mut model = Model::new(
            file,
            &name,
            kind,
            &input_name,
            &self.input.shape,
            layers,
            output,
            self.pipeline.device_mapping,
        )?;
        model.training = self.training.into();
        model.integer_input = integer_input;
        Ok(model)
    }
}

impl From<FileTraining> for TrainingDefaults {
    fn from(t: FileTraining) -> Self {
        use serde_json::Value;
        let mut options = serde_json::Map::new();
        let mut set = |name: &str, v: Option<Value>| {
            if let Some(v) = v {
                options.insert(name.to_string(), v);
            }
        };
        // Every name the options take is lower-case: a name in any case reads as it.
        let name = |s: Option<String>| s.map(|s| Value::from(s.to_lowercase()));
        set("batch_size", t.batch_size.map(Value::from));
        set(
            "gradient_accumulation_count",
            t.gradient_accumulation_count.map(Value::from),
        );
        set("learning_rate", t.learning_rate.map(Value::from));
        set("optimizer", name(t.optimizer));
        set("pipeline_schedule", name(t.pipeline_schedule));
        set("partials_type", name(t.partials_type));
        set(
            "gradient_accumulation_dtype",
            name(t.gradient_accumulation_dtype),
        );
        set(
            "available_memory_proportion",
            t.available_memory_proportion.map(|p| match p {
                Proportions::One(p) => Value::from(p),
                Proportions::PerStage(v) => Value::from(v),
            }),
        );
        set("no_outlining", t.outlining.map(|on| Value::Bool(!on)));
        set(
            "embedding_serialization",
            t.embedding_serialization.map(Value::from),
        );
        TrainingDefaults {
            options,
            epochs: t.epochs,
        }
    }
}

/// The file's `kind`: `sequential` (the default) or `functional`.
fn file_model_kind(kind: Option<&str>) -> Result<ModelKind, String> {
    match kind {
        None | Some("sequential") => Ok(ModelKind::Sequential),
        Some("functional") => Ok(ModelKind::Functional),
        Some(k) => Err(format!(
            "unknown model kind `{k}`; use `sequential` or `functional`"
        )),
    }
}

/// The file's layers in order, each with the stage its `[[stage]]` scope or the
/// `[pipeline] stage_assignment` gives it (`None`: stage 0).
fn staged_layers(
    layers: Vec<FileLayer>,
    stages: Vec<FileStage>,
    assignment: Option<&[usize]>,
) -> Result<Vec<(FileLayer, Option<usize>)>, String> {
    let mut staged: Vec<(FileLayer, Option<usize>)> = match (layers.is_empty(), stages.is_empty()) {
        (false, false) => {
            return Err(
                "give the layers either as [[layer]] or inside [[stage]] scopes, not both".into(),
            )
        }
        (true, true) => return Err("the model has no layers".into()),
        (false, true) => layers.into_iter().map(|l| (l, None)).collect(),
        (true, false) => {
            if assignment.is_some() {
                return Err(
                    "[pipeline] stage_assignment and [[stage]] scopes both assign stages; keep one"
                        .into(),
                );
            }
            stages
                .into_iter()
                .enumerate()
                .flat_map(|(s, st)| st.layer.into_iter().map(move |l| (l, Some(s))))
                .collect()
        }
    };
    if let Some(a) = assignment {
        if a.len() != staged.len() {
            return Err(format!(
                "[pipeline] stage_assignment has {} entries for {} layers",
                a.len(),
                staged.len()
            ));
        }
        for (l, s) in staged.iter_mut().zip(a) {
            l.1 = Some(*s);
        }
    }
    Ok(staged)
}

/// The model's layers from the file's, in order, with every layer's input resolved; also the
/// index of each layer by name. Errors name `file` and the layer.
fn file_layers(
    file: &str,
    kind: ModelKind,
    input_name: &str,
    staged: Vec<(FileLayer, Option<usize>)>,
) -> Result<(Vec<ModelLayer>, BTreeMap<String, usize>), ModelError> {
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    let mut layers = Vec::with_capacity(staged.len());
    for (i, (fl, stage)) in staged.into_iter().enumerate() {
        let bad = |message: String| ModelError::Layer {
            model: file.to_string(),
            index: i,
            name: fl.name.clone().unwrap_or_default(),
            message,
        };
        let Some(name) = fl.name.clone() else {
            return Err(bad("the layer has no `name`".into()));
        };
        let layer_kind = file_layer_kind(&fl).map_err(bad)?;
        let (input, extra) = match (&fl.input, &fl.inputs) {
            (Some(_), Some(_)) => return Err(bad("give `input` or `inputs`, not both".into())),
            (_, Some(list)) if kind == ModelKind::Functional => {
                let mut sources = list
                    .iter()
                    .map(|n| file_layer_input(kind, input_name, i, Some(n), &names))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(bad)?;
                if sources.is_empty() {
                    return Err(bad("`inputs` is empty".into()));
                }
                let first = sources.remove(0);
                (first, sources)
            }
            (_, Some(_)) => {
                return Err(bad(
                    "`inputs` is for functional models; a sequential layer takes the previous layer's output".into(),
                ))
            }
            (input, None) => (
                file_layer_input(kind, input_name, i, input.as_deref(), &names).map_err(bad)?,
                Vec::new(),
            ),
        };
        names.insert(name.clone(), i);
        layers.push(ModelLayer {
            layer: Layer {
                name,
                kind: layer_kind,
            },
            input,
            extra,
            stage: stage.unwrap_or(0),
        });
    }
    Ok((layers, names))
}

/// The fields each layer type takes (besides `type`, `name`, `input` / `inputs`).
const LAYER_FIELDS: [(&str, &[&str]); 19] = [
    ("flatten", &[]),
    ("dense", &["units", "activation"]),
    ("outfeed", &[]),
    ("maybe_outfeed", &[]),
    (
        "conv2d",
        &[
            "filters",
            "kernel_size",
            "strides",
            "padding",
            "dilation_rate",
            "groups",
            "activation",
            "use_bias",
        ],
    ),
    (
        "depthwise_conv2d",
        &[
            "kernel_size",
            "depth_multiplier",
            "strides",
            "padding",
            "activation",
        ],
    ),
    ("max_pooling2d", &["pool_size", "strides", "padding"]),
    ("average_pooling2d", &["pool_size", "strides", "padding"]),
    ("global_average_pooling2d", &[]),
    ("global_average_pooling1d", &[]),
    ("batch_normalization", &["momentum", "epsilon"]),
    ("layer_normalization", &["epsilon"]),
    ("embedding", &["input_dim", "output_dim"]),
    ("dropout", &["rate", "seed"]),
    ("add", &[]),
    ("activation", &["activation"]),
    ("reshape", &["target_shape"]),
    ("lstm", &["units", "return_sequences"]),
    (
        "multi_head_attention",
        &["num_heads", "key_dim", "value_dim", "dropout"],
    ),
];

/// A layer table's `type` with its fields, checked: each type takes only its own fields, and
/// required ones must be there (Keras' defaults fill the rest).
fn file_layer_kind(fl: &FileLayer) -> Result<LayerKind, String> {
    let Some((_, allowed)) = LAYER_FIELDS.iter().find(|(t, _)| *t == fl.kind) else {
        let types: Vec<&str> = LAYER_FIELDS.iter().map(|(t, _)| *t).collect();
        return Err(format!(
            "unknown layer type `{}`; use one of {}",
            fl.kind,
            types.join(", ")
        ));
    };
    if let Some(f) = fl.given().into_iter().find(|f| !allowed.contains(f)) {
        return Err(format!("`{f}` is not a field of {} layers", fl.kind));
    }
    let need = |v: Option<usize>, field: &str| {
        v.filter(|&v| v > 0)
            .ok_or_else(|| format!("a {} layer needs a positive `{field}`", fl.kind))
    };
    let activation = match fl.activation.as_deref() {
        None => LayerActivation::Linear,
        Some(a) => file_activation(a)?,
    };
    let padding = match fl.padding.as_deref() {
        None | Some("valid") => LayerPadding::Valid,
        Some("same") => LayerPadding::Same,
        Some(p) => return Err(format!("unknown padding `{p}`; use `valid` or `same`")),
    };
    let kernel = |fl: &FileLayer| -> Result<[usize; 2], String> {
        let k = fl
            .kernel_size
            .ok_or_else(|| format!("a {} layer needs `kernel_size`", fl.kind))?
            .get();
        Ok([k[0] as usize, k[1] as usize])
    };
    let unit = |p: Option<Pair>| p.map_or([1, 1], Pair::get);
    let rate = |r: f32, field: &str| {
        if (0.0..1.0).contains(&r) {
            Ok(r)
        } else {
            Err(format!("`{field}` must be in [0, 1)"))
        }
    };
    Ok(match fl.kind.as_str() {
        "flatten" => LayerKind::Flatten,
        "outfeed" => LayerKind::Outfeed,
        "maybe_outfeed" => LayerKind::MaybeOutfeed,
        "dense" => LayerKind::Dense {
            units: need(fl.units, "units")?,
            activation,
        },
        "conv2d" => LayerKind::Conv2D {
            filters: need(fl.filters, "filters")?,
            kernel_size: kernel(fl)?,
            strides: unit(fl.strides),
            padding,
            dilation_rate: unit(fl.dilation_rate),
            groups: fl.groups.unwrap_or(1),
            activation,
            use_bias: fl.use_bias.unwrap_or(true),
        },
        "depthwise_conv2d" => LayerKind::DepthwiseConv2D {
            kernel_size: kernel(fl)?,
            depth_multiplier: fl.depth_multiplier.unwrap_or(1),
            strides: unit(fl.strides),
            padding,
            activation,
        },
        "max_pooling2d" | "average_pooling2d" => {
            let pool = fl.pool_size.map_or([2, 2], Pair::get);
            LayerKind::Pooling2D {
                max: fl.kind == "max_pooling2d",
                pool_size: pool,
                strides: fl.strides.map_or(pool, Pair::get),
                padding,
            }
        }
        "global_average_pooling2d" => LayerKind::GlobalAveragePooling2D,
        "global_average_pooling1d" => LayerKind::GlobalAveragePooling1D,
        "batch_normalization" => LayerKind::BatchNormalization {
            momentum: rate(fl.momentum.unwrap_or(0.99), "momentum")?,
            epsilon: fl.epsilon.unwrap_or(1e-3),
        },
        "layer_normalization" => LayerKind::LayerNormalization {
            epsilon: fl.epsilon.unwrap_or(1e-3),
        },
        "embedding" => LayerKind::Embedding {
            input_dim: need(fl.input_dim, "input_dim")?,
            output_dim: need(fl.output_dim, "output_dim")?,
        },
        "dropout" => LayerKind::Dropout {
            rate: rate(fl.rate.ok_or("a dropout layer needs `rate`")?, "rate")?,
            seed: fl.seed.unwrap_or(0),
        },
        "add" => LayerKind::Add,
        "activation" => LayerKind::Activation { activation },
        "reshape" => LayerKind::Reshape {
            target_shape: fl
                .target_shape
                .clone()
                .filter(|t| !t.is_empty() && !t.contains(&0))
                .ok_or("a reshape layer needs a `target_shape` of positive sizes")?,
        },
        "lstm" => LayerKind::Lstm {
            units: need(fl.units, "units")?,
            return_sequences: fl.return_sequences.unwrap_or(false),
        },
        _ => LayerKind::MultiHeadAttention {
            num_heads: need(fl.num_heads, "num_heads")?,
            key_dim: need(fl.key_dim, "key_dim")?,
            value_dim: fl.value_dim,
            dropout: rate(fl.dropout.unwrap_or(0.0), "dropout")?,
        },
    })
}

/// An activation by its file name.
fn file_activation(name: &str) -> Result<LayerActivation, String> {
    LayerActivation::ALL
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, a)| *a)
        .ok_or_else(|| {
            format!("unknown activation `{name}`; use one of linear, relu, sigmoid, tanh, softmax")
        })
}

/// Where layer `index` takes its input from: the previous layer (or the model's input for the
/// first layer) unless a functional model's layer names its `input`, which must be the model's
/// input or an earlier layer (`names`).
fn file_layer_input(
    kind: ModelKind,
    input_name: &str,
    index: usize,
    input: Option<&str>,
    names: &BTreeMap<String, usize>,
) -> Result<Source, String> {
    match (kind == ModelKind::Functional, input) {
        (false, Some(_)) => Err(
            "`input` is for functional models; a sequential layer takes the previous layer's output"
                .into(),
        ),
        (_, None) if index == 0 => Ok(Source::Input),
        (_, None) => Ok(Source::Layer(index - 1)),
        (true, Some(n)) if n == input_name => Ok(Source::Input),
        (true, Some(n)) => names.get(n).map(|&j| Source::Layer(j)).ok_or_else(|| {
            format!("its input `{n}` is neither the model's input nor an earlier layer")
        }),
    }
}

/// The model files shipped with Tessera: (name, file text).
pub const SHIPPED: [(&str, &str); 7] = [
    (
        "pipelined_sequential",
        include_str!("../../examples/models/pipelined_sequential.toml"),
    ),
    (
        "pipelined_model",
        include_str!("../../examples/models/pipelined_model.toml"),
    ),
    (
        "sequential",
        include_str!("../../examples/models/sequential.toml"),
    ),
    ("model", include_str!("../../examples/models/model.toml")),
    (
        "mnist_cnn",
        include_str!("../../examples/models/mnist_cnn.toml"),
    ),
    (
        "residual_cnn",
        include_str!("../../examples/models/residual_cnn.toml"),
    ),
    (
        "transformer_encoder",
        include_str!("../../examples/models/transformer_encoder.toml"),
    ),
];

/// The default model: the pipelined Sequential one.
pub const DEFAULT_MODEL: &str = "pipelined_sequential";

/// A shipped model by name.
pub fn shipped(name: &str) -> Option<Result<Model, ModelError>> {
    SHIPPED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(n, text)| Model::from_toml(text, &format!("examples/models/{n}.toml")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::Fixed;

    #[test]
    fn training_fields_carry_outlining_and_embedding_serialization() {
        let (_, plain) = SHIPPED.iter().find(|(n, _)| *n == "sequential").unwrap();
        // The shipped file ends in its [training] table.
        let text = format!("{plain}\noutlining = false\nembedding_serialization = 4\n");
        let m = Model::from_toml(&text, "m.toml").unwrap();
        assert_eq!(m.training.get("no_outlining"), Some(&true.into()));
        assert_eq!(m.training.get("embedding_serialization"), Some(&4.into()));
        let m = Model::from_toml(plain, "m.toml").unwrap();
        assert_eq!(m.training.get("no_outlining"), None);
        assert_eq!(m.training.get("embedding_serialization"), None);
    }

    #[test]
    fn shipped_models_parse_and_have_the_seeds_layers() {
        for (name, _) in SHIPPED {
            let m = shipped(name).unwrap().unwrap();
            assert_eq!(m.output_units(), Some(10), "{name}");
            let pipelined = name.starts_with("pipelined")
                || name == "mnist_cnn"
                || name == "transformer_encoder";
            assert_eq!(m.is_pipelined(), pipelined, "{name}");
        }
        for name in [
            "pipelined_sequential",
            "pipelined_model",
            "sequential",
            "model",
        ] {
            let m = shipped(name).unwrap().unwrap();
            assert!(m.layers.iter().any(|l| l.layer.name == "Dense_128"));
        }
    }

    #[test]
    fn the_new_layer_models_build_for_training_and_inference() {
        for name in ["mnist_cnn", "residual_cnn", "transformer_encoder"] {
            let m = shipped(name).unwrap().unwrap();
            for training in [true, false] {
                let mut g: Graph<tessera_sim::Heap> = Graph::new();
                let b = m.build(&mut g, 4, DType::F32, training).unwrap();
                assert_eq!(g.node(b.output).shape().dims(), &[4, 10], "{name}");
                assert!(b.softmax_output, "{name}");
            }
        }
        let cnn = shipped("mnist_cnn").unwrap().unwrap();
        assert_eq!(cnn.layers[0].layer.kind.type_name(), "Conv2D");
        let res = shipped("residual_cnn").unwrap().unwrap();
        let add = res
            .layers
            .iter()
            .find(|l| l.layer.name == "Block1_add")
            .unwrap();
        assert_eq!(add.extra.len(), 1);
    }

    #[test]
    fn new_layer_fields_are_checked() {
        let head = "name = \"m\"\ninput = { shape = [4, 4, 1] }\n";
        let err = |body: &str| {
            Model::from_toml(&format!("{head}{body}"), "m.toml")
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err("[[layer]]\ntype = \"dense\"\nname = \"d\"\nunits = 3\nfilters = 2\n"),
            "m.toml: layer 0 (`d`): `filters` is not a field of dense layers"
        );
        assert_eq!(
            err("[[layer]]\ntype = \"conv2d\"\nname = \"c\"\nfilters = 2\n"),
            "m.toml: layer 0 (`c`): a conv2d layer needs `kernel_size`"
        );
        assert_eq!(
            err("[[layer]]\ntype = \"conv2d\"\nname = \"c\"\nfilters = 2\nkernel_size = 3\npadding = \"full\"\n"),
            "m.toml: layer 0 (`c`): unknown padding `full`; use `valid` or `same`"
        );
        assert_eq!(
            err("[[layer]]\ntype = \"add\"\nname = \"a\"\n"),
            "m.toml: layer 0 (`a`): Add takes 2 input(s), this layer has 1; list them as `inputs = [...]`"
        );
        assert_eq!(
            err("[[layer]]\ntype = \"dropout\"\nname = \"d\"\nrate = 1.5\n"),
            "m.toml: layer 0 (`d`): `rate` must be in [0, 1)"
        );
        // A kernel larger than the image is the core's error, naming the layer's node.
        let m = Model::from_toml(
            &format!(
                "{head}[[layer]]\ntype = \"conv2d\"\nname = \"c\"\nfilters = 2\nkernel_size = 5\n"
            ),
            "m.toml",
        )
        .unwrap();
        let mut g: Graph<tessera_sim::Heap> = Graph::new();
        let e = m.build(&mut g, 2, DType::F32, true).unwrap_err();
        assert_eq!(e.to_string(), "m: the graph cannot be built");
        let cause = std::error::Error::source(&e).map(ToString::to_string);
        assert!(
            cause
                .as_deref()
                .is_some_and(|c| c.starts_with("`c/Conv2D` (Conv): the kernel")),
            "{cause:?}"
        );
    }

    #[test]
    fn sequential_and_functional_give_the_same_model() {
        let seq = shipped("pipelined_sequential").unwrap().unwrap();
        let fun = shipped("pipelined_model").unwrap().unwrap();
        assert_eq!(seq.layers, fun.layers);
        let mut s = Sequential::new("pipelined_sequential", "images", &[28, 28]);
        s.add(Layer::flatten("Flatten"))
            .add(Layer::dense("Dense_256", 256, LayerActivation::Relu))
            .add(Layer::dense("Dense_128", 128, LayerActivation::Relu))
            .add(Layer::maybe_outfeed("Dense_128_acts"))
            .add(Layer::dense("Dense_10", 10, LayerActivation::Softmax))
            .add(Layer::maybe_outfeed("Dense_10_acts"))
            .set_pipeline_stage_assignment(&[0, 0, 1, 1, 1, 1]);
        assert_eq!(s.build().unwrap().layers, seq.layers);
    }

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
    fn file_errors_name_the_place() {
        let e = Model::from_toml("input = { shape = [4] }\nbogus = 1\n", "m.toml").unwrap_err();
        let s = e.to_string();
        assert!(s.starts_with("m.toml:2:1"), "{s}");
        assert!(s.contains("bogus"), "{s}");
        let e = Model::from_toml(
            "input = { shape = [4] }\n[[layer]]\ntype = \"dense\"\nname = \"D\"\nunits = 0\n",
            "m.toml",
        )
        .unwrap_err();
        assert!(e.to_string().contains("layer 0 (`D`)"), "{e}");
        let e = Model::from_toml(
            "input = { shape = [4] }\n[[layer]]\ntype = \"conv\"\nname = \"C\"\n",
            "m.toml",
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown layer type `conv`"), "{e}");
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
    fn from_file_reads_what_from_toml_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/models/model.toml");
        let m = Model::from_file(&path).unwrap();
        assert_eq!(m.layers, shipped("model").unwrap().unwrap().layers);
        let e = Model::from_toml("input = { shape = [4] }\n", "m.toml").unwrap_err();
        assert_eq!(e.to_string(), "m.toml: the model has no layers");
        let e = Model::from_toml(
            "input = { shape = [4] }\n[[layer]]\ntype = \"flatten\"\n",
            "m.toml",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "m.toml: layer 0: the layer has no `name`");
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

    #[test]
    fn builds_a_graph_with_taps() {
        let m = shipped("pipelined_sequential").unwrap().unwrap();
        let mut g: Box<Graph<Fixed<64>>> = Box::new(Graph::new());
        let b = m.build(&mut g, 8, DType::F32, true).unwrap();
        assert!(b.softmax_output);
        assert_eq!(b.maybe_outfeeds.len(), 2);
        assert_eq!(g.stage_count(), 2);
        assert_eq!(g.node(b.output).shape().dims(), &[8, 10]);
    }
}
