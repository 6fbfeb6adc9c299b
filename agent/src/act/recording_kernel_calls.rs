//! How the recording kernel answers each [`Kernel`] call: recorded first; a read served from the
//! tree by the live code ([`LinuxKernel`]) or from the script; a write answered `Ok` (or its
//! scripted errno) and followed by its scripted effects, never reaching the tree or a kernel.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Call, RecordedFile, RecordingKernel};
use crate::act::kernel::{ChildExit, Kernel, LoopBacking, MapStatus, Open, TargetStatus};
use crate::act::kernel_linux::LinuxKernel;
use crate::act::multipathd::Reply;
use crate::act::ActError;
use crate::discover::control_socket::Owners;
use crate::discover::iscsi::IscsiDetail;
use crate::discover::probe::KernelWord;
use crate::discover::DiscoverError;
use crate::host::sys::FileId;
use crate::host::HostRoot;
use crate::model::{DevNum, DeviceName, MountNsId};

fn unsupported(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, format!("the recording kernel has no {what}"))
}

impl Kernel for RecordingKernel {
    type Node = RecordedFile;
    type Control = RecordedFile;

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.record(Call::Read(path.to_owned()))?;
        LinuxKernel.read(path)
    }

    fn exists(&self, path: &Path) -> bool {
        self.record(Call::Exists(path.to_owned())).is_ok() && LinuxKernel.exists(path)
    }

    fn is_file(&self, path: &Path) -> bool {
        self.record(Call::IsFile(path.to_owned())).is_ok() && LinuxKernel.is_file(path)
    }

    fn list_dir(&self, path: &Path) -> Result<Vec<String>, DiscoverError> {
        self.record(Call::ListDir(path.to_owned())).map_err(|e| DiscoverError::read(path, e))?;
        LinuxKernel.list_dir(path)
    }

    /// A scripted node's stat; anything else as the tree has it (a regular file, a directory).
    fn stat(&self, path: &Path) -> io::Result<FileId> {
        self.record(Call::Stat(path.to_owned()))?;
        match self.state().nodes.get(path) {
            Some(n) => Ok(n.stat),
            None => LinuxKernel.stat(path),
        }
    }

    fn task_mount_ns(&self, task_dir: &Path) -> Option<MountNsId> {
        self.record(Call::TaskMountNs(task_dir.to_owned())).ok()?;
        LinuxKernel.task_mount_ns(task_dir)
    }

    fn read_mountinfo_in(&self, ns_file: &Path, _proc: &Path) -> io::Result<Vec<u8>> {
        self.record(Call::ReadMountinfoIn(ns_file.to_owned()))?;
        let text = self.state().mountinfo_in.get(ns_file).cloned();
        text.ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    fn rbd_attach_records(&self, _host: &HostRoot) -> HashMap<String, u64> {
        let _ = self.record(Call::RbdAttachRecords);
        self.state().rbd_records.clone()
    }

    fn iscsi_detail(&self, host: &HostRoot, sid: u32) -> Result<Option<IscsiDetail>, DiscoverError> {
        let _ = self.record(Call::IscsiDetail(sid));
        LinuxKernel.iscsi_detail(host, sid)
    }

    fn iscsi_targetname(&self, host: &HostRoot, sid: u32) -> Result<Option<String>, DiscoverError> {
        let _ = self.record(Call::IscsiTargetname(sid));
        LinuxKernel.iscsi_targetname(host, sid)
    }

    fn iscsi_scsi_devices(&self, host: &HostRoot, sid: u32) -> Result<Vec<String>, DiscoverError> {
        let _ = self.record(Call::IscsiScsiDevices(sid));
        LinuxKernel.iscsi_scsi_devices(host, sid)
    }

    fn iscsi_state(&self, host: &HostRoot, sid: u32) -> Result<Option<String>, DiscoverError> {
        let _ = self.record(Call::IscsiState(sid));
        LinuxKernel.iscsi_state(host, sid)
    }

    fn kernel_word(
        &self,
        _host: &HostRoot,
        device: &DeviceName,
        _devnum: DevNum,
        _t: Duration,
    ) -> KernelWord {
        let _ = self.record(Call::KernelWord(device.to_string()));
        self.state().words.get(device.as_str()).cloned().unwrap_or_else(KernelWord::unclaimed)
    }

    fn multipathd_owners(&self, _host: &HostRoot) -> Result<Owners, String> {
        self.record(Call::MultipathdOwners).map_err(|e| e.to_string())?;
        Ok(Owners { owners: Vec::new(), others: self.state().multipathd_others.clone() })
    }

    /// A scripted node, or anything the tree has, opens; else `ENOENT`.
    fn open(&self, path: &Path, how: Open) -> io::Result<RecordedFile> {
        self.record(Call::Open(path.to_owned(), how))?;
        if self.state().nodes.contains_key(path) || path.exists() {
            return Ok(RecordedFile(path.to_owned()));
        }
        Err(io::Error::from_raw_os_error(libc::ENOENT))
    }

    fn disk_seq(&self, node: &RecordedFile) -> io::Result<u64> {
        self.record(Call::DiskSeq(node.0.clone()))?;
        self.node_of(node)?.diskseq.ok_or_else(|| io::Error::from_raw_os_error(libc::ENOTTY))
    }

    fn loop_get_status(&self, node: &RecordedFile) -> io::Result<LoopBacking> {
        self.record(Call::LoopGetStatus(node.0.clone()))?;
        self.node_of(node)?.loop_backing.ok_or_else(|| io::Error::from_raw_os_error(libc::ENXIO))
    }

    fn dm_open(&self, path: &Path) -> io::Result<RecordedFile> {
        self.record(Call::DmOpen(path.to_owned()))?;
        if !self.state().dm_control {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        Ok(RecordedFile(path.to_owned()))
    }

    fn dm_dev_status(&self, _control: &RecordedFile, uuid: &str) -> io::Result<MapStatus> {
        self.record(Call::DmDevStatus(uuid.to_owned()))?;
        let map = self.state().maps.get(uuid).map(|m| m.header.clone());
        map.ok_or_else(|| io::Error::from_raw_os_error(libc::ENXIO))
    }

    fn dm_table_status(&self, _control: &RecordedFile, uuid: &str) -> io::Result<Vec<TargetStatus>> {
        self.record(Call::DmTableStatus(uuid.to_owned()))?;
        let map = self.state().maps.get(uuid).map(|m| m.status.clone());
        map.ok_or_else(|| io::Error::from_raw_os_error(libc::ENXIO))
    }

    fn loop_clear(&self, node: &RecordedFile) -> io::Result<()> {
        self.record(Call::LoopClear(node.0.clone()))
    }

    fn nbd_disconnect(&self, node: &RecordedFile) -> io::Result<()> {
        self.record(Call::NbdDisconnect(node.0.clone()))
    }

    fn nbd_clear_sock(&self, node: &RecordedFile) -> io::Result<()> {
        self.record(Call::NbdClearSock(node.0.clone()))
    }

    fn dm_message(&self, _control: &RecordedFile, uuid: &str, message: &str) -> io::Result<()> {
        self.record(Call::DmMessage { uuid: uuid.to_owned(), message: message.to_owned() })
    }

    fn dm_remove(&self, _control: &RecordedFile, uuid: &str, deferred: bool) -> io::Result<()> {
        self.record(Call::DmRemove { uuid: uuid.to_owned(), deferred })
    }

    fn write(&self, path: &Path, text: &[u8]) -> io::Result<()> {
        let text = String::from_utf8_lossy(text).into_owned();
        self.record(Call::Write { path: path.to_owned(), text })
    }

    fn unmount_in_ns(
        &self,
        ns_file: &Path,
        root: Option<RecordedFile>,
        _proc: RecordedFile,
        rel: PathBuf,
        mount_id: u32,
    ) -> io::Result<()> {
        let root = root.map(|r| r.0);
        self.record(Call::Unmount { ns_file: ns_file.to_owned(), root, rel, mount_id })
    }

    fn run_in_host_namespaces(
        &self,
        _host: &HostRoot,
        device: &DeviceName,
        program: &Path,
        args: &[String],
        _timeout: Duration,
    ) -> Result<ChildExit, ActError> {
        let call = Call::RunInHostNamespaces { program: program.to_owned(), args: args.to_vec() };
        self.record(call).map_err(|source| ActError::Syscall {
            device: device.clone(),
            op: "spawn",
            source,
        })?;
        Ok(self.state().child_exit.clone().unwrap_or((Some(0), String::new())))
    }

    fn multipathd_ask(&self, _ns: &Path, command: &str, _t: Duration) -> io::Result<(Reply, Option<Reply>)> {
        self.record(Call::MultipathdAsk(command.to_owned()))?;
        Err(unsupported("multipathd"))
    }

    fn remove_wwid(&self, path: &Path, wwid: &str) -> io::Result<bool> {
        self.record(Call::RemoveWwid { path: path.to_owned(), wwid: wwid.to_owned() })?;
        Ok(false)
    }
}
