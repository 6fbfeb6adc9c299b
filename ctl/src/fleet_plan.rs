//! `agentctl fleet plan` and the checks `agentctl fleet apply` makes on the console's dry run:
//! which nodes and devices the arguments name (`NODE` for every stale device on it, or
//! `NODE/DEVICE`), each node's plan summarised as the console's Apply dry run summarises it (the
//! same table), and whether the dry run's steps fit the fleet-wide budget left this minute.
//! Pure: the plans come in.

use std::collections::BTreeSet;

use blockjanitor_proto::v1 as pb;

/// Nodes and their devices from `NODE` or `NODE/DEVICE` arguments, in order (a bare `NODE`:
/// every stale device on it, an empty list). A node named both ways is an error.
pub fn plan_targets(args: &[String]) -> Result<Vec<(String, Vec<String>)>, String> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut whole = BTreeSet::new();
    for a in args {
        let (node, device) = match a.split_once('/') {
            None if !a.is_empty() => (a.as_str(), None),
            Some((n, d)) if !n.is_empty() && !d.is_empty() && !d.contains('/') => (n, Some(d)),
            _ => return Err(format!("'{a}' is not NODE or NODE/DEVICE (e.g. node-a or node-a/rbd4)")),
        };
        let at = out.iter().position(|(n, _)| n == node);
        match (device, at) {
            (None, None) => {
                whole.insert(node.to_owned());
                out.push((node.to_owned(), Vec::new()));
            }
            (Some(d), None) => out.push((node.to_owned(), vec![d.to_owned()])),
            (Some(d), Some(i)) if !whole.contains(node) => out[i].1.push(d.to_owned()),
            _ => {
                return Err(format!(
                    "node {node} is named alone (every stale device) and with devices: give one or the other"
                ))
            }
        }
    }
    if out.is_empty() {
        return Err("name at least one NODE or NODE/DEVICE".to_owned());
    }
    Ok(out)
}

/// How a device the agent's plan leaves out is worded in a node's refusal.
pub const UNCOVERED: &str = "the agent's plan does not cover it";

/// One node's plan as the dry run shows it: its steps, and why its part would be refused (a
/// device's refusal, a device the plan does not cover, the plan not to be had).
pub fn summarise(
    node: &str,
    devices: &[String],
    plan: Result<pb::PlanResponse, String>,
) -> pb::NodePlanSummary {
    let plan = match plan {
        Ok(p) => p,
        Err(e) => {
            return pb::NodePlanSummary {
                node: node.to_owned(),
                plan: None,
                steps: 0,
                refusal: format!("its plan could not be had: {e}"),
            }
        }
    };
    let mut refusals: Vec<String> = devices
        .iter()
        .filter(|d| !plan.plans.iter().any(|p| &p.device == *d))
        .map(|d| format!("{d}: {UNCOVERED}"))
        .collect();
    refusals.extend(
        plan.plans.iter().filter(|p| !p.refusal.is_empty()).map(|p| format!("{}: {}", p.device, p.refusal)),
    );
    if devices.is_empty() && plan.plans.is_empty() {
        refusals.push("no stale device to clean".to_owned());
    }
    let steps = plan.plans.iter().map(|p| p.steps.len()).sum::<usize>();
    pb::NodePlanSummary {
        node: node.to_owned(),
        steps: u32::try_from(steps).unwrap_or(u32::MAX),
        refusal: refusals.join("; "),
        plan: Some(plan),
    }
}

/// Why the dry run's steps cannot run now under the fleet-wide budget (`None`: they fit, or
/// there is no budget).
pub fn over_budget(r: &pb::FleetApplyResponse) -> Option<String> {
    let steps: u32 = r.summary.iter().map(|s| s.steps).sum();
    if r.budget_steps_per_minute == 0 || steps <= r.budget_steps_left {
        return None;
    }
    Some(if steps > r.budget_steps_per_minute {
        format!(
            "REFUSED by the fleet budget: these {steps} step(s) are more than the whole budget ({} steps a \
             minute, the console's --fleet-steps-per-minute): split them into smaller applies",
            r.budget_steps_per_minute
        )
    } else {
        format!(
            "REFUSED by the fleet budget: these {steps} step(s) need more than the {} of {} steps left this \
             minute (the console's --fleet-steps-per-minute): try again within a minute",
            r.budget_steps_left, r.budget_steps_per_minute
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn targets_are_nodes_or_node_devices() {
        let t = plan_targets(&s(&["a", "b/rbd4", "b/nbd0"])).expect("ok");
        assert_eq!(t, vec![("a".to_owned(), vec![]), ("b".to_owned(), s(&["rbd4", "nbd0"]))]);
        for bad in [&["a", "a/rbd4"][..], &["/rbd4"], &["a/"], &["a/b/c"], &[""], &[]] {
            assert!(plan_targets(&s(bad)).is_err(), "{bad:?}");
        }
    }

    fn plan(device: &str, refusal: &str, steps: usize) -> pb::DevicePlan {
        pb::DevicePlan {
            device: device.into(),
            refusal: refusal.into(),
            steps: vec![pb::Step::default(); steps],
            ..Default::default()
        }
    }

    #[test]
    fn a_plan_is_summarised_with_its_refusals() {
        let p = pb::PlanResponse {
            plans: vec![plan("rbd4", "", 2), plan("rbd0", "in use: mounted at /mnt", 0)],
            ..Default::default()
        };
        let n = summarise("a", &s(&["rbd4", "rbd0", "loop9"]), Ok(p));
        assert_eq!(n.steps, 2);
        assert_eq!(n.refusal, "loop9: the agent's plan does not cover it; rbd0: in use: mounted at /mnt");
        let n = summarise("b", &[], Ok(pb::PlanResponse::default()));
        assert_eq!(n.refusal, "no stale device to clean");
        let n = summarise("c", &[], Err("the agent on c is not connected".into()));
        assert!(n.refusal.starts_with("its plan could not be had: "), "{}", n.refusal);
    }

    #[test]
    fn the_budget_refuses_clearly() {
        let mut r = pb::FleetApplyResponse {
            summary: vec![pb::NodePlanSummary { steps: 3, ..Default::default() }],
            budget_steps_left: 5,
            budget_steps_per_minute: 20,
            ..Default::default()
        };
        assert_eq!(over_budget(&r), None);
        r.budget_steps_left = 2;
        assert!(over_budget(&r).is_some_and(|m| m.contains("more than the 2 of 20 steps left")));
        r.budget_steps_per_minute = 2;
        assert!(over_budget(&r).is_some_and(|m| m.contains("more than the whole budget")));
        r.budget_steps_per_minute = 0;
        assert_eq!(over_budget(&r), None, "no budget");
    }
}
