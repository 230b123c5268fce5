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
    /// (`name/Relu`, ...). Returns the layer's output. As in Keras, the layer acts on the last
    /// axis of an input of rank 2 or more.
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
        if s.rank() < 2 {
            let kernel_shape = crate::ops::shape_for(name, &[s.last(), units.max(1)])?;
            return Err(GraphError::ShapeMismatch {
                node: name_lossy(name),
                op: "Dense",
                rule: "input must be at least rank 2 (batch, ..., features)",
                left: s,
                right: kernel_shape,
            });
        }
        let sub = |suffix: &str| derived(name, format_args!("{suffix}"));
        let kernel = self.variable(
            &sub("/kernel:0")?,
            &[s.last(), units],
            dtype,
            Init::GlorotUniform,
        )?;
        let bias = self.variable(&sub("/bias:0")?, &[units], dtype, Init::Zeros)?;
        let mm = self.matmul(&sub("/MatMul")?, x, kernel)?;
        let out = self.bias_add(&sub("/BiasAdd")?, mm, bias)?;
        self.activation(name, out, activation)
    }
}

/// The outputs of an LSTM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LstmOutputs {
    /// Every step's hidden state.
    pub sequence: NodeId,
    /// The last hidden state.
    pub hidden: NodeId,
    /// The last cell state.
    pub cell: NodeId,
}

/// The initial states of an LSTM, each optional: a state not given starts at zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LstmStates {
    /// The initial hidden state.
    pub hidden: Option<NodeId>,
    /// The initial cell state.
    pub cell: Option<NodeId>,
}

/// Gate positions within the `4 * hidden` gate axis: input, forget, cell, output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Gates {
    i: usize,
    f: usize,
    c: usize,
    o: usize,
}

/// How a framework lays out an LSTM's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LstmLayout {
    /// The gates' order along the `4 * hidden` axis.
    gates: Gates,
    /// Whether the recurrent weights are stored `[4 * hidden, hidden]` (else `[hidden, 4 *
    /// hidden]`).
    rec_transposed: bool,
}

/// ONNX's layout: gates in the order input, output, forget, cell; `R` stored `[4 * hidden,
/// hidden]`.
const ONNX_LSTM: LstmLayout = LstmLayout {
    gates: Gates {
        i: 0,
        o: 1,
        f: 2,
        c: 3,
    },
    rec_transposed: true,
};

/// Keras' layout: gates in the order input, forget, cell, output; the recurrent kernel stored
/// `[units, 4 * units]`.
const KERAS_LSTM: LstmLayout = LstmLayout {
    gates: Gates {
        i: 0,
        f: 1,
        c: 2,
        o: 3,
    },
    rec_transposed: false,
};

/// The sizes of an unrolled LSTM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LstmSizes {
    /// Steps of the sequence.
    steps: usize,
    /// Sequences side by side.
    batch: usize,
    /// Elements of each hidden (and cell) state.
    hidden: usize,
}

/// The shared part of an ONNX recurrent layer: its sizes, the input projection of every step
/// and the recurrent weights' view, and its bias (checked).
struct OnnxProjection {
    sizes: LstmSizes,
    xw: NodeId,
    rv: NodeId,
    b: Option<NodeId>,
}

/// How an ONNX `GRU` starts and applies its reset gate ([`Graph::gru_onnx`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GruSettings {
    /// The initial hidden state `[1, batch, hidden]`; none starts at zero.
    pub initial: Option<NodeId>,
    /// The reset gate multiplies the recurrent product and its bias (`r * (h R_h + Rb_h)`,
    /// PyTorch's GRU), rather than the state before it (`(r * h) R_h + Rb_h`, ONNX's default).
    pub linear_before_reset: bool,
}

/// A GRU's weights each step reads ([`Graph::gru_onnx`]).
struct GruParts {
    /// The z and r rows of `R`, `[2 * hidden, hidden]`.
    rzr: NodeId,
    /// The h rows of `R`, `[hidden, hidden]`.
    rh: NodeId,
    /// The recurrent biases of z and r, and of h.
    rb: Option<(NodeId, NodeId)>,
    /// The scalar 1 (for `1 - z`).
    one: NodeId,
    /// See [`GruSettings::linear_before_reset`].
    linear_before_reset: bool,
}

/// Convolution layer settings (Keras' `Conv2D` arguments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Conv2dLayer {
    /// Output channels.
    pub filters: usize,
    /// `[height, width]` of the kernel.
    pub kernel: [usize; 2],
    /// `[vertical, horizontal]` stride.
    pub strides: [u32; 2],
    /// `valid`, `same` or explicit.
    pub padding: crate::ops::conv::Padding,
    /// `[vertical, horizontal]` dilation.
    pub dilation: [u32; 2],
    /// Channel groups.
    pub groups: u32,
    /// Activation after the bias.
    pub activation: Activation,
    /// Whether there is a bias.
    pub use_bias: bool,
    /// Data layout (Keras' `channels_last` is NHWC).
    pub layout: crate::ops::conv::DataLayout,
}

impl Conv2dLayer {
    /// `filters` outputs of a `kernel` window, stride 1, `valid`, no dilation, one group,
    /// linear, with a bias, channels last.
    pub const fn new(filters: usize, kernel: [usize; 2]) -> Self {
        Conv2dLayer {
            filters,
            kernel,
            strides: [1, 1],
            padding: crate::ops::conv::Padding::Valid,
            dilation: [1, 1],
            groups: 1,
            activation: Activation::Linear,
            use_bias: true,
            layout: crate::ops::conv::DataLayout::Nhwc,
        }
    }
}

/// Multi-head attention settings (Keras' `MultiHeadAttention` arguments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionLayer {
    /// Heads.
    pub num_heads: usize,
    /// Size of each head's queries and keys.
    pub key_dim: usize,
    /// Size of each head's values (`key_dim` when `None`).
    pub value_dim: Option<usize>,
    /// Dropout on the attention probabilities in training (0 for none).
    pub dropout: f32,
    /// Whether there are biases.
    pub use_bias: bool,
}

/// Composite layers.
impl<S: Storage> Graph<S> {
    /// A Keras `Conv2D` (or grouped/depthwise) layer: `name/kernel:0` (Glorot uniform, in the
    /// layout's weight order), `name/bias:0`, the convolution `name/Conv2D`, `name/BiasAdd`
    /// and the activation.
    pub fn conv2d_layer(
        &mut self,
        name: &str,
        x: impl NodeRef,
        layer: Conv2dLayer,
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        use crate::ops::conv::{ConvParams, DataLayout};
        let x = x.resolve(self)?;
        let s = self.node(x).shape();
        if s.rank() != 4 {
            return Err(GraphError::BadAttribute {
                node: name_lossy(name),
                op: "Conv2D",
                rule: "input must be rank 4 (batch, height, width, channels)",
            });
        }
        let c = s.dim(layer.layout.channel_axis());
        let g = layer.groups.max(1) as usize;
        let [kh, kw] = layer.kernel;
        let dims = match layer.layout {
            DataLayout::Nhwc => [kh, kw, c / g.max(1), layer.filters],
            DataLayout::Nchw => [layer.filters, c / g.max(1), kh, kw],
        };
        let sub = |suffix: &str| derived(name, format_args!("{suffix}"));
        let kernel = self.variable(&sub("/kernel:0")?, &dims, dtype, Init::GlorotUniform)?;
        let p = ConvParams::new(layer.layout)
            .stride(layer.strides[0], layer.strides[1])
            .dilation(layer.dilation[0], layer.dilation[1])
            .groups(layer.groups);
        let mut y = self.conv2d(&sub("/Conv2D")?, x, kernel, p, layer.padding)?;
        if layer.use_bias {
            let bias = self.variable(&sub("/bias:0")?, &[layer.filters], dtype, Init::Zeros)?;
            let b = match layer.layout {
                DataLayout::Nhwc => bias,
                DataLayout::Nchw => {
                    self.reshape(&sub("/bias_view")?, bias, &[layer.filters, 1, 1])?
                }
            };
            y = self.add(&sub("/BiasAdd")?, y, b)?;
        }
        self.activation(name, y, layer.activation)
    }

    /// A Keras `DepthwiseConv2D` layer: one filter per input channel, times the depth
    /// multiplier (given as `layer.filters`); `name/depthwise_kernel:0` of `[kh, kw, channels,
    /// multiplier]`. The layer's groups are the channels; its layout must be NHWC.
    pub fn depthwise_conv2d_layer(
        &mut self,
        name: &str,
        x: impl NodeRef,
        layer: Conv2dLayer,
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        use crate::ops::conv::{ConvParams, DataLayout};
        let x = x.resolve(self)?;
        let s = self.node(x).shape();
        let multiplier = layer.filters;
        if s.rank() != 4 || multiplier == 0 || layer.layout != DataLayout::Nhwc {
            return Err(GraphError::BadAttribute {
                node: name_lossy(name),
                op: "DepthwiseConv2D",
                rule: "input must be rank 4 (batch, height, width, channels) and the multiplier at least 1",
            });
        }
        let c = s.dim(3);
        let [kh, kw] = layer.kernel;
        let sub = |suffix: &str| derived(name, format_args!("{suffix}"));
        let k = self.variable(
            &sub("/depthwise_kernel:0")?,
            &[kh, kw, c, multiplier],
            dtype,
            Init::GlorotUniform,
        )?;
        let kv = self.reshape(&sub("/kernel_view")?, k, &[kh, kw, 1, c * multiplier])?;
        let p = ConvParams::new(DataLayout::Nhwc)
            .stride(layer.strides[0], layer.strides[1])
            .dilation(layer.dilation[0], layer.dilation[1])
            .groups(c as u32);
        let mut y = self.conv2d(&sub("/depthwise")?, x, kv, p, layer.padding)?;
        if layer.use_bias {
            let bias = self.variable(&sub("/bias:0")?, &[c * multiplier], dtype, Init::Zeros)?;
            y = self.add(&sub("/BiasAdd")?, y, bias)?;
        }
        self.activation(name, y, layer.activation)
    }

    /// The LSTM steps over a sequence whose input projections `xw` (`[steps * batch, 4 *
    /// hidden]`, biases included) are computed: each step adds `h . rec` (`rec` laid out as
    /// `layout` says), applies the gates and updates the states, starting from `initial`.
    /// Returns every step's hidden state stacked on a new first axis (`[steps, batch,
    /// hidden]`) and the last states.
    fn lstm_steps(
        &mut self,
        name: &str,
        xw: NodeId,
        rec: NodeId,
        layout: LstmLayout,
        sizes: LstmSizes,
        initial: LstmStates,
    ) -> Result<LstmOutputs, GraphError> {
        let LstmSizes {
            steps,
            batch,
            hidden,
        } = sizes;
        let LstmLayout {
            gates,
            rec_transposed,
        } = layout;
        let (mut h, mut c) = (initial.hidden, initial.cell);
        let mut seq: Option<NodeId> = None;
        for t in 0..steps {
            let sub = |what: &str| derived(name, format_args!("/step{t}/{what}"));
            let mut z = self.slice(&sub("input")?, xw, 0, t * batch, batch)?;
            if let Some(h) = h {
                let r = self.matmul_t(&sub("recurrent")?, h, rec, false, rec_transposed)?;
                z = self.add(&sub("gates")?, z, r)?;
            }
            let gate =
                |g: &mut Self, what: &str, k: usize| g.slice(&sub(what)?, z, 1, k * hidden, hidden);
            let gi = gate(self, "i", gates.i)?;
            let gf = gate(self, "f", gates.f)?;
            let gc = gate(self, "c", gates.c)?;
            let go = gate(self, "o", gates.o)?;
            let i = self.sigmoid(&sub("input_gate")?, gi)?;
            let f = self.sigmoid(&sub("forget_gate")?, gf)?;
            let cc = self.tanh(&sub("candidate")?, gc)?;
            let o = self.sigmoid(&sub("output_gate")?, go)?;
            let ic = self.mul(&sub("input_candidate")?, i, cc)?;
            let cn = match c {
                Some(c) => {
                    let fc = self.mul(&sub("forget_cell")?, f, c)?;
                    self.add(&sub("cell")?, fc, ic)?
                }
                None => ic,
            };
            let tc = self.tanh(&sub("cell_tanh")?, cn)?;
            let hn = self.mul(&sub("hidden")?, o, tc)?;
            let row = self.reshape(&sub("hidden_row")?, hn, &[1, batch, hidden])?;
            seq = Some(match seq {
                None => row,
                Some(s) => self.concat_axis(&sub("sequence")?, s, row, 0)?,
            });
            (h, c) = (Some(hn), Some(cn));
        }
        match (seq, h, c) {
            (Some(sequence), Some(hidden), Some(cell)) => Ok(LstmOutputs {
                sequence,
                hidden,
                cell,
            }),
            _ => Err(GraphError::BadAttribute {
                node: name_lossy(name),
                op: "LSTM",
                rule: "the sequence must have at least one step",
            }),
        }
    }

    /// An ONNX `LSTM` (one direction, default activations): `x` `[seq, batch, input]`, `w`
    /// `[1, 4 * hidden, input]`, `r` `[1, 4 * hidden, hidden]`, optional `b` `[1, 8 * hidden]`
    /// and `initial` states `[1, batch, hidden]`, gates in ONNX's order (i, o, f, c); unrolled
    /// over the sequence. `sequence` is `Y` (`[seq, 1, batch, hidden]`), `hidden` and `cell`
    /// are `Y_h` and `Y_c` (`[1, batch, hidden]`).
    pub fn lstm_onnx(
        &mut self,
        name: &str,
        x: impl NodeRef,
        w: impl NodeRef,
        r: impl NodeRef,
        b: Option<NodeId>,
        initial: LstmStates,
    ) -> Result<LstmOutputs, GraphError> {
        let (x, w, r) = (x.resolve(self)?, w.resolve(self)?, r.resolve(self)?);
        let OnnxProjection {
            sizes,
            mut xw,
            rv,
            b,
        } = self.onnx_projection(name, "LSTM", 4, [x, w, r], b)?;
        let (steps, batch, hidden) = (sizes.steps, sizes.batch, sizes.hidden);
        let sub = |suffix: &str| derived(name, format_args!("{suffix}"));
        if let Some(b) = b {
            let bw = self.slice(&sub("/bias_w")?, b, 1, 0, 4 * hidden)?;
            let br = self.slice(&sub("/bias_r")?, b, 1, 4 * hidden, 4 * hidden)?;
            let bias = self.add(&sub("/bias")?, bw, br)?;
            xw = self.add(&sub("/x_projection_bias")?, xw, bias)?;
        }
        let state =
            |g: &mut Self, s: Option<NodeId>, what: &str| -> Result<Option<NodeId>, GraphError> {
                s.map(|s| {
                    g.reshape(
                        &derived(name, format_args!("/{what}"))?,
                        s,
                        &[batch, hidden],
                    )
                })
                .transpose()
            };
        let initial = LstmStates {
            hidden: state(self, initial.hidden, "initial_h_view")?,
            cell: state(self, initial.cell, "initial_c_view")?,
        };
        let out = self.lstm_steps(name, xw, rv, ONNX_LSTM, sizes, initial)?;
        Ok(LstmOutputs {
            sequence: self.reshape(&sub("/Y")?, out.sequence, &[steps, 1, batch, hidden])?,
            hidden: self.reshape(&sub("/Y_h")?, out.hidden, &[1, batch, hidden])?,
            cell: self.reshape(&sub("/Y_c")?, out.cell, &[1, batch, hidden])?,
        })
    }

    /// The checks and the input projection an ONNX recurrent layer `op` of `gates` gates
    /// shares: `x` `[seq, batch, input]`, `w` `[1, gates * hidden, input]`, `r` `[1, gates *
    /// hidden, hidden]`, optional `b` `[1, 2 * gates * hidden]` (checked, returned as it is):
    /// the sizes, `x W^T` for every step's rows, and `R` viewed as `[gates * hidden, hidden]`.
    fn onnx_projection(
        &mut self,
        name: &str,
        op: &'static str,
        gates: usize,
        [x, w, r]: [NodeId; 3],
        b: Option<NodeId>,
    ) -> Result<OnnxProjection, GraphError> {
        let (sx, sw, sr) = (
            self.node(x).shape(),
            self.node(w).shape(),
            self.node(r).shape(),
        );
        let bad = |rule| GraphError::ShapeMismatch {
            node: name_lossy(name),
            op,
            rule,
            left: sx,
            right: sw,
        };
        if sx.rank() != 3
            || sw.rank() != 3
            || sw.dim(0) != 1
            || sw.dim(1) % gates != 0
            || sw.dim(2) != sx.dim(2)
        {
            return Err(bad(
                "x must be [seq, batch, input] and W [1, gates * hidden, input] (one direction)",
            ));
        }
        let (steps, batch, input, hidden) = (sx.dim(0), sx.dim(1), sx.dim(2), sw.dim(1) / gates);
        let g = gates as u32;
        if sr.dims() != [1, g * hidden as u32, hidden as u32] {
            return Err(bad("R must be [1, gates * hidden, hidden]"));
        }
        if b.is_some_and(|b| self.node(b).shape().dims() != [1, 2 * g * hidden as u32]) {
            return Err(bad("B must be [1, 2 * gates * hidden]"));
        }
        let sub = |suffix: &str| derived(name, format_args!("{suffix}"));
        let xf = self.reshape(&sub("/x_rows")?, x, &[steps * batch, input])?;
        let wv = self.reshape(&sub("/w_view")?, w, &[gates * hidden, input])?;
        let rv = self.reshape(&sub("/r_view")?, r, &[gates * hidden, hidden])?;
        let xw = self.matmul_t(&sub("/x_projection")?, xf, wv, false, true)?;
        Ok(OnnxProjection {
            sizes: LstmSizes {
                steps,
                batch,
                hidden,
            },
            xw,
            rv,
            b,
        })
    }

    /// An ONNX `GRU` (one direction, default activations: sigmoid gates, tanh candidate):
    /// `x` `[seq, batch, input]`, `w` `[1, 3 * hidden, input]`, `r` `[1, 3 * hidden, hidden]`,
    /// optional `b` `[1, 6 * hidden]` (input then recurrent biases), gates in ONNX's order
    /// (z, r, h), and `settings` (the initial hidden state `[1, batch, hidden]`, how the reset
    /// gate applies). Unrolled over the sequence: the outputs' `sequence` is `Y` (`[seq, 1,
    /// batch, hidden]`), `hidden` is `Y_h` (`[1, batch, hidden]`) and `cell` is `Y_h` too (a
    /// GRU has no cell).
    pub fn gru_onnx(
        &mut self,
        name: &str,
        x: impl NodeRef,
        w: impl NodeRef,
        r: impl NodeRef,
        b: Option<NodeId>,
        settings: GruSettings,
    ) -> Result<LstmOutputs, GraphError> {
        let (x, w, r) = (x.resolve(self)?, w.resolve(self)?, r.resolve(self)?);
        let OnnxProjection {
            sizes,
            mut xw,
            rv,
            b,
        } = self.onnx_projection(name, "GRU", 3, [x, w, r], b)?;
        let (steps, batch, hidden) = (sizes.steps, sizes.batch, sizes.hidden);
        if steps == 0 {
            return Err(GraphError::BadAttribute {
                node: name_lossy(name),
                op: "GRU",
                rule: "the sequence must have at least one step",
            });
        }
        let sub = |suffix: &str| derived(name, format_args!("{suffix}"));
        // The recurrent biases: of z and r (added with the products), and of h.
        let mut rb = None;
        if let Some(b) = b {
            let bw = self.slice(&sub("/bias_w")?, b, 1, 0, 3 * hidden)?;
            xw = self.add(&sub("/x_projection_bias")?, xw, bw)?;
            let bzr = self.slice(&sub("/bias_r_zr")?, b, 1, 3 * hidden, 2 * hidden)?;
            let bh = self.slice(&sub("/bias_r_h")?, b, 1, 5 * hidden, hidden)?;
            rb = Some((bzr, bh));
        }
        let dtype = self.node(xw).dtype();
        let parts = GruParts {
            rzr: self.slice(&sub("/r_zr")?, rv, 0, 0, 2 * hidden)?,
            rh: self.slice(&sub("/r_h")?, rv, 0, 2 * hidden, hidden)?,
            rb,
            one: self.constant(&sub("/one")?, &[], dtype, 1.0)?,
            linear_before_reset: settings.linear_before_reset,
        };
        let mut h = match settings.initial {
            Some(s) => Some(self.reshape(&sub("/initial_h_view")?, s, &[batch, hidden])?),
            None => None,
        };
        let mut seq: Option<NodeId> = None;
        for t in 0..steps {
            let hn = self.gru_step(name, t, xw, h, sizes, &parts)?;
            let sub = |what: &str| derived(name, format_args!("/step{t}/{what}"));
            let row = self.reshape(&sub("hidden_row")?, hn, &[1, batch, hidden])?;
            seq = Some(match seq {
                None => row,
                Some(s) => self.concat_axis(&sub("sequence")?, s, row, 0)?,
            });
            h = Some(hn);
        }
        let (Some(seq), Some(h)) = (seq, h) else {
            unreachable!("the sequence has a step (checked above)")
        };
        let last = self.reshape(&sub("/Y_h")?, h, &[1, batch, hidden])?;
        Ok(LstmOutputs {
            sequence: self.reshape(&sub("/Y")?, seq, &[steps, 1, batch, hidden])?,
            hidden: last,
            cell: last,
        })
    }

    /// Step `t` of a GRU ([`Graph::gru_onnx`]): the new hidden state `[batch, hidden]` from
    /// the step's rows of `xw` and the state `h` (none: zero).
    fn gru_step(
        &mut self,
        name: &str,
        t: usize,
        xw: NodeId,
        h: Option<NodeId>,
        LstmSizes { batch, hidden, .. }: LstmSizes,
        p: &GruParts,
    ) -> Result<NodeId, GraphError> {
        let sub = |what: &str| derived(name, format_args!("/step{t}/{what}"));
        let xt = self.slice(&sub("input")?, xw, 0, t * batch, batch)?;
        let mut zr = self.slice(&sub("input_zr")?, xt, 1, 0, 2 * hidden)?;
        let mut pre = self.slice(&sub("input_h")?, xt, 1, 2 * hidden, hidden)?;
        if let Some(h) = h {
            let hzr = self.matmul_t(&sub("recurrent_zr")?, h, p.rzr, false, true)?;
            zr = self.add(&sub("gates_zr")?, zr, hzr)?;
        }
        if let Some((bzr, _)) = p.rb {
            zr = self.add(&sub("gates_zr_bias")?, zr, bzr)?;
        }
        let zg = self.slice(&sub("z")?, zr, 1, 0, hidden)?;
        let rg = self.slice(&sub("r")?, zr, 1, hidden, hidden)?;
        let z = self.sigmoid(&sub("update_gate")?, zg)?;
        let rr = self.sigmoid(&sub("reset_gate")?, rg)?;
        // The recurrent part of the candidate: none with no state and no bias.
        let rec = match (h, p.linear_before_reset) {
            (Some(h), false) => {
                let reset = self.mul(&sub("reset_state")?, rr, h)?;
                Some(self.matmul_t(&sub("recurrent_h")?, reset, p.rh, false, true)?)
            }
            (Some(h), true) => Some(self.matmul_t(&sub("recurrent_h")?, h, p.rh, false, true)?),
            (None, _) => None,
        };
        let rec = match (rec, p.rb.map(|(_, bh)| bh)) {
            (Some(a), Some(bh)) => Some(self.add(&sub("recurrent_h_bias")?, a, bh)?),
            (a, bh) => a.or(bh),
        };
        if let Some(rec) = rec {
            // Before the reset, the reset gate multiplies the product and its bias.
            let rec = if p.linear_before_reset {
                self.mul(&sub("reset_recurrent")?, rr, rec)?
            } else {
                rec
            };
            pre = self.add(&sub("candidate_input")?, pre, rec)?;
        }
        let cand = self.tanh(&sub("candidate")?, pre)?;
        let keep = self.sub(&sub("one_minus_z")?, p.one, z)?;
        let hn = self.mul(&sub("new_part")?, keep, cand)?;
        match h {
            Some(h) => {
                let old = self.mul(&sub("old_part")?, z, h)?;
                self.add(&sub("hidden")?, hn, old)
            }
            None => Ok(hn),
        }
    }

    /// A Keras `LSTM` layer on `x` `[batch, steps, features]`: `name/kernel:0` `[features,
    /// 4 * units]`, `name/recurrent_kernel:0` `[units, 4 * units]`, `name/bias:0` (the forget
    /// gate's part 1), gates in Keras' order (i, f, c, o). Returns `[batch, steps, units]` with
    /// `return_sequences`, else the last hidden state `[batch, units]`.
    pub fn lstm_layer(
        &mut self,
        name: &str,
        x: impl NodeRef,
        units: usize,
        return_sequences: bool,
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let sx = self.node(x).shape();
        if sx.rank() != 3 || units == 0 {
            return Err(GraphError::BadAttribute {
                node: name_lossy(name),
                op: "LSTM",
                rule: "input must be rank 3 (batch, steps, features) and units at least 1",
            });
        }
        let (batch, steps, features) = (sx.dim(0), sx.dim(1), sx.dim(2));
        let sub = |suffix: &str| derived(name, format_args!("{suffix}"));
        let kernel = self.variable(
            &sub("/kernel:0")?,
            &[features, 4 * units],
            dtype,
            Init::GlorotUniform,
        )?;
        let rec = self.variable(
            &sub("/recurrent_kernel:0")?,
            &[units, 4 * units],
            dtype,
            Init::GlorotUniform,
        )?;
        let bias = self.variable(&sub("/bias:0")?, &[4 * units], dtype, Init::Zeros)?;
        let time_major = self.transpose(&sub("/time_major")?, x, &[1, 0, 2])?;
        let rows = self.reshape(&sub("/x_rows")?, time_major, &[steps * batch, features])?;
        let xw = self.matmul(&sub("/x_projection")?, rows, kernel)?;
        let xw = self.add(&sub("/x_projection_bias")?, xw, bias)?;
        let sizes = LstmSizes {
            steps,
            batch,
            hidden: units,
        };
        let out = self.lstm_steps(name, xw, rec, KERAS_LSTM, sizes, LstmStates::default())?;
        if return_sequences {
            self.transpose(name, out.sequence, &[1, 0, 2])
        } else {
            self.reshape(name, out.hidden, &[batch, units])
        }
    }

    /// A Keras `MultiHeadAttention` layer, `query` `[batch, target, features]` attending to
    /// `value` (also the key) `[batch, source, features]`: per-head projections
    /// (`name/query/kernel:0` `[features, heads, key_dim]`, ...), scaled dot products, softmax
    /// over the source, and the output projection (`name/attention_output/kernel:0`) back to
    /// `features`.
    pub fn multi_head_attention(
        &mut self,
        name: &str,
        query: impl NodeRef,
        value: impl NodeRef,
        layer: AttentionLayer,
        training: bool,
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        let (q_in, v_in) = (query.resolve(self)?, value.resolve(self)?);
        let (sq, sv) = (self.node(q_in).shape(), self.node(v_in).shape());
        if sq.rank() != 3
            || sv.rank() != 3
            || sq.dim(0) != sv.dim(0)
            || sq.dim(2) != sv.dim(2)
            || layer.num_heads == 0
            || layer.key_dim == 0
        {
            return Err(GraphError::ShapeMismatch {
                node: name_lossy(name),
                op: "MultiHeadAttention",
                rule: "query and value must be [batch, length, features] with the same batch and features",
                left: sq,
                right: sv,
            });
        }
        let (batch, target, source, features) = (sq.dim(0), sq.dim(1), sv.dim(1), sq.dim(2));
        let (heads, kd) = (layer.num_heads, layer.key_dim);
        let vd = layer.value_dim.unwrap_or(kd);
        let sub = |suffix: &str| derived(name, format_args!("{suffix}"));
        // [b, len, features] . [features, heads * dim] (+ bias) -> [b, heads, len, dim].
        let project = |g: &mut Self,
                       what: &str,
                       x: NodeId,
                       len: usize,
                       dim: usize|
         -> Result<NodeId, GraphError> {
            let k = g.variable(
                &derived(name, format_args!("{what}/kernel:0"))?,
                &[features, heads, dim],
                dtype,
                Init::GlorotUniform,
            )?;
            let kv = g.reshape(
                &derived(name, format_args!("{what}/kernel_view"))?,
                k,
                &[features, heads * dim],
            )?;
            let mut y = g.matmul(&derived(name, format_args!("{what}/MatMul"))?, x, kv)?;
            if layer.use_bias {
                let b = g.variable(
                    &derived(name, format_args!("{what}/bias:0"))?,
                    &[heads, dim],
                    dtype,
                    Init::Zeros,
                )?;
                let bv = g.reshape(
                    &derived(name, format_args!("{what}/bias_view"))?,
                    b,
                    &[heads * dim],
                )?;
                y = g.add(&derived(name, format_args!("{what}/BiasAdd"))?, y, bv)?;
            }
            let split = g.reshape(
                &derived(name, format_args!("{what}/heads"))?,
                y,
                &[batch, len, heads, dim],
            )?;
            g.transpose(
                &derived(name, format_args!("{what}/transpose"))?,
                split,
                &[0, 2, 1, 3],
            )
        };
        let q = project(self, "/query", q_in, target, kd)?;
        let k = project(self, "/key", v_in, source, kd)?;
        let v = project(self, "/value", v_in, source, vd)?;
        let qs = self.scale(&sub("/scaled_query")?, q, 1.0 / libm::sqrtf(kd as f32))?;
        let scores = self.matmul_t(&sub("/scores")?, qs, k, false, true)?;
        let probs = self.softmax(&sub("/softmax")?, scores)?;
        let probs = self.dropout(
            &sub("/attention_dropout")?,
            probs,
            layer.dropout,
            0,
            training,
        )?;
        let ctx = self.matmul(&sub("/context")?, probs, v)?;
        let merged = self.transpose(&sub("/context_transpose")?, ctx, &[0, 2, 1, 3])?;
        let flat = self.reshape(
            &sub("/context_merge")?,
            merged,
            &[batch, target, heads * vd],
        )?;
        let o = self.variable(
            &sub("/attention_output/kernel:0")?,
            &[heads, vd, features],
            dtype,
            Init::GlorotUniform,
        )?;
        let ov = self.reshape(
            &sub("/attention_output/kernel_view")?,
            o,
            &[heads * vd, features],
        )?;
        let mut y = self.matmul(&sub("/attention_output/MatMul")?, flat, ov)?;
        if layer.use_bias {
            let b = self.variable(
                &sub("/attention_output/bias:0")?,
                &[features],
                dtype,
                Init::Zeros,
            )?;
            y = self.add(name, y, b)?;
        }
        Ok(y)
    }
}
