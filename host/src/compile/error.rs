//! Why a session cannot be set up or run: the one error of compiling a model and of running
//! it.

use std::path::PathBuf;

use tessera_core::{GraphError, PlanError, RunError};
use tessera_sim::system::SystemError;

use crate::dataset::DatasetError;
use crate::infeed::InfeedError;
use crate::model::ModelError;
use crate::outfeed::OutfeedError;

/// Why a session cannot be set up or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// An option is out of range or inconsistent.
    #[error("{option}: {message}")]
    Option {
        /// The option, as the command line spells it.
        option: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The model is invalid or does not match the data.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// An ONNX model cannot be read or imported.
    #[error(transparent)]
    Onnx(#[from] crate::onnx::OnnxError),
    /// The core refused the graph.
    #[error("building the graph")]
    Graph(#[source] Box<GraphError>),
    /// The core could not plan the graph.
    #[error("planning the graph")]
    Plan(#[source] Box<PlanError>),
    /// The system configuration (schedule, accumulation, mapping, replicas) is invalid, or
    /// the model does not fit.
    #[error(transparent)]
    System(Box<SystemError>),
    /// The data ran out or does not suit the run.
    #[error("{0}")]
    Data(String),
    /// The dataset pipeline failed.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// The infeed failed.
    #[error(transparent)]
    Infeed(#[from] InfeedError),
    /// An outfeed failed.
    #[error(transparent)]
    Outfeed(#[from] OutfeedError),
    /// Running the program failed.
    #[error("running the program")]
    Run(#[source] Box<RunError>),
    /// A checkpoint could not be written or read.
    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl From<GraphError> for SessionError {
    fn from(e: GraphError) -> Self {
        SessionError::Graph(Box::new(e))
    }
}

impl From<SystemError> for SessionError {
    fn from(e: SystemError) -> Self {
        SessionError::System(Box::new(e))
    }
}

impl From<RunError> for SessionError {
    fn from(e: RunError) -> Self {
        SessionError::Run(Box::new(e))
    }
}

impl From<PlanError> for SessionError {
    fn from(e: PlanError) -> Self {
        SessionError::Plan(Box::new(e))
    }
}
