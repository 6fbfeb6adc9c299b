//! Clean mode's part for orphaned pod volume directories: every directory the latest full scan
//! judged `removable` is carried out through the engine's directory workflow
//! ([`crate::engine::Engine::carry_out_dir`]): fresh evidence and every gate again, the plan
//! within the per-minute step budget, each `rmdir` re-checked, journaled and audited.

use std::sync::Arc;
use std::time::Instant;

use super::state::AgentState;
use crate::engine::dir_workflow::{DirOutcome, DirRequest};
use crate::judge::orphans::DirVerdict;
use crate::plan::pod_volume::DirPlan;

impl AgentState {
    /// Removes the directories the latest view calls removable (clean mode only).
    pub(super) async fn clean_pod_volumes(self: &Arc<Self>) {
        let view = self.view();
        let targets: Vec<String> = view
            .pod_volumes
            .dirs
            .iter()
            .filter(|d| d.judgement.verdict == DirVerdict::Removable)
            .map(|d| d.argument.clone())
            .collect();
        if targets.is_empty() {
            return;
        }
        let _guard = self.act_lock.lock().await;
        let me = Arc::clone(self);
        match tokio::task::spawn_blocking(move || me.clean_pod_volumes_blocking(&targets)).await {
            Ok(true) => self.request_rescan("apply"),
            Ok(false) => {}
            Err(e) => tracing::error!("the pod volume directory thread failed: {e}"),
        }
    }

    /// Carries each out; true when any step ran.
    fn clean_pod_volumes_blocking(&self, targets: &[String]) -> bool {
        let by = format!("daemon mode {}", self.config.mode.as_str());
        let admit = |p: &DirPlan| self.admit_dir_by_budget(p);
        let mut ran = false;
        for arg in targets {
            let req = DirRequest {
                argument: arg.clone(),
                apply: true,
                by: by.clone(),
                journal: &self.config.journal,
                lock_wait: crate::engine::workflow::LOCK_WAIT,
                clocks: &self.clocks,
                admit: Some(&admit),
            };
            match self.engine.carry_out_dir(&req) {
                Ok(o) => ran |= self.dir_finished(arg, &o),
                Err(e) => tracing::warn!(argument = %arg, "cannot remove the pod volume directory: {e}"),
            }
        }
        ran
    }

    /// Within the per-minute step budget, or why not.
    fn admit_dir_by_budget(&self, p: &DirPlan) -> Result<(), String> {
        let mut budget = self.budget.lock().unwrap_or_else(|p| p.into_inner());
        if budget.admit(p.steps.len(), Instant::now()) {
            Ok(())
        } else {
            Err(format!(
                "rate limit reached ({} steps a minute): {} step(s) postponed to a later scan",
                self.config.max_actions_per_minute,
                p.steps.len()
            ))
        }
    }

    /// Counts its steps and says why a directory was left alone; whether a step ran.
    fn dir_finished(&self, arg: &str, o: &DirOutcome) -> bool {
        if let Some((_, why)) = &o.refusal {
            tracing::warn!(argument = %arg, "not removing it: {why}");
        }
        if let Some(why) = o.plan.as_ref().and_then(|p| p.refusal.as_ref()) {
            tracing::info!(argument = %arg, "not removing it: {why}");
        }
        for r in &o.reports {
            self.metrics.action(r.step.action(), r.result_word());
        }
        !o.reports.is_empty()
    }
}
