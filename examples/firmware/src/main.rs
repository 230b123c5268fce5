//! The MNIST convolutional network on a Cortex-M4F (QEMU `mps2-an386`), with tessera-core
//! alone.
//!
//! The weights were trained on the host (`cargo run --release --example train_mnist --
//! --model cnn --export-firmware examples/firmware/data`) and are embedded in flash, as are a
//! few test digits. The plan has no kernel workspaces (convolutions run as direct loops, with
//! the same sums as the host's), and its arena is a static buffer in RAM. Each prediction and its logits are
//! printed through semihosting to the host's stdout; the exit status of `debug::exit` becomes
//! QEMU's. Run with `scripts/run-firmware`.
#![no_std]
#![no_main]

use cortex_m_rt::entry;
use cortex_m_semihosting::{debug, hprintln};
// Panics print their message over semihosting and exit QEMU with a failure.
use panic_semihosting as _;
use tessera_core::models::mnist_cnn;
use tessera_core::{DType, Fixed, Graph, Plan};

/// The batch-1 inference plan's state: every variable, in the plan's layout.
static WEIGHTS: &[u8] = include_bytes!("../data/weights.bin");
/// 28 x 28 pixels per digit, 0 or 255.
static DIGITS: &[u8] = include_bytes!("../data/digits.bin");
/// One label per digit.
static LABELS: &[u8] = include_bytes!("../data/labels.bin");

/// The arena the plan runs in, reserved statically (checked against the plan at start-up).
const ARENA_BYTES: usize = 176 * 1024;
/// Nodes of the inference graph (it has 21).
const NODES: usize = 24;
const PIXELS: usize = 28 * 28;

#[entry]
fn main() -> ! {
    let code = match run() {
        Ok(()) => debug::EXIT_SUCCESS,
        Err(()) => debug::EXIT_FAILURE,
    };
    debug::exit(code);
    #[allow(clippy::empty_loop)]
    loop {}
}

fn run() -> Result<(), ()> {
    let mut g: Graph<Fixed<NODES>> = Graph::new();
    let model = mnist_cnn(&mut g, 1, DType::F32).map_err(|e| hprintln!("error: {}", e))?;
    let plan = Plan::with_workspaces(&g, false).map_err(|e| hprintln!("error: {}", e))?;
    let arena: &'static mut [u8; ARENA_BYTES] =
        cortex_m::singleton!(: [u8; ARENA_BYTES] = [0; ARENA_BYTES]).ok_or(())?;
    hprintln!(
        "plan: {} nodes, arena {} bytes (static buffer {}), weights {} bytes",
        g.len(),
        plan.arena_bytes(),
        ARENA_BYTES,
        WEIGHTS.len()
    );
    if WEIGHTS.len() != plan.state_bytes() {
        hprintln!(
            "error: weights.bin has {} bytes, the plan needs {}",
            WEIGHTS.len(),
            plan.state_bytes()
        );
        return Err(());
    }
    for (i, (digit, &label)) in DIGITS.chunks_exact(PIXELS).zip(LABELS).enumerate() {
        plan.fill_input(model.images, arena, PIXELS, |p| f32::from(digit[p]) / 255.0)
            .map_err(|e| hprintln!("error: {}", e))?;
        plan.infer(arena, WEIGHTS)
            .map_err(|e| hprintln!("error: {}", e))?;
        let logits = plan
            .tensor(model.logits, arena, WEIGHTS)
            .map_err(|e| hprintln!("error: {}", e))?;
        let mut l = [0f32; 10];
        for (c, v) in l.iter_mut().enumerate() {
            *v = logits.get(c);
        }
        let mut best = 0;
        for c in 1..10 {
            if l[c] > l[best] {
                best = c;
            }
        }
        hprintln!(
            "digit {}: label {} prediction {} logits {:?}",
            i,
            label,
            best,
            l
        );
    }
    Ok(())
}
