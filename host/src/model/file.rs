//! The model file format (TOML) and its parsing.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::{
    Layer, LayerActivation, LayerKind, LayerPadding, Model, ModelError, ModelKind, ModelLayer,
    ModelParts, Source, TrainingDefaults,
};

impl Model {
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
            ModelParts {
                name: &name,
                kind,
                input_name: &input_name,
                input_shape: &self.input.shape,
                layers,
                output,
                device_mapping: self.pipeline.device_mapping,
            },
        )?;
        if let Some(r) = self.training.learning_rate {
            if !(r.is_finite() && r > 0.0) {
                return Err(model_err(format!(
                    "[training] learning_rate = {r} is not a positive number"
                )));
            }
        }
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{shipped, SHIPPED};
    use tessera_core::{DType, Graph};

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
    fn a_learning_rate_that_is_not_a_positive_number_is_refused_naming_the_file() {
        let (_, plain) = SHIPPED.iter().find(|(n, _)| *n == "sequential").unwrap();
        for bad in ["nan", "inf", "-0.5", "0.0"] {
            let text = plain.replace("learning_rate = 0.1", &format!("learning_rate = {bad}"));
            assert_ne!(&text, plain, "the shipped file sets a rate of 0.1");
            let err = Model::from_toml(&text, "m.toml").unwrap_err().to_string();
            assert!(err.starts_with("m.toml"), "{err}");
            assert!(
                err.contains("learning_rate") && err.contains("not a positive number"),
                "{err}"
            );
        }
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
}
