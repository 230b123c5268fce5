//! The pipeline stash: what each stage keeps of a micro-batch for its backward pass, how many
//! entries, on which tiles, and its copies when offloaded.

use tessera_core::schedule::{AccumulationRule, Pipeline, Schedule};
use tessera_core::{Op, Plan, Roles, Storage};

use super::phases::{Costs, Run};
use super::SystemError;

/// The tensors each stage stashes for its backward pass, as (stage, tensor) pairs: what its
/// backward reads of the forward pass or, recomputing, of its inputs (a view's root, which is
/// what is stashed).
pub(super) fn stashed_tensors<S: Storage>(plan: &Plan<S>, recompute: bool) -> Vec<(usize, usize)> {
    let g = plan.graph();
    let s = g.stage_count();
    let forward_len = g.forward_len();
    // Per stage and tensor (root): whether the stage's nodes read it, and whether its
    // backward nodes do (updates aside).
    let mut read = vec![vec![(false, false); g.len()]; s];
    for (c, n) in g.nodes().iter().enumerate() {
        if n.roles().contains(Roles::UPDATE) {
            continue;
        }
        for &o in n.op().operands().as_slice() {
            let r = &mut read[n.stage()][plan.storage_of(o).index()];
            r.0 = true;
            r.1 |= c >= forward_len;
        }
    }
    let mut out = Vec::new();
    for (t, node) in g.nodes()[..forward_len].iter().enumerate() {
        if node.op().is_state() || node.op().is_update() || plan.slots()[t].view_of.is_some() {
            continue;
        }
        for (k, read) in read.iter().enumerate() {
            let stage_input = node.stage() != k || matches!(node.op(), Op::Input);
            let keep = if recompute {
                stage_input && read[t].0
            } else {
                read[t].1
            };
            if keep {
                out.push((k, t));
            }
        }
    }
    out
}

/// The bytes `depth` stashed copies of `tensor` take on each of its tiles (tile index, bytes).
pub(super) fn stash_per_tile(
    tensor: &crate::program::ProgTensor,
    depth: u64,
) -> impl Iterator<Item = (usize, u64)> + '_ {
    let eb = tensor.elem_bytes();
    tensor
        .mapping
        .elements_per_tile()
        .into_iter()
        .map(move |(tile, n)| (tile.index(), depth * n * eb))
}

/// What the stages stash for their backward passes.
pub(super) struct Stash {
    /// (stage, tensor) pairs: what each stage's backward reads of its forward (or,
    /// recomputing, of its inputs).
    pub(super) stashed: Vec<(usize, usize)>,
    /// Each stage's stash bytes per micro-batch.
    pub(super) entry_bytes: Vec<u64>,
    /// Whether the stash is kept in streaming memory.
    pub(super) offloaded: bool,
}

/// The stages' stash; offloaded, each stage with a stash stores it to streaming memory after
/// its forward pass and loads it before its backward pass (TensorFlow's
/// `offload_activations`), which `costs` gains.
pub(super) fn stash<S: Storage>(run: &Run<'_, S>, costs: &mut Costs) -> Result<Stash, SystemError> {
    let Run {
        plan, cfg, opts, t, ..
    } = run;
    let g = plan.graph();
    let stashed = if t.training {
        stashed_tensors(plan, opts.techniques.recompute.stages)
    } else {
        Vec::new()
    };
    let mut entry_bytes = vec![0u64; t.s];
    for &(k, i) in &stashed {
        entry_bytes[k] += g.nodes()[i].bytes() as u64;
    }
    let offloaded = opts.techniques.offload.activations && t.training;
    if offloaded {
        if cfg.streaming_memory_bytes == 0 {
            return Err(SystemError::StageOption {
                option: "offload activations",
                detail: "the machine has no streaming memory (remote buffers) to hold them".into(),
            });
        }
        for (k, &bytes) in entry_bytes.iter().enumerate() {
            if t.entries[k] == 0 || bytes == 0 {
                continue;
            }
            let x = (bytes as f64 / cfg.streaming_memory_bytes_per_cycle()).ceil() as u64
                + cfg.exchange_overhead_cycles;
            costs.stages[k].forward += x;
            costs.stages[k].backward += x;
            costs.phases[k].0.remote_buffers += x;
            costs.phases[k].1.remote_buffers += x;
        }
    }
    Ok(Stash {
        stashed,
        entry_bytes,
        offloaded,
    })
}

/// The entries of stage position `p`'s stash. TensorFlow's depth is the schedule's: the
/// micro-batches whose activations wait for their backward while a newer one's are the
/// stage's working tensors ([`Pipeline::stash_depth`]). PopART sizes a stash by the pipeline
/// stages from the stashing one to the restoring one, both counted
/// (`Pipeline::getStashSize`: `numIndependentStages(stash stage, restore stage + 1)`, with a
/// forward stage `s` of `N` restored in backward stage `2(N - 1) - s`), one entry more for
/// every stage but the last, whose forward and backward share a stage and stash nothing.
pub fn stash_entries(pipeline: &Pipeline, p: usize, rule: AccumulationRule) -> usize {
    let depth = pipeline.stash_depth(p);
    let popart_grouped =
        rule == AccumulationRule::PopArt && pipeline.schedule() == Schedule::Grouped;
    if popart_grouped && pipeline.training() && p + 1 < pipeline.stages() {
        depth + 1
    } else {
        depth
    }
}
