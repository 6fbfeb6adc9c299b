//! blockjanitor-ctl: `agentctl` (and the kubectl plugin, `kubectl-blockjanitor`, a link to it)
//! and the renderers of the agent's and the console's answers. Needs the wire (proto) and
//! blockjanitor-rpc only, never the agent.
//!
//! The renderer of the agent's answers (documents, tables, names, exit codes) is
//! blockjanitor-rpc's `view`, shared with the agent's one-shot commands and re-exported here;
//! [`fleet_render`], [`fleet_plan`] and [`fleet_apply`] do the same for the console;
//! [`kubectl`] reaches the console through the Kubernetes API (kubeconfig, port-forward);
//! [`cli`] is agentctl itself (flags in `cli/args.rs`, commands in `cli/node.rs` and
//! `cli/fleet.rs`).

pub mod cli;
/// The shared renderer (moved to blockjanitor-rpc's `view`, so the agent renders the same way).
pub use blockjanitor_rpc::view::{
    apply, columns, doc, exit, explain, format, holders, names, pins, plan, scan, table, term, text, time,
    values,
};
pub mod fleet_apply;
pub mod fleet_pins;
pub mod fleet_plan;
pub mod fleet_render;
pub mod kubectl;

#[cfg(test)]
mod tests;
