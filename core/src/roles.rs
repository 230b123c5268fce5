//! What a tensor is for: the categories memory reports group by and offload selects on.

bitflags::bitflags! {
    /// The roles of a tensor (a graph node's output). Several may hold at once: a tapped
    /// activation is both `ACTIVATION` and `TAPPED`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Roles: u16 {
        /// A weight the optimizer updates.
        const TRAINABLE = 1 << 0;
        /// Optimizer state: momentum, Adam moments, step counters.
        const OPTIMIZER_STATE = 1 << 1;
        /// A forward-pass intermediate.
        const ACTIVATION = 1 << 2;
        /// A gradient (or a backward-pass intermediate).
        const GRADIENT = 1 << 3;
        /// A constant fixed at build time.
        const CONSTANT = 1 << 4;
        /// Marked for the host to read (an outfeed tap).
        const TAPPED = 1 << 5;
        /// Fed by the host before a run.
        const INPUT = 1 << 6;
        /// Read by the host after a run; kept live to the end of the program.
        const OUTPUT = 1 << 7;
        /// The training loss.
        const LOSS = 1 << 8;
        /// Part of the backward pass (skipped when a training plan runs inference).
        const BACKWARD = 1 << 9;
        /// A weight-update op (writes variables and optimizer state in place). With gradient
        /// accumulation these run once per weight update, not once per micro-batch.
        const UPDATE = 1 << 10;
        /// A gradient accumulator (state that sums micro-batches' gradients).
        const ACCUMULATOR = 1 << 11;
        /// State the graph keeps but does not train: running averages of batch statistics,
        /// random-number step counters.
        const STATE = 1 << 12;
    }
}

impl Roles {
    /// Tensors that live for the whole program in the state buffer rather than the arena.
    pub const ALWAYS_LIVE: Roles = Roles::TRAINABLE
        .union(Roles::OPTIMIZER_STATE)
        .union(Roles::CONSTANT)
        .union(Roles::ACCUMULATOR)
        .union(Roles::STATE);
}

#[cfg(feature = "defmt")]
impl defmt::Format for Roles {
    fn format(&self, f: defmt::Formatter) {
        defmt::write!(f, "Roles({=u16:#x})", self.bits())
    }
}
