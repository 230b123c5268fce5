//! Vertices and compute sets: the codelet a vertex runs, its type, its state and cost, and the
//! compute sets they make up.

use tessera_core::NodeId;

use super::{Region, TensorId, TileId};
/// The codelet a vertex runs (decides its code size). A tile holds the code of each distinct
/// vertex type it runs once, and a vertex type is a codelet with its template parameters:
/// `popops::BinaryOp1D<ADD, half>` and `popops::BinaryOp1D<MULTIPLY, half>` are two types
/// with two copies of code, as PopVision lists them and PopLiner sums them (vertex code by
/// `vertex.type.name`, `popliner/stage.py`). So the element-wise codelets carry their
/// function and element types ([`VertexType`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Codelet {
    /// Element-wise binary op of one function and element type.
    Binary(VertexType),
    /// Element-wise unary op of one function and element type.
    Unary(VertexType),
    /// Copy.
    Copy,
    /// Cast from one element type to another.
    Cast(VertexType),
    /// Matrix-multiply partial on the AMP.
    MatMulPartial,
    /// Reduction (of partial sums or along an axis) of one operation ([`REDUCE_ADD`],
    /// [`REDUCE_MAX`], [`REDUCE_SQUARE_ADD`], [`REDUCE_OTHER`]) and element types: popops'
    /// `Reduce` vertices are templated on both.
    Reduce(VertexType),
    /// Row-wise softmax or its gradient.
    Softmax,
    /// Cross-entropy or its gradient.
    CrossEntropy,
    /// Weight update (scaled add and optimizer variants).
    Update,
    /// Broadcast along an axis.
    Broadcast,
    /// Rows of a table by index, their gradients added back by index, or one-hot encodings:
    /// popops' `MultiSlice`, `MultiUpdateAdd` and `EncodeOneHot`, one vertex type each
    /// ([`GATHER_ROWS`], [`SCATTER_ADD_ROWS`], [`ONE_HOT`] with the element type).
    Gather(VertexType),
}

/// [`Codelet::Reduce`]'s operation: a sum (poplibs' `ReduceAdd`).
pub const REDUCE_ADD: u8 = 1;
/// [`Codelet::Reduce`]'s operation: a maximum (`ReduceMax`).
pub const REDUCE_MAX: u8 = 2;
/// [`Codelet::Reduce`]'s operation: a sum and a sum of squares (a norm's statistics,
/// `ReduceSquareAdd` beside `ReduceAdd`).
pub const REDUCE_SQUARE_ADD: u8 = 3;
/// [`Codelet::Reduce`]'s operation: a reduction with its own expression (pooling windows, a
/// loss's rows, an optimizer's norms).
pub const REDUCE_OTHER: u8 = 4;

/// [`Codelet::Gather`]'s function: rows by index (`MultiSlice`).
pub const GATHER_ROWS: u8 = 1;
/// [`Codelet::Gather`]'s function: gradient rows added by index (`MultiUpdateAdd`).
pub const SCATTER_ADD_ROWS: u8 = 2;
/// [`Codelet::Gather`]'s function: one-hot encoding (`EncodeOneHot`).
pub const ONE_HOT: u8 = 3;

impl Codelet {
    /// Bytes of code the codelet occupies on every tile that runs it (estimates, the order of
    /// the poplibs codelets' sizes).
    pub const fn code_bytes(self) -> u64 {
        match self {
            Codelet::Binary(_) | Codelet::Unary(_) | Codelet::Cast(_) | Codelet::Gather(_) => 320,
            Codelet::Copy | Codelet::Broadcast => 160,
            Codelet::MatMulPartial => 1_536,
            Codelet::Reduce(_) => 480,
            Codelet::Softmax | Codelet::CrossEntropy => 640,
            Codelet::Update => 384,
        }
    }
}

/// The template parameters that make a codelet a distinct vertex type: an index of its
/// function (the lowering's own numbering of binary and unary functions; 0 for a cast) and
/// its element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VertexType {
    /// The function, numbered by the lowering that makes the vertex.
    pub function: u8,
    /// The element type read.
    pub input: u8,
    /// The element type written.
    pub output: u8,
}

impl VertexType {
    /// Function `function` reading and writing `dtype`.
    pub fn of(function: u8, dtype: tessera_core::DType) -> Self {
        VertexType {
            function,
            input: dtype_index(dtype),
            output: dtype_index(dtype),
        }
    }

    /// A cast from `from` to `to`.
    pub fn cast(from: tessera_core::DType, to: tessera_core::DType) -> Self {
        VertexType {
            function: 0,
            input: dtype_index(from),
            output: dtype_index(to),
        }
    }
}

fn dtype_index(d: tessera_core::DType) -> u8 {
    match d {
        tessera_core::DType::F32 => 0,
        tessera_core::DType::F16 => 1,
        tessera_core::DType::I32 => 2,
        tessera_core::DType::U8 => 3,
    }
}

/// One vertex: a codelet instance on a tile, with the data it reads and writes.
#[derive(Clone, Debug, PartialEq)]
pub struct Vertex {
    /// The tile it runs on.
    pub tile: TileId,
    /// What it runs.
    pub codelet: Codelet,
    /// Its cost in tile cycles.
    pub cycles: u64,
    /// Data it reads (must be on its tile when the compute set runs).
    pub reads: Vec<Region>,
    /// Data it writes (on its tile).
    pub writes: Vec<Region>,
}

impl Vertex {
    /// Bytes of vertex state, field by field as poplibs' codelets lay them out: a pointer
    /// ([`VERTEX_STATE_PER_READ_BYTES`], `ONE_PTR`) for each region read and a pointer with
    /// its count ([`VERTEX_STATE_PER_WRITE_BYTES`], `SPAN`) for each region written, a region
    /// both read and written (in place) once, as a `SPAN`. An AMP vertex's is its struct
    /// ([`AMP_VERTEX_STATE_BYTES`]).
    pub fn state_bytes(&self) -> u64 {
        if self.codelet == Codelet::MatMulPartial {
            // The AMP vertex's state is its struct, whatever regions it covers: their
            // pointers are the contents of its vectors (vertex field data).
            return AMP_VERTEX_STATE_BYTES;
        }
        let in_place = if self.writes.len() <= 8 {
            self.reads
                .iter()
                .filter(|r| self.writes.contains(r))
                .count()
        } else if self.reads.is_sorted() && self.writes.is_sorted() {
            // Both sorted (as joined regions are): one walk over the two.
            let mut w = self.writes.iter().peekable();
            self.reads
                .iter()
                .filter(|r| {
                    while w.next_if(|x| x < r).is_some() {}
                    w.peek() == Some(r)
                })
                .count()
        } else {
            let mut w = self.writes.clone();
            w.sort_unstable();
            self.reads
                .iter()
                .filter(|r| w.binary_search(r).is_ok())
                .count()
        } as u64;
        VERTEX_STATE_PER_READ_BYTES * (self.reads.len() as u64 - in_place)
            + VERTEX_STATE_PER_WRITE_BYTES * self.writes.len() as u64
    }
}

/// Vertex state of an AMP vertex (poplin's `ConvPartial1x1Out`,
/// `lib/poplin/codelets/ConvPartial1x1Out.cpp`): its `in`, `weights` and `out` vectors and its
/// `worklists` are one 4-byte pointer each, and its eight counts and strides
/// (`numConvGroupsM1`, `numOutGroupsM1`, `numInGroups`, `transformedInStride`,
/// `outChansPerGroup`, `transformedOutStride`, `inChansPerGroup` and the limited version's
/// 16-bit types) two bytes each: 32 bytes.
pub const AMP_VERTEX_STATE_BYTES: u64 = 4 * 4 + 8 * 2;

/// Vertex state per region a vertex reads: an input pointer without a count (`ONE_PTR`; poplibs'
/// `binaryOps1D.S`: `VERTEX_IN1_PTR_OFFSET 0`, `VERTEX_IN2_PTR_OFFSET 4`).
pub const VERTEX_STATE_PER_READ_BYTES: u64 = 4;
/// Vertex state per region a vertex writes: a pointer and its element count (`SPAN`; poplibs'
/// `binaryOps1D.S`: `VERTEX_OUT_PTR_OFFSET 8`, `VERTEX_OUT_COUNT_OFFSET 12`). A 1-D binary op
/// is then 16 bytes and a unary op 12, as poplibs' `BinaryOp1D` and `UnaryOp1D` are.
pub const VERTEX_STATE_PER_WRITE_BYTES: u64 = 8;

/// What estimates need of a vertex: where it runs, its codelet, its cycles and its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VertexCost {
    /// The tile it runs on.
    pub tile: TileId,
    /// Its codelet.
    pub codelet: Codelet,
    /// Worker cycles.
    pub cycles: u64,
    /// Bytes of vertex state ([`Vertex::state_bytes`]).
    pub state_bytes: u64,
}

impl From<&Vertex> for VertexCost {
    fn from(v: &Vertex) -> Self {
        VertexCost {
            tile: v.tile,
            codelet: v.codelet,
            cycles: v.cycles,
            state_bytes: v.state_bytes(),
        }
    }
}

/// A set of vertices that run in parallel in one compute phase.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputeSet {
    /// Name for reports (`<node>/<phase>`).
    pub name: String,
    /// The graph node it implements.
    pub node: NodeId,
    /// Its vertices: empty when the lowering kept only what estimates need (`costs` and
    /// `touched`), as estimates of large models do.
    pub vertices: Vec<Vertex>,
    /// What estimates need of each vertex (made from `vertices` by [`ComputeSet::new`]),
    /// shared by the copies: a node's lowering reused by identical nodes keeps its costs once.
    pub costs: std::sync::Arc<[VertexCost]>,
    /// The tensors its vertices read or write, sorted, each once.
    pub touched: Vec<TensorId>,
}

impl ComputeSet {
    /// A compute set of `vertices`, with their costs and the tensors they touch.
    pub fn new(name: String, node: NodeId, vertices: Vec<Vertex>) -> Self {
        let costs = vertices.iter().map(VertexCost::from).collect();
        // A vertex's regions come by tensor: a tensor is listed once for each run of its
        // regions (not once per region) before sorting, which a large compute set's millions
        // of regions made most of the work.
        let mut touched: Vec<TensorId> = Vec::new();
        for r in vertices
            .iter()
            .flat_map(|v| v.reads.iter().chain(&v.writes))
        {
            if touched.last() != Some(&r.tensor) {
                touched.push(r.tensor);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        ComputeSet {
            name,
            node,
            vertices,
            costs,
            touched,
        }
    }

    /// The compute set without its vertices (what estimates need is kept).
    pub fn without_vertices(mut self) -> Self {
        self.vertices = Vec::new();
        self
    }
}
