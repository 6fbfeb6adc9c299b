//! Network block devices (`/sys/block/nbdN`): connected or not, the process that set it up
//! (`pid`, for rbd-nbd the `rbd-nbd map POOL/IMAGE` process that serves it), and whether that
//! process is still alive. An nbd device whose server process is gone serves nothing.

use serde::Serialize;

use super::{read_attr_opt, read_u64, DiscoverError};
use crate::host::HostRoot;
use crate::model::{BlockDevice, DevNum, DeviceKind, DeviceName, KernelText};

/// One nbd device that is connected (size > 0 or a server pid).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NbdDevice {
    pub device: DeviceName,
    pub devnum: DevNum,
    /// `pid`: the process that set the device up.
    pub pid: Option<u32>,
    /// That process still exists.
    pub server_alive: bool,
    /// Its command line (bounded), e.g. `rbd-nbd map k8s/image`.
    pub server_cmdline: Option<KernelText>,
    /// Its command name (`comm`): what reasons and Events say (a command line can carry secrets,
    /// `qemu-nbd --object secret,...,data=...`, and is shown to operators only).
    pub server_comm: Option<KernelText>,
    /// `backend`: the identifier given at connect time (netlink), when set.
    pub backend: Option<String>,
}

/// Connected nbd devices among `devices`.
pub fn scan(host: &HostRoot, devices: &[BlockDevice]) -> Result<Vec<NbdDevice>, DiscoverError> {
    let mut out = Vec::new();
    for d in devices.iter().filter(|d| d.kind == DeviceKind::Nbd) {
        let dir = host.sys_class_block().join(d.name.as_str());
        let pid = match read_attr_opt(&dir.join("pid"))? {
            Some(p) => Some(
                p.trim()
                    .parse::<u32>()
                    .map_err(|_| DiscoverError::attr(&dir.join("pid"), &p, "expected a PID"))?,
            ),
            None => None,
        };
        let size = read_u64(&dir.join("size")).unwrap_or(0);
        if pid.is_none() && size == 0 {
            continue;
        }
        let proc_dir = pid.map(|p| host.proc_pid(p));
        let server_alive = proc_dir.as_ref().is_some_and(|p| p.join("stat").exists());
        let server_cmdline = proc_dir.as_ref().filter(|_| server_alive).and_then(|p| {
            let mut b = std::fs::read(p.join("cmdline")).ok()?;
            b.truncate(super::processes::CMDLINE_MAX);
            Some(super::processes::cmdline_text(b))
        });
        let server_comm = proc_dir.as_ref().filter(|_| server_alive).and_then(|p| {
            let mut b = std::fs::read(p.join("comm")).ok()?;
            while b.last() == Some(&b'\n') {
                b.pop();
            }
            Some(KernelText::from_bytes(b))
        });
        let backend =
            read_attr_opt(&dir.join("backend"))?.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
        out.push(NbdDevice {
            device: d.name.clone(),
            devnum: d.devnum,
            pid,
            server_alive,
            server_cmdline,
            server_comm,
            backend,
        });
    }
    Ok(out)
}
