//! Fleet.ListDevices a page at a time (issue 36): 5,000 nodes of 20 devices do not fit in one
//! gRPC message (a device with its holders and mounts is one to two kilobytes), so an answer
//! holds at most `page_size` devices (default [`DEFAULT_PAGE`]) and at most [`PAGE_BYTES`], by
//! node then name, and says where the next page starts (`next_page_token`: the last device's
//! `NODE/DEVICE`; node and device names hold no `/`). A caller that does not say it reads pages
//! (`paged`, agentctl from this version on) gets the whole list in one answer when it fits in one
//! page, else FAILED_PRECONDITION: never a first page it could take for the whole fleet. The
//! index's lock is held for one page's copy only.

use std::ops::Bound;

use blockjanitor_proto::v1 as pb;
use prost::Message;
use tonic::Status;

use crate::person::Person;
use crate::service::FleetService;

/// Devices in a page when the caller does not say.
pub const DEFAULT_PAGE: usize = 1000;
/// The most a caller may ask for in one page.
pub const MAX_PAGE: usize = 5000;
/// The most bytes of devices in one page (under the 4 MiB a gRPC client takes by default).
pub const PAGE_BYTES: usize = 3 << 20;

/// Where a page starts: after this node and device.
fn after(token: &str) -> Result<Option<(String, String)>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    token
        .split_once('/')
        .map(|(n, d)| Some((n.to_owned(), d.to_owned())))
        .ok_or_else(|| Status::invalid_argument(format!("page_token '{token}' is not one this console gave")))
}

impl FleetService {
    /// One page of the fleet's devices (see the module docs).
    pub(crate) async fn list_devices_now(
        &self,
        person: &Person,
        r: pb::FleetListDevicesRequest,
    ) -> Result<pb::FleetListDevicesResponse, Status> {
        let _fresh = self.admit_fresh(person, r.fresh)?;
        if r.fresh {
            self.links.refresh_all((!r.node.is_empty()).then_some(r.node.as_str())).await;
        }
        let size = match r.page_size as usize {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        };
        let start = after(&r.page_token)?;
        let ix = self.index.read();
        if !r.node.is_empty() && !ix.nodes.contains_key(&r.node) {
            return Err(Status::not_found(format!("no agent is known on node {}", r.node)));
        }
        let from = match &start {
            Some((n, _)) => Bound::Included(n.clone()),
            None => Bound::Unbounded,
        };
        let wanted =
            |d: &pb::Device| (r.kind == 0 || d.kind == r.kind) && (r.verdict == 0 || d.verdict == r.verdict);
        let mut devices: Vec<pb::FleetDevice> = Vec::new();
        let (mut bytes, mut more) = (0usize, false);
        'nodes: for (name, n) in ix.nodes.range((from, Bound::Unbounded)) {
            if !r.node.is_empty() && *name != r.node {
                continue;
            }
            let first = match &start {
                Some((sn, sd)) if sn == name => Bound::Excluded(sd.clone()),
                _ => Bound::Unbounded,
            };
            for (_, d) in n.devices.range((first, Bound::Unbounded)).filter(|(_, d)| wanted(d)) {
                let len = d.encoded_len();
                if devices.len() >= size || (bytes + len > PAGE_BYTES && !devices.is_empty()) {
                    more = true;
                    break 'nodes;
                }
                bytes += len;
                devices.push(pb::FleetDevice { node: name.clone(), device: Some(pb::Device::clone(d)) });
            }
        }
        let missing_nodes =
            self.missing_of(&ix).into_iter().filter(|m| r.node.is_empty() || m.node == r.node).collect();
        drop(ix);
        if more && !r.paged {
            return Err(Status::failed_precondition(format!(
                "the fleet's devices do not fit in one answer (more than {} devices or {} MiB): ask page by page \
                 (page_token; agentctl fleet devices does from this version on)",
                devices.len(),
                PAGE_BYTES >> 20
            )));
        }
        let next_page_token = match devices.last() {
            Some(last) if more => {
                format!("{}/{}", last.node, last.device.as_ref().map(|d| d.name.as_str()).unwrap_or(""))
            }
            _ => String::new(),
        };
        Ok(pb::FleetListDevicesResponse { devices, missing_nodes, next_page_token })
    }
}
