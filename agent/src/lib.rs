//! blockjanitor: find who holds each block device on a Linux node, across every mount
//! namespace, and release stale holders safely.
//!
//! Data flows one way, one folder per stage: [`discover`] scanners read the host into a
//! [`snapshot::Snapshot`] (with its [`model::blindspot`]s); [`graph`] joins devices to their
//! holders (per transport: `graph/multipath.rs`, `graph/nvme.rs`, `graph/stack.rs`); [`judge`]
//! gives each device a verdict (grace clocks in [`judge::grace`], bound to a
//! [`graph::identity`]), and its [`judge::gates`] stand between evidence and every destructive
//! step; [`plan`] turns a request into ordered, idempotent steps; [`act`] is the only code that
//! writes to the kernel, and its [`act::journal`] records every destructive step before and after
//! it runs. One [`engine`] composes all of it, for the CLI ([`cli`]), the daemon ([`daemon`]) and
//! the tests. See ARCHITECTURE.md.
//!
//! Layers, bottom first: a module may import only from its own folder or a folder below it
//! (tests/tests/structure.rs checks it, with no import circle between files either).
//! What agentctl and the console share with the agent (roles, TLS, health, connecting) is the
//! `blockjanitor-rpc` crate; agentctl is `blockjanitor-ctl`; neither depends on this crate.
//!
//! layers: model < host < discover < kube < snapshot < graph < judge < plan < act < engine < config < daemon < server < cli < errors

pub mod act;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod discover;
pub mod engine;
pub mod errors;
pub mod graph;
pub mod host;
pub mod judge;
pub mod kube;
pub mod model;
pub mod plan;
pub mod server;
pub mod snapshot;
