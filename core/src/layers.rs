//! Keras-like layers built from the op families: each adds its variables and ops under the
//! layer's name, as Keras names them (`name/kernel:0`, `name/MatMul`, ...).

use crate::error::{derived, name_lossy, GraphError};
use crate::graph::{Graph, Init, NodeId, NodeRef};
use crate::storage::Storage;
use crate::DType;

/// The activation of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Activation {
    /// None (linear).
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

/// Layers.
impl<S: Storage> Graph<S> {
    /// Applies `activation` to `x` as a node named `name/<Activation>` (or returns `x`).
    pub fn activation(
        &mut self,
        name: &str,
        x: NodeId,
        activation: Activation,
    ) -> Result<NodeId, GraphError> {
        match activation {
            Activation::Linear => Ok(x),
            Activation::Relu => self.relu(&derived(name, format_args!("/Relu"))?, x),
            Activation::Sigmoid => self.sigmoid(&derived(name, format_args!("/Sigmoid"))?, x),
            Activation::Tanh => self.tanh(&derived(name, format_args!("/Tanh"))?, x),
            Activation::Softmax => self.softmax(&derived(name, format_args!("/Softmax"))?, x),
        }
    }

    /// A Keras-style dense layer named `name`: variables `name/kernel:0` (Glorot uniform) and
    /// `name/bias:0` (zeros), then `name/MatMul`, `name/BiasAdd` and the activation
    /// (`name/Relu`, ...). Returns the layer's output. `x` must be rank 2.
    pub fn dense(
        &mut self,
        name: &str,
        x: impl NodeRef,
        units: usize,
        activation: Activation,
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let s = self.node(x).shape();
        if s.rank() != 2 {
            let kernel_shape = crate::ops::shape_for(name, &[s.last(), units.max(1)])?;
            return Err(GraphError::ShapeMismatch {
                node: name_lossy(name),
                op: "Dense",
                rule: "input must be rank 2 (batch, features)",
                left: s,
                right: kernel_shape,
            });
        }
        let sub = |suffix: &str| derived(name, format_args!("{suffix}"));
        let kernel = self.variable(
            &sub("/kernel:0")?,
            &[s.dim(1), units],
            dtype,
            Init::GlorotUniform,
        )?;
        let bias = self.variable(&sub("/bias:0")?, &[units], dtype, Init::Zeros)?;
        let mm = self.matmul(&sub("/MatMul")?, x, kernel)?;
        let out = self.bias_add(&sub("/BiasAdd")?, mm, bias)?;
        self.activation(name, out, activation)
    }
}
