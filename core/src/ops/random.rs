//! Seeded randomness: the keep-mask of dropout. A mask depends only on the seed, a step
//! counter kept as state and the element's index (a counter-based generator), so runs are
//! reproducible and each step draws a new mask.

use crate::error::{derived, name_lossy, GraphError, RunError};
use crate::graph::{Graph, Init, Node, NodeId, NodeRef};
use crate::kernels as k;
use crate::op::{Op, Operands};
use crate::ops::elementwise::{BinaryFn, UnaryFn};
use crate::ops::update::Update;
use crate::rng::SplitMix64;
use crate::run::Exec;
use crate::storage::Storage;
use crate::{DType, Roles, Shape};

/// Random ops.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Random {
    /// A `u8` mask of the node's shape: 1 with probability `1 - rate`.
    KeepMask {
        /// The step counter (i32 scalar state).
        counter: NodeId,
        /// Probability of a 0.
        rate: f32,
        /// The stream's seed.
        seed: u32,
    },
}

impl Random {
    /// The op's name.
    pub const fn name(&self) -> &'static str {
        match self {
            Random::KeepMask { .. } => "DropoutMask",
        }
    }

    /// Operands.
    pub fn operands(&self) -> Operands {
        match *self {
            Random::KeepMask { counter, .. } => Operands::of(&[counter]),
        }
    }

    /// The same op reading `f(o)` for each operand `o` (a copy of a node elsewhere in the
    /// graph, as recomputation makes).
    pub(crate) fn map_operands(&self, f: &mut dyn FnMut(NodeId) -> NodeId) -> Self {
        let r = *self;
        match r {
            Random::KeepMask {
                counter,
                rate,
                seed,
            } => Random::KeepMask {
                counter: f(counter),
                rate,
                seed,
            },
        }
    }
}

/// Builders.
impl<S: Storage> Graph<S> {
    /// Keras' `Dropout`: in training, each element is zeroed with probability `rate` and the
    /// rest scaled by `1 / (1 - rate)`, with a new mask every step (`name/mask`, from `seed`
    /// and the step counter `name/step`); in inference (or at rate 0) it is `x` itself.
    pub fn dropout(
        &mut self,
        name: &str,
        x: impl NodeRef,
        rate: f32,
        seed: u32,
        training: bool,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        if !(0.0..1.0).contains(&rate) {
            return Err(GraphError::BadAttribute {
                node: name_lossy(name),
                op: "Dropout",
                rule: "rate must be in [0, 1)",
            });
        }
        if !training || rate == 0.0 {
            return Ok(x);
        }
        let shape = self.node(x).shape;
        let counter = self.state(
            &derived(name, format_args!("/step"))?,
            &[],
            DType::I32,
            Init::Zeros,
        )?;
        let mn = self.check_name(&derived(name, format_args!("/mask"))?)?;
        let op = Op::Random(Random::KeepMask {
            counter,
            rate,
            seed,
        });
        let mask = self.push(mn, op, shape, DType::U8, Roles::ACTIVATION)?;
        let inc = self.check_name(&derived(name, format_args!("/next_step"))?)?;
        self.push(
            inc,
            Op::Update(Update::Increment { counter }),
            Shape::scalar(),
            DType::I32,
            Roles::empty(),
        )?;
        let kept = self.binary(
            &derived(name, format_args!("/keep"))?,
            x,
            mask,
            BinaryFn::Keep,
        )?;
        self.unary(name, kept, UnaryFn::Scale(1.0 / (1.0 - rate)))
    }
}

/// Whether element `i` is kept at step `step` of stream `seed`.
pub fn keep(seed: u32, step: i64, i: usize, rate: f32) -> bool {
    let mut g = SplitMix64::new(
        (u64::from(seed) << 32)
            ^ (step as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ (i as u64).wrapping_mul(0xd1b5_4a32_d192_ed03),
    );
    g.next_f32() >= rate
}

/// The reference kernel.
pub(crate) fn run<S: Storage>(
    op: &Random,
    node: &Node,
    ex: &mut Exec<'_, S>,
) -> Result<(), RunError> {
    let Random::KeepMask {
        counter,
        rate,
        seed,
    } = *op;
    let step = k::load_int(ex.ins.bytes(counter), DType::I32, 0);
    for i in 0..node.shape.elements() {
        k::store(
            ex.out,
            node.dtype,
            i,
            if keep(seed, step, i, rate) { 1.0 } else { 0.0 },
        );
    }
    Ok(())
}
