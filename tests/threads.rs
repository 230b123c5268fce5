//! Products cut into pieces on a thread pool give the whole products bit for bit, and so does
//! training with the runner's threads on, and with weight gradients summed straight into
//! their accumulators.
// Run errors carry node names inline (see the core); closures returning them are fine here.
#![allow(clippy::result_large_err)]

use proptest::prelude::*;
use tessera::core::kernels::{matmul, matmul_on, store, Product};
use tessera::core::models::mnist_mlp_pipelined;
use tessera::core::schedule::Schedule;
use tessera::core::{Accumulation, DType, Graph, Optimizer, Plan};
use tessera::sim::runner::PipelineRunner;
use tessera::sim::threads::Threads;
use tessera::sim::Heap;

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
}

/// A tensor of `len` elements of type `t` whose sums round differently in any other order.
fn operand(t: DType, len: usize, salt: usize) -> Vec<u8> {
    let mut v = vec![0u8; len * t.size()];
    for i in 0..len {
        let x = ((i * salt + 17) % 1009) as f32 - 504.0;
        store(&mut v, t, i, x / 89.0);
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn threaded_products_are_the_whole_products(
        m in 1usize..80,
        k in 0usize..300,
        n in 1usize..150,
        ta in any::<bool>(),
        tb in any::<bool>(),
        f16 in any::<bool>(),
        threads in 2usize..=4,
    ) {
        // Large enough to be cut about half the time (the cut needs 2^18 multiply-adds).
        tessera::sim::use_fast_kernels();
        let t = if f16 { DType::F16 } else { DType::F32 };
        let (a, b) = (operand(t, m * k, 7919), operand(t, k * n, 104_729));
        let p = Product { m, k, n, ta, tb };
        let mut whole = vec![0u8; m * n * t.size()];
        matmul(&a, &b, t, &mut whole, p);
        let mut cut = vec![0xffu8; m * n * t.size()];
        pool(threads).install(|| matmul_on(&Threads, &a, &b, t, &mut cut, p));
        prop_assert!(whole == cut, "{:?} ({}, {}, {}) ta={} tb={}", t, m, k, n, ta, tb);
    }
}

/// The README's model (the core's pipelined MNIST classifier, stages [0, 0, 1, 1]), whose
/// products, and its first kernel's accumulation and update, are large enough to be cut.
fn classifier() -> Plan<Heap> {
    let mut g: Graph<Heap> = Graph::new();
    let mlp = mnist_mlp_pipelined(&mut g, 32, DType::F32, [0, 0, 1, 1]).unwrap();
    let labels = g.input("labels", &[32], DType::I32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", mlp.probabilities, labels, false)
        .unwrap();
    g.differentiate_accumulating(loss, Optimizer::sgd(0.1), Accumulation::new(4))
        .unwrap();
    Plan::new(&g).unwrap()
}

/// Trains three weight updates and returns every replica's state; `fused` sums the weight
/// gradients straight into their accumulators (all three kernels').
fn train(threads: Option<usize>, fused: bool) -> Vec<Vec<u8>> {
    tessera::sim::use_fast_kernels();
    let mut runner = PipelineRunner::new(classifier(), Schedule::Grouped, 2).unwrap();
    runner.init_state(7).unwrap();
    runner.use_threads(threads.is_some());
    if fused {
        assert_eq!(
            runner.fuse_accumulation(&[]),
            3,
            "every kernel's gradient is fused"
        );
    }
    let mut run = || {
        for u in 0..3usize {
            runner
                .run_update(|r, b, plan, arena| {
                    let first = ((u * 4 + b) * 2 + r) * 32;
                    plan.fill_input("images", arena, 32 * 784, |i| {
                        ((first * 784 + i) * 2_654_435_761 % 1000) as f32 / 1000.0
                    })?;
                    plan.fill_input("labels", arena, 32, |i| ((first + i) % 10) as f32)
                })
                .unwrap();
        }
    };
    match threads {
        Some(n) => pool(n).install(run),
        None => run(),
    }
    (0..2).map(|r| runner.state(r).to_vec()).collect()
}

#[test]
fn training_on_threads_gives_the_serial_weights_bit_for_bit() {
    let serial = train(None, false);
    for threads in [2, 3, 4] {
        assert!(
            train(Some(threads), false) == serial,
            "{threads} threads changed the weights"
        );
    }
}

#[test]
fn gradients_summed_straight_into_their_accumulators_give_the_same_weights_bit_for_bit() {
    let plain = train(None, false);
    assert!(train(None, true) == plain, "fused on one thread");
    assert!(train(Some(3), true) == plain, "fused on three threads");
}

#[test]
fn a_gradient_that_is_read_elsewhere_is_not_fused() {
    let plan = classifier();
    let g = plan.graph();
    let accumulate = |name: &str| g.find(name).unwrap().index();
    let first = accumulate("Dense_256/kernel:0/accumulate");
    let product = g.find("Dense_256/kernel:0_grad").unwrap().index();
    assert_eq!(plan.fusable_accumulation(first), Some(product));
    // Bias gradients are sums, not products; other nodes are not accumulations.
    assert_eq!(
        plan.fusable_accumulation(accumulate("Dense_256/bias:0/accumulate")),
        None
    );
    assert_eq!(plan.fusable_accumulation(product), None);
    // A product an observer reads keeps its own bytes.
    let mut runner = PipelineRunner::new(classifier(), Schedule::Grouped, 1).unwrap();
    assert_eq!(runner.fuse_accumulation(&[product]), 2);
    let mut state = vec![0; plan.state_bytes()];
    let arena = vec![0; plan.arena_bytes()];
    let err = plan
        .run_accumulated_product_on(product, &arena, &mut state, &tessera::core::kernels::Serial)
        .unwrap_err();
    assert!(err.to_string().contains("Dense_256/kernel:0_grad"), "{err}");
}
