//! The world the daemon runs on: the live host ([`LinuxWorld`]), or the simulated one
//! ([`SimWorld`], for the gRPC suite without root). Every [`World`] call goes to the one it
//! holds; the daemon's own extras (the periodic scan with its process memo, the namespaces the
//! mount watch marks, pin risks, the Kubernetes view) are the live host's, and the sim answers
//! them plainly (a full scan, none, none, no API). On Linux nothing changes.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::act::pod_volume::DirActError;
use crate::act::{ActError, StepOutcome};
use crate::discover::kubelet::pod_dirs::PodDirs;
use crate::discover::pod_processes::PodProcesses;
use crate::discover::probe::KernelWord;
use crate::engine::error::EngineError;
use crate::engine::sim::SimWorld;
use crate::engine::world::{LinuxWorld, Reread, World};
use crate::graph::pin_risks::PinReport;
use crate::graph::propagation::NsTable;
use crate::graph::scan::{Scan, Target};
use crate::host::beneath::FileKey;
use crate::host::clock::BootTime;
use crate::host::parallel::Stop;
use crate::kube::ClusterView;
use crate::model::{DevNum, DeviceName, MountNsId};
use crate::plan::pod_volume::DirStep;
use crate::plan::Step;
use crate::snapshot::reread::Changes;

/// The daemon's world.
// One per daemon, held in place by its engine: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum DaemonWorld {
    Linux(LinuxWorld),
    Sim(Arc<SimWorld>),
}

impl DaemonWorld {
    fn inner(&self) -> &dyn World {
        match self {
            DaemonWorld::Linux(w) => w,
            DaemonWorld::Sim(w) => w.as_ref(),
        }
    }

    /// [`LinuxWorld::scan_periodic`]; the sim scans in full.
    pub fn scan_periodic(&self, stop: Stop<'_>) -> Result<Option<Scan>, EngineError> {
        match self {
            DaemonWorld::Linux(w) => w.scan_periodic(stop),
            DaemonWorld::Sim(w) => w.scan(Target::All).map(Some),
        }
    }

    /// [`LinuxWorld::namespace_files`]; the sim has no namespace files.
    pub fn namespace_files(&self) -> Vec<(MountNsId, Option<u64>, PathBuf)> {
        match self {
            DaemonWorld::Linux(w) => w.namespace_files(),
            DaemonWorld::Sim(_) => Vec::new(),
        }
    }

    /// [`LinuxWorld::pin_risks`]; the sim has none (an empty report on a full pass, as a live
    /// host without a whole-host snapshot).
    pub fn pin_risks(&self, changed: Option<&HashSet<MountNsId>>) -> Option<PinReport> {
        match self {
            DaemonWorld::Linux(w) => w.pin_risks(changed),
            DaemonWorld::Sim(_) => changed.is_none().then(PinReport::default),
        }
    }

    /// [`LinuxWorld::processes_in`]; the sim's namespaces have no processes to look for.
    pub fn processes_in(
        &self,
        ids: &HashSet<MountNsId>,
    ) -> Result<BTreeMap<MountNsId, BTreeSet<u32>>, String> {
        match self {
            DaemonWorld::Linux(w) => w.processes_in(ids),
            DaemonWorld::Sim(_) => Ok(BTreeMap::new()),
        }
    }

    /// Takes the Kubernetes API's view (the live host's; the sim has no API).
    pub fn use_cluster_view(&self, view: tokio::sync::watch::Receiver<ClusterView>) {
        if let DaemonWorld::Linux(w) = self {
            let _ = w.cluster.set(view);
        }
    }

    /// Why the API is not asked (the live host's; the sim says its own).
    pub fn set_api_off(&self, why: String) {
        if let DaemonWorld::Linux(w) = self {
            let _ = w.api_off.set(why);
        }
    }
}

impl World for DaemonWorld {
    fn scan(&self, target: Target) -> Result<Scan, EngineError> {
        self.inner().scan(target)
    }
    fn rescan_changed(&self, changes: &Changes, reusable: &HashSet<DevNum>) -> Result<Reread, String> {
        self.inner().rescan_changed(changes, reusable)
    }
    fn kernel_word(&self, device: &DeviceName, devnum: DevNum) -> KernelWord {
        self.inner().kernel_word(device, devnum)
    }
    fn mount_tables(&self, scan: &Scan, wanted: &dyn Fn(MountNsId) -> bool) -> Vec<NsTable> {
        self.inner().mount_tables(scan, wanted)
    }
    fn open_files(&self, devnum: DevNum, fds: &[(u32, u32)]) -> Result<usize, String> {
        self.inner().open_files(devnum, fds)
    }
    fn cluster(&self) -> Option<ClusterView> {
        self.inner().cluster()
    }
    fn can_act(&self) -> Result<(), String> {
        self.inner().can_act()
    }
    fn api_off(&self) -> String {
        self.inner().api_off()
    }
    fn run(&self, step: &Step) -> Result<StepOutcome, ActError> {
        self.inner().run(step)
    }
    fn now(&self) -> BootTime {
        self.inner().now()
    }
    fn agent_alive(&self, pid: u32) -> bool {
        self.inner().agent_alive(pid)
    }
    fn writer_alive(&self, writer: &crate::act::journal::Writer) -> bool {
        self.inner().writer_alive(writer)
    }
    fn iscsi_session(&self, sid: u32) -> Result<Option<(String, Option<String>)>, String> {
        self.inner().iscsi_session(sid)
    }
    fn resolve(&self, arg: &str) -> Result<DevNum, EngineError> {
        self.inner().resolve(arg)
    }
    fn sight(&self) -> Result<(), String> {
        self.inner().sight()
    }
    fn pod_dirs(&self, survey: &dyn Fn(&str) -> bool) -> Result<PodDirs, String> {
        self.inner().pod_dirs(survey)
    }
    fn pod_processes(&self) -> Result<PodProcesses, String> {
        self.inner().pod_processes()
    }
    fn stat_on_host(&self, path: &Path) -> Result<(FileKey, Option<u64>), String> {
        self.inner().stat_on_host(path)
    }
    fn dir_key(&self, kubelet_dir: &Path, rel: &Path) -> Result<Option<FileKey>, String> {
        self.inner().dir_key(kubelet_dir, rel)
    }
    fn mount_ns_gone(&self, ns: &crate::discover::namespaces::MountNamespace) -> bool {
        self.inner().mount_ns_gone(ns)
    }
    fn remove_dir(&self, step: &DirStep) -> Result<StepOutcome, DirActError> {
        self.inner().remove_dir(step)
    }
}
