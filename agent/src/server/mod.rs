//! The gRPC front: `blockjanitor.v1.Agent` plus `grpc.health.v1` and server reflection, on a
//! unix socket (roles from the peer's credentials) and on TCP with mutual TLS (roles from the
//! client certificate), and `/metrics` over HTTP.

pub mod auth;
pub mod authority;
pub mod convert;
pub mod listen;
pub mod metrics_http;
pub mod peer;
pub mod service;
pub mod status;
pub mod tls;
