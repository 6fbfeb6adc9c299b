//! The sweep's view of Kubernetes ([`KubeView`]: each PV's volume, each VolumeAttachment's node
//! and PV, each Node's volumes in use, kept as small digests, not objects) and the part of the
//! sweep one PV makes from its VolumeAttachments ([`pv_part`]): attached to a node that cannot
//! be asked (`dead_node_watcher`), or to an answering node that neither maps it nor lists it in
//! use (`attached_not_in_use`). Pure; every lookup is keyed (a PV's attachments by PV, a Node by
//! name, the devices of a volume through the index's keys).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use blockjanitor_proto::v1 as pb;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment;

use crate::cluster::Cluster;
use crate::index::Inner;
use crate::multiattach::{devices_of, names_volume, volume_id, VolumeId};
use crate::sweep_part::{Missing, Part};

/// A VolumeAttachment as the sweep reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attachment {
    pub name: String,
    pub node: String,
    /// Its PV ("" for an inline volume).
    pub pv: String,
    pub attached: bool,
}

impl Attachment {
    pub fn of(va: &VolumeAttachment) -> Self {
        Attachment {
            name: va.metadata.name.clone().unwrap_or_default(),
            node: va.spec.node_name.clone(),
            pv: va.spec.source.persistent_volume_name.clone().unwrap_or_default(),
            attached: va.status.as_ref().is_some_and(|s| s.attached),
        }
    }
}

/// What Kubernetes says, as the sweep needs it.
#[derive(Debug, Default, Clone)]
pub struct KubeView {
    /// Each PV's volume, by PV name.
    pub pvs: BTreeMap<String, VolumeId>,
    /// Each VolumeAttachment, by key.
    pub vas: BTreeMap<String, Attachment>,
    /// Each Node's `status.volumesInUse`, by Node name (every Node is here).
    pub nodes: HashMap<String, Vec<String>>,
    /// Why the view cannot be trusted now (not synced), `None` when it can.
    pub not_synced: Option<String>,
    /// VolumeAttachment keys by PV, and by node.
    by_pv: HashMap<String, BTreeSet<String>>,
    by_node: HashMap<String, BTreeSet<String>>,
    /// PVs by the images and WWIDs of their volumes.
    by_volume: HashMap<String, BTreeSet<String>>,
}

impl KubeView {
    /// The cluster's tables now, every object read back (tests, small clusters).
    pub fn of(c: &Cluster) -> Self {
        let mut k = KubeView { not_synced: c.not_synced(), ..KubeView::default() };
        for p in c.pvs.all() {
            k.set_pv(&Cluster::name_of(p.as_ref()), Some(volume_id(&p)));
        }
        for va in c.vas.all() {
            k.set_va(&Cluster::name_of(va.as_ref()), Some(Attachment::of(&va)));
        }
        for n in c.nodes.all() {
            k.set_node(&Cluster::name_of(n.as_ref()), Some(in_use(&n)));
        }
        k
    }

    /// A PV's volume added or changed (`Some`), or the PV deleted; returns the volume it had.
    pub fn set_pv(&mut self, name: &str, v: Option<VolumeId>) -> Option<VolumeId> {
        let old = self.pvs.remove(name);
        if let Some(old) = &old {
            for i in old.images.iter().chain(&old.wwids) {
                unlink(&mut self.by_volume, i, name);
            }
        }
        if let Some(v) = v {
            for i in v.images.iter().chain(&v.wwids) {
                self.by_volume.entry(i.clone()).or_default().insert(name.to_owned());
            }
            self.pvs.insert(name.to_owned(), v);
        }
        old
    }

    /// A VolumeAttachment added or changed (`Some`), or deleted; returns what it was.
    pub fn set_va(&mut self, key: &str, a: Option<Attachment>) -> Option<Attachment> {
        let old = self.vas.remove(key);
        if let Some(old) = &old {
            unlink(&mut self.by_pv, &old.pv, key);
            unlink(&mut self.by_node, &old.node, key);
        }
        if let Some(a) = a {
            self.by_pv.entry(a.pv.clone()).or_default().insert(key.to_owned());
            self.by_node.entry(a.node.clone()).or_default().insert(key.to_owned());
            self.vas.insert(key.to_owned(), a);
        }
        old
    }

    /// A Node added or changed (`Some`: its volumes in use), or deleted.
    pub fn set_node(&mut self, name: &str, in_use: Option<Vec<String>>) {
        match in_use {
            Some(v) => {
                self.nodes.insert(name.to_owned(), v);
            }
            None => {
                self.nodes.remove(name);
            }
        }
    }

    /// The PV whose volume has this image or WWID (the first by name), if any.
    pub fn pv_of(&self, volume: &str) -> Option<String> {
        self.by_volume.get(volume).and_then(|s| s.iter().next().cloned())
    }

    /// The PVs whose volume has this image or WWID.
    pub fn pvs_of(&self, volume: &str) -> Vec<String> {
        self.by_volume.get(volume).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    /// The VolumeAttachments of a PV ("" for the inline ones).
    pub fn attachments_of(&self, pv: &str) -> impl Iterator<Item = &Attachment> {
        self.by_pv.get(pv).into_iter().flatten().filter_map(|k| self.vas.get(k))
    }

    /// The PVs (by name, "" for inline volumes) of the VolumeAttachments on a node.
    pub fn pvs_on(&self, node: &str) -> BTreeSet<String> {
        self.by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|k| self.vas.get(k))
            .map(|a| a.pv.clone())
            .collect()
    }

    /// Whether a VolumeAttachment attaches something to `node`.
    pub fn attached_on(&self, node: &str) -> bool {
        self.by_node.get(node).into_iter().flatten().filter_map(|k| self.vas.get(k)).any(|a| a.attached)
    }

    /// Every PV name some VolumeAttachment names ("" for inline volumes).
    pub fn attached_pvs(&self) -> Vec<String> {
        let mut v: Vec<String> = self.by_pv.keys().cloned().collect();
        v.sort();
        v
    }
}

/// A Node's `status.volumesInUse`.
pub fn in_use(n: &Node) -> Vec<String> {
    n.status.as_ref().and_then(|s| s.volumes_in_use.clone()).unwrap_or_default()
}

fn unlink(map: &mut HashMap<String, BTreeSet<String>>, key: &str, value: &str) {
    if let Some(set) = map.get_mut(key) {
        set.remove(value);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

/// The part one PV (`pv`; "" gathers the inline volumes' attachments) makes from its
/// VolumeAttachments: findings (only for a PV the view knows) and nodes with no agent.
pub fn pv_part(index: &Inner, k: &KubeView, pv: &str, missing: &Missing) -> Part {
    let mut part = Part::default();
    let v = k.pvs.get(pv).filter(|_| !pv.is_empty());
    let mapped_on = v.map(|v| devices_of(index, v)).unwrap_or_default();
    let mut vas: Vec<&Attachment> = k.attachments_of(pv).filter(|a| a.attached).collect();
    vas.sort_by(|a, b| (&a.name, &a.node).cmp(&(&b.name, &b.node)));
    for va in vas {
        let node = va.node.as_str();
        if !index.nodes.contains_key(node) && k.nodes.contains_key(node) {
            part.unagented.insert(node.to_owned());
        }
        let Some(v) = v else { continue };
        let va_text = format!("{} (node={node}, attached=true)", va.name);
        let volume = v.images.first().or(v.wwids.first()).cloned().unwrap_or_else(|| format!("pv/{pv}"));
        let finding = |kind: pb::FindingKind, detail: String| pb::Finding {
            kind: kind as i32,
            volume: volume.clone(),
            pv: pv.to_owned(),
            nodes: vec![node.to_owned()],
            volume_attachments: vec![va_text.clone()],
            detail,
            ..Default::default()
        };
        if let Some(reason) = missing.get(node) {
            // Its last-seen mappings already make a finding; the attachment alone does too.
            if !mapped_on.contains_key(node) {
                part.findings.push(finding(
                    pb::FindingKind::DeadNodeWatcher,
                    format!(
                        "attached to {node}, whose agent cannot be asked ({reason}): its client may still watch \
                         the volume"
                    ),
                ));
            }
            continue;
        }
        if !index.nodes.contains_key(node) {
            if !k.nodes.contains_key(node) {
                part.findings.push(finding(
                    pb::FindingKind::DeadNodeWatcher,
                    format!(
                        "attached to {node}, which is no Node of the cluster any more and has no agent: if the \
                         machine still runs, its client may still watch the volume"
                    ),
                ));
            }
            continue;
        }
        if mapped_on.contains_key(node) {
            continue;
        }
        let in_use = k.nodes.get(node).is_some_and(|l| l.iter().any(|u| names_volume(u, v)));
        if !in_use {
            part.findings.push(finding(
                pb::FindingKind::AttachedNotInUse,
                format!(
                    "VolumeAttachment {va_text} attaches it to {node}, whose agent finds no mapping of it, and \
                     the Node does not list it in use"
                ),
            ));
        }
    }
    part
}
