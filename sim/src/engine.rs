//! The engine: runs a plan's numerics on the host while the lowered program says what each
//! step costs on the machine.
//!
//! Numerics run a compute set at a time with the core's kernels (the same code the
//! microcontroller runs), so they equal the core's bit for bit; cycles come from the lowered
//! program, and do not depend on the data, so one costing serves every step.

use tessera_core::{NodeRef, Plan, RunError, TensorRef};

use crate::estimate::{estimate, Estimate, EstimateOptions, SimError};
use crate::machine::IpuConfig;
use crate::program::Program;

/// A plan lowered onto an IPU, with its buffers, ready to run steps.
pub struct Engine<const N: usize> {
    plan: Plan<N>,
    program: Program,
    estimate: Estimate,
    inference_estimate: Estimate,
    arena: Vec<u8>,
    state: Vec<u8>,
    steps_run: u64,
    cycles_run: u64,
}

impl<const N: usize> Engine<N> {
    /// Lowers and checks `plan` on `cfg`. Fails with the typed out-of-memory error when it does
    /// not fit (unless `opts.allow_out_of_memory`).
    pub fn new(plan: Plan<N>, cfg: &IpuConfig, opts: &EstimateOptions) -> Result<Self, SimError> {
        crate::use_fast_kernels();
        let (program, est) = estimate(&plan, cfg, opts)?;
        let inference_estimate = crate::estimate::estimate_program(
            &program,
            cfg,
            &EstimateOptions {
                inference: true,
                ..*opts
            },
        )?;
        let arena = vec![0u8; plan.arena_bytes()];
        let state = vec![0u8; plan.state_bytes()];
        Ok(Engine {
            plan,
            program,
            estimate: est,
            inference_estimate,
            arena,
            state,
            steps_run: 0,
            cycles_run: 0,
        })
    }

    /// The core plan.
    pub fn plan(&self) -> &Plan<N> {
        &self.plan
    }

    /// The lowered program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The estimate of one training step (the whole program).
    pub fn estimate(&self) -> &Estimate {
        &self.estimate
    }

    /// The estimate of one inference step (the forward pass).
    pub fn inference_estimate(&self) -> &Estimate {
        &self.inference_estimate
    }

    /// Initialises weights and optimizer state from `seed`.
    pub fn init_state(&mut self, seed: u64) -> Result<(), SimError> {
        self.plan
            .init_state(&mut self.state, seed)
            .map_err(SimError::Run)
    }

    /// Writes an input from a function of the element index (an infeed).
    pub fn fill_input(
        &mut self,
        x: impl NodeRef,
        len: usize,
        f: impl FnMut(usize) -> f32,
    ) -> Result<(), SimError> {
        self.plan
            .fill_input(x, &mut self.arena, len, f)
            .map_err(SimError::Run)
    }

    /// Runs one training step; returns its cycles.
    pub fn train_step(&mut self) -> Result<u64, SimError> {
        self.plan
            .train_step(&mut self.arena, &mut self.state)
            .map_err(SimError::Run)?;
        Ok(self.account(self.estimate.cycles_per_step))
    }

    /// Runs one inference step; returns its cycles.
    pub fn infer(&mut self) -> Result<u64, SimError> {
        self.plan
            .infer(&mut self.arena, &self.state)
            .map_err(SimError::Run)?;
        Ok(self.account(self.inference_estimate.cycles_per_step))
    }

    fn account(&mut self, cycles: u64) -> u64 {
        self.steps_run += 1;
        self.cycles_run += cycles;
        cycles
    }

    /// A tensor's data (outputs and taps after a step; weights at any time).
    pub fn tensor(&self, x: impl NodeRef) -> Result<TensorRef<'_>, RunError> {
        self.plan.tensor(x, &self.arena, &self.state)
    }

    /// The state buffer (weights and optimizer state).
    pub fn state(&self) -> &[u8] {
        &self.state
    }

    /// Steps run and their cycles so far.
    pub fn totals(&self) -> (u64, u64) {
        (self.steps_run, self.cycles_run)
    }
}
