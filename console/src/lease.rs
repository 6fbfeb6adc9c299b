//! The apply Lease: with several console replicas, one at a time carries out Applies, so the
//! fleet-wide step budget stays one budget. The holder is named in a `coordination.k8s.io/v1`
//! Lease (Kubernetes is the membership and the arbiter: no consensus of our own); every replica
//! tries to take it when it is free or expired and renews it while it holds it, writing with the
//! Lease's `resourceVersion` so two replicas cannot both win one round (the API server answers
//! the loser 409).
//!
//! Fail closed: a replica vouches for holding the Lease only until `lease duration - margin` after
//! the request of its last successful write was sent; an API server it cannot reach therefore
//! stops its Applies before another replica may take over. A replica that takes over from
//! another holder cannot know what that one spent of the budget: it starts with the minute's
//! budget spent (see [`crate::apply::StepBudget::may_apply`]).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::lease_steps::{self, Seen};

/// Where the Lease is and who this replica is.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    /// This replica (its pod name).
    pub identity: String,
    /// `spec.leaseDurationSeconds`; renewed every third of it.
    pub duration: Duration,
    /// Where this replica's gRPC listener is reached (`HOST:PORT`, written into the Lease while
    /// it holds it, so the others can forward Applies to it; "" when not known).
    pub address: String,
}

/// Taken off the holder's own deadline, for clock skew between replicas.
pub(crate) const SKEW_MARGIN: Duration = Duration::from_secs(2);

/// What this replica knows about the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    /// No Lease configured: a single console carries out its own Applies.
    Alone,
    /// This replica holds it until `until`; `took_over`: when it took it from another holder.
    Held { until: Instant, took_over: Option<Instant> },
    /// Another replica holds it.
    Other { holder: String },
    /// Not known (the API server did not answer, or a write lost a race).
    Unknown { why: String },
}

/// What one round does with the Lease as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// There is none: create it, held by us.
    Create,
    /// Ours: renew it.
    Renew,
    /// Free or expired: take it (from `from`, "" when nobody held it).
    TakeOver { from: String },
    /// Another replica holds it and it has not expired.
    Wait { holder: String },
}

/// The decision, from the Lease as read (`None`: absent), at wall-clock `now`.
pub fn decide(lease: Option<&Lease>, me: &str, now: Timestamp) -> Step {
    let Some(l) = lease else { return Step::Create };
    let spec = l.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.unwrap_or_default();
    if holder == me {
        return Step::Renew;
    }
    if holder.is_empty() {
        return Step::TakeOver { from: holder };
    }
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(0).max(0));
    match spec.renew_time.or(spec.acquire_time) {
        Some(MicroTime(renewed)) if renewed + SignedDuration::from_secs(secs) > now => Step::Wait { holder },
        _ => Step::TakeOver { from: holder },
    }
}

/// The Lease as this replica writes it (keeping the object's metadata, `resourceVersion`
/// included, when it renews or takes one over).
pub(crate) fn ours(opts: &LeaseOptions, old: Option<Lease>, now: Timestamp, take: bool) -> Lease {
    let mut l = old.unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(opts.name.clone()),
            namespace: Some(opts.namespace.clone()),
            ..Default::default()
        },
        spec: None,
    });
    let mut spec =
        l.spec.take().unwrap_or_else(|| LeaseSpec { lease_transitions: Some(0), ..Default::default() });
    if take || spec.acquire_time.is_none() {
        spec.acquire_time = Some(MicroTime(now));
        if take {
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
    }
    spec.holder_identity = Some(opts.identity.clone());
    spec.lease_duration_seconds = Some(i32::try_from(opts.duration.as_secs().max(1)).unwrap_or(i32::MAX));
    spec.renew_time = Some(MicroTime(now));
    l.spec = Some(spec);
    l
}

/// One round: read, decide, write. `was`: what the previous round found; `seen_tx` gets what the
/// Lease shows besides its holder (the holder's address, the steps in flight).
async fn round(
    api: &Api<Lease>,
    opts: &LeaseOptions,
    was: &Holding,
    seen_tx: &watch::Sender<Seen>,
) -> Holding {
    let sent = Instant::now();
    let until = sent + opts.duration.saturating_sub(SKEW_MARGIN);
    let keep_or = |why: String| match was {
        // A holder that cannot renew keeps its own (shorter) deadline, and no longer.
        Holding::Held { until, took_over } => Holding::Held { until: *until, took_over: *took_over },
        _ => Holding::Unknown { why },
    };
    let current = match api.get_opt(&opts.name).await {
        Ok(l) => l,
        Err(e) => return keep_or(format!("reading the Lease: {e}")),
    };
    let now = Timestamp::now();
    let secs = now.as_millisecond() as f64 / 1000.0;
    seen_tx.send_replace(lease_steps::seen(current.as_ref()));
    let pp = PostParams::default();
    // Ours as written: the steps in flight kept (another holder's too, until they end), and
    // where this replica is reached.
    let mine = |old: Option<Lease>, take: bool| {
        let steps = old.as_ref().map(lease_steps::applying).unwrap_or_default();
        let mut l = ours(opts, old, now, take);
        lease_steps::annotate(&mut l, &steps, &opts.address, secs);
        l
    };
    let (written, took_over) = match decide(current.as_ref(), &opts.identity, now) {
        Step::Wait { holder } => return Holding::Other { holder },
        Step::Create => (api.create(&pp, &mine(None, false)).await, None),
        Step::Renew => (api.replace(&opts.name, &pp, &mine(current, false)).await, None),
        Step::TakeOver { from } => {
            let took = (!from.is_empty() || current.is_some()).then_some(sent);
            (api.replace(&opts.name, &pp, &mine(current, true)).await, took)
        }
    };
    match written {
        Ok(l) => {
            seen_tx.send_replace(lease_steps::seen(Some(&l)));
            let took_over = match was {
                Holding::Held { took_over: t, .. } => *t,
                _ => took_over,
            };
            if !matches!(was, Holding::Held { .. }) {
                tracing::info!(lease = %opts.name, identity = %opts.identity, "this replica now holds the apply Lease");
            }
            Holding::Held { until, took_over }
        }
        Err(e) => keep_or(format!("writing the Lease: {e}")),
    }
}

/// How often the holder renews: three times within what its own deadline allows
/// (`duration - SKEW_MARGIN`), so a renewal that fails once still leaves time for the next, and
/// a holder renewing on time never sees its deadline pass between two rounds.
pub(crate) fn renew_every(duration: Duration) -> Duration {
    (duration.saturating_sub(SKEW_MARGIN) / 3).max(Duration::from_millis(200))
}

/// What a round found, unless this replica's own step write proved a later deadline meanwhile
/// (`current`): a round that could not renew keeps the deadline it knew when it began, which a
/// step's write may have moved on.
pub(crate) fn fresher(round: Holding, current: &Holding) -> Holding {
    match (&round, current) {
        (Holding::Held { until: a, took_over }, Holding::Held { until: b, .. }) if b > a => {
            Holding::Held { until: *b, took_over: *took_over }
        }
        _ => round,
    }
}

/// What writes the Lease for a node's step (only with a Lease).
#[derive(Clone)]
struct Writer {
    api: Api<Lease>,
    opts: LeaseOptions,
    holding: watch::Sender<Holding>,
    seen: watch::Sender<Seen>,
}

/// This replica's view of the apply Lease, kept current by a task.
#[derive(Clone)]
pub struct ApplyLease {
    rx: watch::Receiver<Holding>,
    seen: watch::Receiver<Seen>,
    writer: Option<Writer>,
    what: String,
    identity: String,
}

impl ApplyLease {
    /// No Lease: this console carries out its own Applies.
    pub fn alone() -> Self {
        let (_, rx) = watch::channel(Holding::Alone);
        let (_, seen) = watch::channel(Seen::default());
        ApplyLease { rx, seen, writer: None, what: String::new(), identity: String::new() }
    }

    /// A fixed view, changed by hand through the sender (tests).
    pub fn fixed(h: Holding) -> (watch::Sender<Holding>, Self) {
        let (tx, rx) = watch::channel(h);
        let (_, seen) = watch::channel(Seen::default());
        (
            tx,
            ApplyLease { rx, seen, writer: None, what: "test/apply".into(), identity: "this-replica".into() },
        )
    }

    /// This replica's name in the Lease ("" without one).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Starts the task that takes and renews the Lease; it runs until aborted.
    pub fn spawn(client: Client, opts: LeaseOptions) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = watch::channel(Holding::Unknown { why: "the Lease has not been read yet".into() });
        let (seen_tx, seen) = watch::channel(Seen::default());
        let api: Api<Lease> = Api::namespaced(client, &opts.namespace);
        let writer =
            Writer { api: api.clone(), opts: opts.clone(), holding: tx.clone(), seen: seen_tx.clone() };
        let lease = ApplyLease {
            rx,
            seen,
            writer: Some(writer),
            what: format!("{}/{}", opts.namespace, opts.name),
            identity: opts.identity.clone(),
        };
        let task = tokio::spawn(async move {
            let every = renew_every(opts.duration);
            loop {
                let was = tx.borrow().clone();
                let mut now = round(&api, &opts, &was, &seen_tx).await;
                if matches!(was, Holding::Held { .. }) && now == was {
                    // Not renewed (most often a node's step written meanwhile changed the Lease
                    // under this round's write): once more at once, on the Lease as it is now.
                    now = round(&api, &opts, &was, &seen_tx).await;
                }
                // A step's write during the round may have proved a later deadline.
                let now = fresher(now, &tx.borrow());
                if let (Holding::Held { .. }, Holding::Other { holder }) = (&was, &now) {
                    tracing::warn!(lease = %opts.name, holder = %holder, "this replica lost the apply Lease");
                }
                tx.send_replace(now);
                tokio::time::sleep(every).await;
            }
        });
        (lease, task)
    }

    /// What it says now.
    pub fn holding(&self) -> Holding {
        self.rx.borrow().clone()
    }

    /// Another replica holding the Lease, and where it said it is reached ("" when it did not).
    pub fn other_holder(&self) -> Option<(String, String)> {
        match self.holding() {
            Holding::Other { holder } => Some((holder, self.seen.borrow().holder_address.clone())),
            _ => None,
        }
    }

    /// Before `node`'s step: the Lease written (conditionally, as its holder) with the step and
    /// until when it may run (`until`, seconds since the epoch), or why it may not be sent now
    /// (the Lease is another's, cannot be written, or another replica's step on `node` may still
    /// run). Without a Lease: always.
    pub async fn begin_step(&self, node: &str, until: f64) -> Result<(), String> {
        let Some(w) = &self.writer else { return Ok(()) };
        let me = self.identity.clone();
        let change = |steps: &mut lease_steps::Applying, now: f64| {
            if let Some(why) = lease_steps::blocked(steps, node, &me, now) {
                return Err(why);
            }
            steps.insert(node.to_owned(), lease_steps::InFlight { by: me.clone(), until });
            Ok(())
        };
        write_step(&w.api, &w.opts, &w.holding, &w.seen, change).await
    }

    /// After `node`'s step: its entry taken out of the Lease (best effort: an entry left behind
    /// ends at its time).
    pub async fn end_step(&self, node: &str) {
        let Some(w) = &self.writer else { return };
        let me = self.identity.clone();
        let change = |steps: &mut lease_steps::Applying, _: f64| {
            if steps.get(node).is_some_and(|s| s.by == me) {
                steps.remove(node);
            }
            Ok(())
        };
        if let Err(e) = write_step(&w.api, &w.opts, &w.holding, &w.seen, change).await {
            tracing::warn!(node = %node, error = %e, "could not take a finished step out of the apply Lease (it ends at its time)");
        }
    }

    /// Resolves once this replica may no longer carry out Applies (it lost the Lease, or could
    /// not renew it in time); never without a Lease.
    pub async fn lost(&self) {
        let mut rx = self.rx.clone();
        loop {
            let until = match &*rx.borrow_and_update() {
                Holding::Alone => None,
                Holding::Held { until, .. } => Some(*until),
                _ => return,
            };
            match until {
                None => {
                    if rx.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                }
                Some(until) if Instant::now() >= until => return,
                Some(until) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(until) => {}
                        changed = rx.changed() => if changed.is_err() { return },
                    }
                }
            }
        }
    }

    /// Whether this replica may carry out an Apply now: `Ok(took_over)` (when it took the Lease
    /// over from another holder), or why not, naming the holder.
    pub fn check(&self, now: Instant) -> Result<Option<Instant>, String> {
        let me = &self.identity;
        let what = &self.what;
        match self.holding() {
            Holding::Alone => Ok(None),
            Holding::Held { until, took_over } if now < until => Ok(took_over),
            Holding::Held { .. } => Err(format!(
                "this console replica ({me}) could not renew the apply Lease {what} in time, so it may \
                 not carry out Applies now; nothing ran: retry in a few seconds"
            )),
            Holding::Other { holder } => Err(format!(
                "this console replica ({me}) does not hold the apply Lease {what}: replica {holder} does, \
                 and only the holder carries out Applies (one fleet-wide step budget); nothing ran: \
                 retry (a new connection through the Service may reach {holder}), or ask {holder} directly"
            )),
            Holding::Unknown { why } => Err(format!(
                "this console replica ({me}) cannot tell who holds the apply Lease {what} ({why}), so it \
                 may not carry out Applies now; nothing ran"
            )),
        }
    }
}

/// Writes the Lease with `change` applied to its steps, conditionally on the Lease as read and
/// held by this replica; returns the Holding the write proves (the API server accepted it).
async fn write_step(
    api: &Api<Lease>,
    opts: &LeaseOptions,
    holding: &watch::Sender<Holding>,
    seen_tx: &watch::Sender<Seen>,
    change: impl Fn(&mut lease_steps::Applying, f64) -> Result<(), String>,
) -> Result<(), String> {
    let what = format!("{}/{}", opts.namespace, opts.name);
    for _ in 0..3 {
        let sent = Instant::now();
        let current =
            api.get_opt(&opts.name).await.map_err(|e| format!("reading the apply Lease {what}: {e}"))?;
        let now = Timestamp::now();
        let secs = now.as_millisecond() as f64 / 1000.0;
        match decide(current.as_ref(), &opts.identity, now) {
            Step::Renew => {}
            Step::Wait { holder } => {
                return Err(format!(
                    "replica {holder} holds the apply Lease {what} now, not this one ({})",
                    opts.identity
                ))
            }
            Step::Create | Step::TakeOver { .. } => {
                return Err(format!(
                    "this replica ({}) no longer holds the apply Lease {what}",
                    opts.identity
                ))
            }
        }
        let mut steps = current.as_ref().map(lease_steps::applying).unwrap_or_default();
        change(&mut steps, secs)?;
        let mut l = ours(opts, current, now, false);
        lease_steps::annotate(&mut l, &steps, &opts.address, secs);
        match api.replace(&opts.name, &PostParams::default(), &l).await {
            Ok(written) => {
                let took_over = match &*holding.borrow() {
                    Holding::Held { took_over, .. } => *took_over,
                    _ => None,
                };
                let until = sent + opts.duration.saturating_sub(SKEW_MARGIN);
                holding.send_replace(Holding::Held { until, took_over });
                seen_tx.send_replace(lease_steps::seen(Some(&written)));
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(format!("writing the apply Lease {what}: {e}")),
        }
    }
    Err(format!("the apply Lease {what} kept changing under this replica's writes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_come_well_within_the_holders_deadline_and_a_later_proof_is_kept() {
        for secs in [3, 5, 15, 60] {
            let d = Duration::from_secs(secs);
            assert!(renew_every(d) * 3 <= d - SKEW_MARGIN, "{secs} s: {:?}", renew_every(d));
        }
        let t0 = Instant::now();
        let (early, late) = (t0 + Duration::from_secs(1), t0 + Duration::from_secs(2));
        let held = |until| Holding::Held { until, took_over: None };
        assert_eq!(fresher(held(early), &held(late)), held(late), "a step's write proved more");
        assert_eq!(fresher(held(late), &held(early)), held(late));
        let other = Holding::Other { holder: "replica-1".into() };
        assert_eq!(fresher(other.clone(), &held(late)), other, "a lost Lease is never kept as held");
    }

    fn lease(holder: &str, renewed: Timestamp, secs: i32) -> Lease {
        ours(
            &LeaseOptions {
                namespace: "blockjanitor".into(),
                name: "blockjanitor-console-apply".into(),
                identity: holder.into(),
                duration: Duration::from_secs(secs as u64),
                address: String::new(),
            },
            None,
            renewed,
            false,
        )
    }

    #[test]
    fn decide_takes_a_free_or_expired_lease_and_waits_for_a_live_holder() {
        let now = Timestamp::from_second(1_800_000_000).expect("time");
        let ago = |s: i64| now - SignedDuration::from_secs(s);
        assert_eq!(decide(None, "a", now), Step::Create);
        assert_eq!(decide(Some(&lease("a", ago(100), 15)), "a", now), Step::Renew, "ours, even expired");
        assert_eq!(decide(Some(&lease("b", ago(5), 15)), "a", now), Step::Wait { holder: "b".into() });
        assert_eq!(decide(Some(&lease("b", ago(16), 15)), "a", now), Step::TakeOver { from: "b".into() });
        assert_eq!(decide(Some(&lease("", ago(1), 15)), "a", now), Step::TakeOver { from: String::new() });
        let mut no_time = lease("b", now, 15);
        no_time.spec.as_mut().expect("spec").renew_time = None;
        no_time.spec.as_mut().expect("spec").acquire_time = None;
        assert_eq!(decide(Some(&no_time), "a", now), Step::TakeOver { from: "b".into() }, "unreadable: free");
    }

    #[test]
    fn taking_over_counts_a_transition_and_keeps_the_resource_version() {
        let now = Timestamp::from_second(1_800_000_000).expect("time");
        let mut old = lease("b", now, 15);
        old.metadata.resource_version = Some("42".into());
        let opts = LeaseOptions {
            namespace: "blockjanitor".into(),
            name: "blockjanitor-console-apply".into(),
            identity: "a".into(),
            duration: Duration::from_secs(15),
            address: String::new(),
        };
        let l = ours(&opts, Some(old), now, true);
        let spec = l.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_transitions, Some(1));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(l.metadata.resource_version.as_deref(), Some("42"), "the write is conditional");
    }

    #[test]
    fn only_a_fresh_holder_may_apply_and_refusals_name_the_holder() {
        let now = Instant::now();
        let (tx, rx) = watch::channel(Holding::Other { holder: "console-7d9f-b".into() });
        let (_, seen) = watch::channel(Seen::default());
        let l = ApplyLease {
            rx,
            seen,
            writer: None,
            what: "blockjanitor/apply".into(),
            identity: "console-7d9f-a".into(),
        };
        let e = l.check(now).expect_err("not the holder");
        assert!(
            e.contains("console-7d9f-b") && e.contains("console-7d9f-a") && e.contains("nothing ran"),
            "{e}"
        );
        tx.send_replace(Holding::Held { until: now + Duration::from_secs(5), took_over: None });
        assert_eq!(l.check(now), Ok(None));
        assert!(l.check(now + Duration::from_secs(6)).is_err(), "an unrenewed Lease stops Applies");
        tx.send_replace(Holding::Unknown { why: "reading the Lease: connection refused".into() });
        assert!(l.check(now).expect_err("unknown").contains("connection refused"));
        assert_eq!(ApplyLease::alone().check(now), Ok(None));
    }
}
