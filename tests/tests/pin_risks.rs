//! Pin risks on the real kernel (issue 35 item 4: incident 5 before it happens), and Events where
//! people look (item 6).
//!
//! The scene stands in for a node: a directory made a shared mount (as systemd makes `/`) stands
//! for the host root, with a kubelet-like directory below it where an ext4 loop device is mounted
//! (a staged volume). A pod's namespace is made the way runc makes one: a new mount namespace,
//! `/` made `rslave`, a tmpfs as the container's root, the host root (the stand-in) `rbind`ed at
//! `/host` and made `rprivate` (propagation None) or `rslave` (HostToContainer), binaries bound
//! in, `pivot_root`, a proc of its own and the old root detached. The loop device's ext4 is mounted when the
//! namespace is made, so the namespace copies it.
//!
//! - one-shot `scan`: the rprivate namespace is a pin risk with its copy of the volume (device,
//!   host path, path in the namespace), the rslave one is not, an `unshare -m` shell (its own `/`
//!   a private copy of the host root) is, and `--mount-reader mountinfo` (whole tables) says
//!   the same as the default (`statmount` on the scan's listing);
//! - the daemon with the stand-in API server: the namespace's process in a pod's cgroup names
//!   pod and container (from the API), the fix names the volumeMount; a `MountPinRisk` Event on the
//!   pod and the `MountPinRisk` Node condition; `blockjanitor_pin_risks{pod}` in /metrics;
//!   `VolumeHeldElsewhere` on the Node, the PV, the PVC and the pod using the volume, and
//!   `StaleBlockDevice` on another volume's PV and PVC (core/v1 Events, read back through
//!   k8s-openapi); the console's `ListPinRisks` (`agentctl fleet pin-risks`, schema-checked)
//!   follows, and when the namespace goes, so does the risk (condition False, list empty);
//! - the daemon between full scans: a new pod namespace's risk shows and goes with re-reads, and
//!   a copy the host's unmount left behind is no risk, and one again when the host mounts the
//!   volume again (only the host's mounts changed).

#[path = "support/schema.rs"]
#[allow(dead_code)]
mod schema;

use std::path::{Path, PathBuf};
use std::time::Duration;

use blockjanitor_tests::{
    agent, agent_json, real_kernel_test, sh, text, utf8, wait_until, HostMount, LoopDev, NsProcess, Scratch,
};
use serde_json::Value;

/// The volume's path below the kubelet-like directory (a pre-1.24 CSI staging mount).
const STAGED: &str = "plugins/kubernetes.io/csi/pv/pvc-0a5e6f1c-3b2d-4e8f-9a71-5c2d8e4f6b10/globalmount";

/// The node stand-in: `host` (a shared bind mount, as systemd's `/`), its kubelet directory and
/// the volume mounted there.
struct Node {
    host: PathBuf,
    kubelet: PathBuf,
    volume: PathBuf,
    lo: LoopDev,
    // Dropped in this order: the volume, then the host stand-in.
    volume_mount: HostMount,
    _host_mount: HostMount,
}

impl Node {
    fn new(s: &Scratch) -> Self {
        let host = s.mkdir("host");
        let host_mount = HostMount::new(utf8(&host), &host, &["--bind"]);
        sh("mount", &["--make-rshared", utf8(&host)]);
        let kubelet = host.join("var/lib/kubelet");
        let volume = kubelet.join(STAGED);
        std::fs::create_dir_all(&volume).expect("mkdir volume");
        let vol_data = serde_json::json!({
            "driverName": "rbd.csi.ceph.com", "specVolID": "pvc-0a5e6f1c-3b2d-4e8f-9a71-5c2d8e4f6b10",
            "volumeHandle": "0001-0009-rook-ceph-0000000000000002-csi-vol-5f3c", "nodeName": "node-a",
            "volumeLifecycleMode": "Persistent",
        });
        std::fs::write(volume.parent().expect("pv dir").join("vol_data.json"), vol_data.to_string())
            .expect("vol_data.json");
        let lo = LoopDev::attach(&s.ext4_image("volume.img", 32));
        let volume_mount = HostMount::new(&lo.dev, &volume, &[]);
        Node { host, kubelet, volume, lo, volume_mount, _host_mount: host_mount }
    }
}

impl Node {
    /// Where a pod that mounts the host root at `/host` sees the volume.
    fn copy_at(&self) -> PathBuf {
        Path::new("/host").join(self.volume.strip_prefix(&self.host).expect("below the host stand-in"))
    }
}

/// A pod's mount namespace as runc makes one, the host root (`node.host`) at `/host` with
/// `propagation` (`rprivate`: None; `rslave`: HostToContainer); its process sleeps.
fn pod_namespace(s: &Scratch, node: &Node, name: &str, propagation: &str) -> NsProcess {
    let root = s.mkdir(&format!("rootfs-{name}"));
    let (r, host) = (utf8(&root), utf8(&node.host));
    let script = format!(
        "set -e
mount --make-rslave /
mount -t tmpfs rootfs {r}
mkdir {r}/host {r}/old {r}/usr {r}/proc
mount --rbind {host} {r}/host
mount --make-{propagation} {r}/host
mount --rbind /usr {r}/usr
for d in bin sbin lib lib32 lib64; do
  if [ -L /$d ]; then ln -s \"$(readlink /$d)\" {r}/$d
  elif [ -d /$d ]; then mkdir {r}/$d; mount --rbind /$d {r}/$d; fi
done
cd {r}
pivot_root . old
cd /
mount -t proc proc /proc
umount -l /old
exec sleep 1000"
    );
    let p = NsProcess::spawn_with("unchanged", &script);
    let copy = node.copy_at();
    assert!(
        wait_until(Duration::from_secs(10), || p.has_mount(&copy)),
        "the pod namespace {name} has no copy of the volume at {}",
        copy.display()
    );
    p
}

/// The pin risk of namespace `ns` in a `devices` document (or a fleet answer's risks).
fn risk_of(risks: &Value, ns: u64) -> Option<Value> {
    risks.as_array()?.iter().find(|r| r["mount_namespace"].as_u64() == Some(ns)).cloned()
}

#[test]
fn root_a_runtime_namespace_with_a_private_host_rbind_is_a_pin_risk_and_an_rslave_one_is_not() {
    let Some((_serial, s)) = real_kernel_test(&["losetup", "mkfs.ext4", "unshare", "mount", "pivot_root"])
    else {
        return;
    };
    let node = Node::new(&s);
    let private = pod_namespace(&s, &node, "private", "rprivate");
    let slave = pod_namespace(&s, &node, "slave", "rslave");
    // `unshare -m` with util-linux's default propagation: its own `/` is a private copy of the
    // host's root.
    let shell = NsProcess::spawn("exec sleep 1000");
    let kdir = utf8(&node.kubelet).to_owned();
    let mut seen = Vec::new();
    for reader in ["auto", "mountinfo"] {
        let doc = agent_json(&["--kubelet-dir", &kdir, "--mount-reader", reader, "scan", "-o", "json"], 0);
        assert_eq!(doc["pin_risks_checked"], true, "{doc:#}");
        let risks = &doc["pin_risks"];
        let r = risk_of(risks, private.ns_inode())
            .unwrap_or_else(|| panic!("{reader}: the rprivate pod namespace is no pin risk: {risks:#}"));
        assert_eq!(r["unknown"], "", "{r:#}");
        assert_eq!(r["pids"][0].as_u64(), Some(u64::from(private.pid())), "{r:#}");
        let copies = r["copies"].as_array().expect("copies");
        let volume = copies
            .iter()
            .find(|c| c["host_mount_point"] == utf8(&node.volume))
            .unwrap_or_else(|| panic!("{reader}: no copy of the volume: {r:#}"));
        assert_eq!(volume["device"], node.lo.name(), "{r:#}");
        assert_eq!(volume["mount_point"], utf8(&node.copy_at()), "{r:#}");
        assert_eq!(volume["fstype"], "ext4");
        assert_eq!(r["host_root_copy"], "", "the stand-in is not the host's root: {r:#}");
        assert!(r["fix"].as_str().is_some_and(|f| f.contains("--propagation slave")), "{r:#}");
        assert!(
            risk_of(risks, slave.ns_inode()).is_none(),
            "{reader}: the rslave namespace is a pin risk: {risks:#}"
        );
        let sh_risk = risk_of(risks, shell.ns_inode()).expect("the unshared shell is a pin risk");
        assert_eq!(sh_risk["host_root_copy"], "/", "{sh_risk:#}");
        assert!(
            sh_risk["copies"].as_array().expect("copies").iter().any(|c| c["device"] == node.lo.name()),
            "the shell copied the volume mounted when it started: {sh_risk:#}"
        );
        seen.push((r, sh_risk));
    }
    assert_eq!(seen[0], seen[1], "statmount on the scan's listing and whole mountinfo tables agree");
    // The text report shows it too.
    let out = agent(&["--kubelet-dir", &kdir, "scan"]);
    let t = text(&out.stdout);
    assert!(t.contains("PIN RISKS:") && t.contains(&private.ns_inode().to_string()), "{t}");
    drop((private, slave, shell));
}

/// The daemon on `node` with timer scans an hour apart, and `agentctl DOCUMENT -o json` to it.
fn hourly_daemon(s: &Scratch, node: &Node) -> blockjanitor_tests::daemon::Daemon {
    let kdir = utf8(&node.kubelet).to_owned();
    blockjanitor_tests::daemon::Daemon::start(
        s.dir.path(),
        &["--kubelet-dir", &kdir, "--rescan-interval", "3600"],
    )
}

fn ctl(d: &blockjanitor_tests::daemon::Daemon, what: &str) -> Value {
    let out = std::process::Command::new(blockjanitor_tests::console::bin("agentctl"))
        .arg("--socket")
        .arg(&d.socket)
        .args([what, "-o", "json"])
        .output()
        .expect("agentctl");
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// The daemon's first scan is published; the number of its last full scan.
fn first_full_scan(d: &blockjanitor_tests::daemon::Daemon) -> Value {
    assert!(
        wait_until(Duration::from_secs(20), || ctl(d, "scan")["pin_risks_checked"] == true),
        "no first scan"
    );
    let before = ctl(d, "node")["last_full_scan"].clone();
    assert!(before.as_u64().is_some_and(|n| n > 0), "{before}");
    before
}

/// Whether namespace `ns` is listed with a copy of the host mount at `host_point` in the scan.
fn has_copy_of(scan: &Value, ns: u64, host_point: &Path) -> bool {
    risk_of(&scan["pin_risks"], ns).is_some_and(|r| {
        r["copies"].as_array().is_some_and(|c| c.iter().any(|c| c["host_mount_point"] == utf8(host_point)))
    })
}

/// The daemon between its timer scans (one an hour here): a pod namespace made after its first
/// scan is a pin risk as soon as the re-read of the new namespace is published, and is gone from
/// the list once its process exits, without a full scan.
#[test]
fn root_the_daemon_follows_pin_risks_between_full_scans() {
    let Some((_serial, s)) = real_kernel_test(&["losetup", "mkfs.ext4", "unshare", "mount", "pivot_root"])
    else {
        return;
    };
    let node = Node::new(&s);
    let d = hourly_daemon(&s, &node);
    let before = first_full_scan(&d);
    let pod = pod_namespace(&s, &node, "late", "rprivate");
    let ns = pod.ns_inode();
    let mut last = Value::Null;
    let shown = wait_until(Duration::from_secs(20), || {
        last = ctl(&d, "scan");
        risk_of(&last["pin_risks"], ns).is_some_and(|r| r["copies"].as_array().is_some_and(|c| !c.is_empty()))
    });
    assert!(
        shown,
        "a new pod namespace is no pin risk without a full scan: {:#}\n{}",
        last["pin_risks"],
        d.log_text()
    );
    drop(pod);
    let gone = wait_until(Duration::from_secs(20), || {
        last = ctl(&d, "scan");
        risk_of(&last["pin_risks"], ns).is_none()
    });
    assert!(gone, "a namespace that is gone is still listed: {:#}", last["pin_risks"]);
    assert_eq!(ctl(&d, "node")["last_full_scan"], before, "no full scan ran meanwhile: re-reads did it");
}

/// kubelet unmounts a volume a pod's namespace keeps a private copy of, then mounts it again at
/// the same place (the same superblock: the copy kept the filesystem alive). Only the host's
/// mounts change, never the namespace's: the copy is no pin risk while the host's mount is gone
/// (a leak for `release`), and is one again as soon as the host's mount is back, without a full
/// scan (a finding kept from before the mount came back would hide it for up to ten of them).
#[test]
fn root_a_kept_copy_is_a_pin_risk_again_when_the_host_mounts_the_volume_again() {
    let Some((_serial, s)) = real_kernel_test(&["losetup", "mkfs.ext4", "unshare", "mount", "pivot_root"])
    else {
        return;
    };
    let node = Node::new(&s);
    let pod = pod_namespace(&s, &node, "kept", "rprivate");
    let ns = pod.ns_inode();
    let d = hourly_daemon(&s, &node);
    let before = first_full_scan(&d);
    // Whether the copy is listed as `want` within 20 s, and the last scan.
    let follows = |want: bool| {
        let mut last = Value::Null;
        let ok = wait_until(Duration::from_secs(20), || {
            last = ctl(&d, "scan");
            has_copy_of(&last, ns, &node.volume) == want
        });
        (ok, last)
    };
    let (shown, last) = follows(true);
    assert!(shown, "the pod namespace's copy is no pin risk after the first scan: {:#}", last["pin_risks"]);
    node.volume_mount.umount();
    assert!(pod.has_mount(&node.copy_at()), "the namespace keeps its copy of the volume");
    let (dropped, last) = follows(false);
    assert!(dropped, "a copy of a host mount that is gone is still a pin risk: {:#}", last["pin_risks"]);
    sh("mount", &[&node.lo.dev, utf8(&node.volume)]);
    let (again, last) = follows(true);
    assert!(
        again,
        "the host mounted the volume again and the namespace's copy of it is no pin risk: {:#}\n{}",
        last["pin_risks"],
        d.log_text()
    );
    assert_eq!(ctl(&d, "node")["last_full_scan"], before, "no full scan ran meanwhile: re-reads did it");
    drop(pod);
}

/// The daemon, with the stand-in API server and the console: see the module doc.
#[test]
fn root_the_daemon_reports_a_pods_pin_risk_and_a_volumes_verdicts_where_people_look() {
    let Some((_serial, s)) = real_kernel_test(&["losetup", "mkfs.ext4", "unshare", "mount", "pivot_root"])
    else {
        return;
    };
    if !Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists()
        && !Path::new("/sys/fs/cgroup/cgroup.procs").exists()
    {
        eprintln!("SKIPPED: no cgroup v2 hierarchy to put the pod's process in");
        return;
    }
    support::daemon_scenario(&s);
}

#[path = "support/pin_scenario.rs"]
mod support;
