//! What the console knows about one volume on each node involved: the devices that are it (as
//! last seen on a node whose agent does not answer, or that left the fleet), the
//! VolumeAttachments naming the node, whether the Node's status lists it attached or in use, and
//! the node's liveness. A node is involved when any of these names it, and the stuck pod's node
//! always is. Found through keys (the index's, the VolumeAttachments' by PV, the Nodes' by the
//! volume's unique name): a question costs its matches, not the fleet.

use std::collections::{BTreeMap, BTreeSet};

use blockjanitor_proto::v1 as pb;

use super::liveness;
use super::volumes::{is_volume, Volume};
use crate::cluster::Cluster;
use crate::index::Inner;

/// One node's part in a volume.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    pub node: String,
    /// The stuck pod's node.
    pub pod_node: bool,
    /// Its devices for the volume (as last seen when its agent does not answer).
    pub devices: Vec<pb::FleetDevice>,
    /// VolumeAttachments naming it: (name, status.attached).
    pub vas: Vec<(String, bool)>,
    /// Its Node's status.volumesAttached lists the volume.
    pub in_attached: bool,
    /// Its Node's status.volumesInUse lists it.
    pub in_use: bool,
    pub liveness: pb::NodeLiveness,
}

impl NodeFacts {
    /// Kubernetes attaches the volume to this node (a VolumeAttachment attached=true, or its
    /// Node's volumesAttached).
    pub fn attached(&self) -> bool {
        self.in_attached || self.vas.iter().any(|(_, a)| *a)
    }

    /// The devices themselves.
    pub fn devs(&self) -> impl Iterator<Item = &pb::Device> {
        self.devices.iter().filter_map(|f| f.device.as_ref())
    }
}

/// The devices of the volume, by node: the index's (every node in the fleet, as last seen for
/// one that does not answer) and the last views of nodes that left it; and, on the same node, the
/// multipath map a matched SCSI disk is a path of.
fn devices(ix: &Inner, v: &Volume) -> BTreeMap<String, Vec<pb::FleetDevice>> {
    let mut out: BTreeMap<String, Vec<pb::FleetDevice>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut add = |out: &mut BTreeMap<String, Vec<pb::FleetDevice>>, f: pb::FleetDevice| {
        let name = f.device.as_ref().map(|d| d.name.clone()).unwrap_or_default();
        if seen.insert((f.node.clone(), name)) {
            out.entry(f.node.clone()).or_default().push(f);
        }
    };
    let found = v.keys.iter().flat_map(|k| ix.lookup(k));
    let gone = ix.lookup_gone(&v.keys).into_iter().map(|(f, _)| f);
    for f in found.chain(gone) {
        if !f.device.as_ref().is_some_and(|d| is_volume(v, d)) {
            continue;
        }
        let map =
            f.device.as_ref().and_then(|d| d.scsi.as_ref()).map(|s| s.path_of.clone()).unwrap_or_default();
        let node = f.node.clone();
        add(&mut out, f);
        if let Some(m) = ix.nodes.get(&node).and_then(|n| n.devices.get(&map)) {
            add(&mut out, pb::FleetDevice { node, device: Some(pb::Device::clone(m)) });
        }
    }
    out
}

/// Every node involved in `v`, by name; `pod_node` ("" when none) among them.
pub fn gather(ix: &Inner, cluster: Option<&Cluster>, v: &Volume, pod_node: &str) -> Vec<NodeFacts> {
    let mut per: BTreeMap<String, NodeFacts> = BTreeMap::new();
    let entry = |per: &mut BTreeMap<String, NodeFacts>, n: &str| {
        per.entry(n.to_owned())
            .or_insert_with(|| NodeFacts { node: n.to_owned(), ..Default::default() })
            .node
            .clone()
    };
    if !pod_node.is_empty() {
        entry(&mut per, pod_node);
    }
    for (n, devs) in devices(ix, v) {
        entry(&mut per, &n);
        if let Some(f) = per.get_mut(&n) {
            f.devices = devs;
        }
    }
    if let Some(c) = cluster {
        if !v.pv.is_empty() {
            for va in c.vas_of(&v.pv) {
                let n = entry(&mut per, &va.spec.node_name);
                let attached = va.status.as_ref().is_some_and(|s| s.attached);
                if let Some(f) = per.get_mut(&n) {
                    f.vas.push((va.metadata.name.clone().unwrap_or_default(), attached));
                }
            }
        }
        for name in &v.id.unique_names {
            for node in c.nodes_listing(name) {
                let n = entry(&mut per, node.metadata.name.as_deref().unwrap_or(""));
                let status = node.status.as_ref();
                let Some(f) = per.get_mut(&n) else { continue };
                f.in_attached |= status
                    .and_then(|s| s.volumes_attached.as_ref())
                    .is_some_and(|l| l.iter().any(|a| &a.name == name));
                f.in_use |= status.and_then(|s| s.volumes_in_use.as_ref()).is_some_and(|l| l.contains(name));
            }
        }
    }
    per.into_values()
        .map(|mut f| {
            f.pod_node = f.node == pod_node;
            f.liveness = liveness::of(ix, cluster, &f.node);
            f
        })
        .collect()
}
