//! Ready-made graphs of the models the examples and firmware share, so that every party builds
//! the same nodes in the same order (and so the same state layout).

use crate::{Activation, DType, Graph, GraphError, NodeId, Storage};

/// The nodes of an MNIST classifier a caller needs (the MLP's or the CNN's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MnistMlp {
    /// Images, (batch, 28, 28), values in [0, 1].
    pub images: NodeId,
    /// Logits, (batch, 10): the output of `Dense_10` before its softmax.
    pub logits: NodeId,
    /// Class probabilities, (batch, 10).
    pub probabilities: NodeId,
}

/// The MNIST classifier of the examples: Flatten -> Dense 256 relu -> Dense 128 relu ->
/// Dense 10 softmax, in `dtype`, for `batch` images. Logits and probabilities are outputs.
pub fn mnist_mlp<S: Storage>(
    g: &mut Graph<S>,
    batch: usize,
    dtype: DType,
) -> Result<MnistMlp, GraphError> {
    mnist_mlp_pipelined(g, batch, dtype, [0; 4])
}

/// [`mnist_mlp`] with its four layers (Flatten, Dense_256, Dense_128, Dense_10 with its
/// softmax) in the given pipeline stages, as `set_pipeline_stage_assignment([0, 0, 1, 1])`
/// does in Keras. The stage scope is left at the last layer's stage, so a loss added next
/// joins it.
pub fn mnist_mlp_pipelined<S: Storage>(
    g: &mut Graph<S>,
    batch: usize,
    dtype: DType,
    stages: [usize; 4],
) -> Result<MnistMlp, GraphError> {
    g.set_stage(stages[0])?;
    let images = g.input("images", &[batch, 28, 28], dtype)?;
    let flat = g.flatten("Flatten", images)?;
    g.set_stage(stages[1])?;
    let h = g.dense("Dense_256", flat, 256, Activation::Relu, dtype)?;
    g.set_stage(stages[2])?;
    let h = g.dense("Dense_128", h, 128, Activation::Relu, dtype)?;
    g.set_stage(stages[3])?;
    let logits = g.dense("Dense_10", h, 10, Activation::Linear, dtype)?;
    let probabilities = g.softmax("Dense_10/Softmax", logits)?;
    g.mark_output(logits)?;
    g.mark_output(probabilities)?;
    Ok(MnistMlp {
        images,
        logits,
        probabilities,
    })
}

/// The MNIST convolutional network of `examples/models/mnist_cnn.toml`, with the same layer
/// names (so checkpoints move between them): Conv2D 32 3x3 relu -> MaxPool 2 -> Conv2D 64 3x3
/// relu -> MaxPool 2 -> Flatten -> Dense 128 relu -> Dense 10 (softmax), channels last, for
/// `batch` images of 28 x 28 x 1. Logits and probabilities are outputs; the image input is
/// named `images`.
pub fn mnist_cnn<S: Storage>(
    g: &mut Graph<S>,
    batch: usize,
    dtype: DType,
) -> Result<MnistMlp, GraphError> {
    use crate::ops::conv::{DataLayout, Padding};
    use crate::ops::pool::{PoolKind, PoolParams};
    use crate::Conv2dLayer;
    let images = g.input("images", &[batch, 28, 28, 1], dtype)?;
    let conv = |filters| {
        let mut c = Conv2dLayer::new(filters, [3, 3]);
        c.activation = Activation::Relu;
        c
    };
    let pool = PoolParams::new(PoolKind::Max, DataLayout::Nhwc, [2, 2], [2, 2]);
    let x = g.conv2d_layer("Conv2D_32", images, conv(32), dtype)?;
    let x = g.pool2d("MaxPool_1", x, pool, Padding::Valid)?;
    let x = g.conv2d_layer("Conv2D_64", x, conv(64), dtype)?;
    let x = g.pool2d("MaxPool_2", x, pool, Padding::Valid)?;
    let x = g.flatten("Flatten", x)?;
    let x = g.dense("Dense_128", x, 128, Activation::Relu, dtype)?;
    let logits = g.dense("Dense_10", x, 10, Activation::Linear, dtype)?;
    let probabilities = g.softmax("Dense_10/Softmax", logits)?;
    g.mark_output(logits)?;
    g.mark_output(probabilities)?;
    Ok(MnistMlp {
        images,
        logits,
        probabilities,
    })
}

/// A BERT-style encoder trained as a masked language model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bert {
    /// Encoder layers (24 for BERT-Large).
    pub layers: usize,
    /// Hidden size (1024).
    pub hidden: usize,
    /// Attention heads (16).
    pub heads: usize,
    /// Feed-forward width (4096).
    pub intermediate: usize,
    /// Tokens per sequence (128).
    pub sequence: usize,
    /// Sequences per micro-batch.
    pub batch: usize,
    /// Vocabulary (30522).
    pub vocabulary: usize,
    /// Pipeline stages the layers are spread over evenly (embeddings in the first, the
    /// language-model head in the last).
    pub stages: usize,
}

impl Bert {
    /// BERT-Large: 24 layers, hidden 1024, 16 heads, 4096 feed-forward, vocabulary 30522.
    pub const fn large(sequence: usize, batch: usize, stages: usize) -> Self {
        Bert {
            layers: 24,
            hidden: 1024,
            heads: 16,
            intermediate: 4096,
            sequence,
            batch,
            vocabulary: 30522,
            stages,
        }
    }
}

/// The nodes of a [`bert`] graph a caller needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BertNodes {
    /// Token ids, `[batch, sequence]` (i32).
    pub input_ids: NodeId,
    /// Masked-token labels, `[batch, sequence]` (i32; -100 where not masked).
    pub labels: NodeId,
    /// The mean cross-entropy over the masked positions.
    pub loss: NodeId,
}

/// A BERT encoder with a masked-language-model head (the forward pass and its loss; the
/// caller differentiates it): token and position embeddings, post-norm encoder layers
/// (multi-head self-attention, GELU feed-forward, residual connections and layer
/// normalisation), a vocabulary projection and the cross-entropy ignoring label -100.
pub fn bert<S: Storage>(g: &mut Graph<S>, c: &Bert, dtype: DType) -> Result<BertNodes, GraphError> {
    use crate::ops::elementwise::{GeluForm, UnaryFn};
    use crate::{AttentionLayer, Init};
    let stage_of = |layer: usize| layer * c.stages.max(1) / c.layers.max(1);
    g.set_stage(0)?;
    let input_ids = g.input("input_ids", &[c.batch, c.sequence], DType::I32)?;
    let labels = g.input("labels", &[c.batch, c.sequence], DType::I32)?;
    let tokens = g.embedding("embeddings/word", input_ids, c.vocabulary, c.hidden, dtype)?;
    let position = g.variable(
        "embeddings/position:0",
        &[c.sequence, c.hidden],
        dtype,
        Init::Uniform {
            low: -0.02,
            high: 0.02,
        },
    )?;
    let x = g.add("embeddings/sum", tokens, position)?;
    let mut x = g.layer_norm("embeddings/LayerNorm", x, 1, 1e-12)?;
    let mut name = heapless::String::<48>::new();
    let mut n = |l: usize, what: &str| -> Result<heapless::String<48>, GraphError> {
        use core::fmt::Write;
        name.clear();
        write!(name, "layer_{l}/{what}").map_err(|_| GraphError::BadName {
            name: crate::error::name_lossy(what),
        })?;
        Ok(name.clone())
    };
    let attention = AttentionLayer {
        num_heads: c.heads,
        key_dim: c.hidden / c.heads.max(1),
        value_dim: None,
        dropout: 0.0,
        use_bias: true,
    };
    for l in 0..c.layers {
        g.set_stage(stage_of(l))?;
        let a = g.multi_head_attention(&n(l, "attention")?, x, x, attention, true, dtype)?;
        let a = g.add(&n(l, "attention_residual")?, a, x)?;
        let a = g.layer_norm(&n(l, "attention_norm")?, a, 1, 1e-12)?;
        let h = g.dense(
            &n(l, "intermediate")?,
            a,
            c.intermediate,
            Activation::Linear,
            dtype,
        )?;
        let h = g.unary(&n(l, "gelu")?, h, UnaryFn::Gelu(GeluForm::Erf))?;
        let o = g.dense(&n(l, "output")?, h, c.hidden, Activation::Linear, dtype)?;
        let o = g.add(&n(l, "output_residual")?, o, a)?;
        x = g.layer_norm(&n(l, "output_norm")?, o, 1, 1e-12)?;
    }
    g.set_stage(c.stages.max(1) - 1)?;
    let logits = g.dense("mlm/logits", x, c.vocabulary, Activation::Linear, dtype)?;
    let loss =
        g.sparse_categorical_crossentropy_ignoring("loss", logits, labels, true, Some(-100))?;
    Ok(BertNodes {
        input_ids,
        labels,
        loss,
    })
}
