//! The one-shot requests that may act: `release`, `clean`, `plan` and `apply` of a device
//! through the one request workflow ([`crate::engine::Engine::carry_out`]; with `apply`, recovery and the
//! unfinished plan an argument owes come first, before it is resolved), and `clean` of an
//! orphaned pod volume directory through the directory workflow ([`crate::engine::Engine::carry_out_dir`]);
//! what `plan` and `apply` take when no argument is named.

use std::sync::Mutex;

use super::OneShot;
use crate::engine::dir_workflow::{DirOutcome, DirRequest};
use crate::engine::outcome::{Outcome, Request, Subject};
use crate::engine::Operation;
use crate::graph::scan::Target;
use crate::judge::grace::Clocks;
use crate::judge::orphans::DirVerdict;
use crate::judge::Verdict;
use crate::plan::pod_volume;

impl OneShot {
    /// `op` on the device the operator named (`device`, in their words), carried out when
    /// `apply`, else a dry run through the same workflow; the grace clocks saved either way.
    pub fn run_device_request(
        &mut self,
        op: Operation,
        device: &str,
        apply: bool,
    ) -> anyhow::Result<Outcome> {
        self.with_clocks(|run, clocks| {
            run.engine.carry_out(&Request {
                op,
                subject: Subject::Argument(device.to_owned()),
                argument: device.to_owned(),
                expected_identity: None,
                apply,
                by: run.by.clone(),
                journal: &run.journal,
                lock_wait: run.lock_wait,
                clocks,
                admit: None,
            })
        })
    }

    /// `clean` of the pod volume directory `arg` names, carried out when `apply`; the grace
    /// clocks saved either way.
    pub fn run_dir_request(&mut self, arg: &str, apply: bool) -> anyhow::Result<DirOutcome> {
        self.with_clocks(|run, clocks| {
            run.engine.carry_out_dir(&DirRequest {
                argument: arg.to_owned(),
                apply,
                by: run.by.clone(),
                journal: &run.journal,
                lock_wait: run.lock_wait,
                clocks,
                admit: None,
            })
        })
    }

    /// Runs `request` with the grace clocks lent to it, then keeps them and saves the state,
    /// whatever the request came to.
    fn with_clocks<T, E>(
        &mut self,
        request: impl FnOnce(&Self, &Mutex<Clocks>) -> Result<T, E>,
    ) -> anyhow::Result<T>
    where
        anyhow::Error: From<E>,
    {
        let clocks = Mutex::new(std::mem::replace(&mut self.state.clocks, Clocks::new(None)));
        let result = request(self, &clocks);
        self.state.clocks = clocks.into_inner().unwrap_or_else(|p| p.into_inner());
        self.save();
        Ok(result?)
    }

    /// Whether `arg` names a pod volume directory (`pod-volume:<pod uid>/volumes/...`, or its
    /// path below the kubelet directory) rather than a device.
    pub fn is_dir_argument(&self, arg: &str) -> bool {
        let kubelet_dir = &self.engine.world.options.kubelet_dir;
        arg.starts_with(pod_volume::PREFIX) || pod_volume::parse_argument(arg, kubelet_dir).is_some()
    }

    /// Every stale device, by name, from a scan of its own: what `plan` and `apply` of a
    /// cleanup take when no device is named.
    pub fn stale_devices(&mut self) -> anyhow::Result<Vec<String>> {
        let e = &self.engine;
        let judged = e.judge(e.scan(Target::All)?, &mut self.state.clocks);
        self.save();
        Ok(judged
            .scan
            .graph
            .devices
            .iter()
            .filter(|d| judged.verdict(d.device.devnum).is_some_and(|j| j.verdict == Verdict::Stale))
            .map(|d| d.device.name.to_string())
            .collect())
    }

    /// Every removable orphaned pod volume directory, by argument: what `plan` and `apply` of a
    /// cleanup take, with every stale device, when nothing is named.
    pub fn removable_dirs(&mut self) -> Vec<String> {
        let report = self.engine.pod_volumes(&mut self.state.clocks);
        self.save();
        report
            .dirs
            .iter()
            .filter(|d| d.judgement.verdict == DirVerdict::Removable)
            .map(|d| d.argument.clone())
            .collect()
    }
}
