//! Pure planning: from a device's holders to ordered, idempotent steps, plus what is left alone
//! and why. Nothing here reads or writes the host, and nothing here decides whether a plan may
//! run: the gates ([`crate::judge::gates`]) and the engine do that.
//!
//! `release` detaches every mount of the device that lives in a namespace other than the host's,
//! except a copy (shared peer or slave, through any chain of peer groups) of a mount that is live
//! in the host's namespace; it never kills a process, and it is refused while a process in a
//! namespace it would detach a mount in uses the filesystem ([`release::release_with`]). `clean` tears a device down by its kind. Every step carries the kernel
//! identity of the device it acts on, re-checked right before it runs.

pub mod clean;
pub mod iscsi;
pub mod r#loop;
pub mod multipath;
pub mod nvme;
pub mod pod_volume;
pub mod rbd;
pub mod release;
pub mod scope;
pub mod scsi;
pub mod stack;
pub mod step;

pub use step::{Action, ActionKind, LeftAlone, Plan, Step};

use crate::graph::Holder;

impl Plan {
    fn unsupported(&mut self, reason: String) {
        self.steps.clear();
        self.refusal = Some(reason);
        self.unsupported = true;
    }

    fn held(&mut self, holders: &[&Holder], what: &str) {
        self.left_alone =
            holders.iter().map(|h| LeftAlone { holder: (*h).clone(), reason: h.describe() }).collect();
        let what = if what.is_empty() { String::new() } else { format!(" {what}") };
        self.refuse(format!("{} is still held by {} holder(s){what}", self.device, holders.len()));
    }
}

#[cfg(test)]
mod tests;
