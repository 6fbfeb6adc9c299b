//! Time that cannot jump: `CLOCK_BOOTTIME`, and the boot it belongs to.
//!
//! Grace periods and the freshness of evidence are measured on [`BootTime`], which counts from
//! boot, keeps counting across suspend, and is never stepped by NTP or an operator setting the
//! date (wall-clock time is). A `BootTime` means nothing in another boot, so anything persisted
//! with one is stamped with the kernel's boot id ([`boot_id`]) and dropped when it differs.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::host::HostRoot;

/// A moment, as time since boot (`CLOCK_BOOTTIME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BootTime(#[serde(with = "secs")] Duration);

mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = f64::deserialize(d)?;
        if !v.is_finite() || v < 0.0 {
            return Err(serde::de::Error::custom(format!("{v} is not a time since boot")));
        }
        Ok(Duration::from_secs_f64(v))
    }
}

impl BootTime {
    /// Now. `CLOCK_BOOTTIME` cannot fail on Linux; should it, this is the start of the boot,
    /// which only ever makes clocks younger (grace periods longer).
    pub fn now() -> Self {
        match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
            Ok(ts) => {
                Self(Duration::new(ts.tv_sec().max(0) as u64, ts.tv_nsec().clamp(0, 999_999_999) as u32))
            }
            Err(e) => {
                tracing::error!("clock_gettime(CLOCK_BOOTTIME) failed: {e}");
                Self(Duration::ZERO)
            }
        }
    }

    /// A moment this long after boot (tests, simulations, persisted clocks).
    pub const fn from_since_boot(d: Duration) -> Self {
        Self(d)
    }

    /// Time since boot.
    pub const fn since_boot(self) -> Duration {
        self.0
    }

    /// How long after `earlier` this is (zero if it is not after it).
    pub fn since(self, earlier: BootTime) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// This moment plus `d`.
    pub fn after(self, d: Duration) -> BootTime {
        BootTime(self.0.saturating_add(d))
    }
}

impl fmt::Display for BootTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s after boot", self.0.as_secs_f64())
    }
}

/// The kernel's id of this boot (`/proc/sys/kernel/random/boot_id`), or `None` when it cannot be
/// read (then nothing persisted can be trusted to belong to this boot).
pub fn boot_id(host: &HostRoot) -> Option<String> {
    let text = std::fs::read_to_string(host.proc().join("sys/kernel/random/boot_id")).ok()?;
    let id = text.trim();
    (id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')).then(|| id.to_owned())
}

/// `5m00s`, `42s`: durations in reasons.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boottime_moves_forward_and_round_trips() {
        let a = BootTime::now();
        let b = BootTime::now();
        assert!(b >= a);
        assert_eq!(a.since(b), Duration::ZERO, "never negative");
        let json =
            serde_json::to_string(&BootTime::from_since_boot(Duration::from_millis(1500))).expect("ser");
        assert_eq!(json, "1.5");
        let back: BootTime = serde_json::from_str(&json).expect("de");
        assert_eq!(back.since_boot(), Duration::from_millis(1500));
        assert!(serde_json::from_str::<BootTime>("-1").is_err());
    }

    #[test]
    fn boot_id_of_this_host() {
        let id = boot_id(&HostRoot::default()).expect("a live procfs has a boot id");
        assert_eq!(id.len(), 36);
        assert_eq!(boot_id(&HostRoot::default()), Some(id), "stable within a boot");
        assert_eq!(boot_id(&HostRoot::new("/nonexistent")), None);
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::from_secs(42)), "42s");
        assert_eq!(human(Duration::from_secs(300)), "5m00s");
        assert_eq!(human(Duration::from_secs(3720)), "1h02m");
    }
}
