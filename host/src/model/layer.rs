//! Layers: what each does and its Keras-like constructors.

use tessera_core::ops::conv::Padding;
use tessera_core::Activation;

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

    pub(super) fn core(self) -> Activation {
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
    pub(super) fn core(self) -> Padding {
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
