//! The kernel rbd clients this console has seen, each with its node: an agent reports a krbd
//! mapping's client (`client_addr` `IP:0/NONCE`, `client_id`), and that instance lives exactly as
//! long as the kernel keeps a mapping on it. So once an agent that answers now no longer reports
//! an instance the console saw on that node, that instance is gone for good, and lifting its
//! fence cannot bring a stale mapping back. An instance never seen as a krbd client (an rbd-nbd
//! or librbd client, which no agent can see, or one from before this console started) proves
//! nothing either way: who-watches answers it "unknown", never "safe".
//!
//! Bounded: the oldest instances are forgotten first ([`KEPT`]); forgetting only turns a "safe"
//! into an "unknown".

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use blockjanitor_proto::v1 as pb;

use crate::ceph_addr;

/// How many client instances are remembered over the fleet.
pub const KEPT: usize = 65_536;

/// One client instance as seen.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// The node whose agent reported it.
    pub node: String,
    /// Its client id (`N` of `client.N`), when reported.
    pub client_id: Option<u64>,
    /// The device it mapped when last seen (`rbd4`) and the image (`pool/image`).
    pub device: String,
    pub image: String,
    /// When it was first and last seen in a report (seconds since the epoch).
    pub first: f64,
    pub last: f64,
}

/// The instances seen (see the module docs).
#[derive(Debug, Default)]
pub struct ClientHistory {
    by_instance: HashMap<(IpAddr, u32), Seen>,
    by_id: HashMap<u64, (IpAddr, u32)>,
    order: VecDeque<(IpAddr, u32)>,
}

impl ClientHistory {
    /// Records the client of an rbd mapping `d` reported by `node` at `now` (nothing for other
    /// devices, or a mapping whose client address is no instance).
    pub fn record(&mut self, node: &str, d: &pb::Device, now: f64) {
        let Some(r) = &d.rbd else { return };
        let Some(instance) = ceph_addr::client_instance(&r.client_addr) else { return };
        let client_id = ceph_addr::parse_client(&r.client_id).ok();
        let image = [r.pool.as_str(), r.pool_namespace.as_str(), r.image.as_str()]
            .iter()
            .filter(|p| !p.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("/");
        match self.by_instance.get_mut(&instance) {
            Some(s) => {
                s.node = node.to_owned();
                s.client_id = client_id.or(s.client_id);
                s.device = d.name.clone();
                s.image = image;
                s.last = now;
            }
            None => {
                let seen = Seen {
                    node: node.to_owned(),
                    client_id,
                    device: d.name.clone(),
                    image,
                    first: now,
                    last: now,
                };
                self.by_instance.insert(instance, seen);
                self.order.push_back(instance);
                self.forget_oldest();
            }
        }
        if let Some(id) = client_id {
            self.by_id.insert(id, instance);
        }
    }

    fn forget_oldest(&mut self) {
        while self.order.len() > KEPT {
            let Some(old) = self.order.pop_front() else { return };
            if let Some(s) = self.by_instance.remove(&old) {
                if let Some(id) = s.client_id {
                    if self.by_id.get(&id) == Some(&old) {
                        self.by_id.remove(&id);
                    }
                }
            }
        }
    }

    /// An instance by IP and nonce.
    pub fn instance(&self, ip: IpAddr, nonce: u32) -> Option<&Seen> {
        self.by_instance.get(&(ip.to_canonical(), nonce))
    }

    /// An instance by client id, with its address.
    pub fn client(&self, id: u64) -> Option<((IpAddr, u32), &Seen)> {
        let at = *self.by_id.get(&id)?;
        self.by_instance.get(&at).map(|s| (at, s))
    }

    /// How many instances are remembered.
    pub fn len(&self) -> usize {
        self.by_instance.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.by_instance.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(addr: &str, id: &str) -> pb::Device {
        pb::Device {
            name: "rbd0".into(),
            rbd: Some(pb::RbdMapping {
                pool: "k8s".into(),
                image: "vol".into(),
                client_addr: addr.into(),
                client_id: id.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn instances_are_found_by_address_and_id_and_the_oldest_are_forgotten() {
        let mut h = ClientHistory::default();
        h.record("node-a", &mapping("10.0.2.15:0/3317410129", "client4151"), 1.0);
        h.record("node-a", &mapping("garbage", "client9"), 1.0);
        assert_eq!(h.len(), 1, "an address that is no instance is not recorded");
        let ip: IpAddr = "10.0.2.15".parse().expect("ip");
        let s = h.instance(ip, 3317410129).expect("seen");
        assert_eq!((s.node.as_str(), s.client_id, s.image.as_str()), ("node-a", Some(4151), "k8s/vol"));
        assert!(h.instance(ip, 1).is_none());
        assert_eq!(h.client(4151).map(|(at, _)| at), Some((ip, 3317410129)));
        for n in 0..(KEPT as u32 + 1) {
            h.record("node-b", &mapping(&format!("10.9.0.1:0/{}", n + 1), ""), 2.0);
        }
        assert_eq!(h.len(), KEPT);
        assert!(h.instance(ip, 3317410129).is_none() && h.client(4151).is_none(), "the oldest went first");
    }
}
