//! Checkpoints: the trained variables as a safetensors file (f32, the variables' names), and
//! loading them back into a plan's state (weights for `evaluate` and `predict`).

use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use tessera_core::{Plan, Roles};

use crate::compile::{Heap, SessionError};

fn checkpoint_err(
    path: &Path,
    message: impl Into<String>,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
) -> SessionError {
    SessionError::Checkpoint {
        path: path.to_path_buf(),
        message: message.into(),
        source,
    }
}

/// Writes the trained variables of `plan` as a safetensors file (f32, the variables' names).
///
/// # Errors
///
/// [`SessionError::Checkpoint`] naming the file.
pub fn save_checkpoint(path: &Path, plan: &Plan<Heap>, state: &[u8]) -> Result<(), SessionError> {
    let g = plan.graph();
    let arena = vec![0u8; plan.arena_bytes()];
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (id, n) in g.ids().zip(g.nodes()) {
        if !n.roles().contains(Roles::TRAINABLE) {
            continue;
        }
        let v = plan.tensor(id, &arena, state)?;
        let shape = v.shape().dims().iter().map(|&d| d as usize).collect();
        let bytes = v.iter().flat_map(f32::to_le_bytes).collect();
        tensors.push((n.name().to_string(), shape, bytes));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| checkpoint_err(path, "cannot encode", Some(Box::new(e))))
        })
        .collect::<Result<_, _>>()?;
    let meta = std::collections::HashMap::from([("format".to_string(), "tessera".to_string())]);
    // Whole or not at all: a reader sees the old checkpoint or the new one.
    let bytes = safetensors::serialize(views, Some(meta))
        .map_err(|e| checkpoint_err(path, "cannot encode", Some(Box::new(e))))?;
    crate::output::write_bytes_atomically(path, &bytes)
        .map_err(|e| checkpoint_err(path, "cannot write", Some(Box::new(e))))
}

/// Loads the variables of a checkpoint written by [`save_checkpoint`] into `state`: every
/// trainable variable of `plan` must be in the file, with its shape.
///
/// # Errors
///
/// [`SessionError::Checkpoint`] naming the file and, where one is at fault, the variable.
pub fn load_checkpoint(
    path: &Path,
    plan: &Plan<Heap>,
    state: &mut [u8],
) -> Result<(), SessionError> {
    let bytes =
        std::fs::read(path).map_err(|e| checkpoint_err(path, "cannot read", Some(Box::new(e))))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| checkpoint_err(path, "not a safetensors file", Some(Box::new(e))))?;
    let g = plan.graph();
    for (id, n) in g.ids().zip(g.nodes()) {
        if !n.roles().contains(Roles::TRAINABLE) {
            continue;
        }
        let t = file
            .tensor(n.name())
            .map_err(|_| checkpoint_err(path, format!("has no variable `{}`", n.name()), None))?;
        let want: Vec<usize> = n.shape().dims().iter().map(|&d| d as usize).collect();
        if t.dtype() != Dtype::F32 || t.shape() != want.as_slice() {
            return Err(checkpoint_err(
                path,
                format!(
                    "variable `{}` is {:?} {:?}, the model wants F32 {:?}",
                    n.name(),
                    t.dtype(),
                    t.shape(),
                    want
                ),
                None,
            ));
        }
        let values: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        plan.write_state(id, state, &values)?;
    }
    Ok(())
}
