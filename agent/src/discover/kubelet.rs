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

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use super::DiscoverError;
use crate::host::HostRoot;
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
    fn new(kind: VolumeKind, path: PathBuf, plugin: &str) -> Self {
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

/// Reads the kubelet directory `kubelet_dir` (as the host sees it, e.g. [`DEFAULT_KUBELET_DIR`])
/// through `host`. A missing directory is an empty scan; only an unreadable kubelet directory is
/// an error, everything below it is a warning.
pub fn scan(host: &HostRoot, kubelet_dir: &Path) -> Result<KubeletScan, DiscoverError> {
    let local = host.host_path(kubelet_dir);
    let host_dir = match resolve_host_path(host, kubelet_dir) {
        Ok(resolved) => resolved,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(KubeletScan { kubelet_dir: kubelet_dir.to_owned(), ..KubeletScan::default() });
        }
        Err(e) => return Err(DiscoverError::read(&local, e)),
    };
    let local_dir = host.host_path(&host_dir);
    match std::fs::symlink_metadata(&local_dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(DiscoverError::read(&local_dir, io::Error::from_raw_os_error(libc::ENOTDIR))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(KubeletScan { kubelet_dir: host_dir, ..KubeletScan::default() });
        }
        Err(e) => return Err(DiscoverError::read(&local_dir, e)),
    }
    if let Err(e) = std::fs::read_dir(&local_dir) {
        return Err(DiscoverError::read(&local_dir, e));
    }
    let mut walk = Walk { host, host_dir, local_dir, volumes: Vec::new(), warnings: Vec::new() };
    walk.pods();
    walk.csi();
    walk.rbd();
    walk.finish();
    let Walk { host_dir, volumes, warnings, .. } = walk;
    Ok(KubeletScan { kubelet_dir: host_dir, volumes, warnings })
}

/// What reading one `vol_data.json` gave.
enum Found {
    Absent,
    Unusable,
    Data(VolData),
}

struct Walk<'a> {
    host: &'a HostRoot,
    /// The kubelet directory as the host sees it.
    host_dir: PathBuf,
    /// The same, as this process reaches it.
    local_dir: PathBuf,
    volumes: Vec<KubeletVolume>,
    warnings: Vec<KubeletWarning>,
}

impl Walk<'_> {
    fn host_path(&self, rel: &Path) -> PathBuf {
        self.host_dir.join(rel)
    }

    /// Names in a directory below the kubelet directory, sorted; none when it does not exist (or
    /// vanished mid-scan), a warning when it cannot be read.
    fn list(&mut self, rel: &Path) -> Vec<String> {
        match std::fs::read_dir(self.local_dir.join(rel)) {
            Ok(rd) => {
                let mut names: Vec<String> =
                    rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
                names.sort();
                names
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                self.warn_read(rel, &e);
                Vec::new()
            }
        }
    }

    fn is_dir(&self, rel: &Path) -> bool {
        std::fs::symlink_metadata(self.local_dir.join(rel)).is_ok_and(|m| m.is_dir())
    }

    fn warn_read(&mut self, rel: &Path, e: &io::Error) {
        self.warnings.push(KubeletWarning::Read { path: self.host_path(rel), message: e.to_string() });
    }

    fn warn(&mut self, w: KubeletWarning) {
        self.warnings.push(w);
    }

    fn read_vol_data(&mut self, rel: &Path) -> Found {
        let file = self.local_dir.join(rel);
        let text = match read_limited(&file) {
            Ok(Ok(text)) => text,
            Ok(Err(error)) => {
                self.warn(KubeletWarning::VolData { path: self.host_path(rel), error });
                return Found::Unusable;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Found::Absent,
            Err(e) => {
                self.warn_read(rel, &e);
                return Found::Unusable;
            }
        };
        match parse_vol_data(&text) {
            Ok(data) => Found::Data(data),
            Err(error) => {
                self.warn(KubeletWarning::VolData { path: self.host_path(rel), error });
                Found::Unusable
            }
        }
    }

    /// The device number of a raw block device file, following symlinks as the host would.
    fn devnum(&self, rel: &Path) -> Option<DevNum> {
        let resolved = resolve_host_path(self.host, &self.host_path(rel)).ok()?;
        let meta = std::fs::symlink_metadata(self.host.host_path(&resolved)).ok()?;
        meta.file_type().is_block_device().then(|| DevNum::from_dev_t(meta.rdev()))
    }

    fn push(&mut self, v: KubeletVolume) {
        self.volumes.push(v);
    }

    /// `pods/<uid>/{volumes,volumeDevices,volume-subpaths}`.
    fn pods(&mut self) {
        for uid in self.list(Path::new("pods")) {
            let pod = Path::new("pods").join(&uid);
            for plugin_dir in self.list(&pod.join("volumes")) {
                if NOT_BLOCK_PLUGINS.contains(&plugin_dir.as_str()) {
                    continue;
                }
                let plugin = plugin_dir.replace('~', "/");
                for name in self.list(&pod.join("volumes").join(&plugin_dir)) {
                    let rel = pod.join("volumes").join(&plugin_dir).join(&name);
                    if plugin == CSI_PLUGIN {
                        self.pod_csi_mount(&rel, &uid, &name);
                    } else {
                        let mut v = KubeletVolume::new(VolumeKind::PodMount, self.host_path(&rel), &plugin);
                        v.spec_name = Some(name);
                        v.pod_uid = Some(uid.clone());
                        self.push(v);
                    }
                }
            }
            for plugin_dir in self.list(&pod.join("volumeDevices")) {
                let plugin = plugin_dir.replace('~', "/");
                for name in self.list(&pod.join("volumeDevices").join(&plugin_dir)) {
                    let rel = pod.join("volumeDevices").join(&plugin_dir).join(&name);
                    let mut v = KubeletVolume::new(VolumeKind::PodDevice, self.host_path(&rel), &plugin);
                    v.link_target = std::fs::read_link(self.local_dir.join(&rel)).ok();
                    v.devnum = self.devnum(&rel);
                    if plugin == CSI_PLUGIN {
                        // CSI raw block volumes come from PVs only (no inline block volumes).
                        v.pv_name = Some(name.clone());
                    }
                    v.spec_name = Some(name);
                    v.pod_uid = Some(uid.clone());
                    self.push(v);
                }
            }
            let subpaths = pod.join("volume-subpaths");
            for volume in self.list(&subpaths) {
                for container in self.list(&subpaths.join(&volume)) {
                    for index in self.list(&subpaths.join(&volume).join(&container)) {
                        let rel = subpaths.join(&volume).join(&container).join(&index);
                        let mut v = KubeletVolume::new(VolumeKind::PodSubpath, self.host_path(&rel), "");
                        v.spec_name = Some(volume.clone());
                        v.pod_uid = Some(uid.clone());
                        self.push(v);
                    }
                }
            }
        }
    }

    /// `pods/<uid>/volumes/kubernetes.io~csi/<name>/{vol_data.json,mount}`.
    fn pod_csi_mount(&mut self, rel: &Path, uid: &str, name: &str) {
        let file = rel.join(VOL_DATA);
        let mut v = KubeletVolume::new(VolumeKind::PodMount, self.host_path(&rel.join("mount")), CSI_PLUGIN);
        v.spec_name = Some(name.to_owned());
        v.pod_uid = Some(uid.to_owned());
        match self.read_vol_data(&file) {
            Found::Data(data) => {
                if let Some(spec) = data.spec_vol_id.as_deref().filter(|s| *s != name) {
                    self.warn(KubeletWarning::SpecNameMismatch {
                        path: self.host_path(&file),
                        dir: name.to_owned(),
                        spec_vol_id: spec.to_owned(),
                    });
                }
                let ephemeral = data.volume_lifecycle_mode.as_deref() == Some("Ephemeral");
                v = v.with_vol_data(&data, self.host_path(&file));
                if !ephemeral {
                    v.pv_name = Some(name.to_owned());
                }
            }
            Found::Absent => self.warn(KubeletWarning::MissingVolData { path: self.host_path(rel) }),
            Found::Unusable => {}
        }
        self.push(v);
    }

    /// `plugins/kubernetes.io/csi/`: `pv/` (staging before 1.24), `volumeDevices/` (raw block),
    /// and one directory per driver (staging from 1.24).
    fn csi(&mut self) {
        let csi = Path::new("plugins/kubernetes.io/csi");
        for entry in self.list(csi) {
            match entry.as_str() {
                "pv" => self.csi_legacy_staging(&csi.join("pv")),
                "volumeDevices" => self.csi_block(&csi.join("volumeDevices")),
                driver if self.is_dir(&csi.join(driver)) => self.csi_staging(&csi.join(driver), driver),
                _ => {}
            }
        }
    }

    fn csi_legacy_staging(&mut self, pv_root: &Path) {
        for pv in self.list(pv_root) {
            let dir = pv_root.join(&pv);
            let mut v = KubeletVolume::new(
                VolumeKind::StagingLegacy,
                self.host_path(&dir.join(GLOBAL_MOUNT)),
                CSI_PLUGIN,
            );
            v.spec_name = Some(pv.clone());
            v.pv_name = Some(pv);
            match self.read_vol_data(&dir.join(VOL_DATA)) {
                Found::Data(data) => v = v.with_vol_data(&data, self.host_path(&dir.join(VOL_DATA))),
                Found::Absent => self.warn(KubeletWarning::MissingVolData { path: self.host_path(&dir) }),
                Found::Unusable => {}
            }
            self.push(v);
        }
    }

    fn csi_staging(&mut self, driver_root: &Path, driver: &str) {
        for hash in self.list(driver_root) {
            let dir = driver_root.join(&hash);
            let is_hash = hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
            let names = if self.is_dir(&dir) { self.list(&dir) } else { Vec::new() };
            let kubelets = names.iter().any(|n| n == VOL_DATA || n == GLOBAL_MOUNT);
            if !is_hash {
                // Not kubelet's unless it holds what kubelet puts there.
                if kubelets {
                    self.warn(KubeletWarning::BadName {
                        path: self.host_path(&dir),
                        reason: "a CSI staging directory is named by 64 hex digits",
                    });
                } else {
                    continue;
                }
            }
            let mut v =
                KubeletVolume::new(VolumeKind::Staging, self.host_path(&dir.join(GLOBAL_MOUNT)), CSI_PLUGIN);
            let file = dir.join(VOL_DATA);
            match self.read_vol_data(&file) {
                Found::Data(data) => {
                    if let Some(d) = data.driver_name.as_deref().filter(|d| *d != driver) {
                        self.warn(KubeletWarning::DriverMismatch {
                            path: self.host_path(&file),
                            dir: driver.to_owned(),
                            driver: d.to_owned(),
                        });
                    }
                    if let Some(handle) = data.volume_handle.as_deref() {
                        let expected = sha256_hex(handle);
                        if is_hash && expected != hash {
                            self.warn(KubeletWarning::HashMismatch {
                                path: self.host_path(&file),
                                dir: hash.clone(),
                                expected,
                            });
                        }
                    }
                    v = v.with_vol_data(&data, self.host_path(&file));
                }
                Found::Absent => self.warn(KubeletWarning::MissingVolData { path: self.host_path(&dir) }),
                Found::Unusable => {}
            }
            if v.driver.is_none() {
                // The directory is named by the driver even when its vol_data.json is unusable.
                v.driver = Some(driver.to_owned());
            }
            self.push(v);
        }
    }

    /// `plugins/kubernetes.io/csi/volumeDevices/{<pv>/{data,dev},staging/<pv>,publish/<pv>/<uid>}`.
    /// Identity is filled in by [`Walk::finish`] from each PV's `data/vol_data.json`.
    fn csi_block(&mut self, root: &Path) {
        for entry in self.list(root) {
            match entry.as_str() {
                "staging" => {
                    for pv in self.list(&root.join("staging")) {
                        let rel = root.join("staging").join(&pv);
                        let mut v =
                            KubeletVolume::new(VolumeKind::BlockStaging, self.host_path(&rel), CSI_PLUGIN);
                        v.spec_name = Some(pv.clone());
                        v.pv_name = Some(pv);
                        self.push(v);
                    }
                }
                "publish" => {
                    for pv in self.list(&root.join("publish")) {
                        let rel = root.join("publish").join(&pv);
                        // Before kubelet 1.18 the publish path was the file publish/<pv> itself.
                        let pods = if self.is_dir(&rel) { self.list(&rel) } else { vec![String::new()] };
                        for uid in pods {
                            let file = if uid.is_empty() { rel.clone() } else { rel.join(&uid) };
                            let mut v = KubeletVolume::new(
                                VolumeKind::BlockPublish,
                                self.host_path(&file),
                                CSI_PLUGIN,
                            );
                            v.spec_name = Some(pv.clone());
                            v.pv_name = Some(pv.clone());
                            v.pod_uid = (!uid.is_empty()).then_some(uid);
                            v.devnum = self.devnum(&file);
                            self.push(v);
                        }
                    }
                }
                pv => {
                    let dev = root.join(pv).join("dev");
                    for uid in self.list(&dev) {
                        let file = dev.join(&uid);
                        let mut v =
                            KubeletVolume::new(VolumeKind::BlockMapFile, self.host_path(&file), CSI_PLUGIN);
                        v.spec_name = Some(pv.to_owned());
                        v.pv_name = Some(pv.to_owned());
                        v.pod_uid = Some(uid);
                        v.devnum = self.devnum(&file);
                        self.push(v);
                    }
                }
            }
        }
    }

    /// Raw block identity of one PV, `volumeDevices/<pv>/data/vol_data.json`.
    fn csi_block_data(&mut self, pv: &str) -> Option<(VolData, PathBuf)> {
        let file = Path::new("plugins/kubernetes.io/csi/volumeDevices").join(pv).join("data").join(VOL_DATA);
        match self.read_vol_data(&file) {
            Found::Data(data) => {
                if let Some(spec) = data.spec_vol_id.as_deref().filter(|s| *s != pv) {
                    self.warn(KubeletWarning::SpecNameMismatch {
                        path: self.host_path(&file),
                        dir: pv.to_owned(),
                        spec_vol_id: spec.to_owned(),
                    });
                }
                Some((data, self.host_path(&file)))
            }
            Found::Absent => {
                self.warn(KubeletWarning::MissingVolData { path: self.host_path(file.parent()?) });
                None
            }
            Found::Unusable => None,
        }
    }

    /// `plugins/kubernetes.io/rbd/{mounts,rbd}/<pool>-image-<image>` and
    /// `plugins/kubernetes.io/rbd/volumeDevices/<pool>-image-<image>/<uid>`.
    fn rbd(&mut self) {
        let root = Path::new("plugins/kubernetes.io/rbd");
        for sub in ["mounts", "rbd"] {
            for name in self.list(&root.join(sub)) {
                let rel = root.join(sub).join(&name);
                let mut v = KubeletVolume::new(VolumeKind::InTreeRbd, self.host_path(&rel), RBD_PLUGIN);
                v.rbd = self.rbd_name(&rel, &name);
                self.push(v);
            }
        }
        let devices = root.join("volumeDevices");
        for name in self.list(&devices) {
            let rbd = self.rbd_name(&devices.join(&name), &name);
            for uid in self.list(&devices.join(&name)) {
                let file = devices.join(&name).join(&uid);
                let mut v = KubeletVolume::new(VolumeKind::BlockMapFile, self.host_path(&file), RBD_PLUGIN);
                v.rbd = rbd.clone();
                v.pod_uid = Some(uid);
                v.devnum = self.devnum(&file);
                self.push(v);
            }
        }
    }

    fn rbd_name(&mut self, rel: &Path, name: &str) -> Option<RbdImage> {
        let parsed = parse_rbd_dir_name(name);
        if parsed.is_none() {
            self.warn(KubeletWarning::BadName {
                path: self.host_path(rel),
                reason: "an in-tree rbd directory is named <pool>-image-<image>",
            });
        }
        parsed
    }

    /// Joins what one place knows to the others: raw block identity by PV name, and the PV of a
    /// 1.24+ staging directory by driver and volume handle.
    fn finish(&mut self) {
        let is_csi_block = |v: &KubeletVolume| {
            v.plugin == CSI_PLUGIN
                && matches!(
                    v.kind,
                    VolumeKind::BlockMapFile
                        | VolumeKind::BlockPublish
                        | VolumeKind::BlockStaging
                        | VolumeKind::PodDevice
                )
        };
        let block_pvs: BTreeSet<String> =
            self.volumes.iter().filter(|v| is_csi_block(v)).filter_map(|v| v.pv_name.clone()).collect();
        let mut block_data = BTreeMap::new();
        for pv in block_pvs {
            if let Some(found) = self.csi_block_data(&pv) {
                block_data.insert(pv, found);
            }
        }
        for v in self.volumes.iter_mut().filter(|v| is_csi_block(v)) {
            if let Some((data, file)) = v.pv_name.as_ref().and_then(|pv| block_data.get(pv)) {
                *v = v.clone().with_vol_data(data, file.clone());
            }
        }

        let mut pv_of: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for v in &self.volumes {
            if let (Some(d), Some(h), Some(pv)) = (&v.driver, &v.volume_handle, &v.pv_name) {
                pv_of.entry((d.clone(), h.clone())).or_default().insert(pv.clone());
            }
        }
        for v in self.volumes.iter_mut().filter(|v| v.kind == VolumeKind::Staging && v.pv_name.is_none()) {
            let (Some(d), Some(h)) = (&v.driver, &v.volume_handle) else { continue };
            if let Some(pvs) = pv_of.get(&(d.clone(), h.clone())).filter(|s| s.len() == 1) {
                v.pv_name = pvs.iter().next().cloned();
            }
        }
        self.volumes.sort_by(|a, b| a.path.cmp(&b.path).then(a.kind.cmp(&b.kind)));
    }
}

/// Reads a small file as UTF-8: the outer error is I/O, the inner what is wrong with the content.
fn read_limited(path: &Path) -> io::Result<Result<String, VolDataError>> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_VOL_DATA + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_VOL_DATA {
        return Ok(Err(VolDataError::TooLarge { limit: MAX_VOL_DATA }));
    }
    Ok(String::from_utf8(bytes).map_err(|_| VolDataError::NotUtf8))
}

/// Resolves the symlinks in a host path as the host would, reading through `host`: an absolute
/// link target starts again from the host's root, not this process's. Every component must exist.
fn resolve_host_path(host: &HostRoot, path: &Path) -> io::Result<PathBuf> {
    let mut todo: Vec<OsString> = Vec::new();
    push_components(&mut todo, path);
    let mut done = PathBuf::from("/");
    let mut hops = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            done.pop();
            continue;
        }
        let candidate = done.join(&name);
        let local = host.host_path(&candidate);
        let meta = std::fs::symlink_metadata(&local)?;
        if !meta.file_type().is_symlink() {
            done = candidate;
            continue;
        }
        hops += 1;
        if hops > 40 {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        let target = std::fs::read_link(&local)?;
        if target.is_absolute() {
            done = PathBuf::from("/");
        }
        push_components(&mut todo, &target);
    }
    Ok(done)
}

/// Pushes a path's names in reverse, so that popping yields them in order (`..` kept, `.` dropped).
fn push_components(todo: &mut Vec<OsString>, path: &Path) {
    for c in path.components().rev() {
        match c {
            Component::Normal(n) => todo.push(n.to_owned()),
            Component::ParentDir => todo.push(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/kubelet");
    const KUBELET: &str = "/var/lib/kubelet";
    const DRIVER: &str = "rbd.csi.ceph.com";
    const NODE: &str = "mec52";

    fn fixture(tree: &str) -> KubeletScan {
        let host = HostRoot::new(format!("{FIXTURES}/{tree}"));
        scan(&host, Path::new(DEFAULT_KUBELET_DIR)).expect("scan")
    }

    fn ceph_handle(image_uuid: &str) -> String {
        format!("0001-0024-b2e1c3d4-5f60-4a7b-8c9d-0e1f2a3b4c5d-0000000000000002-{image_uuid}")
    }

    fn at<'a>(s: &'a KubeletScan, path: &str) -> &'a KubeletVolume {
        s.volumes.iter().find(|v| v.path == Path::new(path)).unwrap_or_else(|| panic!("no entry {path}"))
    }

    fn kinds(s: &KubeletScan) -> Vec<VolumeKind> {
        s.volumes.iter().map(|v| v.kind).collect()
    }

    #[test]
    fn pre_1_24_staging_by_pv_name() {
        let s = fixture("pre-1.24");
        assert_eq!(s.warnings, vec![]);
        assert_eq!(s.kubelet_dir, Path::new(KUBELET));
        // The projected service-account volume is not a block device.
        assert_eq!(kinds(&s), vec![VolumeKind::StagingLegacy, VolumeKind::PodMount]);
        let pv = "pvc-0a5eb91b-3c1d-4e7f-9a2b-6c8d0e1f2a3b";
        let pod = "7d3c1e2f-4a5b-4c6d-8e9f-0a1b2c3d4e5f";
        let handle = ceph_handle("10ff5cc1-3b7e-11ee-9c2a-0a580a800021");
        let stage_dir = format!("{KUBELET}/plugins/kubernetes.io/csi/pv/{pv}");
        let stage = at(&s, &format!("{stage_dir}/globalmount"));
        assert_eq!(stage.pv_name.as_deref(), Some(pv));
        assert_eq!(stage.volume_handle.as_deref(), Some(handle.as_str()));
        assert_eq!(stage.driver.as_deref(), Some(DRIVER));
        assert_eq!(stage.vol_data, Some(PathBuf::from(format!("{stage_dir}/vol_data.json"))));
        assert_eq!(stage.pod_uid, None);

        let mount = format!("{KUBELET}/pods/{pod}/volumes/kubernetes.io~csi/{pv}/mount");
        let m = at(&s, &mount);
        assert_eq!(m.kind, VolumeKind::PodMount);
        assert_eq!((m.pv_name.as_deref(), m.pod_uid.as_deref()), (Some(pv), Some(pod)));
        assert_eq!(m.volume_handle.as_deref(), Some(handle.as_str()));
        assert_eq!(m.node_name.as_deref(), Some(NODE));
        assert_eq!(m.lifecycle_mode.as_deref(), Some("Persistent"));
        let attach = format!("csi-{}", sha256_hex(&format!("{handle}{DRIVER}{NODE}")));
        assert_eq!(m.attachment_id.as_deref(), Some(attach.as_str()));
        assert_eq!(s.pods_using(pv), vec![pod]);

        // ceph-csi mounts at globalmount/<volumeHandle>: that is the staging entry.
        let ceph_mount = format!("{stage_dir}/globalmount/{handle}");
        assert_eq!(s.find_by_mount_point(&ceph_mount).map(|v| v.kind), Some(VolumeKind::StagingLegacy));
        assert_eq!(s.find_by_mount_point(&mount).map(|v| v.kind), Some(VolumeKind::PodMount));
        assert_eq!(s.find_by_mount_point(&format!("{KUBELET}/pods/{pod}")), None);
        assert_eq!(s.find_by_mount_point("/"), None);
    }

    #[test]
    fn post_1_24_staging_by_driver_and_handle_hash() {
        let s = fixture("post-1.24");
        assert_eq!(s.warnings, vec![], "the directory is sha256 of the handle");
        let pv = "pvc-5f2d7c44-9e1a-4b3c-8d6e-2a4b6c8d0e1f";
        let handle = ceph_handle("6a2e9c0d-4f1b-11ee-8a7c-0a580a800022");
        let hash = sha256_hex(&handle);
        assert_eq!(hash, "b2c31e81a30fedc9869133305a5cb7b059c7aa2b129e5d7e0a7fd759b7cb1619");
        let stage = at(&s, &format!("{KUBELET}/plugins/kubernetes.io/csi/{DRIVER}/{hash}/globalmount"));
        assert_eq!(stage.kind, VolumeKind::Staging);
        assert_eq!(stage.driver.as_deref(), Some(DRIVER));
        assert_eq!(stage.volume_handle.as_deref(), Some(handle.as_str()));
        // Not in the staging vol_data.json: taken from the pod mounts of the same handle.
        assert_eq!(stage.pv_name.as_deref(), Some(pv));
        let pods = ["1b2c3d4e-5f60-4718-a9b0-c1d2e3f40516", "9e8d7c6b-5a49-4837-b261-50f4e3d2c1b0"];
        assert_eq!(s.pods_using(pv), pods.to_vec());
        assert_eq!(s.volumes_of_pv(pv).count(), 3);

        // A CSI ephemeral inline volume has no PV.
        let inline =
            format!("{KUBELET}/pods/{}/volumes/kubernetes.io~csi/secrets-store-inline/mount", pods[0]);
        let v = at(&s, &inline);
        assert_eq!(v.pv_name, None);
        assert_eq!(v.spec_name.as_deref(), Some("secrets-store-inline"));
        assert_eq!(v.lifecycle_mode.as_deref(), Some("Ephemeral"));
        assert_eq!(v.driver.as_deref(), Some("secrets-store.csi.k8s.io"));
        let inline_handle = format!("csi-{}", sha256_hex(&format!("{}secrets-store-inline", pods[0])));
        assert_eq!(v.volume_handle.as_deref(), Some(inline_handle.as_str()));
    }

    #[test]
    fn raw_block_volume_and_its_loop_backing_file() {
        let s = fixture("raw-block");
        assert_eq!(s.warnings, vec![]);
        let pv = "pvc-c3a9d1e5-7b2f-4e8a-9c0d-1e2f3a4b5c6d";
        let pod = "4f3e2d1c-0b9a-4887-9665-544332211000";
        let handle = ceph_handle("93b1f0a2-5c3d-11ee-b1e4-0a580a800023");
        let vd = format!("{KUBELET}/plugins/kubernetes.io/csi/volumeDevices");
        let map_file = format!("{vd}/{pv}/dev/{pod}");
        let publish = format!("{vd}/publish/{pv}/{pod}");
        let data = PathBuf::from(format!("{vd}/{pv}/data/vol_data.json"));
        for (path, kind, pod_uid) in [
            (map_file.clone(), VolumeKind::BlockMapFile, Some(pod)),
            (publish.clone(), VolumeKind::BlockPublish, Some(pod)),
            (format!("{vd}/staging/{pv}"), VolumeKind::BlockStaging, None),
            (
                format!("{KUBELET}/pods/{pod}/volumeDevices/kubernetes.io~csi/{pv}"),
                VolumeKind::PodDevice,
                Some(pod),
            ),
        ] {
            let v = at(&s, &path);
            assert_eq!(v.kind, kind, "{path}");
            assert_eq!(v.pv_name.as_deref(), Some(pv), "{path}");
            assert_eq!(v.pod_uid.as_deref(), pod_uid, "{path}");
            assert_eq!(v.volume_handle.as_deref(), Some(handle.as_str()), "{path}");
            assert_eq!(v.driver.as_deref(), Some(DRIVER), "{path}");
            assert_eq!(v.vol_data.as_ref(), Some(&data), "{path}");
            assert_eq!(v.devnum, None, "fixture files are not device nodes");
        }
        assert_eq!(s.volumes.len(), 4);
        let link = at(&s, &format!("{KUBELET}/pods/{pod}/volumeDevices/kubernetes.io~csi/{pv}"));
        assert_eq!(link.link_target, Some(PathBuf::from(&publish)));
        assert_eq!(s.pods_using(pv), vec![pod]);

        // What sysfs shows as the loop device's backing file.
        assert_eq!(s.find_by_backing_file(&map_file).map(|v| v.kind), Some(VolumeKind::BlockMapFile));
        let deleted = format!("{map_file} (deleted)");
        assert_eq!(s.find_by_backing_file(&deleted).map(|v| &v.path), Some(&PathBuf::from(&map_file)));
        assert!(s.find_by_backing_file(&publish).is_none(), "only map files are loop backing files");
        // ceph-csi bind-mounts the device at staging/<pv>/<volumeHandle>.
        let staged = format!("{vd}/staging/{pv}/{handle}");
        assert_eq!(s.find_by_mount_point(&staged).map(|v| v.kind), Some(VolumeKind::BlockStaging));
        assert_eq!(s.find_by_mount_point(&map_file).map(|v| v.kind), Some(VolumeKind::BlockMapFile));
    }

    #[test]
    fn in_tree_rbd_mounts_and_devices() {
        let s = fixture("in-tree-rbd");
        assert_eq!(s.warnings, vec![]);
        let image = "kubernetes-dynamic-pvc-0a5eb91b-8a0b-11e8-9a3b-fa163e6f1a5c";
        let global = format!("{KUBELET}/plugins/kubernetes.io/rbd/mounts/k8s-image-{image}");
        let g = at(&s, &global);
        assert_eq!(g.kind, VolumeKind::InTreeRbd);
        assert_eq!(g.plugin, "kubernetes.io/rbd");
        assert_eq!(g.rbd, Some(RbdImage { pool: "k8s".into(), image: image.into() }));
        assert!(g.names_rbd_image("k8s", image));
        assert!(!g.names_rbd_image("k8s", "other"));
        // Left by an old kubelet: rbd/rbd/, with a pool that has a dash.
        let old = at(&s, &format!("{KUBELET}/plugins/kubernetes.io/rbd/rbd/rbd-k8s-image-cephimage2"));
        assert_eq!(old.rbd, Some(RbdImage { pool: "rbd-k8s".into(), image: "cephimage2".into() }));

        let pod = "5d1c7c2e-8a0b-11e8-9a3b-fa163e6f1a5c";
        let pv = "pvc-0a5eb91b-8a0b-11e8-9a3b-fa163e6f1a5c";
        let m = at(&s, &format!("{KUBELET}/pods/{pod}/volumes/kubernetes.io~rbd/{pv}"));
        assert_eq!((m.kind, m.plugin.as_str()), (VolumeKind::PodMount, "kubernetes.io/rbd"));
        assert_eq!((m.spec_name.as_deref(), m.pv_name.as_deref()), (Some(pv), None));
        assert_eq!(m.pod_uid.as_deref(), Some(pod));

        let pod_e = "6e2d8d3f-8a0b-11e8-9a3b-fa163e6f1a5c";
        let image_e = "kubernetes-dynamic-pvc-3c9e0d7a-8a0b-11e8-9a3b-fa163e6f1a5c";
        let map =
            at(&s, &format!("{KUBELET}/plugins/kubernetes.io/rbd/volumeDevices/k8s-image-{image_e}/{pod_e}"));
        assert_eq!(map.kind, VolumeKind::BlockMapFile);
        assert_eq!(map.rbd, Some(RbdImage { pool: "k8s".into(), image: image_e.into() }));
        assert!(map.names_rbd_image("k8s", image_e));
        assert_eq!(map.pod_uid.as_deref(), Some(pod_e));
        let dev = at(&s, &format!("{KUBELET}/pods/{pod_e}/volumeDevices/kubernetes.io~rbd/pvc-3c9e0d7a-8a0b-11e8-9a3b-fa163e6f1a5c"));
        assert_eq!(dev.link_target, Some(PathBuf::from("/dev/rbd1")));
        assert_eq!(dev.pv_name, None);
        assert_eq!(s.volumes.len(), 5);

        // Field-notes incident 5: node_exporter mounts the host at /host and keeps its own copy.
        let seen = format!("/host/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-{image}");
        assert_eq!(s.find_by_foreign_path(&seen).map(|v| &v.path), Some(&PathBuf::from(&global)));
        assert_eq!(s.find_by_foreign_path("/host/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts"), None);
        assert_eq!(s.find_by_mount_point(&seen), None, "not a host path");
    }

    #[test]
    fn malformed_files_are_warnings_and_the_scan_goes_on() {
        let s = fixture("malformed");
        let base = format!("{KUBELET}/pods/0c0ffee0-1234-4abc-8def-0123456789ab/volumes/kubernetes.io~csi");
        let file = |name: &str| PathBuf::from(format!("{base}/{name}/vol_data.json"));
        let vol_data_error = |name: &str| {
            s.warnings.iter().find_map(|w| match w {
                KubeletWarning::VolData { path, error } if *path == file(name) => Some(error.clone()),
                _ => None,
            })
        };
        assert!(matches!(vol_data_error("pvc-truncated"), Some(VolDataError::Json { .. })));
        assert!(matches!(vol_data_error("pvc-empty"), Some(VolDataError::Json { .. })));
        assert_eq!(vol_data_error("pvc-no-driver"), Some(VolDataError::Missing { field: "driverName" }));
        assert_eq!(vol_data_error("pvc-number"), Some(VolDataError::NotAString { field: "volumeHandle" }));
        let missing = PathBuf::from(format!("{base}/pvc-no-vol-data"));
        assert!(s.warnings.contains(&KubeletWarning::MissingVolData { path: missing }));
        let bad_rbd = PathBuf::from(format!("{KUBELET}/plugins/kubernetes.io/rbd/mounts/not-an-rbd-mount"));
        assert!(s
            .warnings
            .iter()
            .any(|w| matches!(w, KubeletWarning::BadName { path, .. } if *path == bad_rbd)));
        assert_eq!(s.warnings.len(), 7, "{:#?}", s.warnings);
        // Every warning names its file.
        for w in &s.warnings {
            assert!(w.to_string().contains(KUBELET), "{w}");
        }

        // Entries are kept, with what is known.
        let truncated = at(&s, &format!("{base}/pvc-truncated/mount"));
        assert_eq!((truncated.volume_handle.as_ref(), truncated.pv_name.as_ref()), (None, None));
        assert_eq!(truncated.spec_name.as_deref(), Some("pvc-truncated"));
        assert!(at(&s, &bad_rbd.to_string_lossy()).rbd.is_none());
        let ok = at(&s, &format!("{base}/pvc-11111111-2222-4333-8444-555555555555/mount"));
        assert_eq!(ok.driver.as_deref(), Some(DRIVER));
        assert_eq!(s.volumes.len(), 8);
    }

    #[test]
    fn staging_directory_must_be_sha256_of_the_handle() {
        let s = fixture("malformed");
        let named_for = ceph_handle("bb22cc33-6d5e-11ee-8f00-0a580a800025");
        let recorded = ceph_handle("cc33dd44-6d5e-11ee-8f00-0a580a800026");
        let dir = sha256_hex(&named_for);
        let w =
            s.warnings.iter().find(|w| matches!(w, KubeletWarning::HashMismatch { .. })).expect("mismatch");
        let file = PathBuf::from(format!("{KUBELET}/plugins/kubernetes.io/csi/{DRIVER}/{dir}/vol_data.json"));
        assert_eq!(
            w,
            &KubeletWarning::HashMismatch { path: file, dir: dir.clone(), expected: sha256_hex(&recorded) }
        );
        // The staging entry is still there, with the handle its file records.
        let stage = at(&s, &format!("{KUBELET}/plugins/kubernetes.io/csi/{DRIVER}/{dir}/globalmount"));
        assert_eq!(stage.volume_handle.as_deref(), Some(recorded.as_str()));
        // FIPS 180-2 test vectors.
        assert_eq!(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn missing_kubelet_directory_is_empty() {
        let s = scan(&HostRoot::new("/nonexistent"), Path::new(DEFAULT_KUBELET_DIR)).expect("no kubelet");
        assert_eq!((s.volumes.len(), s.warnings.len()), (0, 0));
        // A tree with a kubelet directory elsewhere than asked.
        let s =
            scan(&HostRoot::new(format!("{FIXTURES}/pre-1.24")), Path::new("/data/kubelet")).expect("scan");
        assert_eq!((s.volumes.len(), s.warnings.len()), (0, 0));
        // A file where the directory should be is an error naming it.
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::write(tmp.path().join("kubelet"), "").expect("write");
        let e = scan(&HostRoot::new(tmp.path()), Path::new("/kubelet")).expect_err("not a directory");
        assert!(e.to_string().contains("kubelet"), "{e}");
    }

    #[test]
    fn vol_data_parser() {
        let kubelet = r#"{"attachmentID":"csi-1","driverName":"rbd.csi.ceph.com","nodeName":"mec52","specVolID":"pvc-1","volumeHandle":"0001-x","volumeLifecycleMode":"Persistent"}"#;
        let d = parse_vol_data(kubelet).expect("kubelet's own text");
        assert_eq!(d.spec_vol_id.as_deref(), Some("pvc-1"));
        assert_eq!(d.volume_handle.as_deref(), Some("0001-x"));
        assert_eq!(d.driver_name.as_deref(), Some("rbd.csi.ceph.com"));
        assert_eq!(d.node_name.as_deref(), Some("mec52"));
        assert_eq!(d.attachment_id.as_deref(), Some("csi-1"));
        assert_eq!(d.volume_lifecycle_mode.as_deref(), Some("Persistent"));
        let staging = r#"{"driverName":"d","seLinuxMountContext":"system_u:object_r:container_file_t:s0","volumeHandle":"h","future":{"x":1}}"#;
        let d = parse_vol_data(staging).expect("staging with a newer and an unknown key");
        assert_eq!(d.selinux_mount_context.as_deref(), Some("system_u:object_r:container_file_t:s0"));
        assert_eq!(d.spec_vol_id, None);
        let d = parse_vol_data(r#"{"driverName":"d","volumeHandle":"h","nodeName":"","specVolID":null}"#)
            .expect("ok");
        assert_eq!((d.node_name, d.spec_vol_id), (None, None));

        for (text, want) in [
            ("", "json"),
            ("{", "json"),
            (r#"{"driverName":"d","volumeHandle":"h"} x"#, "json"),
            ("[]", "object"),
            ("\"x\"", "object"),
            (r#"{"driverName":"d"}"#, "missing volumeHandle"),
            (r#"{"volumeHandle":"h"}"#, "missing driverName"),
            (r#"{"driverName":"d","volumeHandle":""}"#, "missing volumeHandle"),
            (r#"{"driverName":["d"],"volumeHandle":"h"}"#, "type"),
        ] {
            let e = parse_vol_data(text).expect_err(text);
            let got = match &e {
                VolDataError::Json { .. } => "json".to_owned(),
                VolDataError::NotAnObject => "object".to_owned(),
                VolDataError::Missing { field } => format!("missing {field}"),
                VolDataError::NotAString { .. } => "type".to_owned(),
                other => other.to_string(),
            };
            assert_eq!(got, want, "{text}: {e}");
        }
    }

    #[test]
    fn rbd_directory_names() {
        let p = |s| parse_rbd_dir_name(s).map(|r| (r.pool, r.image));
        assert_eq!(
            p("k8s-image-kubernetes-dynamic-pvc-1"),
            Some(("k8s".into(), "kubernetes-dynamic-pvc-1".into()))
        );
        assert_eq!(p("rbd-k8s-image-cephimage2"), Some(("rbd-k8s".into(), "cephimage2".into())));
        assert_eq!(p("k8s-rbd-image-a-image-b"), Some(("k8s-rbd".into(), "a-image-b".into())));
        assert_eq!(p("kubernetes-image-rbd.img"), Some(("kubernetes".into(), "rbd.img".into())));
        for bad in ["", "k8s", "-image-x", "k8s-image-", "k8s-imagex"] {
            assert_eq!(p(bad), None, "{bad}");
        }
        // A pool ending in "-image" is ambiguous; the whole name still matches.
        assert_eq!(p("a-image-image-x"), Some(("a".into(), "image-x".into())));
        let mut v = KubeletVolume::new(
            VolumeKind::InTreeRbd,
            PathBuf::from("/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/a-image-image-x"),
            RBD_PLUGIN,
        );
        v.rbd = parse_rbd_dir_name("a-image-image-x");
        assert!(v.names_rbd_image("a-image", "x"));
        assert!(v.names_rbd_image("a", "image-x"));
        assert!(!v.names_rbd_image("a", "x"));
    }

    /// Builds files under a temporary host root.
    fn host_tree(files: &[(&str, &str)], links: &[(&str, &str)]) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().expect("tempdir");
        for (path, text) in files {
            let p = tmp.path().join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, text).expect("write");
        }
        for (path, target) in links {
            let p = tmp.path().join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::os::unix::fs::symlink(target, &p).expect("symlink");
        }
        tmp
    }

    #[test]
    fn kubelet_directory_symlink_resolves_through_the_host_root() {
        // /var/lib/kubelet -> /data/kubelet: an absolute target is the host's, not ours.
        let vd =
            r#"{"driverName":"d","specVolID":"pv1","volumeHandle":"h","volumeLifecycleMode":"Persistent"}"#;
        let tmp = host_tree(
            &[("/data/kubelet/pods/u1/volumes/kubernetes.io~csi/pv1/vol_data.json", vd)],
            &[("/var/lib/kubelet", "/data/kubelet")],
        );
        let s = scan(&HostRoot::new(tmp.path()), Path::new(DEFAULT_KUBELET_DIR)).expect("scan");
        assert_eq!(s.kubelet_dir, Path::new("/data/kubelet"));
        let mount = "/data/kubelet/pods/u1/volumes/kubernetes.io~csi/pv1/mount";
        assert_eq!(
            s.volumes.iter().map(|v| v.path.to_string_lossy().into_owned()).collect::<Vec<_>>(),
            [mount]
        );
        assert_eq!(s.find_by_mount_point(mount).map(|v| v.pv_name.as_deref()), Some(Some("pv1")));
    }

    #[test]
    fn shared_volume_handle_leaves_staging_pv_unknown() {
        // kubernetes#105899: two PVs with one handle share a 1.24+ staging directory.
        let pod = |pv: &str| {
            format!(
                r#"{{"driverName":"d","specVolID":"{pv}","volumeHandle":"h","volumeLifecycleMode":"Persistent"}}"#
            )
        };
        let (a, b) = (pod("pv-a"), pod("pv-b"));
        let stage = format!("/var/lib/kubelet/plugins/kubernetes.io/csi/d/{}/vol_data.json", sha256_hex("h"));
        let tmp = host_tree(
            &[
                ("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pv-a/vol_data.json", &a),
                ("/var/lib/kubelet/pods/u2/volumes/kubernetes.io~csi/pv-b/vol_data.json", &b),
                (&stage, r#"{"driverName":"d","volumeHandle":"h"}"#),
            ],
            &[],
        );
        let s = scan(&HostRoot::new(tmp.path()), Path::new(DEFAULT_KUBELET_DIR)).expect("scan");
        assert_eq!(s.warnings, vec![]);
        let staging: Vec<_> = s.volumes.iter().filter(|v| v.kind == VolumeKind::Staging).collect();
        assert_eq!(staging.len(), 1);
        assert_eq!(staging[0].pv_name, None);
        assert_eq!((s.pods_using("pv-a"), s.pods_using("pv-b")), (vec!["u1"], vec!["u2"]));
    }

    #[test]
    fn raw_block_device_number_on_a_live_node() {
        // Any block device node of this machine stands in for the rbd device.
        let Some((name, rdev)) = std::fs::read_dir("/dev").ok().and_then(|rd| {
            rd.filter_map(|e| e.ok()).find_map(|e| {
                let m = e.metadata().ok()?;
                m.file_type()
                    .is_block_device()
                    .then(|| (e.file_name().to_string_lossy().into_owned(), m.rdev()))
            })
        }) else {
            eprintln!("no block device node in /dev: skipped");
            return;
        };
        let target = format!("/dev/{name}");
        let tmp =
            host_tree(&[], &[("/var/lib/kubelet/pods/u1/volumeDevices/kubernetes.io~rbd/pv1", &target)]);
        let host = HostRoot::new(tmp.path()).with_dev("/dev");
        let s = scan(&host, Path::new(DEFAULT_KUBELET_DIR)).expect("scan");
        assert_eq!(s.volumes.len(), 1);
        let dev = DevNum::from_dev_t(rdev);
        assert_eq!(s.volumes[0].devnum, Some(dev));
        assert_eq!(s.find_by_devnum(dev).len(), 1);
    }

    #[test]
    fn subpaths_and_old_publish_files() {
        let data =
            r#"{"attachmentID":"a","driverName":"d","nodeName":"n","specVolID":"pv1","volumeHandle":"h"}"#;
        let tmp = host_tree(
            &[
                ("/var/lib/kubelet/pods/u1/volume-subpaths/data/app/0", ""),
                ("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pv1/data/vol_data.json", data),
                // Before 1.18 the publish path was a file per PV.
                ("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv1", ""),
            ],
            &[],
        );
        let s = scan(&HostRoot::new(tmp.path()), Path::new(DEFAULT_KUBELET_DIR)).expect("scan");
        assert_eq!(s.warnings, vec![]);
        let sub = at(&s, "/var/lib/kubelet/pods/u1/volume-subpaths/data/app/0");
        assert_eq!(
            (sub.kind, sub.spec_name.as_deref(), sub.pod_uid.as_deref()),
            (VolumeKind::PodSubpath, Some("data"), Some("u1"))
        );
        let publish = at(&s, "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv1");
        assert_eq!((publish.kind, publish.pod_uid.as_deref()), (VolumeKind::BlockPublish, None));
        assert_eq!(publish.volume_handle.as_deref(), Some("h"));
    }
}
