//! Keras-like builders: [`Sequential`] and [`Functional`].

use super::{Layer, Model, ModelError, ModelKind, ModelLayer, ModelParts, Source};

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
            ModelParts {
                name: &self.name,
                kind: ModelKind::Sequential,
                input_name: &self.input_name,
                input_shape: &self.input_shape,
                layers,
                output: None,
                device_mapping: self.device_mapping.clone(),
            },
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
            ModelParts {
                name: &self.name,
                kind: ModelKind::Functional,
                input_name: &self.input_name,
                input_shape: &self.input_shape,
                layers: self.layers.clone(),
                output: out,
                device_mapping: self.device_mapping.clone(),
            },
        )
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{shipped, LayerActivation};

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
}
