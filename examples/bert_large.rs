//! Builds a BERT-Large training graph (24 layers, hidden 1024, 16 heads, sequence 128, Adam,
//! gradient accumulation), plans it, and lowers and estimates it on four pipelined Mk2 IPUs,
//! printing how long each step takes and how big the graph is.
//!
//! `cargo run --release --example bert_large [-- BATCH]`

use std::time::Instant;

use tessera::core::models::{bert, Bert};
use tessera::core::{Accumulation, DType, Graph, Optimizer, Plan};
use tessera::sim::system::{estimate_system, SystemOptions};
use tessera::sim::{Heap, IpuConfig, Preset};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let batch: usize = std::env::args().nth(1).map_or(Ok(1), |b| b.parse())?;
    let t0 = Instant::now();
    let mut g: Graph<Heap> = Graph::new();
    let cfg = Bert::large(128, batch, 4);
    let nodes = bert(&mut g, &cfg, DType::F16)?;
    let forward = g.len();
    g.differentiate_accumulating(nodes.loss, Optimizer::adam(1e-4), Accumulation::new(16))?;
    let built = t0.elapsed();
    let plan = Plan::new(&g)?;
    let planned = t0.elapsed();
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let opts = SystemOptions {
        micro_batch: batch as u64,
        allow_out_of_memory: true,
        ..SystemOptions::default()
    };
    let e = estimate_system(&plan, &mk2, &opts)?;
    let estimated = t0.elapsed();
    println!(
        "BERT-Large, batch {batch}, sequence 128, fp16, Adam, 4 pipeline stages, M = 16: {} nodes ({forward} forward), {} state bytes",
        g.len(),
        plan.state_bytes()
    );
    println!(
        "built in {:.2} s, planned in {:.2} s, lowered and estimated in {:.2} s ({:.2} s in all)",
        built.as_secs_f64(),
        (planned - built).as_secs_f64(),
        (estimated - planned).as_secs_f64(),
        estimated.as_secs_f64()
    );
    for (k, ipu) in e.ipus.iter().enumerate() {
        println!(
            "IPU {k}: {:.1} MiB, fullest tile {} B",
            ipu.bytes_used as f64 / (1 << 20) as f64,
            ipu.max_tile_bytes
        );
    }
    println!(
        "fits: {}; cycles per weight update {}; {:.1} samples/s",
        e.fits, e.cycles_per_weight_update, e.samples_per_second
    );
    Ok(())
}
