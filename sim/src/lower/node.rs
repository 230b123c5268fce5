//! Lowering one node: its offloaded state's loads and stores, the replay of an identical
//! node's lowering, and the dispatch to its op family.

use tessera_core::{NodeId, Op, Roles, Storage};

use super::{
    elementwise, gather, layout, loss, matmul, memo, norm, pool, random, reduce, softmax, update,
    Lowering,
};
use crate::exchange::{Locality, Summaries};
use crate::program::{Step, TensorId};

impl<'a, S: Storage> Lowering<'a, S> {
    pub(super) fn lower_node(&mut self, i: NodeId, memo: &mut memo::Memo) {
        let node = self.node(i);
        if !self.include[i.index()] {
            if self.remote[i.index()] {
                self.steps.push(Step::LinkReceive {
                    tensor: TensorId::of(i),
                    bytes: node.bytes() as u64,
                });
            }
            return;
        }
        // Offloaded optimizer state comes from streaming memory for this op and goes back after.
        let offloaded: Vec<NodeId> = node
            .op()
            .operands()
            .as_slice()
            .iter()
            .copied()
            .filter(|o| self.offloaded[o.index()])
            .collect();
        // With replicated tensor sharding each replica moves its shard.
        let moved = |l: &Self, t: NodeId| {
            let n = l.node(t);
            (n.bytes() as u64).div_ceil(l.opts.shards_of(n.shape().elements() as u64))
        };
        for &t in &offloaded {
            self.steps.push(Step::RemoteBuffer {
                tensor: TensorId::of(t),
                bytes: moved(self, t),
                load: true,
            });
        }
        self.lower_op_reusing(i, memo);
        for &t in &offloaded {
            self.steps.push(Step::RemoteBuffer {
                tensor: TensorId::of(t),
                bytes: moved(self, t),
                load: false,
            });
        }
    }

    /// [`lower_op`](Self::lower_op), or (estimates) the replay of an identical node's
    /// lowering. A node's temporaries spread from a tile its key picks
    /// ([`start_tile`](Self::start_tile)), so identical nodes share their layouts: PopART
    /// grows an outlined subgraph once, so the repeats of a layer share its layouts. Nodes
    /// that are never reused spread from a tile their name picks.
    fn lower_op_reusing(&mut self, i: NodeId, memo: &mut memo::Memo) {
        let Some((key, refs)) = memo.take_key(i) else {
            self.cursor = self.start_tile_of_name(self.node(i).name());
            return self.lower_op(i);
        };
        self.cursor = self.start_tile(key);
        if !(self.summaries.is_some() && memo.replay(self, key, i, &refs)) {
            let (step0, tensor0) = (self.steps.len(), self.tensors.len());
            self.lower_op(i);
            if self.summaries.is_some() {
                memo.record(self, key, i, refs, step0, tensor0);
            }
        }
    }

    /// A lowering of the same graph tensors with no steps or temporaries yet, for lowering
    /// single nodes apart ([`memo::Memo::prelower`]).
    pub(super) fn fork(&self) -> Lowering<'a, S> {
        Lowering {
            cfg: self.cfg,
            plan: self.plan,
            graph: self.graph,
            opts: self.opts,
            tensors: self.tensors.clone(),
            steps: Vec::new(),
            node_steps: Vec::new(),
            cursor: 0,
            mm: self.mm.clone(),
            plans_by_shape: self.plans_by_shape.clone(),
            fc_layers: self.fc_layers.clone(),
            fc_plans: self.fc_plans.clone(),
            machine: self.machine,
            include: self.include.clone(),
            first_readers: self.first_readers.clone(),
            remote: self.remote.clone(),
            offloaded: self.offloaded.clone(),
            summaries: Some(Summaries::default()),
            locality: Locality::default(),
            row_stats: Vec::new(),
            layouts: self.layouts.clone(),
            spread: self.spread.clone(),
        }
    }

    /// Drops what a fork's last node made: its steps, temporaries and what is known of them.
    pub(super) fn forget_from(&mut self, tensors: usize) {
        self.tensors.truncate(tensors);
        self.steps.clear();
        self.summaries = Some(Summaries::default());
        self.row_stats.clear();
    }

    /// The one place lowering dispatches to the families.
    pub(super) fn lower_op(&mut self, i: NodeId) {
        let node = self.node(i);
        match *node.op() {
            Op::Input => self.steps.push(Step::HostToDevice {
                tensor: TensorId::of(i),
                bytes: node.bytes() as u64,
            }),
            Op::Variable { .. } | Op::Constant { .. } => {}
            Op::Elementwise(e) => elementwise::lower(self, i, &e),
            Op::MatMul(_) | Op::Conv(_) => matmul::lower(self, i),
            Op::Pool(p) => pool::lower(self, i, &p),
            Op::Norm(n) => norm::lower(self, i, &n),
            Op::Gather(g) => gather::lower(self, i, &g),
            Op::Random(r) => random::lower(self, i, &r),
            Op::Softmax(s) => softmax::lower(self, i, &s),
            Op::Loss(l) => loss::lower(self, i, &l),
            Op::Reduce(r) => reduce::lower(self, i, &r),
            Op::Layout(l) => layout::lower(self, i, &l),
            Op::Update(u) => update::lower(self, i, &u),
        }
        if node
            .roles()
            .intersects(Roles::TAPPED | Roles::LOSS | Roles::OUTPUT)
            && !node.op().is_update()
        {
            self.steps.push(Step::DeviceToHost {
                tensor: self.t(i),
                bytes: node.bytes() as u64,
            });
        }
    }
}
