//! The graph inputs' shapes: which axis carries the batch, the shapes `--input-shape` gives
//! and their checks, and the batch the file fixes.

use super::*;

/// Which axis of each graph input carries the batch.
pub(super) struct Batching {
    /// Each graph input's batch axis ([`batch_axes`]).
    pub(super) axes: HashMap<String, usize>,
    /// The inputs whose `--input-shape` set the batch ([`given_batch`]): their given shape's
    /// batch axis is bound to the batch, as a symbolic one is.
    pub(super) rebatched: HashSet<String>,
}

/// The batch axis of each graph input: 0, or 1 for an input a node reads sequence-first (an
/// LSTM's of `layout` 0, `[seq, batch, input]`), as the registry says.
pub(super) fn batch_axes(model: &OnnxModel) -> HashMap<String, usize> {
    let graph = model.graph();
    graph
        .input
        .iter()
        .filter_map(|i| i.name.clone())
        .map(|name| {
            let seq_first = graph.node.iter().any(|n| {
                n.input.first() == Some(&name)
                    && ops::entry(n.op_type.as_deref().unwrap_or(""))
                        .and_then(|c| c.sequence_first)
                        .is_some_and(|first| first(n))
            });
            let axis = usize::from(seq_first);
            (name, axis)
        })
        .collect()
}

/// Real graph inputs (ONNX before IR 4 lists initializers among inputs too).
pub(super) fn real_inputs(model: &OnnxModel) -> Vec<&crate::onnx::proto::ValueInfoProto> {
    let graph = model.graph();
    let inits: HashSet<&str> = graph
        .initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect();
    graph
        .input
        .iter()
        .filter(|i| !inits.contains(i.name.as_deref().unwrap_or("")))
        .collect()
}

/// The dims of a value info: `Ok(size)` or `Err(symbol)` per axis.
pub(super) fn info_dims(
    v: &crate::onnx::proto::ValueInfoProto,
) -> Option<Vec<Result<usize, String>>> {
    use crate::onnx::proto::tensor_shape_proto::dimension::Value as D;
    use crate::onnx::proto::type_proto::Value as T;
    let Some(T::TensorType(t)) = v.r#type.as_ref()?.value.as_ref() else {
        return None;
    };
    let shape = t.shape.as_ref()?;
    Some(
        shape
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(D::DimValue(v)) if *v >= 0 => Ok(*v as usize),
                // `-1`, as some exporters write a dynamic axis (onnx.checker and onnxruntime
                // take it): a symbol.
                Some(D::DimValue(-1)) => Err("-1".into()),
                Some(D::DimParam(p)) => Err(p.clone()),
                _ => Err("?".into()),
            })
            .collect(),
    )
}

/// The dims of input `i` as given by `--input-shape`, else as the file declares them.
pub(super) fn given_dims(
    i: &crate::onnx::proto::ValueInfoProto,
    given: &[(String, Vec<usize>)],
) -> Option<Vec<Result<usize, String>>> {
    let name = i.name.as_deref().unwrap_or("");
    match given.iter().find(|(n, _)| n == name) {
        Some((_, d)) => Some(d.iter().map(|&v| Ok(v)).collect()),
        None => info_dims(i),
    }
}

/// Checks the `--input-shape` entries: each names a real input, once, with its rank.
pub(super) fn check_input_shapes(model: &OnnxModel, given: &[(String, Vec<usize>)]) -> R<()> {
    let inputs = real_inputs(model);
    for (k, (name, dims)) in given.iter().enumerate() {
        let bad = |message: String| OnnxError::InputShape {
            input: name.clone(),
            message,
        };
        if given[..k].iter().any(|(n, _)| n == name) {
            return Err(bad("given twice".into()));
        }
        let Some(i) = inputs.iter().find(|i| i.name.as_deref() == Some(name)) else {
            let names: Vec<&str> = inputs.iter().filter_map(|i| i.name.as_deref()).collect();
            return Err(bad(format!(
                "the model has no such input; its inputs: {}",
                names.join(", ")
            )));
        };
        if dims.contains(&0) {
            return Err(bad(format!("{dims:?} has an axis of size 0")));
        }
        if let Some(file) = info_dims(i) {
            if file.len() != dims.len() {
                return Err(bad(format!(
                    "{} dimensions given; the input has {}",
                    dims.len(),
                    file.len()
                )));
            }
        }
    }
    Ok(())
}

/// Refuses `--input-shape`s that change a fixed size of the file (other than the batch) that
/// an input not given also has: that input would keep the old size (a transformer's
/// `attention_mask` at the old sequence length beside `input_ids` at the new one), and the
/// model would fail at some later node. The error names the input to give.
pub(super) fn check_shared_sizes(
    model: &OnnxModel,
    axes: &HashMap<String, usize>,
    given: &[(String, Vec<usize>)],
) -> R<()> {
    let inputs = real_inputs(model);
    let non_batch = |name: &str, dims: Vec<Result<usize, String>>| -> Vec<(usize, usize)> {
        let batch = axes.get(name).copied().unwrap_or(0);
        dims.into_iter()
            .enumerate()
            .filter(|&(k, _)| k != batch)
            .filter_map(|(k, d)| d.ok().map(|v| (k, v)))
            .collect()
    };
    for (name, dims) in given {
        let Some(file) = inputs
            .iter()
            .find(|i| i.name.as_deref() == Some(name.as_str()))
            .and_then(|i| info_dims(i))
        else {
            continue;
        };
        for (k, old) in non_batch(name, file) {
            if dims.get(k) == Some(&old) {
                continue;
            }
            for other in &inputs {
                let oname = other.name.as_deref().unwrap_or("");
                if given.iter().any(|(n, _)| n == oname) {
                    continue;
                }
                let Some(odims) = info_dims(other) else {
                    continue;
                };
                if let Some((ok, _)) = non_batch(oname, odims.clone())
                    .into_iter()
                    .find(|&(_, v)| v == old)
                {
                    let shape: Vec<String> = odims
                        .iter()
                        .map(|d| d.as_ref().map_or_else(Clone::clone, usize::to_string))
                        .collect();
                    return Err(OnnxError::InputShape {
                        input: name.clone(),
                        message: format!(
                            "it changes axis {k} from {old} to {}, but input `{oname}` [{}] has {old} at its axis {ok} and is not given: give its shape too (--input-shape {oname}=...)",
                            dims[k],
                            shape.join(", ")
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}

/// `opts` with each `--input-shape` whose batch axis the file fixes (at the file's batch)
/// given another size read as
/// the file's shape at that input's other sizes, bound to the batch it gives: the sizes the
/// file derived from its batch (Reshape targets written at the exported batch) are then
/// rebound as `--batch-size` rebinds them. `None` when no given shape changes a fixed batch.
/// The batches given must agree with each other and with `--batch-size`.
pub(super) fn given_batch(
    model: &OnnxModel,
    axes: &HashMap<String, usize>,
    opts: &ImportOptions,
) -> R<Option<(ImportOptions, HashSet<String>)>> {
    let Some(file_batch) = file_batch(model, axes, &[])? else {
        return Ok(None);
    };
    let mut out = opts.clone();
    let mut batch: Option<(usize, &str)> = opts.batch_size.map(|b| (b, "--batch-size"));
    let mut rebatched = HashSet::new();
    for (name, dims) in out.input_shapes.iter_mut() {
        let Some(i) = real_inputs(model)
            .into_iter()
            .find(|i| i.name.as_deref() == Some(name.as_str()))
        else {
            continue;
        };
        let axis = axes.get(name.as_str()).copied().unwrap_or(0);
        let Some(Ok(file)) = info_dims(i).and_then(|d| d.get(axis).cloned()) else {
            continue;
        };
        let Some(&b) = dims.get(axis) else { continue };
        if b == file || file != file_batch {
            continue;
        }
        match batch {
            Some((other, from)) if other != b => {
                return Err(OnnxError::InputShape {
                    input: name.clone(),
                    message: format!(
                        "its batch axis {axis} is {b}, but {from} gives a batch of {other}"
                    ),
                })
            }
            _ => batch = Some((b, name.as_str())),
        }
        dims[axis] = file;
        rebatched.insert(name.clone());
    }
    out.batch_size = batch.map(|(b, _)| b);
    Ok((!rebatched.is_empty()).then_some((out, rebatched)))
}

/// The batch size the file was exported with (`None` when symbolic), the shapes given
/// standing for the file's.
pub(super) fn file_batch(
    model: &OnnxModel,
    axes: &HashMap<String, usize>,
    given: &[(String, Vec<usize>)],
) -> R<Option<usize>> {
    for i in real_inputs(model) {
        let name = i.name.clone().unwrap_or_default();
        let dims = given_dims(i, given).ok_or_else(|| OnnxError::UnboundDim {
            input: name.clone(),
            axis: 0,
            param: "?".into(),
            hint: "the input has no tensor shape in the file; give it with --input-shape".into(),
        })?;
        let axis = axes.get(&name).copied().unwrap_or(0);
        if let Some(Ok(b)) = dims.get(axis) {
            return Ok(Some(*b));
        }
    }
    Ok(None)
}

/// The first input whose batch axis is symbolic.
pub(super) fn symbolic_batch(
    model: &OnnxModel,
    axes: &HashMap<String, usize>,
    given: &[(String, Vec<usize>)],
) -> Option<(String, usize, String)> {
    real_inputs(model).into_iter().find_map(|i| {
        let name = i.name.clone().unwrap_or_default();
        let axis = axes.get(&name).copied().unwrap_or(0);
        match given_dims(i, given)?.get(axis)? {
            Err(p) => Some((name, axis, p.clone())),
            Ok(_) => None,
        }
    })
}
