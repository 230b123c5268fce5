//! Ready-made graphs of the models the examples and firmware share, so that every party builds
//! the same nodes in the same order (and so the same state layout).

use crate::{Activation, DType, Graph, GraphError, NodeId, Storage};

/// The nodes of the MNIST classifier a caller needs.
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
