//! The converters of ONNX ops to graph ops: one module per op family (as tract's
//! `onnx/src/ops/`), each listing its ops in a table of [`Converter`]s. [`REGISTRY`] joins the
//! tables; the importer finds a node's converter there, the error for an unsupported op lists
//! the registry's ops, and the op table of docs/onnx.md is generated from it
//! ([`markdown_table`], checked by a test).

use super::{Importer, Val, R};
use crate::onnx::proto::NodeProto;

mod constant;
mod conv;
mod einsum;
mod elementwise;
mod gather;
mod linalg;
mod norm;
mod reduce;
mod resize;
mod rnn;
mod shape;

/// A family of ops, one module each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    /// Element-wise arithmetic, comparisons, logic, activations and casts.
    Elementwise,
    /// Matrix products.
    LinearAlgebra,
    /// Convolutions and pooling.
    ConvolutionAndPooling,
    /// Normalisations and softmax.
    Normalization,
    /// Reductions.
    Reduction,
    /// Shapes, views and copies: reshapes, transposes, concatenation, splits, slices.
    Shape,
    /// Gathers.
    Gather,
    /// Constants and what passes a tensor through.
    Constant,
    /// Recurrent layers.
    Recurrent,
}

impl Family {
    /// The family's name in docs and messages.
    pub fn name(self) -> &'static str {
        match self {
            Family::Elementwise => "element-wise",
            Family::LinearAlgebra => "linear algebra",
            Family::ConvolutionAndPooling => "convolution and pooling",
            Family::Normalization => "normalisation",
            Family::Reduction => "reduction",
            Family::Shape => "shape",
            Family::Gather => "gather",
            Family::Constant => "constant",
            Family::Recurrent => "recurrent",
        }
    }
}

/// How one ONNX op of the default domain becomes graph ops.
pub struct Converter {
    /// The op type.
    pub op: &'static str,
    /// Its family.
    pub family: Family,
    /// The versions of the op it reads (ONNX's `since_version`s): the version in force at the
    /// model's opset must be one of them.
    pub versions: &'static [u32],
    /// Converts a node whose inputs are not all constants (constants fold first).
    pub(super) convert: for<'a, 'b> fn(&'b mut Importer<'a>, &'b NodeProto) -> R<Vec<Val>>,
}

/// Every converter, by family.
pub const REGISTRY: &[&[Converter]] = &[
    elementwise::CONVERTERS,
    linalg::CONVERTERS,
    einsum::CONVERTERS,
    conv::CONVERTERS,
    norm::CONVERTERS,
    reduce::CONVERTERS,
    shape::CONVERTERS,
    resize::CONVERTERS,
    gather::CONVERTERS,
    constant::CONVERTERS,
    rnn::CONVERTERS,
];

/// Every converter.
pub fn converters() -> impl Iterator<Item = &'static Converter> {
    REGISTRY.iter().flat_map(|f| f.iter())
}

/// The converter of `op`, if the importer reads it.
pub fn converter(op: &str) -> Option<&'static Converter> {
    converters().find(|c| c.op == op)
}

/// Why the importer does not read an op at an opset.
pub(super) enum NotRead {
    /// No converter reads the op.
    Op,
    /// Its converter does not read the op's version there.
    Version(u32),
}

/// The converter of `op` at `opset`: registered, and reading the op's version in force there
/// (an op that has no version at that opset is left to its converter).
pub(super) fn converter_at(op: &str, opset: i64) -> Result<&'static Converter, NotRead> {
    let c = converter(op).ok_or(NotRead::Op)?;
    match super::versions::version_at(op, opset) {
        Some(v) if !c.versions.contains(&v) => Err(NotRead::Version(v)),
        _ => Ok(c),
    }
}

/// The ops the importer reads, sorted.
pub fn supported_ops() -> Vec<&'static str> {
    let mut v: Vec<&str> = converters().map(|c| c.op).collect();
    v.sort_unstable_by_key(|op| op.to_ascii_lowercase());
    v
}

/// The op table of docs/onnx.md: each family's ops with the versions read.
pub fn markdown_table() -> String {
    let mut rows: Vec<&Converter> = converters().collect();
    rows.sort_by(|a, b| (a.family, a.op).cmp(&(b.family, b.op)));
    let mut out = String::from("| family | op | versions read |\n|---|---|---|\n");
    for c in rows {
        let v: Vec<String> = c.versions.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            c.family.name(),
            c.op,
            v.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_op_has_one_converter_with_versions_onnx_knows() {
        let mut ops = supported_ops();
        ops.sort_unstable();
        let mut unique = ops.clone();
        unique.dedup();
        assert_eq!(ops, unique, "an op is registered twice");
        for c in converters() {
            let known = super::super::versions::versions_of(c.op)
                .unwrap_or_else(|| panic!("{} is no op of ONNX's default domain", c.op));
            assert!(!c.versions.is_empty(), "{}", c.op);
            for v in c.versions {
                assert!(known.contains(v), "{} has no version {v}: {known:?}", c.op);
            }
        }
    }

    #[test]
    fn the_docs_op_table_is_the_registrys() {
        let docs = include_str!("../../../../../docs/onnx.md");
        let table = markdown_table();
        assert!(
            docs.contains(&table),
            "docs/onnx.md's op table differs from the registry's; put this in it:\n{table}"
        );
    }
}
