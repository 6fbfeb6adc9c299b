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
//!   PVCs, VAs)  service (Fleet: ListNodes, ListDevices, Where, WhoWatches, MultiAttach, Sweep,
//!                        Explain, Plan/Apply forwarded on behalf of the caller) + metrics
//! ```
//!
//! - [`discover`]: the agents, from a static list or the DaemonSet's pods (watched).
//! - [`link`]: one task per agent keeping its part of the index current (`link_session`: one
//!   connection's loop); [`liveness`]: whether a link went silent, net of the console's own
//!   scheduling lag.
//! - [`index`]: the fleet index and its lookups.
//! - [`watchers`]: parsing `rbd status` / `rados listwatchers` text, and one watcher's answer
//!   ("yes" only from evidence about the client's own node); [`who_watches`]: finding that node
//!   (the agent reporting the client, the node this console saw it on ([`client_history`]), the
//!   Node whose address it is, a deleted Node) and the mappings through the index's keys.
//! - [`ceph_addr`]: every identifier a user pastes from Ceph (addresses, vectors, ranges, client
//!   ids, `rbd status` and `ceph osd blocklist ls` lines) for WhoWatches, and matching it;
//!   `IP:0/0` is the whole IP, a daemon's address is no client.
//! - [`cluster`]: Nodes, PVs, PVCs and VolumeAttachments, watched ([`kube_table`]: each indexed
//!   for its questions, deleted objects remembered).
//! - [`explain`]: why a pod (PVC, PV) is stuck, from the pod to the process holding its volume,
//!   one diagnosis with evidence and next steps; dead-node advice only for a node believed dead.
//! - [`multiattach`]: one diagnosis per node for a volume.
//! - [`apply`]: an Apply's targets (identities required), its dry run's summary, the fleet-wide
//!   step budget; [`lease`]: the apply Lease, so that with several replicas only one spends it;
//!   [`person_budget`]: each person's share of it.
//! - [`access`]: who may call, for what: a bearer token the API server reviews
//!   ([`review`]: TokenReview, SubjectAccessReview, cached in a [`ttl_cache`]) or a per-person
//!   client certificate; [`person`]: the person, the verb a method needs, the refusal's words.
//! - [`forward`]: Plan and Apply forwarded to the agents on behalf of that person.
//! - [`pin_risks`]: the fleet's pin risks, paged (`ListPinRisks`).
//! - [`serving_ca`]: the serving CA published in a ConfigMap for the kubectl plugin.
//! - [`service`]: the gRPC service; [`serve`]: putting it all together; [`metrics`].
//! - `scale_objects` (tests, and the `scale-objects` feature only): Kubernetes objects at issue
//!   36's scale, for the memory measurement and the acceptance bench.

pub mod access;
#[cfg(test)]
mod alerts_tests;
pub mod apply;
pub mod apply_run;
pub mod ceph_addr;
pub mod client_history;
pub mod cluster;
pub mod devices_page;
pub mod discover;
pub mod explain;
pub mod forward;
pub mod ident;
pub mod index;
pub mod kube_keep;
#[cfg(test)]
mod kube_scale_tests;
pub mod kube_table;
pub mod lease;
pub mod lease_steps;
pub mod limits;
pub mod link;
mod link_session;
pub mod liveness;
pub mod metrics;
pub mod multiattach;
pub mod multiattach_run;
pub mod peer;
pub mod person;
pub mod person_budget;
pub mod pin_risks;
pub mod ready;
pub mod resolve;
pub mod review;
#[cfg(any(test, feature = "scale-objects"))]
pub mod scale_objects;
pub mod serve;
pub mod service;
pub mod serving_ca;
pub mod sweep;
pub mod sweep_attach;
pub mod sweep_bound;
pub mod sweep_part;
pub mod sweeper;
pub mod ttl_cache;
pub mod volume_key;
pub mod watchers;
pub mod who_watches;
