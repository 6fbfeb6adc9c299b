//! A unix-socket connection that carries what the kernel said about its peer when it connected:
//! `SO_PEERCRED` (uid, gid, pid) and `SO_PEERGROUPS` (supplementary groups). The roles in
//! `auth.rs` come from these, never from `/proc/PID/status` read later (the peer may have exited
//! and its pid been reused by then).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::server::{Connected, UdsConnectInfo};

/// What tonic hands each request of the connection (in its extensions).
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub uds: UdsConnectInfo,
    /// The peer's supplementary groups at connect time, or why the kernel would not say.
    pub groups: Result<Arc<Vec<u32>>, String>,
}

/// An accepted unix-socket connection with its peer's credentials.
#[derive(Debug)]
pub struct PeerStream {
    inner: UnixStream,
    info: PeerInfo,
}

impl PeerStream {
    /// Reads the peer's credentials once, right after the accept.
    pub fn new(inner: UnixStream) -> Self {
        let uds = inner.connect_info();
        let groups = peer_groups(inner.as_fd()).map(Arc::new).map_err(|e| format!("SO_PEERGROUPS: {e}"));
        Self { inner, info: PeerInfo { uds, groups } }
    }
}

impl Connected for PeerStream {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for PeerStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

write_through!(PeerStream);

/// The supplementary groups of the process at the other end of a unix socket, as the kernel
/// recorded them when it connected (`SO_PEERGROUPS`, Linux 4.13): unlike `/proc/PID/status`,
/// immune to the peer exiting and its pid being reused.
pub fn peer_groups(fd: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = libc::socklen_t::try_from(groups.len() * std::mem::size_of::<libc::gid_t>())
            .map_err(|_| io::Error::other("too many groups"))?;
        // SAFETY: the fd is open for the call; `groups` is writable for `len` bytes, and the
        // kernel writes at most `len` bytes and stores the size it needs (or wrote) in `len`.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = usize::try_from(len).unwrap_or(0) / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ERANGE) && n > groups.len() {
            groups.resize(n, 0);
            continue;
        }
        return Err(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_kernel_names_the_peer_and_its_groups() {
        let (a, _b) = UnixStream::pair().expect("socketpair");
        let s = PeerStream::new(a);
        let info = s.connect_info();
        let cred = info.uds.peer_cred.expect("SO_PEERCRED");
        assert_eq!(cred.uid(), nix::unistd::getuid().as_raw());
        let mut want: Vec<u32> =
            nix::unistd::getgroups().expect("getgroups").iter().map(|g| g.as_raw()).collect();
        let mut got = info.groups.expect("SO_PEERGROUPS").to_vec();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want, "the kernel's record of our own supplementary groups");
    }
}
