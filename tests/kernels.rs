//! The AVX2 matmul gives the portable kernel's results bit for bit.

use tessera::core::kernels::{load, matmul, store};
use tessera::core::DType;

const LAYOUTS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// Operands of an (m, k) x (k, n) product whose sums round differently in any other order.
fn operands(m: usize, k: usize, n: usize) -> (Vec<u8>, Vec<u8>) {
    let mut a = vec![0u8; 4 * m * k];
    let mut b = vec![0u8; 4 * k * n];
    for i in 0..m * k {
        store(
            &mut a,
            DType::F32,
            i,
            ((i * 7919 % 1000) as f32 - 500.0) / 97.0,
        );
    }
    for i in 0..k * n {
        store(
            &mut b,
            DType::F32,
            i,
            ((i * 104_729 % 1000) as f32 - 500.0) / 131.0,
        );
    }
    (a, b)
}

/// C for every layout.
fn products(m: usize, k: usize, n: usize) -> Vec<Vec<u8>> {
    let (a, b) = operands(m, k, n);
    LAYOUTS
        .iter()
        .map(|&(ta, tb)| {
            let mut c = vec![0u8; 4 * m * n];
            matmul(&a, &b, DType::F32, &mut c, m, k, n, ta, tb);
            c
        })
        .collect()
}

#[test]
fn avx2_matmul_is_bit_identical_to_the_portable_one() {
    // Ragged tiles; and the classifier's shapes: more than one panel of k, n below one tile;
    // and each width of tile the AVX-512 kernel picks from n (16: 71, 10, 37; 32: 96; 64:
    // 256, 192), or from m when it swaps a transposed B's product (16: 13; 32: 32, 19; 64:
    // 60).
    let shapes = [
        (37, 53, 71),
        (32, 784, 256),
        (32, 128, 10),
        (13, 300, 37),
        (19, 70, 96),
        (70, 33, 192),
        // B transposed, fewer rows than columns: C^T = B . op(A)^T in 64-wide tiles.
        (60, 70, 200),
    ];
    // The flag is process-wide: every portable result is computed before it is set.
    let portable: Vec<Vec<Vec<u8>>> = shapes.iter().map(|&(m, k, n)| products(m, k, n)).collect();
    if !tessera::sim::use_fast_kernels() {
        eprintln!("no AVX2 on this CPU: nothing to compare");
        return;
    }
    for (&(m, k, n), portable) in shapes.iter().zip(&portable) {
        let wide = products(m, k, n);
        for (l, &(ta, tb)) in LAYOUTS.iter().enumerate() {
            for j in 0..m * n {
                assert_eq!(
                    load(&wide[l], DType::F32, j).to_bits(),
                    load(&portable[l], DType::F32, j).to_bits(),
                    "({m}, {k}, {n}) ta={ta} tb={tb} element {j}"
                );
            }
        }
    }
}
