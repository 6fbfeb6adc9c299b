//! Enum values as lower-case names without their prefix (`DEVICE_KIND_LOOP` -> `"loop"`,
//! `VERDICT_IN_USE` -> `"in_use"`, `TYPE_DEVICE_ADDED` -> `"device_added"`), and back.

use blockjanitor_proto::v1 as pb;

fn lower_name(name: Option<&str>, prefix: &str, raw: i32) -> String {
    match name {
        Some(n) => n.strip_prefix(prefix).unwrap_or(n).to_ascii_lowercase(),
        None => format!("unknown({raw})"),
    }
}

/// `loop`, `in_use`... for a raw `DeviceKind`.
pub fn kind_name(raw: i32) -> String {
    lower_name(pb::DeviceKind::try_from(raw).ok().map(|k| k.as_str_name()), "DEVICE_KIND_", raw)
}

/// `stale`, `in_use`... for a raw `Verdict`.
pub fn verdict_name(raw: i32) -> String {
    lower_name(pb::Verdict::try_from(raw).ok().map(|v| v.as_str_name()), "VERDICT_", raw)
}

/// `mount`, `open_device`... for a raw `HolderKind`.
pub fn holder_kind_name(raw: i32) -> String {
    lower_name(pb::HolderKind::try_from(raw).ok().map(|k| k.as_str_name()), "HOLDER_KIND_", raw)
}

/// `device_added`, `verdict_changed`... for a raw `Event.Type`.
pub fn event_type_name(raw: i32) -> String {
    lower_name(pb::event::Type::try_from(raw).ok().map(|t| t.as_str_name()), "TYPE_", raw)
}

/// The `DeviceKind` for a lower-case name (`loop`); `None` for unknown names and `unspecified`.
pub fn parse_kind(name: &str) -> Option<pb::DeviceKind> {
    pb::DeviceKind::from_str_name(&format!("DEVICE_KIND_{}", name.to_ascii_uppercase()))
        .filter(|k| *k != pb::DeviceKind::Unspecified)
}

/// The `Verdict` for a lower-case name (`in_use`); `None` for unknown names and `unspecified`.
pub fn parse_verdict(name: &str) -> Option<pb::Verdict> {
    pb::Verdict::from_str_name(&format!("VERDICT_{}", name.to_ascii_uppercase()))
        .filter(|v| *v != pb::Verdict::Unspecified)
}
