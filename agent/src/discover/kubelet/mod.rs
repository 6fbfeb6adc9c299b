//! Kubelet's own record of the volumes it set up on this node, read from its directory
//! (`/var/lib/kubelet` unless kubelet runs with `--root-dir`): which PV, CSI volume handle and
//! driver each mount point or device file belongs to, and which pods use it. The agent joins these
//! to block devices by mount point (mountinfo), by device number (raw block volumes) and by loop
//! backing file (kubelet pins every raw block volume with a loop device).
//!
//! Layouts, as kubelet writes them (kubernetes `pkg/volume/csi`, `pkg/volume/rbd`,
//! `pkg/volume/util`), relative to the kubelet directory:
//!
//! | kind | path | identity from |
//! | --- | --- | --- |
//! | [`StagingLegacy`](VolumeKind::StagingLegacy) | `plugins/kubernetes.io/csi/pv/<pv>/globalmount` (kubelet < 1.24) | `vol_data.json` beside it, PV from the directory |
//! | [`Staging`](VolumeKind::Staging) | `plugins/kubernetes.io/csi/<driver>/<sha256 hex of volumeHandle>/globalmount` (kubelet >= 1.24) | `vol_data.json` beside it; no PV name there |
//! | [`PodMount`](VolumeKind::PodMount) | `pods/<uid>/volumes/kubernetes.io~csi/<specName>/mount`, `pods/<uid>/volumes/<plugin>/<specName>` | `vol_data.json` in `<specName>/` (CSI) |
//! | [`PodSubpath`](VolumeKind::PodSubpath) | `pods/<uid>/volume-subpaths/<pod volume>/<container>/<index>` | nothing: joined by device |
//! | [`PodDevice`](VolumeKind::PodDevice) | `pods/<uid>/volumeDevices/<plugin>/<specName>` (symlink to the device or CSI publish path) | CSI: the PV's `data/vol_data.json` |
//! | [`BlockMapFile`](VolumeKind::BlockMapFile) | `plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<uid>`, `plugins/kubernetes.io/rbd/volumeDevices/<pool>-image-<image>/<uid>` | `plugins/kubernetes.io/csi/volumeDevices/<pv>/data/vol_data.json` |
//! | [`BlockPublish`](VolumeKind::BlockPublish) | `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>` (`publish/<pv>` before 1.18) | the same |
//! | [`BlockStaging`](VolumeKind::BlockStaging) | `plugins/kubernetes.io/csi/volumeDevices/staging/<pv>` | the same |
//! | [`InTreeRbd`](VolumeKind::InTreeRbd) | `plugins/kubernetes.io/rbd/mounts/<pool>-image-<image>` (`rbd/rbd/...` from old kubelets) | the directory name |
//!
//! Both CSI staging layouts exist in the field, on one node too: a kubelet upgraded to 1.24 keeps
//! volumes staged before. For a 1.24+ staging directory the PV name is taken from the pod mounts
//! of the same driver and handle (unless two PVs share the handle, kubernetes#105899); the
//! directory name is checked against `sha256(volumeHandle)` and a mismatch is a warning. Drivers
//! may mount below the staging path (ceph-csi stages at `globalmount/<volumeHandle>`):
//! [`KubeletScan::find_by_mount_point`] maps such a mount to its staging entry.
//!
//! A raw block volume's device is bind-mounted by kubelet on the empty file
//! `volumeDevices/<pv>/dev/<podUID>`, which is also the backing file of the loop device kubelet
//! attaches to hold the device open ([`KubeletScan::find_by_backing_file`]). On a live node the
//! device files are `stat`ed for their device number (a device node's inode lives on devtmpfs: no
//! I/O reaches the device).
//!
//! Nothing below a mount point is listed or `stat`ed, only the directories kubelet keeps around
//! them, so a hung filesystem cannot hang the scan; in particular `rbd.json` (older kubelets
//! persisted the whole in-tree rbd mounter, cephx secret included, inside the global mount
//! directory) is never read. A missing kubelet directory is an empty scan (nodes without
//! kubelet); a malformed or unexpected entry below it is a [`KubeletWarning`] naming the file and
//! the scan goes on.

pub mod pod_dirs;
pub mod walk;

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::model::DevNum;

/// Kubelet's directory unless it runs with `--root-dir`.
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";

const CSI_PLUGIN: &str = "kubernetes.io/csi";
const RBD_PLUGIN: &str = "kubernetes.io/rbd";
const VOL_DATA: &str = "vol_data.json";
const GLOBAL_MOUNT: &str = "globalmount";
/// kubelet's files are a few hundred bytes; anything larger is not one.
const MAX_VOL_DATA: u64 = 64 * 1024;
/// Pod volume plugins whose volumes are never a block device (tmpfs or a plain directory).
const NOT_BLOCK_PLUGINS: [&str; 6] = [
    "kubernetes.io~configmap",
    "kubernetes.io~downward-api",
    "kubernetes.io~empty-dir",
    "kubernetes.io~git-repo",
    "kubernetes.io~projected",
    "kubernetes.io~secret",
];

/// Which of kubelet's layouts an entry comes from (table in the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeKind {
    /// CSI staging before kubelet 1.24: `plugins/kubernetes.io/csi/pv/<pv>/globalmount`.
    StagingLegacy,
    /// CSI staging from kubelet 1.24: `plugins/kubernetes.io/csi/<driver>/<sha256>/globalmount`.
    Staging,
    /// In-tree rbd global mount: `plugins/kubernetes.io/rbd/mounts/<pool>-image-<image>`.
    InTreeRbd,
    /// A pod's filesystem volume: `pods/<uid>/volumes/<plugin>/<name>` (`.../mount` for CSI).
    PodMount,
    /// A subPath bind mount: `pods/<uid>/volume-subpaths/<pod volume>/<container>/<index>`.
    PodSubpath,
    /// A pod's raw block volume: `pods/<uid>/volumeDevices/<plugin>/<name>`.
    PodDevice,
    /// Raw block global map file: `plugins/kubernetes.io/<plugin>/volumeDevices/<volume>/.../<uid>`,
    /// the device bind-mounted on an empty file and the backing file of kubelet's loop device.
    BlockMapFile,
    /// CSI raw block publish path: `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>`.
    BlockPublish,
    /// CSI raw block staging directory: `plugins/kubernetes.io/csi/volumeDevices/staging/<pv>`.
    BlockStaging,
}

impl VolumeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StagingLegacy => "staging_legacy",
            Self::Staging => "staging",
            Self::InTreeRbd => "in_tree_rbd",
            Self::PodMount => "pod_mount",
            Self::PodSubpath => "pod_subpath",
            Self::PodDevice => "pod_device",
            Self::BlockMapFile => "block_map_file",
            Self::BlockPublish => "block_publish",
            Self::BlockStaging => "block_staging",
        }
    }

    /// Node-wide (staged once per node), as opposed to per pod.
    pub fn is_node_wide(self) -> bool {
        matches!(self, Self::StagingLegacy | Self::Staging | Self::InTreeRbd | Self::BlockStaging)
    }
}

/// An rbd image named by an in-tree rbd directory (`<pool>-image-<image>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct RbdImage {
    pub pool: String,
    pub image: String,
}

/// One place kubelet keeps a volume: a mount point or, for raw block volumes, a device file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KubeletVolume {
    pub kind: VolumeKind,
    /// As the host sees it (`/var/lib/kubelet/...`, symlinks in the kubelet directory resolved):
    /// what mountinfo shows as the mount point, or the device file.
    pub path: PathBuf,
    /// Volume plugin, unescaped: `kubernetes.io/csi`, `kubernetes.io/rbd`, ... (empty for a
    /// subpath: kubelet names it by the pod's volume only).
    pub plugin: String,
    /// The name kubelet gave the volume's directory: the PV name for a volume from a
    /// PersistentVolume, the pod's volume name for an inline one (`volume-subpaths`: always the
    /// pod's volume name).
    pub spec_name: Option<String>,
    /// The PersistentVolume, when kubelet's files say it is one.
    pub pv_name: Option<String>,
    pub volume_handle: Option<String>,
    /// CSI driver (`driverName`).
    pub driver: Option<String>,
    pub pod_uid: Option<String>,
    /// `volumeLifecycleMode`: `Persistent`, or `Ephemeral` for a CSI inline volume.
    pub lifecycle_mode: Option<String>,
    pub node_name: Option<String>,
    /// The VolumeAttachment's name: `csi-` + sha256(volumeHandle + driver + node).
    pub attachment_id: Option<String>,
    /// In-tree rbd pool and image, from the directory name.
    pub rbd: Option<RbdImage>,
    /// The `vol_data.json` the identity was read from (host path).
    pub vol_data: Option<PathBuf>,
    /// Where a symlink points, as written (pod raw block volumes).
    pub link_target: Option<PathBuf>,
    /// The block device a raw block device file is (live nodes only; `None` on fixture trees).
    pub devnum: Option<DevNum>,
}

impl KubeletVolume {
    pub(crate) fn new(kind: VolumeKind, path: PathBuf, plugin: &str) -> Self {
        Self {
            kind,
            path,
            plugin: plugin.to_owned(),
            spec_name: None,
            pv_name: None,
            volume_handle: None,
            driver: None,
            pod_uid: None,
            lifecycle_mode: None,
            node_name: None,
            attachment_id: None,
            rbd: None,
            vol_data: None,
            link_target: None,
            devnum: None,
        }
    }

    fn with_vol_data(mut self, data: &VolData, file: PathBuf) -> Self {
        self.volume_handle = data.volume_handle.clone();
        self.driver = data.driver_name.clone();
        self.node_name = data.node_name.clone();
        self.attachment_id = data.attachment_id.clone();
        self.lifecycle_mode = data.volume_lifecycle_mode.clone();
        self.vol_data = Some(file);
        self
    }

    /// True when this in-tree rbd entry's directory is the one kubelet makes for `pool`/`image`.
    /// Compares the whole `<pool>-image-<image>` name, so it is right even where splitting the
    /// name is ambiguous (a pool ending in `-image`).
    pub fn names_rbd_image(&self, pool: &str, image: &str) -> bool {
        let dir = match self.kind {
            VolumeKind::InTreeRbd => self.path.file_name(),
            VolumeKind::BlockMapFile if self.plugin == RBD_PLUGIN => {
                self.path.parent().and_then(Path::file_name)
            }
            _ => None,
        };
        dir.and_then(|d| d.to_str()).is_some_and(|d| d == format!("{pool}-image-{image}"))
    }
}

/// What is wrong with one `vol_data.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum VolDataError {
    #[error("not JSON: {message}")]
    Json { message: String },
    #[error("not a JSON object")]
    NotAnObject,
    #[error("'{field}' is not a string")]
    NotAString { field: &'static str },
    #[error("'{field}' is missing or empty")]
    Missing { field: &'static str },
    #[error("larger than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("not UTF-8")]
    NotUtf8,
}

/// Something in the kubelet directory that could not be read or understood; the scan went on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "warning", rename_all = "snake_case")]
pub enum KubeletWarning {
    #[error("cannot read {}: {message}", path.display())]
    Read { path: PathBuf, message: String },
    #[error("malformed {}: {error}", path.display())]
    VolData { path: PathBuf, error: VolDataError },
    #[error("{} has no vol_data.json: driver and volume handle unknown", path.display())]
    MissingVolData { path: PathBuf },
    #[error("{}: directory {dir} is not sha256(volumeHandle) {expected}", path.display())]
    HashMismatch { path: PathBuf, dir: String, expected: String },
    #[error("{}: driverName '{driver}' is not its directory '{dir}'", path.display())]
    DriverMismatch { path: PathBuf, dir: String, driver: String },
    #[error("{}: specVolID '{spec_vol_id}' is not its directory '{dir}'", path.display())]
    SpecNameMismatch { path: PathBuf, dir: String, spec_vol_id: String },
    #[error("unexpected name {}: {reason}", path.display())]
    BadName { path: PathBuf, reason: &'static str },
}

/// The fields kubelet writes to a `vol_data.json` (a Go `map[string]string`). Which are present
/// depends on the writer: staging has `driverName` and `volumeHandle` (and 1.25+ may add
/// `seLinuxMountContext`); pod mounts add `specVolID`, `nodeName`, `attachmentID`,
/// `volumeLifecycleMode`; raw block `data/` has all but the lifecycle mode.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VolData {
    pub spec_vol_id: Option<String>,
    pub volume_handle: Option<String>,
    pub driver_name: Option<String>,
    pub node_name: Option<String>,
    pub attachment_id: Option<String>,
    pub volume_lifecycle_mode: Option<String>,
    pub selinux_mount_context: Option<String>,
}

/// Parses the text of a `vol_data.json`. `volumeHandle` and `driverName` are required (every
/// writer records them); other fields are optional, an empty string counts as absent, and keys
/// kubelet may add later are ignored.
pub fn parse_vol_data(text: &str) -> Result<VolData, VolDataError> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| VolDataError::Json { message: e.to_string().chars().take(200).collect() })?;
    let obj = value.as_object().ok_or(VolDataError::NotAnObject)?;
    let field = |key: &'static str| -> Result<Option<String>, VolDataError> {
        match obj.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) if s.is_empty() => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(VolDataError::NotAString { field: key }),
        }
    };
    let data = VolData {
        spec_vol_id: field("specVolID")?,
        volume_handle: field("volumeHandle")?,
        driver_name: field("driverName")?,
        node_name: field("nodeName")?,
        attachment_id: field("attachmentID")?,
        volume_lifecycle_mode: field("volumeLifecycleMode")?,
        selinux_mount_context: field("seLinuxMountContext")?,
    };
    if data.volume_handle.is_none() {
        return Err(VolDataError::Missing { field: "volumeHandle" });
    }
    if data.driver_name.is_none() {
        return Err(VolDataError::Missing { field: "driverName" });
    }
    Ok(data)
}

/// Splits an in-tree rbd directory name, `<pool>-image-<image>`, at the first `-image-`: pool
/// names cannot contain `-image-` (kubelet could not tell them apart either), image names may
/// contain anything. Ambiguous only for a pool ending in `-image` (`a-image-image-x`): use
/// [`KubeletVolume::names_rbd_image`] to match a known mapping.
pub fn parse_rbd_dir_name(name: &str) -> Option<RbdImage> {
    let (pool, image) = name.split_once("-image-")?;
    if pool.is_empty() || image.is_empty() {
        return None;
    }
    Some(RbdImage { pool: pool.to_owned(), image: image.to_owned() })
}

/// Lowercase hex SHA-256, as kubelet names 1.24+ staging directories.
pub fn sha256_hex(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Everything found in the kubelet directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KubeletScan {
    /// The kubelet directory as the host sees it, symlinks resolved.
    pub kubelet_dir: PathBuf,
    /// Sorted by path.
    pub volumes: Vec<KubeletVolume>,
    pub warnings: Vec<KubeletWarning>,
}

impl KubeletScan {
    /// Pod UIDs with a mount, subpath or device of the PV, sorted.
    pub fn pods_using(&self, pv: &str) -> Vec<&str> {
        let set: BTreeSet<&str> = self
            .volumes
            .iter()
            .filter(|v| v.pv_name.as_deref() == Some(pv))
            .filter_map(|v| v.pod_uid.as_deref())
            .collect();
        set.into_iter().collect()
    }

    /// Every entry of the PV.
    pub fn volumes_of_pv<'a>(&'a self, pv: &'a str) -> impl Iterator<Item = &'a KubeletVolume> + 'a {
        self.volumes.iter().filter(move |v| v.pv_name.as_deref() == Some(pv))
    }

    /// The entry a host mount point (from the host's mountinfo, unescaped) belongs to: the entry
    /// at that path, else the nearest entry above it (a driver's mount below a staging
    /// directory, like ceph-csi's `globalmount/<volumeHandle>`).
    pub fn find_by_mount_point(&self, mount_point: &str) -> Option<&KubeletVolume> {
        let mp = Path::new(mount_point);
        self.volumes.iter().filter(|v| mp.starts_with(&v.path)).max_by_key(|v| v.path.components().count())
    }

    /// The entry a path seen from another root names, such as a mount point in a container that
    /// mounts the host at `/host` (field-notes incident 5:
    /// `/host/data/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-...`): matched by the part
    /// below the kubelet directory, at that path or the nearest entry above it.
    pub fn find_by_foreign_path(&self, path: &str) -> Option<&KubeletVolume> {
        let comps: Vec<Component<'_>> = Path::new(path).components().collect();
        let mut best: Option<(usize, &KubeletVolume)> = None;
        for v in &self.volumes {
            let Ok(rel) = v.path.strip_prefix(&self.kubelet_dir) else { continue };
            let rel: Vec<Component<'_>> = rel.components().collect();
            if rel.is_empty() || rel.len() > comps.len() {
                continue;
            }
            let found = comps.windows(rel.len()).any(|w| w == rel.as_slice());
            if found && best.is_none_or(|(n, _)| rel.len() > n) {
                best = Some((rel.len(), v));
            }
        }
        best.map(|(_, v)| v)
    }

    /// The raw block map file a loop device's backing file (as sysfs prints it) is, exactly or
    /// seen from another root.
    pub fn find_by_backing_file(&self, backing_file: &str) -> Option<&KubeletVolume> {
        let file = backing_file.trim_end().trim_end_matches(" (deleted)");
        let is_map = |v: &&KubeletVolume| v.kind == VolumeKind::BlockMapFile;
        self.volumes
            .iter()
            .filter(is_map)
            .find(|v| v.path == Path::new(file))
            .or_else(|| self.find_by_foreign_path(file).filter(is_map))
            .filter(|v| {
                v.path.strip_prefix(&self.kubelet_dir).is_ok_and(|rel| Path::new(file).ends_with(rel))
            })
    }

    /// Raw block entries that are the device `dev` (live nodes).
    pub fn find_by_devnum(&self, dev: DevNum) -> Vec<&KubeletVolume> {
        self.volumes.iter().filter(|v| v.devnum == Some(dev)).collect()
    }
}

#[cfg(test)]
mod tests;
