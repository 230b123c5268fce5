//! A BERT-shaped masked language model: the graph of `models::bert` builds, differentiates
//! with Adam and gradient accumulation, plans, trains (its loss falls on a learnable task),
//! and lowers and estimates on pipelined IPUs. BERT-Large itself is the `bert_large` example.

use tessera::core::models::{bert, Bert};
use tessera::core::rng::SplitMix64;
use tessera::core::{Accumulation, DType, Graph, Optimizer, Plan};
use tessera::sim::system::{estimate_system, SystemOptions};
use tessera::sim::{Heap, IpuConfig, Preset};

fn small(stages: usize) -> Bert {
    Bert {
        layers: 2,
        hidden: 32,
        heads: 4,
        intermediate: 64,
        sequence: 8,
        batch: 4,
        vocabulary: 20,
        stages,
    }
}

#[test]
fn a_small_bert_trains_and_estimates_on_pipelined_ipus() {
    let cfg = small(2);
    let mut g: Graph<Heap> = Graph::new();
    let n = bert(&mut g, &cfg, DType::F32).unwrap();
    g.differentiate_accumulating(n.loss, Optimizer::adam(3e-3), Accumulation::new(4))
        .unwrap();
    assert_eq!(g.stage_count(), 2);
    let plan = Plan::new(&g).unwrap();

    // The task: predict each masked token from its neighbours in sequences of the form
    // a, a+1, a+2, ... (mod the vocabulary); half the positions are masked.
    let mut arena = vec![0u8; plan.arena_bytes()];
    let mut state = vec![0u8; plan.state_bytes()];
    plan.init_state(&mut state, 7).unwrap();
    let mut rng = SplitMix64::new(1);
    let tokens = cfg.batch * cfg.sequence;
    let mut losses = Vec::new();
    for _ in 0..120 {
        let mut ids = Vec::with_capacity(tokens);
        let mut labels = Vec::with_capacity(tokens);
        for _ in 0..cfg.batch {
            let start = rng.below(cfg.vocabulary);
            for p in 0..cfg.sequence {
                let t = ((start + p) % cfg.vocabulary) as f32;
                let masked = rng.below(2) == 0;
                ids.push(if masked { 0.0 } else { t });
                labels.push(if masked { t } else { -100.0 });
            }
        }
        plan.write_input(n.input_ids, &mut arena, &ids).unwrap();
        plan.write_input(n.labels, &mut arena, &labels).unwrap();
        plan.train_step(&mut arena, &mut state).unwrap();
        losses.push(plan.tensor(n.loss, &arena, &state).unwrap().get(0));
    }
    let first: f32 = losses[..10].iter().sum::<f32>() / 10.0;
    let last: f32 = losses[losses.len() - 10..].iter().sum::<f32>() / 10.0;
    assert!(losses.iter().all(|l| l.is_finite()));
    assert!(last < 0.8 * first, "loss {first} -> {last}");

    let mk2 = IpuConfig::preset(Preset::Mk2);
    let opts = SystemOptions {
        micro_batch: cfg.batch as u64,
        ..SystemOptions::default()
    };
    let e = estimate_system(&plan, &mk2, &opts).unwrap();
    assert!(e.fits);
    assert_eq!(e.ipus.len(), 2);
    assert!(e.cycles_per_weight_update > 0);
}
