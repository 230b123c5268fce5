//! The AVX2 matmul gives the portable kernel's results bit for bit.

use tessera::core::kernels::{load, matmul, store};
use tessera::core::DType;

#[test]
fn avx2_matmul_is_bit_identical_to_the_portable_one() {
    let (m, k, n) = (37, 53, 71);
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
    let run = |ta, tb| {
        let mut c = vec![0u8; 4 * m * n];
        let (mm, kk, nn) = (m, k, n);
        matmul(&a, &b, DType::F32, &mut c, mm, kk, nn, ta, tb);
        c
    };
    // The flag is process-wide; portable results are computed before it is set (other tests
    // may set it too, which is harmless because both kernels agree - what this test checks).
    let portable: Vec<Vec<u8>> = [(false, false), (false, true), (true, false), (true, true)]
        .iter()
        .map(|&(ta, tb)| run(ta, tb))
        .collect();
    if !tessera::sim::use_fast_kernels() {
        eprintln!("no AVX2 on this CPU: nothing to compare");
        return;
    }
    for (i, &(ta, tb)) in [(false, false), (false, true), (true, false), (true, true)]
        .iter()
        .enumerate()
    {
        let wide = run(ta, tb);
        for j in 0..m * n {
            assert_eq!(
                load(&wide, DType::F32, j).to_bits(),
                load(&portable[i], DType::F32, j).to_bits(),
                "ta={ta} tb={tb} element {j}"
            );
        }
    }
}
