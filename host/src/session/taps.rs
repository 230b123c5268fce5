//! Taps: which tensors each outfeed reads during a weight update, and how a micro-batch's
//! taps become one outfeed element the moment its last tap has run, as the device would
//! enqueue it.

use std::collections::BTreeMap;

use tessera_core::{NodeId, Plan, Roles};
use tessera_sim::runner::Observe;

use super::run::TrainOptions;
use crate::compile::{Compiled, Heap, SessionError};
use crate::inspect::{GradientOutfeedMode, MaybeOutfeedQueue};
use crate::outfeed::{Element, HostTensor, OutfeedMode, OutfeedQueue};

/// The outfeed queues of a training session, in callback order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Queue {
    /// Gradients (BEFORE_APPLY or AFTER_COMPUTE).
    Gradients = 0,
    /// Plain `outfeed` layers.
    Plain = 1,
    /// `maybe_outfeed` layers (filtered).
    Maybe = 2,
}

impl Queue {
    /// Every queue, in callback order.
    pub(super) const ALL: [Queue; 3] = [Queue::Gradients, Queue::Plain, Queue::Maybe];

    /// The callback that reports the queue at an epoch's end (the seeds' names).
    pub(super) fn callback(self) -> &'static str {
        match self {
            Queue::Gradients => "Gradients callback",
            Queue::Plain => "Single layer activations callback",
            Queue::Maybe => "Multi-layer activations callback",
        }
    }
}

/// What the observe hook does with a node.
#[derive(Clone, Debug)]
enum Watch {
    Loss,
    Tap(Queue, String),
}

/// One update's taps, indexed `[micro_batch][replica]`.
type PerMicroBatch = Vec<Vec<BTreeMap<String, HostTensor>>>;

/// Where to look during a weight update, and the queues the taps go to.
pub(super) struct Taps {
    ids: Vec<NodeId>,
    watch: Vec<Option<Watch>>,
    /// The last watched node of each queue: its micro-batch is complete once it has run.
    last_watched: [usize; 3],
    /// BEFORE_APPLY gradients: (key, accumulator).
    accumulators: Vec<(String, NodeId)>,
    grads: MaybeOutfeedQueue,
    plain: OutfeedQueue,
    maybe: MaybeOutfeedQueue,
    /// Whether the model has plain / maybe outfeed layers (else their callbacks are silent).
    has_plain: bool,
    has_maybe: bool,
    replicas: usize,
}

fn queue(
    name: &str,
    options: &TrainOptions,
    replicas: usize,
) -> Result<OutfeedQueue, SessionError> {
    Ok(OutfeedQueue::new(
        name,
        OutfeedMode::All,
        options.buffer_depth,
        replicas,
    )?)
}

impl Taps {
    /// Finds the loss, the tapped layers and the gradients the filters keep.
    pub(super) fn new(c: &Compiled, options: &TrainOptions) -> Result<Self, SessionError> {
        let replicas = c.target.options.replicas;
        let g = c.target.plan.graph();
        let mut watch: Vec<Option<Watch>> = vec![None; g.len()];
        watch[c.loss.index()] = Some(Watch::Loss);
        for (name, id, _) in &c.built.outfeeds {
            watch[id.index()] = Some(Watch::Tap(Queue::Plain, name.clone()));
        }
        let maybe = MaybeOutfeedQueue::new(
            queue("multi_activations_outfeed", options, replicas)?,
            options.activations_filters.clone(),
        );
        for (name, id, _) in &c.built.maybe_outfeeds {
            if maybe.keeps(name) {
                watch[id.index()] = Some(Watch::Tap(Queue::Maybe, name.clone()));
            }
        }
        let grads = MaybeOutfeedQueue::new(
            queue("optimizer_outfeed", options, replicas)?,
            options.gradients_filters.clone(),
        );
        let mut accumulators = Vec::new();
        for n in g.nodes() {
            let key = format!("{}_grad", n.name());
            if !n.roles().contains(Roles::TRAINABLE) || !grads.keeps(&key) {
                continue;
            }
            match options.gradient_outfeed_mode {
                GradientOutfeedMode::AfterCompute => {
                    let id = g.find(&key)?;
                    watch[id.index()] = Some(Watch::Tap(Queue::Gradients, key));
                }
                GradientOutfeedMode::BeforeApply => {
                    let id = g.find(&format!("{}/accumulator", n.name()))?;
                    accumulators.push((key, id));
                }
            }
        }
        let mut last_watched = [usize::MAX; 3];
        for (i, w) in watch.iter().enumerate() {
            if let Some(Watch::Tap(q, _)) = w {
                last_watched[*q as usize] = i;
            }
        }
        Ok(Taps {
            ids: g.ids().collect(),
            watch,
            last_watched,
            accumulators,
            grads,
            plain: queue("activations_outfeed", options, replicas)?,
            maybe,
            has_plain: !c.built.outfeeds.is_empty(),
            has_maybe: !c.built.maybe_outfeeds.is_empty(),
            replicas,
        })
    }

    /// The nodes whose outputs the observe hook reads (the loss and every tap).
    pub(super) fn observed(&self) -> Vec<usize> {
        (0..self.watch.len())
            .filter(|&i| self.watch[i].is_some())
            .collect()
    }

    /// A queue.
    pub(super) fn queue(&self, q: Queue) -> &OutfeedQueue {
        match q {
            Queue::Gradients => self.grads.queue(),
            Queue::Plain => &self.plain,
            Queue::Maybe => self.maybe.queue(),
        }
    }

    /// Whether a queue's callback reports anything (the model has layers feeding it).
    pub(super) fn reports(&self, q: Queue) -> bool {
        match q {
            Queue::Gradients => true,
            Queue::Plain => self.has_plain,
            Queue::Maybe => self.has_maybe,
        }
    }

    /// Fresh per-update buffers.
    pub(super) fn update(&self) -> UpdateTaps<'_> {
        UpdateTaps {
            taps: self,
            pending: Default::default(),
            before: vec![BTreeMap::new(); self.replicas],
            loss_sum: 0.0,
            loss_n: 0,
        }
    }
}

/// A tensor of the plan, copied to the host in one pass over its bytes.
pub(super) fn read(
    plan: &Plan<Heap>,
    id: NodeId,
    arena: &[u8],
    state: &[u8],
) -> Result<HostTensor, SessionError> {
    let view = plan.tensor(id, arena, state)?;
    let shape = view.shape().dims().iter().map(|&d| d as usize).collect();
    let mut data = vec![0f32; view.len()];
    view.copy_to(&mut data);
    Ok(HostTensor { shape, data })
}

/// The first element of a tensor of the plan (the loss), without copying the rest.
pub(super) fn read_first(
    plan: &Plan<Heap>,
    id: NodeId,
    arena: &[u8],
    state: &[u8],
) -> Result<f32, SessionError> {
    let mut first = [f32::NAN];
    plan.tensor(id, arena, state)?.copy_to(&mut first);
    Ok(first[0])
}

/// One weight update's taps in flight, and the loss seen so far.
pub(super) struct UpdateTaps<'a> {
    taps: &'a Taps,
    pending: [PerMicroBatch; 3],
    before: Vec<BTreeMap<String, HostTensor>>,
    /// Sum of the micro-batches' losses.
    pub(super) loss_sum: f64,
    /// Micro-batches (x replicas) summed.
    pub(super) loss_n: u64,
}

impl UpdateTaps<'_> {
    /// The runner's observe hook: reads taps, and enqueues a micro-batch's element once its
    /// last tap of a queue has run on the last replica.
    pub(super) fn observe(
        &mut self,
        point: Observe,
        plan: &Plan<Heap>,
        arena: &[u8],
        state: &[u8],
    ) -> Result<(), SessionError> {
        let t = self.taps;
        match point {
            Observe::Node {
                replica,
                micro_batch,
                node,
            } => match &t.watch[node] {
                None => Ok(()),
                Some(Watch::Loss) => {
                    self.loss_sum += f64::from(read_first(plan, t.ids[node], arena, state)?);
                    self.loss_n += 1;
                    Ok(())
                }
                Some(Watch::Tap(q, key)) => {
                    let slots = &mut self.pending[*q as usize];
                    if slots.len() <= micro_batch {
                        slots.resize(micro_batch + 1, vec![BTreeMap::new(); t.replicas]);
                    }
                    let value = read(plan, t.ids[node], arena, state)?;
                    slots[micro_batch][replica].insert(key.clone(), value);
                    if node == t.last_watched[*q as usize] && replica + 1 == t.replicas {
                        let maps = std::mem::take(&mut slots[micro_batch]);
                        self.enqueue(*q, maps)?;
                    }
                    Ok(())
                }
            },
            Observe::BeforeUpdate { replica } => {
                for (k, id) in &t.accumulators {
                    self.before[replica].insert(k.clone(), read(plan, *id, arena, state)?);
                }
                if replica + 1 == t.replicas {
                    let maps = std::mem::take(&mut self.before);
                    self.before = vec![BTreeMap::new(); t.replicas];
                    self.enqueue(Queue::Gradients, maps)?;
                }
                Ok(())
            }
        }
    }

    fn enqueue(
        &self,
        q: Queue,
        maps: Vec<BTreeMap<String, HostTensor>>,
    ) -> Result<(), SessionError> {
        let t = self.taps;
        match q {
            Queue::Gradients => t.grads.maybe_enqueue(maps).map(drop)?,
            Queue::Plain => t
                .plain
                .enqueue(maps.into_iter().map(Element::Map).collect())
                .map(drop)?,
            Queue::Maybe => t.maybe.maybe_enqueue(maps).map(drop)?,
        }
        Ok(())
    }
}
