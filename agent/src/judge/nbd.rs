//! The verdict of an nbd device: a candidate once nothing holds it, whatever its server does
//! (the server process is named in the reasons).

use super::{fin, Assessment, Verdict};
use crate::discover::nbd::NbdDevice;
use crate::graph::{DeviceEntry, Holder};

/// An nbd device's assessment.
pub(super) fn assess(e: &DeviceEntry, n: &NbdDevice) -> Assessment {
    let d = &e.device;
    let server = match (n.pid, n.server_alive) {
        (Some(pid), true) => {
            format!("served by pid {pid} ({})", n.server_comm.as_ref().map_or("?".into(), |c| c.to_string()))
        }
        (Some(pid), false) => format!("its server process {pid} is gone"),
        (None, _) => "no server process recorded".to_owned(),
    };
    if !e.holders.is_empty() {
        let mut reasons: Vec<String> = e.holders.iter().map(Holder::describe).collect();
        reasons.push(format!("{}: {server}", d.name));
        return fin(Verdict::InUse, reasons);
    }
    Assessment::Candidate(format!("nothing holds {} for {{age}}; {server}", d.name))
}
