//! A unix-socket connection that carries what the kernel said about its peer when it connected:
//! `SO_PEERCRED` (uid, gid, pid) and `SO_PEERGROUPS` (supplementary groups). The roles in
//! `auth.rs` come from these, never from `/proc/PID/status` read later (the peer may have exited
//! and its pid been reused by then).

use std::io;
use std::os::fd::AsFd;
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
        let groups = crate::host::sys::peer_groups(inner.as_fd())
            .map(Arc::new)
            .map_err(|e| format!("SO_PEERGROUPS: {e}"));
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
