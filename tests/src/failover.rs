//! A client that spreads questions over several console replicas, the stand-in for a
//! Kubernetes Service in front of the console's Deployment: round robin over the replicas not
//! known to be down; a call that fails marks its replica down (as the Service's endpoints drop
//! a pod that stopped answering) and is asked again of the next one. Used to measure and test
//! what a replica's loss costs the callers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_client::FleetClient;
use tonic::transport::Channel;

use crate::daemon::{tls_channel, Pem};

/// Bound on one call to one replica.
pub const CALL_DEADLINE: Duration = Duration::from_secs(2);

/// The replicas and which of them are down.
pub struct Replicas {
    clients: Vec<FleetClient<Channel>>,
    down: Vec<AtomicBool>,
    next: AtomicUsize,
}

/// One question and how it went.
#[derive(Debug, Clone)]
pub struct Asked {
    pub started: Instant,
    /// Until the answer (or the last failure), retries included.
    pub took: Duration,
    /// The replica that answered (`None`: none did).
    pub answered_by: Option<usize>,
    /// Failed attempts: the replica and the error.
    pub failures: Vec<(usize, String)>,
}

impl Replicas {
    /// One mTLS channel per address, as `who` (a certificate of `ca`).
    pub async fn connect(addrs: &[SocketAddr], ca: &str, who: &Pem) -> Self {
        let mut clients = Vec::new();
        for a in addrs {
            let ch =
                tls_channel(*a, ca, Some((&who.cert, &who.key))).await.expect("connect to a console replica");
            clients.push(FleetClient::new(ch).max_decoding_message_size(64 << 20));
        }
        let down = addrs.iter().map(|_| AtomicBool::new(false)).collect();
        Replicas { clients, down, next: AtomicUsize::new(0) }
    }

    fn pick(&self) -> Option<usize> {
        let n = self.clients.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n).map(|k| (start + k) % n).find(|i| !self.down[*i].load(Ordering::Relaxed))
    }

    /// Asks `req` (a `Where`) of the next replica up, then of the others as they fail.
    pub async fn ask(&self, req: pb::WhereRequest) -> (Asked, Option<pb::WhereResponse>) {
        let started = Instant::now();
        let mut failures = Vec::new();
        while let Some(i) = self.pick() {
            let mut c = self.clients[i].clone();
            match tokio::time::timeout(CALL_DEADLINE, c.r#where(req.clone())).await {
                Ok(Ok(r)) => {
                    let asked = Asked { started, took: started.elapsed(), answered_by: Some(i), failures };
                    return (asked, Some(r.into_inner()));
                }
                Ok(Err(s)) => failures.push((i, format!("{:?}: {}", s.code(), s.message()))),
                Err(_) => failures.push((i, format!("no answer within {CALL_DEADLINE:?}"))),
            }
            self.down[i].store(true, Ordering::Relaxed);
        }
        (Asked { started, took: started.elapsed(), answered_by: None, failures }, None)
    }
}

/// What a run with a replica killed mid-way gave.
#[derive(Debug, Default)]
pub struct FailoverReport {
    pub asked: usize,
    /// Questions with a failed attempt (each then asked again of another replica).
    pub failed_attempts: usize,
    /// Of those, the ones that started more than [`IN_FLIGHT_GRACE`] after the kill: a failure
    /// the loss of a replica should not cost.
    pub failed_after_grace: usize,
    /// Questions no replica answered.
    pub unanswered: usize,
    /// Questions whose answer was wrong (`check` said no).
    pub wrong: usize,
    /// The longest a question that started after the kill took, retries included.
    pub worst_after_kill: Duration,
    /// From the kill to the first answer to a question that started after it.
    pub first_answer_after_kill: Option<Duration>,
}

/// A question that started this soon after the kill counts as in flight at the kill (the
/// client had not yet heard of the loss).
pub const IN_FLIGHT_GRACE: Duration = Duration::from_millis(100);

/// `workers` callers ask `req(k)` in a loop for `run`; `kill` runs at `kill_at`. `check` says
/// whether an answer is right.
pub async fn run_with_kill(
    replicas: Arc<Replicas>,
    workers: usize,
    run: Duration,
    kill_at: Duration,
    kill: impl FnOnce() + Send + 'static,
    req: impl Fn(usize) -> pb::WhereRequest + Send + Sync + 'static,
    check: impl Fn(&pb::WhereResponse) -> bool + Send + Sync + 'static,
) -> FailoverReport {
    let t0 = Instant::now();
    let killed: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let req = Arc::new(req);
    let check = Arc::new(check);
    let mut set = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (replicas, req, check) = (Arc::clone(&replicas), Arc::clone(&req), Arc::clone(&check));
        set.spawn(async move {
            let mut out = Vec::new();
            let mut k = w;
            while t0.elapsed() < run {
                let (asked, r) = replicas.ask(req(k)).await;
                out.push((asked, r.is_some_and(|r| check(&r))));
                k += workers;
            }
            out
        });
    }
    let k2 = Arc::clone(&killed);
    let killer = tokio::spawn(async move {
        tokio::time::sleep(kill_at).await;
        let at = Instant::now();
        tokio::task::spawn_blocking(kill).await.expect("kill");
        *k2.lock().expect("lock") = Some(at);
    });
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.extend(r.expect("worker"));
    }
    killer.await.expect("killer");
    let kill_time = killed.lock().expect("lock").expect("the replica was killed");
    let mut rep = FailoverReport { asked: all.len(), ..Default::default() };
    for (a, right) in &all {
        if std::env::var_os("FAILOVER_DEBUG").is_some() && a.took > Duration::from_millis(200) {
            let at = a
                .started
                .checked_duration_since(kill_time)
                .map_or_else(|| format!("-{:?}", kill_time - a.started), |d| format!("+{d:?}"));
            eprintln!(
                "slow question: started {at} from the kill, took {:?}, by {:?}, failures {:?}",
                a.took, a.answered_by, a.failures
            );
        }
        if !a.failures.is_empty() {
            rep.failed_attempts += 1;
            if a.started > kill_time + IN_FLIGHT_GRACE {
                rep.failed_after_grace += 1;
            }
        }
        if a.answered_by.is_none() {
            rep.unanswered += 1;
        } else if !right {
            rep.wrong += 1;
        }
        if a.started >= kill_time {
            rep.worst_after_kill = rep.worst_after_kill.max(a.took);
            if a.answered_by.is_some() {
                let at = a.started + a.took - kill_time;
                rep.first_answer_after_kill = Some(rep.first_answer_after_kill.map_or(at, |f| f.min(at)));
            }
        }
    }
    rep
}
