//! How durations and sizes are written on the command line.
//!
//! Durations the way timeout(1) and sleep(1) take them.
//! A bare number is seconds (`30`, `1.5`); a number with a unit is read by humantime (`90s`,
//! `10m`, `1h30m`, `500ms`). Durations longer than [`MAX_DURATION`] are refused: nothing the
//! tool does needs more, and a huge value would overflow the deadline arithmetic.

use std::time::Duration;

/// Ten years: longer than any trace or window anyone means.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// What `--help` says a duration is.
pub const DURATION_HELP: &str =
    "a bare number is seconds (30, 1.5); or with units: 90s, 10m, 1h30m, 500ms";

/// Parses a command-line duration (clap `value_parser`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let d = if s.chars().next().is_some_and(|c| c.is_ascii_digit() || c == '.')
        && s.chars().all(|c| c.is_ascii_digit() || c == '.')
    {
        let secs: f64 =
            s.parse().map_err(|_| format!("{s:?} is not a number of seconds ({DURATION_HELP})"))?;
        Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is out of range"))?
    } else {
        humantime::parse_duration(s).map_err(|e| format!("{e} ({DURATION_HELP})"))?
    };
    if d > MAX_DURATION {
        return Err(format!("{s:?} is longer than {}", humantime::format_duration(MAX_DURATION)));
    }
    Ok(d)
}

/// What `--help` says a size is.
pub const SIZE_HELP: &str =
    "bytes, or with a unit: 64MiB, 512M (K, M, G, T and KiB.. are 1024-based; KB, MB, GB are 1000-based)";

/// Parses a command-line size in bytes (clap `value_parser`): `67108864`, `64MiB`, `64M`,
/// `1.5G`, `500MB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("{s:?} is not a size ({SIZE_HELP})"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(format!("{s:?}: unknown unit ({SIZE_HELP})")),
    };
    let bytes = n * mult as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("{s:?} is too large"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_number_is_seconds() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration(" 2 "), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn units_still_work() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    }

    #[test]
    fn nonsense_and_huge_values_are_refused_with_the_format() {
        for bad in
            ["soon", "", "1.2.3", "-5", "18446744073709551615s", "18446744073709551615", "1e400"]
        {
            let e = parse_duration(bad).expect_err(bad);
            assert!(!e.is_empty(), "{bad}");
        }
        assert!(parse_duration("soon").expect_err("soon").contains("bare number is seconds"));
    }

    #[test]
    fn sizes_take_the_usual_units() {
        assert_eq!(parse_size("67108864"), Ok(64 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64 MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("0"), Ok(0));
        for bad in ["", "lots", "64XB", "-1", "1e30T", "99999999999999999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
