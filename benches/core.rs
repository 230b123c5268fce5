//! Speed of the core's reference kernels and plan: a training step and an inference batch of
//! the MNIST classifier.

use criterion::{criterion_group, criterion_main, Criterion};
use tessera::core::models::mnist_mlp;
use tessera::core::{DType, Fixed, Graph, Optimizer, Plan};

fn training_step(c: &mut Criterion) {
    let avx2 = tessera::sim::use_fast_kernels();
    eprintln!(
        "matmul kernel: {}",
        if avx2 {
            "AVX2 / AVX-512 with FMA"
        } else {
            "portable"
        }
    );
    let mut g: Graph<Fixed<96>> = Graph::new();
    let m = mnist_mlp(&mut g, 32, DType::F32).unwrap();
    let labels = g.input("labels", &[32], DType::I32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", m.probabilities, labels, false)
        .unwrap();
    g.differentiate(loss, Optimizer::sgd(0.1)).unwrap();
    let plan = Plan::new(&g).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes()];
    let mut state = vec![0u8; plan.state_bytes()];
    plan.init_state(&mut state, 1).unwrap();
    plan.fill_input("images", &mut arena, 32 * 784, |i| {
        ((i * 7919) % 255) as f32 / 255.0
    })
    .unwrap();
    plan.fill_input("labels", &mut arena, 32, |i| (i % 10) as f32)
        .unwrap();
    c.bench_function("mnist_mlp train_step batch 32 f32", |b| {
        b.iter(|| plan.train_step(&mut arena, &mut state).unwrap())
    });

    let mut ig: Graph<Fixed<32>> = Graph::new();
    mnist_mlp(&mut ig, 100, DType::F32).unwrap();
    let iplan = Plan::new(&ig).unwrap();
    let mut iarena = vec![0u8; iplan.arena_bytes()];
    let mut istate = vec![0u8; iplan.state_bytes()];
    iplan.init_state(&mut istate, 1).unwrap();
    c.bench_function("mnist_mlp infer batch 100 f32", |b| {
        b.iter(|| iplan.infer(&mut iarena, &istate).unwrap())
    });
}

criterion_group!(benches, training_step);
criterion_main!(benches);
