//! The details the agent's one-shot JSON always showed, as protobuf messages too (issue 21: one
//! output model): a holder's mount details and how its namespace is entered, a loop device's
//! status, a dm device's, a multipath map's paths, a SCSI disk's state and transport, an nbd
//! device's server. [`super`] puts them into `Holder` and `Device`.

use blockjanitor_proto::v1 as pb;

use crate::discover::namespaces::NsEntry;
use crate::discover::nbd::NbdDevice;
use crate::discover::scsi::Transport;
use crate::graph::multipath::{MultipathView, ScsiView};
use crate::graph::Holder;
use crate::model::{DmInfo, KernelText, LoopInfo};

/// Names from the kernel travel as their escaped text (protobuf strings must be UTF-8).
pub(super) fn escaped(t: &Option<KernelText>) -> String {
    t.as_ref().map(KernelText::to_string).unwrap_or_default()
}

/// `MAJ:MIN` of an optional device number, "" when absent.
fn devnum(d: Option<crate::model::DevNum>) -> String {
    d.map(|d| d.to_string()).unwrap_or_default()
}

/// A holder's mount details and process state into `out`.
pub(super) fn holder_details(h: &Holder, out: &mut pb::Holder) {
    out.process_state = h.process_state.map(String::from).unwrap_or_default();
    out.mount_id = h.mount_id.unwrap_or(0);
    out.source = escaped(&h.source);
    out.shared_group = h.shared_group.unwrap_or(0);
    out.master_group = h.master_group.unwrap_or(0);
    out.upstream_groups = h.upstream_groups.clone();
    out.mount_dev = devnum(h.mount_dev);
    out.namespace_entry = h.namespace_entry.as_ref().map(namespace_entry);
    out.tid = h.tid.unwrap_or(0);
    out.other_mount_namespaces = h.other_namespaces.iter().map(|n| n.0).collect();
    out.access = h.access.clone();
}

pub(super) fn namespace_entry(e: &NsEntry) -> pb::NamespaceEntry {
    let mut out = pb::NamespaceEntry { description: e.describe(), ..Default::default() };
    match e {
        NsEntry::Task { pid, tid } => (out.via, out.pid, out.tid) = ("task".into(), *pid, *tid),
        NsEntry::TaskNamespace { pid, tid } => {
            (out.via, out.pid, out.tid) = ("task_namespace".into(), *pid, *tid)
        }
        NsEntry::Nsfs { path } => (out.via, out.path) = ("nsfs".into(), path.display().to_string()),
        NsEntry::Fd { pid, fd } => (out.via, out.pid, out.fd) = ("fd".into(), *pid, *fd),
    }
    out
}

pub(super) fn loop_status(l: &LoopInfo) -> pb::LoopStatus {
    pb::LoopStatus {
        backing_file: l.backing_file.to_string(),
        backing_deleted: l.backing_deleted,
        offset: l.offset,
        sizelimit: l.sizelimit,
        autoclear: l.autoclear,
        read_only: l.read_only,
        backing_dev: devnum(l.backing_dev),
        backing_inode: l.backing_inode.unwrap_or(0),
        backing_rdev: devnum(l.backing_rdev),
        status_blocked: l.status_blocked.clone().unwrap_or_default(),
    }
}

pub(super) fn dm_status(d: &DmInfo) -> pb::DmStatus {
    pb::DmStatus { name: d.name.clone(), uuid: d.uuid.clone(), suspended: d.suspended }
}

pub(super) fn multipath(m: &MultipathView) -> pb::Multipath {
    pb::Multipath {
        name: m.name.clone(),
        uuid: m.uuid.clone(),
        wwid: m.wwid.clone(),
        open_count: m.open_count.map_or(-1, i64::from),
        suspended: m.suspended,
        queue_if_no_path: match m.queue_if_no_path {
            Some(true) => "on".into(),
            Some(false) => "off".into(),
            None => String::new(),
        },
        paths: m
            .paths
            .iter()
            .map(|p| pb::MultipathPath {
                device: p.device.as_ref().map(|d| d.to_string()).unwrap_or_default(),
                devnum: p.devnum.to_string(),
                state: p.state.to_owned(),
                fail_count: p.fail_count,
                scsi_state: p.scsi_state.clone().unwrap_or_default(),
            })
            .collect(),
        active_paths: m.active_paths as u32,
        io_would_hang: m.io_would_hang,
        partitions: m.partitions.iter().map(|p| p.to_string()).collect(),
    }
}

pub(super) fn scsi(s: &ScsiView) -> pb::ScsiDisk {
    let (transport, transport_name) = match &s.disk.transport {
        Transport::Iscsi { session } => ("iscsi", session.clone()),
        Transport::Fc { rport } => ("fc", rport.clone()),
        Transport::Other => ("local", String::new()),
    };
    pb::ScsiDisk {
        address: s.disk.address.to_string(),
        state: serde_json::to_value(s.disk.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        vendor: s.disk.vendor.clone(),
        model: s.disk.model.clone(),
        wwid: s.disk.wwid.clone().unwrap_or_default(),
        ioerr_cnt: s.disk.ioerr_cnt,
        iorequest_cnt: s.disk.iorequest_cnt,
        transport: transport.into(),
        transport_name,
        transport_state: s.transport_state.clone().unwrap_or_default(),
        path_of: s.path_of.as_ref().map(|p| p.to_string()).unwrap_or_default(),
        lun_gone: s.lun_gone.clone().unwrap_or_default(),
        outage_scope: s.outage.as_ref().map(|o| o.scope.as_str().to_owned()).unwrap_or_default(),
        outage_key: s.outage.as_ref().map(|o| o.key.clone()).unwrap_or_default(),
        outage_members: s.outage.as_ref().map(|o| o.members.clone()).unwrap_or_default(),
    }
}

pub(super) fn nbd(n: &NbdDevice) -> pb::NbdConnection {
    pb::NbdConnection {
        pid: n.pid.unwrap_or(0),
        server_alive: n.server_alive,
        server_comm: escaped(&n.server_comm),
        server_cmdline: escaped(&n.server_cmdline),
        backend: n.backend.clone().unwrap_or_default(),
    }
}
