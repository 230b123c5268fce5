//! Gradient accumulation: M micro-batches of b samples, combined by MEAN (or SUM with the
//! learning rate divided by M, or RUNNING_MEAN), give the weights of one step on M*b samples;
//! weights change only once every M micro-batches.

use crate::common;

use common::{close, weights};

use proptest::prelude::*;
use tessera::core::{
    Accumulation, AccumulationMethod, Activation, DType, Fixed, Graph, Optimizer, Plan, Roles,
};

fn mlp(batch: usize, hidden: usize, acc: Option<Accumulation>, opt: Optimizer) -> Plan<Fixed<64>> {
    let mut g: Graph<Fixed<64>> = Graph::new();
    let x = g.input("x", &[batch, 3], DType::F32).unwrap();
    let labels = g.input("labels", &[batch], DType::I32).unwrap();
    let h = g
        .dense("Dense_h", x, hidden, Activation::Tanh, DType::F32)
        .unwrap();
    let y = g
        .dense("Dense_out", h, 4, Activation::Softmax, DType::F32)
        .unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", y, labels, false)
        .unwrap();
    match acc {
        Some(a) => g.differentiate_accumulating(loss, opt, a).unwrap(),
        None => g.differentiate(loss, opt).unwrap(),
    }
    Plan::new(&g).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn accumulating_m_micro_batches_equals_one_big_batch(
        b in 1usize..5, m in 1u32..6, hidden in 1usize..6, seed in any::<u64>(),
        method in prop_oneof![Just(AccumulationMethod::Mean), Just(AccumulationMethod::Sum), Just(AccumulationMethod::RunningMean)],
        momentum in any::<bool>(),
    ) {
        let m_us = m as usize;
        let n = b * m_us;
        let lr = 0.5f32;
        // SUM adds M gradients of batch means: scale the learning rate to compare with a mean.
        let acc_lr = if method == AccumulationMethod::Sum { lr / m as f32 } else { lr };
        let opt = |lr| if momentum { Optimizer::momentum(lr, 0.9) } else { Optimizer::sgd(lr) };
        let big = mlp(n, hidden, None, opt(lr));
        let acc = Accumulation { count: m, method, dtype: None };
        let small = mlp(b, hidden, Some(acc), opt(acc_lr));
        let xs: Vec<f32> = (0..n * 3).map(|i| (((i as u64 * 2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0).collect();
        let ls: Vec<f32> = (0..n).map(|i| (((i as u64 * 40503) ^ seed) % 4) as f32).collect();

        let mut big_arena = vec![0u8; big.arena_bytes()];
        let mut big_state = vec![0u8; big.state_bytes()];
        big.init_state(&mut big_state, seed).unwrap();
        let mut arena = vec![0u8; small.arena_bytes()];
        let mut state = vec![0u8; small.state_bytes()];
        small.init_state(&mut state, seed).unwrap();
        let before = weights(&small, &state);
        close(&before, &weights(&big, &big_state))?;

        // Two weight updates.
        for round in 0..2 {
            big.write_input("x", &mut big_arena, &xs).unwrap();
            big.write_input("labels", &mut big_arena, &ls).unwrap();
            big.train_step(&mut big_arena, &mut big_state).unwrap();
            for k in 0..m_us {
                small.write_input("x", &mut arena, &xs[k * b * 3..(k + 1) * b * 3]).unwrap();
                small.write_input("labels", &mut arena, &ls[k * b..(k + 1) * b]).unwrap();
                let w0 = weights(&small, &state);
                small.train_step(&mut arena, &mut state).unwrap();
                if k + 1 < m_us {
                    prop_assert_eq!(weights(&small, &state), w0, "round {}: weights changed after micro-batch {}", round, k);
                }
            }
            close(&weights(&small, &state), &weights(&big, &big_state))?;
        }
    }
}

#[test]
fn fp16_weights_with_fp32_accumulators() {
    let mut g: Graph<Fixed<64>> = Graph::new();
    let x = g.input("x", &[2, 3], DType::F16).unwrap();
    let labels = g.input("labels", &[2], DType::I32).unwrap();
    let y = g.dense("D", x, 4, Activation::Linear, DType::F16).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", y, labels, true)
        .unwrap();
    let acc = Accumulation {
        count: 4,
        method: AccumulationMethod::Mean,
        dtype: Some(DType::F32),
    };
    g.differentiate_accumulating(loss, Optimizer::sgd(0.1), acc)
        .unwrap();
    let accs: Vec<_> = g
        .nodes()
        .iter()
        .filter(|n| n.roles().contains(Roles::ACCUMULATOR) && n.shape().rank() > 0)
        .collect();
    assert_eq!(accs.len(), 2);
    assert!(accs.iter().all(|n| n.dtype() == DType::F32));
    assert_eq!(g.accumulation_count(), 4);
    let plan = Plan::new(&g).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes()];
    let mut state = vec![0u8; plan.state_bytes()];
    plan.init_state(&mut state, 1).unwrap();
    plan.write_input("x", &mut arena, &[0.5, -1.0, 2.0, 1.0, 0.0, -0.5])
        .unwrap();
    plan.write_input("labels", &mut arena, &[1.0, 3.0]).unwrap();
    let w0 = plan
        .tensor("D/kernel:0", &arena, &state)
        .unwrap()
        .iter()
        .collect::<Vec<_>>();
    for _ in 0..4 {
        plan.train_step(&mut arena, &mut state).unwrap();
    }
    let w1 = plan
        .tensor("D/kernel:0", &arena, &state)
        .unwrap()
        .iter()
        .collect::<Vec<_>>();
    assert_ne!(w0, w1);
    assert_eq!(
        plan.tensor("optimizer/micro_batches", &arena, &state)
            .unwrap()
            .get(0),
        0.0
    );
    assert!(plan
        .tensor("D/kernel:0/accumulator", &arena, &state)
        .unwrap()
        .iter()
        .all(|v| v == 0.0));
}

#[test]
fn a_zero_accumulation_count_is_an_error() {
    let mut g: Graph<Fixed<32>> = Graph::new();
    let x = g.input("x", &[2, 3], DType::F32).unwrap();
    let y = g.dense("D", x, 1, Activation::Linear, DType::F32).unwrap();
    let l = g.reduce_mean("l", y, None).unwrap();
    assert!(g
        .differentiate_accumulating(l, Optimizer::sgd(0.1), Accumulation::new(0))
        .is_err());
}
