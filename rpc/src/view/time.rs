//! Times for people: a UTC date and time from seconds since the epoch (proleptic Gregorian
//! date maths) and how long ago something was.

use std::time::{SystemTime, UNIX_EPOCH};

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`; `never` for 0 (and anything odd).
pub fn utc_time(secs: f64) -> String {
    // Up to the end of year 9999; beyond that (or NaN, or negative) it is not a real time.
    if !(secs > 0.0 && secs < 253_402_300_800.0) {
        return "never".into();
    }
    let t = secs as i64;
    let (y, m, d) = civil_from_days(t.div_euclid(86_400));
    let s = t.rem_euclid(86_400);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", s / 3600, s % 3600 / 60, s % 60)
}

/// How long before `now` the time `then` was: `4s ago`, `3m ago`, `2h ago`, `5d ago`.
pub fn ago(then: f64, now: f64) -> String {
    let d = now - then;
    if !d.is_finite() {
        return "?".into();
    }
    if d < -1.0 {
        return "in the future: check the clocks".into();
    }
    let d = d.max(0.0) as u64;
    match d {
        0..=119 => format!("{d}s ago"),
        120..=7199 => format!("{}m ago", d / 60),
        7200..=172_799 => format!("{}h ago", d / 3600),
        _ => format!("{}d ago", d / 86_400),
    }
}

/// Now, in seconds since the epoch.
pub fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}
