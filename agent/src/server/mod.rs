//! The gRPC front: `blockjanitor.v1.Agent` plus `grpc.health.v1` and server reflection, on a
//! unix socket (roles from the peer's credentials) and on TCP with mutual TLS (roles from the
//! client certificate), and `/metrics` over HTTP.

/// `AsyncWrite` for a stream wrapper that writes straight through to its `inner` stream (the
/// wrappers in this module only look at what is read).
macro_rules! write_through {
    ($ty:ty $(, $gen:ident)?) => {
        impl$(<$gen: tokio::io::AsyncWrite + Unpin>)? tokio::io::AsyncWrite for $ty {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }
        }
    };
}

pub mod auth;
pub mod authority;
pub mod convert;
pub mod listen;
pub mod metrics_http;
pub mod peer;
pub mod service;
pub mod status;
pub mod tls;
