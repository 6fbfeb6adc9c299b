//! What the daemon does besides scanning: acting by its mode after a scan, Plan and Apply
//! requests (through the engine's one request workflow), and reporting to Kubernetes.

use super::state::{check_device_arg, AgentState, ApiError};
use crate::act::StepReport;
use crate::config::Mode;
use crate::daemon::events::{AgentEvent, EventKind};
use crate::engine::error::EngineError;
use crate::engine::outcome::{Outcome, OutcomeClass, Request, Subject};
use crate::engine::view::DeviceView;
use crate::engine::Operation;
use crate::graph::resolve;
use crate::judge::Verdict;
use crate::model::DevNum;
use crate::plan::Plan;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

impl AgentState {
    /// In release and clean modes, acts on what the latest scan found. Each device's plan comes
    /// from a fresh scan through the engine's gates, and runs as a unit within the per-minute
    /// step budget (a plan larger than the whole budget runs once the window is empty).
    pub(super) async fn act_by_mode(self: &Arc<Self>) {
        let mode = self.config.mode;
        let op = match mode {
            Mode::Report => return,
            Mode::Release => Operation::Release,
            Mode::Clean => Operation::Clean,
        };
        if mode == Mode::Clean {
            self.clean_pod_volumes().await;
        }
        let view = self.view();
        let targets: Vec<DevNum> = view
            .devices
            .iter()
            .filter(|d| match mode {
                Mode::Clean => d.judgement.verdict == Verdict::Stale,
                // Volumes kubelet knows and no pod of its uses, still mounted in other namespaces.
                Mode::Release => {
                    d.judgement.verdict != Verdict::Protected
                        && d.entry.kubernetes.as_ref().is_some_and(|k| k.pod_uids.is_empty())
                        && d.entry.holders.iter().any(|h| h.is_foreign_mount())
                }
                Mode::Report => false,
            })
            .map(|d| d.entry.device.devnum)
            .collect();
        if targets.is_empty() {
            return;
        }
        let _guard = self.act_lock.lock().await;
        let me = Arc::clone(self);
        let outcome = tokio::task::spawn_blocking(move || me.act_blocking(&targets, op)).await;
        let reports = match outcome {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::error!(mode = mode.as_str(), "{e}");
                return;
            }
            Err(e) => {
                tracing::error!(mode = mode.as_str(), "the action thread failed: {e}");
                return;
            }
        };
        if reports.is_empty() {
            return;
        }
        self.report_actions(&reports).await;
        self.request_rescan("apply");
    }

    /// A request for `op` on `devnum` through the one workflow ([`Engine::carry_out`]), with
    /// the daemon's journal and grace clocks.
    /// (Set `expected_identity` and `admit` with struct update syntax.)
    pub(super) fn request(&self, devnum: DevNum, op: Operation, apply: bool, by: &str) -> Request<'_> {
        Request {
            op,
            subject: Subject::Device(devnum),
            argument: devnum.to_string(),
            expected_identity: None,
            apply,
            by: by.to_owned(),
            journal: &self.config.journal,
            lock_wait: crate::engine::workflow::LOCK_WAIT,
            clocks: &self.clocks,
            admit: None,
        }
    }

    /// Plans `op` for each target from a fresh scan (a dry run of the one workflow), then carries
    /// out, bound to the identity it planned for, each plan the budget admits.
    pub(super) fn act_blocking(
        &self,
        targets: &[DevNum],
        op: Operation,
    ) -> Result<Vec<StepReport>, ApiError> {
        let by = format!("daemon mode {}", self.config.mode.as_str());
        let mut plans = Vec::new();
        for &devnum in targets {
            match self.engine.carry_out(&self.request(devnum, op, false, &by)) {
                Ok(Outcome { plan: Some(p), .. }) if p.refusal.is_none() && !p.steps.is_empty() => {
                    plans.push(p)
                }
                // The latest view called it a candidate; the fresh scan behind the plan did not
                // agree. Said, so an operator can see why a stale device was left alone.
                Ok(Outcome { plan: Some(p), .. }) if p.refusal.is_some() => {
                    let why = p.refusal.as_deref().unwrap_or_default();
                    tracing::info!(device = %p.device, op = ?op, "not acting on it: {why}");
                }
                Ok(_) | Err(EngineError::NotFound(_)) => {}
                Err(e) => tracing::warn!(device = %devnum, "cannot plan: {e}"),
            }
        }
        // A plan that logs an iSCSI session out after its disk runs after the plans that delete
        // the session's other disks (its logout needs them gone; stable otherwise).
        plans.sort_by_key(|p| {
            p.steps.iter().any(|s| matches!(s.action, crate::plan::Action::IscsiLogout { .. }))
        });
        let admit = |p: &Plan| self.admit_by_budget(p);
        let mut out = Vec::new();
        for p in plans {
            let req = Request {
                argument: p.device.to_string(),
                expected_identity: Some(p.identity.token()),
                admit: Some(&admit),
                ..self.request(p.devnum, op, true, &by)
            };
            match self.engine.carry_out(&req) {
                Ok(o) => {
                    if let Some((_, why)) = &o.refusal {
                        tracing::warn!(device = %p.device, op = ?op, "not acting on it: {why}");
                    }
                    self.finished(&o);
                    out.extend(o.resumed.into_iter().flat_map(|r| r.reports).chain(o.reports));
                }
                Err(e) => tracing::warn!(device = %p.device, "cannot act: {e}"),
            }
        }
        Ok(out)
    }

    /// The mode's may-act on a plan: within the per-minute step budget (counted, and announced
    /// as an ActionStarted event), or why not.
    pub(super) fn admit_by_budget(&self, p: &Plan) -> Result<(), String> {
        let mut budget = self.budget.lock().unwrap_or_else(|p| p.into_inner());
        if budget.admit(p.steps.len(), Instant::now()) {
            self.action_started(p);
            Ok(())
        } else {
            Err(format!(
                "rate limit reached ({} steps a minute): {} step(s) postponed to a later scan",
                self.config.max_actions_per_minute,
                p.steps.len()
            ))
        }
    }

    pub(super) fn action_started(&self, p: &Plan) {
        let name = p.device.as_str();
        self.send_event(AgentEvent::new(
            EventKind::ActionStarted,
            name,
            format!("{} {name}: {} step(s)", p.operation, p.steps.len()),
            None,
        ));
    }

    /// Metrics and the ActionFinished event of a carried-out request (its own steps, and those of
    /// the unfinished plans it resumed first).
    pub(super) fn finished(&self, o: &Outcome) {
        for r in o.resumed.iter().flat_map(|r| &r.reports) {
            self.metrics.action(r.step.action(), r.result_word());
        }
        if let (Some(p), true) = (&o.plan, o.applied) {
            let name = p.device.as_str();
            let mut counts: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
            for r in &o.reports {
                let word = r.result_word();
                self.metrics.action(r.step.action(), word);
                *counts.entry(word.as_str()).or_default() += 1;
            }
            let summary: Vec<String> = counts.iter().map(|(w, n)| format!("{n} {w}")).collect();
            self.send_event(AgentEvent::new(
                EventKind::ActionFinished,
                name,
                format!("{} {name}: {}", p.operation, summary.join(", ")),
                None,
            ));
        }
    }

    /// Looks a device argument up in the latest view.
    pub fn find(&self, arg: &str) -> Result<Arc<DeviceView>, ApiError> {
        check_device_arg(arg)?;
        let view = self.view();
        if view.scanned_at.is_none() {
            return Err(ApiError::Unavailable("no scan has finished yet; try again in a moment".into()));
        }
        let dev = resolve::device(&self.host, view.devices.iter().map(|d| &d.entry.device), arg)
            .map_err(|e| ApiError::NotFound(e.to_string()))?;
        let devnum = dev.devnum;
        view.devices
            .iter()
            .find(|d| d.entry.device.devnum == devnum)
            .cloned()
            .ok_or_else(|| ApiError::NotFound(format!("unknown device '{arg}'")))
    }

    /// The devices named (each once), or every stale one when none is named.
    pub(super) fn targets(&self, devices: &[String]) -> Result<Vec<DevNum>, ApiError> {
        if devices.is_empty() {
            return Ok(self
                .view()
                .devices
                .iter()
                .filter(|d| d.judgement.verdict == Verdict::Stale)
                .map(|d| d.entry.device.devnum)
                .collect());
        }
        let mut seen = BTreeSet::new();
        for d in devices {
            seen.insert(self.find(d)?.entry.device.devnum);
        }
        Ok(seen.into_iter().collect())
    }

    /// `op` plans for the named devices (or, for a cleanup, every stale one), each from a fresh
    /// scan of the device judged with the daemon's grace clocks, each with its class and the
    /// INCOMPLETE VIEW line of the scan it rests on. Changes nothing.
    pub async fn plan(
        self: &Arc<Self>,
        devices: &[String],
        op: Operation,
    ) -> Result<Vec<(Plan, OutcomeClass, Option<String>)>, ApiError> {
        if devices.is_empty() && op == Operation::Release {
            return Err(ApiError::InvalidArgument("a release plan needs the devices named".into()));
        }
        let targets = self.targets(devices)?;
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let mut plans = Vec::new();
            for devnum in targets {
                let req = me.request(devnum, op, false, "Plan");
                match me.engine.carry_out(&req) {
                    Ok(o) => {
                        let (class, incomplete) = (o.class(), o.incomplete());
                        plans.extend(o.plan.map(|p| (p, class, incomplete)));
                    }
                    Err(EngineError::NotFound(_)) => {}
                    Err(e) => return Err(ApiError::from(e)),
                }
            }
            Ok(plans)
        })
        .await
        .map_err(|e| ApiError::Internal(format!("planning thread failed: {e}")))?
    }

    /// Plans and carries out `op` (a cleanup, or a release of foreign mount copies) on the named
    /// devices, one Apply at a time.
    /// `identities`, when given, are the identities a Plan answered for the same devices (same
    /// order, "" for none): a device that is now another one is refused (FailedPrecondition
    /// naming both) before anything runs. `person` is who asked, for the journal and the audit.
    /// Each device's outcome, with the argument that named it (the answer is built from them by
    /// [`crate::engine::wire::outcome::add_results`], as the one-shot `apply --yes` builds its).
    pub async fn apply(
        self: &Arc<Self>,
        devices: &[String],
        identities: &[String],
        op: Operation,
        person: &str,
    ) -> Result<Vec<(String, Outcome)>, ApiError> {
        if devices.is_empty() {
            return Err(ApiError::InvalidArgument("apply needs at least one device".into()));
        }
        if !identities.is_empty() && identities.len() != devices.len() {
            return Err(ApiError::InvalidArgument(format!(
                "{} identities for {} devices: give one per device (\"\" for none), in the same order",
                identities.len(),
                devices.len()
            )));
        }
        self.can_act().map_err(ApiError::FailedPrecondition)?;
        let mut wanted = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            let v = self.find(d)?;
            if v.judgement.verdict == Verdict::Protected {
                return Err(ApiError::FailedPrecondition(format!(
                    "{} is protected: {}",
                    v.entry.device.name,
                    v.judgement.reasons.join("; ")
                )));
            }
            let expected = identities.get(i).filter(|t| !t.is_empty()).cloned();
            wanted.push((d.clone(), v.entry.device.devnum, expected));
        }
        let _guard = self.act_lock.lock().await;
        let me = Arc::clone(self);
        let person = person.to_owned();
        let outcomes = tokio::task::spawn_blocking(move || {
            // Every device bound to the identity the caller saw before anything runs (a dry run
            // of each), then each carried out through the one workflow, bound to it again.
            // The person (`uid N`, a per-person certificate, or whom the console reviewed) is
            // journaled and audited with the plan.
            let by = format!("Apply by {person}");
            let mut bound = Vec::new();
            for (argument, devnum, expected) in &wanted {
                let o = me.engine.carry_out(&Request {
                    expected_identity: expected.clone(),
                    ..me.request(*devnum, op, false, &by)
                })?;
                if let Some((_, why)) = o.refusal {
                    return Err(ApiError::FailedPrecondition(why));
                }
                let token = o.plan.as_ref().map(|p| p.identity.token());
                bound.push((argument.clone(), *devnum, expected.clone().or(token)));
            }
            let admit = |p: &Plan| {
                me.action_started(p);
                Ok(())
            };
            let mut outcomes: Vec<(String, Outcome)> = Vec::new();
            for (argument, devnum, expected) in bound {
                let o = me.engine.carry_out(&Request {
                    expected_identity: expected,
                    admit: Some(&admit),
                    ..me.request(devnum, op, true, &by)
                })?;
                if let Some((_, why)) = &o.refusal {
                    // The first device refused, before anything was planned or ran: the
                    // whole Apply is refused, saying why.
                    let ran = |o: &Outcome| {
                        o.plan.is_some()
                            || !o.reports.is_empty()
                            || o.resumed.iter().any(|r| !r.reports.is_empty())
                    };
                    if !outcomes.iter().any(|(_, o)| ran(o)) {
                        return Err(ApiError::FailedPrecondition(why.clone()));
                    }
                    tracing::warn!(device = %devnum, "Apply: not acting on it: {why}");
                }
                me.finished(&o);
                outcomes.push((argument, o));
            }
            Ok::<_, ApiError>(outcomes)
        })
        .await
        .map_err(|e| ApiError::Internal(format!("apply thread failed: {e}")))??;
        self.request_rescan("apply");
        Ok(outcomes)
    }
}
