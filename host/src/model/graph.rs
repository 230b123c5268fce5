//! A model added to a core graph.

use tessera_core::ops::conv::DataLayout;
use tessera_core::ops::norm::BatchNorm;
use tessera_core::ops::pool::{PoolKind, PoolParams};
use tessera_core::ops::reduce::ReduceKind;
use tessera_core::{AttentionLayer, Conv2dLayer, DType, Graph, GraphError, NodeId, Storage};

use super::{Layer, LayerActivation, LayerKind, Model, ModelError, Source};

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
        let settings = Settings {
            batch,
            dtype,
            training,
        };
        for l in &self.layers {
            g.set_stage(l.stage).map_err(ge)?;
            let source = |s: Source| match s {
                Source::Input => input,
                Source::Layer(j) => outs[j],
            };
            let x = source(l.input);
            let extra: Vec<NodeId> = l.extra.iter().map(|&s| source(s)).collect();
            let y = build_layer(g, &l.layer, x, &extra, settings).map_err(ge)?;
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
}

/// What every layer of a model is built for: micro-batches of `batch` samples in `dtype`,
/// for training or for inference.
#[derive(Clone, Copy)]
struct Settings {
    batch: usize,
    dtype: DType,
    training: bool,
}

/// Adds one layer to `g`: `x` is its input, `extra` its further inputs.
// The core's builder errors carry the node's name inline; the caller boxes them.
#[allow(clippy::result_large_err)]
fn build_layer<S: Storage>(
    g: &mut Graph<S>,
    layer: &Layer,
    x: NodeId,
    extra: &[NodeId],
    settings: Settings,
) -> Result<NodeId, GraphError> {
    let Settings {
        batch,
        dtype,
        training,
    } = settings;
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::shipped;
    use tessera_core::Fixed;

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
