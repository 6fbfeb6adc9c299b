//! A simulated host: a [`World`] with no kernel behind it, for running the daemon and the gRPC
//! service without root (the gRPC suite, `tests/tests/grpc_plan_apply.rs`), as stratisd ships its sim
//! engine beside the real one.
//!
//! A scene starts from a real scan ([`SimWorld::from_fixture`] reads a fixture tree under
//! `tests/fixtures` with the normal scan code, [`SimWorld::from_scan`] takes any scan); from then
//! on the sim keeps the state: its devices with their identities, their holders (mounts in
//! namespaces, open fds, stacked devices). A step that runs changes that state the way the kernel
//! would (`sim/steps.rs`): a release detaches its mount, a teardown removes its device. Hooks for
//! tests ([`SimWorld::fail_steps_on`], [`SimWorld::change_identity`], [`SimWorld::crash_next_step`])
//! make steps fail, a device become another one, or the agent die mid-plan.
//!
//! The kernel's word and the mount tables are derived from the holders (a mount claims its
//! device; each namespace's table is private, so no unmount propagates). It can always act: it
//! sees everything it simulates.

mod steps;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::error::EngineError;
use super::world::{LinuxWorld, World};
use crate::act::{ActError, StepOutcome};
use crate::discover::blockdev;
use crate::discover::probe::{Claim, KernelWord};
use crate::graph::propagation::NsTable;
use crate::graph::scan::{Scan, Target};
use crate::graph::DeviceEntry;
use crate::host::clock::BootTime;
use crate::host::HostRoot;
use crate::kube::ClusterView;
use crate::model::{DevNum, DeviceName, HolderKind, MountNsId};
use crate::plan::Step;
use crate::snapshot::ScanOptions;

/// The simulated host.
pub struct SimWorld {
    state: Mutex<SimState>,
}

/// What the sim keeps between calls.
struct SimState {
    /// The scene: the devices as they are now (its graph), its blind spots and protected
    /// devices as the scan it started from found them.
    scene: Scan,
    /// Devices whose steps fail, with the error each gives.
    failing: BTreeMap<DevNum, String>,
    /// The next step kills the agent (a panic on the acting thread) before the kernel sees it.
    crash_next: bool,
    /// Every step that reached the simulated kernel, in order.
    runs: Vec<Step>,
}

impl SimWorld {
    /// A scene from `scan`: its devices, holders, blind spots and protected devices.
    pub fn from_scan(scan: Scan) -> Self {
        let state = SimState { scene: scan, failing: BTreeMap::new(), crash_next: false, runs: Vec::new() };
        Self { state: Mutex::new(state) }
    }

    /// A scene read from the fixture tree `tree` (a `/sys` and `/proc` captured from a real
    /// host) by the normal scan code.
    pub fn from_fixture(tree: &Path) -> Result<Self, EngineError> {
        let options = ScanOptions { trust_unreadable_init: true, ..ScanOptions::default() };
        let linux = LinuxWorld::new(HostRoot::new(tree), options, Duration::from_secs(5));
        linux.scan(Target::All).map(Self::from_scan)
    }

    fn state(&self) -> MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The devices as they are now.
    pub fn devices(&self) -> Vec<DeviceEntry> {
        self.state().scene.graph.devices.clone()
    }

    /// The device named `name` now (`loop3`), if there is one.
    pub fn device(&self, name: &str) -> Option<DeviceEntry> {
        self.state().scene.graph.devices.iter().find(|e| e.device.name.as_str() == name).cloned()
    }

    /// Every step that reached the simulated kernel, in order (failed ones too; not one a
    /// simulated crash stopped before it).
    pub fn steps_run(&self) -> Vec<Step> {
        self.state().runs.clone()
    }

    /// From now on every step on `devnum` fails with `why` (the device and its holders stay).
    pub fn fail_steps_on(&self, devnum: DevNum, why: &str) {
        self.state().failing.insert(devnum, why.to_owned());
    }

    /// `devnum` becomes another device under the same number (its disk sequence number moves
    /// on, as when a loop device is detached and attached again): an identity taken before no
    /// longer matches.
    pub fn change_identity(&self, devnum: DevNum) {
        let mut s = self.state();
        if let Some(e) = s.scene.graph.devices.iter_mut().find(|e| e.device.devnum == devnum) {
            e.device.diskseq = Some(e.device.diskseq.unwrap_or(0) + 1000);
        }
    }

    /// The next step kills the agent before the kernel sees it (a panic on the acting thread),
    /// leaving its journaled plan unfinished, as a crash would.
    pub fn crash_next_step(&self) {
        self.state().crash_next = true;
    }
}

/// The mount tables of the scene's namespaces `wanted` accepts: in each namespace a device
/// mounts in, a private root with every mount of the devices below it, so no unmount
/// propagates.
fn private_tables(devices: &[DeviceEntry], wanted: &dyn Fn(MountNsId) -> bool) -> Vec<NsTable> {
    let mut by_ns: BTreeMap<MountNsId, String> = BTreeMap::new();
    for e in devices {
        for h in e.holders.iter().filter(|h| h.kind == HolderKind::Mount) {
            let (Some(ns), Some(id)) = (h.mount_namespace, h.mount_id) else { continue };
            let text =
                by_ns.entry(ns).or_insert_with(|| "4000000000 0 0:1 / / rw - tmpfs tmpfs rw\n".to_owned());
            let dev = h.mount_dev.unwrap_or(e.device.devnum);
            let at = h.mount_point.as_ref().map_or_else(|| "/mnt".to_owned(), |m| m.escaped().into_owned());
            text.push_str(&format!("{id} 4000000000 {dev} / {at} rw - ext4 /dev/{} rw\n", e.device.name));
        }
    }
    by_ns
        .into_iter()
        .filter(|(ns, _)| wanted(*ns))
        .map(|(ns, text)| (ns, crate::discover::mountinfo::parse(text.as_bytes()).map_err(|e| e.to_string())))
        .collect()
}

impl World for SimWorld {
    fn scan(&self, target: Target) -> Result<Scan, EngineError> {
        let mut scan = self.state().scene.clone();
        scan.taken_at = self.now();
        let known: Vec<_> = scan.graph.devices.iter().map(|e| e.device.clone()).collect();
        let wanted: Vec<DevNum> = match target {
            Target::All => return Ok(scan),
            Target::Device(d) => vec![d],
            Target::Devices(ds) => ds,
        };
        if let Some(d) = wanted.first().filter(|d| !known.iter().any(|x| x.devnum == **d)) {
            return Err(EngineError::NotFound(format!("no block device {d} on the simulated host")));
        }
        let mut scope: Vec<DevNum> = Vec::new();
        for d in wanted.iter().filter(|d| known.iter().any(|x| x.devnum == **d)) {
            for x in blockdev::with_descendants(&known, *d) {
                if !scope.contains(&x) {
                    scope.push(x);
                }
            }
        }
        scan.scope = Some(scope);
        Ok(scan)
    }

    fn kernel_word(&self, device: &DeviceName, devnum: DevNum) -> KernelWord {
        let s = self.state();
        let Some(e) = s.scene.graph.devices.iter().find(|e| e.device.devnum == devnum) else {
            return KernelWord {
                claim: Claim::Inconclusive(format!("{device} is gone")),
                ..KernelWord::unclaimed()
            };
        };
        let mounted = e.holders.iter().any(|h| h.kind == HolderKind::Mount);
        let stacked: Vec<DeviceName> = e
            .holders
            .iter()
            .filter(|h| h.kind == HolderKind::StackedDevice)
            .filter_map(|h| h.device.clone())
            .collect();
        KernelWord {
            claim: if mounted || !stacked.is_empty() { Claim::Claimed } else { Claim::Unclaimed },
            live_filesystems: if mounted {
                vec![format!("ext4 at /sys/fs/ext4/{device}")]
            } else {
                Vec::new()
            },
            sysfs_holders: stacked,
            ..KernelWord::unclaimed()
        }
    }

    fn mount_tables(&self, scan: &Scan, wanted: &dyn Fn(MountNsId) -> bool) -> Vec<NsTable> {
        private_tables(&scan.graph.devices, wanted)
    }

    fn open_files(&self, _devnum: DevNum, fds: &[(u32, u32)]) -> Result<usize, String> {
        // Each simulated fd is its own open file.
        Ok(fds.iter().collect::<HashSet<_>>().len())
    }

    fn cluster(&self) -> Option<ClusterView> {
        None
    }

    fn can_act(&self) -> Result<(), String> {
        Ok(())
    }

    fn api_off(&self) -> String {
        "a simulated host has no Kubernetes API".to_owned()
    }

    fn run(&self, step: &Step) -> Result<StepOutcome, ActError> {
        let mut s = self.state();
        if std::mem::take(&mut s.crash_next) {
            drop(s);
            panic!("simulated crash before {} reached the kernel", step.device);
        }
        s.runs.push(step.clone());
        if let Some(why) = s.failing.get(&step.devnum) {
            return Err(ActError::Syscall {
                device: step.device.clone(),
                op: "simulated",
                source: std::io::Error::other(why.clone()),
            });
        }
        Ok(steps::apply(&mut s.scene.graph.devices, step))
    }

    fn now(&self) -> BootTime {
        BootTime::now()
    }

    fn resolve(&self, arg: &str) -> Result<DevNum, EngineError> {
        let name = arg.strip_prefix("/dev/").unwrap_or(arg);
        let s = self.state();
        s.scene
            .graph
            .devices
            .iter()
            .find(|e| e.device.name.as_str() == name || e.device.devnum.to_string() == arg)
            .map(|e| e.device.devnum)
            .ok_or_else(|| EngineError::NotFound(format!("no device '{arg}' on the simulated host")))
    }
}
