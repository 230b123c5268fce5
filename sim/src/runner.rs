//! Running a pipelined, replicated graph's numerics in schedule order: every micro-batch has
//! its own activation arena (its stash), each stage's forward and backward slots run when the
//! schedule says, gradients accumulate as the backward slots finish, and once all
//! micro-batches are through, the replicas average their accumulated gradients (the
//! all-reduce) and every replica applies the same update.
//!
//! Inference plans (no backward pass) run the forward slots of the inference schedule only:
//! one "update" is then M micro-batches through the pipeline, with nothing to reduce or apply.
//! A plain (non-accumulating) training plan on one stage and one replica runs every node in
//! plan order, updates included: the one-stage engine of a single IPU.

use tessera_core::kernels::{Parallel, Serial};
use tessera_core::ops::update::Update;
use tessera_core::schedule::{Pipeline, Schedule, Slot};
use tessera_core::{NodeId, Op, Plan, Roles, RunError, Storage};

use crate::system::SystemError;
use crate::threads::Threads;

/// A point in a weight update where [`PipelineRunner::run_update_observed`] lets the caller
/// look at tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observe {
    /// Node `node` (graph index) has just run for `micro_batch` on `replica`: its output is in
    /// that micro-batch's arena until a later node reuses the bytes (except a product summed
    /// straight into its accumulator, see [`PipelineRunner::fuse_accumulation`]).
    Node {
        /// The replica.
        replica: usize,
        /// The micro-batch.
        micro_batch: usize,
        /// The node.
        node: usize,
    },
    /// All micro-batches are through and the replicas' accumulators are averaged: the update
    /// is about to run on `replica` (accumulators hold what it will apply).
    BeforeUpdate {
        /// The replica.
        replica: usize,
    },
}

/// One replica's buffers.
struct Replica {
    state: Vec<u8>,
    arenas: Vec<Vec<u8>>,
}

/// Runs a training plan's weight updates in pipeline-schedule order on `replicas` replicas.
pub struct PipelineRunner<S: Storage> {
    plan: Plan<S>,
    pipeline: Pipeline,
    replicas: Vec<Replica>,
    forward: Vec<Vec<usize>>,
    backward: Vec<Vec<usize>>,
    update: Vec<usize>,
    accumulators: Vec<NodeId>,
    stash_observed: Vec<usize>,
    threads: bool,
    /// Per node, how it runs ([`PipelineRunner::fuse_accumulation`]; empty: all alone).
    fusion: Vec<Fusion>,
}

/// How the runner runs a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fusion {
    /// On its own.
    Alone,
    /// A product run with accumulate node `.0`, straight into the accumulator.
    WithAccumulation(usize),
    /// An accumulation that runs with its product.
    WithProduct,
}

impl<S: Storage> PipelineRunner<S> {
    /// Checks the plan's stages against the schedule and makes the buffers: one arena per
    /// micro-batch and replica. Stages must follow the graph's order (each forward node's
    /// stage at least the one before it), as a pipeline's layers do. An inference plan runs
    /// one micro-batch per call (see [`PipelineRunner::inference`] for more).
    pub fn new(plan: Plan<S>, schedule: Schedule, replicas: usize) -> Result<Self, SystemError> {
        Self::with_positions(plan, schedule, replicas, None)
    }

    /// An inference plan (forward pass only) run `micro_batches` at a time per replica in the
    /// inference schedule, as a pipelined model's `predict` runs on IPUs.
    pub fn inference(
        plan: Plan<S>,
        schedule: Schedule,
        replicas: usize,
        micro_batches: usize,
    ) -> Result<Self, SystemError> {
        Self::build(plan, schedule, replicas, None, micro_batches)
    }

    /// [`PipelineRunner::new`] with concurrent stages: `positions[k]` is stage k's pipeline
    /// position (see [`crate::system::SystemOptions::stage_positions`]).
    pub fn with_positions(
        plan: Plan<S>,
        schedule: Schedule,
        replicas: usize,
        positions: Option<&[usize]>,
    ) -> Result<Self, SystemError> {
        Self::build(plan, schedule, replicas, positions, 1)
    }

    fn build(
        plan: Plan<S>,
        schedule: Schedule,
        replicas: usize,
        positions: Option<&[usize]>,
        inference_micro_batches: usize,
    ) -> Result<Self, SystemError> {
        if replicas == 0 {
            return Err(SystemError::NoReplicas);
        }
        let g = plan.graph();
        let training = g.is_training();
        let stages = g.stage_count();
        // A plain training plan runs in plan order on one stage: its updates are interleaved
        // with the backward pass, so they cannot wait for other micro-batches or replicas.
        let plain = training && !g.is_accumulating();
        if plain && (stages > 1 || replicas > 1) {
            return Err(SystemError::NotAccumulating);
        }
        let pos: Vec<usize> = positions.map_or_else(|| (0..stages).collect(), <[usize]>::to_vec);
        if pos.len() != stages {
            return Err(SystemError::Positions {
                detail: format!("{} positions for {stages} stages", pos.len()),
            });
        }
        let s = pos.iter().copied().max().unwrap_or(0) + 1;
        let m = if !training {
            inference_micro_batches
        } else if plain {
            1
        } else {
            g.accumulation_count() as usize
        };
        let pipeline = Pipeline::new(s, m, schedule, training).map_err(SystemError::Schedule)?;
        let fl = g.forward_len();
        let (mut forward, mut backward) = (vec![Vec::new(); s], vec![Vec::new(); s]);
        let mut update = Vec::new();
        let mut accumulators = Vec::new();
        let (mut last_f, mut last_b) = (0usize, usize::MAX);
        for (id, n) in g.ids().zip(g.nodes()) {
            let (i, k) = (id.index(), pos[n.stage()]);
            if n.roles().contains(Roles::ACCUMULATOR) && n.dtype().is_float() {
                accumulators.push(id);
            }
            if n.op().is_state() || matches!(n.op(), Op::Input) {
                continue;
            }
            if n.roles().contains(Roles::UPDATE) && !plain {
                update.push(i);
            } else if i < fl || !training {
                if k < last_f {
                    return Err(SystemError::StagesOutOfOrder {
                        node: n.name().to_string(),
                        stage: k,
                        after: last_f,
                    });
                }
                last_f = k;
                forward[k].push(i);
            } else if matches!(n.op(), Op::Update(Update::Increment { .. })) {
                // A stage's micro-batch counter: state only, placed after the whole backward
                // pass; it runs at the end of its stage's backward slot.
                backward[k].push(i);
            } else {
                if k > last_b {
                    return Err(SystemError::StagesOutOfOrder {
                        node: n.name().to_string(),
                        stage: k,
                        after: last_b,
                    });
                }
                last_b = k;
                backward[k].push(i);
            }
        }
        let reps = (0..replicas)
            .map(|_| Replica {
                state: vec![0; plan.state_bytes()],
                arenas: vec![vec![0; plan.arena_bytes()]; m],
            })
            .collect();
        Ok(PipelineRunner {
            plan,
            pipeline,
            replicas: reps,
            forward,
            backward,
            update,
            accumulators,
            stash_observed: vec![0; s],
            threads: false,
            fusion: Vec::new(),
        })
    }

    /// The plan.
    pub fn plan(&self) -> &Plan<S> {
        &self.plan
    }

    /// The pipeline.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Initialises every replica's state from `seed` (replicas start identical).
    pub fn init_state(&mut self, seed: u64) -> Result<(), RunError> {
        for r in &mut self.replicas {
            self.plan.init_state(&mut r.state, seed)?;
        }
        Ok(())
    }

    /// A replica's state (weights, optimizer state, accumulators).
    pub fn state(&self, replica: usize) -> &[u8] {
        &self.replicas[replica].state
    }

    /// The arena of a replica's micro-batch (its outputs after the update ran).
    pub fn arena(&self, replica: usize, micro_batch: usize) -> &[u8] {
        &self.replicas[replica].arenas[micro_batch]
    }

    /// Micro-batches per call of [`PipelineRunner::run_update`] (per replica).
    pub fn micro_batches(&self) -> usize {
        self.pipeline.accumulation()
    }

    /// A replica's state, to load trained weights into (see `Plan::copy_state_from`).
    pub fn state_mut(&mut self, replica: usize) -> &mut [u8] {
        &mut self.replicas[replica].state
    }

    /// Whether kernels cut large products and updates into pieces run on the current rayon
    /// pool's threads ([`Threads`]; off by default). The pool's other workers sleep between
    /// pieces and are woken for each: workers kept polling for pieces took a core from the
    /// host's own threads (`tessera train`'s session, median of 7 alternated bench runs:
    /// 1.26x a JAX step with the workers polling, 1.21x without). Results are the same either
    /// way (bit for bit, a NaN's payload aside). The calling thread takes pieces too; run the
    /// updates on a worker of a pool of their own (`ThreadPool::install`) to keep other work
    /// off the pool.
    pub fn use_threads(&mut self, on: bool) {
        self.threads = on;
    }

    /// Sums each weight gradient that only feeds its accumulator straight into it: a SUM
    /// accumulation of a matrix product ([`Plan::fusable_accumulation`]) in the same backward
    /// slot runs as one step ([`Plan::run_accumulated_product_on`]). The state ends the same bit
    /// for bit (a NaN's payload aside), without the product being written to its micro-batch's
    /// arena and read back: a layer's weight gradient is as large as its weights. The
    /// products' own bytes are then never written, so `observed` lists the nodes whose outputs
    /// the observer of [`PipelineRunner::run_update_observed`] reads: they are left as they
    /// are. Off until called; each call replaces the last. Returns how many products run
    /// with their accumulation.
    pub fn fuse_accumulation(&mut self, observed: &[usize]) -> usize {
        self.fusion = vec![Fusion::Alone; self.plan.graph().len()];
        let mut count = 0;
        for list in &self.backward {
            for (at, &j) in list.iter().enumerate() {
                let Some(i) = self.plan.fusable_accumulation(j) else {
                    continue;
                };
                if list[..at].contains(&i) && !observed.contains(&i) {
                    self.fusion[i] = Fusion::WithAccumulation(j);
                    self.fusion[j] = Fusion::WithProduct;
                    count += 1;
                }
            }
        }
        count
    }

    /// The highest stash occupancy observed per stage.
    pub fn stash_observed(&self) -> &[usize] {
        &self.stash_observed
    }

    /// Runs one weight update (for an inference plan: one pass of its micro-batches):
    /// `feed(replica, micro_batch, plan, arena)` writes a micro-batch's inputs just before its
    /// first stage runs.
    pub fn run_update(
        &mut self,
        feed: impl FnMut(usize, usize, &Plan<S>, &mut [u8]) -> Result<(), RunError>,
    ) -> Result<(), RunError> {
        self.run_update_observed(feed, |_, _, _, _| Ok::<(), RunError>(()))
    }

    /// [`PipelineRunner::run_update`], calling `observe(point, plan, arena, state)` after every
    /// node and before the update (see [`Observe`]; inference plans have no update, so no
    /// `BeforeUpdate`): how outfeeds read tapped activations, predictions and gradients. `feed` and `observe` may fail with the caller's own error type.
    pub fn run_update_observed<E: From<RunError>>(
        &mut self,
        mut feed: impl FnMut(usize, usize, &Plan<S>, &mut [u8]) -> Result<(), E>,
        mut observe: impl FnMut(Observe, &Plan<S>, &[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let plan = &self.plan;
        let par: &dyn Parallel = if self.threads { &Threads } else { &Serial };
        let mut stash: Vec<usize> = vec![0; self.pipeline.stages()];
        let mut events: Vec<(usize, Slot, usize)> = self.pipeline.events().collect();
        // Backward before forward within a step, as the timeline runs them.
        events.sort_by_key(|&(t, slot, _)| (t, !matches!(slot, Slot::Backward(_))));
        for (_, slot, b) in events {
            let k = slot.stage();
            for (ri, r) in self.replicas.iter_mut().enumerate() {
                let arena = &mut r.arenas[b];
                let nodes = match slot {
                    Slot::Forward(_) => {
                        if k == 0 {
                            feed(ri, b, plan, arena)?;
                        }
                        &self.forward[k]
                    }
                    Slot::Backward(_) => &self.backward[k],
                };
                for &i in nodes {
                    match self.fusion.get(i).copied().unwrap_or(Fusion::Alone) {
                        Fusion::Alone => plan.run_node_on(i, arena, &mut r.state, par)?,
                        Fusion::WithAccumulation(j) => {
                            plan.run_accumulated_product_on(j, arena, &mut r.state, par)?;
                        }
                        // Ran with its product.
                        Fusion::WithProduct => {}
                    }
                    observe(
                        Observe::Node {
                            replica: ri,
                            micro_batch: b,
                            node: i,
                        },
                        plan,
                        arena,
                        &r.state,
                    )?;
                }
            }
            match slot {
                Slot::Forward(_) => {
                    self.stash_observed[k] = self.stash_observed[k].max(stash[k]);
                    stash[k] += 1;
                }
                Slot::Backward(_) => stash[k] -= 1,
            }
        }
        if self.update.is_empty() {
            // Inference, or a plain plan whose updates ran in the backward pass.
            return Ok(());
        }
        self.all_reduce_mean()?;
        for (ri, r) in self.replicas.iter_mut().enumerate() {
            observe(
                Observe::BeforeUpdate { replica: ri },
                &self.plan,
                &r.arenas[0],
                &r.state,
            )?;
            let arena = &mut r.arenas[0];
            for &i in &self.update {
                self.plan.run_node_on(i, arena, &mut r.state, par)?;
            }
        }
        Ok(())
    }

    /// Averages every accumulator over the replicas, in f32, identically on each.
    fn all_reduce_mean(&mut self) -> Result<(), RunError> {
        if self.replicas.len() < 2 {
            return Ok(());
        }
        let arena = vec![0u8; self.plan.arena_bytes()];
        let n = self.replicas.len() as f32;
        for &a in &self.accumulators {
            let mut sum = vec![0f32; self.plan.graph().node(a).shape().elements()];
            for r in &self.replicas {
                for (s, v) in sum
                    .iter_mut()
                    .zip(self.plan.tensor(a, &arena, &r.state)?.iter())
                {
                    *s += v;
                }
            }
            let mean: Vec<f32> = sum.iter().map(|s| s / n).collect();
            for r in &mut self.replicas {
                self.plan.write_state(a, &mut r.state, &mean)?;
            }
        }
        Ok(())
    }
}
