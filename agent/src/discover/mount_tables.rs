//! Whole mount tables, for the one question the routine scan does not answer: what an unmount
//! would take with it through mount propagation (`graph::propagation`, gotcha 29). The scan
//! fully parses only the lines of the devices in scope; the parent of a mount is usually on
//! another device, and the mounts that receive from it can be in namespaces that mount no
//! device in scope. So a release reads, right when it is planned and again right before each
//! detach, the whole table of the namespaces it asks about: each namespace once, in parallel,
//! through a task checked to be in it now and at its root (its mountinfo then shows every
//! mount), or by entering it (every task chrooted, or a namespace only a pin keeps). A table
//! that cannot be read is an error naming the namespace, never an empty table.

use std::io::Read;

use super::mount_namespace::{MountNamespace, NsEntry};
use super::mountinfo::{self, MountEntry};
use super::processes::task_mount_ns;
use super::{is_gone, DiscoverError};
use crate::host::{nsenter, parallel, HostRoot};
use crate::model::MountNsId;

/// The whole table of every namespace of `namespaces` that `wanted` accepts, in their order,
/// each read once (in parallel); an error names what could not be read.
pub fn read_tables(
    host: &HostRoot,
    namespaces: &[MountNamespace],
    wanted: impl Fn(MountNsId) -> bool,
) -> Vec<(MountNsId, Result<Vec<MountEntry>, DiscoverError>)> {
    let list: Vec<&MountNamespace> = namespaces.iter().filter(|n| wanted(n.id)).collect();
    let read = parallel::map(&list, |ns| read_table(host, ns));
    list.iter().map(|n| n.id).zip(read).collect()
}

/// The whole mount table of one namespace, read now.
pub fn read_table(host: &HostRoot, ns: &MountNamespace) -> Result<Vec<MountEntry>, DiscoverError> {
    let live = host.is_live();
    if let Some(pin) = &ns.pinned_by {
        return entered(host, ns.id, pin);
    }
    let here = |pid: u32, tid: u32| !live || task_mount_ns(&host.proc_task(pid, tid)) == Some(ns.id);
    let mut first_here = None;
    for &(pid, tid) in &ns.tasks {
        if !here(pid, tid) {
            continue;
        }
        first_here.get_or_insert((pid, tid));
        let at_root =
            std::fs::read_link(host.proc_task(pid, tid).join("root")).map_or(!live, |r| r.as_os_str() == "/");
        if !at_root {
            continue;
        }
        let path = host.proc_task(pid, tid).join("mountinfo");
        let mut text = Vec::new();
        match std::fs::File::open(&path).and_then(|mut f| f.read_to_end(&mut text)) {
            Ok(_) if text.is_empty() => continue, // exited between open and read
            Ok(_) => {}
            Err(e) if is_gone(&e) => continue,
            Err(e) => return Err(DiscoverError::read(&path, e)),
        }
        // Still there after the read: the text is this namespace's, not one it moved to.
        if !here(pid, tid) {
            continue;
        }
        return mountinfo::parse(&text).map_err(|source| DiscoverError::MountInfo { path, source });
    }
    match first_here {
        // Every task is chrooted: the namespace's own root, by entering it.
        Some((pid, tid)) if live => entered(host, ns.id, &NsEntry::TaskNamespace { pid, tid }),
        // Its last task left and nothing pinned it: the kernel tore it down with its mounts, so
        // nothing there can receive propagation. Only on the kernel's own word (`listmount` by
        // the namespace's ID answers ENOENT), never because no task was found.
        _ if live && ns.kernel_id.is_some_and(|id| !crate::host::sys::mount_api::ns_exists(id)) => {
            Ok(Vec::new())
        }
        _ => Err(DiscoverError::read(
            host.proc(),
            std::io::Error::other(format!(
                "no task of mount namespace {} is left in it to read its table through, and nothing pins it",
                ns.id.0
            )),
        )),
    }
}

/// The table of the namespace behind `entry`, read from inside it, once its file is checked to
/// be namespace `id`.
fn entered(host: &HostRoot, id: MountNsId, entry: &NsEntry) -> Result<Vec<MountEntry>, DiscoverError> {
    let file = entry.ns_file(host);
    let ino = crate::host::sys::stat_cached(&file).map_err(|e| DiscoverError::read(&file, e))?.ino;
    if ino != id.0 {
        return Err(DiscoverError::read(
            &file,
            std::io::Error::other(format!("it is mount namespace {ino} now, not {}", id.0)),
        ));
    }
    let text = nsenter::read_mountinfo(&file, host.proc()).map_err(|e| DiscoverError::read(&file, e))?;
    mountinfo::parse(&text).map_err(|source| DiscoverError::MountInfo { path: file, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the live kernel: this process's namespace is read whole (every line, not only those of
    /// some device), through a task that is there; a namespace none of whose tasks is there any
    /// more is an error naming it, never an empty table.
    #[test]
    fn a_namespace_is_read_whole_or_named_as_unreadable() {
        let host = HostRoot::default();
        let me = std::process::id();
        let Some(id) = task_mount_ns(&host.proc_task(me, me)) else {
            eprintln!("SKIPPED: cannot read this process's ns/mnt");
            return;
        };
        let mut ns = MountNamespace::empty(id);
        ns.tasks = vec![(me, me)];
        ns.pids = vec![me];
        let whole = read_table(&host, &ns).expect("read");
        let text = std::fs::read("/proc/self/mountinfo").expect("mountinfo");
        assert_eq!(whole.len(), text.iter().filter(|&&b| b == b'\n').count(), "every line");
        let mut elsewhere = MountNamespace::empty(MountNsId(id.0 + 1_000_000));
        elsewhere.tasks = vec![(me, me)];
        let err = read_table(&host, &elsewhere).expect_err("not there").to_string();
        assert!(err.contains(&(id.0 + 1_000_000).to_string()), "{err}");
        let read = read_tables(&host, &[ns, elsewhere], |_| true);
        assert_eq!((read[0].0, read[0].1.is_ok(), read[1].1.is_ok()), (id, true, false));
    }

    /// On the live kernel (root): a namespace whose last task left, with nothing pinning it, is
    /// gone with its mounts (the kernel's `listmount` by its ID says so): an empty table, not an
    /// error; the same namespace with no ID to ask the kernel about stays an error.
    #[test]
    fn a_namespace_the_kernel_tore_down_has_no_mounts_left() {
        use std::os::fd::AsFd;
        if !nix::unistd::geteuid().is_root() {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs as root");
            eprintln!("SKIPPED: needs root (a mount namespace of its own)");
            return;
        }
        let host = HostRoot::default();
        let (ino, kernel_id, tid) = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS | nix::sched::CloneFlags::CLONE_NEWNS)
                .expect("unshare");
            let file = std::fs::File::open("/proc/thread-self/ns/mnt").expect("ns");
            let ino = std::os::unix::fs::MetadataExt::ino(&file.metadata().expect("stat"));
            let id = crate::host::sys::mount_api::mntns_id(file.as_fd()).ok();
            (ino, id, nix::unistd::gettid().as_raw() as u32)
        })
        .join()
        .expect("the thread");
        let Some(kernel_id) = kernel_id else {
            eprintln!("SKIPPED: NS_GET_MNTNS_ID unavailable on this kernel");
            return;
        };
        let mut ns = MountNamespace::empty(MountNsId(ino));
        ns.tasks = vec![(std::process::id(), tid)];
        let gone = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            !crate::host::sys::mount_api::ns_exists(kernel_id)
        });
        assert!(gone, "the kernel keeps a namespace with no task and no pin");
        ns.kernel_id = Some(kernel_id);
        assert_eq!(read_table(&host, &ns).expect("gone: no mounts").len(), 0);
        ns.kernel_id = None;
        assert!(read_table(&host, &ns).is_err(), "without the kernel's word it stays unreadable");
    }
}
