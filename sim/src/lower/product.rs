//! What a product is, for the lowering: an op that is `[m, k] x [k, n]` per group (a matmul,
//! or a convolution seen as one, `lower/conv.rs`), and which elements each block of it reads
//! and writes. `lower/matmul.rs` plans and lowers every product alike; the ops say only how
//! they are one.

use crate::planner::LaidOut;
use crate::program::Region;

/// Element ranges `[start, end)`.
pub(crate) type Range = (u64, u64);

/// The regions a block (group, rows, reduction range, columns) reads.
pub(crate) type BlockReads = Box<dyn Fn(usize, Range, Range, Range) -> Vec<Region>>;

/// Element spans of a block of an operand or the output: (group, rows, columns).
pub(crate) type BlockSpans = Box<dyn Fn(usize, Range, Range) -> Vec<(u64, u64)>>;

/// An op that is a product per group, and how its blocks touch memory.
pub(crate) struct Product {
    /// Independent groups, each planned on `tiles_per_group` tiles.
    pub groups: usize,
    /// Rows, reduction length and columns of each group's product.
    pub m: u64,
    /// The reduction (`k`) length.
    pub k: u64,
    /// Columns.
    pub n: u64,
    /// Tiles each group's plan uses.
    pub tiles_per_group: u64,
    /// Which operands are laid out by the plan: a weight as the right-hand operand, a state
    /// tensor first read here as the left-hand one.
    pub laid_out: LaidOut,
    /// The regions a block (group, rows, reduction range, columns) reads.
    pub reads: BlockReads,
    /// Output element spans of (group, rows, columns).
    pub out: BlockSpans,
    /// Right-hand operand element spans of (group, reduction range, columns), when it can be
    /// laid out by the plan.
    pub b: Option<BlockSpans>,
    /// Left-hand operand element spans of (group, rows, reduction range), when it can be laid
    /// out by the plan.
    pub a: Option<BlockSpans>,
    /// The geometry of a convolution's activation operand `a` (its blocks bring their
    /// receptive field), for the planner; `None` for a matmul and a weight-update pass.
    pub field: Option<crate::planner::Field>,
    /// Positions of the kernel in poplin's view of the product: 1 for a matmul, the kernel's
    /// for a convolution's forward and input-gradient passes, the output field's for its
    /// weight update. With `k`, it decides whether the AMP can write a narrow output
    /// (`crate::planner::casts_partials`).
    pub kernel_area: u64,
}
