//! blockjanitor: find who holds each block device on a Linux node, across every mount
//! namespace, and release stale holders safely.
//!
//! Data flows one way: [`discover`] scanners read the host into a [`snapshot::Snapshot`] (with
//! its [`blindspot`]s); [`graph`] joins devices to their holders; [`policy`] judges each device
//! (grace clocks in [`grace`], bound to an [`identity`]); [`plan`] turns a request into ordered,
//! idempotent steps; the [`gates`] stand between evidence and every destructive step; [`act`] is
//! the only code that writes to the kernel; [`journal`] records every destructive step before
//! and after it runs. One [`engine`] composes all of it, for the CLI, the daemon and the tests.
//! See ARCHITECTURE.md.

pub mod act;
pub mod cli;
pub mod client;
pub mod config;
pub mod daemon;
pub mod discover;
pub mod engine;
pub mod errors;
pub mod fleet_plan;
pub mod fleet_render;
pub mod graph;
pub mod host;
pub mod judge;
pub mod kube;
pub mod model;
pub mod plan;
pub mod server;
pub mod snapshot;
