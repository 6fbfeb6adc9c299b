//! The live kernel behind the [`Kernel`] seam: each call is the code the actuators made before
//! the seam existed, moved here unchanged (the syscalls themselves are in `host/`, `act/unmount.rs`,
//! `act/host_command.rs` and `act/multipathd.rs`).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::kernel::{ChildExit, Kernel, LoopBacking, MapStatus, Open, TargetStatus};
use super::multipathd::{self, Reply};
use super::{host_command, unmount, ActError};
use crate::discover::control_socket::{self, Owners};
use crate::discover::iscsi::{self, IscsiDetail};
use crate::discover::probe::{self, KernelWord};
use crate::discover::{kmsg, processes, DiscoverError};
use crate::host::dmioctl::{Control, DmRef};
use crate::host::sys::{self, FileId};
use crate::host::{nsenter, HostRoot};
use crate::model::{DevNum, DeviceName, MountNsId};

/// The running kernel.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxKernel;

/// An open `/dev/mapper/control`.
pub struct DmControl(Control);

impl Kernel for LinuxKernel {
    type Node = File;
    type Control = DmControl;

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn is_file(&self, path: &Path) -> bool {
        path.is_file()
    }

    fn list_dir(&self, path: &Path) -> Result<Vec<String>, DiscoverError> {
        crate::discover::list_dir(path)
    }

    fn stat(&self, path: &Path) -> io::Result<FileId> {
        sys::stat_cached(path)
    }

    fn task_mount_ns(&self, task_dir: &Path) -> Option<MountNsId> {
        processes::task_mount_ns(task_dir)
    }

    fn read_mountinfo_in(&self, ns_file: &Path, proc: &Path) -> io::Result<Vec<u8>> {
        nsenter::read_mountinfo(ns_file, proc)
    }

    fn rbd_attach_records(&self, host: &HostRoot) -> HashMap<String, u64> {
        kmsg::read_rbd(host).attached
    }

    fn iscsi_detail(&self, host: &HostRoot, sid: u32) -> Result<Option<IscsiDetail>, DiscoverError> {
        iscsi::detail(host, sid)
    }

    fn iscsi_targetname(&self, host: &HostRoot, sid: u32) -> Result<Option<String>, DiscoverError> {
        iscsi::targetname(host, sid)
    }

    fn iscsi_scsi_devices(&self, host: &HostRoot, sid: u32) -> Result<Vec<String>, DiscoverError> {
        iscsi::scsi_devices_of(host, sid)
    }

    fn iscsi_state(&self, host: &HostRoot, sid: u32) -> Result<Option<String>, DiscoverError> {
        iscsi::state(host, sid)
    }

    fn kernel_word(
        &self,
        host: &HostRoot,
        device: &DeviceName,
        devnum: DevNum,
        timeout: Duration,
    ) -> KernelWord {
        probe::kernel_word(host, device, devnum, timeout)
    }

    fn multipathd_owners(&self, host: &HostRoot) -> Result<Owners, String> {
        control_socket::owners(host, multipathd::COMM, multipathd::SOCKET)
    }

    fn open(&self, path: &Path, how: Open) -> io::Result<File> {
        match how {
            Open::Read => File::open(path),
            Open::ReadNonBlocking => {
                File::options().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)
            }
            Open::ReadWrite => File::options().read(true).write(true).open(path),
            Open::DirPath => File::options()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(path),
        }
    }

    fn disk_seq(&self, node: &File) -> io::Result<u64> {
        sys::disk_seq(node.as_fd())
    }

    fn loop_get_status(&self, node: &File) -> io::Result<LoopBacking> {
        let st = sys::loop_get_status(node.as_fd())?;
        Ok(LoopBacking { device: DevNum::from_dev_t(st.lo_device), inode: st.lo_inode })
    }

    fn dm_open(&self, path: &Path) -> io::Result<DmControl> {
        Control::open(path).map(DmControl)
    }

    fn dm_dev_status(&self, control: &DmControl, uuid: &str) -> io::Result<MapStatus> {
        let h = control.0.dev_status(DmRef::Uuid(uuid))?;
        Ok(MapStatus { dev: h.dev, open_count: h.open_count, name: h.name })
    }

    fn dm_table_status(&self, control: &DmControl, uuid: &str) -> io::Result<Vec<TargetStatus>> {
        let (_, targets) = control.0.table_status(DmRef::Uuid(uuid), false)?;
        Ok(targets
            .into_iter()
            .map(|t| TargetStatus { target_type: t.target_type, params: t.params })
            .collect())
    }

    fn loop_clear(&self, node: &File) -> io::Result<()> {
        sys::loop_clear(node.as_fd())
    }

    fn nbd_disconnect(&self, node: &File) -> io::Result<()> {
        sys::nbd_disconnect(node.as_fd())
    }

    fn nbd_clear_sock(&self, node: &File) -> io::Result<()> {
        sys::nbd_clear_sock(node.as_fd())
    }

    fn dm_message(&self, control: &DmControl, uuid: &str, message: &str) -> io::Result<()> {
        control.0.message(DmRef::Uuid(uuid), 0, message)
    }

    fn dm_remove(&self, control: &DmControl, uuid: &str, deferred: bool) -> io::Result<()> {
        control.0.remove(DmRef::Uuid(uuid), deferred)
    }

    fn write(&self, path: &Path, text: &[u8]) -> io::Result<()> {
        std::fs::write(path, text)
    }

    fn unmount_in_ns(
        &self,
        ns_file: &Path,
        root: Option<File>,
        proc: File,
        rel: PathBuf,
        mount_id: u32,
    ) -> io::Result<()> {
        nsenter::in_mount_ns(ns_file, move || {
            let root = match root {
                Some(fd) => fd,
                None => self_open_root()?,
            };
            unmount::unmount_exactly(&root.into(), &rel, mount_id, &proc.into())
        })
    }

    fn run_in_host_namespaces(
        &self,
        host: &HostRoot,
        device: &DeviceName,
        program: &Path,
        args: &[String],
        timeout: Duration,
    ) -> Result<ChildExit, ActError> {
        host_command::run_in_host_namespaces(host, device, program, args, timeout)
    }

    fn multipathd_ask(
        &self,
        ns_file: &Path,
        command: &str,
        timeout: Duration,
    ) -> io::Result<(Reply, Option<Reply>)> {
        multipathd::ask_alive_in(ns_file, multipathd::SOCKET, command, timeout)
    }

    fn remove_wwid(&self, path: &Path, wwid: &str) -> io::Result<bool> {
        multipathd::remove_wwid(path, wwid)
    }
}

/// The root of the mount namespace this thread entered, opened `O_PATH`.
fn self_open_root() -> io::Result<File> {
    File::options().read(true).custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC).open("/")
}
