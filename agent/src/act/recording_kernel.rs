//! A recording kernel for the actuators' unit tests: a [`super::kernel::Kernel`] that serves a scripted kernel
//! state and records every call made to it, in order, so a test can assert which writes reached
//! the kernel (none, when a re-check refused the step).
//!
//! The state is a directory tree in the layout of the real kernel's `/sys`, `/proc` and `/dev`
//! (usually a copy of one of the real-kernel fixture trees under `tests/fixtures/`): reads are
//! served from it by the same code the live kernel runs (`LinuxKernel`). What no tree can
//! hold is scripted: what a device node is (`stat`) and what its ioctls answer (diskseq,
//! `LOOP_GET_STATUS64`), the device-mapper maps, the kernel log's rbd attach records, the
//! kernel's word on a device, a namespace's mountinfo read from inside it. A write never
//! touches the tree: it is recorded, answered (`Ok`, or an errno a test scripted with
//! [`RecordingKernel::fail`]) and followed by the effects a test scripted with
//! [`RecordingKernel::on`] (what the real kernel would do: remove a device's directory, unbind
//! a loop device, drop a map), so the actuator's verification after the write sees them.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::kernel::{ChildExit, LoopBacking, MapStatus, Open, TargetStatus};
use super::linux::LinuxActuator;
use crate::discover::probe::KernelWord;
use crate::host::sys::FileId;
use crate::host::HostRoot;
use crate::model::DevNum;

/// One call the actuator made, with what identifies its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Read(PathBuf),
    Exists(PathBuf),
    IsFile(PathBuf),
    ListDir(PathBuf),
    Stat(PathBuf),
    TaskMountNs(PathBuf),
    ReadMountinfoIn(PathBuf),
    RbdAttachRecords,
    IscsiDetail(u32),
    IscsiTargetname(u32),
    IscsiScsiDevices(u32),
    IscsiState(u32),
    KernelWord(String),
    MultipathdOwners,
    Open(PathBuf, Open),
    DiskSeq(PathBuf),
    LoopGetStatus(PathBuf),
    DmOpen(PathBuf),
    DmDevStatus(String),
    DmTableStatus(String),
    // Writes.
    LoopClear(PathBuf),
    NbdDisconnect(PathBuf),
    NbdClearSock(PathBuf),
    DmMessage { uuid: String, message: String },
    DmRemove { uuid: String, deferred: bool },
    Write { path: PathBuf, text: String },
    Unmount { ns_file: PathBuf, root: Option<PathBuf>, rel: PathBuf, mount_id: u32 },
    RunInHostNamespaces { program: PathBuf, args: Vec<String> },
    MultipathdAsk(String),
    RemoveWwid { path: PathBuf, wwid: String },
}

impl Call {
    /// Whether the call changes the kernel (the [`Kernel`] trait's "Writes").
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Call::LoopClear(_)
                | Call::NbdDisconnect(_)
                | Call::NbdClearSock(_)
                | Call::DmMessage { .. }
                | Call::DmRemove { .. }
                | Call::Write { .. }
                | Call::Unmount { .. }
                | Call::RunInHostNamespaces { .. }
                | Call::MultipathdAsk(_)
                | Call::RemoveWwid { .. }
        )
    }
}

/// What the kernel does after a write, as a test scripts it ([`RecordingKernel::on`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// A sysfs or procfs entry goes away (a file, a directory, or a class link).
    Remove(PathBuf),
    /// A file's text changes (a device's `size`, a namespace's `mountinfo`).
    WriteFile(PathBuf, String),
    /// A loop device node is no longer bound (`LOOP_GET_STATUS64` says `ENXIO`).
    Unbind(PathBuf),
    /// The device-mapper map with this uuid is gone.
    DropMap(String),
    /// The mountinfo read from inside the namespace behind this file changes.
    MountinfoIn(PathBuf, String),
}

/// A device node as the kernel answers for it: its `stat`, and its ioctls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedNode {
    pub stat: FileId,
    /// `BLKGETDISKSEQ` (`None`: `ENOTTY`, a kernel without it).
    pub diskseq: Option<u64>,
    /// `LOOP_GET_STATUS64` (`None`: `ENXIO`, not bound).
    pub loop_backing: Option<LoopBacking>,
}

impl ScriptedNode {
    /// A block device node for `devnum` (`S_IFBLK`, mode 0660).
    pub fn block(devnum: DevNum) -> Self {
        let stat = FileId {
            dev: DevNum::new(0, 5),
            rdev: devnum,
            ino: 0,
            mode: libc::S_IFBLK | 0o660,
            mnt_id: None,
        };
        Self { stat, diskseq: None, loop_backing: None }
    }

    /// An nsfs file: a mount namespace of inode `ino`.
    pub fn namespace(ino: u64) -> Self {
        let stat = FileId {
            dev: DevNum::new(0, 4),
            rdev: DevNum::new(0, 0),
            ino,
            mode: libc::S_IFREG | 0o444,
            mnt_id: None,
        };
        Self { stat, diskseq: None, loop_backing: None }
    }
}

/// A device-mapper map as `DM_DEV_STATUS` and `DM_TABLE_STATUS` answer for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedMap {
    pub uuid: String,
    pub header: MapStatus,
    pub status: Vec<TargetStatus>,
}

/// An open file of the recording kernel: the path it was opened at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedFile(pub PathBuf);

#[derive(Debug, Default)]
struct State {
    calls: Vec<Call>,
    nodes: HashMap<PathBuf, ScriptedNode>,
    /// Whether `/dev/mapper/control` opens.
    dm_control: bool,
    maps: BTreeMap<String, ScriptedMap>,
    rbd_records: HashMap<String, u64>,
    words: HashMap<String, KernelWord>,
    mountinfo_in: HashMap<PathBuf, Vec<u8>>,
    /// Processes named multipathd that hold no control socket.
    multipathd_others: Vec<u32>,
    child_exit: Option<ChildExit>,
    failures: Vec<(Call, i32)>,
    effects: Vec<(Call, Vec<Effect>)>,
}

/// The recording kernel: its tree (removed with the last clone) and its script and record.
#[derive(Debug, Clone)]
pub struct RecordingKernel {
    tree: Arc<tempfile::TempDir>,
    state: Arc<Mutex<State>>,
}

impl RecordingKernel {
    /// An empty tree: the test lays out what the step reads. In memory (`/dev/shm`) where there
    /// is one: a fixture tree is a thousand small files.
    pub fn new() -> Self {
        let mut b = tempfile::Builder::new();
        b.prefix("bj-kernel-");
        let tree = b.tempdir_in("/dev/shm").or_else(|_| b.tempdir()).expect("tempdir");
        Self { tree: Arc::new(tree), state: Arc::default() }
    }

    /// A copy of the real-kernel fixture tree `tests/fixtures/<name>`.
    pub fn fixture(name: &str) -> Self {
        let k = Self::new();
        let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name);
        copy_tree(&from, k.tree.path());
        k
    }

    /// The host whose `/proc`, `/sys` and `/dev` are the tree.
    pub fn host(&self) -> HostRoot {
        HostRoot::new(self.tree.path())
    }

    /// `rel` in the tree (`sys/class/block/sda`).
    pub fn path(&self, rel: &str) -> PathBuf {
        self.tree.path().join(rel)
    }

    /// The Linux actuator on this kernel (a 5 s deadline per call).
    pub fn actuator(&self) -> LinuxActuator<Self> {
        LinuxActuator::with_kernel(self.host(), Duration::from_secs(5), self.clone())
    }

    /// Writes `text` at `rel` in the tree, making its directories.
    pub fn file(&self, rel: &str, text: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
    }

    /// A symlink at `rel` in the tree to `target`, as sysfs and procfs have them.
    pub fn link(&self, rel: &str, target: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::os::unix::fs::symlink(target, &p).expect("symlink");
    }

    /// Makes the tree's `/proc` this process's (its `self` link names our PID), as the mount
    /// step requires before it enters a namespace.
    pub fn live_proc(&self) {
        self.link("proc/self", &std::process::id().to_string());
    }

    /// What the device node (or nsfs file) at `rel` is.
    pub fn node(&self, rel: &str, node: ScriptedNode) {
        self.state().nodes.insert(self.path(rel), node);
    }

    /// A map `DM_DEV_STATUS` finds by its uuid (and `/dev/mapper/control` opens).
    pub fn dm_map(&self, map: ScriptedMap) {
        let mut s = self.state();
        s.dm_control = true;
        s.maps.insert(map.uuid.clone(), map);
    }

    /// Every map of the tree, as the real kernel answered for it: name, uuid and number from
    /// `sys/block/dm-*/`, its open count from its `holders/`, its status lines from the tree's
    /// `dm-tables.txt`.
    pub fn dm_maps_from_tree(&self) {
        let text = std::fs::read_to_string(self.path("dm-tables.txt")).expect("dm-tables.txt");
        let dump = crate::discover::dm::parse_dump(&text).expect("dm-tables.txt parses");
        let block = self.path("sys/block");
        for name in crate::discover::list_dir(&block).expect("sys/block") {
            let dir = block.join(&name);
            let Ok(uuid) = std::fs::read_to_string(dir.join("dm/uuid")) else { continue };
            let map_name = std::fs::read_to_string(dir.join("dm/name")).expect("dm/name").trim().to_owned();
            let dev = std::fs::read_to_string(dir.join("dev")).expect("dev").trim().parse().expect("dev");
            let holders = crate::discover::list_dir(&dir.join("holders")).expect("holders").len();
            let status: Vec<TargetStatus> = dump
                .iter()
                .filter(|t| t.name == map_name)
                .map(|t| TargetStatus {
                    target_type: t.target.target_type.clone(),
                    params: t.target.status.clone(),
                })
                .collect();
            let header = MapStatus { dev, open_count: holders as i32, name: map_name };
            self.dm_map(ScriptedMap { uuid: uuid.trim().to_owned(), header, status });
        }
    }

    /// The kernel log's latest attach record of rbd device `name`.
    pub fn rbd_record(&self, name: &str, seq: u64) {
        self.state().rbd_records.insert(name.to_owned(), seq);
    }

    /// The kernel's word on `device` (unscripted: nothing uses it).
    pub fn word(&self, device: &str, word: KernelWord) {
        self.state().words.insert(device.to_owned(), word);
    }

    /// The mountinfo read from inside the namespace behind `ns_file`.
    pub fn mountinfo_in(&self, ns_file: &Path, text: &str) {
        self.state().mountinfo_in.insert(ns_file.to_owned(), text.as_bytes().to_vec());
    }

    /// Root processes named multipathd that hold no control socket.
    pub fn multipathd_without_socket(&self, pids: &[u32]) {
        self.state().multipathd_others = pids.to_vec();
    }

    /// How a program run in the host's namespaces exits (unscripted: 0, no output).
    pub fn child_exit(&self, exit: ChildExit) {
        self.state().child_exit = Some(exit);
    }

    /// The next `call` fails with `errno` (once per scripting).
    pub fn fail(&self, call: Call, errno: i32) {
        self.state().failures.push((call, errno));
    }

    /// After `call` succeeds, the kernel does `effects`.
    pub fn on(&self, call: Call, effects: Vec<Effect>) {
        self.state().effects.push((call, effects));
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The calls so far that changed the kernel, in order.
    pub fn writes(&self) -> Vec<Call> {
        self.state().calls.iter().filter(|c| c.is_write()).cloned().collect()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `call`; its scripted failure if there is one; else, for a write, its effects.
    fn record(&self, call: Call) -> io::Result<()> {
        let mut s = self.state();
        s.calls.push(call.clone());
        if let Some(i) = s.failures.iter().position(|(c, _)| *c == call) {
            let (_, errno) = s.failures.remove(i);
            return Err(io::Error::from_raw_os_error(errno));
        }
        if call.is_write() {
            let effects: Vec<Effect> =
                s.effects.iter().filter(|(c, _)| *c == call).flat_map(|(_, e)| e.clone()).collect();
            for e in effects {
                apply(&mut s, e);
            }
        }
        Ok(())
    }

    fn node_of(&self, f: &RecordedFile) -> io::Result<ScriptedNode> {
        self.state().nodes.get(&f.0).cloned().ok_or_else(|| io::Error::from_raw_os_error(libc::ENOTTY))
    }
}

impl Default for RecordingKernel {
    fn default() -> Self {
        Self::new()
    }
}

fn apply(s: &mut State, effect: Effect) {
    match effect {
        Effect::Remove(p) => {
            let meta = std::fs::symlink_metadata(&p).expect("an effect removes what is there");
            if meta.is_dir() {
                std::fs::remove_dir_all(&p).expect("remove dir");
            } else {
                std::fs::remove_file(&p).expect("remove");
            }
        }
        Effect::WriteFile(p, text) => std::fs::write(&p, text).expect("effect write"),
        Effect::Unbind(p) => {
            if let Some(n) = s.nodes.get_mut(&p) {
                n.loop_backing = None;
            }
        }
        Effect::DropMap(uuid) => {
            s.maps.remove(&uuid);
        }
        Effect::MountinfoIn(ns_file, text) => {
            s.mountinfo_in.insert(ns_file, text.into_bytes());
        }
    }
}

/// Copies a fixture tree, symlinks as symlinks (sysfs's are relative).
pub(crate) fn copy_tree(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).expect("read fixture") {
        let e = e.expect("entry");
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type().expect("type");
        if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).expect("link"), &dst).expect("symlink");
        } else if t.is_dir() {
            std::fs::create_dir_all(&dst).expect("mkdir");
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).expect("copy");
        }
    }
}

#[path = "recording_kernel_calls.rs"]
mod calls;
