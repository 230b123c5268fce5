//! Recomputation checkpoints: where `auto` recomputation cuts, and the segments that
//! checkpoints close.

use crate::error::GraphError;
use crate::graph::{Graph, NodeId, NodeRef};
use crate::op::Op;
use crate::storage::{Buffer, Storage};
use crate::Roles;

use super::backprop::Segments;

impl<S: Storage> Graph<S> {
    /// Which of the first `len` nodes are made from variables alone (a reshaped bias, a
    /// transposed weight): parameters in another shape, the same for every micro-batch, not
    /// activations to stash, recompute or cut at. Constants and inputs are data.
    fn parameter_derived(&self, len: usize) -> Option<S::Vec<bool>> {
        let mut out: S::Vec<bool> = S::filled(len, false)?;
        for i in 0..len {
            let op = &self.nodes[i].op;
            let ops = op.operands();
            out[i] = !op.is_state()
                && !matches!(op, Op::Input)
                && !ops.as_slice().is_empty()
                && ops.as_slice().iter().all(|o| {
                    matches!(self.nodes[o.index()].op, Op::Variable { .. }) || out[o.index()]
                });
        }
        Some(out)
    }

    /// The checkpoints `auto` recomputation puts at the output of each repeated block: the
    /// forward activations where the graph narrows to that one tensor, that is, after which no
    /// earlier activation that depends on a trainable variable is read again (masks and other
    /// tensors made from the inputs alone may be). Residual blocks, transformer sublayers
    /// (attention and feed-forward, each closed by its residual add and norm) and the
    /// embeddings end at such points. Of a chain of such points (a residual add and the norm
    /// or activation after it, a stem's convolution, norm, activation and pooling) only the
    /// last is taken: the block's output, where PopTorch's `recomputationCheckpoint` and
    /// TensorFlow's `recomputation_checkpoint` go in Graphcore's models, and where a stage
    /// ending with the block hands one tensor to the next and stashes none of its own
    /// (taking the chain's first point, a post-norm layer's residual sum, left its norm to be
    /// recomputed from a stashed copy of that sum). A chain that runs into the loss (the
    /// last block's output, then the head) gives the last block's output: its last point
    /// of its first point's shape, before the head pools or gathers. The loss is never one.
    ///
    /// # Errors
    ///
    /// [`GraphError::UnknownNode`] and the like for a `loss` that is not a node of the graph.
    pub fn auto_checkpoints(&self, loss: impl NodeRef) -> Result<S::Vec<NodeId>, GraphError> {
        let loss = loss.resolve(self)?;
        let last = loss.index();
        let len = last + 1;
        let full = || GraphError::CapacityExceeded {
            node: crate::error::name_lossy("checkpoints"),
            capacity: len,
        };
        // What the loss reads, directly or not: a batch norm's statistics for its running
        // averages do not, and are no activation the backward pass keeps; their reads keep
        // nothing alive for it.
        let reaches_loss = self.reaching(len, last).ok_or_else(full)?;
        let mut depends: S::Vec<bool> = S::filled(len, false).ok_or_else(full)?;
        let mut last_reader: S::Vec<usize> = S::filled(len, 0).ok_or_else(full)?;
        for i in 0..len {
            let n = &self.nodes[i];
            depends[i] = n.roles.contains(Roles::TRAINABLE);
            for o in n.op.operands().as_slice() {
                depends[i] |= depends[o.index()];
                if reaches_loss[i] {
                    last_reader[o.index()] = i;
                }
            }
        }
        let parameter = self.parameter_derived(len).ok_or_else(full)?;
        // Activations (depending on a variable) made so far and read after node i, with how
        // many close at each node: a sweep of opening and closing counts.
        let mut closing: S::Vec<u32> = S::filled(len + 1, 0).ok_or_else(full)?;
        let mut open = 0u32;
        let mut out: S::Vec<NodeId> = S::vec();
        // The chain under way: its last cut of the first cut's shape, and its last cut. The
        // last is pushed when an activation ends the chain; when the chain runs into the loss,
        // the last of the first shape (the last block's output, before a head changes it).
        let mut chain: Option<(usize, usize)> = None;
        for i in 0..len {
            open -= closing[i];
            let n = &self.nodes[i];
            let activation = depends[i]
                && reaches_loss[i]
                && !parameter[i]
                && !n.op.is_state()
                && !n.op.is_update()
                && !matches!(n.op, Op::Input);
            let lives_on = activation && last_reader[i] > i;
            if lives_on {
                open += 1;
                closing[last_reader[i]] += 1;
            }
            // `open` counts the activations read after node i, i among them: a cut when i is
            // the only one.
            let cut = lives_on && i != last && open == 1;
            // A chain runs over activations: variables and inputs between them do not end it.
            if cut {
                chain = Some(match chain {
                    Some((block, _)) if n.shape == self.nodes[block].shape => (i, i),
                    Some((block, _)) => (block, i),
                    None => (i, i),
                });
            } else if activation || i == last {
                if let Some((block, end)) = chain.take() {
                    let at = if i == last { block } else { end };
                    out.push(NodeId::at(at)).map_err(|_| full())?;
                }
            }
        }
        self.repeated_blocks(&mut out)?;
        Ok(out)
    }

    /// Keeps, of the narrowing points `cuts`, those that end each repeated block: when the
    /// segments between them repeat with a period of several segments (a transformer layer
    /// is an attention and a feed-forward sublayer, each ending at a narrowing point), every
    /// period-th point, the last one kept. The first such point closes the stem or the
    /// embeddings; points before it (a BERT's word-embedding lookup, before the other
    /// embeddings are added) are inside that first segment and are not kept.
    /// Segments compare by their ops and shapes; the period is the one of 1 to 4 under which
    /// most segments equal the one a period later (the shortest of equals).
    fn repeated_blocks(&self, cuts: &mut S::Vec<NodeId>) -> Result<(), GraphError> {
        let n = cuts.len();
        if n < 3 {
            return Ok(());
        }
        let full = || GraphError::CapacityExceeded {
            node: crate::error::name_lossy("checkpoints"),
            capacity: n,
        };
        // A signature of each segment (c[j-1], c[j]]: FNV-1a over its ops' names and shapes.
        let mut sig: S::Vec<u64> = S::filled(n, 0).ok_or_else(full)?;
        for j in 1..n {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            let mut eat = |x: u64| {
                h ^= x;
                h = h.wrapping_mul(0x0100_0000_01b3);
            };
            for node in &self.nodes[cuts[j - 1].index() + 1..=cuts[j].index()] {
                for b in node.op.name().bytes() {
                    eat(u64::from(b));
                }
                for &d in node.shape.dims() {
                    eat(u64::from(d));
                }
                eat(0xff);
            }
            sig[j] = h;
        }
        let matches = |p: usize| (1..n - p).filter(|&j| sig[j] == sig[j + p]).count();
        let mut best = (1, matches(1));
        for p in 2..=4usize.min(n - 2) {
            let m = matches(p);
            if m > best.1 {
                best = (p, m);
            }
        }
        let p = best.0;
        if p == 1 {
            return Ok(());
        }
        let keep_phase = (n - 1) % p;
        let mut kept: S::Vec<NodeId> = S::vec();
        for (j, &c) in cuts.iter().enumerate() {
            if j % p == keep_phase {
                kept.push(c).map_err(|_| full())?;
            }
        }
        *cuts = kept;
        Ok(())
    }

    /// Recomputation: each forward node's segment (the checkpoint closing it, in its stage),
    /// and whether it is recomputed. Checkpoints, state, inputs, activations that depend on no
    /// trainable variable and what follows a stage's last checkpoint are kept.
    pub(super) fn segments(
        &self,
        checkpoints: &[NodeId],
        last: usize,
        reaches_loss: &[bool],
        depends_on_var: &[bool],
    ) -> Result<Segments<S>, GraphError> {
        let forward_len = reaches_loss.len();
        let full = || GraphError::CapacityExceeded {
            node: crate::error::name_lossy("autodiff"),
            capacity: forward_len,
        };
        let mut segment: S::Vec<u32> = S::filled(forward_len, u32::MAX).ok_or_else(full)?;
        let mut recomputed: S::Vec<bool> = S::filled(forward_len, false).ok_or_else(full)?;
        if checkpoints.is_empty() {
            return Ok((segment, recomputed));
        }
        let mut is_checkpoint: S::Vec<bool> = S::filled(forward_len, false).ok_or_else(full)?;
        for &c in checkpoints {
            let ok = c.index() < forward_len
                && c.index() != last
                && reaches_loss[c.index()]
                && depends_on_var[c.index()]
                && !self.nodes[c.index()].op.is_state()
                && !matches!(self.nodes[c.index()].op, Op::Input);
            if !ok {
                let node = match self.nodes.get(c.index()) {
                    Some(n) => n.name.clone(),
                    None => crate::error::name_lossy("?"),
                };
                return Err(GraphError::BadCheckpoint { node });
            }
            is_checkpoint[c.index()] = true;
        }
        // Walking backwards: the next checkpoint of each stage. A stage before the loss's
        // ends a segment with its last node too: its activations after its last checkpoint
        // are recomputed as well (only the stage's inputs and checkpoints are stashed, as
        // PopART's pipelined recomputation does); the loss's stage keeps what follows its
        // last checkpoint, which its backward reads at once.
        let parameter = self.parameter_derived(forward_len).ok_or_else(full)?;
        let mut next: [u32; 256] = [u32::MAX; 256];
        let loss_stage = usize::from(self.nodes[last].stage);
        for i in 0..=last {
            let st = usize::from(self.nodes[i].stage);
            if st != loss_stage {
                next[st] = i as u32;
            }
        }
        for i in (0..=last).rev() {
            let n = &self.nodes[i];
            let st = usize::from(n.stage);
            if is_checkpoint[i] {
                next[st] = i as u32;
                segment[i] = i as u32;
                continue;
            }
            let activation = !n.op.is_state() && !matches!(n.op, Op::Input) && !parameter[i];
            // Only what the backward pass reads: a value that does not reach the loss
            // (a batch norm's statistics for its running averages) is no gradient's
            // operand, so no copy of it is made (as dead-code elimination drops it).
            if activation && depends_on_var[i] && reaches_loss[i] && next[st] != u32::MAX {
                segment[i] = next[st];
                recomputed[i] = true;
            }
        }
        Ok((segment, recomputed))
    }
}
