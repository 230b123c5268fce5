//! f16 conversion agrees with the `half` crate on every pattern and on random f32 values.

use proptest::prelude::*;
use tessera::core::f16::{f16_to_f32, f32_to_f16};

#[test]
fn widening_matches_half_on_all_65536_patterns() {
    for h in 0..=u16::MAX {
        let ours = f16_to_f32(h);
        let theirs = half::f16::from_bits(h).to_f32();
        assert!(
            ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()),
            "{h:#06x}"
        );
        assert_eq!(f32_to_f16(ours), h, "round trip of {h:#06x}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]
    #[test]
    fn narrowing_matches_half(bits in any::<u32>()) {
        let x = f32::from_bits(bits);
        let ours = f32_to_f16(x);
        let theirs = half::f16::from_f32(x).to_bits();
        if x.is_nan() {
            prop_assert!(half::f16::from_bits(ours).is_nan());
        } else {
            prop_assert_eq!(ours, theirs, "{:e} ({:#010x})", x, bits);
        }
    }

    #[test]
    fn narrowing_matches_half_near_the_half_range(x in -70000.0f32..70000.0) {
        prop_assert_eq!(f32_to_f16(x), half::f16::from_f32(x).to_bits());
        let tiny = x * 1e-9;
        prop_assert_eq!(f32_to_f16(tiny), half::f16::from_f32(tiny).to_bits());
    }
}
