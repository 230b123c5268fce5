//! The names options take in model files, sweep specs, Python and the command line: one
//! table per choice ([`Named`]), read and written by serde through [`named`] and
//! [`named::option`].
//!
//! The names are the command line's (`grouped`, `f16`, `mk2`, `masked-lm`, ...), so that a
//! value means the same wherever it is written.

use tessera_core::schedule::Schedule;
use tessera_core::DType;
use tessera_sim::machine::Preset;
use tessera_sim::planner::PartialsType;

use crate::compile::onnx::LossKind;
use crate::compile::OptimizerKind;

mod parser;
pub use parser::{parser, NamedParser};

/// A choice with a fixed set of names.
pub trait Named: Copy + PartialEq + 'static {
    /// What the choice is, for messages (`pipeline schedule`).
    const WHAT: &'static str;
    /// Every value with its name, in the order help lists them.
    const NAMES: &'static [(&'static str, Self)];
    /// What each value does, in the order of [`Named::NAMES`] (empty: the names say it).
    const HELP: &'static [&'static str] = &[];

    /// The value's name.
    fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, v)| *v == self)
            .map_or("", |(n, _)| *n)
    }

    /// The value named `s` (letter case aside when `ignore_case`).
    fn from_name(s: &str, ignore_case: bool) -> Option<Self> {
        Self::NAMES
            .iter()
            .find(|(n, _)| {
                if ignore_case {
                    n.eq_ignore_ascii_case(s)
                } else {
                    *n == s
                }
            })
            .map(|(_, v)| *v)
    }

    /// The names, comma-separated, for messages.
    fn names() -> String {
        Self::NAMES
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Named for Schedule {
    const WHAT: &'static str = "pipeline schedule";
    const NAMES: &'static [(&'static str, Self)] = &[
        ("grouped", Schedule::Grouped),
        ("interleaved", Schedule::Interleaved),
        ("sequential", Schedule::Sequential),
    ];
    const HELP: &'static [&'static str] = &[
        "All forward and backward stages run every step, on successive micro-batches",
        "Forward and backward stages alternate on each IPU",
        "One stage at a time (no overlap)",
    ];
}

impl Named for DType {
    const WHAT: &'static str = "element type";
    const NAMES: &'static [(&'static str, Self)] = &[("f32", DType::F32), ("f16", DType::F16)];
}

impl Named for Preset {
    const WHAT: &'static str = "IPU generation";
    const NAMES: &'static [(&'static str, Self)] = &[
        ("mk1", Preset::Mk1),
        ("mk2", Preset::Mk2),
        ("bow", Preset::Bow),
        ("c600", Preset::C600),
    ];
    const HELP: &'static [&'static str] = &[
        "Colossus Mk1 (GC2): 1216 tiles of 256 KiB at 1.6 GHz",
        "Colossus Mk2 (GC200, IPU-M2000 and IPU-PODs): 1472 tiles of 624 KiB at 1.325 GHz",
        "Bow IPU (Bow-2000 and Bow Pods): the Mk2 tiles at 1.85 GHz",
        "C600 PCIe card: one Mk2 IPU at 1.486 GHz, host and remote buffers over PCIe",
    ];
}

impl Named for PartialsType {
    const WHAT: &'static str = "partials type";
    const NAMES: &'static [(&'static str, Self)] =
        &[("float", PartialsType::Float), ("half", PartialsType::Half)];
    const HELP: &'static [&'static str] = &[
        "fp32 partial sums (Poplar's default)",
        "fp16 partial sums for fp16 products: the AMP at its fp16 peak, half the partials' bytes",
    ];
}

impl Named for OptimizerKind {
    const WHAT: &'static str = "optimizer";
    const NAMES: &'static [(&'static str, Self)] = &[
        ("sgd", OptimizerKind::Sgd),
        ("momentum", OptimizerKind::Momentum),
        ("adam", OptimizerKind::Adam),
        ("lamb", OptimizerKind::Lamb),
        ("lars", OptimizerKind::Lars),
    ];
    const HELP: &'static [&'static str] = &[
        "Plain SGD",
        "SGD with momentum 0.9",
        "Adam (Keras defaults)",
        "LAMB (beta1 0.9, beta2 0.999, epsilon 1e-6, weight decay 0.01: Graphcore's BERT pre-training's), Adam's moments with a per-tensor trust ratio",
        "LARS (momentum 0.9, weight decay 1e-4, trust coefficient 0.001), momentum SGD with a per-tensor trust ratio",
    ];
}

impl Named for LossKind {
    const WHAT: &'static str = "loss";
    const NAMES: &'static [(&'static str, Self)] = &[
        ("auto", LossKind::Auto),
        (
            "sparse-categorical-crossentropy",
            LossKind::SparseCategoricalCrossentropy,
        ),
        ("mse", LossKind::Mse),
        ("masked-lm", LossKind::MaskedLm),
        ("span", LossKind::Span),
    ];
    const HELP: &'static [&'static str] = &[
        "By the output: `[batch, classes]` gets sparse cross-entropy; `[batch, seq, hidden]` of a model with a token embedding gets the masked-LM head; anything else MSE",
        "Sparse categorical cross-entropy on the output as logits (`[batch, classes]` or `[batch, seq, classes]`), integer labels",
        "Mean squared error against a target of the output's shape",
        "A masked-LM head as BERT's pre-training: the hidden states of the masked positions (`--mask-tokens` per sequence, gathered from the output `[batch, seq, hidden]`) projected onto the token embedding (tied; when the embedding is in an earlier pipeline stage the projection is a stage of its own on the embedding's IPU) to `[batch, masked, vocab]` logits, cross-entropy with labels (-100 ignored)",
        "A span head as BERT's SQuAD fine-tuning: the output `[batch, seq, hidden]` projected to two logits a position (`qa_outputs`), the start's and the end's over the sequence, each with a cross-entropy against its labelled position",
    ];
}

/// serde for a [`Named`] value, by name: `#[serde(with = "crate::names::named")]`.
pub mod named {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Named;

    /// Writes the value's name.
    pub fn serialize<T: Named, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.name())
    }

    /// Reads a name; any other string is an error listing the names.
    pub fn deserialize<'de, T: Named, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        let s = String::deserialize(d)?;
        T::from_name(&s, false)
            .ok_or_else(|| D::Error::custom(format!("`{s}` is not one of {}", T::names())))
    }

    /// serde for an optional [`Named`] value: `#[serde(with = "crate::names::named::option")]`
    /// (with `default`, so that a missing key is `None`).
    pub mod option {
        use serde::{Deserializer, Serializer};

        use super::super::Named;

        /// Writes the name, or nothing.
        pub fn serialize<T: Named, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(v) => s.serialize_some(v.name()),
                None => s.serialize_none(),
            }
        }

        /// Reads a name, or null.
        pub fn deserialize<'de, T: Named, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<T>, D::Error> {
            struct Visit<T>(std::marker::PhantomData<T>);
            impl<'de, T: Named> serde::de::Visitor<'de> for Visit<T> {
                type Value = Option<T>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    write!(f, "the {} ({})", T::WHAT, T::names())
                }
                fn visit_none<E>(self) -> Result<Self::Value, E> {
                    Ok(None)
                }
                fn visit_unit<E>(self) -> Result<Self::Value, E> {
                    Ok(None)
                }
                fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                    super::deserialize(d).map(Some)
                }
            }
            d.deserialize_option(Visit(std::marker::PhantomData))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Named + std::fmt::Debug>() {
        for &(n, v) in T::NAMES {
            assert_eq!(v.name(), n);
            assert_eq!(T::from_name(n, false), Some(v));
            assert_eq!(T::from_name(&n.to_ascii_uppercase(), true), Some(v));
        }
        assert_eq!(T::from_name("no such name", true), None);
    }

    /// Help, where a choice has it, says what every value does.
    fn helped<T: Named>() {
        assert!(
            T::HELP.is_empty() || T::HELP.len() == T::NAMES.len(),
            "{}",
            T::WHAT
        );
        assert!(T::HELP.iter().all(|h| !h.is_empty()), "{}", T::WHAT);
    }

    #[test]
    fn every_name_reads_back_as_its_value() {
        helped::<Schedule>();
        helped::<DType>();
        helped::<Preset>();
        helped::<PartialsType>();
        helped::<OptimizerKind>();
        helped::<LossKind>();
        round_trip::<Schedule>();
        round_trip::<DType>();
        round_trip::<Preset>();
        round_trip::<PartialsType>();
        round_trip::<OptimizerKind>();
        round_trip::<LossKind>();
    }

    #[test]
    fn a_wrong_name_lists_the_right_ones() {
        #[derive(serde::Deserialize, Debug)]
        struct S {
            #[serde(with = "named")]
            _d: DType,
        }
        let e = serde_json::from_str::<S>(r#"{"_d": "f8"}"#).unwrap_err();
        assert!(e.to_string().contains("`f8` is not one of f32, f16"), "{e}");
    }
}
