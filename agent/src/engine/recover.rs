//! Crash recovery: closing the steps a run that died left open in the journal.
//!
//! A step's intent is on disk before it touches the kernel and its result after, so a run killed
//! in between (`kill -9`, OOM, a node reboot) leaves an intent with no result. The next daemon,
//! before it acts on anything (and every `--apply` run, before its own steps), re-checks each such
//! intent against the device as it is now and closes it with a `recovered` record
//! ([`Journal::recovered`]) that says what was found:
//!
//! - `gone`: no device has that number any more: the step, or a later one of its plan, took
//!   effect (or someone else removed it). Nothing to repeat.
//! - `identity_changed`: the number now stands for another device (a new disk sequence, uuid,
//!   wwid, backing...). The interrupted step is **never** repeated against it; the new device is
//!   judged on its own, from scratch, like any other. A loop device found unbound, or an nbd
//!   device found disconnected, is the step's own effect and counts as `in_place`.
//! - `in_place`: the same device, with the step's effect visible (queueing off after
//!   `fail_if_no_path`, a disk offline, the mount gone, a loop device unbound).
//! - `replan`: the same device, the effect not in place. The step is not finished: when its plan
//!   was journaled ([`crate::act::journal::Journal::plan`]) and the request resumes it
//!   ([`super::workflow`]), it runs again from that plan, re-checked right before (identity,
//!   holders, the kernel's word), against this same device, as an idempotent re-run; otherwise the
//!   device is planned again from a fresh scan, through every gate.
//!
//! An interrupted `rmdir` of a pod volume directory is resolved against the directory, not a
//! device ([`super::dir_recover`]: gone is `in_place`).
//!
//! Closing intents is the first half of recovery; the second, finishing the unfinished plans, is
//! [`super::workflow`]'s (a plan whose interrupted step found `identity_changed` is closed, never
//! resumed).
//!
//! An intent whose writer is still alive (a concurrent `--apply` run) is in flight, not
//! interrupted, and is left open; so is one whose device cannot be re-checked (a failed scan):
//! it is tried again at the next start. An agent that may not act on the host (not in its PID
//! namespace) cannot tell a live writer from a dead one, and closes nothing. [`resolve`] is pure; [`Engine::recover`] reads the
//! journal and the host.

use std::io;

use serde_json::Value;

use super::{Engine, EngineError, World};
use crate::act::journal::{self, Intent, Journal, JournaledStep, Resolution};
use crate::graph::identity::{Backing, Identity};
use crate::graph::scan::Target;
use crate::graph::DeviceEntry;
use crate::model::{DevNum, HolderKind};
use crate::plan::Action;

/// A step a run started and never finished: an open intent, as the journal has it.
#[derive(Debug, Clone, PartialEq)]
pub struct Interrupted {
    /// The intent's record ID (the `recovered` record carries it too).
    pub id: String,
    /// The process that wrote the intent (the ID's second field).
    pub writer_pid: Option<u32>,
    /// The process that wrote it, with its start time and boot when the record has them
    /// ([`journal::Writer`]).
    pub writer: Option<journal::Writer>,
    pub device: String,
    pub devnum: DevNum,
    /// The identity token the step was planned for.
    pub identity: String,
    /// The step as journaled, read into its type (its action's fields).
    pub step: JournaledStep,
}

impl Interrupted {
    /// Reads an open intent ([`journal::pending`]); why not when it is malformed.
    pub fn from_intent(intent: &Intent) -> Result<Self, String> {
        let step = intent.step()?;
        let (device, devnum, identity) = match &step {
            JournaledStep::Device { device, devnum, identity, .. } => {
                (device.clone(), *devnum, identity.clone())
            }
            // A directory's `rmdir`: its device the placeholder `pod-volume`, its identity the
            // directory's device and inode.
            JournaledStep::Dir(d) => ("pod-volume".into(), DevNum::new(0, 0), d.key.to_string()),
        };
        Ok(Self {
            id: intent.id.clone(),
            writer_pid: journal::writer_pid(&intent.id),
            writer: intent.writer(),
            device,
            devnum,
            identity,
            step,
        })
    }

    /// Reads an intent record given as JSON (as a journal line has it); why not when it is
    /// malformed.
    pub fn from_record(v: &Value) -> Result<Self, String> {
        let intent: Intent =
            serde_json::from_value(v.clone()).map_err(|e| format!("not an intent record: {e}"))?;
        Self::from_intent(&intent)
    }

    /// `dm_message`, `dm_remove`, `scsi_delete`... ([`crate::plan::ActionKind::as_str`]).
    pub fn action(&self) -> &'static str {
        self.step.action_name()
    }

    /// The step's action on a device (`None` for a directory's `rmdir`).
    fn device_action(&self) -> Option<&Action> {
        match &self.step {
            JournaledStep::Device { action, .. } => Some(action),
            JournaledStep::Dir(_) => None,
        }
    }

    /// The step in words: `dm_remove of dm-0 (253:0)`, `dm_message 'fail_if_no_path' to ...`.
    pub fn describe(&self) -> String {
        match self.device_action() {
            Some(Action::DmMessage { message, .. }) => {
                format!("{} '{message}' to {} ({})", self.action(), self.device, self.devnum)
            }
            _ => format!("{} of {} ({})", self.action(), self.device, self.devnum),
        }
    }
}

/// How an interrupted step was closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub word: Resolution,
    /// What was found, in words (the `recovered` record's detail).
    pub detail: String,
}

/// Resolves one interrupted step against what a fresh scan shows at its device number now
/// (`None`: no device there). Pure.
pub fn resolve(i: &Interrupted, now: Option<&DeviceEntry>) -> Resolved {
    let what = format!(
        "{} was interrupted (the agent stopped after writing its intent, before its result)",
        i.describe()
    );
    let Some(entry) = now else {
        return Resolved {
            word: Resolution::Gone,
            detail: format!(
                "{what}; no device is {} any more, so the step or a later one of its plan took effect: nothing to repeat",
                i.devnum
            ),
        };
    };
    let identity = Identity::of(entry);
    if identity.token() != i.identity {
        if let Some(effect) = changed_by_the_step_itself(i, entry, &identity) {
            return Resolved {
                word: Resolution::InPlace,
                detail: format!("{what}; {effect}: nothing to repeat"),
            };
        }
        return Resolved {
            word: Resolution::IdentityChanged,
            detail: format!(
                "{what}; {} is now another device: planned for [{}], now [{}]; the interrupted step is not repeated against it, and the new device is judged on its own",
                i.devnum,
                i.identity,
                identity.token()
            ),
        };
    }
    if let Some(effect) = effect_in_place(i, entry) {
        return Resolved {
            word: Resolution::InPlace,
            detail: format!("{what}; {effect}: nothing to repeat"),
        };
    }
    Resolved {
        word: Resolution::Replan,
        detail: format!(
            "{what}; {} is still the device it was planned for [{}] and the step's effect is not in place: it is planned again from a fresh scan and re-checked before each step, so it runs again only if that plan still calls for it, against this same device",
            i.device, i.identity
        ),
    }
}

/// Resolves an interrupted `iscsi_logout` against the session as sysfs shows it now
/// (`(target, portal)`, `None`: gone). Pure.
pub fn resolve_logout(i: &Interrupted, now: Option<&(String, Option<String>)>) -> Resolved {
    let (sid, planned_target, planned_portal) = match i.device_action() {
        Some(Action::IscsiLogout { sid, target, portal, .. }) => (*sid, target.as_str(), portal.as_str()),
        _ => (0, "", ""),
    };
    let what = format!(
        "the logout of iSCSI session{sid} ({planned_target} at {planned_portal}) was interrupted (the agent stopped after writing its intent, before its result)"
    );
    match now {
        None => Resolved {
            word: Resolution::InPlace,
            detail: format!("{what}; session{sid} is no longer in sysfs: logged out, nothing to repeat"),
        },
        Some((target, portal)) if target != planned_target || portal.as_deref() != Some(planned_portal) => {
            Resolved {
                word: Resolution::IdentityChanged,
                detail: format!(
                    "{what}; session{sid} now logs in to {target} at {}: another session, never logged out for this step",
                    portal.as_deref().unwrap_or("an unknown portal")
                ),
            }
        }
        Some(_) => Resolved {
            word: Resolution::Replan,
            detail: format!(
                "{what}; session{sid} is still logged in: the agent logs a session out only on the plan of its last disk, so it is reported (no LUN) and left for `iscsiadm -m session -r {sid} -u`"
            ),
        },
    }
}

/// A changed identity that is the step's own doing: an unbound loop device after `detach_loop`,
/// a disconnected nbd device after `nbd_disconnect` (same name and number, nothing bound).
fn changed_by_the_step_itself(i: &Interrupted, entry: &DeviceEntry, now: &Identity) -> Option<String> {
    if now.devnum != i.devnum || now.name.as_str() != i.device {
        return None;
    }
    match i.device_action()? {
        Action::DetachLoop { .. } if now.backing == Backing::UnboundLoop => {
            Some(format!("{} is an unbound loop device now", i.device))
        }
        Action::NbdDisconnect { .. } if entry.nbd.is_none() && now.backing == Backing::Plain => {
            Some(format!("{} is disconnected now", i.device))
        }
        _ => None,
    }
}

/// The step's effect, when a fresh scan of the same device shows it.
fn effect_in_place(i: &Interrupted, entry: &DeviceEntry) -> Option<String> {
    match i.device_action()? {
        Action::DmMessage { message, .. } => {
            let queueing = entry.multipath.as_ref()?.queue_if_no_path?;
            (message == "fail_if_no_path" && !queueing)
                .then(|| format!("map {} no longer queues I/O (no queue_if_no_path in its table)", i.device))
        }
        Action::NvmeDeleteController { controller, subsysnqn, address, .. } => {
            // The head outlives a controller while another path of its subsystem is left.
            let still = entry.nvme.as_ref()?.controllers.iter().any(|c| {
                &c.name == controller && &c.subsysnqn == subsysnqn && &c.address.target() == address
            });
            (!still).then(|| format!("controller {controller} no longer serves {}", i.device))
        }
        Action::ScsiOffline { .. } => {
            entry.scsi.as_ref().filter(|s| s.is_offline()).map(|_| format!("disk {} is offline", i.device))
        }
        Action::DetachMount { namespace, mount_id, .. } => {
            let still = entry.holders.iter().any(|h| {
                h.kind == HolderKind::Mount
                    && h.mount_namespace == Some(*namespace)
                    && h.mount_id == Some(*mount_id)
            });
            (!still).then(|| {
                format!("mount {mount_id} of {} is no longer in mount namespace {}", i.device, namespace.0)
            })
        }
        _ => None,
    }
}

/// A closed `rmdir` intent as an interrupted step (its device the placeholder `pod-volume`,
/// its identity the directory's device and inode) and how it was closed.
fn dir_interrupted(d: super::dir_recover::DirRecovered) -> (Interrupted, Resolved) {
    let i = Interrupted {
        writer_pid: d.writer.as_ref().map(|w| w.pid),
        writer: d.writer,
        device: "pod-volume".into(),
        devnum: DevNum::new(0, 0),
        identity: d.step.key.to_string(),
        step: JournaledStep::Dir(d.step),
        id: d.id,
    };
    (i, Resolved { word: d.word, detail: d.detail })
}

/// What [`Engine::recover`] did.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Each interrupted step and how it was closed (its `recovered` record is on disk).
    pub resolved: Vec<(Interrupted, Resolved)>,
    /// Open intents left open, with why (in flight in a live process, not re-checkable).
    pub left_open: Vec<(String, String)>,
}

impl<W: World> Engine<W> {
    /// Re-checks every step the journal has open (see the module docs) and closes each whose
    /// writer is dead with a `recovered` record. Changes nothing on the host.
    pub fn recover(&self, journal: &mut Journal) -> io::Result<Recovery> {
        let mut out = Recovery::default();
        let open = journal::pending(journal.path())?;
        // Telling a dead writer from a live one needs the processes of the PID namespace the
        // steps were run from: the same condition as acting at all.
        if let Err(why) = self.world.can_act() {
            for record in open {
                out.left_open.push((record.id, format!("this agent may not act here, so it cannot tell whether the step's writer is alive: {why}")));
            }
            return Ok(out);
        }
        for record in open {
            if record.is_dir_step() {
                match self.recover_dir(&record, journal)? {
                    Ok(d) => out.resolved.push(dir_interrupted(d)),
                    Err(left) => out.left_open.push(left),
                }
                continue;
            }
            let i = match Interrupted::from_intent(&record) {
                Ok(i) => i,
                Err(why) => {
                    let id = record.id;
                    tracing::error!(journal_id = %id, "cannot re-check an interrupted step: {why}; left open");
                    out.left_open.push((id, format!("malformed intent: {why}")));
                    continue;
                }
            };
            // The writer by PID, start time and boot (a reused PID is another process).
            let alive =
                i.writer.as_ref().filter(|w| w.pid != std::process::id() && self.world.writer_alive(w));
            if let Some(pid) = alive.map(|w| w.pid) {
                let why =
                    format!("its writer, agent process {pid}, is still running: in flight, not interrupted");
                tracing::info!(journal_id = %i.id, step = %i.describe(), "{why}; left open");
                out.left_open.push((i.id, why));
                continue;
            }
            if let Some(&Action::IscsiLogout { sid, .. }) = i.device_action() {
                // Its disk is gone by design: the session is what the step was about.
                let now = match self.world.iscsi_session(sid) {
                    Ok(now) => now,
                    Err(why) => {
                        out.left_open.push((i.id, format!("cannot re-read the session: {why}")));
                        continue;
                    }
                };
                let resolved = resolve_logout(&i, now.as_ref());
                journal.recovered(&i.id, resolved.word, &resolved.detail)?;
                tracing::warn!(target: "audit", phase = "recovered", action = i.action(), device = %i.device, identity = %i.identity, result = resolved.word.as_str(), detail = %resolved.detail, journal_id = %i.id);
                out.resolved.push((i, resolved));
                continue;
            }
            let resolved = match self.scan(Target::Device(i.devnum)) {
                Ok(scan) => resolve(&i, scan.entry(i.devnum)),
                Err(EngineError::NotFound(_)) => resolve(&i, None),
                Err(e) => {
                    let why = format!("cannot re-check it with a fresh scan: {e}");
                    tracing::error!(journal_id = %i.id, step = %i.describe(), "{why}; left open until the next start");
                    out.left_open.push((i.id, why));
                    continue;
                }
            };
            journal.recovered(&i.id, resolved.word, &resolved.detail)?;
            tracing::warn!(target: "audit", phase = "recovered", action = i.action(), device = %i.device, identity = %i.identity, result = resolved.word.as_str(), detail = %resolved.detail, journal_id = %i.id);
            out.resolved.push((i, resolved));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::scsi::{ScsiAddress, ScsiDisk, ScsiState, Transport};
    use crate::graph::multipath::{MultipathView, PathView, ScsiView};
    use crate::graph::Holder;
    use crate::model::{BlockDevice, DeviceKind, DeviceName, MountNsId};

    fn bare(name: &str, devnum: DevNum, kind: DeviceKind, diskseq: u64) -> DeviceEntry {
        let device = BlockDevice {
            diskseq: Some(diskseq),
            ..BlockDevice::new(DeviceName::new(name).expect("name"), devnum, kind, 16 << 20)
        };
        DeviceEntry::new(device, Vec::new())
    }

    fn disk(diskseq: u64, state: ScsiState) -> DeviceEntry {
        let mut e = bare("sda", DevNum::new(8, 0), DeviceKind::Disk, diskseq);
        e.scsi = Some(ScsiView {
            disk: ScsiDisk {
                name: DeviceName::new("sda").expect("name"),
                devnum: DevNum::new(8, 0),
                address: "0:0:0:0".parse::<ScsiAddress>().expect("address"),
                state,
                vendor: "Linux".into(),
                model: "scsi_debug".into(),
                wwid: Some("naa.33333330000007d0".into()),
                ioerr_cnt: 0,
                iorequest_cnt: 0,
                transport: Transport::Other,
            },
            transport_state: None,
            path_of: None,
            session: None,
            outage: None,
            lun_gone: None,
        });
        e
    }

    fn map(queueing: bool) -> DeviceEntry {
        let mut e = bare("dm-0", DevNum::new(253, 0), DeviceKind::Dm, 9);
        e.device.dm = Some(crate::model::DmInfo {
            name: "mpathb".into(),
            uuid: "mpath-333333330000007d0".into(),
            suspended: false,
        });
        e.multipath = Some(MultipathView {
            name: "mpathb".into(),
            uuid: "mpath-333333330000007d0".into(),
            wwid: "333333330000007d0".into(),
            open_count: Some(0),
            suspended: false,
            queue_if_no_path: Some(queueing),
            paths: vec![PathView {
                devnum: DevNum::new(8, 0),
                device: None,
                state: "failed",
                fail_count: 1,
                scsi_state: Some("offline".into()),
            }],
            active_paths: 0,
            io_would_hang: queueing,
            partitions: Vec::new(),
        });
        e
    }

    /// The intent record the engine writes for `action` on `e` (planned for `e`'s identity).
    fn intent(e: &DeviceEntry, action: Value, pid: u32) -> Interrupted {
        let mut step = serde_json::json!({
            "device": e.device.name.as_str(),
            "devnum": e.device.devnum,
            "identity": Identity::of(e).token(),
        });
        step.as_object_mut().expect("object").extend(action.as_object().expect("object").clone());
        let record =
            serde_json::json!({ "ts": 1.0, "id": format!("1700-{pid}-0"), "phase": "intent", "step": step });
        Interrupted::from_record(&record).expect("an intent")
    }

    /// An NVMe head served by `ctrls` (name, state).
    fn nvme_head(ctrls: &[(&str, crate::discover::nvme::CtrlState)]) -> DeviceEntry {
        use crate::discover::nvme::{NvmeAddress, NvmeController};
        let mut e = bare("nvme0n1", DevNum::new(259, 1), DeviceKind::NvmeNamespace, 14);
        let controllers: Vec<NvmeController> = ctrls
            .iter()
            .map(|(n, st)| NvmeController {
                name: (*n).into(),
                transport: "tcp".into(),
                subsysnqn: "nqn.a".into(),
                address: NvmeAddress::parse("traddr=127.0.0.1,trsvcid=4420"),
                state: st.clone(),
                ctrl_loss_tmo: None,
                reconnect_delay: None,
                cntlid: Some(1),
                hostnqn: None,
                subsystem: None,
                namespaces: Vec::new(),
                fabrics: true,
            })
            .collect();
        e.nvme = Some(crate::graph::nvme::NvmeView {
            role: crate::graph::nvme::NvmeRole::Head,
            subsystem: Some("nvme-subsys0".into()),
            subsysnqn: "nqn.a".into(),
            head: None,
            live: 0,
            controllers,
            outage: None,
            siblings: Vec::new(),
            siblings_held: Vec::new(),
        });
        e
    }

    #[test]
    fn an_interrupted_controller_deletion_is_gone_in_place_or_replanned() {
        use crate::discover::nvme::CtrlState;
        let step = serde_json::json!({"action": "nvme_delete_controller", "controller": "nvme0", "subsysnqn": "nqn.a", "transport": "tcp", "address": "traddr=127.0.0.1,trsvcid=4420", "cntlid": 1});
        let planned = nvme_head(&[("nvme0", CtrlState::Connecting), ("nvme3", CtrlState::Connecting)]);
        let i = intent(&planned, step, 42);
        // The last controller went: so did the head.
        assert_eq!(resolve(&i, None).word, Resolution::Gone);
        // Another path of the subsystem keeps the head: the planned controller is no longer there.
        let r = resolve(&i, Some(&nvme_head(&[("nvme3", CtrlState::Connecting)])));
        assert_eq!(r.word, Resolution::InPlace, "{}", r.detail);
        assert!(r.detail.contains("controller nvme0 no longer serves nvme0n1"), "{}", r.detail);
        // Still there: planned again from a fresh scan.
        assert_eq!(resolve(&i, Some(&planned)).word, Resolution::Replan);
    }

    #[test]
    fn an_interrupted_logout_is_resolved_against_the_session_not_the_deleted_disk() {
        let i = intent(
            &disk(5, ScsiState::Offline),
            serde_json::json!({"action": "iscsi_logout", "sid": 4, "target": "iqn.t:a", "portal": "10.0.0.1:3260", "iface": "default"}),
            42,
        );
        let r = resolve_logout(&i, None);
        assert_eq!(r.word, Resolution::InPlace, "{}", r.detail);
        assert!(r.detail.contains("session4 is no longer in sysfs"), "{}", r.detail);
        let same = ("iqn.t:a".to_owned(), Some("10.0.0.1:3260".to_owned()));
        let r = resolve_logout(&i, Some(&same));
        assert_eq!(r.word, Resolution::Replan, "{}", r.detail);
        assert!(r.detail.contains("iscsiadm -m session -r 4 -u"), "{}", r.detail);
        let other = ("iqn.t:b".to_owned(), Some("10.0.0.1:3260".to_owned()));
        assert_eq!(resolve_logout(&i, Some(&other)).word, Resolution::IdentityChanged);
        let moved = ("iqn.t:a".to_owned(), None);
        assert_eq!(resolve_logout(&i, Some(&moved)).word, Resolution::IdentityChanged);
    }

    #[test]
    fn a_step_whose_device_is_gone_is_closed_as_gone() {
        let i = intent(
            &map(true),
            serde_json::json!({"action": "dm_remove", "uuid": "mpath-333333330000007d0", "deferred": false}),
            42,
        );
        assert_eq!(i.writer_pid, Some(42));
        let r = resolve(&i, None);
        assert_eq!(r.word, Resolution::Gone);
        assert!(r.detail.starts_with("dm_remove of dm-0 (253:0) was interrupted"), "{}", r.detail);
        assert!(r.detail.contains("no device is 253:0 any more"), "{}", r.detail);
    }

    #[test]
    fn a_step_whose_device_changed_is_never_replanned_as_the_same_step() {
        let planned = disk(5, ScsiState::Offline);
        let i = intent(
            &planned,
            serde_json::json!({"action": "scsi_delete", "wwid": "naa.33333330000007d0", "address": "0:0:0:0"}),
            42,
        );
        // Deleted and found again by a rescan: same name, number, wwid and address; a new disk
        // sequence number.
        let r = resolve(&i, Some(&disk(6, ScsiState::Running)));
        assert_eq!(r.word, Resolution::IdentityChanged, "{}", r.detail);
        assert!(
            r.detail.contains("sda@8:0#5;") && r.detail.contains("sda@8:0#6;"),
            "both named: {}",
            r.detail
        );
        assert!(r.detail.contains("not repeated"), "{}", r.detail);
        // The same disk, not deleted yet: planned again.
        let r = resolve(&i, Some(&planned));
        assert_eq!(r.word, Resolution::Replan, "{}", r.detail);
    }

    #[test]
    fn a_step_whose_effect_is_visible_is_in_place_and_otherwise_replanned() {
        let fail = serde_json::json!({"action": "dm_message", "uuid": "mpath-333333330000007d0", "message": "fail_if_no_path"});
        let i = intent(&map(true), fail, 42);
        assert_eq!(resolve(&i, Some(&map(true))).word, Resolution::Replan, "still queueing");
        let r = resolve(&i, Some(&map(false)));
        assert_eq!(r.word, Resolution::InPlace);
        assert!(r.detail.contains("no longer queues I/O"), "{}", r.detail);

        let offline = serde_json::json!({"action": "scsi_offline", "wwid": "naa.33333330000007d0", "address": "0:0:0:0", "require_offline": false});
        let i = intent(&disk(5, ScsiState::Running), offline, 42);
        assert_eq!(resolve(&i, Some(&disk(5, ScsiState::Running))).word, Resolution::Replan);
        assert_eq!(resolve(&i, Some(&disk(5, ScsiState::Offline))).word, Resolution::InPlace);

        let mut held = bare("loop3", DevNum::new(7, 3), DeviceKind::Loop, 4);
        let mut m = Holder::bare(HolderKind::Mount);
        m.mount_namespace = Some(MountNsId(4026532001));
        m.mount_id = Some(77);
        held.holders.push(m);
        let detach = serde_json::json!({"action": "detach_mount", "namespace": 4026532001u64, "via": {"via": "task", "pid": 100, "tid": 100}, "mount_id": 77, "mount_dev": {"major": 7, "minor": 3}, "mount_point": "/mnt/x", "fstype": "ext4"});
        let i = intent(&held, detach, 42);
        assert_eq!(resolve(&i, Some(&held)).word, Resolution::Replan, "the mount is still there");
        held.holders.clear();
        assert_eq!(resolve(&i, Some(&held)).word, Resolution::InPlace, "the mount is gone");
    }

    #[test]
    fn an_unbound_loop_device_is_the_detach_itself_not_another_device() {
        let mut bound = bare("loop3", DevNum::new(7, 3), DeviceKind::Loop, 4);
        bound.device.loop_info = Some(crate::graph::test_support::loop_info(12));
        let i = intent(&bound, serde_json::json!({"action": "detach_loop", "backing_file": "/img"}), 42);
        let unbound = bare("loop3", DevNum::new(7, 3), DeviceKind::Loop, 4);
        let r = resolve(&i, Some(&unbound));
        assert_eq!(r.word, Resolution::InPlace, "{}", r.detail);
        // Bound again to another file: another device.
        let mut rebound = bound.clone();
        rebound.device.diskseq = Some(5);
        assert_eq!(resolve(&i, Some(&rebound)).word, Resolution::IdentityChanged);
    }

    #[test]
    fn malformed_intents_are_reported_not_guessed() {
        let e = Interrupted::from_record(&serde_json::json!({"id": "1-2-3", "phase": "intent"}))
            .expect_err("no step");
        assert!(e.contains("no step"), "{e}");
        let e = Interrupted::from_record(
            &serde_json::json!({"id": "1-2-3", "step": {"device": "sda", "identity": "x", "action": "scsi_delete"}}),
        )
        .expect_err("no devnum");
        assert!(e.contains("devnum"), "{e}");
    }
}
