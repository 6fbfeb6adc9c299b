//! The blockjanitor fleet console: finds every node's agent, keeps an index of the fleet's block
//! devices, and answers questions across it over gRPC (`blockjanitor.v1.Fleet`).
//!
//! ```text
//!  discover ──► link (one task per agent: mTLS, ListDevices, WatchEvents, resync, backoff)
//!  (pods or       │
//!   --agents)     ▼
//!               index (by node, image, PV, client addr/id, WWID, nbd backend)
//!  cluster ───►   │      multiattach (VAs + Node status + agents' findings → diagnosis)
//!  (Nodes, PVs,   ▼
//!   PVCs, VAs)  service (Fleet: ListNodes, ListDevices, Where, WhoWatches, MultiAttach,
//!                        Plan/Apply forwarded on behalf of the caller) + metrics
//! ```
//!
//! - [`discover`]: the agents, from a static list or the DaemonSet's pods (watched).
//! - [`link`]: one task per agent keeping its part of the index current.
//! - [`index`]: the fleet index and its lookups.
//! - [`watchers`]: parsing `rbd status` / `rados listwatchers` text.
//! - [`ceph_addr`]: every identifier a user pastes from Ceph (addresses, vectors, ranges, client
//!   ids, `rbd status` and `ceph osd blocklist ls` lines) for WhoWatches, and matching it.
//! - [`cluster`]: Nodes, PVs, PVCs and VolumeAttachments, watched.
//! - [`multiattach`]: one diagnosis per node for a volume.
//! - [`apply`]: an Apply's targets (identities required), its dry run's summary, the fleet-wide
//!   step budget; [`lease`]: the apply Lease, so that with several replicas only one spends it.
//! - [`service`]: the gRPC service; [`serve`]: putting it all together; [`metrics`].

#[cfg(test)]
mod alerts_tests;
pub mod apply;
pub mod ceph_addr;
pub mod cluster;
pub mod discover;
pub mod ident;
pub mod index;
pub mod lease;
pub mod link;
pub mod metrics;
pub mod multiattach;
pub mod resolve;
pub mod serve;
pub mod service;
pub mod sweep;
pub mod watchers;
