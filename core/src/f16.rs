//! IEEE 754 binary16 conversion with round-to-nearest-even.
//!
//! Half-precision values are stored as their bit patterns (`u16`). Widening to `f32` is exact;
//! narrowing rounds to nearest, ties to even, overflows to infinity, keeps NaN payloads where
//! they fit (and always keeps a NaN a NaN), and produces subnormals where the value calls for one.

/// Widens a binary16 bit pattern to `f32`. Exact for every one of the 65,536 patterns.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = (u32::from(h) & 0x8000) << 16;
    let exp = (h >> 10) & 0x1f;
    let man = u32::from(h & 0x3ff);
    let bits = if exp == 0x1f {
        // Infinity or NaN: the payload moves to the top of the f32 mantissa.
        sign | 0x7f80_0000 | (man << 13)
    } else if exp != 0 {
        sign | ((u32::from(exp) + 112) << 23) | (man << 13)
    } else if man == 0 {
        sign
    } else {
        // Subnormal half: normalise. man < 2^10, so the leading one is at bit 9 or below.
        let shift = man.leading_zeros() - 21; // bring the leading one to bit 10
        let man = (man << shift) & 0x3ff;
        let exp = 113 - shift; // 127 - 14 - shift
        sign | (exp << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// Narrows an `f32` to the nearest binary16 bit pattern, ties to even.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;

    if exp == 0xff {
        if man == 0 {
            return sign | 0x7c00;
        }
        // NaN: keep the top payload bits, and make sure at least one mantissa bit stays set.
        let payload = (man >> 13) as u16;
        return sign | 0x7c00 | if payload == 0 { 0x200 } else { payload };
    }

    let e = exp - 127 + 15; // biased half exponent
    if e >= 0x1f {
        return sign | 0x7c00; // overflow to infinity
    }
    if e <= 0 {
        // Result is subnormal or zero. Full 24-bit significand with the implicit one.
        if e < -10 {
            return sign; // below half the smallest subnormal: rounds to zero
        }
        let full = man | 0x80_0000;
        let shift = (14 - e) as u32; // 13 + (1 - e)
        let half_man = full >> shift;
        let rem = full & ((1 << shift) - 1);
        let halfway = 1 << (shift - 1);
        let round_up = rem > halfway || (rem == halfway && (half_man & 1) == 1);
        // A carry out of the mantissa correctly becomes the smallest normal.
        return sign | (half_man + u32::from(round_up)) as u16;
    }
    let half_man = man >> 13;
    let rem = man & 0x1fff;
    let round_up = rem > 0x1000 || (rem == 0x1000 && (half_man & 1) == 1);
    // A carry out of the mantissa increments the exponent, and may reach infinity: both correct.
    let out = ((e as u32) << 10 | half_man) + u32::from(round_up);
    sign | out as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_half_round_trips_through_f32() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            assert_eq!(f32_to_f16(f), h, "pattern {h:#06x} -> {f:e}");
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(-2.0), 0xc000);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // halfway to the next binade: rounds to inf
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001); // smallest subnormal
        assert_eq!(f32_to_f16(2.980_232_2e-8), 0x0000); // exactly half of it: tie to even (zero)
        assert_eq!(f32_to_f16(2.980_232_5e-8), 0x0001); // just above half
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even mantissa (1) wins.
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02);
    }
}
