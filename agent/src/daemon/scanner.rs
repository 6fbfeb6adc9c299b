//! The rescan loop ([`AgentState::run_scanner`]) and its turns: a full scan of the host, or a
//! re-read of what the kernel reported changed, each on a blocking thread with a deadline.
//!
//! While a turn runs, further triggers collapse into a single follow-up (a `Notify` holds at
//! most one permit), so scans never stack. A scan that overruns its deadline is reported; no
//! new scan starts until it has finished. What the kernel reported changed is read again alone
//! and shown at once; a burst of uevents or mount changes that asks for a full scan settles
//! first. The timer's scan does not settle (the timer is no burst) and stops for a change that
//! is waiting, at most [`TIMER_SCAN_STOPS`] times in a row: the change is read again alone,
//! then the scan runs again. It does not stop once the latest snapshot is gone (a re-read that
//! failed leaves none to read a change into).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::state::{AgentState, SCAN_DEADLINE, TIMER};
use crate::engine::view::View;
use crate::host::parallel::Stop;
use crate::model::{DevNum, MountNsId};
use crate::snapshot::reread::Changes;

/// How many times in a row the timer's scan may stop for a waiting change before it runs to
/// its end whatever comes.
pub const TIMER_SCAN_STOPS: u32 = 3;

/// How a full scan ended ([`AgentState::scan_once`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanEnd {
    /// Published.
    Done,
    /// Failed or overran; the previous view stays.
    Failed,
    /// Stopped for a change that is waiting, as it was allowed to; the previous view stays.
    Stopped,
}

impl AgentState {
    /// Scans the whole host and judges it (blocking). A process whose signs of change are the
    /// same keeps what its last full read found, but for every `--full-read-every`th scan
    /// (`snapshot::process_read_cache`). `Ok(None)`: `stoppable`, it stopped for a change that is
    /// waiting.
    pub(super) fn scan_blocking(&self, scan_number: u64, stoppable: bool) -> Result<Option<View>, String> {
        let asked = || self.change_waiting.load(Ordering::Acquire);
        let stop = if stoppable { Stop::when(&asked) } else { Stop::NEVER };
        let Some(scan) = self.engine.world.scan_periodic(stop).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        if let Some(watch) = self.mount_watch.get() {
            watch.sync(&self.engine.world.namespace_files());
        }
        let judged = self.engine.judge(scan, &mut self.clocks());
        let mut view = View::of(judged, scan_number);
        view.pod_volumes = Arc::new(self.engine.pod_volumes(&mut self.clocks()));
        view.pin_risks = Arc::new(self.engine.world.pin_risks(None).unwrap_or_default());
        Ok(Some(view))
    }

    /// Brings the latest view up to date after what the kernel reported changed (blocking).
    /// Judged on a copy of the grace clocks: a re-read carries the full scan's fds and
    /// processes, so it may show a verdict and restart a clock, but never advances one.
    /// `Err`: why only a full scan will do.
    pub(super) fn rescan_changed_blocking(
        &self,
        changes: &Changes,
        scan_number: u64,
        previous: &View,
    ) -> Result<View, String> {
        use crate::engine::world::World;
        let t0 = Instant::now();
        // What the previous view may keep of a device the re-read does not touch.
        let (api, now) = (self.engine.world.cluster(), self.engine.world.now());
        let reusable: HashSet<DevNum> = previous
            .devices
            .iter()
            .filter(|d| d.reusable(api.as_ref(), now))
            .map(|d| d.entry.device.devnum)
            .collect();
        let reread = self.engine.world.rescan_changed(changes, &reusable)?;
        let t1 = Instant::now();
        let mut scratch = self.clocks().clone();
        let judged = self.engine.judge(reread.scan, &mut scratch);
        // It may restart a clock (it saw the device held: a mount is evidence enough), never
        // advance one.
        self.clocks().retain(|id| scratch.get(id).is_some());
        let t2 = Instant::now();
        let mut view = View::merged(judged, previous, reread.rebuilt.as_ref(), &reread.devices, scan_number)
            .ok_or("the latest view does not list the re-read snapshot's devices")?;
        // The pin risks of the namespaces read again; the others' stand.
        let read: HashSet<MountNsId> = changes
            .namespaces
            .iter()
            .chain(&changes.gone)
            .chain(changes.new_namespaces.keys())
            .copied()
            .collect();
        let pins = if read.is_empty() { None } else { self.engine.world.pin_risks(Some(&read)) };
        view.pin_risks = pins.map_or_else(|| Arc::clone(&previous.pin_risks), Arc::new);
        tracing::debug!(
            read_us = (t1 - t0).as_micros() as u64,
            judge_us = (t2 - t1).as_micros() as u64,
            view_us = t2.elapsed().as_micros() as u64,
            "re-read what changed"
        );
        Ok(view)
    }

    /// Reads again what the kernel reported changed and publishes the result; false when only
    /// a full scan will do.
    pub(super) async fn rescan_changed_once(self: &Arc<Self>, changes: Changes) -> bool {
        let previous = self.view();
        let number = previous.scan_number + 1;
        let me = Arc::clone(self);
        let started = Instant::now();
        let handle =
            tokio::task::spawn_blocking(move || me.rescan_changed_blocking(&changes, number, &previous));
        match tokio::time::timeout(SCAN_DEADLINE, handle).await {
            Ok(Ok(Ok(view))) => {
                self.publish("changes", started.elapsed(), view);
                true
            }
            Ok(Ok(Err(why))) => {
                tracing::debug!("{why}: scanning in full");
                false
            }
            Ok(Err(join)) => {
                tracing::error!("re-read thread failed: {join}");
                false
            }
            Err(_) => {
                tracing::error!("a re-read overran its {SCAN_DEADLINE:?} deadline");
                false
            }
        }
    }

    /// Runs one scan now on a blocking thread, publishes it and its events, and checks health
    /// ([`ScanEnd`]). A `stoppable` scan stops for a change that is waiting, with nothing
    /// published or counted.
    pub async fn scan_once(self: &Arc<Self>, trigger: &'static str, stoppable: bool) -> ScanEnd {
        let number = self.view().scan_number + 1;
        let me = Arc::clone(self);
        let started = Instant::now();
        let handle = tokio::task::spawn_blocking(move || me.scan_blocking(number, stoppable));
        let result = match tokio::time::timeout(SCAN_DEADLINE, handle).await {
            Ok(Ok(r)) => r,
            Ok(Err(join)) => Err(format!("scan thread failed: {join}")),
            Err(_) => {
                Err(format!("scan overran its {SCAN_DEADLINE:?} deadline; a device or process may be hung"))
            }
        };
        let elapsed = started.elapsed();
        let (end, scan) = match result {
            Ok(Some(view)) => {
                self.publish(trigger, elapsed, view);
                self.save_statmount_cache_file();
                (ScanEnd::Done, None)
            }
            Ok(None) => {
                tracing::debug!(
                    trigger,
                    ms = elapsed.as_secs_f64() * 1e3,
                    "scan stopped for a waiting change"
                );
                return ScanEnd::Stopped;
            }
            Err(e) => {
                self.metrics.scan_failed(trigger);
                tracing::error!(trigger, "scan failed: {e}");
                (ScanEnd::Failed, Some(e))
            }
        };
        self.check_health(scan).await;
        end
    }

    /// Re-evaluates every health check ([`super::health`]) with the latest scan's outcome
    /// (`scan`: why it failed), and tells the health service and the metrics when it changed.
    pub(super) async fn check_health(&self, scan: Option<String>) {
        use super::health::{journal_problem, kubernetes_problem, Health};
        let journal = self.config.journal.clone();
        let journal = tokio::task::spawn_blocking(move || journal_problem(&journal))
            .await
            .unwrap_or_else(|e| Some(format!("the journal check failed: {e}")));
        let kubernetes = kubernetes_problem(self.config.mode, &self.view().api_state);
        let health = Health { scan, journal, kubernetes };
        self.metrics.observe_health(&health);
        self.health.send_if_modified(|h| {
            if *h == health {
                return false;
            }
            *h = health;
            true
        });
    }

    /// The rescan loop: waits for triggers and scans, one at a time, until `shutdown` fires.
    pub async fn run_scanner(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        // The timer's scans stopped in a row for a waiting change.
        let mut stops = 0;
        loop {
            tokio::select! {
                _ = self.rescan.notified() => {}
                _ = shutdown.changed() => return,
            }
            // What is awaited is looked at first: a namespace no longer awaited by then was
            // asked for before, so its read is in what is taken next.
            let awaiting = self.awaiting_set().clone();
            let mut changes = self.pending().take();
            changes.awaiting = awaiting;
            let full_pending = *self.pending_trigger.lock().unwrap_or_else(|p| p.into_inner());
            // A new namespace the re-read could not read is scanned for as before ("namespace").
            let fallback = if changes.new_namespaces.is_empty() { "mount" } else { "namespace" };
            // A wake whose changes an earlier turn took already (each request wakes the
            // scanner once, and a request may land while a turn runs): nothing to do.
            if full_pending.is_none() && changes.is_empty() {
                continue;
            }
            // What the kernel reported is shown at once, without waiting to settle; before the
            // timer's scan too.
            let mut read_alone = full_pending.is_none() || full_pending == Some(TIMER);
            if read_alone && !changes.is_empty() {
                read_alone = self.rescan_changed_once(changes).await;
                if read_alone && full_pending.is_none() {
                    continue;
                }
            }
            // Let a burst of uevents or mount changes settle into one scan (the timer is no
            // burst).
            if !read_alone || full_pending != Some(TIMER) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _covered = self.pending().take();
            let trigger = self.pending_trigger.lock().ok().and_then(|mut p| p.take()).unwrap_or(fallback);
            // The timer's scan stops for a change only while the latest snapshot stands (a
            // re-read that failed leaves none to read it into).
            let stoppable = trigger == TIMER && read_alone && stops < TIMER_SCAN_STOPS;
            match self.scan_once(trigger, stoppable).await {
                ScanEnd::Stopped => {
                    stops += 1;
                    if let Ok(mut p) = self.pending_trigger.lock() {
                        p.get_or_insert(trigger);
                    }
                    self.rescan.notify_one();
                }
                ScanEnd::Done => {
                    stops = 0;
                    self.report_to_kubernetes().await;
                    self.act_by_mode().await;
                }
                ScanEnd::Failed => stops = 0,
            }
        }
    }
}
