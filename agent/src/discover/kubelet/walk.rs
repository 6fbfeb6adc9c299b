//! Walking the kubelet directory: pods' volume mounts and devices, CSI staging and publish
//! paths, in-tree rbd mounts, each read without following anything below a mount point.

use super::*;
use crate::discover::DiscoverError;
use crate::host::HostRoot;
use crate::model::DevNum;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

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
pub(super) fn resolve_host_path(host: &HostRoot, path: &Path) -> io::Result<PathBuf> {
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
