//! The converters of ONNX ops to graph ops: one module per op family (as tract's
//! `onnx/src/ops/`), each listing its ops in a table of [`Converter`]s, one entry per op: its
//! versions, its converter called with the op's variant (which binary function, which
//! reduction), how it folds on constant inputs, and which inputs are weights. [`REGISTRY`]
//! joins the tables; the importer finds a node's converter there, folding asks it whether and
//! how an op folds, the error for an unsupported op lists the registry's ops, and the op table
//! of docs/onnx.md is generated from it ([`markdown_table`], checked by a test).

use std::rc::Rc;

use super::{Const, Importer, Val, R};
use crate::onnx::proto::NodeProto;

mod constant;
mod control;
mod conv;
mod einsum;
mod elementwise;
mod gather;
mod linalg;
mod norm;
mod pool;
mod quant;
mod reduce;
mod resize;
mod rnn;
mod shape;

pub(super) use shape::Reshaping;

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
    /// Control flow: subgraphs run on a condition or repeated.
    ControlFlow,
    /// Quantized ops: 8-bit integers with scales and zero points.
    Quantization,
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
            Family::ControlFlow => "control flow",
            Family::Quantization => "quantization",
        }
    }
}

/// Converts a node whose inputs are not all constants (constants fold first).
pub(super) type Convert = for<'a, 'b> fn(&'b mut Importer<'a>, &'b NodeProto) -> R<Vec<Val>>;

/// Computes a node's outputs at import from its inputs, every one a constant: input 0 (given
/// apart) and each input by position (`None` where the node leaves it out).
pub(super) type Fold = for<'a, 'b> fn(
    &'b Importer<'a>,
    &'b NodeProto,
    &'b Rc<Const>,
    &'b [Option<Rc<Const>>],
) -> R<Vec<Val>>;

/// Whether a node reads its input 0 sequence-first (the batch at axis 1).
pub(super) type SequenceFirst = fn(&NodeProto) -> bool;

/// How one ONNX op of the default domain becomes graph ops, and how it folds.
#[derive(Clone, Copy)]
pub struct Converter {
    /// The op type.
    pub op: &'static str,
    /// Its family.
    pub family: Family,
    /// The versions of the op it reads (ONNX's `since_version`s): the version in force at the
    /// model's opset must be one of them. Empty for an op that only folds.
    pub versions: &'static [u32],
    /// Converts a node, the op's variant given in the registry (`None`: the op only folds).
    pub(super) convert: Option<Convert>,
    /// Folds a node whose inputs are all constants, at any version (`None`: it does not fold).
    pub(super) fold: Option<Fold>,
    /// The inputs read as weights: made variables where they are initializers.
    pub(super) weights: &'static [usize],
    /// Whether a node of the op reads its input 0 sequence-first (`None`: never).
    pub(super) sequence_first: Option<SequenceFirst>,
}

impl Converter {
    /// `op` of `family`, read at `versions` by `convert`; it neither folds nor reads weights.
    pub(super) const fn new(
        op: &'static str,
        family: Family,
        versions: &'static [u32],
        convert: Convert,
    ) -> Self {
        Converter {
            op,
            family,
            versions,
            convert: Some(convert),
            fold: None,
            weights: &[],
            sequence_first: None,
        }
    }

    /// `op` of `family`, which the importer does not read but folds by `fold`.
    pub(super) const fn fold_only(op: &'static str, family: Family, fold: Fold) -> Self {
        Converter {
            op,
            family,
            versions: &[],
            convert: None,
            fold: Some(fold),
            weights: &[],
            sequence_first: None,
        }
    }

    /// The converter, folding by `fold` when every input is a constant.
    pub(super) const fn folds(self, fold: Fold) -> Self {
        Converter {
            fold: Some(fold),
            ..self
        }
    }

    /// The converter, reading the inputs at `slots` as weights.
    pub(super) const fn weights(self, slots: &'static [usize]) -> Self {
        Converter {
            weights: slots,
            ..self
        }
    }

    /// The converter, `first` saying whether a node reads its input 0 sequence-first.
    pub(super) const fn sequence_first(self, first: SequenceFirst) -> Self {
        Converter {
            sequence_first: Some(first),
            ..self
        }
    }

    /// Whether the importer reads the op (rather than only folding it).
    pub fn reads(&self) -> bool {
        self.convert.is_some()
    }
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
    control::CONVERTERS,
    quant::CONVERTERS,
];

/// Every registry entry: the converters and the ops that only fold.
fn entries() -> impl Iterator<Item = &'static Converter> {
    REGISTRY.iter().flat_map(|f| f.iter())
}

/// The registry entry of `op`, if the importer reads or folds it.
pub(super) fn entry(op: &str) -> Option<&'static Converter> {
    entries().find(|c| c.op == op)
}

/// Every converter of an op the importer reads.
pub fn converters() -> impl Iterator<Item = &'static Converter> {
    entries().filter(|c| c.reads())
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
pub(super) fn converter_at(op: &str, opset: i64) -> Result<Convert, NotRead> {
    let c = converter(op).ok_or(NotRead::Op)?;
    let convert = c.convert.ok_or(NotRead::Op)?;
    match super::versions::version_at(op, opset) {
        Some(v) if !c.versions.contains(&v) => Err(NotRead::Version(v)),
        _ => Ok(convert),
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
        let mut ops: Vec<&str> = entries().map(|c| c.op).collect();
        ops.sort_unstable();
        let mut unique = ops.clone();
        unique.dedup();
        assert_eq!(ops, unique, "an op is registered twice");
        for c in entries().filter(|c| !c.reads()) {
            assert!(c.versions.is_empty() && c.fold.is_some(), "{}", c.op);
            assert!(
                super::super::versions::versions_of(c.op).is_some(),
                "{}",
                c.op
            );
        }
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
