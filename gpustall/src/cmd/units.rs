//! How durations are written on the command line: the way timeout(1) and sleep(1) take them.
//!
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
}
