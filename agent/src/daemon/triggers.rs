//! What wakes the scanner: block uevents, host mount-table changes and a slow timer.
//!
//! Uevents: the kernel's own netlink group (`NETLINK_KOBJECT_UEVENT`, group 1) works with or
//! without udevd; when udevd runs, the `udev` crate's monitor (group 2, after udev's rules) is used
//! as well. Mount changes: `/proc/<host pid>/mountinfo` becomes readable with `POLLPRI` whenever
//! that namespace's mount table changes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::watch;

use super::state::AgentState;

/// Opens a socket on the kernel's uevent multicast group.
fn kernel_uevent_socket() -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the returned fd is checked and owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::NETLINK_KOBJECT_UEVENT,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_nl is plain data; zeroed is a valid starting value.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr.nl_groups = 1; // the kernel's own events
                        // SAFETY: addr is a valid sockaddr_nl of the length passed.
    let rc = unsafe {
        libc::bind(
            owned.as_raw_fd(),
            &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(owned)
}

/// Registers an fd with the runtime for `interest`. `inner` must keep its descriptor open,
/// unchanged, until the returned AsyncFd is dropped (it owns it, or borrows it from an owner
/// that outlives the AsyncFd).
pub(super) fn register<T: AsRawFd>(inner: T, interest: Interest) -> std::io::Result<AsyncFd<T>> {
    // SAFETY: every caller passes a descriptor that stays open and unchanged while the AsyncFd
    // lives: an owned one (OwnedFd, File, udev::MonitorSocket), or the mount watch's, borrowed
    // while the Arc that owns it is held alongside.
    unsafe { AsyncFd::register_with_interest(inner, interest) }
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// True when a uevent message (`ACTION@DEVPATH\0KEY=VALUE\0...`) is about a block device.
pub fn is_block_uevent(msg: &[u8]) -> bool {
    msg.split(|b| *b == 0).any(|f| f == b"SUBSYSTEM=block")
}

/// The kernel name of the block device a uevent message is about (`DEVNAME=loop3`, else the
/// last component of `DEVPATH`); `None` for other subsystems or a name that is not one.
pub fn block_uevent_device(msg: &[u8]) -> Option<String> {
    if !is_block_uevent(msg) {
        return None;
    }
    let field = |key: &[u8]| msg.split(|b| *b == 0).find_map(|f| f.strip_prefix(key));
    let name = field(b"DEVNAME=").or_else(|| field(b"DEVPATH=")?.rsplit(|b| *b == b'/').next())?;
    let name = std::str::from_utf8(name).ok()?;
    let name = name.strip_prefix("/dev/").unwrap_or(name);
    crate::model::DeviceName::new(name).ok().map(|n| n.to_string())
}

/// Wakes the scanner on block uevents from the kernel.
pub async fn watch_kernel_uevents(state: Arc<AgentState>, mut shutdown: watch::Receiver<bool>) {
    let fd = match kernel_uevent_socket().and_then(|s| register(s, Interest::READABLE)) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(
                "cannot listen to kernel uevents ({e}); relying on the mount-table watch and the timer"
            );
            return;
        }
    };
    tracing::info!("listening to kernel block uevents (netlink group 1)");
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            ready = fd.readable() => {
                let Ok(mut guard) = ready else { return };
                loop {
                    // SAFETY: buf is valid for writes of its length.
                    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                    if n <= 0 {
                        break;
                    }
                    let msg = &buf[..n as usize];
                    // The device it names is read again, with what is stacked on it; a block
                    // uevent without a usable name asks for a full scan.
                    match block_uevent_device(msg) {
                        Some(name) => state.request_device_rescan(name),
                        None if is_block_uevent(msg) => state.request_rescan("uevent"),
                        None => {}
                    }
                }
                guard.clear_ready();
            }
        }
    }
}

/// Wakes the scanner on udev's block events when udevd runs (it does not on every host). The
/// udev monitor is not `Send`, so it lives on its own thread, polling with a 1 s timeout to notice
/// shutdown.
pub fn spawn_udev_watch(state: Arc<AgentState>, shutdown: watch::Receiver<bool>) {
    if !std::path::Path::new("/run/udev/control").exists() {
        tracing::info!("udevd is not running (no /run/udev/control): using kernel uevents only");
        return;
    }
    let spawned = std::thread::Builder::new().name("blockjanitor-udev".into()).spawn(move || {
        let socket = match udev::MonitorBuilder::new()
            .and_then(|b| b.match_subsystem("block"))
            .and_then(|b| b.listen())
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("cannot open a udev monitor ({e}); using kernel uevents only");
                return;
            }
        };
        tracing::info!("listening to udev block events");
        while !*shutdown.borrow() {
            let mut pfd = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd, for the length passed.
            let n = unsafe { libc::poll(&mut pfd, 1, 1000) };
            if n <= 0 {
                continue;
            }
            for event in socket.iter() {
                match crate::model::DeviceName::new(&event.sysname().to_string_lossy()) {
                    Ok(name) => state.request_device_rescan(name.to_string()),
                    Err(_) => state.request_rescan("udev"),
                }
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the udev thread ({e}); using kernel uevents only");
    }
}

/// Wakes the scanner when the host's mount table changes (`POLLPRI` on its mountinfo).
pub async fn watch_mount_table(state: Arc<AgentState>, mut shutdown: watch::Receiver<bool>) {
    // PID 1 is the host's; where it cannot be read, kthreadd shares the initial namespace.
    let file = [1u32, 2]
        .iter()
        .find_map(|pid| std::fs::File::open(state.host.proc_pid(*pid).join("mountinfo")).ok());
    let Some(file) = file else {
        tracing::warn!("cannot open the host's mountinfo; mount changes are seen only by the timer");
        return;
    };
    let fd = match register(file, Interest::PRIORITY) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(
                "cannot poll the host's mountinfo ({e}); mount changes are seen only by the timer"
            );
            return;
        }
    };
    tracing::info!("watching the host's mount table");
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            ready = fd.ready(Interest::PRIORITY) => {
                let Ok(mut guard) = ready else { return };
                // The kernel's poll() records the event it reported; nothing to read.
                guard.clear_ready();
                state.request_rescan("mount");
            }
        }
    }
}

/// Wakes the scanner every `every`.
pub async fn timer(state: Arc<AgentState>, every: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => state.request_rescan("timer"),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn block_uevents() {
        let add = b"add@/devices/virtual/block/loop3\0ACTION=add\0DEVPATH=/devices/virtual/block/loop3\0SUBSYSTEM=block\0MAJOR=7\0";
        assert!(super::is_block_uevent(add));
        assert!(!super::is_block_uevent(b"change@/devices/system/cpu\0SUBSYSTEM=cpu\0"));
    }

    #[test]
    fn the_device_a_block_uevent_names() {
        let add = b"add@/devices/virtual/block/loop3\0ACTION=add\0DEVPATH=/devices/virtual/block/loop3\0SUBSYSTEM=block\0MAJOR=7\0MINOR=3\0DEVNAME=loop3\0DEVTYPE=disk\0SEQNUM=4242\0";
        assert_eq!(super::block_uevent_device(add).as_deref(), Some("loop3"));
        let no_devname = b"change@/devices/virtual/block/dm-2\0ACTION=change\0DEVPATH=/devices/virtual/block/dm-2\0SUBSYSTEM=block\0";
        assert_eq!(super::block_uevent_device(no_devname).as_deref(), Some("dm-2"));
        assert_eq!(super::block_uevent_device(b"add@/x\0SUBSYSTEM=block\0DEVNAME=../etc\0"), None);
        assert_eq!(
            super::block_uevent_device(b"add@/devices/system/cpu/cpu1\0SUBSYSTEM=cpu\0DEVNAME=cpu1\0"),
            None
        );
    }
}
