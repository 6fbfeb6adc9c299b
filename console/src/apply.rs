//! The console's Apply, before anything reaches an agent: which nodes and devices a request
//! names (every device with the identity its node's Plan answered for it, or the request is
//! refused naming the device), the dry run's summary of each node's plan and why a node's part
//! may not run, and the fleet-wide budget of steps a minute shared by every caller.
//!
//! All pure (time is passed in); [`crate::service`] asks the agents and forwards.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;

use crate::lease::ApplyLease;

/// The budget's window.
const WINDOW: Duration = Duration::from_secs(60);

/// One node's part of an Apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub node: String,
    pub devices: Vec<String>,
    pub identities: Vec<String>,
}

/// Why a request cannot be taken as it is (INVALID_ARGUMENT).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("name at least one node and its devices")]
    NoTarget,
    #[error("a target names no node")]
    NoNode,
    #[error("node {0} is named twice: give each node once, with all its devices")]
    Duplicate(String),
    #[error("no devices named on node {0}")]
    NoDevices(String),
    #[error(
        "no identity for {node}/{device}: pass the identity {node}'s Plan answered for it (Fleet.Plan, \
         or this Apply without execute, returns it), so that the agent refuses if the name now stands \
         for another device"
    )]
    NoIdentity { node: String, device: String },
    #[error("{node}: {identities} identities for {devices} devices: give one per device, in the same order")]
    Count { node: String, devices: usize, identities: usize },
}

/// The request's targets, in order: `node`/`devices`/`identities` first (when `node` is set),
/// then `targets`. Every device needs its identity.
pub fn targets(r: &pb::FleetApplyRequest) -> Result<Vec<Target>, RequestError> {
    let mut out = Vec::new();
    if !r.node.is_empty() || !r.devices.is_empty() || !r.identities.is_empty() {
        out.push(Target {
            node: r.node.clone(),
            devices: r.devices.clone(),
            identities: r.identities.clone(),
        });
    }
    out.extend(r.targets.iter().map(|t| Target {
        node: t.node.clone(),
        devices: t.devices.clone(),
        identities: t.identities.clone(),
    }));
    if out.is_empty() {
        return Err(RequestError::NoTarget);
    }
    let mut seen = HashSet::new();
    for t in &out {
        if t.node.trim().is_empty() {
            return Err(RequestError::NoNode);
        }
        if !seen.insert(t.node.as_str()) {
            return Err(RequestError::Duplicate(t.node.clone()));
        }
        if t.devices.is_empty() {
            return Err(RequestError::NoDevices(t.node.clone()));
        }
        // A device without its identity is named before a count mismatch is reported.
        for (i, d) in t.devices.iter().enumerate() {
            if t.identities.get(i).is_none_or(|id| id.trim().is_empty()) {
                return Err(RequestError::NoIdentity { node: t.node.clone(), device: d.clone() });
            }
        }
        if t.identities.len() != t.devices.len() {
            return Err(RequestError::Count {
                node: t.node.clone(),
                devices: t.devices.len(),
                identities: t.identities.len(),
            });
        }
    }
    Ok(out)
}

/// One node's dry run: its plan (or why it could not be had), and why its part may not run.
pub fn summarise(t: &Target, plan: Result<pb::PlanResponse, String>) -> pb::NodePlanSummary {
    let plan = match plan {
        Err(e) => {
            return pb::NodePlanSummary {
                node: t.node.clone(),
                plan: None,
                steps: 0,
                refusal: format!("its plan could not be had: {e}"),
            }
        }
        Ok(p) => p,
    };
    let mut refusals = Vec::new();
    for (device, identity) in t.devices.iter().zip(&t.identities) {
        match plan.plans.iter().find(|p| &p.device == device) {
            None => refusals.push(format!("{device}: the agent's plan does not cover it")),
            Some(p) if !p.refusal.is_empty() => refusals.push(format!("{device}: {}", p.refusal)),
            Some(p) if &p.identity != identity => refusals.push(format!(
                "{device}: the plan is for identity {} but the request carries {identity}: the name may \
                 stand for another device now; plan again",
                if p.identity.is_empty() { "(none)" } else { p.identity.as_str() },
            )),
            Some(_) => {}
        }
    }
    let steps = plan.plans.iter().map(|p| p.steps.len()).sum::<usize>();
    pb::NodePlanSummary {
        node: t.node.clone(),
        steps: u32::try_from(steps).unwrap_or(u32::MAX),
        refusal: refusals.join("; "),
        plan: Some(plan),
    }
}

/// The summary as lines for people: per node its steps, or why it may not run.
pub fn summary_text(summary: &[pb::NodePlanSummary]) -> String {
    summary
        .iter()
        .map(|s| {
            if s.refusal.is_empty() {
                let steps: Vec<String> = s
                    .plan
                    .iter()
                    .flat_map(|p| &p.plans)
                    .flat_map(|p| &p.steps)
                    .map(|st| format!("{} {}", st.action, st.device))
                    .collect();
                format!("{}: {} step(s): {}", s.node, s.steps, steps.join(", "))
            } else {
                format!("{}: refused: {}", s.node, s.refusal)
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The fleet-wide budget: at most `per_minute` steps in any minute, across every node and
/// caller (0: no budget). Steps are counted when an Apply is let through, whether they then
/// succeed or not. With several console replicas, only the holder of the apply Lease
/// ([`crate::lease`]) may spend it ([`StepBudget::may_apply`]), so the fleet has one budget.
pub struct StepBudget {
    per_minute: u32,
    spent: Mutex<VecDeque<(Instant, u32)>>,
    lease: ApplyLease,
    /// The takeover of the Lease already charged to the budget.
    charged_takeover: Mutex<Option<tokio::time::Instant>>,
}

/// An Apply the budget cannot take now.
#[derive(Debug, PartialEq, Eq)]
pub struct OverBudget {
    pub per_minute: u32,
    pub needed: u32,
    pub left: u32,
    /// When enough of the window frees; `None`: never (more than the whole budget).
    pub frees_in: Option<Duration>,
}

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the fleet-wide step budget ({} steps a minute, --fleet-steps-per-minute) has {} left and \
             this Apply needs {}: ",
            self.per_minute, self.left, self.needed
        )?;
        match self.frees_in {
            Some(d) => write!(f, "enough frees in {} s; nothing ran", d.as_secs() + 1),
            None => write!(f, "more than the whole budget, split it into smaller Applies; nothing ran"),
        }
    }
}

impl StepBudget {
    pub fn new(per_minute: u32) -> Self {
        StepBudget {
            per_minute,
            spent: Mutex::new(VecDeque::new()),
            lease: ApplyLease::alone(),
            charged_takeover: Mutex::new(None),
        }
    }

    /// The same budget, spent only while this replica holds `lease`.
    pub fn with_lease(mut self, lease: ApplyLease) -> Self {
        self.lease = lease;
        self
    }

    /// Whether this replica may carry out an Apply at `now`: always without a Lease; with one,
    /// only while it holds it, or why not (naming the holder). A replica that took the Lease over
    /// from another holder cannot know what that one spent: the whole budget is charged at the
    /// takeover, so the fleet never exceeds one budget in any minute across a change of holder.
    pub fn may_apply(&self, now: Instant) -> Result<(), String> {
        let took_over = self.lease.check(tokio::time::Instant::from_std(now))?;
        let mut charged = self.charged_takeover.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = took_over.filter(|t| *charged != Some(*t)) {
            *charged = Some(t);
            if self.per_minute > 0 {
                let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
                spent.push_back((t.into_std(), self.per_minute));
                tracing::info!(
                    steps = self.per_minute,
                    "took the apply Lease over: this minute's budget counts as spent"
                );
            }
        }
        Ok(())
    }

    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    fn prune(spent: &mut VecDeque<(Instant, u32)>, now: Instant) {
        while spent.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) >= WINDOW) {
            spent.pop_front();
        }
    }

    /// Steps left in the window at `now` (`u32::MAX` without a budget).
    pub fn left(&self, now: Instant) -> u32 {
        if self.per_minute == 0 {
            return u32::MAX;
        }
        let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        Self::prune(&mut spent, now);
        self.per_minute.saturating_sub(spent.iter().map(|(_, n)| *n).sum())
    }

    /// Takes `steps` from the budget at `now`, returning what is left, or says why not and when
    /// enough frees.
    pub fn take(&self, steps: u32, now: Instant) -> Result<u32, OverBudget> {
        if self.per_minute == 0 {
            return Ok(u32::MAX);
        }
        let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        Self::prune(&mut spent, now);
        let used: u32 = spent.iter().map(|(_, n)| *n).sum();
        let left = self.per_minute.saturating_sub(used);
        if steps <= left {
            spent.push_back((now, steps));
            return Ok(left - steps);
        }
        let frees_in = if steps > self.per_minute {
            None
        } else {
            // The oldest entries leave the window first: wait until enough of them have.
            let mut freed = left;
            let mut at = None;
            for (t, n) in spent.iter() {
                freed += n;
                if freed >= steps {
                    at = Some(WINDOW.saturating_sub(now.saturating_duration_since(*t)));
                    break;
                }
            }
            at
        };
        Err(OverBudget { per_minute: self.per_minute, needed: steps, left, frees_in })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(node: &str, devices: &[&str], identities: &[&str]) -> pb::FleetApplyRequest {
        pb::FleetApplyRequest {
            node: node.into(),
            devices: devices.iter().map(|s| s.to_string()).collect(),
            identities: identities.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn every_device_needs_its_identity() {
        let ok = targets(&req("n1", &["rbd4", "loop3"], &["rbd=a", "loop=b"])).expect("ok");
        assert_eq!(ok.len(), 1);
        assert_eq!(
            targets(&req("n1", &["rbd4", "loop3"], &["rbd=a"])),
            Err(RequestError::NoIdentity { node: "n1".into(), device: "loop3".into() })
        );
        assert_eq!(
            targets(&req("n1", &["rbd4"], &[" "])),
            Err(RequestError::NoIdentity { node: "n1".into(), device: "rbd4".into() })
        );
        let e = targets(&req("n1", &["rbd4"], &[])).expect_err("none");
        assert!(e.to_string().starts_with("no identity for n1/rbd4: "), "{e}");
        assert!(matches!(targets(&req("n1", &["rbd4"], &["a", "b"])), Err(RequestError::Count { .. })));
        assert_eq!(targets(&req("", &[], &[])), Err(RequestError::NoTarget));
        assert_eq!(targets(&req("n1", &[], &[])), Err(RequestError::NoDevices("n1".into())));
        assert_eq!(targets(&req("", &["rbd4"], &["a"])), Err(RequestError::NoNode));
        let mut two = req("n1", &["rbd4"], &["a"]);
        two.targets.push(pb::FleetApplyTarget {
            node: "n2".into(),
            devices: vec!["nbd0".into()],
            identities: vec![String::new()],
        });
        assert_eq!(targets(&two), Err(RequestError::NoIdentity { node: "n2".into(), device: "nbd0".into() }));
        two.targets[0].identities[0] = "nbd=x".into();
        assert_eq!(targets(&two).expect("two").len(), 2);
        two.targets[0].node = "n1".into();
        assert_eq!(targets(&two), Err(RequestError::Duplicate("n1".into())));
    }

    fn plan(device: &str, identity: &str, steps: usize, refusal: &str) -> pb::DevicePlan {
        pb::DevicePlan {
            device: device.into(),
            steps: (0..steps)
                .map(|i| pb::Step { action: format!("a{i}"), device: device.into(), ..Default::default() })
                .collect(),
            left_alone: Vec::new(),
            refusal: refusal.into(),
            identity: identity.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_dry_run_refuses_a_refused_plan_a_changed_identity_and_a_silent_agent() {
        let t = Target { node: "n1".into(), devices: vec!["rbd4".into()], identities: vec!["rbd=a".into()] };
        let good = summarise(
            &t,
            Ok(pb::PlanResponse { plans: vec![plan("rbd4", "rbd=a", 2, "")], ..Default::default() }),
        );
        assert_eq!((good.steps, good.refusal.as_str()), (2, ""));
        assert_eq!(summary_text(&[good]), "n1: 2 step(s): a0 rbd4, a1 rbd4");
        let refused = summarise(
            &t,
            Ok(pb::PlanResponse {
                plans: vec![plan("rbd4", "rbd=a", 0, "in use by pod x")],
                ..Default::default()
            }),
        );
        assert_eq!(refused.refusal, "rbd4: in use by pod x");
        let other = summarise(
            &t,
            Ok(pb::PlanResponse { plans: vec![plan("rbd4", "rbd=b", 1, "")], ..Default::default() }),
        );
        assert!(other
            .refusal
            .starts_with("rbd4: the plan is for identity rbd=b but the request carries rbd=a"));
        let missing = summarise(&t, Ok(pb::PlanResponse { plans: vec![], ..Default::default() }));
        assert_eq!(missing.refusal, "rbd4: the agent's plan does not cover it");
        let down = summarise(&t, Err("unavailable".into()));
        assert_eq!(down.refusal, "its plan could not be had: unavailable");
        assert_eq!(summary_text(&[down]), "n1: refused: its plan could not be had: unavailable");
    }

    #[test]
    fn the_budget_is_shared_and_says_when_it_frees() {
        let b = StepBudget::new(5);
        let t0 = Instant::now();
        assert_eq!(b.take(3, t0), Ok(2));
        assert_eq!(b.take(1, t0 + Duration::from_secs(10)), Ok(1));
        let e = b.take(3, t0 + Duration::from_secs(20)).expect_err("over");
        assert_eq!((e.left, e.needed, e.frees_in), (1, 3, Some(Duration::from_secs(40))));
        assert!(e.to_string().contains("5 steps a minute") && e.to_string().contains("frees in 41 s"), "{e}");
        assert_eq!(b.left(t0 + Duration::from_secs(20)), 1, "a refusal takes nothing");
        assert_eq!(b.take(3, t0 + Duration::from_secs(60)), Ok(1), "the first Apply left the window");
        let e = b.take(6, t0 + Duration::from_secs(61)).expect_err("never fits");
        assert_eq!(e.frees_in, None);
        assert!(e.to_string().contains("more than the whole budget"), "{e}");
        assert_eq!(StepBudget::new(0).take(1000, t0), Ok(u32::MAX), "0: no budget");
    }

    #[test]
    fn a_takeover_of_the_apply_lease_charges_the_whole_minute_once() {
        use crate::lease::Holding;
        let t0 = Instant::now();
        let at = tokio::time::Instant::from_std(t0);
        let (tx, lease) = ApplyLease::fixed(Holding::Other { holder: "replica-b".into() });
        let b = StepBudget::new(5).with_lease(lease);
        assert!(b.may_apply(t0).expect_err("not the holder").contains("replica-b"));
        assert_eq!(b.left(t0), 5, "a refusal charges nothing");
        tx.send_replace(Holding::Held { until: at + Duration::from_secs(10), took_over: Some(at) });
        assert_eq!(b.may_apply(t0), Ok(()));
        assert_eq!(b.left(t0), 0, "the old holder's minute is assumed spent");
        assert_eq!(b.may_apply(t0 + Duration::from_secs(1)), Ok(()));
        assert_eq!(b.left(t0 + Duration::from_secs(60)), 5, "charged once, and it leaves the window");
        assert!(b.may_apply(t0 + Duration::from_secs(11)).is_err(), "an unrenewed Lease stops Applies");
    }
}
