//! One scan as the engine uses it: the device graph, what the scan could not see, which devices
//! are protected, and when it was taken. Verdicts and plans are always made from one `Scan`.
//!
//! A scan of one device looks for holders of that device and what is stacked on it. A plan's
//! steps may remove more than their own device (an NVMe controller's other namespaces, the
//! partitions of a disk, an iSCSI session's disks): [`crate::plan::scope`] says what, so the
//! engine can widen the scan to all of it ([`Target::Devices`]) and hold every device a
//! step removes to the same gates.

use serde::Serialize;

use crate::graph::{DeviceEntry, DeviceGraph};
use crate::host::clock::BootTime;
use crate::model::blindspot::BlindSpot;
use crate::model::scan_stats::ScanStats;
use crate::model::DevNum;

/// What a scan looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Every block device.
    All,
    /// One device and everything stacked on it (partitions, sysfs holders), transitively.
    Device(DevNum),
    /// These devices (the first is the one asked about: the scan fails when it is not there)
    /// and everything stacked on each: a plan's scope ([`plan_scope`]).
    Devices(Vec<DevNum>),
}

/// The result of one scan.
#[derive(Debug, Clone, Serialize)]
pub struct Scan {
    pub graph: DeviceGraph,
    /// What the scan could not see.
    pub blind_spots: Vec<BlindSpot>,
    /// Devices never to be touched: behind the host root and the kubelet and runtime
    /// directories (and everything they sit on), and those the config names.
    #[serde(skip)]
    pub protected: crate::graph::protect::Protected,
    pub stats: ScanStats,
    /// Things that could not be read but that cannot hide a holder (labels, cmdlines).
    pub warnings: Vec<String>,
    /// When the scan started.
    #[serde(skip)]
    pub taken_at: BootTime,
    /// The devices whose holders were looked for (`None`: all of them).
    #[serde(skip)]
    pub scope: Option<Vec<DevNum>>,
    /// The mount namespaces the scan found, with their tasks and pins: the ways into each, for
    /// the whole tables a release reads (`discover::mount_tables`). Filled by scans of some
    /// devices (the ones plans and re-checks rest on); empty in a scan of every device.
    #[serde(skip)]
    pub namespaces: std::sync::Arc<Vec<crate::discover::namespaces::MountNamespace>>,
}

impl Scan {
    /// A scan of `graph` that saw everything (no blind spot, nothing protected, no warning),
    /// taken at `taken_at`: what simulated worlds and tests hand the policy.
    pub fn complete(graph: DeviceGraph, taken_at: BootTime) -> Self {
        Self {
            graph,
            blind_spots: Vec::new(),
            protected: Default::default(),
            stats: ScanStats::default(),
            warnings: Vec::new(),
            taken_at,
            scope: None,
            namespaces: Default::default(),
        }
    }

    /// The entry of one device.
    pub fn entry(&self, devnum: DevNum) -> Option<&DeviceEntry> {
        self.graph.get(devnum)
    }

    /// Whether this scan looked for holders of `devnum`.
    pub fn covers(&self, devnum: DevNum) -> bool {
        self.scope.as_ref().is_none_or(|s| s.contains(&devnum))
    }
}

/// The engine over a world whose scans look only at what they target: widening to a plan's
/// scope, and the re-check of what a step removes besides its own device.
#[cfg(test)]
mod engine_tests {
    use std::cell::{Cell, RefCell};
    use std::time::Duration;

    use crate::act::journal::Journal;
    use crate::act::recording::RecordingActuator;
    use crate::act::{ActError, Actuator, StepOutcome};
    use crate::discover::nvme::CtrlState;
    use crate::discover::probe::KernelWord;
    use crate::engine::error::EngineError;
    use crate::engine::world::World;
    use crate::engine::{Engine, Operation, Settings};
    use crate::graph::nvme::test_support::{ctrl, entries};
    use crate::graph::scan::{Scan, Target};
    use crate::graph::{DeviceGraph, Holder};
    use crate::host::clock::BootTime;
    use crate::judge::grace::Clocks;
    use crate::kube::ClusterView;
    use crate::model::{DevNum, DeviceName, HolderKind, MountNsId};
    use crate::plan::Step;

    /// One NVMe/TCP subsystem with two namespaces behind one controller reconnecting for ever;
    /// a scan looks for holders only of the devices its target names (as on a real host), and
    /// `held` puts a process on the second namespace.
    #[derive(Default)]
    struct TwoNamespaces {
        held: Cell<bool>,
        scans: RefCell<Vec<Target>>,
        actuator: RecordingActuator,
    }

    fn now() -> BootTime {
        BootTime::from_since_boot(Duration::from_secs(100))
    }

    impl World for &TwoNamespaces {
        fn scan(&self, target: Target) -> Result<Scan, EngineError> {
            self.scans.borrow_mut().push(target.clone());
            let mut e = entries(
                &["nvme0n1", "nvme0n2"],
                vec![ctrl("nvme0", "nqn.2026-11.io.blockjanitor:two", "4420", CtrlState::Connecting, true)],
                Vec::new(),
            );
            let all: Vec<DevNum> = e.iter().map(|x| x.device.devnum).collect();
            let scope = match target {
                Target::All => all,
                Target::Device(d) => vec![d],
                Target::Devices(v) => v,
            };
            if self.held.get() && scope.contains(&e[1].device.devnum) {
                let mut h = Holder::bare(HolderKind::OpenDevice);
                h.pids = vec![77];
                h.comm = Some("sleep".into());
                h.path = Some("/dev/nvme0n2".into());
                h.fds = vec![0];
                e[1].holders.push(h);
            }
            crate::graph::mark_held_siblings(&mut e);
            let graph = DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices: e };
            Ok(Scan { scope: Some(scope), ..Scan::complete(graph, now()) })
        }
        fn kernel_word(&self, _device: &DeviceName, _devnum: DevNum) -> KernelWord {
            KernelWord::unclaimed()
        }
        fn mount_tables(
            &self,
            scan: &Scan,
            wanted: &dyn Fn(MountNsId) -> bool,
        ) -> Vec<crate::graph::propagation::NsTable> {
            crate::graph::test_support::private_tables(&scan.graph.devices, wanted)
        }
        fn cluster(&self) -> Option<ClusterView> {
            None
        }
        fn can_act(&self) -> Result<(), String> {
            Ok(())
        }
        fn run(&self, step: &Step) -> Result<StepOutcome, ActError> {
            self.actuator.run(step)
        }
        fn now(&self) -> BootTime {
            now()
        }
    }

    const N1: DevNum = DevNum::new(259, 1);
    const N2: DevNum = DevNum::new(259, 3);

    fn engine(w: &TwoNamespaces) -> Engine<&TwoNamespaces> {
        Engine::new(w, Settings { grace: Duration::ZERO, ..Settings::default() })
    }

    /// Issue 17: a one-shot clean of nvme0n1 scans nvme0n1 only at first; deleting its controller
    /// removes nvme0n2 too, so the scan is widened to it, its holder is found, and the plan is
    /// refused naming the sibling and the process.
    #[test]
    fn a_plan_whose_step_removes_a_held_sibling_is_refused_after_widening_the_scan() {
        let w = TwoNamespaces::default();
        w.held.set(true);
        let e = engine(&w);
        let (judged, plan) = e.plan_fresh(N1, Operation::Clean, &mut Clocks::new(None)).expect("planned");
        assert_eq!(*w.scans.borrow(), vec![Target::Device(N1), Target::Devices(vec![N1, N2])]);
        assert!(judged.scan.covers(N2));
        let r = plan.refusal.as_deref().unwrap_or_default();
        assert!(plan.steps.is_empty(), "{plan:?}");
        assert!(r.contains("nvme0n2") && r.contains("pid 77 (sleep) has the device node open"), "{r}");
    }

    /// Unheld, the plan deletes the controller; a holder appearing on the sibling between the
    /// plan and the step vetoes it right before it runs (the re-check widens its scan too).
    #[test]
    fn a_sibling_held_after_planning_vetoes_the_controller_deletion() {
        let w = TwoNamespaces::default();
        let e = engine(&w);
        let (_, plan) = e.plan_fresh(N1, Operation::Clean, &mut Clocks::new(None)).expect("planned");
        assert!(plan.refusal.is_none() && plan.steps.len() == 1, "{plan:?}");
        w.held.set(true);
        w.scans.borrow_mut().clear();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut j = Journal::open(&dir.path().join("j.jsonl")).expect("journal");
        let reports = e.execute(&plan, &mut j).expect("may act");
        assert_eq!(*w.scans.borrow(), vec![Target::Device(N1), Target::Devices(vec![N1, N2])]);
        match &reports[0].result {
            Err(ActError::Precondition { reason, .. }) => assert!(
                reason.starts_with("nvme0n2 goes too when nvme_delete_controller runs")
                    && reason.contains("pid 77 (sleep) has the device node open"),
                "{reason}"
            ),
            other => panic!("not vetoed: {other:?}"),
        }
        assert!(w.actuator.calls.borrow().is_empty(), "the controller was not deleted");
        // Free again: the step runs.
        w.held.set(false);
        let reports = e.execute(&plan, &mut j).expect("may act");
        assert!(reports[0].result.is_ok(), "{:?}", reports[0].result);
        assert_eq!(w.actuator.calls.borrow().len(), 1);
    }

    /// A device a step removes that the scan did not look at is refused, never assumed free.
    #[test]
    fn a_side_effect_outside_the_scan_is_refused() {
        let w = TwoNamespaces::default();
        let e = engine(&w);
        let (judged, plan) = e.plan_fresh(N1, Operation::Clean, &mut Clocks::new(None)).expect("planned");
        let mut narrow = judged.scan.clone();
        narrow.scope = Some(vec![N1]);
        let sibling = narrow.entry(N2).expect("in the graph");
        let r = crate::engine::recheck::side_effect(&plan.steps[0], &narrow, sibling, None, None, now())
            .unwrap_or_default();
        assert!(r.contains("nvme0n2 goes too") && r.contains("did not look for its holders"), "{r}");
    }
}
