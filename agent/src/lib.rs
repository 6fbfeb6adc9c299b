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
pub mod blindspot;
pub mod bounded;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod discover;
pub mod dmioctl;
pub mod durable;
pub mod engine;
pub mod errors;
pub mod gates;
pub mod grace;
pub mod graph;
pub mod host;
pub mod identity;
pub mod journal;
pub mod kube;
pub mod metrics;
pub mod model;
pub mod mount_events;
pub mod nsenter;
pub mod nvme;
pub mod nvme_view;
pub mod outage;
pub mod owner;
pub mod parallel;
pub mod plan;
pub mod plan_iscsi;
pub mod policy;
pub mod protect;
pub mod render;
pub mod resolve;
pub mod scan;
pub mod server;
pub mod snapshot;
pub mod stack;
pub mod stall;
pub mod storage;
pub mod sys;
pub mod view;
