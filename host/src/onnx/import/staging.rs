//! Pipeline stages as a transform of an import. The importer converts a model once, in one
//! stage; placing its ONNX nodes in stages gives each graph node its ONNX node's stage. A
//! weight read in several stages is held once per stage, as tied weights are (each IPU keeps
//! its copy): the first stage to read it keeps its variable; each other stage gets a copy,
//! named `<weight>@stage<k>`, made where that stage first reads it, and reads that.
//!
//! [`OnnxGraph`] keeps one import of a model for every placement an estimate tries (the
//! stages asked for, an automatic split's attempts, the search for the fewest IPUs).

use std::collections::{HashMap, HashSet};

use tessera_core::{Graph, NodeId, Roles};
use tessera_sim::Heap;

use super::{fresh, ipu_mapping, stage_of, Stages, R};
use crate::onnx::{ImportOptions, Imported, OnnxError, OnnxModel, StateValue};

/// One read of a weight during the import.
#[derive(Clone, Copy, Debug)]
pub(super) struct WeightUse {
    /// The weight (the importer's index).
    pub weight: usize,
    /// The graph's length when it was read: a copy for another stage is made there.
    pub at: usize,
    /// The ONNX node that read it (`None`: the graph outputs, after every node).
    pub layer: Option<usize>,
}

/// What placing an import's nodes in stages needs besides its graph.
#[derive(Clone, Debug, Default)]
pub(super) struct Placements {
    /// Every read of a weight, in import order.
    pub uses: Vec<WeightUse>,
    /// Each weight's variable.
    pub placed: HashMap<usize, NodeId>,
    /// The graph node names the import gave.
    pub used: HashSet<String>,
}

/// A model imported once, in one stage: every placement of its nodes in pipeline stages
/// that an estimate tries is made from it ([`OnnxGraph::staged`]) without importing again.
#[derive(Debug)]
pub struct OnnxGraph<'m> {
    model: &'m OnnxModel,
    options: ImportOptions,
    graph: Graph<Heap>,
    imported: Imported,
    placements: Placements,
}

impl<'m> OnnxGraph<'m> {
    /// Imports `model` with `options` (their `stages` aside: [`OnnxGraph::staged`] places
    /// the nodes).
    ///
    /// # Errors
    ///
    /// As [`super::import`].
    pub fn import(model: &'m OnnxModel, options: &ImportOptions) -> Result<Self, OnnxError> {
        let mut graph = Graph::new();
        let (imported, placements) = super::import_unstaged(model, &mut graph, options)?;
        Ok(OnnxGraph {
            model,
            options: ImportOptions {
                stages: Stages::One,
                ..options.clone()
            },
            graph,
            imported,
            placements,
        })
    }

    /// The model.
    pub fn model(&self) -> &'m OnnxModel {
        self.model
    }

    /// The options it was imported with (`stages` is [`Stages::One`]).
    pub fn options(&self) -> &ImportOptions {
        &self.options
    }

    /// The import, in one stage.
    pub fn imported(&self) -> &Imported {
        &self.imported
    }

    /// The graph and its import with the model's nodes in `stages`: what
    /// [`super::import`] makes with these options and `stages`.
    ///
    /// # Errors
    ///
    /// [`OnnxError::UnknownStageNode`] / [`OnnxError::BadStages`] for stages that do not
    /// place the model's nodes.
    pub fn staged(&self, stages: &Stages) -> Result<(Graph<Heap>, Imported), OnnxError> {
        let mut g = self.graph.clone();
        let mut imported = self.imported.clone();
        stage(
            self.model,
            &mut g,
            0,
            &mut imported,
            &self.placements,
            stages,
        )?;
        Ok((g, imported))
    }
}

/// Places the nodes that `model`'s import made in `g` (from node `base` on) in `stages`,
/// and says so in `imported` (each layer's stage, the stage count, the file's stage ->
/// IPU mapping).
pub(super) fn stage(
    model: &OnnxModel,
    g: &mut Graph<Heap>,
    base: usize,
    imported: &mut Imported,
    p: &Placements,
    stages: &Stages,
) -> R<()> {
    let per_node = stage_of(model, stages)?;
    imported.device_mapping = match stages {
        Stages::Attributes => ipu_mapping(model, &per_node),
        _ => None,
    };
    let last = per_node.last().copied().unwrap_or(0);
    let at = |layer: Option<usize>| layer.map_or(last, |l| per_node[l]);
    // Each weight's stage: that of its first read, which placed it.
    let mut home: HashMap<usize, usize> = HashMap::with_capacity(p.placed.len());
    let mut shared = false;
    for u in &p.uses {
        let s = at(u.layer);
        shared |= *home.entry(u.weight).or_insert(s) != s;
    }
    if shared {
        let (h, restaged) = Copy::new(g, imported, p, &per_node, home).run(base)?;
        *g = h;
        *imported = restaged;
    } else {
        for (k, s) in node_stages(g.len(), base, imported, &per_node) {
            g.assign_stage(NodeId::from_index(k as u32), s)
                .map_err(|e| graph_err(g, k, e))?;
        }
        for (layer, &s) in imported.layers.iter_mut().zip(&per_node) {
            layer.stage = s;
        }
    }
    imported.stages = per_node.iter().copied().max().map_or(1, |s| s + 1);
    g.set_stage(last).map_err(|e| graph_err(g, g.len(), e))?;
    Ok(())
}

/// The stage of each node the import made (index, stage): its ONNX node's; the graph inputs
/// (before the first node) in stage 0; what the graph outputs made (after the last) in the
/// last node's.
fn node_stages<'a>(
    len: usize,
    base: usize,
    imported: &'a Imported,
    per_node: &'a [usize],
) -> impl Iterator<Item = (usize, usize)> + 'a {
    let first = imported.layers.first().map_or(len, |l| l.first);
    let end = imported.layers.last().map_or(len, |l| l.end);
    let last = per_node.last().copied().unwrap_or(0);
    let inputs = (base..first).map(|k| (k, 0));
    let layers = imported
        .layers
        .iter()
        .zip(per_node)
        .flat_map(|(l, &s)| (l.first..l.end).map(move |k| (k, s)));
    let outputs = (end..len).map(move |k| (k, last));
    inputs.chain(layers).chain(outputs)
}

/// A graph builder's error while placing stages, naming the graph node at `k`.
fn graph_err(g: &Graph<Heap>, k: usize, e: tessera_core::GraphError) -> OnnxError {
    OnnxError::Graph {
        node: g
            .get(NodeId::from_index(k as u32))
            .map_or_else(String::new, |n| n.name().to_string()),
        op: "pipeline stages".into(),
        source: Box::new(e),
    }
}

/// The copy of an import with its nodes in stages and a weight read in several stages held
/// on each: node by node in import order, each weight's copy for a stage made where that
/// stage first read it, as an import in those stages would have made it.
struct Copy<'a> {
    g: &'a Graph<Heap>,
    imported: &'a Imported,
    p: &'a Placements,
    per_node: &'a [usize],
    /// Each weight's stage (its first read's).
    home: HashMap<usize, usize>,
    /// Weight of each variable.
    weight_of: HashMap<NodeId, usize>,
    /// Entry in `imported.state` of each node that has one.
    state_of: HashMap<NodeId, usize>,
    /// The copy.
    h: Graph<Heap>,
    /// Node of the copy of each node copied.
    map: Vec<NodeId>,
    /// A weight's variable in a stage other than its own.
    held: HashMap<(usize, usize), NodeId>,
    used: HashSet<String>,
    state: Vec<StateValue>,
    /// The next read of `p.uses` to make copies for.
    next: usize,
}

impl<'a> Copy<'a> {
    fn new(
        g: &'a Graph<Heap>,
        imported: &'a Imported,
        p: &'a Placements,
        per_node: &'a [usize],
        home: HashMap<usize, usize>,
    ) -> Self {
        Copy {
            g,
            imported,
            p,
            per_node,
            home,
            weight_of: p.placed.iter().map(|(&w, &id)| (id, w)).collect(),
            state_of: (imported.state.iter().enumerate())
                .map(|(i, s)| (s.node, i))
                .collect(),
            h: Graph::new(),
            map: Vec::with_capacity(g.len() + 16),
            held: HashMap::new(),
            used: p.used.clone(),
            state: Vec::with_capacity(imported.state.len() + 16),
            next: 0,
        }
    }

    /// The copy of the graph (nodes before `base` as they are) and its import.
    fn run(mut self, base: usize) -> R<(Graph<Heap>, Imported)> {
        let g = self.g;
        for k in 0..base {
            let s = g.nodes()[k].stage();
            self.node(k, s)?;
        }
        let last = self.per_node.last().copied().unwrap_or(0);
        let first = self.imported.layers.first().map_or(g.len(), |l| l.first);
        for k in base..first {
            self.node(k, 0)?;
        }
        let mut layers = self.imported.layers.clone();
        for (l, layer) in layers.iter_mut().enumerate() {
            let s = self.per_node[l];
            let start = self.h.len();
            for k in layer.first..layer.end {
                self.reads(Some(l), k, s)?;
                self.node(k, s)?;
            }
            self.reads(Some(l), layer.end, s)?;
            (layer.first, layer.end, layer.stage) = (start, self.h.len(), s);
        }
        let end = self.imported.layers.last().map_or(first, |l| l.end);
        for k in end..g.len() {
            self.reads(None, k, last)?;
            self.node(k, last)?;
        }
        self.reads(None, g.len(), last)?;
        let mut out = self.imported.clone();
        out.layers = layers;
        for i in &mut out.inputs {
            i.node = self.map[i.node.index()];
        }
        for e in &mut out.embeddings {
            e.node = self.map[e.node.index()];
        }
        for c in &mut out.conditionals {
            for b in &mut c.branches {
                // The copies of a branch's nodes, and any weight copies made among them.
                let at = |k: usize| self.map.get(k).map_or(self.h.len(), |id| id.index());
                *b = match b.len() {
                    0 => at(b.start)..at(b.start),
                    _ => at(b.start)..at(b.end - 1) + 1,
                };
            }
        }
        for o in &mut out.outputs {
            let id = self.operand(o.node, last);
            if id != self.map[o.node.index()] && g.node(o.node).roles().contains(Roles::OUTPUT) {
                self.h
                    .mark_output(id)
                    .map_err(|e| graph_err(g, o.node.index(), e))?;
            }
            o.node = id;
        }
        out.state = self.state;
        Ok((self.h, out))
    }

    /// The reads of weights that `layer` made when the graph had `at` nodes, in stage `s`:
    /// the first in `s` of a weight whose own stage is another makes its copy.
    fn reads(&mut self, layer: Option<usize>, at: usize, s: usize) -> R<()> {
        while let Some(u) = self.p.uses.get(self.next) {
            if u.layer != layer || u.at != at {
                break;
            }
            self.next += 1;
            if self.home.get(&u.weight) != Some(&s) {
                self.hold(u.weight, s)?;
            }
        }
        Ok(())
    }

    /// Weight `w`'s variable in stage `s` (not its own), made when missing.
    fn hold(&mut self, w: usize, s: usize) -> R<NodeId> {
        if let Some(&id) = self.held.get(&(w, s)) {
            return Ok(id);
        }
        let var = self.p.placed[&w];
        let entry = self.state_of.get(&var).map(|&i| &self.imported.state[i]);
        let tensor =
            entry.map_or_else(|| self.g.node(var).name().to_string(), |e| e.tensor.clone());
        let name = fresh(&mut self.used, &format!("{tensor}@stage{s}"));
        self.h
            .set_stage(s)
            .map_err(|e| graph_err(self.g, var.index(), e))?;
        let id = self
            .h
            .push_copy(self.g, var, &name, &mut |o| o)
            .map_err(|e| graph_err(self.g, var.index(), e))?;
        self.held.insert((w, s), id);
        if let Some(e) = entry {
            self.state.push(StateValue {
                node: id,
                tensor,
                values: e.values.clone(),
            });
        }
        Ok(id)
    }

    /// What a node of stage `s` reads for operand `o`: the copy of `o`, or of a weight of
    /// another stage its variable in `s`.
    fn operand(&self, o: NodeId, s: usize) -> NodeId {
        match self.weight_of.get(&o) {
            Some(w) if self.home.get(w) != Some(&s) => self.held[&(*w, s)],
            _ => self.map[o.index()],
        }
    }

    /// Copies node `k` into stage `s`.
    fn node(&mut self, k: usize, s: usize) -> R<()> {
        let g = self.g;
        let id = NodeId::from_index(k as u32);
        let n = g.node(id);
        // A weight of another stage read without a recorded read in this one (a value the
        // converter passed on): its variable in this stage, made before the node.
        for &o in n.op().operands().as_slice() {
            if let Some(&w) = self.weight_of.get(&o) {
                if self.home.get(&w) != Some(&s) {
                    self.hold(w, s)?;
                }
            }
        }
        let reads: Vec<(NodeId, NodeId)> = (n.op().operands().as_slice().iter())
            .map(|&o| (o, self.operand(o, s)))
            .collect();
        let to = |o: NodeId| reads.iter().find(|r| r.0 == o).map_or(o, |r| r.1);
        self.h.set_stage(s).map_err(|e| graph_err(g, k, e))?;
        let copy = self
            .h
            .push_copy(g, id, n.name(), &mut |o| to(o))
            .map_err(|e| graph_err(g, k, e))?;
        self.map.push(copy);
        if let Some(&i) = self.state_of.get(&id) {
            let mut v = self.imported.state[i].clone();
            v.node = copy;
            self.state.push(v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tessera_core::Plan;

    use super::*;
    use crate::onnx::import::testing::{float_info, model};
    use crate::onnx::proto::{GraphProto, NodeProto, TensorProto};

    fn node(name: &str, op: &str, inputs: &[&str], output: &str) -> NodeProto {
        NodeProto {
            name: Some(name.into()),
            op_type: Some(op.into()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            ..Default::default()
        }
    }

    /// `y = relu(x . w) . w`: the weight `w` is read by the first and the last node.
    fn tied() -> OnnxModel {
        model(
            "tied",
            GraphProto {
                node: vec![
                    node("first", "MatMul", &["x", "w"], "a"),
                    node("relu", "Relu", &["a"], "b"),
                    node("last", "MatMul", &["b", "w"], "y"),
                ],
                input: vec![float_info("x", &[2, 4])],
                output: vec![float_info("y", &[2, 4])],
                initializer: vec![TensorProto {
                    name: Some("w".into()),
                    dims: vec![4, 4],
                    data_type: Some(1),
                    float_data: (0..16).map(|i| i as f32 / 16.0).collect(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        )
    }

    fn stages_of(g: &Graph<Heap>) -> Vec<(String, usize)> {
        g.nodes()
            .iter()
            .map(|n| (n.name().to_string(), n.stage()))
            .collect()
    }

    /// A weight read in two stages is held in each: the later stage's copy is made where it
    /// first reads it, and read there.
    #[test]
    fn a_weight_read_in_two_stages_is_held_in_each() {
        let m = tied();
        let og = OnnxGraph::import(&m, &ImportOptions::default()).unwrap();
        let (g, imp) = og.staged(&Stages::After(vec!["relu".into()])).unwrap();
        let names: Vec<(String, usize)> = stages_of(&g);
        let held = names
            .iter()
            .position(|n| n.0 == "w@stage1")
            .expect("a copy");
        assert_eq!(names[held].1, 1);
        assert_eq!(names.iter().find(|n| n.0 == "w").map(|n| n.1), Some(0));
        // The copy is the last stage's first node, before the product that reads it.
        assert_eq!(imp.layers[2].first, held);
        let last = g.node(NodeId::from_index(imp.layers[2].end as u32 - 1));
        assert!(last
            .op()
            .operands()
            .as_slice()
            .contains(&NodeId::from_index(held as u32)));
        assert_eq!(
            imp.layers.iter().map(|l| l.stage).collect::<Vec<_>>(),
            [0, 0, 1]
        );
        assert_eq!(imp.stages, 2);
        let held_state: Vec<&StateValue> = imp.state.iter().filter(|s| s.tensor == "w").collect();
        assert_eq!(held_state.len(), 2, "each variable has the weight's values");
        assert_eq!(held_state[0].values, held_state[1].values);
        Plan::new(&g).expect("a well-formed graph");
        // What the import in those stages makes.
        let mut direct = Graph::new();
        let options = ImportOptions {
            stages: Stages::After(vec!["relu".into()]),
            ..ImportOptions::default()
        };
        assert_eq!(crate::onnx::import(&m, &mut direct, &options).unwrap(), imp);
        assert_eq!(stages_of(&direct), names);
    }

    /// In one stage, or when each weight is read in one stage only, stages are assigned in
    /// place: the graph's nodes stay as imported.
    #[test]
    fn without_shared_weights_only_the_stages_change() {
        let m = tied();
        let og = OnnxGraph::import(&m, &ImportOptions::default()).unwrap();
        let (one, imp) = og.staged(&Stages::One).unwrap();
        assert_eq!(imp, *og.imported());
        assert!(one.nodes().iter().all(|n| n.stage() == 0));
        let (two, imp2) = og.staged(&Stages::PerNode(vec![0, 0, 0])).unwrap();
        assert_eq!(stages_of(&two), stages_of(&one));
        assert_eq!(imp2.layers, imp.layers);
        // Stages that place no node are refused, naming the problem.
        let bad = og.staged(&Stages::PerNode(vec![0, 1])).unwrap_err();
        assert!(bad.to_string().contains("3 nodes"), "{bad}");
        let unknown = og.staged(&Stages::After(vec!["nope".into()])).unwrap_err();
        assert!(
            matches!(unknown, OnnxError::UnknownStageNode { .. }),
            "{unknown}"
        );
    }
}
