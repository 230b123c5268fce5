//! # tessera-core
//!
//! Static neural-network graphs for machines without a heap: every shape is fixed when the
//! graph is built, autodiff turns a forward graph into a static training graph, and a
//! [`Plan`] fixes the execution order and every tensor's bytes before anything runs. Running a
//! plan needs only two byte slices the caller owns: an arena for activations and gradients,
//! and a state buffer for weights and optimizer state.
//!
//! `#![no_std]`, no `alloc`: storage is the caller's choice ([`Graph<Fixed<N>>`](Graph) holds
//! at most `N` nodes in place; a host passes a heap-backed [`Storage`]). It runs the same on a
//! host, in the Tessera simulator and on a Cortex-M.
//!
//! Ops come in families ([`ops`]): each family's module holds its builders and shape rules,
//! its reference kernel and its gradient.
//!
//! ```
//! use tessera_core::{Activation, DType, Fixed, Graph, Optimizer, Plan};
//!
//! let mut g: Graph<Fixed<64>> = Graph::new();
//! let x = g.input("x", &[8, 4], DType::F32)?;
//! let labels = g.input("labels", &[8], DType::I32)?;
//! let h = g.dense("Dense_16", x, 16, Activation::Relu, DType::F32)?;
//! let p = g.dense("Dense_3", h, 3, Activation::Softmax, DType::F32)?;
//! let loss = g.sparse_categorical_crossentropy("loss", p, labels, false)?;
//! g.differentiate(loss, Optimizer::sgd(0.1))?;
//!
//! let plan = Plan::new(&g)?;
//! let mut arena = [0u8; 4096];
//! let mut state = [0u8; 4096];
//! plan.init_state(&mut state, 1)?;
//! plan.fill_input("x", &mut arena, 32, |i| (i % 5) as f32 / 5.0)?;
//! plan.fill_input("labels", &mut arena, 8, |i| (i % 3) as f32)?;
//! plan.train_step(&mut arena, &mut state)?;
//! let first = plan.tensor(loss, &arena, &state)?.get(0);
//! for _ in 0..50 {
//!     plan.train_step(&mut arena, &mut state)?;
//! }
//! assert!(plan.tensor(loss, &arena, &state)?.get(0) < first);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![no_std]
// Unsafe code is denied except for the opt-in AVX2 / AVX-512 matmul with fused multiply-adds
// (`kernels::wide`, `kernels::Fused`), whose measured need and safety contract are stated there.
#![deny(unsafe_code)]
#![deny(missing_docs)]
// Errors carry the offending node's name inline (there is no heap to box it in), which makes
// them larger than clippy's default threshold; build-time errors are off the hot path.
#![allow(clippy::result_large_err)]

mod autodiff;
mod dtype;
mod error;
pub mod f16;
mod graph;
pub mod kernels;
mod layers;
pub mod models;
mod op;
pub mod ops;
mod plan;
pub mod rng;
mod roles;
mod run;
pub mod schedule;
mod shape;
mod storage;

pub use autodiff::{Accumulation, AccumulationMethod, Optimizer};
pub use dtype::DType;
pub use error::{GraphError, Name, PlanError, RunError, NAME_CAPACITY, USER_NAME_MAX};
pub use graph::{Graph, Init, Node, NodeId, NodeRef};
pub use layers::{Activation, AttentionLayer, Conv2dLayer, GruSettings, LstmOutputs, LstmStates};
pub use op::{Op, Operands};
pub use plan::{Place, Plan, Slot, ALIGN};
pub use roles::Roles;
pub use run::TensorRef;
pub use shape::{Shape, ShapeError, MAX_RANK};
pub use storage::{Buffer, Fixed, Storage};
