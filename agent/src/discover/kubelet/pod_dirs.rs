//! Kubelet's per-pod directories, read for the question kubelet asks before it deletes a pod's
//! directory ("orphaned pod ... found, but volume paths are still present on disk"): for every
//! `pods/<uid>`, what kubelet keeps of the pod (`etc-hosts`, `containers/<name>`: files it
//! bind-mounts into the pod's containers) and each place a volume of the pod lives:
//!
//! | kind | path below the kubelet directory |
//! | --- | --- |
//! | [`Volume`](PodVolumeKind::Volume) | `pods/<uid>/volumes/<plugin>/<name>` (CSI: a `mount` directory and `vol_data.json` in it) |
//! | [`Device`](PodVolumeKind::Device) | `pods/<uid>/volumeDevices/<plugin>/<name>` (a symlink to the raw block device) |
//! | [`Subpath`](PodVolumeKind::Subpath) | `pods/<uid>/volume-subpaths/<volume>/<container>/<index>` (a subPath bind mount's target) |
//!
//! Each entry comes with its device and inode and what is in it: nothing but empty directories
//! (then every directory, deepest first: what `rmdir` would remove), or how many other entries
//! and the first of them. Read only, through [`crate::host::beneath`]: nothing below the
//! kubelet directory is followed if it is a symlink, and nothing is entered if something is
//! mounted on it in this process's namespace (that is reported, `mounted_here`). A directory
//! with more than [`MAX_ENTRIES`] entries, or deeper than [`MAX_DEPTH`], is never called empty.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::host::beneath::{self, FileKey, Kind};
use crate::host::HostRoot;

/// At most this many entries are looked at below one volume directory.
pub const MAX_ENTRIES: usize = 256;
/// At most this many levels below one volume directory.
pub const MAX_DEPTH: usize = 16;
/// How many names of a non-empty directory are shown.
pub const SHOWN: usize = 5;

/// Which of kubelet's per-pod volume places an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PodVolumeKind {
    Volume,
    Device,
    Subpath,
}

impl PodVolumeKind {
    /// The directory below `pods/<uid>/` kubelet keeps them in.
    pub fn dir(self) -> &'static str {
        match self {
            Self::Volume => "volumes",
            Self::Device => "volumeDevices",
            Self::Subpath => "volume-subpaths",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Volume => "volume",
            Self::Device => "volume_device",
            Self::Subpath => "volume_subpath",
        }
    }
}

/// What a volume entry holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Content {
    /// A directory with nothing but empty directories in it (or nothing): every directory, the
    /// deepest first and the entry itself last, each below the kubelet directory with its device
    /// and inode.
    Empty { dirs: Vec<(PathBuf, FileKey)> },
    /// Something else is in it: how many entries were seen (at most [`MAX_ENTRIES`] + 1), and
    /// the first [`SHOWN`] that are not empty directories, below the entry.
    NotEmpty { entries: usize, first: Vec<String> },
    /// Not a directory: a symlink (where it points), a file, a device node.
    NotADirectory { kind: &'static str, target: Option<PathBuf> },
    /// Something is mounted at this place below the entry (`.` the entry itself), in the
    /// agent's own mount namespace: it was not entered.
    MountedHere { at: PathBuf },
    /// It could not be read (why).
    Unreadable { why: String },
    /// Not looked into: its pod runs here or is on this node per the API (the caller said so).
    NotSurveyed,
}

impl Content {
    /// Nothing but empty directories.
    pub fn is_empty_dir(&self) -> bool {
        matches!(self, Self::Empty { .. })
    }
}

/// One place a volume of a pod lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodVolumeEntry {
    pub pod_uid: String,
    pub kind: PodVolumeKind,
    /// Below the kubelet directory: `pods/<uid>/volumes/kubernetes.io~csi/pvc-1`.
    pub rel: PathBuf,
    /// As the host sees it.
    pub path: PathBuf,
    /// The volume plugin, unescaped (`kubernetes.io/csi`); for a subpath the pod's volume.
    pub plugin: String,
    /// The volume's name (a PV, or the pod's volume); for a subpath `<container>/<index>`.
    pub name: String,
    /// Its device and inode (`None` when it could not be read).
    pub key: Option<FileKey>,
    pub content: Content,
}

/// One `pods/<uid>` directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodDir {
    pub uid: String,
    /// Its device and inode.
    pub key: Option<FileKey>,
    /// `etc-hosts` is there (kubelet writes it when the pod's sandbox starts and bind-mounts it
    /// as every container's `/etc/hosts`).
    pub etc_hosts: bool,
    /// The names in `containers/` (kubelet's termination-log files, one directory per container).
    pub containers: Vec<String>,
    pub volumes: Vec<PodVolumeEntry>,
}

/// Every pod directory of the kubelet directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PodDirs {
    /// The kubelet directory as the host sees it, symlinks resolved.
    pub kubelet_dir: PathBuf,
    pub pods: Vec<PodDir>,
    /// What could not be read below `pods/` (the walk went on).
    pub warnings: Vec<String>,
}

impl PodDirs {
    /// Every volume entry, in order.
    pub fn entries(&self) -> impl Iterator<Item = &PodVolumeEntry> {
        self.pods.iter().flat_map(|p| p.volumes.iter())
    }

    /// The pod directory of `uid`.
    pub fn pod(&self, uid: &str) -> Option<&PodDir> {
        self.pods.iter().find(|p| p.uid == uid)
    }
}

/// Reads every `pods/<uid>` below the kubelet directory `kubelet_dir` (as the host sees it),
/// looking into the volume places of the pods `survey` accepts only (the others': their kind and
/// key, [`Content::NotSurveyed`]). A kubelet directory or `pods/` that does not exist is none;
/// one that cannot be opened is an error.
pub fn scan(host: &HostRoot, kubelet_dir: &Path, survey: &dyn Fn(&str) -> bool) -> io::Result<PodDirs> {
    let resolved = match super::walk::resolve_host_path(host, kubelet_dir) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(PodDirs { kubelet_dir: kubelet_dir.to_owned(), ..PodDirs::default() })
        }
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", kubelet_dir.display()))),
    };
    let local = host.host_path(&resolved);
    let root = beneath::open_root(&local)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", local.display())))?;
    let mut out = PodDirs { kubelet_dir: resolved, ..PodDirs::default() };
    // `pods/` may be a filesystem of its own: crossing into it is allowed, nothing below.
    let pods = match beneath::open_dir(root.as_fd(), Path::new("pods"), true) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}/pods: {e}", out.kubelet_dir.display()))),
    };
    for uid in beneath::names(pods.as_fd())? {
        let Some(uid) = uid.to_str().map(str::to_owned) else {
            out.warnings.push(format!("pods/{}: not a pod UID (not UTF-8)", uid.to_string_lossy()));
            continue;
        };
        match read_pod(pods.as_fd(), &out.kubelet_dir, &uid, survey(&uid)) {
            Ok(Some(p)) => out.pods.push(p),
            Ok(None) => {}
            Err(why) => out.warnings.push(format!("pods/{uid}: {why}")),
        }
    }
    Ok(out)
}

/// The device and inode of `rel` (below `pods/`, as `pods/<uid>/...`) under the kubelet
/// directory `kubelet_dir` (as the host sees it, symlinks resolved); `None` when it is not there.
pub fn key_below(host: &HostRoot, kubelet_dir: &Path, rel: &Path) -> io::Result<Option<FileKey>> {
    let gone = |e: &io::Error| e.kind() == io::ErrorKind::NotFound;
    let (Ok(below), Some(name)) = (rel.strip_prefix("pods"), rel.file_name()) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not below pods/"));
    };
    let root = beneath::open_root(&host.host_path(kubelet_dir))?;
    let pods = match beneath::open_dir(root.as_fd(), Path::new("pods"), true) {
        Ok(fd) => fd,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let parent = below.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let parent = match beneath::open_dir(pods.as_fd(), parent, false) {
        Ok(fd) => fd,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    match beneath::kind_of(parent.as_fd(), name) {
        Ok((_, key)) => Ok(Some(key)),
        Err(e) if gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// One pod's directory; `None` when it is not a directory (or vanished).
fn read_pod(
    pods: BorrowedFd<'_>,
    kubelet_dir: &Path,
    uid: &str,
    survey: bool,
) -> Result<Option<PodDir>, String> {
    let fd = match beneath::open_dir(pods, Path::new(uid), false) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR) => {
            return Ok(None)
        }
        Err(e) if beneath::is_mount_crossing(&e) => return Err("something is mounted on it".into()),
        Err(e) => return Err(e.to_string()),
    };
    let key = beneath::key_of(fd.as_fd()).ok();
    let names = beneath::names(fd.as_fd()).map_err(|e| e.to_string())?;
    let etc_hosts = names.iter().any(|n| n == "etc-hosts");
    let containers = match beneath::open_dir(fd.as_fd(), Path::new("containers"), false) {
        Ok(c) => beneath::names(c.as_fd()).unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let mut pod = PodDir {
        uid: uid.to_owned(),
        key,
        etc_hosts,
        containers: containers.iter().map(|c| c.to_string_lossy().into_owned()).collect(),
        volumes: Vec::new(),
    };
    let base = Path::new("pods").join(uid);
    let at = |rel: &Path| (base.join(rel), kubelet_dir.join("pods").join(uid).join(rel));
    for kind in [PodVolumeKind::Volume, PodVolumeKind::Device] {
        for (plugin_dir, plugin) in children(fd.as_fd(), Path::new(kind.dir())) {
            for (name_os, name) in children(fd.as_fd(), &Path::new(kind.dir()).join(&plugin_dir)) {
                let rel = Path::new(kind.dir()).join(&plugin_dir).join(&name_os);
                let (rel_k, path) = at(&rel);
                let (key, content) = survey_entry(fd.as_fd(), &rel, &rel_k, survey);
                pod.volumes.push(PodVolumeEntry {
                    pod_uid: uid.to_owned(),
                    kind,
                    rel: rel_k,
                    path,
                    plugin: plugin.replace('~', "/"),
                    name,
                    key,
                    content,
                });
            }
        }
    }
    let subpaths = Path::new(PodVolumeKind::Subpath.dir());
    for (vol_os, vol) in children(fd.as_fd(), subpaths) {
        for (ctr_os, ctr) in children(fd.as_fd(), &subpaths.join(&vol_os)) {
            for (idx_os, idx) in children(fd.as_fd(), &subpaths.join(&vol_os).join(&ctr_os)) {
                let rel = subpaths.join(&vol_os).join(&ctr_os).join(&idx_os);
                let (rel_k, path) = at(&rel);
                let (key, content) = survey_entry(fd.as_fd(), &rel, &rel_k, survey);
                pod.volumes.push(PodVolumeEntry {
                    pod_uid: uid.to_owned(),
                    kind: PodVolumeKind::Subpath,
                    rel: rel_k,
                    path,
                    plugin: vol.clone(),
                    name: format!("{ctr}/{idx}"),
                    key,
                    content,
                });
            }
        }
    }
    Ok(Some(pod))
}

/// The names in the directory `rel` below `dir` (none when it is missing, not a directory or
/// cannot be entered: the entries below it are then not listed, and the caller's survey of the
/// level above says why), each with its text.
fn children(dir: BorrowedFd<'_>, rel: &Path) -> Vec<(std::ffi::OsString, String)> {
    let Ok(fd) = beneath::open_dir(dir, rel, false) else { return Vec::new() };
    beneath::names(fd.as_fd())
        .unwrap_or_default()
        .into_iter()
        .map(|n| {
            let text = n.to_string_lossy().into_owned();
            (n, text)
        })
        .collect()
}

/// What the entry `rel` (below the pod directory `pod`; `rel_k` below the kubelet directory)
/// is and, when `survey`, holds.
fn survey_entry(pod: BorrowedFd<'_>, rel: &Path, rel_k: &Path, survey: bool) -> (Option<FileKey>, Content) {
    let (parent, name) = match (rel.parent(), rel.file_name()) {
        (Some(p), Some(n)) => (p, n),
        _ => return (None, Content::Unreadable { why: "no name".into() }),
    };
    let parent_fd = match beneath::open_dir(pod, parent, false) {
        Ok(fd) => fd,
        Err(e) => return (None, Content::Unreadable { why: e.to_string() }),
    };
    let (kind, key) = match beneath::kind_of(parent_fd.as_fd(), name) {
        Ok(k) => k,
        // Something is mounted on it (a volume, a subPath bind of a file) in this namespace.
        Err(e) if beneath::is_mount_crossing(&e) => return (None, Content::MountedHere { at: ".".into() }),
        Err(e) => return (None, Content::Unreadable { why: e.to_string() }),
    };
    match kind {
        Kind::Dir if !survey => return (Some(key), Content::NotSurveyed),
        Kind::Dir => {}
        Kind::Symlink => {
            let target = beneath::link_target(parent_fd.as_fd(), name).ok();
            return (Some(key), Content::NotADirectory { kind: kind.as_str(), target });
        }
        Kind::File | Kind::Other => {
            return (Some(key), Content::NotADirectory { kind: kind.as_str(), target: None })
        }
    }
    let fd = match beneath::open_dir(parent_fd.as_fd(), Path::new(name), false) {
        Ok(fd) => fd,
        Err(e) if beneath::is_mount_crossing(&e) => {
            return (Some(key), Content::MountedHere { at: ".".into() })
        }
        Err(e) => return (Some(key), Content::Unreadable { why: e.to_string() }),
    };
    // The key of the directory itself, through the fd (what the rmdir will check).
    let key = beneath::key_of(fd.as_fd()).unwrap_or(key);
    let mut s = Survey::default();
    s.walk(&fd, Path::new(""), 0);
    (Some(key), s.content(rel_k, key))
}

/// What a walk below one directory found.
#[derive(Default)]
struct Survey {
    /// Directories below the entry (relative to it), deepest first, with their keys.
    dirs: Vec<(PathBuf, FileKey)>,
    /// Entries seen.
    entries: usize,
    /// The first entries that are not directories, or the reason a directory counts as content.
    others: Vec<String>,
    mounted: Option<PathBuf>,
    unreadable: Option<String>,
}

impl Survey {
    fn walk(&mut self, dir: &OwnedFd, rel: &Path, depth: usize) {
        let names = match beneath::names(dir.as_fd()) {
            Ok(n) => n,
            Err(e) => {
                self.unreadable.get_or_insert_with(|| format!("{}: {e}", shown(rel)));
                return;
            }
        };
        for name in names {
            self.entries += 1;
            let below = rel.join(&name);
            if self.entries > MAX_ENTRIES {
                self.other(format!("more than {MAX_ENTRIES} entries"));
                return;
            }
            match beneath::kind_of(dir.as_fd(), &name) {
                Ok((Kind::Dir, _)) if depth + 1 >= MAX_DEPTH => {
                    self.other(format!("{}/ (deeper than {MAX_DEPTH} levels)", shown(&below)))
                }
                Ok((Kind::Dir, _)) => match beneath::open_keyed(dir.as_fd(), Path::new(&name)) {
                    Ok((fd, key)) => {
                        self.walk(&fd, &below, depth + 1);
                        self.dirs.push((below, key));
                    }
                    Err(e) if beneath::is_mount_crossing(&e) => {
                        self.mounted.get_or_insert(below);
                    }
                    Err(e) => {
                        self.unreadable.get_or_insert_with(|| format!("{}: {e}", shown(&below)));
                    }
                },
                Ok((kind, _)) => self.other(format!("{} ({})", shown(&below), kind.as_str())),
                Err(e) if beneath::is_mount_crossing(&e) => {
                    self.mounted.get_or_insert(below);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => self.entries -= 1,
                Err(e) => {
                    self.unreadable.get_or_insert_with(|| format!("{}: {e}", shown(&below)));
                }
            }
        }
    }

    fn other(&mut self, what: String) {
        if self.others.len() < SHOWN {
            self.others.push(what);
        }
    }

    /// What the entry holds: `rel_k` is the entry below the kubelet directory, `key` its own.
    fn content(self, rel_k: &Path, key: FileKey) -> Content {
        if let Some(at) = self.mounted {
            return Content::MountedHere { at };
        }
        if let Some(why) = self.unreadable {
            return Content::Unreadable { why };
        }
        if !self.others.is_empty() {
            return Content::NotEmpty { entries: self.entries, first: self.others };
        }
        let mut dirs: Vec<(PathBuf, FileKey)> =
            self.dirs.into_iter().map(|(rel, key)| (rel_k.join(rel), key)).collect();
        dirs.push((rel_k.to_owned(), key));
        Content::Empty { dirs }
    }
}

fn shown(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        ".".to_owned()
    } else {
        OsStr::new(rel).to_string_lossy().into_owned()
    }
}
