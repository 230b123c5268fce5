//! Element-wise ops on tiles: one vertex per tile of the output, reading the same elements of
//! full-size operands and the broadcast parts of the others; the output is laid out like its
//! full-size operand, so no exchange is needed in the common case.

use tessera_core::ops::elementwise::{BinaryFn, Elementwise, TernaryFn, UnaryFn};
use tessera_core::{Node, NodeId, Storage};

use super::broadcast::Broadcast;
use super::compute::SameElements;
use super::{Lowering, Placement};
use crate::cost::{self, UnaryKind};
use crate::program::{Codelet, TensorId, VertexType};

/// The cost class of a unary function.
fn unary_kind(f: UnaryFn) -> UnaryKind {
    match f {
        UnaryFn::Identity => UnaryKind::Copy,
        UnaryFn::Neg => UnaryKind::Neg,
        UnaryFn::Scale(_) => UnaryKind::Scale,
        UnaryFn::Relu => UnaryKind::Relu,
        UnaryFn::Sigmoid => UnaryKind::Sigmoid,
        UnaryFn::Tanh => UnaryKind::Tanh,
        UnaryFn::Exp => UnaryKind::Exp,
        UnaryFn::Log => UnaryKind::Log,
        UnaryFn::Sqrt => UnaryKind::Sqrt,
        UnaryFn::Erf => UnaryKind::Erf,
        UnaryFn::Gelu(_) => UnaryKind::Gelu,
        UnaryFn::Clip { .. } => UnaryKind::Clip,
    }
}

/// How a binary vertex type runs: popops has a codelet family for each (`BinaryOp1D`,
/// `BinaryOp1DInPlace`, the broadcast codelets), each a vertex type of its own.
#[derive(Clone, Copy)]
pub(crate) enum BinaryForm {
    /// Out of place, operands of the output's shape.
    Plain,
    /// In place (`a += b`).
    InPlace,
    /// With an operand constant along the trailing axes.
    Broadcast,
}

impl BinaryForm {
    /// The family of an out-of-place op whose other operand runs `run` elements to a value
    /// ([`broadcast_run`]).
    pub(crate) fn of_run(run: Option<u64>) -> Self {
        if run.is_some() {
            BinaryForm::Broadcast
        } else {
            BinaryForm::Plain
        }
    }
}

/// The vertex type of binary function `f` on `dtype` in `form`: each function, element type
/// and codelet family its own type (and code).
pub(crate) fn binary_type(f: BinaryFn, dtype: tessera_core::DType, form: BinaryForm) -> VertexType {
    let function: u8 = match f {
        BinaryFn::Add => 1,
        BinaryFn::Sub => 2,
        BinaryFn::Mul => 3,
        BinaryFn::Div => 4,
        BinaryFn::Pow => 5,
        BinaryFn::Max => 6,
        BinaryFn::Min => 7,
        BinaryFn::Equal => 8,
        BinaryFn::Less => 9,
        BinaryFn::LessOrEqual => 10,
        BinaryFn::Greater => 11,
        BinaryFn::GreaterOrEqual => 12,
        BinaryFn::And => 13,
        BinaryFn::Or => 14,
        BinaryFn::ReluGrad => 15,
        BinaryFn::SigmoidGrad => 16,
        BinaryFn::TanhGrad => 17,
        BinaryFn::SqrtGrad => 18,
        BinaryFn::ErfGrad => 19,
        BinaryFn::GeluGrad(_) => 20,
        BinaryFn::ClipGrad { .. } => 21,
        BinaryFn::Keep => 22,
        BinaryFn::Drop => 23,
    };
    let family = match form {
        BinaryForm::Plain => 0,
        BinaryForm::InPlace => 64,
        BinaryForm::Broadcast => 128,
    };
    VertexType::of(function | family, dtype)
}

/// The vertex type of unary kind `kind` on `dtype`.
pub(crate) fn unary_type(kind: UnaryKind, dtype: tessera_core::DType) -> VertexType {
    let function = UnaryKind::ALL
        .iter()
        .position(|&k| k == kind)
        .map_or(u8::MAX, |p| p as u8);
    VertexType::of(function, dtype)
}

/// Worker cycles per vector beyond a plain binary op (add, sub, mul, compare), for the binary
/// functions that compute more: estimates, each named by what it adds.
fn binary_extra(f: BinaryFn) -> Option<UnaryKind> {
    match f {
        // A divide.
        BinaryFn::Div | BinaryFn::SqrtGrad => Some(UnaryKind::Reciprocal),
        // An exp and a log.
        BinaryFn::Pow => Some(UnaryKind::Log),
        // The derivative of GELU or erf re-evaluates the function.
        BinaryFn::GeluGrad(_) => Some(UnaryKind::Gelu),
        BinaryFn::ErfGrad => Some(UnaryKind::Exp),
        // Costed as one pass (an estimate for the gradients' few operations a vector).
        BinaryFn::Add
        | BinaryFn::Sub
        | BinaryFn::Mul
        | BinaryFn::Max
        | BinaryFn::Min
        | BinaryFn::Equal
        | BinaryFn::Less
        | BinaryFn::LessOrEqual
        | BinaryFn::Greater
        | BinaryFn::GreaterOrEqual
        | BinaryFn::And
        | BinaryFn::Or
        | BinaryFn::ReluGrad
        | BinaryFn::SigmoidGrad
        | BinaryFn::TanhGrad
        | BinaryFn::ClipGrad { .. }
        | BinaryFn::Keep
        | BinaryFn::Drop => None,
    }
}

/// The run of consecutive output elements over which an operand of shape `from` broadcast to
/// `to` holds one value: the elements of the trailing axes it broadcasts along (all of them
/// for a scalar). `None` when it varies along the last axis (no run longer than one element).
pub(super) fn broadcast_run(from: tessera_core::Shape, to: tessera_core::Shape) -> Option<u64> {
    let pad = to.rank() - from.rank().min(to.rank());
    let mut run = 1u64;
    for i in (0..to.rank()).rev() {
        let d = if i >= pad { from.dim(i - pad) } else { 1 };
        if d != 1 {
            break;
        }
        run *= to.dim(i) as u64;
    }
    (run > 1).then_some(run)
}

/// How the output is laid out: like its first operand of the output's shape.
pub(super) fn placement<S: Storage>(
    l: &Lowering<'_, S>,
    node: &Node,
    op: &Elementwise,
) -> Placement {
    op.operands()
        .as_slice()
        .iter()
        .copied()
        .find(|&x| l.node(x).shape() == node.shape())
        .map_or(Placement::Rows(1), Placement::Like)
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Elementwise) {
    let (cfg, node) = (l.cfg, l.node(i));
    let (dt, shape) = (node.dtype(), node.shape());
    let out = l.t(i);
    let operands: Vec<(_, _)> = op
        .operands()
        .as_slice()
        .iter()
        .map(|&x| (l.t(x), l.node(x).shape()))
        .collect();
    let (codelet, cycles): (Codelet, Box<dyn Fn(u64) -> u64>) = match *op {
        Elementwise::Unary { f, x } => {
            let kind = unary_kind(f);
            let from = l.node(x).dtype();
            if f == UnaryFn::Identity && from != dt {
                (
                    Codelet::Cast(VertexType::cast(from, dt)),
                    Box::new(move |n| cost::cast_cycles(cfg, n)),
                )
            } else {
                (
                    Codelet::Unary(unary_type(kind, dt)),
                    Box::new(move |n| kind.cycles(cfg, n, dt)),
                )
            }
        }
        Elementwise::Binary { f, .. } => {
            let extra = binary_extra(f);
            // popops runs an add, sub or mul whose other operand is constant along the
            // trailing axes with its broadcast codelets, not `BinaryOp1D`.
            let run = matches!(f, BinaryFn::Add | BinaryFn::Sub | BinaryFn::Mul)
                .then(|| {
                    operands
                        .iter()
                        .filter(|&&(_, from)| from != shape)
                        .map(|&(_, from)| broadcast_run(from, shape))
                        .min()
                        .flatten()
                })
                .flatten();
            (
                Codelet::Binary(binary_type(f, dt, BinaryForm::of_run(run))),
                Box::new(move |n| {
                    cost::binary_pass_cycles(cfg, n, run, dt)
                        + extra.map_or(0, |k| k.cycles(cfg, n, dt))
                }),
            )
        }
        Elementwise::Ternary { f, .. } => {
            // Two binary passes; the power's gradient adds an exp and a log.
            let extra = matches!(f, TernaryFn::PowGradBase | TernaryFn::PowGradExponent);
            let function = match f {
                TernaryFn::Where => 1,
                TernaryFn::DivGradDivisor => 2,
                TernaryFn::PowGradBase => 3,
                TernaryFn::PowGradExponent => 4,
                // (The number every other ternary function had before they were named.)
                TernaryFn::PickGrad => 31,
            };
            (
                // Ternary functions are vertex types of their own (`popops::Select`, the
                // gradients' expressions), apart from the binary ones.
                Codelet::Binary(VertexType::of(32 + function, dt)),
                Box::new(move |n| {
                    2 * cost::elementwise_binary_cycles(cfg, n, dt)
                        + if extra {
                            UnaryKind::Log.cycles(cfg, n, dt) + UnaryKind::Exp.cycles(cfg, n, dt)
                        } else {
                            0
                        }
                }),
            )
        }
    };
    if operands.iter().all(|&(_, from)| from == shape) {
        // No broadcast: every operand reads the output's own elements.
        let reads: Vec<_> = operands.iter().map(|&(t, _)| t).collect();
        l.per_tile_same(
            i,
            "op",
            out,
            codelet,
            cycles,
            SameElements {
                reads: &reads,
                writes: &[out],
                fixed: &[],
            },
        );
        return;
    }
    let same: Vec<TensorId> = operands
        .iter()
        .filter(|&&(_, from)| from == shape)
        .map(|&(t, _)| t)
        .collect();
    let broadcast: Vec<Broadcast> = operands
        .iter()
        .filter(|&&(_, from)| from != shape)
        .map(|&(t, from)| Broadcast::new(t, from, shape))
        .collect();
    l.elementwise_broadcast(i, out, &same, codelet, cycles, &broadcast);
}

#[cfg(test)]
mod tests {
    use tessera_core::{DType, Graph, Plan, Shape};

    use super::super::{lower_with, LowerOptions};
    use super::broadcast_run;
    use crate::heap::Heap;
    use crate::machine::{IpuConfig, Preset};
    use crate::program::Step;

    fn shape(d: &[usize]) -> Shape {
        Shape::new(d).unwrap()
    }

    #[test]
    fn a_run_is_the_trailing_axes_an_operand_is_constant_along() {
        let to = shape(&[2, 8, 5, 5]);
        assert_eq!(broadcast_run(shape(&[1, 8, 1, 1]), to), Some(25));
        assert_eq!(broadcast_run(shape(&[8, 1, 1]), to), Some(25));
        assert_eq!(broadcast_run(shape(&[2, 1, 1, 1]), to), Some(200));
        assert_eq!(broadcast_run(shape(&[1]), to), Some(400));
        // Varying along the last axis: no run.
        assert_eq!(broadcast_run(shape(&[5]), to), None);
        assert_eq!(broadcast_run(shape(&[1, 8, 1, 5]), to), None);
    }

    /// The compute cycles of `y = x (op) s` for a per-channel `s` of `s_dims`.
    fn compute_cycles(s_dims: &[usize], add: bool) -> u64 {
        let mut g: Graph<Heap> = Graph::new();
        let x = g.input("x", &[4, 16, 28, 28], DType::F16).unwrap();
        let s = g.input("s", s_dims, DType::F16).unwrap();
        let y = if add {
            g.add("y", x, s).unwrap()
        } else {
            g.mul("y", x, s).unwrap()
        };
        g.reduce_mean("out", y, None).unwrap();
        let plan = Plan::new(&g).unwrap();
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(16);
        let p = lower_with(&plan, &cfg, LowerOptions::default(), &|_| true, true, None).0;
        p.steps
            .iter()
            .filter_map(|st| match st {
                Step::Compute(cs) if cs.name.starts_with("y/") => {
                    cs.costs.iter().map(|c| c.cycles).max()
                }
                _ => None,
            })
            .sum()
    }

    /// The vertex code of the tiles running `y = x + a` then `z = y (op) b`.
    fn vertex_code(second_is_add: bool) -> u64 {
        let mut g: Graph<Heap> = Graph::new();
        let x = g.input("x", &[64, 64], DType::F16).unwrap();
        let a = g.input("a", &[64, 64], DType::F16).unwrap();
        let b = g.input("b", &[64, 64], DType::F16).unwrap();
        let y = g.add("y", x, a).unwrap();
        let z = if second_is_add {
            g.add("z", y, b).unwrap()
        } else {
            g.mul("z", y, b).unwrap()
        };
        g.reduce_mean("out", z, None).unwrap();
        let plan = Plan::new(&g).unwrap();
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(4);
        let p = lower_with(&plan, &cfg, LowerOptions::default(), &|_| true, false, None).0;
        crate::memory::account(&p, &cfg)
            .tiles
            .iter()
            .map(|t| t.vertex_code)
            .max()
            .unwrap()
    }

    /// A tile keeps one copy of code per vertex type: two adds share it, an add and a
    /// multiply (two template instantiations) do not.
    #[test]
    fn each_function_is_a_vertex_type_of_its_own() {
        let binary = crate::program::Codelet::Binary(super::binary_type(
            tessera_core::ops::elementwise::BinaryFn::Add,
            DType::F16,
            super::BinaryForm::Plain,
        ))
        .code_bytes();
        assert_eq!(vertex_code(false), vertex_code(true) + binary);
    }

    /// A per-channel scale or shift of NCHW data runs as popops' broadcast codelets (2 cycles
    /// a vector), an operand varying along the last axis as `BinaryOp1D` (3).
    #[test]
    fn per_channel_operands_cost_the_broadcast_codelets() {
        for add in [false, true] {
            let channel = compute_cycles(&[1, 16, 1, 1], add);
            let row = compute_cycles(&[28], add);
            let r = channel as f64 / row as f64;
            assert!((0.6..0.75).contains(&r), "add {add}: {channel} vs {row}");
        }
    }
}
