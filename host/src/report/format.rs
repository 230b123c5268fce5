//! Numbers as people read them, for every text, page and picture the crate writes: counts with
//! grouped thousands, bytes in binary units, decimals, percentages and durations.
//!
//! Every function gives `n/a` for a float that is not finite.
//!
//! [`one_line`] makes any message one line, as every error the crate and the command print is.

/// A count with grouped thousands: `1234567` as `1,234,567`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A float with one decimal and grouped thousands: `45,210.3`.
pub fn decimal(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let tenths = (x.abs() * 10.0).round();
    if tenths >= 1e18 {
        return format!("{x:.3e}");
    }
    let tenths = tenths as u64;
    let sign = if x < 0.0 && tenths > 0 { "-" } else { "" };
    format!("{sign}{}.{}", count(tenths / 10), tenths % 10)
}

/// [`decimal`] without a trailing `.0`: `1,325`, `2.5`.
pub fn short_decimal(x: f64) -> String {
    let s = decimal(x);
    match s.strip_suffix(".0") {
        Some(whole) => whole.to_string(),
        None => s,
    }
}

/// Bytes in binary units with one decimal: `512 B`, `13.9 KiB`, `13.4 MiB`, `2.0 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut x = n as f64 / 1024.0;
    let mut unit = 0;
    // Rounding to one decimal may reach 1024.0: that is the next unit's 1.0.
    while x >= 1023.95 && unit + 1 < UNITS.len() {
        x /= 1024.0;
        unit += 1;
    }
    format!("{x:.1} {}", UNITS[unit])
}

/// A fraction as a percentage with one decimal: `0.123` as `12.3%`.
pub fn percent(fraction: f64) -> String {
    if fraction.is_finite() {
        format!("{:.1}%", fraction * 100.0)
    } else {
        "n/a".into()
    }
}

/// Seconds in a readable unit: `70.8 µs`, `12.30 ms`, `2.50 s`.
pub fn seconds(s: f64) -> String {
    if !s.is_finite() {
        "n/a".into()
    } else if s == 0.0 {
        "0 s".into()
    } else if s.abs() < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s.abs() < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

/// `s` with its whitespace collapsed: one line.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_group_thousands() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(93_809), "93,809");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(u64::MAX), "18,446,744,073,709,551,615");
    }

    #[test]
    fn decimals_have_one_place() {
        assert_eq!(decimal(45_210.26), "45,210.3");
        assert_eq!(decimal(0.04), "0.0");
        assert_eq!(decimal(-0.04), "0.0");
        assert_eq!(decimal(-1234.56), "-1,234.6");
        assert_eq!(decimal(f64::NAN), "n/a");
        assert_eq!(decimal(f64::INFINITY), "n/a");
        assert_eq!(decimal(1e30), "1.000e30");
        assert_eq!(short_decimal(1325.0), "1,325");
        assert_eq!(short_decimal(2.5), "2.5");
        assert_eq!(short_decimal(f64::NAN), "n/a");
    }

    #[test]
    fn bytes_in_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(14_244), "13.9 KiB");
        assert_eq!(bytes(638_976), "624.0 KiB");
        assert_eq!(bytes(12 * 1024), "12.0 KiB");
        assert_eq!(bytes(14_069_352), "13.4 MiB");
        assert_eq!(bytes(1024 * 1024 - 1), "1.0 MiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(bytes(u64::MAX), "16777216.0 TiB");
    }

    #[test]
    fn percents_and_seconds() {
        assert_eq!(percent(0.123), "12.3%");
        assert_eq!(percent(0.0), "0.0%");
        assert_eq!(percent(f64::NAN), "n/a");
        assert_eq!(seconds(7.08e-5), "70.8 µs");
        assert_eq!(seconds(0.0123), "12.30 ms");
        assert_eq!(seconds(2.5), "2.50 s");
        assert_eq!(seconds(0.0), "0 s");
        assert_eq!(seconds(f64::NAN), "n/a");
    }
}
