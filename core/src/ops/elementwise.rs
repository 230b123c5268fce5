//! Element-wise functions of one, two or three operands. Two- and three-operand functions
//! broadcast as numpy does (shapes aligned on the right; a dimension of 1 stretches).
//!
//! Adding a function: a variant in [`UnaryFn`] (or [`BinaryFn`]), its formula in `apply`, its
//! derivative in `backward`, its name. Nothing else in the core changes.

use crate::autodiff::Backprop;
use crate::error::{GraphError, RunError};
use crate::graph::{Graph, Node, NodeId, NodeRef};
use crate::kernels as k;
use crate::op::{Op, Operands};
use crate::ops::{broadcast_shapes, broadcast_walk};
use crate::run::Exec;
use crate::storage::Storage;
use crate::{DType, Roles, Shape};

/// The two forms of GELU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum GeluForm {
    /// `x * Phi(x)` with the exact normal CDF (erf).
    Erf,
    /// The tanh approximation `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Tanh,
}

/// A function of one operand.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum UnaryFn {
    /// `x`, converted to the node's element type (a cast).
    Identity,
    /// `-x`.
    Neg,
    /// `x * factor`.
    Scale(f32),
    /// `max(x, 0)`.
    Relu,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
    /// `exp(x)`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// The error function.
    Erf,
    /// GELU.
    Gelu(GeluForm),
    /// `min(max(x, min), max)` (ReLU6 is `Clip { min: 0, max: 6 }`).
    Clip {
        /// Lower bound.
        min: f32,
        /// Upper bound.
        max: f32,
    },
}

/// A function of two operands (broadcast).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum BinaryFn {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// `a ^ b`.
    Pow,
    /// `max(a, b)`.
    Max,
    /// `min(a, b)`.
    Min,
    /// `a == b` (1 or 0, as `u8`).
    Equal,
    /// `a < b` (`u8`).
    Less,
    /// `a <= b` (`u8`).
    LessOrEqual,
    /// `a > b` (`u8`).
    Greater,
    /// `a >= b` (`u8`).
    GreaterOrEqual,
    /// Logical and of two masks (`u8`).
    And,
    /// Logical or of two masks (`u8`).
    Or,
    /// Backward of ReLU: `dy` where `y > 0`, else 0 (`a = dy`, `b = y`).
    ReluGrad,
    /// Backward of sigmoid: `dy * y * (1 - y)`.
    SigmoidGrad,
    /// Backward of tanh: `dy * (1 - y^2)`.
    TanhGrad,
    /// Backward of the square root: `dy / (2 y)`.
    SqrtGrad,
    /// Backward of erf: `dy * 2 / sqrt(pi) * exp(-x^2)` (`b = x`).
    ErfGrad,
    /// Backward of GELU: `dy * gelu'(x)` (`b = x`).
    GeluGrad(GeluForm),
    /// Backward of a clip: `dy` where `min <= x <= max`, else 0 (`b = x`).
    ClipGrad {
        /// Lower bound.
        min: f32,
        /// Upper bound.
        max: f32,
    },
    /// `a` where the mask `b` is non-zero, else 0.
    Keep,
    /// 0 where the mask `b` is non-zero, else `a`.
    Drop,
}

/// A function of three operands (broadcast).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TernaryFn {
    /// `b` where the mask `a` is non-zero, else `c` (ONNX `Where`).
    Where,
    /// Backward of `a / b` with respect to `b`: `-dy * y / b` (`dy, y, b`).
    DivGradDivisor,
    /// Backward of `a ^ b` with respect to `a`: `dy * b * a ^ (b - 1)` (`dy, a, b`).
    PowGradBase,
    /// Backward of `a ^ b` with respect to `b`: `dy * ln(a) * y`, 0 where `a <= 0`
    /// (`dy, a, y`).
    PowGradExponent,
    /// `dy` where `x == y`, else 0 (`dy, x, y`): the gradient of max, min and max-reduction.
    PickGrad,
}

/// An element-wise op.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Elementwise {
    /// `f(x)`.
    Unary {
        /// Operand.
        x: NodeId,
        /// The function.
        f: UnaryFn,
    },
    /// `f(a, b)`, broadcast.
    Binary {
        /// Left operand.
        a: NodeId,
        /// Right operand.
        b: NodeId,
        /// The function.
        f: BinaryFn,
    },
    /// `f(a, b, c)`, broadcast.
    Ternary {
        /// First operand.
        a: NodeId,
        /// Second operand.
        b: NodeId,
        /// Third operand.
        c: NodeId,
        /// The function.
        f: TernaryFn,
    },
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const FRAC_1_SQRT_2: f32 = core::f32::consts::FRAC_1_SQRT_2;
const FRAC_2_SQRT_PI: f32 = core::f32::consts::FRAC_2_SQRT_PI;
/// 1 / sqrt(2 pi).
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;
const GELU_CUBIC: f32 = 0.044_715;

fn gelu(x: f32, form: GeluForm) -> f32 {
    match form {
        GeluForm::Erf => 0.5 * x * (1.0 + libm::erff(x * FRAC_1_SQRT_2)),
        GeluForm::Tanh => {
            0.5 * x * (1.0 + libm::tanhf(SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)))
        }
    }
}

fn gelu_derivative(x: f32, form: GeluForm) -> f32 {
    match form {
        GeluForm::Erf => {
            0.5 * (1.0 + libm::erff(x * FRAC_1_SQRT_2))
                + x * FRAC_1_SQRT_2PI * libm::expf(-0.5 * x * x)
        }
        GeluForm::Tanh => {
            let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
            let t = libm::tanhf(u);
            0.5 * (1.0 + t)
                + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
        }
    }
}

fn flag(b: bool) -> f32 {
    if b {
        1.0
    } else {
        0.0
    }
}

impl UnaryFn {
    /// The function's value at `x`.
    // Always inlined: with `self` a constant, only its own arm is left in a kernel's loop.
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            UnaryFn::Identity => x,
            UnaryFn::Neg => -x,
            UnaryFn::Scale(s) => x * s,
            UnaryFn::Relu => {
                if x > 0.0 {
                    x
                } else {
                    0.0
                }
            }
            UnaryFn::Sigmoid => 1.0 / (1.0 + libm::expf(-x)),
            UnaryFn::Tanh => libm::tanhf(x),
            UnaryFn::Exp => libm::expf(x),
            UnaryFn::Log => libm::logf(x),
            UnaryFn::Sqrt => libm::sqrtf(x),
            UnaryFn::Erf => libm::erff(x),
            UnaryFn::Gelu(form) => gelu(x, form),
            UnaryFn::Clip { min, max } => x.max(min).min(max),
        }
    }

    /// The name reports print.
    pub const fn name(self) -> &'static str {
        match self {
            UnaryFn::Identity => "Cast",
            UnaryFn::Neg => "Neg",
            UnaryFn::Scale(_) => "Scale",
            UnaryFn::Relu => "Relu",
            UnaryFn::Sigmoid => "Sigmoid",
            UnaryFn::Tanh => "Tanh",
            UnaryFn::Exp => "Exp",
            UnaryFn::Log => "Log",
            UnaryFn::Sqrt => "Sqrt",
            UnaryFn::Erf => "Erf",
            UnaryFn::Gelu(GeluForm::Erf) => "Gelu",
            UnaryFn::Gelu(GeluForm::Tanh) => "GeluTanh",
            UnaryFn::Clip { .. } => "Clip",
        }
    }
}

impl BinaryFn {
    /// The function's value at `(a, b)`.
    // Always inlined: with `self` a constant, only its own arm is left in a kernel's loop.
    #[inline(always)]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryFn::Add => a + b,
            BinaryFn::Sub => a - b,
            BinaryFn::Mul => a * b,
            BinaryFn::Div => a / b,
            BinaryFn::Pow => libm::powf(a, b),
            BinaryFn::Max => a.max(b),
            BinaryFn::Min => a.min(b),
            BinaryFn::Equal => flag(a == b),
            BinaryFn::Less => flag(a < b),
            BinaryFn::LessOrEqual => flag(a <= b),
            BinaryFn::Greater => flag(a > b),
            BinaryFn::GreaterOrEqual => flag(a >= b),
            BinaryFn::And => flag(a != 0.0 && b != 0.0),
            BinaryFn::Or => flag(a != 0.0 || b != 0.0),
            BinaryFn::ReluGrad => {
                if b > 0.0 {
                    a
                } else {
                    0.0
                }
            }
            BinaryFn::SigmoidGrad => a * b * (1.0 - b),
            BinaryFn::TanhGrad => a * (1.0 - b * b),
            BinaryFn::SqrtGrad => a / (2.0 * b),
            BinaryFn::ErfGrad => a * FRAC_2_SQRT_PI * libm::expf(-b * b),
            BinaryFn::GeluGrad(form) => a * gelu_derivative(b, form),
            BinaryFn::ClipGrad { min, max } => {
                if (min..=max).contains(&b) {
                    a
                } else {
                    0.0
                }
            }
            BinaryFn::Keep => {
                if b != 0.0 {
                    a
                } else {
                    0.0
                }
            }
            BinaryFn::Drop => {
                if b != 0.0 {
                    0.0
                } else {
                    a
                }
            }
        }
    }

    /// The name reports print.
    pub const fn name(self) -> &'static str {
        match self {
            BinaryFn::Add => "Add",
            BinaryFn::Sub => "Sub",
            BinaryFn::Mul => "Mul",
            BinaryFn::Div => "Div",
            BinaryFn::Pow => "Pow",
            BinaryFn::Max => "Max",
            BinaryFn::Min => "Min",
            BinaryFn::Equal => "Equal",
            BinaryFn::Less => "Less",
            BinaryFn::LessOrEqual => "LessOrEqual",
            BinaryFn::Greater => "Greater",
            BinaryFn::GreaterOrEqual => "GreaterOrEqual",
            BinaryFn::And => "And",
            BinaryFn::Or => "Or",
            BinaryFn::ReluGrad => "ReluGrad",
            BinaryFn::SigmoidGrad => "SigmoidGrad",
            BinaryFn::TanhGrad => "TanhGrad",
            BinaryFn::SqrtGrad => "SqrtGrad",
            BinaryFn::ErfGrad => "ErfGrad",
            BinaryFn::GeluGrad(_) => "GeluGrad",
            BinaryFn::ClipGrad { .. } => "ClipGrad",
            BinaryFn::Keep => "Keep",
            BinaryFn::Drop => "Drop",
        }
    }

    /// Whether the result is a `u8` mask (comparisons and logic).
    pub const fn is_predicate(self) -> bool {
        matches!(
            self,
            BinaryFn::Equal
                | BinaryFn::Less
                | BinaryFn::LessOrEqual
                | BinaryFn::Greater
                | BinaryFn::GreaterOrEqual
                | BinaryFn::And
                | BinaryFn::Or
        )
    }

    /// Whether `b` is a mask of any type rather than a value of `a`'s type.
    const fn b_is_mask(self) -> bool {
        matches!(self, BinaryFn::Keep | BinaryFn::Drop)
    }
}

impl TernaryFn {
    /// The function's value at `(a, b, c)`.
    #[inline]
    pub fn apply(self, a: f32, b: f32, c: f32) -> f32 {
        match self {
            TernaryFn::Where => {
                if a != 0.0 {
                    b
                } else {
                    c
                }
            }
            TernaryFn::DivGradDivisor => -a * b / c,
            TernaryFn::PowGradBase => a * c * libm::powf(b, c - 1.0),
            TernaryFn::PowGradExponent => {
                if b > 0.0 {
                    a * libm::logf(b) * c
                } else {
                    0.0
                }
            }
            TernaryFn::PickGrad => {
                if b == c {
                    a
                } else {
                    0.0
                }
            }
        }
    }

    /// The name reports print.
    pub const fn name(self) -> &'static str {
        match self {
            TernaryFn::Where => "Where",
            TernaryFn::DivGradDivisor => "DivGradDivisor",
            TernaryFn::PowGradBase => "PowGradBase",
            TernaryFn::PowGradExponent => "PowGradExponent",
            TernaryFn::PickGrad => "PickGrad",
        }
    }
}

impl Elementwise {
    /// The op's name.
    pub const fn name(&self) -> &'static str {
        match self {
            Elementwise::Unary { f, .. } => f.name(),
            Elementwise::Binary { f, .. } => f.name(),
            Elementwise::Ternary { f, .. } => f.name(),
        }
    }

    /// Operands.
    pub fn operands(&self) -> Operands {
        match *self {
            Elementwise::Unary { x, .. } => Operands::of(&[x]),
            Elementwise::Binary { a, b, .. } => Operands::of(&[a, b]),
            Elementwise::Ternary { a, b, c, .. } => Operands::of(&[a, b, c]),
        }
    }

    /// The same op reading `f(o)` for each operand `o` (a copy of a node elsewhere in the
    /// graph, as recomputation makes).
    pub(crate) fn map_operands(&self, f: &mut dyn FnMut(NodeId) -> NodeId) -> Self {
        let e = *self;
        match e {
            Elementwise::Unary { x, f: u } => Elementwise::Unary { x: f(x), f: u },
            Elementwise::Binary { a, b, f: g } => Elementwise::Binary {
                a: f(a),
                b: f(b),
                f: g,
            },
            Elementwise::Ternary { a, b, c, f: t } => Elementwise::Ternary {
                a: f(a),
                b: f(b),
                c: f(c),
                f: t,
            },
        }
    }
}

/// Builders.
impl<S: Storage> Graph<S> {
    /// `f(x)`, same shape; the operand must be a float type (except for a cast).
    pub fn unary(&mut self, name: &str, x: impl NodeRef, f: UnaryFn) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        self.float_operand(&n, f.name(), x)?;
        let node = self.node(x);
        let (shape, dtype) = (node.shape, node.dtype);
        let op = Op::Elementwise(Elementwise::Unary { x, f });
        self.push(n, op, shape, dtype, Roles::ACTIVATION)
    }

    /// `f(a, b)` with numpy broadcasting. Arithmetic needs two operands of one float type;
    /// comparisons any one type (the result is a `u8` mask); `And`/`Or` take masks.
    pub fn binary(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
        f: BinaryFn,
    ) -> Result<NodeId, GraphError> {
        let (a, b) = (a.resolve(self)?, b.resolve(self)?);
        let n = self.check_name(name)?;
        let dtype = if f.b_is_mask() {
            self.float_operand(&n, f.name(), a)?;
            self.node(a).dtype
        } else {
            let t = self.same_dtype(&n, f.name(), a, b)?;
            if !f.is_predicate() {
                self.float_operand(&n, f.name(), a)?;
            }
            if f.is_predicate() {
                DType::U8
            } else {
                t
            }
        };
        let (sa, sb) = (self.node(a).shape, self.node(b).shape);
        let shape = broadcast_shapes(sa, sb).ok_or_else(|| GraphError::ShapeMismatch {
            node: n.clone(),
            op: f.name(),
            rule: "operands must broadcast (numpy rules)",
            left: sa,
            right: sb,
        })?;
        let op = Op::Elementwise(Elementwise::Binary { a, b, f });
        self.push(n, op, shape, dtype, Roles::ACTIVATION)
    }

    /// ONNX `Where`: `a` where `cond` is non-zero, else `b`, all three broadcast together.
    pub fn select(
        &mut self,
        name: &str,
        cond: impl NodeRef,
        a: impl NodeRef,
        b: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        let (c, a, b) = (cond.resolve(self)?, a.resolve(self)?, b.resolve(self)?);
        let n = self.check_name(name)?;
        let dtype = self.same_dtype(&n, "Where", a, b)?;
        let (sc, sa, sb) = (self.node(c).shape, self.node(a).shape, self.node(b).shape);
        let mismatch = |left, right| GraphError::ShapeMismatch {
            node: n.clone(),
            op: "Where",
            rule: "condition and values must broadcast (numpy rules)",
            left,
            right,
        };
        let ab = broadcast_shapes(sa, sb).ok_or_else(|| mismatch(sa, sb))?;
        let shape = broadcast_shapes(sc, ab).ok_or_else(|| mismatch(sc, ab))?;
        let op = Op::Elementwise(Elementwise::Ternary {
            a: c,
            b: a,
            c: b,
            f: TernaryFn::Where,
        });
        self.push(n, op, shape, dtype, Roles::ACTIVATION)
    }

    /// Element-wise `a + b` (broadcast).
    pub fn add(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        self.binary(name, a, b, BinaryFn::Add)
    }

    /// Element-wise `a - b` (broadcast).
    pub fn sub(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        self.binary(name, a, b, BinaryFn::Sub)
    }

    /// Element-wise `a * b` (broadcast).
    pub fn mul(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        self.binary(name, a, b, BinaryFn::Mul)
    }

    /// Element-wise `a / b` (broadcast).
    pub fn div(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        self.binary(name, a, b, BinaryFn::Div)
    }

    /// `x + bias`, the rank-1 bias the size of x's last axis (a checked broadcast).
    pub fn bias_add(
        &mut self,
        name: &str,
        x: impl NodeRef,
        bias: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        let (x, bias) = (x.resolve(self)?, bias.resolve(self)?);
        let (sx, sb) = (self.node(x).shape, self.node(bias).shape);
        if sb.rank() != 1 || sx.rank() == 0 || sx.last() != sb.dim(0) {
            return Err(GraphError::ShapeMismatch {
                node: crate::error::name_lossy(name),
                op: "BiasAdd",
                rule: "bias must be rank 1, the size of x's last axis",
                left: sx,
                right: sb,
            });
        }
        self.binary(name, x, bias, BinaryFn::Add)
    }

    /// `x * factor`.
    pub fn scale(
        &mut self,
        name: &str,
        x: impl NodeRef,
        factor: f32,
    ) -> Result<NodeId, GraphError> {
        self.unary(name, x, UnaryFn::Scale(factor))
    }

    /// ReLU.
    pub fn relu(&mut self, name: &str, x: impl NodeRef) -> Result<NodeId, GraphError> {
        self.unary(name, x, UnaryFn::Relu)
    }

    /// Sigmoid.
    pub fn sigmoid(&mut self, name: &str, x: impl NodeRef) -> Result<NodeId, GraphError> {
        self.unary(name, x, UnaryFn::Sigmoid)
    }

    /// Tanh.
    pub fn tanh(&mut self, name: &str, x: impl NodeRef) -> Result<NodeId, GraphError> {
        self.unary(name, x, UnaryFn::Tanh)
    }

    /// Element type conversion (float to integer truncates toward zero and saturates).
    pub fn cast(
        &mut self,
        name: &str,
        x: impl NodeRef,
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        let shape = self.node(x).shape;
        let op = Op::Elementwise(Elementwise::Unary {
            x,
            f: UnaryFn::Identity,
        });
        self.push(n, op, shape, dtype, Roles::ACTIVATION)
    }
}

/// Runs `$body` with `$g` bound to a closure computing `$f.apply`; for the common functions
/// the function is a constant in the closure, so that the loops `$body` makes are vectorised.
macro_rules! with_binary {
    ($f:expr, |$g:ident| $body:expr) => {
        match $f {
            BinaryFn::Add => {
                let $g = |a, b| BinaryFn::Add.apply(a, b);
                $body
            }
            BinaryFn::Sub => {
                let $g = |a, b| BinaryFn::Sub.apply(a, b);
                $body
            }
            BinaryFn::Mul => {
                let $g = |a, b| BinaryFn::Mul.apply(a, b);
                $body
            }
            BinaryFn::ReluGrad => {
                let $g = |a, b| BinaryFn::ReluGrad.apply(a, b);
                $body
            }
            f => {
                let $g = |a, b| f.apply(a, b);
                $body
            }
        }
    };
}

/// The reference kernel.
pub(crate) fn run<S: Storage>(
    op: &Elementwise,
    node: &Node,
    ex: &mut Exec<'_, S>,
) -> Result<(), RunError> {
    let (ot, os) = (node.dtype, node.shape);
    let ins = &ex.ins;
    match *op {
        Elementwise::Unary { x, f } => {
            let (xt, xb, n) = (ins.dtype(x), ins.bytes(x), os.elements());
            // The common functions as constants, so that the loop is vectorised.
            match f {
                UnaryFn::Relu => k::map(xb, xt, ex.out, ot, n, |v| UnaryFn::Relu.apply(v)),
                UnaryFn::Identity => {
                    k::map(xb, xt, ex.out, ot, n, |v| UnaryFn::Identity.apply(v));
                }
                UnaryFn::Neg => k::map(xb, xt, ex.out, ot, n, |v| UnaryFn::Neg.apply(v)),
                UnaryFn::Scale(s) => k::map(xb, xt, ex.out, ot, n, |v| UnaryFn::Scale(s).apply(v)),
                f => k::map(xb, xt, ex.out, ot, n, |v| f.apply(v)),
            }
        }
        Elementwise::Binary { a, b, f } => {
            let (xa, xb) = (ins.bytes(a), ins.bytes(b));
            let (ta, tb) = (ins.dtype(a), ins.dtype(b));
            let (sa, sb) = (ins.shape(a), ins.shape(b));
            let same_types = ta == ot && tb == ot;
            if sa == os && sb == os && same_types {
                with_binary!(f, |g| k::zip(xa, xb, ot, ex.out, os.elements(), g));
            } else if same_types && ot == DType::F32 && sa == os && repeats(sb, os) {
                // `b` repeats along the leading axes (a bias): row after row of `a`.
                let row = 4 * sb.elements();
                with_binary!(f, |g| {
                    for (o, x) in ex.out.chunks_exact_mut(row).zip(xa.chunks_exact(row)) {
                        k::zip(x, xb, ot, o, row / 4, g);
                    }
                });
            } else if same_types && ot == DType::F32 && sb == os && repeats(sa, os) {
                let row = 4 * sa.elements();
                with_binary!(f, |g| {
                    for (o, y) in ex.out.chunks_exact_mut(row).zip(xb.chunks_exact(row)) {
                        k::zip(xa, y, ot, o, row / 4, g);
                    }
                });
            } else {
                let out = &mut *ex.out;
                broadcast_walk(os, [sa, sb], |o, [i, j]| {
                    let v = f.apply(k::load(xa, ta, i), k::load(xb, tb, j));
                    k::store(out, ot, o, v);
                });
            }
        }
        Elementwise::Ternary { a, b, c, f } => {
            let (xa, xb, xc) = (ins.bytes(a), ins.bytes(b), ins.bytes(c));
            let (ta, tb, tc) = (ins.dtype(a), ins.dtype(b), ins.dtype(c));
            let shapes = [ins.shape(a), ins.shape(b), ins.shape(c)];
            let out = &mut *ex.out;
            broadcast_walk(os, shapes, |o, [i, j, l]| {
                let v = f.apply(k::load(xa, ta, i), k::load(xb, tb, j), k::load(xc, tc, l));
                k::store(out, ot, o, v);
            });
        }
    }
    Ok(())
}

/// Whether a tensor of shape `small` broadcast to `out` is `small`'s elements repeated one
/// after another: its dimensions, leading 1s aside, are `out`'s last ones.
fn repeats(small: Shape, out: Shape) -> bool {
    let dims = small.dims();
    let first = dims.iter().position(|&d| d != 1).unwrap_or(dims.len());
    let (tail, od) = (&dims[first..], out.dims());
    small.elements() > 0 && tail.len() <= od.len() && od.ends_with(tail)
}

fn binary(a: NodeId, b: NodeId, f: BinaryFn) -> Op {
    Op::Elementwise(Elementwise::Binary { a, b, f })
}

fn ternary(a: NodeId, b: NodeId, c: NodeId, f: TernaryFn) -> Op {
    Op::Elementwise(Elementwise::Ternary { a, b, c, f })
}

/// A gradient for operand `x` computed at the output's shape, summed back to `x`'s shape.
fn reduce_into<S: Storage>(
    bp: &mut Backprop<'_, S>,
    x: NodeId,
    op: Op,
    out: Shape,
) -> Result<(), GraphError> {
    let dt = bp.meta(x).1;
    let g = bp.node(x, op, out, dt)?;
    let g = bp.sum_to(x, g)?;
    bp.contribute(x, g)
}

/// The gradient.
pub(crate) fn backward<S: Storage>(
    op: &Elementwise,
    bp: &mut Backprop<'_, S>,
    id: NodeId,
    dy: NodeId,
) -> Result<(), GraphError> {
    let out = bp.graph.node(id).shape;
    match *op {
        Elementwise::Unary { x, f } => {
            if !bp.wants(x) {
                return Ok(());
            }
            let g = match f {
                UnaryFn::Identity | UnaryFn::Neg | UnaryFn::Scale(_) => {
                    Op::Elementwise(Elementwise::Unary { x: dy, f })
                }
                UnaryFn::Relu => binary(dy, id, BinaryFn::ReluGrad),
                UnaryFn::Sigmoid => binary(dy, id, BinaryFn::SigmoidGrad),
                UnaryFn::Tanh => binary(dy, id, BinaryFn::TanhGrad),
                UnaryFn::Exp => binary(dy, id, BinaryFn::Mul),
                UnaryFn::Log => binary(dy, x, BinaryFn::Div),
                UnaryFn::Sqrt => binary(dy, id, BinaryFn::SqrtGrad),
                UnaryFn::Erf => binary(dy, x, BinaryFn::ErfGrad),
                UnaryFn::Gelu(form) => binary(dy, x, BinaryFn::GeluGrad(form)),
                UnaryFn::Clip { min, max } => binary(dy, x, BinaryFn::ClipGrad { min, max }),
            };
            bp.pass(x, g)
        }
        Elementwise::Binary { a, b, f } => binary_backward(bp, (a, b, f), id, dy, out),
        Elementwise::Ternary { a, b, c, f } => match f {
            TernaryFn::Where => {
                for (x, keep) in [(b, BinaryFn::Keep), (c, BinaryFn::Drop)] {
                    if bp.wants(x) {
                        reduce_into(bp, x, binary(dy, a, keep), out)?;
                    }
                }
                Ok(())
            }
            // Gradients' own functions: not differentiated again.
            TernaryFn::DivGradDivisor
            | TernaryFn::PowGradBase
            | TernaryFn::PowGradExponent
            | TernaryFn::PickGrad => Err(bp.not_differentiable(id)),
        },
    }
}

/// The gradients of binary op `f` of `a` and `b` (node `id`, whose gradient is `dy`, of
/// shape `out`), each reduced to its operand's shape.
fn binary_backward<S: Storage>(
    bp: &mut Backprop<'_, S>,
    (a, b, f): (NodeId, NodeId, BinaryFn),
    id: NodeId,
    dy: NodeId,
    out: Shape,
) -> Result<(), GraphError> {
    let (da, db) = match f {
        BinaryFn::Add => (Grad::Upstream, Grad::Upstream),
        BinaryFn::Sub => (
            Grad::Upstream,
            Grad::Of(Op::Elementwise(Elementwise::Unary {
                x: dy,
                f: UnaryFn::Neg,
            })),
        ),
        BinaryFn::Mul => {
            // A normalised operand (a norm's scale) is whitened again from the norm's
            // input where a gradient reads it, as popnn's norm gradients do
            // (`batchNormGradients`, `normParamGradients`): the backward pass keeps
            // the input, which the norm's own gradient reads, not the normalised copy.
            let (a2, b2) = (
                if bp.wants(b) {
                    whitened_again(bp, a)?
                } else {
                    a
                },
                if bp.wants(a) {
                    whitened_again(bp, b)?
                } else {
                    b
                },
            );
            (
                Grad::Of(binary(dy, b2, BinaryFn::Mul)),
                Grad::Of(binary(dy, a2, BinaryFn::Mul)),
            )
        }
        BinaryFn::Div => (
            Grad::Of(binary(dy, b, BinaryFn::Div)),
            Grad::Of(ternary(dy, id, b, TernaryFn::DivGradDivisor)),
        ),
        BinaryFn::Pow => (
            Grad::Of(ternary(dy, a, b, TernaryFn::PowGradBase)),
            Grad::Of(ternary(dy, a, id, TernaryFn::PowGradExponent)),
        ),
        BinaryFn::Max | BinaryFn::Min => (
            Grad::Of(ternary(dy, a, id, TernaryFn::PickGrad)),
            Grad::Of(ternary(dy, b, id, TernaryFn::PickGrad)),
        ),
        // Masks carry no gradient.
        BinaryFn::Equal
        | BinaryFn::Less
        | BinaryFn::LessOrEqual
        | BinaryFn::Greater
        | BinaryFn::GreaterOrEqual
        | BinaryFn::And
        | BinaryFn::Or => (Grad::None, Grad::None),
        BinaryFn::Keep | BinaryFn::Drop => (Grad::Of(binary(dy, b, f)), Grad::None),
        // Gradients of gradients: not differentiated again.
        BinaryFn::ReluGrad
        | BinaryFn::SigmoidGrad
        | BinaryFn::TanhGrad
        | BinaryFn::SqrtGrad
        | BinaryFn::ErfGrad
        | BinaryFn::GeluGrad(_)
        | BinaryFn::ClipGrad { .. } => return Err(bp.not_differentiable(id)),
    };
    for (x, g) in [(a, da), (b, db)] {
        if !bp.wants(x) {
            continue;
        }
        match g {
            Grad::None => {}
            Grad::Upstream => {
                let g = bp.sum_to(x, dy)?;
                bp.contribute(x, g)?;
            }
            Grad::Of(g) => reduce_into(bp, x, g, out)?,
        }
    }
    Ok(())
}

/// `v` computed again in the backward pass when it is a normalisation's output (from the
/// same input, so the same values bit for bit), else `v`.
fn whitened_again<S: Storage>(bp: &mut Backprop<'_, S>, v: NodeId) -> Result<NodeId, GraphError> {
    match bp.graph.node(v).op {
        op @ Op::Norm(crate::ops::norm::Norm::Normalize { .. }) => bp.again(v, op),
        _ => Ok(v),
    }
}

/// An operand's gradient: none, the upstream gradient itself, or a new node's.
enum Grad {
    None,
    Upstream,
    Of(Op),
}
