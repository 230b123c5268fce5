//! `tessera estimate MODEL.onnx`: an imported model's fit, memory and cycles, per IPU and per
//! layer, on one IPU, split at named nodes, or split automatically; and, when it does not
//! fit, the fewest IPUs an automatic split fits on.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use tessera_core::schedule::least_accumulation;
use tessera_host::model::TrainingDefaults;
use tessera_host::onnx::{OnnxModel, Stages};
use tessera_host::report::format::{bytes, count};
use tessera_host::report::{write_report, Report};
use tessera_host::session::onnx::{
    compile_onnx, layer_rows, pipeline_stages, run_onnx, LayerRow, LossKind, NamedTensor,
    OnnxOptions, ONNX_ACCUMULATION_RULE,
};
use tessera_host::session::split::{
    check_pipeline_ipus, fewest_ipus, is_profile_estimate, layers_per_ipu, profile, profile_of,
    split, SplitInfo, MAX_IPUS,
};
use tessera_host::session::{EstimateSummary, SessionOptions};

use super::args::{EstimateArgs, RunArgs};
use super::estimate::{files_list, inference_line, make_report};
use super::options::options_with;
use super::{one_line, AnyError};

/// What `--json` prints for an ONNX model: the estimate summary and the import's facts.
#[derive(Serialize)]
struct OnnxSummary<'a> {
    #[serde(flatten)]
    summary: EstimateSummary,
    onnx: &'a ImportFacts,
}

#[derive(Serialize)]
struct ImportFacts {
    file: String,
    opset: i64,
    nodes: usize,
    graph_nodes: usize,
    parameters: u64,
    batch_size: usize,
    file_batch_size: usize,
    training: bool,
    loss: Option<LossKind>,
    stages: usize,
    split: Option<SplitInfo>,
    fewest_ipus: Option<FewestIpus>,
    /// The model's float64 graph inputs, outputs and initializers: the IPU has no float64,
    /// and the estimate takes them as `--dtype`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    float64: Vec<String>,
    layers: Vec<LayerRow>,
    seconds: f64,
}

#[derive(Serialize)]
struct FewestIpus {
    /// The fewest IPUs an automatic split fits on, if any up to the limit.
    ipus: Option<usize>,
    /// The most IPUs the search would try.
    limit: usize,
    /// The most IPUs it tried.
    tried_up_to: usize,
    /// Why it stopped before the limit without a fit, if it did.
    stopped: Option<String>,
    /// When splits on some IPU counts could not run (counted as not fitting): the fewest
    /// such, with why.
    unrunnable: Option<String>,
    boundaries: Vec<String>,
}

/// An ONNX model's estimate with the import's facts, as `estimate` prints it.
pub struct OnnxEstimate {
    /// The summary `--json` prints.
    pub summary: EstimateSummary,
    facts: ImportFacts,
    /// The model's name.
    pub name: String,
    /// Why it does not fit, on one line.
    pub out_of_memory: Option<String>,
    report_files: Option<Vec<std::path::PathBuf>>,
    inference_line: Option<String>,
}

impl OnnxEstimate {
    /// The stage boundaries of an automatic split, if the estimate is of one.
    pub fn boundaries(&self) -> Option<&[String]> {
        self.facts.split.as_ref().map(|s| s.boundaries.as_slice())
    }
}

pub fn run(a: EstimateArgs) -> Result<bool, AnyError> {
    let o = estimate(&a)?;
    let (summary, facts, name) = (o.summary, o.facts, o.name);
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&OnnxSummary {
                summary,
                onnx: &facts
            })?
        );
    } else {
        print!("{}", facts_text(&facts, a.layers));
        if a.inference {
            println!("{}", o.inference_line.unwrap_or_default());
        }
        print!("{}", summary.to_text());
        if let Some(files) = &o.report_files {
            println!("report written: {}", files_list(files));
        }
    }
    if let Some(oom) = &o.out_of_memory {
        eprintln!("error: {name} does not fit: {oom}");
        if let Some(f) = &facts.fewest_ipus {
            match f.ipus {
                Some(n) => eprintln!(
                    "an automatic split fits on {n} IPUs: add --pipeline-ipus {n} (stage boundaries after {})",
                    f.boundaries.join(", ")
                ),
                None => {
                    let why = match (&f.stopped, &f.unrunnable) {
                        (Some(why), _) => format!(
                            "no automatic split fits: the search stopped at {} IPUs, as {why}",
                            f.tried_up_to
                        ),
                        (None, Some(why)) if f.tried_up_to < 2 => format!(
                            "no automatic split can run ({why}: a larger --gradient-accumulation-count lets more IPUs run)"
                        ),
                        (None, Some(why)) => format!(
                            "no automatic split fits on up to {} IPUs among those that can run ({why}: a larger --gradient-accumulation-count lets more IPUs run)",
                            f.tried_up_to
                        ),
                        (None, None) => format!(
                            "no automatic split fits on up to {} IPUs",
                            f.tried_up_to
                        ),
                    };
                    eprintln!(
                        "{why} (try --dtype f16, --offload-optimizer-state, --recompute or a smaller --batch-size)"
                    )
                }
            }
        }
        return Ok(false);
    }
    Ok(true)
}

/// The estimate `run` prints, without printing it (but with the report written when
/// `--report-dir` asks for one).
pub fn estimate(a: &EstimateArgs) -> Result<OnnxEstimate, AnyError> {
    let start = Instant::now();
    let path = Path::new(&a.model.model);
    let model = OnnxModel::load(path)?;
    let name = model.name();
    // The file's batch is the default batch size; the probe also tells what the loss adds.
    let probe = {
        let mut g = tessera_core::Graph::<tessera_sim::Heap>::new();
        tessera_host::onnx::import(
            &model,
            &mut g,
            &tessera_host::onnx::ImportOptions {
                stages: Stages::One,
                batch_size: a.model.batch_size,
                input_shapes: a.input_shapes.clone(),
                ..Default::default()
            },
        )?
    };
    let file_batch = probe.file_batch;
    let defaults = TrainingDefaults {
        batch_size: Some(file_batch),
        ..TrainingDefaults::default()
    };
    let stages = if !a.pipeline_stages.is_empty() {
        Stages::After(a.pipeline_stages.clone())
    } else {
        Stages::Attributes
    };
    let mut oo = OnnxOptions {
        stages,
        loss: a.loss.unwrap_or_default(),
        inference: a.inference,
        recompute: a.recompute,
        mask_tokens: a.mask_tokens,
        device_mapping: (!a.device_mapping.is_empty()).then(|| a.device_mapping.clone()),
        input_shapes: a.input_shapes.clone(),
    };
    // Before the defaults that depend on the stages are worked out from it.
    if let Some(n) = a.pipeline_ipus {
        check_pipeline_ipus(n)?;
    }
    if !a.layers_per_ipu.is_empty() {
        // The blocks are found on the model as one stage; the boundaries then name the ONNX
        // nodes each IPU's last block ends with, as `--pipeline-stages` would.
        let one = OnnxOptions {
            stages: Stages::One,
            device_mapping: None,
            ..oo.clone()
        };
        let whole = compile_onnx(&model, &options_with(&a.model, &defaults, &name, 1)?, &one)?;
        oo.stages = Stages::After(layers_per_ipu(&whole, &a.layers_per_ipu)?);
    }
    let stage_guess = match (&oo.stages, a.pipeline_ipus) {
        (_, Some(n)) => n,
        (Stages::After(v), None) => v.len() + 1,
        _ => 1,
    };
    // The options of a run on `stages` stages: the defaults depend on them.
    let options_for = |stages: usize| -> Result<SessionOptions, AnyError> {
        let mut so = options_with(&a.model, &defaults, &name, stages)?;
        if a.model.gradient_accumulation_count.is_none() && stages > 1 {
            // A pipeline needs enough micro-batches per update to fill: the schedule's least
            // under PopART's rule, for its stages with a masked-LM head's.
            let piped = pipeline_stages(&probe, oo.loss, a.inference, stages);
            so.gradient_accumulation_count =
                least_accumulation(ONNX_ACCUMULATION_RULE, so.schedule, piped, !a.inference);
        }
        Ok(so)
    };
    let so = options_for(stage_guess)?;
    // The one-IPU profile the automatic split balances on: made once, and read from the
    // estimate itself when that is a one-IPU estimate.
    let mut prof = None;
    let (compiled, e, split_info) = match a.pipeline_ipus {
        Some(n) => {
            let p = prof.insert(profile(&model, &so, &oo)?);
            let s = split(&model, &so, &oo, n, p)?;
            (s.compiled, s.estimate, Some(s.info))
        }
        None => {
            let c = compile_onnx(&model, &so, &oo)?;
            let e = c.estimate()?;
            if !e.fits && is_profile_estimate(&so, &oo) {
                prof = Some(profile_of(&c, &e));
            }
            (c, e, None)
        }
    };
    let layers = layer_rows(&compiled, &e);
    let fewest = if e.fits || a.no_search {
        None
    } else {
        if !a.json {
            eprintln!("{name} does not fit; searching for the fewest IPUs an automatic split fits on (up to {MAX_IPUS})...");
        }
        let p = match prof {
            Some(p) => p,
            None => profile(&model, &so, &oo)?,
        };
        // The estimate just made is where the search starts when it was of one IPU or of an
        // automatic split.
        let known = match a.pipeline_ipus {
            Some(n) => Some(n),
            None => (matches!(oo.stages, Stages::Attributes) && e.ipus.len() == 1).then_some(1),
        }
        .zip(e.ipus.iter().map(|i| i.max_tile_bytes).max());
        // The search's split on n IPUs is the run `--pipeline-ipus n` makes, with its options.
        let by_stages = (0..=MAX_IPUS)
            .map(|n| options_for(n.max(1)))
            .collect::<Result<Vec<_>, _>>()?;
        let found = fewest_ipus(
            &model,
            &|n| by_stages[n.min(MAX_IPUS)].clone(),
            &oo,
            &p,
            known,
        )?;
        Some(FewestIpus {
            ipus: found.split.as_ref().map(|s| s.info.ipus),
            limit: MAX_IPUS,
            tried_up_to: found.tried_up_to,
            stopped: found.stopped,
            unrunnable: found
                .unrunnable
                .map(|(n, why)| format!("the split on {n} IPUs cannot run: {why}")),
            boundaries: found.split.map(|s| s.info.boundaries).unwrap_or_default(),
        })
    };
    let machine = compiled.machine.clone();
    let summary = EstimateSummary::new(&name, so.ipu, &machine, &e);
    let report_files = match &a.report_dir {
        Some(dir) => Some(write_report(
            dir,
            &Report {
                layers: layers.clone(),
                ..make_report(&name, &compiled.options, &machine, e.clone(), None)
            },
        )?),
        None => None,
    };
    let g = compiled.plan.graph();
    let parameters: u64 = g
        .nodes()
        .iter()
        .filter(|n| n.roles().contains(tessera_core::Roles::TRAINABLE))
        .map(|n| n.shape().elements() as u64)
        .sum();
    let facts = ImportFacts {
        file: path.display().to_string(),
        opset: model.opset,
        nodes: model.graph().node.len(),
        graph_nodes: g.len(),
        parameters,
        batch_size: compiled.imported.batch,
        file_batch_size: compiled.imported.file_batch,
        training: !a.inference,
        loss: compiled.loss_kind,
        stages: g.stage_count(),
        split: split_info,
        fewest_ipus: fewest,
        float64: float64_tensors(&model),
        layers,
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok(OnnxEstimate {
        summary,
        facts,
        name,
        out_of_memory: e.out_of_memory.as_ref().map(|o| one_line(&o.to_string())),
        inference_line: a.inference.then(|| inference_line(&e)),
        report_files,
    })
}

/// The names of `model`'s float64 graph inputs, outputs and initializers.
fn float64_tensors(model: &OnnxModel) -> Vec<String> {
    use tessera_host::onnx::{tensor_elem, Elem};
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

/// The import's facts and the layer table as text.
fn facts_text(f: &ImportFacts, all_layers: bool) -> String {
    use std::fmt::Write as _;
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
            Some(l) => format!("training with {} loss", serde_json::to_value(l).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()),
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
        "{} (cycles per micro-batch):",
        if all_layers {
            "every layer"
        } else {
            "the 12 layers with the most cycles"
        }
    );
    let _ = writeln!(
        s,
        "  {:<40} {:<20} {:>5} {:>12} {:>12} {:>12} {:>12}",
        "node", "op", "stage", "forward", "backward", "weights", "activations"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "  {:<40} {:<20} {:>5} {:>12} {:>12} {:>12} {:>12}",
            r.name,
            r.op,
            r.stage,
            count(r.forward_cycles),
            count(r.backward_cycles),
            bytes(r.weight_bytes),
            bytes(r.activation_bytes)
        );
    }
    s
}

/// `tessera run MODEL.onnx --input NAME=FILE.npy ...`: the forward pass, outputs as .npy.
pub fn run_model(a: RunArgs) -> Result<bool, AnyError> {
    // Where the outputs go is checked before any work.
    tessera_host::output::check_output_dir(&a.output_dir)?;
    let model = OnnxModel::load(&a.model)?;
    // The types and the weights first: without them no input matters. (A symbolic batch is
    // bound by the inputs, read next; `run_onnx` checks the weights again then.)
    model.require_float32_io()?;
    match tessera_host::onnx::import(
        &model,
        &mut tessera_core::Graph::<tessera_sim::Heap>::new(),
        &tessera_host::onnx::ImportOptions {
            stages: Stages::One,
            ..Default::default()
        },
    ) {
        Ok(imported) => imported.require_weights()?,
        Err(tessera_host::onnx::OnnxError::UnboundDim { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let mut inputs = Vec::new();
    for spec in &a.inputs {
        let (name, file) = spec
            .split_once('=')
            .ok_or_else(|| format!("--input `{spec}`: expected NAME=FILE.npy"))?;
        inputs.push(read_npy(name, Path::new(file))?);
    }
    let outputs = run_onnx(&model, &inputs)?;
    std::fs::create_dir_all(&a.output_dir)
        .map_err(|e| format!("{}: {e}", a.output_dir.display()))?;
    for o in &outputs {
        let safe: String = o
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = a.output_dir.join(format!("{safe}.npy"));
        write_npy(&path, &o.dims, &o.data)?;
        println!("{}: {:?} -> {}", o.name, o.dims, path.display());
    }
    Ok(true)
}

/// A .npy file of any numeric type as an f32 tensor named `name`, in C (row-major) order: a
/// Fortran-order file's values are reordered, as NumPy's `load` gives them. A header that
/// cannot be read, an element type that is not numeric and data that ends early are each
/// their own message, naming the file.
fn read_npy(name: &str, path: &Path) -> Result<NamedTensor, AnyError> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| {
        format!(
            "{}: not a .npy file (its header cannot be read: {e})",
            path.display()
        )
    })?;
    let dims: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let order = npy.order();
    let (n, descr) = (npy.len(), npy.dtype().descr());
    let truncated = |e: std::io::Error| {
        format!(
            "{}: the data ends early or is corrupt: the header says {n} elements of {descr} ({e})",
            path.display()
        )
    };
    let finish = |data: Vec<f32>| -> Result<NamedTensor, AnyError> {
        let data = match order {
            npyz::Order::C => data,
            npyz::Order::Fortran => fortran_to_c(&dims, &data),
        };
        Ok(NamedTensor {
            name: name.to_string(),
            dims: dims.clone(),
            data,
        })
    };
    // Each element type the header may name, read as it is and converted; a type that does
    // not match hands the file back for the next.
    macro_rules! read_as {
        ($npy:expr, $t:ty, $conv:expr) => {
            match $npy.try_data::<$t>() {
                Ok(r) => {
                    let v = r.collect::<std::io::Result<Vec<$t>>>().map_err(truncated)?;
                    return finish(v.into_iter().map($conv).collect());
                }
                Err(back) => back,
            }
        };
    }
    let npy = read_as!(npy, f32, |x| x);
    let npy = read_as!(npy, f64, |x| x as f32);
    let npy = read_as!(npy, i64, |x| x as f32);
    let npy = read_as!(npy, i32, |x| x as f32);
    let npy = read_as!(npy, u8, f32::from);
    let _ = read_as!(npy, bool, |b| f32::from(u8::from(b)));
    Err(format!(
        "{}: element type {descr} is not float32/64, int32/64, uint8 or bool",
        path.display()
    )
    .into())
}

/// `data`, stored in Fortran (column-major) order for `dims`, in C (row-major) order.
fn fortran_to_c(dims: &[usize], data: &[f32]) -> Vec<f32> {
    let mut index = vec![0usize; dims.len()];
    let mut out = Vec::with_capacity(data.len());
    for _ in 0..data.len() {
        // The Fortran offset of the current C-order index: the first axis varies fastest.
        let mut offset = 0;
        let mut stride = 1;
        for (k, &d) in dims.iter().enumerate() {
            offset += index[k] * stride;
            stride *= d;
        }
        out.push(data[offset]);
        // The next index in C order: the last axis varies fastest.
        for k in (0..dims.len()).rev() {
            index[k] += 1;
            if index[k] < dims[k] {
                break;
            }
            index[k] = 0;
        }
    }
    out
}

fn write_npy(path: &Path, dims: &[usize], data: &[f32]) -> Result<(), AnyError> {
    use npyz::WriterBuilder as _;
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let shape: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    tessera_host::output::write_atomically(path, |out| {
        let mut w = npyz::WriteOptions::<f32>::new()
            .default_dtype()
            .shape(&shape)
            .writer(out)
            .begin_nd()?;
        w.extend(data.iter().copied())?;
        w.finish()
    })
    .map_err(err)?;
    Ok(())
}
