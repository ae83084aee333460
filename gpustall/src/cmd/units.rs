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
    "a bare number is seconds (30, 1.5); or with units ms, s, m, h, d: 90s, 10m, 1h30m, 500ms";

/// The units a duration may have, as timeout(1) and sleep(1) take them (and the sub-second
/// ones). humantime alone would also read `M` as months and `y` as years: `10M` must not be
/// ten months where `--memory-budget 10M` is 10 MiB.
const DURATION_UNITS: &[&str] = &[
    "ns", "us", "ms", "s", "sec", "secs", "second", "seconds", "m", "min", "mins", "minute",
    "minutes", "h", "hr", "hrs", "hour", "hours", "d", "day", "days",
];

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
        let units = s.split(|c: char| c.is_ascii_digit() || c == '.' || c.is_whitespace());
        if let Some(u) = units.filter(|u| !u.is_empty()).find(|u| !DURATION_UNITS.contains(u)) {
            return Err(format!("{s:?}: {u:?} is not a duration unit ({DURATION_HELP})"));
        }
        humantime::parse_duration(s).map_err(|e| format!("{e} ({DURATION_HELP})"))?
    };
    if d > MAX_DURATION {
        return Err(format!("{s:?} is longer than {}", humantime::format_duration(MAX_DURATION)));
    }
    Ok(d)
}

/// A duration that must be more than zero (`--duration 0` would end the trace before it began).
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("{s:?}: a duration of zero leaves nothing to do ({DURATION_HELP})"));
    }
    Ok(d)
}

/// A listen address: HOST:PORT with a name or an address (`localhost:9464`, `[::1]:9464`), or
/// `:PORT` for every interface, as Prometheus exporters take it.
pub fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs as _;
    let s = s.trim();
    let spec = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_string(),
    };
    let mut addrs =
        spec.to_socket_addrs().map_err(|e| format!("{s:?} is not HOST:PORT or :PORT ({e})"))?;
    addrs.next().ok_or_else(|| format!("{s:?} names no address"))
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
    fn months_and_years_are_no_duration_units_and_zero_no_duration() {
        assert!(parse_duration("10M").is_err_and(|e| e.contains("\"M\" is not a duration unit")));
        assert!(parse_duration("1y").is_err());
        assert!(parse_duration("2w").is_err());
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2 d"), Ok(Duration::from_secs(2 * 86400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_positive_duration("0").is_err_and(|e| e.contains("zero")));
        assert!(parse_positive_duration("0s").is_err());
    }

    #[test]
    fn listen_takes_names_and_a_bare_port() {
        assert_eq!(parse_listen(":9464").map(|a| a.to_string()), Ok("0.0.0.0:9464".into()));
        assert_eq!(parse_listen("127.0.0.1:9464").map(|a| a.port()), Ok(9464));
        assert!(parse_listen("localhost:9464").is_ok_and(|a| a.ip().is_loopback()));
        assert!(parse_listen("[::1]:9").is_ok_and(|a| a.is_ipv6()));
        assert!(parse_listen("9464").is_err());
    }

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
