//! The gRPC front: `blockjanitor.v1.Agent` plus `grpc.health.v1` and server reflection, on a
//! unix socket (roles from the peer's credentials) and on TCP with mutual TLS (roles from the
//! client certificate), and `/metrics` over HTTP. The wire pieces it shares with the console
//! (roles, TLS, peer credentials, the `:authority` fix, health and reflection, `/metrics`) are in
//! blockjanitor-rpc. What it answers with is the engine's answers on the wire
//! ([`crate::engine::wire`]); it converts only the daemon's events itself ([`convert`]).

pub mod convert;
mod event_cap;
pub mod listen;
pub mod service;
pub mod sim;
pub mod status;
