//! The one-shot requests that only show: `scan` (every device judged, the orphaned pod volume
//! directories and the pin risks: the view the daemon would publish) and `holders` (each device
//! judged from the scan a cleanup of it would rest on), answered on the wire as the daemon
//! answers `ListDevices` and `ListHolders`; and the device an operator's argument names.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::path_device::{device_of_path, PathDeviceError};

use super::setup::HostSpec;
use super::OneShot;
use crate::discover::blockdev;
use crate::engine::outcome::incomplete_view;
use crate::engine::statmount_cache_file;
use crate::engine::view::View;
use crate::engine::{wire, Judged, Operation};
use crate::graph::resolve;
use crate::graph::scan::Target;
use crate::host::HostRoot;
use crate::model::DevNum;

/// A device to answer for is not in the scan.
#[derive(Debug, thiserror::Error)]
pub enum ShowError {
    #[error("device {0} disappeared during the scan")]
    Gone(DevNum),
}

/// What `scan` found: the view of every device (generation 0: a one-shot scan has none), each
/// device on the wire, and whether a blind spot could hide a holder of any of them.
pub struct ScanAnswer {
    pub view: View,
    pub devices: Vec<pb::Device>,
    pub incomplete: bool,
}

/// What `holders` found of one device: the `ListHolders` answer, whether anything holds it, and
/// whether a blind spot could hide a holder of it.
pub struct HoldersAnswer {
    pub response: pb::ListHoldersResponse,
    pub held: bool,
    pub incomplete: bool,
}

impl OneShot {
    /// What `statmount` said of each mount, as an earlier run of this boot that only showed kept
    /// it ([`super::OneShotOptions::statmount_memo`]): loaded here, by `holders` and `scan`
    /// alone, which only show. A request that acts never calls this: its scans, and the
    /// re-check before each step, ask the kernel. Saved with the grace clocks after the scans.
    fn load_report_only_memo(&mut self) {
        let host = &self.engine.world.host;
        self.memo = self.memo_path.as_deref().and_then(|path| statmount_cache_file::Kept::load(host, path));
    }

    /// `scan`: every device judged, then the pin risks and the orphaned pod volume directories.
    pub fn scan(&mut self) -> Result<ScanAnswer> {
        self.load_report_only_memo();
        let e = &self.engine;
        let judged = e.judge(e.scan(Target::All)?, &mut self.state.clocks);
        let pod_volumes = Arc::new(e.pod_volumes(&mut self.state.clocks));
        let pins = Arc::new(e.world.pin_risks(None).unwrap_or_default());
        self.save();
        let incomplete = incomplete_view(&judged.scan, None).is_some();
        let mut view = one_shot_view(&judged);
        view.pod_volumes = pod_volumes;
        view.pin_risks = pins;
        let devices = view.devices.iter().map(|d| wire::device(d)).collect();
        Ok(ScanAnswer { view, devices, incomplete })
    }

    /// `holders`: each device judged from the scan a cleanup of it would rest on (what its
    /// removal takes with it, an NVMe controller's other namespaces or a session's other disks,
    /// is looked at too), in order.
    pub fn holders(&mut self, devices: &[DevNum]) -> Result<Vec<HoldersAnswer>> {
        self.load_report_only_memo();
        let mut answers = Vec::new();
        for &devnum in devices {
            let e = &self.engine;
            let judged = e.judge(e.plan_scan(devnum, Operation::Clean)?, &mut self.state.clocks);
            let entry = judged.scan.entry(devnum).ok_or(ShowError::Gone(devnum))?;
            // As `fuser -s`: held or free (kernel threads are symptoms, not holders); unknown
            // when nothing was seen holding it but a blind spot could hide a holder.
            let held = !entry.holders.is_empty();
            let incomplete = incomplete_view(&judged.scan, Some(entry)).is_some();
            let v = one_shot_view(&judged);
            let d = v.devices.iter().find(|d| d.entry.device.devnum == devnum);
            let d = d.ok_or(ShowError::Gone(devnum))?;
            let response = wire::holders_response(&v, d, wire::device(d));
            answers.push(HoldersAnswer { response, held, incomplete });
        }
        self.save();
        Ok(answers)
    }
}

/// A judged scan as the view the daemon publishes (generation 0: a one-shot scan has none), so
/// that its devices convert as the daemon's do.
fn one_shot_view(judged: &Judged) -> View {
    View::of(judged.clone(), 0)
}

/// The device `arg` names on the host `spec` names: a device (`/dev/loop3`, `loop3`, `mpatha`,
/// `7:3`), or a path's filesystem's device (`blockjanitor_rpc::path_device`, under the host's
/// root as /dev paths are). A path that does not exist is left to the device resolver (a
/// /dev/rbd link udev did not make, a fixture tree), which names what it could not find.
pub fn device_argument(spec: &HostSpec, arg: &str) -> Result<DevNum> {
    let host = spec.host();
    if is_path(arg) {
        let at = if arg.starts_with('/') { host.host_path(Path::new(arg)) } else { arg.into() };
        match device_of_path(&at) {
            Ok(Some(majmin)) => {
                return device_named(&host, &majmin).with_context(|| format!("{arg} is on device {majmin}"))
            }
            Ok(None) | Err(PathDeviceError::Stat { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    device_named(&host, arg)
}

/// The device an operator named.
fn device_named(host: &HostRoot, arg: &str) -> Result<DevNum> {
    let devices = blockdev::scan(host)?;
    Ok(resolve::device(host, &devices, arg)?.devnum)
}

/// Whether `arg` is a path (`/...`, `./...`, `.`) rather than a device's name.
fn is_path(arg: &str) -> bool {
    arg.starts_with('/') || arg.starts_with("./") || arg.starts_with("../") || arg == "." || arg == ".."
}
