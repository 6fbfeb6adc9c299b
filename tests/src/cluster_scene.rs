//! Issue 36's cluster for the console's acceptance bench (`benches/console_cluster.rs`): the
//! Kubernetes objects of [`blockjanitor_console::scale_objects`] served by the stand-in API
//! server ([`crate::kube_mock`]), stand-in agents ([`crate::standin_fleet`]) whose devices agree
//! with them, and the changes a live cluster makes while it is watched: device events at a churn
//! rate with bursts, and a trickle of pod and VolumeAttachment watch events.
//!
//! What each node's agent reports (node `i`): its disk `sda` and 4 partitions (mounted: root,
//! kubelet and container storage), an rbd mapping for each volume attached to it, 4 loop devices
//! (snaps, mounted) and 2 idle nbd devices. A mapping in use is mounted twice (the CSI global
//! mount and the pod's) and held open by the pod's process, named with its pod and container; 2 %
//! of the volumes are mapped with nothing holding them (stale: the sweep's "attached, not in use"),
//! and 0.1 % are also mapped on the next node, stale there (Multi-Attach: their pods are Pending
//! with a `FailedAttachVolume` event, what Explain is for).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use blockjanitor_console::scale_objects::{self as objects, Shape};
use blockjanitor_proto::v1 as pb;
use serde_json::Value;

use crate::kube_mock::ApiServer;
use crate::kube_objects::{ago, core_event};
use crate::kube_reads::{EVENTS, PODS};
use crate::standin_fleet::{client_addr, NodeState};

pub const NODES: &str = "/api/v1/nodes";
pub const PVS: &str = "/api/v1/persistentvolumes";
pub const PVCS: &str = "/api/v1/persistentvolumeclaims";
pub const VAS: &str = "/apis/storage.k8s.io/v1/volumeattachments";

/// Whether volume `v` is mapped with nothing holding it (2 %).
pub fn stale(v: usize) -> bool {
    v % 50 == 7
}

/// Whether volume `v` is also mapped on the node after its own, stale there (0.1 %).
pub fn multi_attached(v: usize) -> bool {
    v % 1000 == 3
}

/// Node `i`'s rbd client id.
pub fn client_id(i: usize) -> String {
    format!("client.{}", 100_000 + i)
}

/// A `rados listwatchers` line for node `i`'s client, as an operator pastes it.
pub fn watcher_text(i: usize) -> String {
    format!("Watchers:\n\twatcher={} {} cookie=18446462598732840961\n", client_addr(i), client_id(i))
}

fn device(name: String, kind: pb::DeviceKind, verdict: pb::Verdict, size: u64) -> pb::Device {
    pb::Device {
        name,
        kind: kind as i32,
        verdict: verdict as i32,
        size_bytes: size,
        in_use: verdict == pb::Verdict::InUse,
        last_seen_scan: 1,
        ..Default::default()
    }
}

fn host_mount(dev: &str, at: &str, fstype: &str, mount_id: u32) -> pb::Holder {
    pb::Holder {
        kind: pb::HolderKind::Mount as i32,
        mount_namespace: 4_026_531_841,
        in_host_namespace: true,
        mount_point: at.into(),
        fstype: fstype.into(),
        source: format!("/dev/{dev}"),
        mount_id,
        description: format!("mounted at {at} ({fstype}) in the host's mount namespace"),
        ..Default::default()
    }
}

/// The process of pod `p` holding a file open on its volume (a new pid after each restart).
pub fn pod_process(s: &Shape, p: usize, restarts: u32) -> pb::Holder {
    let (ns, name) = s.pod_of(p);
    let pid = 10_000 + (p as u32 % 50_000) * 7 + restarts;
    pb::Holder {
        kind: pb::HolderKind::OpenFile as i32,
        pids: vec![pid],
        pid_count: 1,
        comm: "postgres".into(),
        cmdline: "postgres -D /var/lib/postgresql/data".into(),
        mount_namespace: 4_026_540_000 + p as u64,
        container_id: format!("containerd://{:064x}", p * 31 + restarts as usize),
        pod_uid: objects::pod_uid(p),
        path: "/var/lib/postgresql/data/base/16384/2619".into(),
        fds: vec![23],
        process_state: "S".into(),
        description: format!("open by postgres (pid {pid}) in pod {ns}/{name}, container app"),
        ..Default::default()
    }
}

/// Volume `v`'s mapping on node `i` as `rbd{k}`: in use (mounted, held by its pod's process) or
/// stale (nothing holds it).
fn rbd_device(s: &Shape, i: usize, k: usize, v: usize, in_use: bool) -> pb::Device {
    let name = format!("rbd{k}");
    let verdict = if in_use { pb::Verdict::InUse } else { pb::Verdict::Stale };
    let mut d = device(name.clone(), pb::DeviceKind::Rbd, verdict, 10 << 30);
    d.major = 251;
    d.minor = (k * 16) as u32;
    d.rbd = Some(pb::RbdMapping {
        id: k as u32,
        pool: objects::POOL.into(),
        image: objects::image_name(v),
        image_id: format!("{:012x}", v * 7 + 1),
        snap: "-".into(),
        client_id: client_id(i),
        client_addr: client_addr(i),
        cluster_fsid: "b2e1c3d4-5f60-4a7b-8c9d-0e1f2a3b4c5d".into(),
        dev_paths: vec![format!("/dev/rbd/{}/{}", objects::POOL, objects::image_name(v))],
        ..Default::default()
    });
    let pv = objects::pv_name(v);
    d.pv_names = vec![pv.clone()];
    d.volume_handles = vec![objects::volume_handle(v)];
    d.csi_drivers = vec![objects::DRIVER.into()];
    d.identity = format!("rbd:{}/{}@{}", objects::POOL, objects::image_name(v), client_id(i));
    let global =
        format!("/var/lib/kubelet/plugins/kubernetes.io/csi/{}/{:064x}/globalmount", objects::DRIVER, v);
    if !in_use {
        d.reasons = vec![
            "mapped, and nothing holds it: no mount in any namespace, no open file, no process".into(),
            format!("no pod on this node uses PV {pv}"),
        ];
        return d;
    }
    let Some(p) = s.pod_of_volume(v) else { return d };
    let pod_mount =
        format!("/var/lib/kubelet/pods/{}/volumes/kubernetes.io~csi/{pv}/mount", objects::pod_uid(p));
    d.pod_uids = vec![objects::pod_uid(p)];
    d.kubelet_paths = vec![global.clone(), pod_mount.clone()];
    d.holders = vec![
        host_mount(&name, &global, "ext4", 3000 + k as u32),
        host_mount(&name, &pod_mount, "ext4", 3100 + k as u32),
        pod_process(s, p, 0),
    ];
    let (ns, pod) = s.pod_of(p);
    d.reasons =
        vec![format!("mounted at {global} and {pod_mount}"), format!("open by a process of pod {ns}/{pod}")];
    d
}

/// Node `i`'s devices (see the module docs).
pub fn devices(s: &Shape, i: usize) -> Vec<pb::Device> {
    let mut v = Vec::new();
    let mut disk = device("sda".into(), pb::DeviceKind::Disk, pb::Verdict::InUse, 200 << 30);
    disk.stacked_below = (1..=4).map(|p| format!("sda{p}")).collect();
    disk.reasons = vec!["its partitions are in use".into()];
    disk.wwid = format!("naa.6000c29{i:09x}");
    v.push(disk);
    for (p, at) in [(1, "/"), (2, "/boot"), (3, "/var/lib/kubelet"), (4, "/var/lib/containerd")] {
        let mut d = device(format!("sda{p}"), pb::DeviceKind::Partition, pb::Verdict::Protected, 50 << 30);
        d.parent = "sda".into();
        d.holders = vec![host_mount(&d.name, at, "ext4", 20 + p)];
        d.reasons = vec![format!("mounted at {at}: a system mount")];
        v.push(d);
    }
    let mut k = 0;
    for vol in s.volumes_of_node(i) {
        v.push(rbd_device(s, i, k, vol, !stale(vol) && !multi_attached(vol)));
        k += 1;
    }
    // The volumes of the node before this one that are mapped here too (stale here).
    let before = (i + s.nodes - 1) % s.nodes;
    for vol in s.volumes_of_node(before).filter(|v| multi_attached(*v)) {
        v.push(rbd_device(s, i, k, vol, false));
        k += 1;
    }
    for l in 0..4 {
        let mut d = device(format!("loop{l}"), pb::DeviceKind::Loop, pb::Verdict::InUse, 60 << 20);
        d.loop_backing_file = format!("/var/lib/snapd/snaps/core22_{}.snap", 1000 + l);
        d.holders = vec![host_mount(&d.name, &format!("/snap/core22/{}", 1000 + l), "squashfs", 40 + l)];
        d.reasons = vec!["mounted (a snap)".into()];
        v.push(d);
    }
    for n in 0..2 {
        let mut d = device(format!("nbd{n}"), pb::DeviceKind::Nbd, pb::Verdict::Unused, 0);
        d.reasons = vec!["no backend connected".into()];
        v.push(d);
    }
    v
}

/// Fills `api` with the cluster's objects: Nodes, PVs, PVCs, VolumeAttachments, pods (those of
/// multi-attached volumes Pending) and their events. Returns how many objects.
pub fn fill(api: &ApiServer, s: &Shape) -> usize {
    let nodes: Vec<Value> = (0..s.nodes).map(|i| objects::node(s, i)).collect();
    let pvs: Vec<Value> = (0..s.volumes).map(objects::pv).collect();
    let pvcs: Vec<Value> = (0..s.volumes).map(objects::pvc).collect();
    let vas: Vec<Value> = (0..s.volumes).map(|v| objects::va(s, v, true)).collect();
    let mut events = Vec::new();
    let pods: Vec<Value> = (0..s.pods)
        .map(|p| {
            let pending = s.pod_claim(p).is_some_and(multi_attached);
            if pending {
                let (ns, name) = s.pod_of(p);
                let v = s.pod_claim(p).unwrap_or_default();
                let message = format!(
                    "Multi-Attach error for volume \"{}\" Volume is already exclusively attached to one node and can't be attached to another",
                    objects::pv_name(v)
                );
                events.push(core_event(
                    ("Pod", &ns, &name, &objects::pod_uid(p)),
                    ("FailedAttachVolume", &message),
                    "attachdetach-controller",
                    12,
                    &ago(90),
                ));
            }
            objects::pod(s, p, if pending { "Pending" } else { "Running" }, 0)
        })
        .collect();
    let count = nodes.len() + pvs.len() + pvcs.len() + vas.len() + pods.len();
    let mut st = api.state.lock().expect("state");
    st.lists.insert(NODES, nodes);
    st.lists.insert(PVS, pvs);
    st.lists.insert(PVCS, pvcs);
    st.lists.insert(VAS, vas);
    st.lists.insert(PODS, pods);
    st.lists.insert(EVENTS, events);
    st.index_pods_by_node();
    count
}

/// A small deterministic generator (xorshift64*): the same run makes the same changes.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn draw(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.draw() % n as u64) as usize
        }
    }
}

/// What the churn sent.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sent {
    /// Device changes made.
    pub changes: u64,
    /// Events delivered to subscribers (a change reaches every replica following its node).
    pub delivered: u64,
    /// Bursts.
    pub bursts: u64,
}

/// One change on node `i`: a process of one of its pods in use restarts, so the open-file holder
/// of its volume goes away, or comes back with a new pid (HOLDERS_CHANGED, the device as it is
/// after). Returns how many subscribers got the event (`None`: the node maps nothing in use).
pub fn change(s: &Shape, node: &NodeState, i: usize, rng: &mut Rng) -> Option<usize> {
    let mapped: Vec<(usize, usize)> =
        s.volumes_of_node(i).enumerate().filter(|(_, v)| !stale(*v) && !multi_attached(*v)).collect();
    let (k, v) = *mapped.get(rng.below(mapped.len()))?;
    let p = s.pod_of_volume(v)?;
    let restarts = (rng.draw() % 1000) as u32 + 1;
    node.change(&format!("rbd{k}"), pb::event::Type::HoldersChanged, |d| {
        let held = d.holders.iter().position(|h| h.kind == pb::HolderKind::OpenFile as i32);
        match held {
            Some(at) => {
                d.holders.remove(at);
            }
            None => d.holders.push(pod_process(s, p, restarts)),
        }
    })
}

/// Changes `per_node_minute` times a minute per node on average (spread evenly over time, nodes
/// at random), plus `burst` nodes at once every `burst_every`, until `until`; the counts
/// through `sent`.
pub async fn churn(
    s: Shape,
    nodes: Arc<Vec<Arc<NodeState>>>,
    per_node_minute: f64,
    (burst, burst_every): (usize, Duration),
    until: tokio::time::Instant,
    sent: Arc<std::sync::Mutex<Sent>>,
) {
    let mut rng = Rng::new(36);
    let tick = Duration::from_millis(100);
    let per_tick = nodes.len() as f64 * per_node_minute / 60.0 * tick.as_secs_f64();
    let mut due = 0.0;
    let mut next_burst = tokio::time::Instant::now() + burst_every;
    let mut interval = tokio::time::interval(tick);
    while tokio::time::Instant::now() < until {
        interval.tick().await;
        due += per_tick;
        let mut now: Vec<usize> = Vec::new();
        while due >= 1.0 {
            now.push(rng.below(nodes.len()));
            due -= 1.0;
        }
        let bursting = burst > 0 && tokio::time::Instant::now() >= next_burst;
        if bursting {
            let first = rng.below(nodes.len());
            now.extend((0..burst.min(nodes.len())).map(|k| (first + k) % nodes.len()));
            next_burst += burst_every;
        }
        let mut d = Sent::default();
        for i in now {
            if let Some(n) = change(&s, &nodes[i], i, &mut rng) {
                d.changes += 1;
                d.delivered += n as u64;
            }
        }
        let mut total = sent.lock().expect("sent");
        total.changes += d.changes;
        total.delivered += d.delivered;
        total.bursts += u64::from(bursting);
    }
}

/// Publishes `per_second` watch events a second until `until`: three in four a pod restarting
/// (its container's restart count), one in four a VolumeAttachment detached, or attached again.
/// Returns how many it published.
pub async fn kube_trickle(api: ApiServer, s: Shape, per_second: f64, until: tokio::time::Instant) -> u64 {
    if per_second <= 0.0 || s.pods == 0 || s.volumes == 0 {
        return 0;
    }
    let mut rng = Rng::new(3636);
    let mut detached: HashSet<usize> = HashSet::new();
    let mut interval = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
    let mut published = 0u64;
    while tokio::time::Instant::now() < until {
        interval.tick().await;
        if published % 4 == 3 {
            let v = rng.below(s.volumes);
            let attached = !detached.insert(v);
            if attached {
                detached.remove(&v);
            }
            api.publish(VAS, "MODIFIED", objects::va(&s, v, attached));
        } else {
            let p = rng.below(s.pods);
            let phase = if s.pod_claim(p).is_some_and(multi_attached) { "Pending" } else { "Running" };
            api.publish(PODS, "MODIFIED", objects::pod(&s, p, phase, (rng.draw() % 100) as u32 + 1));
        }
        published += 1;
    }
    published
}
