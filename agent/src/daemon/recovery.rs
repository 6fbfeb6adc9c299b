//! The journal's recovery when the daemon starts: after the Kubernetes API's view is up, through
//! the one request workflow.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::state::AgentState;
use crate::engine::error::EngineError;
use crate::engine::outcome::Outcome;
use crate::engine::workflow::{self, Resumer};
use crate::engine::world::World;
use crate::kube::ApiState;
use crate::plan::Plan;

impl AgentState {
    /// Waits until the Kubernetes API's view vouches (or the API is off by the operator's word),
    /// then closes the steps a run that died left open, each re-checked against its device as it
    /// is now; a daemon that acts by itself then carries each unfinished plan on through the one
    /// request workflow ([`crate::engine::Engine::recover_all`]), under the same gates (the API's
    /// among them), its step budget and the audit, as a new plan; a reporting one lists them.
    /// Requests that come meanwhile recover what they owe themselves, through the same workflow.
    /// `None`: stopped before (SIGTERM).
    pub async fn recover_at_start(
        self: Arc<Self>,
        mut stop: watch::Receiver<bool>,
    ) -> Option<Result<Outcome, EngineError>> {
        let mut said = None;
        loop {
            let world = &self.engine.world;
            match ApiState::of(world.cluster().as_ref(), &world.api_off(), world.now()) {
                ApiState::Vouching | ApiState::Off(_) => break,
                ApiState::CannotVouch(why) => {
                    if said.as_ref() != Some(&why) {
                        tracing::info!("journal recovery waits for the Kubernetes API: {why}");
                        said = Some(why);
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.changed() => return None,
            }
        }
        let me = Arc::clone(&self);
        let recovered = tokio::task::spawn_blocking(move || {
            let by = format!("daemon mode {} at start", me.config.mode.as_str());
            let admit = |p: &Plan| me.admit_by_budget(p);
            let resumer = Resumer { by: &by, admit: Some(&admit) };
            let resume = (me.config.mode != crate::config::Mode::Report).then_some(resumer);
            me.engine.recover_all(&me.config.journal, workflow::LOCK_WAIT, resume)
        })
        .await;
        match recovered {
            Ok(out) => {
                if out.as_ref().is_ok_and(|o| !o.resumed.is_empty()) {
                    self.request_rescan("apply");
                }
                Some(out)
            }
            Err(e) => Some(Err(EngineError::Journal {
                path: self.config.journal.clone(),
                source: std::io::Error::other(format!("the recovery thread failed: {e}")),
            })),
        }
    }
}
