//! An ONNX model's estimate: on one IPU, split at named nodes, split by blocks per IPU or
//! automatically; and, when it does not fit, the fewest IPUs an automatic split fits on.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use tessera_core::schedule::least_accumulation;
use tessera_sim::system::SystemEstimate;

use super::system::{pipeline_candidates, System};
use super::{EstimateError, EstimateOptions, Estimation, Progress};
use crate::compile::onnx::{
    compile_imported, layer_rows, pipeline_stages, LayerRow, LossKind, OnnxCompiled, OnnxOptions,
    ONNX_ACCUMULATION_RULE,
};
use crate::compile::SessionOptions;
use crate::estimation::split::{
    check_pipeline_ipus, fewest_ipus, is_profile_estimate, layers_per_ipu, profile, profile_of,
    split, SplitInfo, MAX_IPUS,
};
use crate::names::Named;
use crate::onnx::{ImportOptions, OnnxGraph, OnnxModel, Stages};
use crate::report::format::{bytes, count};
use crate::summary::EstimateSummary;

/// An ONNX model's import, split and search facts (under `onnx` in the JSON).
#[derive(Clone, Debug, Serialize)]
pub struct OnnxFacts {
    /// The file (or the name the bytes were given).
    pub file: String,
    /// The default domain's opset.
    pub opset: i64,
    /// ONNX nodes.
    pub nodes: usize,
    /// Graph nodes they became (training included).
    pub graph_nodes: usize,
    /// Trainable parameters.
    pub parameters: u64,
    /// The batch size estimated.
    pub batch_size: usize,
    /// The file's own batch size.
    pub file_batch_size: usize,
    /// Training (not inference).
    pub training: bool,
    /// The loss training added.
    pub loss: Option<LossKind>,
    /// Pipeline stages.
    pub stages: usize,
    /// The automatic split, when the estimate is of one.
    pub split: Option<SplitInfo>,
    /// The search for the fewest IPUs, when the model did not fit and it ran.
    pub fewest_ipus: Option<FewestIpus>,
    /// The model's float64 graph inputs, outputs and initializers: the IPU has no float64,
    /// and the estimate takes them as `dtype`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub float64: Vec<String>,
    /// The branch the cycles assume of each `If` decided at run time.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditionals: Vec<tessera_sim::system::ConditionalCost>,
    /// Memory and cycles per ONNX node.
    pub layers: Vec<LayerRow>,
    /// Wall-clock seconds the estimate took.
    pub seconds: f64,
}

/// The search for the fewest IPUs an automatic split fits on.
#[derive(Clone, Debug, Serialize)]
pub struct FewestIpus {
    /// The fewest IPUs an automatic split fits on, if any up to the limit.
    pub ipus: Option<usize>,
    /// The most IPUs the search would try.
    pub limit: usize,
    /// The most IPUs it tried.
    pub tried_up_to: usize,
    /// Why it stopped before the limit without a fit, if it did.
    pub stopped: Option<String>,
    /// When splits on some IPU counts could not run (counted as not fitting): the fewest
    /// such, with why.
    pub unrunnable: Option<String>,
    /// The fitting split's stage boundaries.
    pub boundaries: Vec<String>,
}

/// The estimate of `model` (read from `path`) with options `o`; `start` is when the work
/// began (for `seconds`). In phases: the file's batch and what the loss adds
/// ([`Job::new`]), the stages ([`Job::stages`]), the estimate on them ([`Job::estimate`]),
/// the search for the fewest IPUs when it does not fit ([`Job::search`]), and the facts.
pub(super) fn estimate(
    model: &OnnxModel,
    path: &Path,
    o: &EstimateOptions,
    start: Instant,
    progress: &mut dyn FnMut(Progress),
) -> Result<Estimation, EstimateError> {
    let mut job = Job::new(model, o)?;
    job.stages()?;
    let (compiled, e, split_info) = match o.system {
        Some(system) => job.on_system(system)?,
        None => job.estimate()?,
    };
    let layers = layer_rows(&compiled, &e);
    let fewest = if e.fits || o.no_search {
        None
    } else {
        progress(Progress::Searching {
            model: job.name.clone(),
            limit: MAX_IPUS,
        });
        Some(job.search(&e)?)
    };
    let machine = compiled.target.machine.clone();
    let summary = EstimateSummary::new(&job.name, compiled.target.options.ipu, &machine, &e);
    let g = compiled.target.plan.graph();
    let parameters: u64 = g
        .nodes()
        .iter()
        .filter(|n| n.roles().contains(tessera_core::Roles::TRAINABLE))
        .map(|n| n.shape().elements() as u64)
        .sum();
    let facts = OnnxFacts {
        file: path.display().to_string(),
        opset: model.opset,
        nodes: model.graph().node.len(),
        graph_nodes: g.len(),
        parameters,
        batch_size: compiled.imported.batch,
        file_batch_size: compiled.imported.file_batch,
        training: !o.inference,
        loss: compiled.loss_kind,
        stages: g.stage_count(),
        split: split_info,
        fewest_ipus: fewest,
        float64: float64_tensors(model),
        conditionals: e.conditionals.clone(),
        layers,
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok(Estimation {
        name: job.name,
        summary,
        estimate: e,
        session: compiled.target.options.clone(),
        machine,
        inference: o.inference,
        onnx: Some(facts),
        model_summary: None,
    })
}

/// An estimate's compile, its figures and the automatic split it made, if it made one.
type Estimated = (OnnxCompiled, SystemEstimate, Option<SplitInfo>);

/// What an ONNX estimate works out before and between its compiles: the model imported once,
/// the options, the file's batch (the default batch size) and what the loss adds, the stages,
/// and the one-IPU profile that automatic splits balance on once it is made.
struct Job<'a> {
    /// The options, owned: a search for a system's placement changes the pipeline IPUs and
    /// replicas between estimates.
    o: EstimateOptions,
    /// The model's name.
    name: String,
    /// The model imported once, in one stage: every compile places its stages in a copy.
    og: OnnxGraph<'a>,
    /// The imported batch (the file's, or a given input shape's) as the default batch size.
    defaults: EstimateOptions,
    /// How the model is compiled (its stages resolved by [`Job::stages`]).
    oo: OnnxOptions,
    /// The one-IPU profile the automatic split balances on, once made.
    profile: Option<crate::estimation::split::Profile>,
}

impl<'a> Job<'a> {
    /// The import and the compile options before the stages are resolved.
    fn new(model: &'a OnnxModel, o: &'a EstimateOptions) -> Result<Self, EstimateError> {
        let name = model.name();
        // At the batch asked for, else the file's (which is then the default batch size).
        let og = OnnxGraph::import(
            model,
            &ImportOptions {
                batch_size: o.batch_size,
                dtype: o.dtype,
                training: !o.inference,
                stages: Stages::One,
                input_shapes: o.input_shapes.clone(),
                known_inputs: Vec::new(),
                // What the import reads of them does not hang on the stages.
                techniques: o.session_options(&name, 1)?.techniques,
            },
        )?;
        // The batch the import bound: the file's, or one a given input shape sets.
        let defaults = EstimateOptions {
            batch_size: Some(og.imported().batch),
            ..EstimateOptions::default()
        };
        let stages = if !o.pipeline_stages.is_empty() {
            Stages::After(o.pipeline_stages.clone())
        } else {
            Stages::Attributes
        };
        let oo = OnnxOptions {
            stages,
            loss: o.loss.unwrap_or_default(),
            inference: o.inference,
            mask_tokens: o.mask_tokens,
            device_mapping: (!o.device_mapping.is_empty()).then(|| o.device_mapping.clone()),
            input_shapes: o.input_shapes.clone(),
        };
        Ok(Job {
            o: o.clone(),
            name,
            og,
            defaults,
            oo,
            profile: None,
        })
    }

    /// The stages: the options' boundaries, the file's attributes, or the blocks per IPU
    /// (found on the model as one stage, then named by the ONNX nodes each IPU's last block
    /// ends with, as `pipeline_stages` would).
    fn stages(&mut self) -> Result<(), EstimateError> {
        // Before the defaults that depend on the stages are worked out from it.
        if let Some(n) = self.o.pipeline_ipus {
            check_pipeline_ipus(n)?;
        }
        if !self.o.layers_per_ipu.is_empty() {
            let one = OnnxOptions {
                stages: Stages::One,
                device_mapping: None,
                ..self.oo.clone()
            };
            let so = self.o.over(&self.defaults).session_options(&self.name, 1)?;
            let whole = compile_imported(&self.og, &so, &one)?;
            self.oo.stages = Stages::After(layers_per_ipu(&whole, &self.o.layers_per_ipu)?);
        }
        Ok(())
    }

    /// The session options of a run on `stages` stages: the defaults depend on them (a
    /// pipeline needs enough micro-batches per update to fill: the schedule's least under
    /// PopART's rule, for its stages with a masked-LM head's).
    fn options_for(&self, stages: usize) -> Result<SessionOptions, EstimateError> {
        let o = &self.o;
        let mut so = o.over(&self.defaults).session_options(&self.name, stages)?;
        if o.gradient_accumulation_count.is_none() && stages > 1 {
            let piped = pipeline_stages(self.og.imported(), self.oo.loss, o.inference, stages);
            so.gradient_accumulation_count =
                least_accumulation(ONNX_ACCUMULATION_RULE, so.schedule, piped, !o.inference);
        }
        Ok(so)
    }

    /// The stages the options ask for, counted before compiling.
    fn stage_guess(&self) -> usize {
        match (&self.oo.stages, self.o.pipeline_ipus) {
            (_, Some(n)) => n,
            (Stages::After(v), None) => v.len() + 1,
            _ => 1,
        }
    }

    /// The estimate on the stages: split automatically over `pipeline_ipus`, or as placed.
    /// The one-IPU profile an automatic split balances on is made once, and read from the
    /// estimate itself when that is a one-IPU estimate that does not fit.
    fn estimate(&mut self) -> Result<Estimated, EstimateError> {
        let so = self.options_for(self.stage_guess())?;
        Ok(match self.o.pipeline_ipus {
            Some(n) => {
                let p = self.profile.insert(profile(&self.og, &so, &self.oo)?);
                let s = split(&self.og, &so, &self.oo, n, p)?;
                (s.compiled, s.estimate, Some(s.info))
            }
            None => {
                let c = compile_imported(&self.og, &so, &self.oo)?;
                let e = c.target.estimate()?;
                if !e.fits && is_profile_estimate(&so, &self.oo, &c) {
                    self.profile = Some(profile_of(&c, &e));
                }
                (c, e, None)
            }
        })
    }

    /// The estimate on `system` ([`super::system`]): with the replicas given, each on the
    /// system's IPUs over them (split automatically unless placed); with a placement given,
    /// as many replicas of it as the system holds; else the fewest pipeline IPUs, a power of
    /// two, on which the split fits with the rest replicas, or the most tried when none does.
    fn on_system(&mut self, system: System) -> Result<Estimated, EstimateError> {
        let placed =
            self.o.pipeline_ipus.is_some() || !matches!(self.oo.stages, Stages::Attributes);
        if let Some(r) = self.o.replicas {
            let per = system.ipus_per_replica(r)?;
            if !placed && per > 1 {
                self.o.pipeline_ipus = Some(per);
            }
            let est = self.estimate()?;
            system.check_within(est.1.ipus_total, r)?;
            return Ok(est);
        }
        let candidates = if placed {
            vec![self.stage_guess()]
        } else {
            pipeline_candidates(system, MAX_IPUS)
        };
        let mut last = None;
        for p in candidates {
            let per = p.next_power_of_two();
            self.o.replicas = Some((system.ipus / per).max(1));
            if !placed {
                self.o.pipeline_ipus = (p > 1).then_some(p);
            }
            let est = self.estimate()?;
            // A placement from the file's attributes shows its IPUs only once estimated.
            let used = est.1.ipus.len().next_power_of_two();
            if used != per {
                self.o.replicas = Some((system.ipus / used).max(1));
                let est = self.estimate()?;
                system.check_within(est.1.ipus_total, self.o.replicas())?;
                return Ok(est);
            }
            if est.1.fits {
                return Ok(est);
            }
            last = Some(est);
        }
        last.ok_or_else(|| {
            EstimateError::Options(format!("system `{}` has no IPUs", system.name()))
        })
    }

    /// The fewest IPUs an automatic split fits on, searched from the estimate `e` just made
    /// (its start, when it was of one IPU or of an automatic split).
    fn search(&mut self, e: &SystemEstimate) -> Result<FewestIpus, EstimateError> {
        let so = self.options_for(self.stage_guess())?;
        let p = match self.profile.take() {
            Some(p) => p,
            None => profile(&self.og, &so, &self.oo)?,
        };
        let known = match self.o.pipeline_ipus {
            Some(n) => Some(n),
            None => {
                (matches!(self.oo.stages, Stages::Attributes) && e.ipus.len() == 1).then_some(1)
            }
        }
        .zip(e.ipus.iter().map(|i| i.max_tile_bytes).max());
        // The search's split on n IPUs is the run `pipeline_ipus = n` makes, with its options.
        let by_stages = (0..=MAX_IPUS)
            .map(|n| self.options_for(n.max(1)))
            .collect::<Result<Vec<_>, _>>()?;
        let found = fewest_ipus(
            &self.og,
            &|n| by_stages[n.min(MAX_IPUS)].clone(),
            &self.oo,
            &p,
            known,
        )?;
        Ok(FewestIpus {
            ipus: found.split.as_ref().map(|s| s.info.ipus),
            limit: MAX_IPUS,
            tried_up_to: found.tried_up_to,
            stopped: found.stopped,
            unrunnable: found
                .unrunnable
                .map(|(n, why)| format!("the split on {n} IPUs cannot run: {why}")),
            boundaries: found.split.map(|s| s.info.boundaries).unwrap_or_default(),
        })
    }
}

/// The names of `model`'s float64 graph inputs, outputs and initializers.
fn float64_tensors(model: &OnnxModel) -> Vec<String> {
    use crate::onnx::{tensor_elem, Elem};
    let graph = model.graph();
    let io = graph.input.iter().chain(&graph.output);
    let mut out: Vec<String> = io
        .filter(|v| tensor_elem(v) == Some(Elem::F64))
        .filter_map(|v| v.name.clone())
        .collect();
    for t in &graph.initializer {
        if Elem::from_code(t.data_type.unwrap_or(0)) == Some(Elem::F64) {
            out.extend(t.name.clone());
        }
    }
    out.sort();
    out.dedup();
    out
}

impl OnnxFacts {
    /// The import's facts and the layer table as text: every layer, or the 12 with the most
    /// cycles.
    pub fn to_text(&self, all_layers: bool) -> String {
        use std::fmt::Write as _;
        let f = self;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{}: ONNX opset {}, {} nodes -> {} graph nodes, {} parameters; batch {} (the file's {}); {}",
            f.file,
            f.opset,
            f.nodes,
            f.graph_nodes,
            count(f.parameters),
            f.batch_size,
            f.file_batch_size,
            match f.loss {
                Some(l) => format!("training with {} loss", crate::names::Named::name(l)),
                None => "inference".into(),
            }
        );
        if !f.float64.is_empty() {
            let shown: Vec<&str> = f.float64.iter().take(3).map(String::as_str).collect();
            let more = if f.float64.len() > 3 { ", ..." } else { "" };
            let _ = writeln!(
                s,
                "note: the IPU has no float64; the model's {} float64 tensors (`{}`{more}) are estimated in the --dtype given (float32 by default)",
                f.float64.len(),
                shown.join("`, `")
            );
        }
        for c in &f.conditionals {
            let other = if c.assumed == "then" { "else" } else { "then" };
            let (assumed, cheaper) = match c.assumed.as_str() {
                "then" => (c.then_cycles, c.else_cycles),
                _ => (c.else_cycles, c.then_cycles),
            };
            let _ = writeln!(
                s,
                "note: `{}` is an If decided at run time: memory holds both branches, cycles assume its {} branch, the dearer ({} cycles per {} against {} for its {} branch)",
                c.name,
                c.assumed,
                count(assumed),
                if self.training { "micro-batch" } else { "step" },
                count(cheaper),
                other
            );
        }
        if let Some(sp) = &f.split {
            let _ = writeln!(
                s,
                "automatic split into {} IPUs after {}: IPU cycles (one-IPU estimate) {:?}, weight state {} (caps {}, attempt {} of {})",
                sp.ipus,
                sp.boundaries.join(", "),
                sp.stage_cycles,
                sp.stage_weight_bytes.iter().map(|&b| bytes(b)).collect::<Vec<_>>().join(" / "),
                sp.cap_bytes.iter().map(|&b| bytes(b)).collect::<Vec<_>>().join(" / "),
                sp.attempts,
                sp.tried
            );
        }
        let mut rows: Vec<&LayerRow> = f.layers.iter().collect();
        if !all_layers {
            rows.sort_by_key(|r| std::cmp::Reverse(r.forward_cycles + r.backward_cycles));
            rows.truncate(12);
        }
        let _ = writeln!(
            s,
            "{} (cycles per {}):",
            if all_layers {
                "every layer"
            } else {
                "the 12 layers with the most cycles"
            },
            if self.training { "micro-batch" } else { "step" }
        );
        // Inference has no backward pass: no column for it.
        let backward = |x: &str| {
            if !self.training {
                String::new()
            } else {
                format!(" {x:>12}")
            }
        };
        let _ = writeln!(
            s,
            "  {:<40} {:<20} {:>5} {:>12}{} {:>12} {:>12}",
            "node",
            "op",
            "stage",
            "forward",
            backward("backward"),
            "weights",
            "activations"
        );
        for r in rows {
            let _ = writeln!(
                s,
                "  {:<40} {:<20} {:>5} {:>12}{} {:>12} {:>12}",
                r.name,
                r.op,
                r.stage,
                count(r.forward_cycles),
                backward(&count(r.backward_cycles)),
                bytes(r.weight_bytes),
                bytes(r.activation_bytes)
            );
        }
        s
    }
}
