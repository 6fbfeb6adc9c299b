//! Pin risks ([`crate::graph::pin_risks`]) as protobuf messages: `ListDevicesResponse.pin_risks`
//! and the `PIN_RISKS_CHANGED` event. Names from the kernel travel as their escaped text.

use blockjanitor_proto::v1 as pb;

use crate::graph::pin_risks::{PinCopy, PinReport, PinRisk};

use super::detail::escaped;

/// Every pin risk of a report (the risks, then the namespaces that could not be judged).
pub fn pin_risks(r: &PinReport) -> Vec<pb::PinRisk> {
    r.risks.iter().map(pin_risk).collect()
}

pub fn pin_risk(r: &PinRisk) -> pb::PinRisk {
    pb::PinRisk {
        mount_namespace: r.mount_namespace.0,
        pids: r.pids.clone(),
        pid_count: r.pid_count as u32,
        comm: escaped(&r.comm),
        pod_uid: r.pod_uid.clone().unwrap_or_default(),
        container_id: r.container_id.clone().unwrap_or_default(),
        pod_namespace: r.pod.as_ref().map(|p| p.namespace.clone()).unwrap_or_default(),
        pod_name: r.pod.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
        container_name: r.container.clone().unwrap_or_default(),
        host_root_copy: escaped(&r.host_root_copy),
        copies: r.copies.iter().map(copy).collect(),
        fix: r.fix.clone(),
        unknown: r.unknown.clone().unwrap_or_default(),
    }
}

fn copy(c: &PinCopy) -> pb::PinCopy {
    pb::PinCopy {
        mount_point: c.mount_point.to_string(),
        host_mount_point: c.host_mount_point.to_string(),
        dev: c.dev.to_string(),
        device: c.device.as_ref().map(|d| d.to_string()).unwrap_or_default(),
        fstype: c.fstype.to_string(),
        pv_name: c.pv_name.clone().unwrap_or_default(),
    }
}
