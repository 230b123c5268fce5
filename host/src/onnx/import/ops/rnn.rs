//! Recurrent layers: `LSTM` and `GRU`, in every direction and either layout. Each direction
//! is the core's unrolled layer on its slice of the weights; the reverse direction reads the
//! sequence reversed (a gather of the time axis) and its outputs are reversed back, and a
//! bidirectional layer joins the two directions' outputs on the direction axis, as ONNX
//! lays them out. A batch-first node (`layout` 1) has its sequence and initial states
//! transposed to sequence-first and its outputs back.

use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::Recurrent, versions, convert)
}

/// Whether a recurrent node reads its input sequence-first (`layout` 0, the default).
fn sequence_first(n: &NodeProto) -> bool {
    super::super::attr(n, "layout")
        .and_then(|a| a.i)
        .unwrap_or(0)
        == 0
}

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    op("LSTM", &[7, 14, 22], |im, n| im.lstm(n))
        .weights(&[1, 2, 3])
        .sequence_first(sequence_first),
    op("GRU", &[7, 14, 22], |im, n| im.gru(n))
        .weights(&[1, 2, 3])
        .sequence_first(sequence_first),
];

/// One direction of a recurrent layer: its name, sequence, weights, recurrence, bias and
/// initial states, to build.
struct Direction {
    name: String,
    x: NodeId,
    w: NodeId,
    r: NodeId,
    b: Option<NodeId>,
    states: [Option<NodeId>; 2],
}

impl<'a> Importer<'a> {
    /// The directions of a recurrent node: whether each reads the sequence reversed.
    fn directions(&self, node: &NodeProto) -> R<Vec<bool>> {
        match self.attr_s(node, "direction").as_deref() {
            None | Some("forward") => Ok(vec![false]),
            Some("reverse") => Ok(vec![true]),
            Some("bidirectional") => Ok(vec![false, true]),
            Some(other) => Err(self.bad(format!(
                "direction {other}: forward, reverse or bidirectional expected"
            ))),
        }
    }

    /// Whether recurrent node `node` lays its tensors out batch-first (`layout` 1: `X` `[batch,
    /// seq, input]`, `Y` `[batch, seq, directions, hidden]`, the states `[batch, directions,
    /// hidden]`), else sequence-first (0, the default).
    fn batch_first(&self, node: &NodeProto) -> R<bool> {
        match self.attr_i(node, "layout", 0) {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(self.bad(format!("layout {other}: 0 or 1 expected"))),
        }
    }

    /// What every recurrent node must be: default activations, no clip, and every sequence
    /// of the batch at full length.
    fn recurrent_checks(&self, node: &NodeProto) -> R<()> {
        let time_axis = usize::from(self.batch_first(node)?);
        if attr(node, "activations").is_some() || attr(node, "clip").is_some() {
            return Err(self.unsupported("custom activations or clip"));
        }
        if self.opt(node, 4)?.is_some() {
            if let Some(c) = self.konst(node, 4, "sequence_lens")? {
                let steps = self.dims(&self.req(node, 0)?)[time_axis] as f64;
                if c.data.iter().any(|&v| v != steps) {
                    return Err(self.unsupported("sequences of different lengths"));
                }
            }
        }
        Ok(())
    }

    pub(in crate::onnx::import) fn lstm(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        self.recurrent_checks(node)?;
        if self.attr_i(node, "input_forget", 0) != 0 {
            return Err(self.unsupported("input_forget = 1"));
        }
        if self.opt(node, 7)?.is_some() {
            return Err(self.unsupported("peephole weights P"));
        }
        let states = self.initial_states(node, &[5, 6])?;
        self.each_direction(node, states, |g, d| {
            let initial = tessera_core::LstmStates {
                hidden: d.states[0],
                cell: d.states[1],
            };
            g.lstm_onnx(&d.name, d.x, d.w, d.r, d.b, initial)
        })
    }

    /// `GRU` (default activations; `linear_before_reset` as the node says, PyTorch's 1).
    pub(in crate::onnx::import) fn gru(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        self.recurrent_checks(node)?;
        let states = self.initial_states(node, &[5])?;
        let linear_before_reset = self.attr_i(node, "linear_before_reset", 0) != 0;
        let mut out = self.each_direction(node, states, |g, d| {
            let settings = tessera_core::GruSettings {
                initial: d.states[0],
                linear_before_reset,
            };
            g.gru_onnx(&d.name, d.x, d.w, d.r, d.b, settings)
        })?;
        // A GRU has no cell state: `Y` and `Y_h`.
        out.truncate(2);
        Ok(out)
    }

    /// Builds each direction of recurrent node `node` from its slice of the weights (W, R, B:
    /// inputs 1 to 3) and of the initial `states` (`build` makes one direction's layer: its
    /// sequence `[seq, 1, batch, hidden]`, last hidden and cell states): the outputs `Y` `[seq, directions, batch,
    /// hidden]`, `Y_h` and `Y_c` `[directions, batch, hidden]`.
    fn each_direction(
        &mut self,
        node: &NodeProto,
        states: [Option<NodeId>; 2],
        build: impl Fn(&mut Graph<Heap>, &Direction) -> Result<tessera_core::LstmOutputs, GraphError>,
    ) -> R<Vec<Val>> {
        let dirs = self.directions(node)?;
        let batch_first = self.batch_first(node)?;
        let mut xd = self.dims(&self.req(node, 0)?);
        let mut x = self.ti(node, 0)?;
        if batch_first {
            x = self.swap_leading(node, x, "x")?;
            xd.swap(0, 1);
        }
        let w = self.ti(node, 1)?;
        let r = self.ti(node, 2)?;
        let b = match self.opt(node, 3)? {
            Some(v) => Some(self.t(&v, &node.input[3].clone())?),
            None => None,
        };
        let steps = xd[0];
        let reversed: Vec<usize> = (0..steps).rev().collect();
        let mut outs: Vec<[NodeId; 3]> = Vec::new();
        for (k, &reverse) in dirs.iter().enumerate() {
            let what = if reverse { "reverse" } else { "forward" };
            // This direction's slice of a tensor of every direction (itself when one).
            let part = |im: &mut Self, t: NodeId, label: &str| -> R<NodeId> {
                if dirs.len() == 1 {
                    return Ok(t);
                }
                let name = im.out_name(node, &format!("{what}_{label}"));
                chk!(im, im.g.slice(&name, t, 0, k, 1))
            };
            let (w, r) = (part(self, w, "w")?, part(self, r, "r")?);
            let b = b.map(|b| part(self, b, "b")).transpose()?;
            let mut st = [None, None];
            for (slot, s) in states.iter().enumerate() {
                st[slot] = s.map(|s| part(self, s, "state")).transpose()?;
            }
            let x = if reverse {
                self.take_along(node, x, &xd, 0, &reversed)?.0
            } else {
                x
            };
            let d = Direction {
                name: self.out_name(node, if dirs.len() == 1 { "" } else { what }),
                x,
                w,
                r,
                b,
                states: st,
            };
            let o = build(self.g, &d).map_err(|e| self.graph_err(e))?;
            let mut seq = o.sequence;
            if reverse {
                let sd = self
                    .g
                    .node(seq)
                    .shape()
                    .dims()
                    .iter()
                    .map(|&v| v as usize)
                    .collect::<Vec<_>>();
                seq = self.take_along(node, seq, &sd, 0, &reversed)?.0;
            }
            outs.push([seq, o.hidden, o.cell]);
        }
        let joined = match outs[..] {
            [one] => one,
            [f, b] => {
                let mut j = [f[0]; 3];
                for (slot, axis) in [(0usize, 1isize), (1, 0), (2, 0)] {
                    let name = self.out_name(node, &format!("directions{slot}"));
                    j[slot] = chk!(self, self.g.concat_axis(&name, f[slot], b[slot], axis))?;
                }
                j
            }
            _ => unreachable!("one or two directions"),
        };
        let mut joined = joined;
        if batch_first {
            // Y [seq, directions, batch, hidden] -> [batch, seq, directions, hidden]; the
            // states [directions, batch, hidden] -> [batch, directions, hidden].
            let name = self.out_name(node, "batch_first_y");
            joined[0] = chk!(self, self.g.transpose(&name, joined[0], &[2, 0, 1, 3]))?;
            for (slot, label) in [(1, "h"), (2, "c")] {
                joined[slot] = self.swap_leading(node, joined[slot], label)?;
            }
        }
        Ok(joined.iter().map(|&t| Val::T(t, Elem::F32)).collect())
    }

    /// `t` with its first two axes swapped (a batch-first recurrent node's sequence or
    /// states to and from the sequence-first layout the core's layers take).
    fn swap_leading(&mut self, node: &NodeProto, t: NodeId, label: &str) -> R<NodeId> {
        let rank = self.g.node(t).shape().dims().len();
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(0, 1);
        let name = self.out_name(node, &format!("batch_first_{label}"));
        chk!(self, self.g.transpose(&name, t, &perm))
    }

    /// The initial states of recurrent node `node` (inputs `slots`: `initial_h`, and for an
    /// LSTM `initial_c`), each rebound to the batch when written at the file's.
    fn initial_states(&mut self, node: &NodeProto, slots: &[usize]) -> R<[Option<NodeId>; 2]> {
        let xd = self.dims(&self.req(node, 0)?);
        // The batch axis of the states and of X: 1 sequence-first, 0 batch-first.
        let batch_first = self.batch_first(node)?;
        let axis = usize::from(!batch_first);
        let mut states = [None, None];
        for (slot, &k) in slots.iter().enumerate() {
            if let Some(v) = self.opt(node, k)? {
                let dims = self.dims(&v);
                let name = node.input[k].clone();
                let id = if dims.len() == 3 && xd.len() == 3 && dims[axis] != xd[axis] {
                    // Initial states written at the file's batch: rebound with it.
                    let mut dims2 = [dims[0], dims[1], dims[2]];
                    dims2[axis] = xd[axis];
                    let values = match &v {
                        Val::W(i) => self.weights[*i].values.clone(),
                        Val::C(c) => Ok(Arc::new(c.data.clone())),
                        Val::T(..) => {
                            return Err(
                                self.unsupported("rebinding the batch of run-time initial states")
                            )
                        }
                    };
                    let values = values.map(|vals| {
                        let fill = vals.first().copied().unwrap_or(0.0);
                        Arc::new(vec![fill; dims2.iter().product()])
                    });
                    if let Ok(vals) = match &v {
                        Val::W(i) => self.weights[*i].values.clone(),
                        _ => Err(Missing::Light),
                    } {
                        if vals.iter().any(|&x| x.to_bits() != vals[0].to_bits()) {
                            return Err(self.unsupported(
                                "rebinding the batch of initial states that differ per sample",
                            ));
                        }
                    }
                    self.weights.push(Weight {
                        name: format!("{name}@batch{}", xd[axis]),
                        dims: dims2.to_vec(),
                        values,
                        trainable: true,
                        init: Init::Zeros,
                    });
                    let i = self.weights.len() - 1;
                    self.place(i)?
                } else {
                    self.t(&v, &name)?
                };
                states[slot] = Some(if batch_first {
                    self.swap_leading(node, id, &format!("initial{slot}"))?
                } else {
                    id
                });
            }
        }
        Ok(states)
    }
}
