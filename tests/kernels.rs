//! The fast matmul (AVX2 or AVX-512 with fused multiply-adds) gives exactly the plain loop
//! with fused terms, and the portable kernel exactly the plain loop with a multiply and an
//! add: each output summed from `p = 0` upward either way.

use tessera::core::kernels::{load, matmul, store, Product};
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
            matmul(&a, &b, DType::F32, &mut c, Product { m, k, n, ta, tb });
            c
        })
        .collect()
}

/// The plain loop's C for the product `p`: `c[i][j]` summed from `p = 0` upward, each term
/// joined as a fused multiply-add (`fused`) or as a multiply and then an add.
fn plain(a: &[u8], b: &[u8], p: Product, fused: bool) -> Vec<u32> {
    let Product { m, k, n, ta, tb } = p;
    let mut c = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f32;
            for p in 0..k {
                let x = load(a, DType::F32, if ta { p * m + i } else { i * k + p });
                let y = load(b, DType::F32, if tb { j * k + p } else { p * n + j });
                s = if fused { x.mul_add(y, s) } else { s + x * y };
            }
            c.push(s.to_bits());
        }
    }
    c
}

fn bits(c: &[u8], len: usize) -> Vec<u32> {
    (0..len).map(|j| load(c, DType::F32, j).to_bits()).collect()
}

#[test]
fn fast_matmul_is_the_fused_plain_loop_and_the_portable_one_the_separate_loop() {
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
    for (&(m, k, n), portable) in shapes.iter().zip(&portable) {
        let (a, b) = operands(m, k, n);
        for (l, &(ta, tb)) in LAYOUTS.iter().enumerate() {
            assert_eq!(
                bits(&portable[l], m * n),
                plain(&a, &b, Product { m, k, n, ta, tb }, false),
                "portable ({m}, {k}, {n}) ta={ta} tb={tb}"
            );
        }
    }
    if !tessera::sim::use_fast_kernels() {
        eprintln!("no AVX2 or AVX-512 with FMA on this CPU: no fast kernel to compare");
        return;
    }
    let mut differ = 0;
    for (&(m, k, n), portable) in shapes.iter().zip(&portable) {
        let (a, b) = operands(m, k, n);
        let wide = products(m, k, n);
        for (l, &(ta, tb)) in LAYOUTS.iter().enumerate() {
            let fast = bits(&wide[l], m * n);
            let fused = plain(&a, &b, Product { m, k, n, ta, tb }, true);
            for (j, (f, r)) in fast.iter().zip(&fused).enumerate() {
                assert_eq!(f, r, "({m}, {k}, {n}) ta={ta} tb={tb} element {j}");
            }
            differ += fast
                .iter()
                .zip(bits(&portable[l], m * n))
                .filter(|(f, p)| **f != *p)
                .count();
        }
    }
    // The operands round differently fused: the fast path is not the portable one.
    assert!(
        differ > 0,
        "no element differs between the fused and the separate terms"
    );
}
