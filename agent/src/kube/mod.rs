//! The Kubernetes side of the agent, all optional: the agent scans and cleans with no API at all.
//!
//! - [`connect`](connect::connect) builds a client from an explicit URL, a kubeconfig file or the
//!   pod's service account, in that order of precedence.
//! - [`spawn_watch`](cache::spawn_watch) keeps a [`ClusterView`] of this node's pods, its
//!   VolumeAttachments and every PersistentVolume current with watches, relisting after a backoff
//!   when a watch breaks, and looks up this node's Node periodically.
//!   [`ClusterView::vouch`] says whether the view may be taken as evidence now: not while a watch
//!   has not relisted since it broke, any one watch (events or bookmarks) or the Node lookup has
//!   not heard from the API server within the silence bound (90 s by default), or no Node has
//!   this node's name.
//! - [`Reporter`](report::Reporter) posts de-duplicated Events on the Node and keeps the Node's
//!   `StaleBlockDevices` condition, as node-problem-detector does.
//!
//! The API needs (ClusterRole): `list`/`watch` on pods, `volumeattachments.storage.k8s.io` and
//! persistentvolumes; `get` on nodes (without it the view never vouches); `create` on events;
//! `get`/`patch` on `nodes/status`.

pub mod cache;
pub mod cluster;
pub mod connect;
pub mod error;
mod follow;
pub mod options;
pub mod reduce;
pub mod report;
pub mod source;
mod table;

pub use cache::spawn_watch;
pub use cluster::{
    ClusterView, ContainerInfo, CsiVolume, PodInfo, PvInfo, RbdImage, VaInfo, VolumeMountInfo, WatchHealth,
    DEFAULT_SILENCE_BOUND,
};
pub use connect::{connect, KubeConfig};
pub use options::WatchOptions;
pub use report::{Delivery, EventReason, Reporter};
pub use source::{ApiState, Choice};
