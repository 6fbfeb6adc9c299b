//! blockjanitor-ctl: `agentctl` (and the kubectl plugin, `kubectl-blockjanitor`, a link to it)
//! and the renderers of the agent's and the console's answers. Needs the wire (proto) and
//! blockjanitor-rpc only, never the agent.
//!
//! [`exit`] holds the exit codes (the agent's own). [`names`] turns enum values into lower-case names; [`values`] renders responses as JSON and
//! YAML values; [`text`], [`plan`] and [`apply`] render them as text (with [`table`] and
//! [`time`]); [`fleet_render`], [`fleet_plan`] and [`fleet_apply`] do the same for the console;
//! [`kubectl`] reaches the console through the Kubernetes API (kubeconfig, port-forward);
//! [`cli`] is agentctl itself (flags in `cli/args.rs`, commands in `cli/node.rs` and
//! `cli/fleet.rs`).

pub mod apply;
pub mod cli;
pub mod exit;
pub mod fleet_apply;
pub mod fleet_plan;
pub mod fleet_render;
pub mod kubectl;
pub mod names;
pub mod plan;
pub mod table;
pub mod text;
pub mod time;
pub mod values;

#[cfg(test)]
mod tests;
