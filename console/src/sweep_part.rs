//! What one part of the fleet sweep found ([`Part`]: one volume's, from its devices, or one PV's,
//! from its VolumeAttachments) and the nodes it could not speak for ([`Missing`]); made by
//! [`crate::sweep::volume_part`] and [`crate::sweep_attach::pv_part`], put together by
//! [`crate::sweep::assemble`].

use std::collections::{BTreeMap, BTreeSet};

use blockjanitor_proto::v1 as pb;

/// The reason of each node answers cannot speak for, by name.
pub type Missing = BTreeMap<String, String>;

/// What one part of the sweep found: its findings, the devices its agents cannot vouch for
/// (`node/device`), and the nodes with no agent its attachments name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Part {
    pub findings: Vec<pb::Finding>,
    pub unvouched: Vec<String>,
    pub unagented: BTreeSet<String>,
}
