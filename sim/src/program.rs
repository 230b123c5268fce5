//! A lowered program: tensors mapped onto tiles, and a sequence of steps (exchanges, compute
//! sets of vertices, host streams) that the engine runs as BSP supersteps.

use tessera_core::DType;

/// A tile's index on its IPU.
pub type TileId = u32;

/// Elements `[start, start + len)` of a tensor's flattened data, held by `tile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Interval {
    /// The tile holding them.
    pub tile: TileId,
    /// First element.
    pub start: u64,
    /// Number of elements.
    pub len: u64,
}

impl Interval {
    /// One past the last element.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// Where every element of a tensor lives: intervals sorted by `start`, disjoint, covering
/// `0..elements`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    intervals: Vec<Interval>,
}

impl Mapping {
    /// A mapping from intervals; sorts them. The caller guarantees they are disjoint and cover
    /// the tensor (the checker verifies it).
    pub fn from_intervals(mut intervals: Vec<Interval>) -> Self {
        intervals.sort_by_key(|i| i.start);
        Mapping { intervals }
    }

    /// The whole tensor on one tile.
    pub fn single(elements: u64, tile: TileId) -> Self {
        Mapping {
            intervals: vec![Interval {
                tile,
                start: 0,
                len: elements,
            }],
        }
    }

    /// Spread over `tiles` consecutive tiles from `first_tile` (wrapping at `tile_count`), in
    /// chunks that are multiples of `grain` elements: the fewest tiles that keep every chunk
    /// at least `min_chunk` elements.
    pub fn linear(
        elements: u64,
        grain: u64,
        min_chunk: u64,
        first_tile: TileId,
        tiles: u32,
        tile_count: u32,
    ) -> Self {
        let grain = grain.max(1);
        let per = elements
            .div_ceil(u64::from(tiles.max(1)))
            .max(min_chunk.max(1));
        let per = per.div_ceil(grain) * grain;
        let mut intervals = Vec::with_capacity(elements.div_ceil(per) as usize);
        let mut start = 0;
        let mut k: u64 = 0;
        while start < elements {
            let len = per.min(elements - start);
            let tile = ((u64::from(first_tile) + k) % u64::from(tile_count.max(1))) as TileId;
            intervals.push(Interval { tile, start, len });
            start += len;
            k += 1;
        }
        Mapping { intervals }
    }

    /// The intervals, sorted by start.
    pub fn intervals(&self) -> &[Interval] {
        &self.intervals
    }

    /// Calls `f(tile, start, len)` for every part of `[start, start + len)`, in order.
    pub fn for_each_piece(&self, start: u64, len: u64, mut f: impl FnMut(TileId, u64, u64)) {
        let end = start + len;
        let mut i = self.intervals.partition_point(|iv| iv.end() <= start);
        while i < self.intervals.len() && self.intervals[i].start < end {
            let iv = self.intervals[i];
            let s = iv.start.max(start);
            let e = iv.end().min(end);
            if e > s {
                f(iv.tile, s, e - s);
            }
            i += 1;
        }
    }

    /// Elements held by each tile, as (tile, elements), sorted by tile.
    pub fn elements_per_tile(&self) -> Vec<(TileId, u64)> {
        let mut v: Vec<(TileId, u64)> = self.intervals.iter().map(|i| (i.tile, i.len)).collect();
        v.sort_unstable();
        let mut out: Vec<(TileId, u64)> = Vec::with_capacity(v.len());
        for (t, n) in v {
            match out.last_mut() {
                Some((lt, ln)) if *lt == t => *ln += n,
                _ => out.push((t, n)),
            }
        }
        out
    }

    /// Number of distinct tiles.
    pub fn tile_count(&self) -> usize {
        self.elements_per_tile().len()
    }
}

/// What a program tensor is, for memory reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorClass {
    /// A graph tensor live for the whole program (variables, optimizer state, constants).
    AlwaysLive,
    /// A graph tensor with a live range (inputs, activations, gradients).
    NotAlwaysLive,
    /// A temporary the lowering made (partial sums, gathered operands).
    Temporary,
}

/// A tensor of the program: a graph node's output or a temporary of the lowering.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgTensor {
    /// A name for reports (the node's name, or `<node>/partials`).
    pub name: String,
    /// The graph node it belongs to.
    pub node: u16,
    /// Element type.
    pub dtype: DType,
    /// Element count.
    pub elements: u64,
    /// Where its elements live.
    pub mapping: Mapping,
    /// Memory class.
    pub class: TensorClass,
    /// First and last program step at which it holds live data (inclusive).
    pub live: (usize, usize),
}

impl ProgTensor {
    /// Bytes per element.
    pub fn elem_bytes(&self) -> u64 {
        self.dtype.size() as u64
    }
}

/// Elements `[start, start + len)` of program tensor `tensor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Region {
    /// Index into [`Program::tensors`].
    pub tensor: u32,
    /// First element.
    pub start: u64,
    /// Number of elements.
    pub len: u64,
}

/// The codelet a vertex runs (decides its code size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Codelet {
    /// Element-wise binary op.
    Binary,
    /// Element-wise unary op.
    Unary,
    /// Copy.
    Copy,
    /// Cast.
    Cast,
    /// Matrix-multiply partial on the AMP.
    MatMulPartial,
    /// Reduction (of partial sums or along an axis).
    Reduce,
    /// Row-wise softmax or its gradient.
    Softmax,
    /// Cross-entropy or its gradient.
    CrossEntropy,
    /// Weight update (scaled add and optimizer variants).
    Update,
    /// Broadcast along an axis.
    Broadcast,
}

impl Codelet {
    /// Bytes of code the codelet occupies on every tile that runs it (estimates, the order of
    /// the poplibs codelets' sizes).
    pub const fn code_bytes(self) -> u64 {
        match self {
            Codelet::Binary | Codelet::Unary | Codelet::Cast => 320,
            Codelet::Copy | Codelet::Broadcast => 160,
            Codelet::MatMulPartial => 1_536,
            Codelet::Reduce => 480,
            Codelet::Softmax | Codelet::CrossEntropy => 640,
            Codelet::Update => 384,
        }
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
    /// Bytes of vertex state: a descriptor plus a pointer and length per edge (estimate).
    pub fn state_bytes(&self) -> u64 {
        16 + 8 * (self.reads.len() + self.writes.len()) as u64
    }
}

/// A set of vertices that run in parallel in one compute phase.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputeSet {
    /// Name for reports (`<node>/<phase>`).
    pub name: String,
    /// The graph node it implements.
    pub node: u16,
    /// Its vertices.
    pub vertices: Vec<Vertex>,
}

/// One transfer of an exchange: elements of a tensor copied from one tile to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Transfer {
    /// Receiving tile.
    pub to: TileId,
    /// The data (elements of a program tensor).
    pub region: Region,
    /// Sending tile.
    pub from: TileId,
}

/// A step of the program.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Moves operands to the tiles of the compute set that follows.
    Exchange {
        /// The graph node whose compute set needs them.
        node: u16,
        /// Every transfer, sorted.
        transfers: Vec<Transfer>,
    },
    /// A compute phase.
    Compute(ComputeSet),
    /// Data from the host (an infeed) into a tensor's tiles.
    HostToDevice {
        /// The tensor.
        tensor: u32,
        /// Bytes moved.
        bytes: u64,
    },
    /// Data from a tensor's tiles to the host (an outfeed, a tap or a loss).
    DeviceToHost {
        /// The tensor.
        tensor: u32,
        /// Bytes moved.
        bytes: u64,
    },
}

/// A lowered program for one IPU.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// Tiles of the IPU it was lowered for.
    pub tiles: u32,
    /// Graph tensors first (index = node index; update nodes have an empty tensor), then
    /// temporaries.
    pub tensors: Vec<ProgTensor>,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// For each graph node, the range of steps that implement it.
    pub node_steps: Vec<(usize, usize)>,
    /// Graph node names, for reports.
    pub node_names: Vec<String>,
    /// Nodes an inference run executes (a prefix).
    pub forward_nodes: usize,
}

impl Program {
    /// Number of vertices over all compute sets.
    pub fn vertex_count(&self) -> usize {
        self.steps
            .iter()
            .map(|s| match s {
                Step::Compute(cs) => cs.vertices.len(),
                _ => 0,
            })
            .sum()
    }
}

/// The exchange a compute set needs: a transfer for every piece of every region a vertex reads
/// that lives on another tile, sorted and without duplicates.
pub fn exchange_for(tensors: &[ProgTensor], vertices: &[Vertex]) -> Vec<Transfer> {
    let mut transfers = Vec::new();
    for v in vertices {
        for r in &v.reads {
            tensors[r.tensor as usize].mapping.for_each_piece(
                r.start,
                r.len,
                |tile, start, len| {
                    if tile != v.tile {
                        transfers.push(Transfer {
                            to: v.tile,
                            region: Region {
                                tensor: r.tensor,
                                start,
                                len,
                            },
                            from: tile,
                        });
                    }
                },
            );
        }
    }
    transfers.sort_unstable();
    transfers.dedup();
    transfers
}
