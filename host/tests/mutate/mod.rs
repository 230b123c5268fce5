//! Mutations of ONNX files, shared by the property test (`onnx_mutations.rs`) and the long
//! run of `benches/onnx_mutations.rs`: truncations, flipped bytes, and decoded-then-edited
//! models (tensor and input dims set to 0, 2^32 - 1 or 2^40, node inputs renamed to missing or
//! other tensors, nodes dropped, op types swapped).

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use prost::Message;
use tessera_host::onnx::proto::ModelProto;

/// The models mutated: the ONNX fixtures of every op family and the shipped BERT-Tiny,
/// under the repository's root `root`.
pub fn models(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = [
        "cnn",
        "transformer",
        "transformer_opset14",
        "lstm",
        "gpt_block",
        "light_cnn",
        "stripped",
        "cnn_opset9",
        "activations",
    ]
    .iter()
    .map(|m| root.join(format!("tests/fixtures/onnx/{m}.onnx")))
    .collect();
    v.push(root.join("data/onnx/bert_tiny.stripped.onnx"));
    v
}

/// One mutation of a model's bytes.
#[derive(Clone, Debug)]
pub enum Mutation {
    Truncate(prop::sample::Index),
    Flip(prop::sample::Index, u8),
    InitializerDims(prop::sample::Index, u64),
    InputDims(prop::sample::Index, u64),
    RenameInput(prop::sample::Index, prop::sample::Index, bool),
    DropNode(prop::sample::Index),
    SwapOp(prop::sample::Index, prop::sample::Index),
}

pub fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1u64 << 40),
        Just(u64::from(u32::MAX)),
        1u64..9
    ]
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    let i = any::<prop::sample::Index>;
    prop_oneof![
        i().prop_map(Mutation::Truncate),
        (i(), any::<u8>()).prop_map(|(a, b)| Mutation::Flip(a, b)),
        (i(), size()).prop_map(|(a, b)| Mutation::InitializerDims(a, b)),
        (i(), size()).prop_map(|(a, b)| Mutation::InputDims(a, b)),
        (i(), i(), any::<bool>()).prop_map(|(a, b, c)| Mutation::RenameInput(a, b, c)),
        i().prop_map(Mutation::DropNode),
        (i(), i()).prop_map(|(a, b)| Mutation::SwapOp(a, b)),
    ]
}

pub fn mutate(bytes: &[u8], m: &Mutation) -> Vec<u8> {
    let edit = |f: &dyn Fn(&mut ModelProto)| {
        let mut model = ModelProto::decode(bytes).expect("the original decodes");
        f(&mut model);
        model.encode_to_vec()
    };
    match m {
        Mutation::Truncate(at) => bytes[..at.index(bytes.len())].to_vec(),
        Mutation::Flip(at, b) => {
            let mut v = bytes.to_vec();
            let k = at.index(v.len());
            v[k] ^= b | 1;
            v
        }
        Mutation::InitializerDims(at, d) => edit(&|model| {
            let g = model.graph.as_mut().unwrap();
            if !g.initializer.is_empty() {
                let k = at.index(g.initializer.len());
                if let Some(x) = g.initializer[k].dims.first_mut() {
                    *x = *d as i64;
                }
            }
        }),
        Mutation::InputDims(at, d) => edit(&|model| {
            use tessera_host::onnx::proto::tensor_shape_proto::dimension::Value as D;
            use tessera_host::onnx::proto::type_proto::Value as T;
            let g = model.graph.as_mut().unwrap();
            let k = at.index(g.input.len());
            if let Some(T::TensorType(t)) =
                g.input[k].r#type.as_mut().and_then(|t| t.value.as_mut())
            {
                if let Some(dim) = t.shape.as_mut().and_then(|s| s.dim.last_mut()) {
                    dim.value = Some(D::DimValue(*d as i64));
                }
            }
        }),
        Mutation::RenameInput(at, other, missing) => edit(&|model| {
            let g = model.graph.as_mut().unwrap();
            let k = at.index(g.node.len());
            let names: Vec<String> = g.node.iter().flat_map(|n| n.output.clone()).collect();
            let to = if *missing || names.is_empty() {
                "no_such_tensor".to_string()
            } else {
                names[other.index(names.len())].clone()
            };
            if let Some(x) = g.node[k].input.first_mut() {
                *x = to;
            }
        }),
        Mutation::DropNode(at) => edit(&|model| {
            let g = model.graph.as_mut().unwrap();
            let k = at.index(g.node.len());
            g.node.remove(k);
        }),
        Mutation::SwapOp(at, other) => edit(&|model| {
            let g = model.graph.as_mut().unwrap();
            let (k, j) = (at.index(g.node.len()), other.index(g.node.len()));
            let op = g.node[j].op_type.clone();
            g.node[k].op_type = op;
        }),
    }
}
