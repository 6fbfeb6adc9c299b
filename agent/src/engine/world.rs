//! What the engine needs from the machine, and the real machine behind it.
//!
//! [`World`] is the engine's only way out: reading the host, asking the kernel about one device,
//! the Kubernetes API's view, whether this agent may act at all, and running a step.
//! [`LinuxWorld`] is the live host (or a fixture tree, which can be read but never acted on); the
//! property test has a simulated world with hidden holders, identity swaps and failing steps.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::EngineError;
use crate::act::linux::LinuxActuator;
use crate::act::probe::{self, KernelWord};
use crate::act::{ActError, Actuator, StepOutcome};
use crate::clock::BootTime;
use crate::discover::blockdev;
use crate::graph::DeviceGraph;
use crate::host::HostRoot;
use crate::kube::ClusterView;
use crate::model::{DevNum, DeviceName};
use crate::plan::Step;
use crate::protect::protected_devices;
use crate::scan::{Scan, Target};
use crate::snapshot::{ScanOptions, Scope, Snapshot};

/// The machine, as the engine sees it.
pub trait World {
    /// Reads the host: every device, or one device and what is stacked on it
    /// ([`EngineError::NotFound`] when that device is not there).
    fn scan(&self, target: Target) -> Result<Scan, EngineError>;
    /// The kernel's own word about one device (exclusive-open probe, sysfs holders, live
    /// filesystems, loop devices on its node, dm open count), read right before a destructive
    /// step and never in routine scans.
    fn kernel_word(&self, device: &DeviceName, devnum: DevNum) -> KernelWord;
    /// The Kubernetes API's view of this node, when the API is in use.
    fn cluster(&self) -> Option<ClusterView>;
    /// Whether this agent may act on the host at all; why not otherwise.
    fn can_act(&self) -> Result<(), String>;
    /// Carries out one step (the engine has re-checked it).
    fn run(&self, step: &Step) -> Result<StepOutcome, ActError>;
    /// Now, on a clock that cannot jump.
    fn now(&self) -> BootTime;
    /// Whether process `pid` is alive and is this agent's program (the writer of a journal
    /// intent still at work, not crashed). A world without processes has none.
    fn agent_alive(&self, _pid: u32) -> bool {
        false
    }
}

/// `PROC_PID_INIT_INO`: the inode of the initial PID namespace, fixed by the kernel.
const INITIAL_PID_NS: &str = "pid:[4026531836]";

/// The live host (or a fixture tree).
pub struct LinuxWorld {
    pub host: HostRoot,
    pub options: ScanOptions,
    /// Deadline of each kernel call that may block on a device.
    pub timeout: Duration,
    /// Filled in once the daemon connects to the Kubernetes API.
    pub cluster: Arc<OnceLock<tokio::sync::watch::Receiver<ClusterView>>>,
}

impl LinuxWorld {
    pub fn new(host: HostRoot, options: ScanOptions, timeout: Duration) -> Self {
        Self { host, options, timeout, cluster: Arc::new(OnceLock::new()) }
    }
}

impl World for LinuxWorld {
    fn scan(&self, target: Target) -> Result<Scan, EngineError> {
        let taken_at = BootTime::now();
        let started = Instant::now();
        let devices = blockdev::scan_all(&self.host)?;
        let (scope, covered) = match target {
            Target::All => (Scope::All, None),
            Target::Device(d) => {
                if !devices.devices.iter().any(|x| x.devnum == d) {
                    return Err(EngineError::NotFound(format!(
                        "no block device {d} in {}",
                        self.host.sys_class_block().display()
                    )));
                }
                let s = blockdev::with_descendants(&devices.devices, d);
                (Scope::Devices(s.clone()), Some(s))
            }
        };
        let snap = Snapshot::take_with(&self.host, devices, &scope, started, &self.options)?;
        let graph = DeviceGraph::build(&snap);
        let protected = protected_devices(
            &self.host,
            &graph,
            &self.options.protected_paths,
            &self.options.protected_devices,
        );
        Ok(Scan {
            graph,
            blind_spots: snap.blind_spots,
            protected,
            stats: snap.stats,
            warnings: snap.warnings,
            taken_at,
            scope: covered,
        })
    }

    fn kernel_word(&self, device: &DeviceName, devnum: DevNum) -> KernelWord {
        probe::kernel_word(&self.host, device, devnum, self.timeout)
    }

    fn cluster(&self) -> Option<ClusterView> {
        self.cluster.get().map(|rx| rx.borrow().clone())
    }

    fn can_act(&self) -> Result<(), String> {
        if !self.host.is_live() {
            return Err(format!(
                "{} is not this process's procfs (a fixture tree?): namespaces and devices cannot be acted on through it",
                self.host.proc().display()
            ));
        }
        let ns = std::fs::read_link(self.host.proc().join("self/ns/pid"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|e| format!("unreadable ({e})"));
        if ns != INITIAL_PID_NS {
            return Err(format!(
                "acting needs the host's PID namespace (hostPID: true in the pod spec): this agent runs in PID namespace {ns}, \
                 where it sees only its own processes and would miss every holder outside them"
            ));
        }
        Ok(())
    }

    fn run(&self, step: &Step) -> Result<StepOutcome, ActError> {
        LinuxActuator::new(self.host.clone(), self.timeout).run(step)
    }

    fn now(&self) -> BootTime {
        BootTime::now()
    }

    fn agent_alive(&self, pid: u32) -> bool {
        // `comm` is the executable's name cut to 15 bytes: `blockjanitor-ag`.
        std::fs::read_to_string(self.host.proc().join(pid.to_string()).join("comm"))
            .is_ok_and(|c| c.trim_end().starts_with("blockjanitor"))
    }
}
