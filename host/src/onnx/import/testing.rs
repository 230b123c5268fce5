//! Small ONNX models written in tests: value infos and a model around a graph.

use std::path::Path;

use prost::Message;

use crate::onnx::proto::{
    tensor_shape_proto::{dimension::Value as Dim, Dimension},
    type_proto, GraphProto, ModelProto, OperatorSetIdProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
use crate::onnx::OnnxModel;

/// A float tensor's value info with `dims` (negative ones written as they are).
pub(crate) fn float_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| Dimension {
                            value: Some(Dim::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `graph` as a model `name` of the default domain's opset 13 (IR version 8), decoded as
/// `name.onnx` is.
pub(crate) fn model(name: &str, mut graph: GraphProto) -> OnnxModel {
    graph.name = Some(name.into());
    let m = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(13),
        }],
        graph: Some(graph),
        ..Default::default()
    };
    OnnxModel::from_bytes(&m.encode_to_vec(), Path::new(&format!("{name}.onnx"))).expect("a model")
}
