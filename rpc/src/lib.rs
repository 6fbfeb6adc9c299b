//! blockjanitor-rpc: the wire side shared by the agent's gRPC server, the fleet console and
//! agentctl. Role rules ([`auth`]) from the peer's credentials ([`peer`]) or the client
//! certificate; the `:authority` fix every listener reads through ([`authority`]); TLS
//! termination ([`tls`]); a per-client rate limit ([`peer_limit`]); health and reflection
//! ([`health`]); `/metrics` over HTTP ([`metrics_http`]); the caller's side of a connection
//! ([`client`]); errors on one line ([`errors`]) and sizes for people ([`units`]); the example
//! lines of a `--help`, for both CLIs' tests ([`help_examples`]); a path `holders` takes to the
//! device its filesystem lives on, on the caller's side ([`path_device`]). It knows
//! nothing of devices or the fleet: never depends on the agent.

/// `AsyncWrite` for a stream wrapper that writes straight through to its `inner` stream (the
/// wrappers in this crate only look at what is read).
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
pub mod client;
pub mod errors;
pub mod health;
pub mod help_examples;
pub mod metrics_http;
pub mod path_device;
pub mod peer;
pub mod peer_limit;
pub mod tls;
pub mod units;
pub mod view;
