//! The model files shipped with Tessera.

use super::{Model, ModelError};

/// The model files shipped with Tessera: (name, file text).
pub const SHIPPED: [(&str, &str); 7] = [
    (
        "pipelined_sequential",
        include_str!("../../../examples/models/pipelined_sequential.toml"),
    ),
    (
        "pipelined_model",
        include_str!("../../../examples/models/pipelined_model.toml"),
    ),
    (
        "sequential",
        include_str!("../../../examples/models/sequential.toml"),
    ),
    ("model", include_str!("../../../examples/models/model.toml")),
    (
        "mnist_cnn",
        include_str!("../../../examples/models/mnist_cnn.toml"),
    ),
    (
        "residual_cnn",
        include_str!("../../../examples/models/residual_cnn.toml"),
    ),
    (
        "transformer_encoder",
        include_str!("../../../examples/models/transformer_encoder.toml"),
    ),
];

/// The default model: the pipelined Sequential one.
pub const DEFAULT_MODEL: &str = "pipelined_sequential";

/// A shipped model by name.
pub fn shipped(name: &str) -> Option<Result<Model, ModelError>> {
    SHIPPED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(n, text)| Model::from_toml(text, &format!("examples/models/{n}.toml")))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_models_parse_and_have_the_seeds_layers() {
        for (name, _) in SHIPPED {
            let m = shipped(name).unwrap().unwrap();
            assert_eq!(m.output_units(), Some(10), "{name}");
            let pipelined = name.starts_with("pipelined")
                || name == "mnist_cnn"
                || name == "transformer_encoder";
            assert_eq!(m.is_pipelined(), pipelined, "{name}");
        }
        for name in [
            "pipelined_sequential",
            "pipelined_model",
            "sequential",
            "model",
        ] {
            let m = shipped(name).unwrap().unwrap();
            assert!(m.layers.iter().any(|l| l.layer.name == "Dense_128"));
        }
    }
}
