//! blockjanitor: find who holds each block device on a Linux node, across every mount
//! namespace, and release stale holders safely.
//!
//! Data flows one way: [`discover`] scanners read the host into a [`snapshot::Snapshot`];
//! [`graph`] joins devices to their holders; [`plan`] turns a request into ordered, idempotent
//! steps; [`act`] is the only code that writes to the kernel; [`journal`] records every
//! destructive step before and after it runs. See ARCHITECTURE.md.

pub mod act;
pub mod client;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod discover;
pub mod dmioctl;
pub mod errors;
pub mod graph;
pub mod host;
pub mod journal;
pub mod kube;
pub mod metrics;
pub mod model;
pub mod nsenter;
pub mod owner;
pub mod parallel;
pub mod plan;
pub mod policy;
pub mod render;
pub mod resolve;
pub mod server;
pub mod snapshot;
pub mod storage;
pub mod sys;
