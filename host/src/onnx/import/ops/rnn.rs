//! Recurrent layers: `LSTM`.

use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::Recurrent, versions, convert)
}

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[op("LSTM", &[7, 14], |im, n| im.lstm(n))
    .weights(&[1, 2, 3])
    .sequence_first(|n| {
        super::super::attr(n, "layout")
            .and_then(|a| a.i)
            .unwrap_or(0)
            == 0
    })];

impl<'a> Importer<'a> {
    pub(in crate::onnx::import) fn lstm(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let dir = self
            .attr_s(node, "direction")
            .unwrap_or_else(|| "forward".into());
        if dir != "forward" {
            return Err(self.unsupported(format!("direction {dir} (forward only)")));
        }
        if self.attr_i(node, "layout", 0) != 0 {
            return Err(self.unsupported("layout 1 (batch first)"));
        }
        if attr(node, "activations").is_some() || attr(node, "clip").is_some() {
            return Err(self.unsupported("custom activations or clip"));
        }
        if self.attr_i(node, "input_forget", 0) != 0 {
            return Err(self.unsupported("input_forget = 1"));
        }
        if self.opt(node, 4)?.is_some() {
            if let Some(c) = self.konst(node, 4, "sequence_lens")? {
                let steps = self.dims(&self.req(node, 0)?)[0] as f64;
                if c.data.iter().any(|&v| v != steps) {
                    return Err(self.unsupported("sequences of different lengths"));
                }
            }
        }
        if self.opt(node, 7)?.is_some() {
            return Err(self.unsupported("peephole weights P"));
        }
        let xd = self.dims(&self.req(node, 0)?);
        let x = self.ti(node, 0)?;
        let w = self.ti(node, 1)?;
        let r = self.ti(node, 2)?;
        let b = match self.opt(node, 3)? {
            Some(v) => Some(self.t(&v, &node.input[3].clone())?),
            None => None,
        };
        let mut states = [None, None];
        for (slot, k) in [(0usize, 5usize), (1, 6)] {
            if let Some(v) = self.opt(node, k)? {
                let dims = self.dims(&v);
                let name = node.input[k].clone();
                let id = if dims.len() == 3 && xd.len() == 3 && dims[1] != xd[1] {
                    // Initial states written at the file's batch: rebound with it.
                    let dims2 = [dims[0], xd[1], dims[2]];
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
                        name: format!("{name}@batch{}", xd[1]),
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
                states[slot] = Some(id);
            }
        }
        let name = self.out_name(node, "");
        let initial = tessera_core::LstmStates {
            hidden: states[0],
            cell: states[1],
        };
        let out = chk!(self, self.g.lstm_onnx(&name, x, w, r, b, initial))?;
        Ok(vec![
            Val::T(out.sequence, Elem::F32),
            Val::T(out.hidden, Elem::F32),
            Val::T(out.cell, Elem::F32),
        ])
    }
}
