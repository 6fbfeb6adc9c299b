//! The fuzz targets: one function per kind of hostile input the agent reads, each taking raw
//! bytes and feeding them to the agent's own parser. The binaries in `src/bin/` hand them to
//! AFL++ (`scripts/fuzz.sh TARGET SECONDS`); the tests below replay every kept input (the seed
//! corpus and every crash found, `fuzz/corpus/TARGET/` and `fuzz/regressions/TARGET/`) on
//! every `cargo test`, so a fixed crash stays fixed. A target passes an input when the parser
//! returns, whatever it returns: a panic (or an abort, or a hang AFL++ times out) is the finding.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use blockjanitor::discover::{cgroup, kmsg, kubelet, maps, mountinfo, multipath, processes, swaps};
use prost::Message;

/// A fuzz target: raw bytes in, the parser's answer ignored (only a panic or a hang counts).
pub type Target = fn(&[u8]);

/// Every target, by the name its binary, corpus and regressions directories carry.
pub const TARGETS: &[(&str, Target)] = &[
    ("mountinfo", mountinfo_text),
    ("dm", dm_lines),
    ("proc", proc_files),
    ("kubelet", kubelet_input),
    ("kmsg", kmsg_records),
    ("config", config_toml),
    ("grpc", grpc_requests),
    ("sysfs", sysfs_attributes),
    ("events", kernel_events),
    ("ceph_addr", ceph_identifiers),
];

/// The target called `name` (a binary's own name: a typo is a bug in this crate).
pub fn target(name: &str) -> Target {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f).expect("a target of TARGETS")
}

fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// `/proc/PID/mountinfo` as the kernel prints it, any bytes at all (names need not be UTF-8).
pub fn mountinfo_text(data: &[u8]) {
    let _ = mountinfo::parse(data);
    for (i, line) in data.split(|b| *b == b'\n').enumerate() {
        let _ = mountinfo::parse_line(line, i + 1);
    }
    let _ = mountinfo::unescape(data);
}

/// A dm-multipath table or status line, as `DM_TABLE_STATUS` returns them; a dm uuid and name
/// (the first two words), as a stack layer is told apart by them; and a reply from multipathd's
/// control socket (a native length, then the text).
pub fn dm_lines(data: &[u8]) {
    let t = text(data);
    let _ = multipath::parse_table(&t);
    let _ = multipath::parse_status(&t);
    let mut words = t.split_whitespace();
    let (uuid, name) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let _ = blockjanitor::graph::stack::classify(uuid, name);
    let _ = blockjanitor::graph::stack::partition(uuid);
    let _ = blockjanitor::act::multipathd::read_reply(&mut &data[..]);
}

/// `/proc/PID/stat`, `maps`, `cgroup` and `/proc/swaps`.
pub fn proc_files(data: &[u8]) {
    let _ = processes::stat_comm(data);
    let _ = maps::file_mappings(data).count();
    let _ = swaps::parse(data);
    let t = text(data);
    let _ = cgroup::identify(&t);
    let _ = processes::kthread_serves(&t, "rbd3", "250:0");
    let _ = processes::fs_kthread_serves(&t, "rbd3", "250:0");
}

/// kubelet's `vol_data.json` and its volume directory names.
pub fn kubelet_input(data: &[u8]) {
    let t = text(data);
    let _ = kubelet::parse_vol_data(&t);
    let _ = kubelet::parse_rbd_dir_name(&t);
}

/// What an operator pastes into the console's who-watches from Ceph (addresses, vectors, ranges,
/// client ids, `rbd status` and `ceph osd blocklist ls` lines), then matched against an agent's
/// report; and an agent's report itself.
pub fn ceph_identifiers(data: &[u8]) {
    use blockjanitor_console::ceph_addr;
    let t = text(data);
    if let Ok(qs) = ceph_addr::parse_query(&t) {
        for q in qs {
            let _ = q.matches("10.254.0.1:0/1532017994", "client4122");
            let _ = q.matches(&t, &t);
            let _ = (q.ip(), q.client_text());
        }
    }
    let _ = ceph_addr::parse_addr(&t);
    let _ = ceph_addr::parse_client(&t);
    let _ = ceph_addr::readable(&t, &t);
    // What Where takes: image specs, WWIDs, IQNs, NQNs.
    use blockjanitor_console::ident;
    if let Ok(spec) = ident::parse_image(&t) {
        let _ = spec.key();
    }
    let _ = ident::parse_wwid(&t);
    let _ = ident::parse_iqn(&t);
    let _ = ident::parse_nqn(&t);
    let _ = ident::parse_bare(&t);
}

/// Kernel log records (`/dev/kmsg`).
pub fn kmsg_records(data: &[u8]) {
    let t = text(data);
    for record in t.split('\n') {
        let _ = kmsg::KernelRecord::parse(record);
    }
    let _ = kmsg::RbdLog::from_records(t.split('\n'));
}

/// What the kernel sends the daemon: fanotify mount-event records, uevent messages, and a
/// device's `/sys/block/X/stat` (judged for unresponsiveness).
pub fn kernel_events(data: &[u8]) {
    let _ = blockjanitor::discover::mount_events::parse(data);
    let _ = blockjanitor::daemon::triggers::block_uevent_device(data);
    let _ = blockjanitor::discover::iostat::parse(&text(data));
}

/// The agent's TOML config.
pub fn config_toml(data: &[u8]) {
    if let Ok(c) = blockjanitor::config::Config::parse(&text(data), Path::new("fuzz.toml")) {
        let _ = c.validate();
    }
}

/// gRPC request bodies as a client sends them, and the device arguments they carry.
pub fn grpc_requests(data: &[u8]) {
    use blockjanitor_proto::v1 as pb;
    let check = |arg: &str| {
        let _ = blockjanitor::daemon::state::check_device_arg(arg);
    };
    if let Ok(r) = pb::PlanRequest::decode(data) {
        r.devices.iter().for_each(|d| check(d));
        let _ = blockjanitor::server::convert::operation(r.operation);
    }
    if let Ok(r) = pb::ApplyRequest::decode(data) {
        r.devices.iter().chain(&r.identities).for_each(|d| check(d));
        let _ = blockjanitor::server::convert::operation(r.operation);
    }
    if let Ok(r) = pb::GetDeviceRequest::decode(data) {
        check(&r.device);
    }
    if let Ok(r) = pb::ListHoldersRequest::decode(data) {
        check(&r.device);
    }
    let _ = pb::ListDevicesRequest::decode(data);
    let _ = pb::WatchEventsRequest::decode(data);
}

/// Where the sysfs target writes: a copy of real kernel trees (the iSCSI hosts, a krbd mapping,
/// NVMe/TCP controllers dumped from the guest), made once per process.
fn sysfs_root() -> &'static Mutex<(tempfile::TempDir, PathBuf)> {
    static ROOT: OnceLock<Mutex<(tempfile::TempDir, PathBuf)>> = OnceLock::new();
    ROOT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        for tree in ["iscsi", "incident1", "nvme-tcp"] {
            copy_tree(&fixtures.join(tree), &dir.path().join(tree));
        }
        let root = dir.path().to_owned();
        Mutex::new((dir, root))
    })
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("fixture tree").flatten() {
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        match entry.file_type() {
            Ok(t) if t.is_symlink() => {
                let _ = std::os::unix::fs::symlink(std::fs::read_link(&src).expect("link"), &dst);
            }
            Ok(t) if t.is_dir() => copy_tree(&src, &dst),
            _ => {
                std::fs::copy(&src, &dst).expect("copy");
            }
        }
    }
}

/// The sysfs attributes the scanners read, one chosen by the first byte, with the rest as its
/// contents: krbd (`/sys/bus/rbd/devices/N/*`), SCSI, iSCSI session and connection, and NVMe-oF
/// controller and subsystem attributes; then the scanners that read them run over the tree. The attribute is restored afterwards.
pub fn sysfs_attributes(data: &[u8]) {
    const ATTRS: &[&str] = &[
        "incident1/sys/devices/rbd/4/pool",
        "incident1/sys/devices/rbd/4/name",
        "incident1/sys/devices/rbd/4/client_id",
        "incident1/sys/devices/rbd/4/client_addr",
        "incident1/sys/devices/rbd/4/major",
        "incident1/sys/devices/rbd/4/minor",
        "incident1/sys/devices/rbd/4/size",
        "incident1/sys/devices/rbd/4/snap",
        "incident1/sys/devices/rbd/4/image_id",
        "incident1/sys/devices/rbd/4/block/rbd4/dev",
        "incident1/sys/devices/rbd/4/block/rbd4/size",
        "iscsi/sys/devices/platform/host5/session3/iscsi_session/session3/targetname",
        "iscsi/sys/devices/platform/host5/session3/iscsi_session/session3/state",
        "iscsi/sys/devices/platform/host5/session3/connection3:0/iscsi_connection/connection3:0/persistent_address",
        "iscsi/sys/devices/platform/host4/session2/target4:0:0/4:0:0:1/wwid",
        "iscsi/sys/devices/platform/host4/session2/target4:0:0/4:0:0:1/state",
        "iscsi/sys/devices/platform/host5/session3/iscsi_session/session3/recovery_tmo",
        "iscsi/sys/devices/platform/host5/session3/iscsi_session/session3/tpgt",
        "iscsi/sys/devices/platform/host5/session3/iscsi_session/session3/ifacename",
        "iscsi/sys/devices/platform/host5/session3/connection3:0/iscsi_connection/connection3:0/persistent_port",
        "iscsi/sys/devices/platform/host5/session3/connection3:0/iscsi_connection/connection3:0/state",
        "nvme-tcp/sys/devices/virtual/nvme-fabrics/ctl/nvme0/address",
        "nvme-tcp/sys/devices/virtual/nvme-fabrics/ctl/nvme0/state",
        "nvme-tcp/sys/devices/virtual/nvme-fabrics/ctl/nvme0/ctrl_loss_tmo",
        "nvme-tcp/sys/devices/virtual/nvme-fabrics/ctl/nvme0/reconnect_delay",
        "nvme-tcp/sys/devices/virtual/nvme-fabrics/ctl/nvme0/cntlid",
        "nvme-tcp/sys/devices/virtual/nvme-fabrics/ctl/nvme0/subsysnqn",
        "nvme-tcp/sys/devices/virtual/nvme-fabrics/ctl/nvme0/transport",
        "nvme-tcp/sys/devices/virtual/nvme-subsystem/nvme-subsys0/subsysnqn",
        "nvme-tcp/sys/devices/virtual/nvme-subsystem/nvme-subsys0/iopolicy",
    ];
    let Some((&pick, value)) = data.split_first() else { return };
    let guard = sysfs_root().lock().unwrap_or_else(|p| p.into_inner());
    let root = &guard.1;
    let attr = root.join(ATTRS[usize::from(pick) % ATTRS.len()]);
    let Ok(original) = std::fs::read(&attr) else { return };
    if std::fs::write(&attr, value).is_err() {
        return;
    }
    for tree in ["iscsi", "incident1", "nvme-tcp"] {
        let host = blockjanitor::host::HostRoot::new(root.join(tree));
        let _ = blockjanitor::discover::rbd::scan(&host);
        let _ = blockjanitor::discover::scsi::scan(&host);
        let _ = blockjanitor::discover::nvme::scan(&host);
        if let Ok(devices) = blockjanitor::discover::blockdev::scan(&host) {
            let _ = blockjanitor::discover::nbd::scan(&host, &devices);
        }
    }
    let _ = std::fs::write(&attr, original);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kept input of every target: the seed corpus and the crashes found (fixed since).
    #[test]
    fn every_kept_input_is_parsed_without_a_panic() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut replayed = 0;
        for (name, target) in TARGETS {
            let mut inputs = 0;
            for kind in ["corpus", "regressions"] {
                let Ok(entries) = std::fs::read_dir(dir.join(kind).join(name)) else { continue };
                for e in entries.flatten() {
                    let data = std::fs::read(e.path()).expect("read input");
                    target(&data);
                    inputs += 1;
                }
            }
            assert!(inputs > 0, "target {name} has no seed corpus in fuzz/corpus/{name}");
            replayed += inputs;
        }
        eprintln!("replayed {replayed} inputs");
    }
}
