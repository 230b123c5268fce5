//! Automatic pipeline splits of imported models: N contiguous stages (in the file's node
//! order) on N IPUs, balanced on the estimate's cycles within each IPU's memory; a masked-LM
//! head is a stage more, on its embedding's IPU.
//!
//! How it balances:
//! 1. The model is estimated once on one IPU (a fit is not needed) and every ONNX node gets
//!    its forward and backward cycles and its weight bytes from that estimate
//!    ([`layer_rows`]); a masked-LM head's cycles count with its token embedding's node, as
//!    the same IPU runs both.
//! 2. A stage's cost is the sum of its nodes' cycles; its memory is its weights' bytes times
//!    the copies training keeps on the IPU (the weight, its gradient accumulator, and the
//!    optimizer's state unless offloaded). [`partition`] finds the contiguous split that
//!    minimises the most expensive stage with each stage's memory under its cap (dynamic
//!    programming, exact; `tests` compares it with an exhaustive search). In training,
//!    stages start only after the end of a repeated block (the points `auto` recomputation
//!    checkpoints), as Graphcore's models are split between whole layers, unless no such
//!    split keeps under the caps.
//! 3. The split is estimated for real. If an IPU overflows while another has room, the cap of
//!    each overflowing IPU's stage drops to a fifth below its weights (so that stage must
//!    shed layers to IPUs with room) and the split is redone, up to [`RETRIES`] times; the
//!    split that fits is returned, else the one whose fullest tile is smallest, with its
//!    estimate. The caps bound weights and their training state (a tile's always-live
//!    bytes), so the split is not redone when an overflowing IPU's fullest tile is over even
//!    without its always-live bytes (a first stage's stashed activations, say). This is a
//!    heuristic: a new cap also moves boundaries, and the layers that move take their
//!    activations and stashes along, which now and then brings such a tile under (measured:
//!    GPT-2 at batch 3 over 4 IPUs with Adam, where a second attempt fits the first IPU but
//!    not the others). On the shipped models it saves estimates that made the overflow worse
//!    (ResNet-50 and MobileNetV2 at batch 8, whose first stage's stashes grew with each
//!    smaller cap).
//!
//! The pipeline's own balance (stash depths, idle time) is the estimate's, not the split's:
//! the split only equalises the stages' cycles.

use serde::Serialize;
use tessera_sim::system::SystemEstimate;
use tessera_sim::techniques::MemoryProportion;

use crate::compile::onnx::{
    compile_imported, head_cycles, layer_rows, OnnxCompiled, OnnxOptions, ONNX_ACCUMULATION_RULE,
};
use crate::compile::{opt_err, OptimizerKind, SessionError, SessionOptions};
use crate::onnx::{OnnxGraph, Stages};

/// Splits the memory cap shrinks through before the split is given as it is.
pub const RETRIES: usize = 5;

/// The most IPUs the fewest-IPUs search tries.
pub const MAX_IPUS: usize = 64;

/// The split's cut points and cost, contiguous in `costs`' order: stage `s` holds items
/// `starts[s] .. starts[s + 1]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Where each stage starts (the first is 0).
    pub starts: Vec<usize>,
    /// The most expensive stage's cost.
    pub max_cost: u64,
}

/// The contiguous split of `costs` into `caps.len()` non-empty parts that minimises the
/// largest part's cost, part `k`'s `mems` summing to at most `caps[k]`, parts starting only
/// at items `j` with `cuttable[j]` (an empty `cuttable`: anywhere); `None` when no split keeps
/// under the caps (or there are fewer items than parts). Ties go to the earliest cuts.
pub fn partition(
    costs: &[u64],
    mems: &[u64],
    caps: &[u64],
    cuttable: &[bool],
) -> Option<Partition> {
    let n = caps.len();
    let l = costs.len();
    if n == 0 || l < n || mems.len() != l || !(cuttable.is_empty() || cuttable.len() == l) {
        return None;
    }
    let may_start = |j: usize| cuttable.is_empty() || cuttable[j];
    let mut pc = vec![0u64; l + 1];
    let mut pm = vec![0u64; l + 1];
    for i in 0..l {
        pc[i + 1] = pc[i] + costs[i];
        pm[i + 1] = pm[i] + mems[i];
    }
    const NONE: u64 = u64::MAX;
    // best[k][i]: the best largest cost of splitting items 0..i into k + 1 parts.
    let mut best = vec![vec![NONE; l + 1]; n];
    let mut from = vec![vec![0usize; l + 1]; n];
    for i in 1..=l {
        if pm[i] <= caps[0] {
            best[0][i] = pc[i];
        }
    }
    for k in 1..n {
        for i in (k + 1)..=l {
            let mut b = NONE;
            let mut arg = 0;
            // The last part is j..i; j from the largest down, so memory only grows.
            for j in (k..i).rev() {
                if pm[i] - pm[j] > caps[k] {
                    break;
                }
                if best[k - 1][j] == NONE || !may_start(j) {
                    continue;
                }
                let c = best[k - 1][j].max(pc[i] - pc[j]);
                if c < b || (c == b && j < arg) {
                    b = c;
                    arg = j;
                }
            }
            best[k][i] = b;
            from[k][i] = arg;
        }
    }
    if best[n - 1][l] == NONE {
        return None;
    }
    let mut starts = vec![0usize; n];
    let mut i = l;
    for k in (1..n).rev() {
        let j = from[k][i];
        starts[k] = j;
        i = j;
    }
    Some(Partition {
        starts,
        max_cost: best[n - 1][l],
    })
}

/// An automatic split and its estimate.
pub struct Split {
    /// The compiled model with the split's stages.
    pub compiled: OnnxCompiled,
    /// Its estimate.
    pub estimate: SystemEstimate,
    /// What the split did.
    pub info: SplitInfo,
}

/// How a split came out, for reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SplitInfo {
    /// IPUs (stages).
    pub ipus: usize,
    /// The last node of each stage but the last (what `--pipeline-stages` would take).
    pub boundaries: Vec<String>,
    /// Each stage's cycles as the one-IPU estimate gives them (forward + backward).
    pub stage_cycles: Vec<u64>,
    /// Each stage's weight-state bytes.
    pub stage_weight_bytes: Vec<u64>,
    /// The memory cap of each stage this split was made with (an IPU's memory, less where
    /// an earlier attempt overflowed that stage's IPU).
    pub cap_bytes: Vec<u64>,
    /// Which attempt made this split (each attempt is a full estimate).
    pub attempts: usize,
    /// Attempts made in all.
    pub tried: usize,
}

/// The cost and memory of every ONNX node, from a one-IPU estimate.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    names: Vec<String>,
    /// Index of each node that made graph nodes.
    units: Vec<usize>,
    costs: Vec<u64>,
    /// Bytes of each unit's weights.
    weights: Vec<u64>,
    nodes: usize,
    /// A masked-LM head's cycles (forward and backward, with the loss's) and the unit holding
    /// its token embedding: split over several IPUs, the head is a stage of its own on that
    /// unit's IPU, so its cycles count there.
    head: Option<(usize, u64)>,
    /// Per unit: whether a stage may start at it, the previous unit ending a repeated block
    /// (empty: anywhere).
    block_starts: Vec<bool>,
}

impl Profile {
    /// The pipeline stages a split into `n` parts makes: one more for a masked-LM head that
    /// is a stage of its own (its embedding is in an earlier part).
    pub fn pipeline_stages(&self, n: usize) -> usize {
        n + usize::from(n > 1 && self.head.is_some())
    }

    /// Each unit's cycles as the split balances them: a head's counted with its embedding's
    /// unit (the same IPU runs both) when the split has several parts.
    fn costs(&self, n: usize) -> Vec<u64> {
        let mut costs = self.costs.clone();
        if let Some((unit, cycles)) = self.head.filter(|_| n > 1) {
            costs[unit] += cycles;
        }
        costs
    }

    /// Bytes each unit's weights take on the IPU with their training state under `so` and
    /// `oo`: the weight and its gradient (or accumulator), plus the optimizer's state unless
    /// it is offloaded; the weight alone for inference.
    fn state_bytes(&self, so: &SessionOptions, oo: &OnnxOptions) -> Vec<u64> {
        let copies = if oo.inference {
            1
        } else {
            let state = if so.techniques.offload.optimizer_state {
                0
            } else {
                match so.optimizer {
                    OptimizerKind::Sgd => 0,
                    OptimizerKind::Momentum | OptimizerKind::Lars => 1,
                    OptimizerKind::Adam | OptimizerKind::Lamb => 2,
                }
            };
            2 + state
        };
        self.weights.iter().map(|w| w * copies).collect()
    }
}

/// Estimates the imported model on one IPU and reads every node's cycles and weight bytes.
///
/// # Errors
///
/// As [`compile_imported`].
pub fn profile(
    og: &OnnxGraph<'_>,
    so: &SessionOptions,
    oo: &OnnxOptions,
) -> Result<Profile, SessionError> {
    let one = OnnxOptions {
        stages: Stages::One,
        device_mapping: None,
        ..oo.clone()
    };
    let mut so1 = so.clone();
    so1.replicas = 1;
    // Per-stage proportions await the split: the profile plans every product with the
    // smallest (the tightest bound, whose plans are the slowest).
    let proportion = &mut so1.techniques.available_memory_proportion;
    *proportion = MemoryProportion::All(proportion.least());
    let c = compile_imported(og, &so1, &one)?;
    // The profile is of cycles: the split checks each stage's memory itself.
    let e = c.target.estimate_cycles()?;
    Ok(profile_of(&c, &e))
}

/// Whether the estimate of `c`, compiled with `so` and `oo`, is the one-IPU estimate
/// [`profile`] makes, so that [`profile_of`] can read the profile from it: one replica, at
/// most one available memory proportion, no device mapping, and one stage - asked for
/// ([`Stages::One`]) or placed so by the file (no stage attributes, the usual case), which
/// compiles the same graph. (The profile skips the memory accounting, which leaves cycles as
/// they are.)
pub fn is_profile_estimate(so: &SessionOptions, oo: &OnnxOptions, c: &OnnxCompiled) -> bool {
    so.replicas == 1
        && so.techniques.available_memory_proportion.is_uniform()
        && oo.device_mapping.is_none()
        && c.imported.device_mapping.is_none()
        && c.target.plan.graph().stage_count() == 1
}

/// The profile read from a one-IPU estimate `e` of `c` (made with [`profile`]'s options: see
/// [`is_profile_estimate`]).
pub fn profile_of(c: &OnnxCompiled, e: &SystemEstimate) -> Profile {
    let rows = layer_rows(c, e);
    let mut p = Profile {
        names: rows.iter().map(|r| r.name.clone()).collect(),
        units: Vec::new(),
        costs: Vec::new(),
        weights: Vec::new(),
        nodes: rows.len(),
        head: None,
        block_starts: Vec::new(),
    };
    let table = c.head.as_ref().map(|h| h.table.index());
    for (i, (r, l)) in rows.iter().zip(&c.imported.layers).enumerate() {
        if l.end > l.first {
            if table.is_some_and(|t| l.first <= t && t < l.end) {
                p.head = Some((p.units.len(), head_cycles(c, e)));
            }
            p.units.push(i);
            p.costs.push(r.forward_cycles + r.backward_cycles);
            p.weights.push(r.weight_bytes);
        }
    }
    p.block_starts = block_starts(c, &p.units);
    p
}

/// Per unit (an ONNX node that computes, `units` its layer indices): whether the unit before
/// it ends a repeated block, where a stage may start. Graphcore's pipelined models are cut
/// between whole layers (PopTorch's `BeginBlock` around each encoder layer, PopART's
/// `layers_per_ipu`, TensorFlow's lists of layers per stage), and there one tensor crosses
/// to the next IPU and is stashed: the block ends are `auto` recomputation's checkpoints
/// ([`tessera_core::Graph::auto_checkpoints`]). Empty (a stage may start anywhere) for
/// inference, where there is no loss to find them from, and for models with no such point.
fn block_starts(c: &OnnxCompiled, units: &[usize]) -> Vec<bool> {
    let Some(loss) = c.loss else {
        return Vec::new();
    };
    let g = c.target.plan.graph();
    let Ok(ends) = g.auto_checkpoints(loss) else {
        return Vec::new();
    };
    let layers = &c.imported.layers;
    let mut out = vec![false; units.len()];
    for u in 1..units.len() {
        let prev = &layers[units[u - 1]];
        out[u] = ends
            .iter()
            .any(|e| prev.first <= e.index() && e.index() < prev.end);
    }
    if out.iter().any(|&b| b) {
        out[0] = true;
        out
    } else {
        Vec::new()
    }
}

/// The per-node stages of a partition of `p`'s units: nodes that made nothing go with the
/// next node that did.
fn stages_of(p: &Profile, part: &Partition) -> Vec<usize> {
    let mut stage_of_unit = vec![0usize; p.units.len()];
    for (s, w) in part.starts.iter().enumerate() {
        let end = part.starts.get(s + 1).copied().unwrap_or(p.units.len());
        for x in &mut stage_of_unit[*w..end] {
            *x = s;
        }
    }
    let mut out = vec![0usize; p.nodes];
    let mut u = p.units.len();
    let mut next = stage_of_unit.last().copied().unwrap_or(0);
    for i in (0..p.nodes).rev() {
        if u > 0 && p.units[u - 1] == i {
            u -= 1;
            next = stage_of_unit[u];
        }
        out[i] = next;
    }
    out
}

/// PopTorch's `layers_per_ipu` (Optimum Graphcore's too, and the runs of `"hid"` blocks in
/// Graphcore's TensorFlow BERT `pipeline_stages`): the stage boundaries, as ONNX node names
/// for [`Stages::After`], that put `counts[k]` repeated blocks (transformer layers, residual
/// blocks) on IPU `k`. The embeddings or the stem, which end where the first block starts, go
/// with the first IPU, so `[0, 4, 4, 4]` is Graphcore's BERT-Base phase-1 split (the
/// embeddings alone on IPU 0) and `[3, 7, 7, 7]` its BERT-Large one. The blocks are those
/// `--recompute-checkpoints auto` finds ([`tessera_core::Graph::auto_checkpoints`]): a stage
/// ends after a block's output. `compiled` is the model compiled as one stage; inference,
/// with no loss, finds the blocks from the model's first output.
///
/// # Errors
///
/// [`SessionError::Option`] naming `--layers-per-ipu`: no counts, more IPUs than a system
/// has, an IPU after the first with no block, counts that do not add up to the model's
/// blocks (the message gives how many it has), or a model without repeated blocks.
pub fn layers_per_ipu(
    compiled: &OnnxCompiled,
    counts: &[usize],
) -> Result<Vec<String>, SessionError> {
    const OPTION: &str = "--layers-per-ipu";
    if counts.is_empty() {
        return Err(opt_err(OPTION, "give one count per IPU".into()));
    }
    check_pipeline_ipus(counts.len()).map_err(|_| {
        opt_err(
            OPTION,
            format!(
                "{} IPUs are more than the largest IPU-POD system has ({})",
                counts.len(),
                tessera_sim::system::MAX_SYSTEM_IPUS
            ),
        )
    })?;
    if let Some(k) = counts.iter().skip(1).position(|&n| n == 0) {
        return Err(opt_err(
            OPTION,
            format!(
                "IPU {} would hold no layer; only the first IPU, which holds the embeddings or \
                 the stem, may have none",
                k + 1
            ),
        ));
    }
    let g = compiled.target.plan.graph();
    let end = match compiled.loss {
        Some(loss) => loss,
        None => compiled
            .imported
            .outputs
            .first()
            .map(|o| o.node)
            .ok_or_else(|| opt_err(OPTION, "the model has no output".into()))?,
    };
    let ends = g.auto_checkpoints(end)?;
    let blocks = ends.len().saturating_sub(1);
    if blocks == 0 {
        return Err(opt_err(
            OPTION,
            "the model has no repeated blocks (layers) to count; split it with \
             --pipeline-stages or --pipeline-ipus"
                .into(),
        ));
    }
    let total: usize = counts.iter().sum();
    if total != blocks {
        return Err(opt_err(
            OPTION,
            format!(
                "the counts add up to {total}, but the model has {blocks} repeated blocks \
                 (layers) after its embeddings or stem"
            ),
        ));
    }
    let mut names = Vec::with_capacity(counts.len() - 1);
    let mut at = 0;
    for &n in &counts[..counts.len() - 1] {
        at += n;
        let node = ends[at].index();
        let layer = compiled.imported.layer_of(node).ok_or_else(|| {
            opt_err(
                OPTION,
                format!(
                    "block {at} ends at graph node `{}`, which no ONNX node made",
                    g.node(ends[at]).name()
                ),
            )
        })?;
        names.push(layer.name.clone());
    }
    Ok(names)
}

/// Checks an IPU count for a split: at least one, at most the largest system's.
///
/// # Errors
///
/// [`SessionError::Option`] naming `--pipeline-ipus`.
pub fn check_pipeline_ipus(n: usize) -> Result<(), SessionError> {
    let max = tessera_sim::system::MAX_SYSTEM_IPUS;
    match n {
        0 => Err(opt_err("--pipeline-ipus", "must be at least 1".into())),
        n if n > max => Err(opt_err(
            "--pipeline-ipus",
            format!("{n} is more IPUs than the largest IPU-POD system has ({max})"),
        )),
        _ => Ok(()),
    }
}

/// Splits the imported model into `n` stages on `n` IPUs (see the module's documentation).
///
/// # Errors
///
/// [`SessionError::Option`] when the model has fewer nodes than stages or no split keeps
/// its weights under an IPU's memory (when a retry's smaller cap leaves no split, the best
/// attempt's split is returned instead); import and estimate errors as
/// [`compile_imported`].
pub fn split(
    og: &OnnxGraph<'_>,
    so: &SessionOptions,
    oo: &OnnxOptions,
    n: usize,
    profile: &Profile,
) -> Result<Split, SessionError> {
    check_pipeline_ipus(n)?;
    let machine = tessera_sim::machine::IpuConfig::preset(so.ipu);
    let sram = machine.sram_bytes_per_tile * u64::from(machine.tiles);
    let mut caps = vec![sram; n];
    let mut last: Option<Split> = None;
    let mut tried = 0;
    let mems = profile.state_bytes(so, oo);
    let costs = profile.costs(n);
    for attempt in 1..=RETRIES {
        // Whole blocks when a split of them keeps under the caps, else any node.
        let part = partition(&costs, &mems, &caps, &profile.block_starts)
            .or_else(|| partition(&costs, &mems, &caps, &[]));
        let Some(part) = part else {
            // A smaller cap left no split: the best attempt's split is the answer.
            if let Some(mut last) = last {
                last.info.tried = tried;
                return Ok(last);
            }
            return Err(no_split(profile, oo, n, sram));
        };
        let plan = Attempt {
            og,
            so,
            oo,
            profile,
            part: &part,
            ipus: n,
            costs: &costs,
            mems: &mems,
        };
        let (this, outlook) = plan.run(&caps, attempt, machine.sram_bytes_per_tile)?;
        tried = attempt;
        // Keep the attempt that fits, else the one whose fullest tile is smallest (a smaller
        // cap can move weights onto an IPU already full of activations).
        if outlook.fits
            || last
                .as_ref()
                .is_none_or(|l| fullest_tile(&this) < fullest_tile(l))
        {
            last = Some(this);
        }
        // A smaller cap moves weights from the IPUs that overflow to those with room: when
        // none has room no rebalancing makes the split fit, and when an IPU overflows without
        // its weights a rebalancing rarely does.
        if outlook.fits || n == 1 || !outlook.room || !outlook.movable {
            break;
        }
        // Each overflowing IPU's stage gets a cap a fifth below its weights (or its cap, when
        // that is lower): the stage must shed weights, and the layers that carry them go to
        // IPUs with room. The other stages keep their caps.
        for (k, i) in outlook.fullest.iter().enumerate() {
            if *i > machine.sram_bytes_per_tile {
                caps[k] = caps[k].min(outlook.stage_weight_bytes[k]) / 5 * 4;
            }
        }
    }
    last.map(|mut s| {
        s.info.tried = tried;
        s
    })
    .ok_or_else(|| opt_err("--pipeline-ipus", "no attempt was made".into()))
}

/// Why no split into `n` stages can be made: too few nodes that compute, or no split keeps
/// each stage's state under an IPU's `sram` bytes.
fn no_split(profile: &Profile, oo: &OnnxOptions, n: usize, sram: u64) -> SessionError {
    let what = if oo.inference {
        "weights"
    } else {
        "weights and their training state"
    };
    opt_err(
        "--pipeline-ipus",
        if profile.costs.len() < n {
            format!(
                "the model has {} nodes that compute; it cannot fill {n} stages",
                profile.costs.len()
            )
        } else {
            format!(
                "no split into {n} stages keeps each stage's {what} under {sram} bytes (an IPU's memory); try more IPUs"
            )
        },
    )
}

/// One attempt of an automatic split: a partition of the profile's units into stages.
struct Attempt<'a, 'm> {
    og: &'a OnnxGraph<'m>,
    so: &'a SessionOptions,
    oo: &'a OnnxOptions,
    profile: &'a Profile,
    part: &'a Partition,
    /// The IPUs (stages) it splits into.
    ipus: usize,
    /// Each unit's cycles.
    costs: &'a [u64],
    /// Each unit's weights (and training state) in bytes.
    mems: &'a [u64],
}

/// What an attempt's estimate says about the next.
struct Outlook {
    /// Every IPU fits.
    fits: bool,
    /// Some IPU's fullest tile has room.
    room: bool,
    /// Moving weights alone could make every IPU fit.
    movable: bool,
    /// Each IPU's fullest tile in bytes.
    fullest: Vec<u64>,
    /// Each stage's weights (and training state) in bytes.
    stage_weight_bytes: Vec<u64>,
}

impl Attempt<'_, '_> {
    /// The split the partition makes, compiled and estimated (attempt `attempt`, under the
    /// stage caps `caps`), and its outlook on tiles of `tile_sram` bytes.
    fn run(
        &self,
        caps: &[u64],
        attempt: usize,
        tile_sram: u64,
    ) -> Result<(Split, Outlook), SessionError> {
        let (profile, part, n) = (self.profile, self.part, self.ipus);
        let per = OnnxOptions {
            stages: Stages::PerNode(stages_of(profile, part)),
            device_mapping: None,
            ..self.oo.clone()
        };
        let compiled = compile_imported(self.og, self.so, &per)?;
        let estimate = compiled.target.estimate()?;
        let boundaries = (part.starts.iter().skip(1))
            .map(|&s| profile.names[profile.units[s] - 1].clone())
            .collect();
        let sums = |v: &[u64]| -> Vec<u64> {
            (0..n)
                .map(|s| {
                    let a = part.starts[s];
                    let b = part.starts.get(s + 1).copied().unwrap_or(v.len());
                    v[a..b].iter().sum()
                })
                .collect()
        };
        let over = |i: &&tessera_sim::system::IpuRow| i.max_tile_bytes > tile_sram;
        let outlook = Outlook {
            fits: estimate.fits,
            room: estimate.ipus.iter().any(|i| i.max_tile_bytes <= tile_sram),
            // Each overflowing IPU's fullest tile is within the SRAM without its always-live
            // bytes (a heuristic, see the module's documentation).
            movable: estimate.ipus.iter().filter(over).all(|i| {
                i.fullest_tiles
                    .first()
                    .is_none_or(|t| t.total().saturating_sub(t.always_live) <= tile_sram)
            }),
            fullest: (0..n)
                .map(|k| estimate.ipus.get(k).map_or(0, |i| i.max_tile_bytes))
                .collect(),
            stage_weight_bytes: sums(self.mems),
        };
        let info = SplitInfo {
            ipus: n,
            boundaries,
            stage_cycles: sums(self.costs),
            stage_weight_bytes: outlook.stage_weight_bytes.clone(),
            cap_bytes: caps.to_vec(),
            attempts: attempt,
            tried: attempt,
        };
        let split = Split {
            compiled,
            estimate,
            info,
        };
        Ok((split, outlook))
    }
}

/// The bytes the fullest tile of a split's IPUs needs.
fn fullest_tile(s: &Split) -> Option<u64> {
    s.estimate.ipus.iter().map(|i| i.max_tile_bytes).max()
}

/// The least share by which doubling the IPUs must shrink the fullest tile for the search to
/// go on doubling: when twice the IPUs leave the fullest tile above this share of what it
/// was, its peak is in something a pipeline split does not divide (one node's activations or
/// weights), and more IPUs will not make it fit. (Estimate: a split into twice the stages
/// halves each stage's weights and stashes; 10% allows for code and buffers that do not.)
pub const STOP_SHRINK: f64 = 0.9;

/// How many more IPUs than the fullest tile's trend predicts the search's growing steps try, so
/// that the step most likely fits and the narrowing that follows is short (an estimate).
pub const GROWTH_MARGIN: f64 = 1.1;

/// The least a growing step multiplies the IPUs by (an estimate: short steps would make many
/// estimates where the fullest tile's trend is a poor guide).
pub const MIN_GROWTH: f64 = 1.25;

/// What the fewest-IPUs search found.
pub struct FewestIpus {
    /// The split on the fewest IPUs that fits, if any.
    pub split: Option<Split>,
    /// The most IPUs tried.
    pub tried_up_to: usize,
    /// Why the search stopped before [`MAX_IPUS`] without a fit, when it did.
    pub stopped: Option<String>,
    /// When splits on some IPU counts could not run (the accumulation count asked for is
    /// not a multiple of their schedule's overlap): the fewest such IPUs, and why.
    pub unrunnable: Option<(usize, String)>,
}

/// The fewest IPUs (up to [`MAX_IPUS`]) on which an automatic split fits: growing, then
/// narrowing between the last that did not fit and the first that did. Each growing step
/// doubles the IPUs, or takes fewer (at least [`MIN_GROWTH`] times as many) when the fullest
/// tile's shrink over the last two steps, modelled as `a + b / n` bytes, reaches the tile's
/// SRAM sooner ([`GROWTH_MARGIN`] beyond that); each narrowing step probes where that model meets the SRAM between the two ends,
/// or the midpoint after a probe that left more than half. The result is the same as
/// bisection's (the fewest IPUs that fit, as fitting is taken to hold for more IPUs), in
/// fewer estimates. The growing stops early when, against the latest estimate on at most half
/// the IPUs, the fullest tile has not shrunk below [`STOP_SHRINK`] of what it was per doubling:
/// splitting further would not make the model fit. Before it stops short of the limit it tries
/// the limit once: a split's plateau (the same layers on the fullest stage over a few more
/// IPUs) can end just before it.
///
/// `options_for(n)` gives the session options of a split on `n` IPUs: those the same command
/// with `--pipeline-ipus n` would use (its defaults can depend on the stages: micro-batches
/// enough to fill the pipeline, optimizer state offloaded), so that the split found is the
/// one the user gets by asking for it.
///
/// `known` is an estimate already made that did not fit: its IPUs (one, or an automatic split
/// on that many) and its fullest tile's bytes. The growing starts from it instead of from one
/// IPU, as the narrowing already takes fewer IPUs never to fit where more do not.
///
/// When the accumulation count asked for does not suit every IPU count's schedule, the fewest
/// IPUs that fit are found by bisection over the counts whose schedule takes it (which
/// ones can run is not monotone in the IPUs), and the first that cannot is reported.
///
/// # Errors
///
/// As [`split`], except that splits that cannot be made (an option out of range on that
/// many IPUs) count as not fitting.
pub fn fewest_ipus(
    og: &OnnxGraph<'_>,
    options_for: &dyn Fn(usize) -> SessionOptions,
    oo: &OnnxOptions,
    profile: &Profile,
    known: Option<(usize, u64)>,
) -> Result<FewestIpus, SessionError> {
    // The split on n IPUs, and its fullest tile's bytes when it was made.
    let try_n = |n: usize| -> Result<(Option<Split>, Option<u64>), SessionError> {
        match split(og, &options_for(n), oo, n, profile) {
            Ok(s) => {
                let worst = fullest_tile(&s);
                Ok((s.estimate.fits.then_some(s), worst))
            }
            Err(SessionError::Option { .. }) => Ok((None, None)),
            Err(e) => Err(e),
        }
    };
    let limit = MAX_IPUS.min(profile.costs.len());
    let sram = tessera_sim::machine::IpuConfig::preset(options_for(1).ipu).sram_bytes_per_tile;
    // A split on n IPUs runs only when its schedule takes the accumulation count (Grouped
    // needs a multiple of twice the stages). That is not monotone in n (M = 32 runs on 2, 4,
    // 8 and 16 IPUs, not on 3), which the search assumes of fitting: when some counts cannot
    // run, the fewest that fit is found by bisection over the counts that can.
    // The same check the system estimate makes of the split's n stages: only counts it
    // passes are estimated.
    let runs: Vec<(usize, Result<(), String>)> = (2..=limit)
        .map(|n| {
            let so = options_for(n);
            let check = tessera_core::schedule::Pipeline::with_rule(
                profile.pipeline_stages(n),
                so.gradient_accumulation_count,
                so.schedule,
                !oo.inference,
                ONNX_ACCUMULATION_RULE,
            );
            (n, check.map(|_| ()).map_err(|e| e.to_string()))
        })
        .collect();
    let first_unrunnable = runs
        .iter()
        .find_map(|(n, r)| r.as_ref().err().map(|why| (*n, why.clone())));
    let (split, tried_up_to, stopped) = if first_unrunnable.is_some() {
        let counts: Vec<usize> = runs
            .iter()
            .filter(|(n, r)| r.is_ok() && known.is_none_or(|(k, _)| *n > k))
            .map(|&(n, _)| n)
            .collect();
        bisect(&counts, &mut |n| try_n(n).map(|r| r.0))?
    } else {
        search::<Split, SessionError>(limit, sram, known, &mut |n| try_n(n))?
    };
    Ok(FewestIpus {
        split,
        tried_up_to,
        stopped,
        unrunnable: first_unrunnable,
    })
}

/// The fitting result on the fewest of `counts` (IPU counts, increasing), by bisection, with
/// `try_n(n)` giving the result on `n` IPUs when it fits: the largest is tried first, and
/// when it does not fit, none is taken to. Returns it, the most IPUs tried, and no reason
/// to stop early.
fn bisect<T, E>(
    counts: &[usize],
    try_n: &mut dyn FnMut(usize) -> Result<Option<T>, E>,
) -> Result<Searched<T>, E> {
    let Some(&top) = counts.last() else {
        return Ok((None, 0, None));
    };
    let Some(mut best) = try_n(top)? else {
        return Ok((None, top, None));
    };
    // counts[hi] fits; every count before `lo` (exclusive) was found not to, or not tried.
    let (mut lo, mut hi) = (0usize, counts.len() - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        match try_n(counts[mid])? {
            Some(s) => {
                best = s;
                hi = mid;
            }
            None => lo = mid + 1,
        }
    }
    Ok((Some(best), top, None))
}

/// What [`search`] returns: the fitting result on the fewest IPUs if any, the most IPUs
/// tried, and why the growing stopped early.
type Searched<T> = (Option<T>, usize, Option<String>);

/// The search of [`fewest_ipus`] over IPU counts up to `limit`, with `try_n(n)` giving the
/// result on `n` IPUs when it fits and its fullest tile's bytes when known.
fn search<T, E>(
    limit: usize,
    sram: u64,
    known: Option<(usize, u64)>,
    try_n: &mut dyn FnMut(usize) -> Result<(Option<T>, Option<u64>), E>,
) -> Result<Searched<T>, E>
where
    T: FullestTile,
{
    let known = known.filter(|&(n, _)| n >= 1 && n < limit);
    let first = known.map_or(1, |(n, _)| n);
    let (mut lo, mut found, mut tried, mut stopped) = (first, None, first, None);
    let mut previous: Option<(usize, u64)> = known;
    // Every estimate made so far that did not fit, with its fullest tile.
    let mut tried_points: Vec<(usize, u64)> = known.into_iter().collect();
    let mut n = (2 * first).min(limit);
    while n >= 2 && n <= limit {
        tried = n;
        let (fit, worst) = try_n(n)?;
        if let Some(s) = fit {
            found = Some((n, s));
            break;
        }
        // The next step: doubling, or fewer IPUs when the fullest tile's shrink so far, modelled
        // as `a + b / n`, says fewer fit (with `GROWTH_MARGIN` to spare).
        let mut next = 2 * n;
        if let Some(w) = worst {
            // Against the latest estimate on at most half the IPUs: twice the IPUs (or more)
            // must shrink the fullest tile below STOP_SHRINK of what it was, by as much in
            // proportion (STOP_SHRINK ^ log2(n / pn)). Comparing across a doubling, not a
            // shorter step, keeps a split's plateaus (the same layers per stage on a few more
            // IPUs) from stopping the search.
            if let Some(&(pn, pw)) = tried_points.iter().rev().find(|&&(pn, _)| 2 * pn <= n) {
                let expected = STOP_SHRINK.powf((n as f64 / pn as f64).log2());
                if w as f64 > expected * pw as f64 {
                    if n < limit {
                        // A plateau can end before the limit (a stage losing its last extra
                        // layer): the limit is tried once before the search gives up.
                        previous = Some((n, w));
                        tried_points.push((n, w));
                        lo = n;
                        n = limit;
                        continue;
                    }
                    stopped = Some(format!(
                        "the fullest tile needs {w} bytes on {n} IPUs against {pw} on {pn}: more IPUs do not shrink it"
                    ));
                    break;
                }
            }
            if let Some((pn, pw)) = previous {
                if let Some(m) = interpolate_ipus((pn, pw), (n, w), sram) {
                    let least = (n + 1).max((n as f64 * MIN_GROWTH).ceil() as usize);
                    next = ((m as f64 * GROWTH_MARGIN).ceil() as usize).clamp(least, 2 * n);
                }
            }
            previous = Some((n, w));
            tried_points.push((n, w));
        }
        lo = n;
        // The limit itself is the last step.
        n = if n == limit { n + 1 } else { next.min(limit) };
    }
    let Some((mut hi, mut best)) = found else {
        return Ok((None, tried, stopped));
    };
    // Narrowing (lo never fits, hi does): each probe is where the fullest tile, modelled as
    // `a + b / n` through the two ends, meets the tile's SRAM; a probe that leaves more than
    // half the interval is followed by a midpoint, so it takes at most twice bisection's probes.
    let mut worst_lo = previous.filter(|&(n, _)| n == lo).map(|(_, w)| w);
    let mut worst_hi = best.fullest_tile();
    let mut halve = false;
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        let probe = match (worst_lo, worst_hi) {
            (Some(wl), Some(wh)) if !halve => {
                interpolate_ipus((lo, wl), (hi, wh), sram).map_or(mid, |n| n.clamp(lo + 1, hi - 1))
            }
            _ => mid,
        };
        let width = hi - lo;
        let (fit, worst) = try_n(probe)?;
        match fit {
            Some(s) => {
                hi = probe;
                worst_hi = worst;
                best = s;
            }
            None => {
                lo = probe;
                worst_lo = worst;
            }
        }
        halve = !halve && 2 * (hi - lo) > width;
    }
    Ok((Some(best), tried, None))
}

/// A search result's fullest tile, when it has one.
trait FullestTile {
    fn fullest_tile(&self) -> Option<u64>;
}

impl FullestTile for Split {
    fn fullest_tile(&self) -> Option<u64> {
        fullest_tile(self)
    }
}

/// The IPUs at which a fullest tile modelled as `a + b / n` through `(n0, w0)` and `(n1, w1)`
/// (`n0 < n1`, `w0 > w1`) comes down to `sram` bytes, rounded up; `None` when the two points
/// do not describe such a curve.
fn interpolate_ipus((n0, w0): (usize, u64), (n1, w1): (usize, u64), sram: u64) -> Option<usize> {
    if n0 >= n1 || w0 <= w1 || w0 <= sram {
        return None;
    }
    let (n0, n1, w0, w1, sram) = (n0 as f64, n1 as f64, w0 as f64, w1 as f64, sram as f64);
    // w0 - w1 = b (1/n0 - 1/n1); a = w1 - b / n1.
    let b = (w0 - w1) / (1.0 / n0 - 1.0 / n1);
    let a = w1 - b / n1;
    if sram <= a {
        return None;
    }
    let n = (b / (sram - a)).ceil();
    (n.is_finite() && n >= 1.0).then_some(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A search result that is only its IPU count and fullest tile.
    #[derive(Debug)]
    struct Fit(usize, u64);

    impl FullestTile for Fit {
        fn fullest_tile(&self) -> Option<u64> {
            Some(self.1)
        }
    }

    /// The search as it was: doubling (with the same stop rule, across doublings), then
    /// bisecting. The reference the faster search must agree with.
    fn doubling_then_bisecting(limit: usize, sram: u64, f: &dyn Fn(usize) -> u64) -> Option<usize> {
        let (mut lo, mut prev, mut n) = (1, f(1), 2);
        let mut hi = None;
        while n <= limit {
            let w = f(n);
            if w <= sram {
                hi = Some(n);
                break;
            }
            if w as f64 > STOP_SHRINK * prev as f64 {
                return None;
            }
            (lo, prev) = (n, w);
            n = if n == limit {
                n + 1
            } else {
                (2 * n).min(limit)
            };
        }
        let mut hi = hi?;
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if f(mid) <= sram {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(hi)
    }

    proptest::proptest! {
        /// On fullest tiles that fall in steps as the IPUs grow (a split's plateaus: `a + b x
        /// ceil(layers / n)`), the search finds the fewest IPUs the doubling-and-bisecting
        /// search found, starting from one IPU that did not fit, and nothing but the fewest
        /// where that search gave up.
        #[test]
        fn the_search_finds_what_doubling_and_bisecting_found(
            a in 0u64..400,
            b in 1u64..400,
            layers in 1usize..120,
            sram in 100u64..2000,
            limit in 2usize..64,
        ) {
            let f = |n: usize| a + b * layers.div_ceil(n) as u64;
            proptest::prop_assume!(f(1) > sram);
            let want = doubling_then_bisecting(limit, sram, &f);
            let mut tries = 0;
            let got = search::<Fit, ()>(limit, sram, Some((1, f(1))), &mut |n| {
                tries += 1;
                let w = f(n);
                Ok(((w <= sram).then_some(Fit(n, w)), Some(w)))
            })
            .unwrap();
            // It finds what the reference found; where the reference's stop rule gave up, it
            // may go on to the limit (a plateau ending there), and what it finds is the
            // fewest IPUs that fit (the fullest tile falls with the IPUs here).
            let got = got.0.map(|Fit(n, _)| n);
            let fewest = (1..=limit).find(|&n| f(n) <= sram);
            match want {
                Some(_) => proptest::prop_assert_eq!(got, want),
                None => proptest::prop_assert!(got.is_none() || got == fewest, "{got:?} vs {fewest:?}"),
            }
            // At most a few more estimates than bisection over the limit would make.
            proptest::prop_assert!(tries <= 4 * (usize::BITS - limit.leading_zeros()) as usize + 4, "{tries}");
        }
    }

    #[test]
    fn interpolation_finds_where_a_tile_falls_under_its_sram() {
        // a = 100, b = 1600: 200 at 16 IPUs, 150 at 32; 180 is reached at 20.
        assert_eq!(interpolate_ipus((16, 200), (32, 150), 180), Some(20));
        // Exactly on a point.
        assert_eq!(interpolate_ipus((16, 200), (32, 150), 150), Some(32));
        // No such curve: growing tiles, an end already under, or a floor above the SRAM.
        assert_eq!(interpolate_ipus((16, 150), (32, 200), 180), None);
        assert_eq!(interpolate_ipus((16, 170), (32, 150), 180), None);
        assert_eq!(interpolate_ipus((16, 200), (32, 190), 170), None);
    }

    #[test]
    fn balances_and_respects_the_cap() {
        let p = partition(&[5, 1, 1, 5, 1, 1], &[1; 6], &[10, 10], &[]).unwrap();
        assert_eq!(p.starts, vec![0, 3]);
        assert_eq!(p.max_cost, 7);
        // Memory forces the cut earlier than cycles want.
        let p = partition(&[1, 1, 1, 1], &[5, 5, 1, 1], &[7, 7], &[]).unwrap();
        assert_eq!(p.starts, vec![0, 1]);
        assert_eq!(partition(&[1, 1], &[5, 5], &[4, 4], &[]), None);
        assert_eq!(partition(&[1], &[1], &[4, 4], &[]), None);
    }
}
