//! `tessera run MODEL.onnx`: an ONNX model's forward pass on inputs from .npy files, with
//! the reference kernels; the outputs written as .npy.

use std::path::Path;

use crate::compile::onnx::{run_onnx, NamedTensor};
use crate::onnx::{OnnxModel, Stages};

use super::args::RunArgs;
use super::AnyError;

/// `tessera run MODEL.onnx --input NAME=FILE.npy ...`: the forward pass, outputs as .npy.
pub fn run_model(a: RunArgs) -> Result<bool, AnyError> {
    // Where the outputs go is checked before any work.
    crate::output::check_output_dir(&a.output_dir)?;
    let model = OnnxModel::load(&a.model)?;
    // The types and the weights first: without them no input matters. (A symbolic batch is
    // bound by the inputs, read next; `run_onnx` checks the weights again then.)
    model.require_float32_io()?;
    match crate::onnx::import(
        &model,
        &mut tessera_core::Graph::<tessera_sim::Heap>::new(),
        &crate::onnx::ImportOptions {
            stages: Stages::One,
            ..Default::default()
        },
    ) {
        Ok(imported) => imported.require_weights()?,
        Err(crate::onnx::OnnxError::UnboundDim { .. }) => {}
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
    crate::output::write_atomically(path, |out| {
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
