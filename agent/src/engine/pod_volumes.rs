//! Orphaned pod volume directories through the engine: the evidence for each place a volume of
//! a pod lives below the kubelet directory, gathered through the [`World`] at one instant, and
//! judged ([`crate::judge::orphans`]).
//!
//! What is read, cheapest first, and only as far as needed:
//! 1. the kubelet directory's `pods/<uid>/...` (each entry's device, inode and content);
//! 2. every process's cgroup (which pods have a process here) and the Kubernetes API's view:
//!    an entry whose pod runs here, or is on this node per the API, is in use, and nothing more
//!    is read for it;
//! 3. for the others only: the mount namespaces (a scan of no device: every namespace and pin,
//!    and the scan's blind spots), each one's whole table, and where the entry and its pod's
//!    directory are on the host (a stat through the host's root, located in the host's table).
//!    Then every mount of every namespace that is at or below the entry, or rooted in it or in
//!    its pod's directory: each namespace's table is indexed once, by the mounts that reach the
//!    kubelet directory's `pods/` ([`crate::graph::pod_volumes::Near`]), and every entry is
//!    answered from that index (a place not within `pods/` is not known, never "nothing there").
//!
//! What cannot be read is said per entry (`mounts_unknown`, `pod_unknown`), never taken as
//! "nothing there".

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Engine, World};
use crate::discover::kubelet::pod_dirs::{Content, PodDirs, PodVolumeEntry};
use crate::discover::mountinfo::MountEntry;
use crate::graph::pod_volumes::{self, Location, Near, Pin, Reach};
use crate::graph::scan::Target;
use crate::judge::gates::{self, PodWord};
use crate::judge::grace::Clocks;
use crate::judge::orphans::{self, DirEvidence, DirJudgement, DirVerdict, OrphanInput};
use crate::model::MountNsId;

/// One entry, its evidence and its verdict.
#[derive(Debug, Clone, Serialize)]
pub struct JudgedDir {
    /// How to name it to `clean`: `pod-volume:<uid>/...`.
    pub argument: String,
    pub evidence: DirEvidence,
    pub judgement: DirJudgement,
}

/// Every pod volume place whose pod is not proven to be on this node, judged.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PodVolumeReport {
    /// The kubelet directory as the host sees it.
    pub kubelet_dir: PathBuf,
    /// Every entry but those in use, by path.
    pub dirs: Vec<JudgedDir>,
    /// Entries whose pod runs here or is on this node per the API (not listed).
    pub in_use: usize,
    /// Why the kubelet directory could not be read at all (then nothing is listed).
    pub error: Option<String>,
    /// What could not be read below `pods/` (the walk went on).
    pub warnings: Vec<String>,
}

impl PodVolumeReport {
    /// How many entries have `verdict`.
    pub fn count(&self, verdict: DirVerdict) -> usize {
        self.dirs.iter().filter(|d| d.judgement.verdict == verdict).count()
    }
}

/// Evidence gathered for some entries.
pub struct Gathered {
    pub kubelet_dir: PathBuf,
    pub evidence: Vec<DirEvidence>,
    pub warnings: Vec<String>,
}

impl<W: World> Engine<W> {
    /// Every entry judged now with `clocks` (a clock kept only for an entry seen orphaned and
    /// empty in this report).
    pub fn pod_volumes(&self, clocks: &mut Clocks) -> PodVolumeReport {
        let gathered = match self.pod_volume_evidence(&|_| true) {
            Ok(g) => g,
            Err(why) => return PodVolumeReport { error: Some(why), ..PodVolumeReport::default() },
        };
        let mut report = PodVolumeReport {
            kubelet_dir: gathered.kubelet_dir,
            warnings: gathered.warnings,
            ..PodVolumeReport::default()
        };
        let mut candidates = Vec::new();
        let input = self.orphan_input();
        for ev in gathered.evidence {
            let judgement = orphans::judge(&ev, &(&input).into(), clocks);
            if matches!(judgement.verdict, DirVerdict::Pending | DirVerdict::Removable) {
                candidates.push(orphans::token(&ev.entry));
            }
            if judgement.verdict == DirVerdict::InUse {
                report.in_use += 1;
                continue;
            }
            let argument = crate::plan::pod_volume::argument(&ev.entry);
            report.dirs.push(JudgedDir { argument, evidence: ev, judgement });
        }
        clocks.retain_dirs(|t| candidates.iter().any(|c| c == t));
        report
    }

    /// What a verdict rests on besides the evidence: the API's view now, the grace period.
    pub(super) fn orphan_input(&self) -> OrphanInputOwned {
        OrphanInputOwned {
            api: self.world.cluster(),
            api_off: self.world.api_off(),
            now: self.world.now(),
            grace: self.settings.grace,
            max_gap: self.settings.max_gap,
        }
    }

    /// The evidence for every entry `wanted` accepts (see the module docs). `Err` only when the
    /// kubelet directory cannot be read.
    pub fn pod_volume_evidence(&self, wanted: &dyn Fn(&PodVolumeEntry) -> bool) -> Result<Gathered, String> {
        let processes = self.world.pod_processes();
        let input = self.orphan_input();
        let on_node = |uid: &str| {
            matches!(gates::pod_api(uid, input.api.as_ref(), &input.api_off, input.now), PodWord::OnNode(_))
        };
        // What is in the volume places of a pod that runs here is none of this question's
        // business: not looked into.
        let runs = |uid: &str| processes.as_ref().is_ok_and(|p| !p.of(uid).is_empty()) || on_node(uid);
        let dirs = self.world.pod_dirs(&|uid| !runs(uid))?;
        let mut evidence: Vec<DirEvidence> = Vec::new();
        let mut open: Vec<usize> = Vec::new();
        for pod in &dirs.pods {
            for entry in pod.volumes.iter().filter(|e| wanted(e)) {
                let mut ev = bare_evidence(entry, pod.etc_hosts, &pod.containers);
                match &processes {
                    Ok(p) => ev.pod_pids = p.of(&pod.uid).to_vec(),
                    Err(why) => ev.pod_unknown.push(why.clone()),
                }
                ev.pod_unknown.extend(processes.as_ref().map(|p| p.unreadable.clone()).unwrap_or_default());
                if ev.pod_pids.is_empty() && !on_node(&pod.uid) {
                    open.push(evidence.len());
                }
                evidence.push(ev);
            }
        }
        if !open.is_empty() {
            self.mount_evidence(&dirs, &mut evidence, &open);
        }
        Ok(Gathered { kubelet_dir: dirs.kubelet_dir, evidence, warnings: dirs.warnings })
    }

    /// Step 3 of the module docs, for the entries at `open`.
    fn mount_evidence(&self, dirs: &PodDirs, evidence: &mut [DirEvidence], open: &[usize]) {
        let everywhere = |evidence: &mut [DirEvidence], why: String| {
            for &i in open {
                evidence[i].mounts_unknown.push(why.clone());
                evidence[i].pod_unknown.push(why.clone());
            }
        };
        let scan = match self.world.scan(Target::Devices(Vec::new())) {
            Ok(s) => s,
            Err(e) => return everywhere(evidence, format!("the mount namespaces cannot be listed: {e}")),
        };
        let mut blind: Vec<String> = scan
            .blind_spots
            .iter()
            .filter(|b| b.hides_mount_namespace)
            .map(|b| format!("blind spot: {}", b.what))
            .collect();
        if let Some(why) = &scan.graph.host_ns_unsure {
            blind.push(format!("the host's mount namespace is not known: {why}"));
        }
        let tables = self.world.mount_tables(&scan, &|_| true);
        let host_ns = scan.graph.host_ns;
        let host_table: Result<&Vec<MountEntry>, String> = match tables.iter().find(|(ns, _)| *ns == host_ns)
        {
            Some((_, Ok(t))) => Ok(t),
            Some((_, Err(e))) => Err(format!("the host's mount table cannot be read: {e}")),
            None => Err(format!("the host's mount namespace {} was not found", host_ns.0)),
        };
        // A namespace whose last task exited since the scan holds no mount: gone, not unknown.
        let gone = |id: MountNsId| scan.namespaces.iter().any(|n| n.id == id && self.world.mount_ns_gone(n));
        let unreadable: Vec<String> = tables
            .iter()
            .filter(|(ns, t)| t.is_err() && !gone(*ns))
            .filter_map(|(ns, t)| t.as_ref().err().map(|e| format!("mount namespace {}: {e}", ns.0)))
            .collect();
        let readable: Vec<(MountNsId, &Vec<MountEntry>)> =
            tables.iter().filter_map(|(ns, t)| t.as_ref().ok().map(|t| (*ns, t))).collect();
        // Every namespace's mounts in `pods/` or below, indexed once for every directory asked.
        let pods = match self.locate(&host_table, &dirs.kubelet_dir.join("pods"), None) {
            Ok(loc) => loc,
            Err(why) => return everywhere(evidence, why),
        };
        let near: Vec<Near> = readable.iter().map(|(ns, t)| Near::index(*ns, t, &pods)).collect();
        // The index answers for places within `pods/` only: any other is not known.
        let pins = |loc: &Location| -> Result<Vec<Pin>, String> {
            if !loc.within(&pods) {
                return Err(format!("{loc} is not within the pods directory's place ({pods})"));
            }
            Ok(near.iter().flat_map(|n| n.pins(loc)).collect())
        };
        let mut pod_locations: BTreeMap<String, Result<Location, String>> = BTreeMap::new();
        for &i in open {
            let ev = &mut evidence[i];
            ev.namespaces = readable.len();
            ev.mounts_unknown.extend(blind.iter().cloned().chain(unreadable.iter().cloned()));
            ev.pod_unknown.extend(blind.iter().cloned().chain(unreadable.iter().cloned()));
            let pod_path = dirs.kubelet_dir.join("pods").join(&ev.entry.pod_uid);
            let pod_key = dirs.pod(&ev.entry.pod_uid).and_then(|p| p.key);
            let pod_loc = pod_locations
                .entry(ev.entry.pod_uid.clone())
                .or_insert_with(|| self.locate(&host_table, &pod_path, pod_key))
                .clone();
            match pod_loc.and_then(|loc| pins(&loc)) {
                Ok(p) => ev.pod_rooted = p.into_iter().filter(|p| p.reach == Reach::Rooted).collect(),
                Err(why) => ev.pod_unknown.push(why),
            }
            match self.locate_entry(&host_table, &ev.entry).and_then(|loc| pins(&loc)) {
                Ok(p) => ev.pins = p,
                Err(why) => ev.mounts_unknown.push(why),
            }
        }
    }

    /// Where a volume entry is on the host's filesystems; a symlink (a raw block volume's map)
    /// is its own place in its directory: never followed, located through that directory.
    fn locate_entry(
        &self,
        host_table: &Result<&Vec<MountEntry>, String>,
        entry: &PodVolumeEntry,
    ) -> Result<Location, String> {
        let is_link = matches!(&entry.content, Content::NotADirectory { kind: "symlink", .. });
        match (is_link, entry.path.parent(), entry.path.file_name()) {
            (true, Some(dir), Some(name)) => {
                self.locate(host_table, dir, None).map(|l| l.join(Path::new(name)))
            }
            _ => self.locate(host_table, &entry.path, entry.key),
        }
    }

    /// Where `path` is on the host's filesystems: stat through the host's root (the same
    /// directory as `key`, the walk's), located in the host's table.
    fn locate(
        &self,
        host_table: &Result<&Vec<MountEntry>, String>,
        path: &Path,
        key: Option<crate::host::beneath::FileKey>,
    ) -> Result<Location, String> {
        let table = host_table.as_ref().map_err(Clone::clone)?;
        let (on_host, mnt_id) = self.world.stat_on_host(path)?;
        let located = pod_volumes::locate(table, path, mnt_id)
            .map_err(|why| format!("{} cannot be located on the host: {why}", path.display()))?;
        if key.is_some_and(|k| k != on_host) {
            return Err(format!(
                "{} on the host (device/inode {on_host}) is not the directory the kubelet directory walk found ({}): something is mounted on it, or it was replaced",
                path.display(),
                key.map(|k| k.to_string()).unwrap_or_default()
            ));
        }
        Ok(located)
    }
}

/// An owned [`OrphanInput`].
pub(super) struct OrphanInputOwned {
    pub api: Option<crate::kube::ClusterView>,
    pub api_off: String,
    pub now: crate::host::clock::BootTime,
    pub grace: std::time::Duration,
    pub max_gap: std::time::Duration,
}

impl<'a> From<&'a OrphanInputOwned> for OrphanInput<'a> {
    fn from(o: &'a OrphanInputOwned) -> Self {
        OrphanInput {
            api: o.api.as_ref(),
            api_off: &o.api_off,
            now: o.now,
            grace: o.grace,
            max_gap: o.max_gap,
        }
    }
}

fn bare_evidence(entry: &PodVolumeEntry, etc_hosts: bool, containers: &[String]) -> DirEvidence {
    DirEvidence {
        entry: entry.clone(),
        etc_hosts,
        containers: containers.to_vec(),
        pod_pids: Vec::new(),
        pod_rooted: Vec::new(),
        pins: Vec::new(),
        mounts_unknown: Vec::new(),
        pod_unknown: Vec::new(),
        namespaces: 0,
    }
}

#[cfg(test)]
#[path = "pod_volumes_tests.rs"]
mod tests;
