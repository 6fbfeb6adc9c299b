//! `blockjanitor-console`: the fleet console. Parses flags, installs logging, runs
//! [`blockjanitor_console::serve::run`] until SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;

use blockjanitor_console::discover;
use blockjanitor_console::lease::LeaseOptions;
use blockjanitor_console::link::{LinkOptions, TlsFiles};
use blockjanitor_console::review::ReviewOptions;
use blockjanitor_console::serve::{self, ConsoleOptions, Discovery, KubeSource};
use blockjanitor_console::serving_ca;

#[derive(Parser, Debug)]
#[command(
    name = "blockjanitor-console",
    version,
    about = "The blockjanitor fleet console: follows every node's agent and answers where a volume is mapped, \
who watches an image, and why a volume is stuck in Multi-Attach.",
    after_help = "EXAMPLES:\n  blockjanitor-console --in-cluster --tls-cert tls.crt --tls-key tls.key --tls-client-ca ca.crt \\\n    \
--agent-cert tls.crt --agent-key tls.key --agent-ca ca.crt --publish-serving-ca blockjanitor-console-ca\n  \
blockjanitor-console --agents node1=https://10.0.0.5:9443,node2=https://10.0.0.6:9443 ..."
)]
struct Cli {
    /// Address for gRPC with mutual TLS.
    #[arg(long, default_value = "0.0.0.0:9444", value_name = "ADDR")]
    listen: SocketAddr,
    /// The console's server certificate (PEM).
    #[arg(long, value_name = "FILE")]
    tls_cert: PathBuf,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: PathBuf,
    /// CA that signs the certificates of the console's callers (PEM). A caller without a
    /// certificate sends a bearer token instead (kubectl blockjanitor sends the user's own).
    #[arg(long, value_name = "FILE")]
    tls_client_ca: PathBuf,
    /// Caller identity (certificate DNS SAN or CN) with the operator role, one per person (never a
    /// certificate a team shares: the audit names it); repeatable.
    #[arg(long, value_name = "NAME")]
    operator: Vec<String>,
    /// Caller identity with the viewer role; repeatable.
    #[arg(long, value_name = "NAME")]
    viewer: Vec<String>,
    /// The namespace whose RBAC decides what a token's user may do (SubjectAccessReview of
    /// get/plan/apply on fleet.blockjanitor.io) [default: --namespace].
    #[arg(long, value_name = "NS")]
    access_namespace: Option<String>,
    /// Only tokens issued for this audience are taken (TokenReview audiences) [default: the API
    /// server's own, so the user's kubeconfig token is].
    #[arg(long, value_name = "AUDIENCE")]
    token_audience: Option<String>,
    /// Seconds a TokenReview's or SubjectAccessReview's answer is reused (0: ask every call).
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    review_cache_seconds: u64,
    /// Deadline of one review, in milliseconds: an API server that does not answer refuses the
    /// call (UNAVAILABLE).
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    review_timeout_ms: u64,
    /// The CA that signed --tls-cert (PEM), published with --publish-serving-ca [default:
    /// --tls-client-ca].
    #[arg(long, value_name = "FILE")]
    serving_ca: Option<PathBuf>,
    /// Publish the serving CA in this ConfigMap (key ca.crt) of --namespace, where the kubectl
    /// plugin reads it.
    #[arg(long, value_name = "CONFIGMAP")]
    publish_serving_ca: Option<String>,
    /// Serve /metrics only to a scraper whose bearer token the API server authenticates and may
    /// get /metrics (TokenReview, SubjectAccessReview), as kube-rbac-proxy does.
    #[arg(long)]
    metrics_review: bool,
    /// The console's client certificate towards the agents (the agents give it the console role).
    #[arg(long, value_name = "FILE")]
    agent_cert: PathBuf,
    /// Its private key.
    #[arg(long, value_name = "FILE")]
    agent_key: PathBuf,
    /// CA that signed the agents' certificates.
    #[arg(long, value_name = "FILE")]
    agent_ca: PathBuf,
    /// The name every agent's certificate carries.
    #[arg(long, default_value = "agent.blockjanitor.svc", value_name = "NAME")]
    agent_server_name: String,
    /// Static agents instead of pod discovery: NODE=https://HOST:PORT,...
    #[arg(long, value_name = "LIST")]
    agents: Option<String>,
    /// Namespace of the agent pods (and of the console: its apply Lease, its published CA, the
    /// RBAC asked about).
    #[arg(long, default_value = "blockjanitor", value_name = "NS")]
    namespace: String,
    /// Label selector of the agent pods.
    #[arg(
        long,
        default_value = "app.kubernetes.io/name=blockjanitor,app.kubernetes.io/component=agent",
        value_name = "SELECTOR"
    )]
    selector: String,
    /// The agents' gRPC port (pod IP + this port).
    #[arg(long, default_value_t = 9443, value_name = "PORT")]
    agent_port: u16,
    /// Kubernetes API URL (no credentials: kubectl proxy, tests).
    #[arg(long, value_name = "URL")]
    kube_url: Option<String>,
    /// Kubeconfig file.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Use the pod's service account.
    #[arg(long)]
    in_cluster: bool,
    /// Address for /metrics over HTTP.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Deadline of one call to an agent, in milliseconds.
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    call_timeout_ms: u64,
    /// Deadline of one connection attempt to an agent, in milliseconds.
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    connect_timeout_ms: u64,
    /// Seconds between two full reads of a connected agent's devices.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    resync_seconds: u64,
    /// Longest wait between two connection attempts, in seconds.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    backoff_max_seconds: u64,
    /// Silence after which a link probes its agent (a GetNode call), in milliseconds; also the
    /// least time between two probes. Any event or answer from the agent counts as alive.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    keepalive_interval_ms: u64,
    /// How long an agent may stay silent, beyond the console's own scheduling lag over that
    /// time, before its link counts as dead and its node is named missing, in milliseconds (an
    /// agent that goes silent under a console that runs on time is named within about this).
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    keepalive_timeout_ms: u64,
    /// Idle seconds before TCP keepalive probes start on each link to an agent.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    tcp_keepalive_seconds: u64,
    /// Fleet-wide budget: at most this many steps a minute carried out through the console's
    /// Apply, across every node and caller; an Apply over it is refused, saying when it frees
    /// (0: no budget).
    #[arg(long, default_value_t = serve::DEFAULT_STEPS_PER_MINUTE, value_name = "N")]
    fleet_steps_per_minute: u32,
    /// Applies (dry runs included) a minute per person (the reviewed user, or the certificate's
    /// identity; 0: no limit).
    #[arg(long, default_value_t = 10, value_name = "N")]
    applies_per_minute_per_caller: u32,
    /// Plans a minute per person (0: no limit).
    #[arg(long, default_value_t = 60, value_name = "N")]
    plans_per_minute_per_caller: u32,
    /// Fresh fan-outs a minute per person: questions with --fresh (each asks every agent) and
    /// MultiAttach diagnoses that ask the nodes' plans (0: no limit).
    #[arg(long, default_value_t = 12, value_name = "N")]
    fresh_per_minute_per_caller: u32,
    /// Steps carried out a minute per person, their share of --fleet-steps-per-minute, so that
    /// one person cannot spend the whole fleet's minute (0: no per-person budget).
    #[arg(long, default_value_t = 10, value_name = "N")]
    steps_per_minute_per_caller: u32,
    /// With several replicas: the name of the coordination.k8s.io Lease whose holder alone
    /// carries out Applies (one fleet-wide step budget); the others refuse an Apply naming the
    /// holder. Needs the Kubernetes API. Unset: this console is the only one.
    #[arg(long, value_name = "NAME")]
    apply_lease: Option<String>,
    /// Namespace of the apply Lease (default: --namespace).
    #[arg(long, value_name = "NS")]
    lease_namespace: Option<String>,
    /// This replica's name in the Lease (default: $POD_NAME, else the host name).
    #[arg(long, value_name = "NAME")]
    lease_identity: Option<String>,
    /// The Lease's duration in seconds; the holder renews it every third of that.
    #[arg(long, default_value_t = 15, value_name = "SECONDS")]
    lease_seconds: u64,
    /// Where the other replicas reach this one's gRPC listener, written into the apply Lease while
    /// it holds it, so that they forward Applies to it [default: $POD_IP and the --listen port].
    #[arg(long, value_name = "HOST:PORT")]
    advertise_address: Option<String>,
    /// Certificate identity of the other console replicas, which may forward an Apply here on
    /// behalf of a person they let through (the console role); repeatable.
    #[arg(long, value_name = "NAME")]
    peer_console: Vec<String>,
    /// The name the replicas' serving certificates carry, checked when forwarding to the holder.
    #[arg(long, default_value = "console.blockjanitor.svc", value_name = "NAME")]
    peer_server_name: String,
    /// Deadline of one node's Apply step, in seconds.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    apply_timeout_seconds: u64,
    /// An agent that answers but whose latest scan finished longer ago than this is stale: answers
    /// do not speak for its node (0: never stale).
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    stale_scan_seconds: u64,
    /// Fresh fan-outs (--fresh) one person may have running at once.
    #[arg(long, default_value_t = 2, value_name = "N")]
    fresh_at_once_per_caller: usize,
    /// Fresh fan-outs running at once over every person (the callers of one round share one
    /// fan-out of every agent; 0: no bound).
    #[arg(long, default_value_t = 16, value_name = "N")]
    fresh_at_once: usize,
    /// Plans (Plan, an Apply's dry run, a MultiAttach diagnosis) one person may have running at once.
    #[arg(long, default_value_t = 8, value_name = "N")]
    plans_at_once_per_caller: usize,
    /// Plans running at once over every person (0: no bound).
    #[arg(long, default_value_t = 64, value_name = "N")]
    plans_at_once: usize,
    /// Sweeps one person may have running at once.
    #[arg(long, default_value_t = 2, value_name = "N")]
    sweeps_at_once_per_caller: usize,
    /// Sweeps running at once over every person (0: no bound).
    #[arg(long, default_value_t = 8, value_name = "N")]
    sweeps_at_once: usize,
    /// Log format on stderr.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let sub = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if cli.log_format == "json" {
        sub.json().flatten_event(true).init();
    } else {
        sub.init();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", blockjanitor_rpc::errors::one_line(e.as_ref()));
            ExitCode::from(1)
        }
    }
}

/// `$POD_NAME` (the Deployment sets it from the downward API), else the host name.
fn default_identity() -> String {
    std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()).unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_default()
    })
}

/// How the links connect, wait and retry, from the flags.
fn link_options(cli: &Cli) -> LinkOptions {
    let mut links = LinkOptions::new(
        TlsFiles { cert: cli.agent_cert.clone(), key: cli.agent_key.clone(), ca: cli.agent_ca.clone() },
        &cli.agent_server_name,
    );
    links.call_timeout = Duration::from_millis(cli.call_timeout_ms.max(1));
    links.connect_timeout = Duration::from_millis(cli.connect_timeout_ms.max(1));
    links.resync_interval = Duration::from_secs(cli.resync_seconds.max(1));
    links.backoff_max = Duration::from_secs(cli.backoff_max_seconds.max(1));
    links.keepalive_interval = Duration::from_millis(cli.keepalive_interval_ms.max(1));
    links.keepalive_timeout = Duration::from_millis(cli.keepalive_timeout_ms.max(1));
    links.tcp_keepalive = Duration::from_secs(cli.tcp_keepalive_seconds.max(1));
    links
}

/// `$POD_IP` with the port of `--listen` ("" without it).
fn default_address(listen: SocketAddr) -> String {
    match std::env::var("POD_IP").ok().filter(|ip| !ip.is_empty()) {
        Some(ip) if ip.contains(':') => format!("[{ip}]:{}", listen.port()),
        Some(ip) => format!("{ip}:{}", listen.port()),
        None => String::new(),
    }
}

/// The console's options, from the flags.
fn options(cli: Cli) -> Result<ConsoleOptions> {
    let discovery = match &cli.agents {
        Some(list) => Discovery::Static(discover::parse_static(list)?),
        None => Discovery::Pods {
            namespace: cli.namespace.clone(),
            selector: cli.selector.clone(),
            port: cli.agent_port,
        },
    };
    let apply_lease = cli.apply_lease.clone().map(|name| LeaseOptions {
        namespace: cli.lease_namespace.clone().unwrap_or_else(|| cli.namespace.clone()),
        name,
        identity: cli.lease_identity.clone().unwrap_or_else(default_identity),
        duration: Duration::from_secs(cli.lease_seconds.max(3)),
        address: cli.advertise_address.clone().unwrap_or_else(|| default_address(cli.listen)),
    });
    let publish_ca = cli.publish_serving_ca.clone().map(|name| serving_ca::Publish {
        ca_file: cli.serving_ca.clone().unwrap_or_else(|| cli.tls_client_ca.clone()),
        namespace: cli.namespace.clone(),
        name,
    });
    let review = ReviewOptions {
        audience: cli.token_audience.clone(),
        ttl: Duration::from_secs(cli.review_cache_seconds),
        timeout: Duration::from_millis(cli.review_timeout_ms.max(1)),
        ..ReviewOptions::default()
    };
    Ok(ConsoleOptions {
        access_namespace: cli.access_namespace.clone().unwrap_or_else(|| cli.namespace.clone()),
        review,
        publish_ca,
        metrics_review: cli.metrics_review,
        listen: cli.listen,
        links: link_options(&cli),
        tls_cert: cli.tls_cert,
        tls_key: cli.tls_key,
        tls_client_ca: cli.tls_client_ca,
        operators: cli.operator,
        viewers: cli.viewer,
        metrics_listen: cli.metrics_listen,
        discovery,
        kube: KubeSource { url: cli.kube_url, kubeconfig: cli.kubeconfig, in_cluster: cli.in_cluster },
        apply_timeout: Duration::from_secs(cli.apply_timeout_seconds.max(1)),
        steps_per_minute: cli.fleet_steps_per_minute,
        caller_limits: blockjanitor_console::service::CallerLimits {
            applies_per_minute: cli.applies_per_minute_per_caller,
            plans_per_minute: cli.plans_per_minute_per_caller,
            fresh_per_minute: cli.fresh_per_minute_per_caller,
            steps_per_minute: cli.steps_per_minute_per_caller,
        },
        apply_lease,
        stale_after_seconds: cli.stale_scan_seconds as f64,
        concurrency: blockjanitor_console::limits::Concurrency {
            fresh: (cli.fresh_at_once_per_caller, cli.fresh_at_once),
            plans: (cli.plans_at_once_per_caller, cli.plans_at_once),
            sweeps: (cli.sweeps_at_once_per_caller, cli.sweeps_at_once),
        },
        peer_consoles: cli.peer_console,
        peer_server_name: cli.peer_server_name,
    })
}

fn run(cli: Cli) -> Result<()> {
    let opts = options(cli)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")?;
    rt.block_on(async move {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("cannot listen for SIGTERM: {e}");
                    return;
                }
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            let _ = tx.send(true);
        });
        serve::run(opts, rx).await
    })?;
    Ok(())
}
