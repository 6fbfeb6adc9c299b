//! The engine's answers as the wire carries them (blockjanitor-proto's `v1` messages): a device
//! of a view with its holders and details, the `ListDevices` and `ListHolders` answers, a plan
//! and its step results, a request's outcome ([`outcome`]), pin risks ([`pins`]) and orphaned
//! pod volume directories ([`pod_volumes`]). Built once, here, for every front: the gRPC service
//! answers with them and the one-shot commands print them (JSON and YAML, and `scan`'s and
//! `holders`' tables, through blockjanitor-rpc's `view`, as agentctl does), so both give the
//! same document for the same question.

use std::time::{SystemTime, UNIX_EPOCH};

use blockjanitor_proto::v1 as pb;

use crate::act::StepReport;
use crate::engine::outcome::incomplete_line;
use crate::engine::view::{DeviceView, View};
use crate::graph::Holder;
use crate::judge::Verdict;
use crate::model::{DeviceKind, HolderKind};
use crate::plan::{Plan, Step};

use detail::escaped;

pub mod detail;
pub mod outcome;
pub mod pins;
pub mod pod_volumes;

/// The engine's operation for a request's `operation` field (unset: a cleanup); `None` for a
/// value the schema does not have.
pub fn operation(op: i32) -> Option<crate::engine::Operation> {
    use crate::engine::Operation;
    match pb::Operation::try_from(op) {
        Ok(pb::Operation::Unspecified | pb::Operation::Clean) => Some(Operation::Clean),
        Ok(pb::Operation::Release) => Some(Operation::Release),
        Err(_) => None,
    }
}

pub fn secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

pub fn kind(k: DeviceKind) -> pb::DeviceKind {
    match k {
        DeviceKind::Disk => pb::DeviceKind::Disk,
        DeviceKind::Partition => pb::DeviceKind::Partition,
        DeviceKind::Loop => pb::DeviceKind::Loop,
        DeviceKind::Dm => pb::DeviceKind::Dm,
        DeviceKind::Md => pb::DeviceKind::Md,
        DeviceKind::Rbd => pb::DeviceKind::Rbd,
        DeviceKind::Nbd => pb::DeviceKind::Nbd,
        DeviceKind::Zram => pb::DeviceKind::Zram,
        DeviceKind::Other => pb::DeviceKind::Other,
        DeviceKind::NvmeNamespace => pb::DeviceKind::NvmeNamespace,
    }
}

pub fn verdict(v: Verdict) -> pb::Verdict {
    match v {
        Verdict::InUse => pb::Verdict::InUse,
        Verdict::Unused => pb::Verdict::Unused,
        Verdict::Suspect => pb::Verdict::Suspect,
        Verdict::Stale => pb::Verdict::Stale,
        Verdict::Protected => pb::Verdict::Protected,
        Verdict::Unknown => pb::Verdict::Unknown,
        Verdict::Outage => pb::Verdict::Outage,
    }
}

fn holder_kind(k: HolderKind) -> pb::HolderKind {
    match k {
        HolderKind::Mount => pb::HolderKind::Mount,
        HolderKind::OpenDevice => pb::HolderKind::OpenDevice,
        HolderKind::OpenFile => pb::HolderKind::OpenFile,
        HolderKind::Cwd => pb::HolderKind::Cwd,
        HolderKind::Root => pb::HolderKind::Root,
        HolderKind::Mmap => pb::HolderKind::Mmap,
        HolderKind::Swap => pb::HolderKind::Swap,
        HolderKind::StackedDevice => pb::HolderKind::StackedDevice,
        HolderKind::LoopBacking => pb::HolderKind::LoopBacking,
        HolderKind::Filesystem => pb::HolderKind::Filesystem,
    }
}

pub fn holder(h: &Holder) -> pb::Holder {
    let mut out = pb::Holder {
        kind: holder_kind(h.kind) as i32,
        pids: h.pids.clone(),
        pid_count: h.pid_count as u32,
        comm: escaped(&h.comm),
        cmdline: escaped(&h.cmdline),
        mount_namespace: h.mount_namespace.map_or(0, |n| n.0),
        in_host_namespace: h.in_host_namespace.unwrap_or(false),
        mount_point: escaped(&h.mount_point),
        container_id: h.container_id.clone().unwrap_or_default(),
        pod_uid: h.pod_uid.clone().unwrap_or_default(),
        path: escaped(&h.path),
        device: h.device.as_ref().map(|d| d.to_string()).unwrap_or_default(),
        fstype: escaped(&h.fstype),
        fds: h.fds.clone(),
        description: h.describe(),
        ..Default::default()
    };
    detail::holder_details(h, &mut out);
    out
}

pub fn device(v: &DeviceView) -> pb::Device {
    device_with(v, v.entry.holders.iter().map(holder).collect(), v.judgement.reasons.clone())
}

/// [`device`] for an event that cannot fit the size cap (the gRPC service's `event_cap`): its holders
/// one per kind with their counts, and its first `reasons`, made before anything is converted
/// (a device held 3,000 times, as a node's image disk is, cost ~15 ms to convert in full for
/// each watcher, ahead of every event behind it on the stream).
pub fn device_by_kind(v: &DeviceView, reasons: usize) -> pb::Device {
    let kinds = crate::graph::by_kind::count_by_kind(v.entry.holders.iter().map(|h| (h.kind, h.pid_count)))
        .into_iter()
        .map(|(kind, count)| pb::Holder {
            kind: holder_kind(kind) as i32,
            pid_count: count as u32,
            ..Default::default()
        })
        .collect();
    device_with(v, kinds, v.judgement.reasons.iter().take(reasons).cloned().collect())
}

/// Holders already on the wire as one entry per kind, each with the number of processes (at
/// least one) it stands for: what an event over its size cap carries.
pub fn holders_by_kind(holders: &[pb::Holder]) -> Vec<pb::Holder> {
    crate::graph::by_kind::count_by_kind(holders.iter().map(|h| (h.kind, h.pid_count as usize)))
        .into_iter()
        .map(|(kind, count)| pb::Holder { kind, pid_count: count as u32, ..Default::default() })
        .collect()
}

fn device_with(v: &DeviceView, holders: Vec<pb::Holder>, reasons: Vec<String>) -> pb::Device {
    let d = &v.entry.device;
    pb::Device {
        name: d.name.to_string(),
        major: d.devnum.major,
        minor: d.devnum.minor,
        kind: crate::graph::stack::layer_of(d).map_or_else(|| kind(d.kind), |l| layer_kind(l.kind())) as i32,
        size_bytes: d.size_bytes,
        read_only: d.read_only,
        parent: d.parent.as_ref().map(|p| p.to_string()).unwrap_or_default(),
        stacked_on_top: d.holders.iter().map(|h| h.to_string()).collect(),
        stacked_below: d.slaves.iter().map(|h| h.to_string()).collect(),
        loop_backing_file: d.loop_info.as_ref().map(|l| l.backing_file.to_string()).unwrap_or_default(),
        dm_name: d.dm.as_ref().map(|m| m.name.clone()).unwrap_or_default(),
        dm_uuid: d.dm.as_ref().map(|m| m.uuid.clone()).unwrap_or_default(),
        verdict: verdict(v.judgement.verdict) as i32,
        reasons,
        holders,
        kernel_threads: v
            .entry
            .kernel_threads
            .iter()
            .map(|k| format!("{} (pid {})", k.comm, k.pid))
            .collect(),
        pv_names: v.entry.kubernetes.as_ref().map(|k| k.pv_names.clone()).unwrap_or_default(),
        pod_uids: v.entry.kubernetes.as_ref().map(|k| k.pod_uids.clone()).unwrap_or_default(),
        kubelet_paths: v.entry.kubernetes.as_ref().map(|k| k.paths.clone()).unwrap_or_default(),
        identity: v.identity.token(),
        rbd: v.entry.rbd.as_ref().map(|r| pb::RbdMapping {
            id: r.id,
            pool: r.pool.clone(),
            pool_namespace: r.pool_ns.clone(),
            image: r.image.clone(),
            image_id: r.image_id.clone(),
            snap: r.snap.clone(),
            client_id: r.watcher_client.clone(),
            client_addr: r.client_addr.clone(),
            cluster_fsid: r.cluster_fsid.clone(),
            dev_paths: r.dev_paths.clone(),
            fenced: r.fenced.clone().unwrap_or_default(),
        }),
        wwid: v.entry.wwid(),
        nbd_backend: v.entry.nbd.as_ref().and_then(|n| n.backend.clone()).unwrap_or_default(),
        unresponsive: v.unresponsive.is_some(),
        unresponsive_seconds: v.unresponsive.as_ref().map_or(0.0, |s| s.stalled_for.as_secs_f64()),
        last_seen_unix_seconds: v.last_seen.map_or(0.0, secs),
        last_seen_scan: v.last_seen_scan,
        stack: crate::graph::stack::layer_of(d).as_ref().map(stack_layer),
        nvme: v.entry.nvme.as_ref().map(nvme),
        iscsi_session: v.entry.scsi.as_ref().and_then(|s| s.session.as_ref()).map(iscsi_session),
        outage: v
            .entry
            .scsi
            .as_ref()
            .and_then(|s| s.outage.as_ref())
            .map(|o| format!("{} {}", o.scope.as_str(), o.key))
            .unwrap_or_default(),
        r#loop: d.loop_info.as_ref().map(detail::loop_status),
        dm: d.dm.as_ref().map(detail::dm_status),
        multipath: v.entry.multipath.as_ref().map(detail::multipath),
        scsi: v.entry.scsi.as_ref().map(detail::scsi),
        nbd: v.entry.nbd.as_ref().map(detail::nbd),
        volume_handles: v.entry.kubernetes.as_ref().map(|k| k.volume_handles.clone()).unwrap_or_default(),
        csi_drivers: v.entry.kubernetes.as_ref().map(|k| k.drivers.clone()).unwrap_or_default(),
        diskseq: d.diskseq.unwrap_or(0),
        in_use: !v.entry.holders.is_empty(),
    }
}

fn iscsi_session(s: &crate::discover::scsi::IscsiSession) -> pb::IscsiSessionInfo {
    let state = serde_json::to_value(s.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_ascii_uppercase))
        .unwrap_or_default();
    pb::IscsiSessionInfo {
        sid: s.detail.sid,
        target: s.targetname.clone(),
        portal: s.detail.portal().unwrap_or_default(),
        state,
        iface: s.detail.ifacename.clone().unwrap_or_default(),
        tpgt: s.detail.tpgt.unwrap_or_default(),
        recovery_tmo: s.detail.recovery_tmo.unwrap_or_default(),
        initiator: s.detail.initiatorname.clone().unwrap_or_default(),
    }
}

fn nvme(n: &crate::graph::nvme::NvmeView) -> pb::NvmeNamespace {
    use crate::discover::nvme::Timeout;
    let tmo = |t: Option<Timeout>| match t {
        None => String::new(),
        Some(Timeout::Off) => "off".into(),
        Some(Timeout::Seconds(s)) => s.to_string(),
    };
    pb::NvmeNamespace {
        role: n.role.as_str().to_owned(),
        subsystem: n.subsystem.clone().unwrap_or_default(),
        subsysnqn: n.subsysnqn.clone(),
        head: n.head.as_ref().map(|h| h.to_string()).unwrap_or_default(),
        controllers: n
            .controllers
            .iter()
            .map(|c| pb::NvmeController {
                name: c.name.clone(),
                transport: c.transport.clone(),
                subsysnqn: c.subsysnqn.clone(),
                address: c.address.target(),
                state: c.state.as_str().to_owned(),
                ctrl_loss_tmo: tmo(c.ctrl_loss_tmo),
                reconnect_delay: tmo(c.reconnect_delay),
                cntlid: c.cntlid.map_or(-1, i32::from),
                hostnqn: c.hostnqn.clone().unwrap_or_default(),
                fabrics: c.fabrics,
                address_raw: c.address.raw.clone(),
                src_addr: c.address.src_addr.clone().unwrap_or_default(),
                host_traddr: c.address.host_traddr.clone().unwrap_or_default(),
                host_iface: c.address.host_iface.clone().unwrap_or_default(),
                namespaces: c.namespaces.iter().map(|n| n.to_string()).collect(),
            })
            .collect(),
        live_controllers: n.live as u32,
        outage_target: n.outage.as_ref().map(|o| o.target.clone()).unwrap_or_default(),
        siblings: n.siblings.iter().map(|s| s.to_string()).collect(),
        siblings_held: n.siblings_held.clone(),
    }
}

/// The kind of a stack layer.
pub fn layer_kind(k: crate::graph::stack::LayerKind) -> pb::DeviceKind {
    use crate::graph::stack::LayerKind;
    match k {
        LayerKind::LvmLv => pb::DeviceKind::LvmLv,
        LayerKind::Crypt => pb::DeviceKind::Crypt,
        LayerKind::PartitionMap => pb::DeviceKind::PartitionMap,
    }
}

/// What a dm layer's uuid and name say.
pub fn stack_layer(l: &crate::graph::stack::StackLayer) -> pb::StackLayer {
    use crate::graph::stack::StackLayer;
    let mut out =
        pb::StackLayer { kind: layer_kind(l.kind()) as i32, description: l.describe(), ..Default::default() };
    match l {
        StackLayer::LvmLv { vg, lv, sublayer, vg_uuid, lv_uuid } => {
            out.vg = vg.clone();
            out.lv = lv.clone();
            out.lv_sublayer = sublayer.clone().unwrap_or_default();
            out.vg_uuid = vg_uuid.clone();
            out.lv_uuid = lv_uuid.clone();
        }
        StackLayer::Crypt { format, header_uuid, name } => {
            out.crypt_format = format.clone();
            out.crypt_header_uuid = header_uuid.clone().unwrap_or_default();
            out.crypt_name = name.clone();
        }
        StackLayer::PartitionMap { number, parent_uuid } => {
            out.partition_number = *number;
            out.parent_uuid = parent_uuid.clone();
        }
    }
    out
}

/// What a scan read.
pub fn stats(s: &crate::model::scan_stats::ScanStats) -> pb::ScanStats {
    pb::ScanStats {
        processes: s.processes as u64,
        tasks: s.tasks as u64,
        kernel_threads: s.kernel_threads as u64,
        mount_namespaces: s.mount_namespaces as u64,
        mounts: s.mounts as u64,
        namespaces_via_statmount: s.namespaces_via_statmount as u64,
        mountinfo_bytes: s.mountinfo_bytes as u64,
        duration_ms: s.duration.as_secs_f64() * 1000.0,
    }
}

/// A view's blind spots, one line each.
pub fn blind_spots(v: &View) -> Vec<String> {
    v.blind_spots.iter().map(|b| b.to_string()).collect()
}

/// Every device of a view (`devices`, already converted and filtered), with the view's context:
/// what `ListDevices` answers and `scan -o json` prints.
pub fn devices_response(v: &View, devices: Vec<pb::Device>) -> pb::ListDevicesResponse {
    pb::ListDevicesResponse {
        devices,
        scan_unix_seconds: v.scanned_at.map_or(0.0, secs),
        scan: v.scan_number,
        warnings: v.warnings.clone(),
        blind_spots: blind_spots(v),
        incomplete_view: incomplete_line(&v.blind_spots.iter().collect::<Vec<_>>()).unwrap_or_default(),
        kubernetes: v.api_state.to_string(),
        host_mount_namespace: v.host_ns.0,
        stats: Some(stats(&v.stats)),
        orphaned_volume_dirs: pod_volumes::orphaned_volume_dirs(&v.pod_volumes),
        orphaned_volume_dirs_unknown: pod_volumes::unknown(&v.pod_volumes),
        pin_risks: pins::pin_risks(&v.pin_risks),
        pin_risks_checked: v.pin_risks.checked,
        pin_risks_unknown: v.pin_risks.unknown.clone().unwrap_or_default(),
    }
}

/// One device of a view (`device`, already converted) with the view's context for it: what
/// `ListHolders` answers and `holders -o json` prints.
pub fn holders_response(v: &View, d: &DeviceView, device: pb::Device) -> pb::ListHoldersResponse {
    let reaching = crate::model::blindspot::reaching(&v.blind_spots, &d.entry.device);
    pb::ListHoldersResponse {
        device: Some(device),
        warnings: v.warnings.clone(),
        blind_spots: blind_spots(v),
        incomplete_view: incomplete_line(&reaching).unwrap_or_default(),
        stats: Some(stats(&v.stats)),
    }
}

pub fn step(s: &Step) -> pb::Step {
    pb::Step { action: s.action().to_owned(), device: s.device.to_string(), description: s.describe() }
}

/// A plan as the wire carries it, with what its request came to (`class`).
pub fn plan((p, class): &(Plan, crate::engine::outcome::OutcomeClass)) -> pb::DevicePlan {
    pb::DevicePlan {
        device: p.device.to_string(),
        steps: p.steps.iter().map(step).collect(),
        left_alone: p.left_alone.iter().map(|l| l.reason.clone()).collect(),
        refusal: p.refusal.clone().unwrap_or_default(),
        identity: p.identity.token(),
        outcome: class.as_str().to_owned(),
        operation: p.operation.to_owned(),
        notes: p.notes.clone(),
        incomplete_view: String::new(),
    }
}

pub fn report(r: &StepReport) -> pb::StepResult {
    let (result, detail) = r.word();
    pb::StepResult { step: Some(step(&r.step)), result: result.to_owned(), detail }
}
