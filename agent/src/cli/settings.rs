//! The agent's settings, built once from its flags (and, for `serve`, its config file): the host
//! it reads and how, the engine's settings, the one-shot run's engine ([`one_shot`]: the
//! engine's request API, with the grace clocks kept between runs and the Kubernetes API's view).

use super::args::*;
use crate::config::Config;
use crate::engine::requests::api::ApiWanted;
use crate::engine::requests::setup::{self, HostSpec};
use crate::engine::requests::{OneShot, OneShotOptions};
use crate::engine::Settings;
use anyhow::Result;
use std::path::PathBuf;
use std::time::Duration;

/// Where the host is and how to read it.
pub fn host_spec(cli: &Cli) -> HostSpec {
    HostSpec {
        root: cli.root.clone(),
        proc: cli.proc.clone(),
        sys: cli.sys.clone(),
        dev: cli.dev.clone(),
        mountinfo_only: matches!(cli.mount_reader, ReaderArg::Mountinfo),
        kubelet_dir: cli.kubelet_dir.clone(),
        trust_unreadable_init: cli.trust_unreadable_init,
        timeout: Duration::from_secs(cli.timeout),
    }
}

/// The engine's settings for the one-shot commands, from the flags: the grace period and the
/// rescan interval (twice it is the longest gap between two runs that keeps a grace clock
/// running); a command's opt-ins are set on them.
pub fn settings(cli: &Cli) -> Settings {
    let interval = Duration::from_secs(cli.rescan_interval.unwrap_or(60).max(1));
    Settings::with_grace(Duration::from_secs(cli.grace_period), interval)
}

/// The engine for a one-shot command, with the grace clocks kept in `--state`, the statmount
/// memo's place (which only `holders` and `scan` load) and the Kubernetes API's view where it
/// is asked.
pub fn one_shot(cli: &Cli, settings: Settings) -> OneShot {
    OneShot::open(OneShotOptions {
        host: host_spec(cli),
        settings,
        api: ApiWanted {
            off: cli.no_kubernetes,
            url: cli.kube_url.clone(),
            kubeconfig: cli.kubeconfig.clone(),
            node_name: node_name(cli),
            silence_bound_seconds: cli.kube_silence_bound_seconds,
            wait: Duration::from_secs(cli.kube_wait),
        },
        state: cli.state.clone(),
        statmount_memo: statmount_memo_path(cli).map(PathBuf::from),
        journal: journal_path(cli),
        lock_wait: Duration::from_secs(cli.lock_wait),
        by: format!("cli (uid {})", nix::unistd::geteuid()),
    })
}

/// This node's name: `--node-name` (or `$NODE_NAME`), else the host name.
pub fn node_name(cli: &Cli) -> String {
    cli.node_name.clone().unwrap_or_else(|| {
        nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown".into())
    })
}

/// The `statmount` memo file, when one is kept: `--statmount-memo` is not empty, and the mount
/// tables are read with `statmount`'s help (`--mount-reader auto`).
pub fn statmount_memo_path(cli: &Cli) -> Option<&std::path::Path> {
    let kept = matches!(cli.mount_reader, ReaderArg::Auto) && !cli.statmount_memo.as_os_str().is_empty();
    kept.then_some(cli.statmount_memo.as_path())
}

pub fn journal_path(cli: &Cli) -> PathBuf {
    cli.journal.clone().unwrap_or_else(|| PathBuf::from(setup::JOURNAL))
}

/// Builds the daemon's config: the file (if any), then the flags.
pub fn serve_config(cli: &Cli, a: &ServeArgs) -> Result<Config> {
    let mut c = match &a.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some(v) = &a.socket {
        c.socket.path = v.clone();
    }
    if let Some(v) = &a.socket_group {
        c.socket.group = Some(v.clone());
    }
    if let Some(v) = a.listen {
        c.tcp.listen = Some(v);
    }
    if let Some(v) = &a.tls_cert {
        c.tcp.cert = Some(v.clone());
    }
    if let Some(v) = &a.tls_key {
        c.tcp.key = Some(v.clone());
    }
    if let Some(v) = &a.tls_client_ca {
        c.tcp.client_ca = Some(v.clone());
    }
    c.tcp.operators.extend(a.tls_operator.iter().cloned());
    c.tcp.viewers.extend(a.tls_viewer.iter().cloned());
    c.tcp.consoles.extend(a.tls_console.iter().cloned());
    if let Some(v) = a.metrics_listen {
        c.metrics.listen = Some(v);
    }
    if let Some(v) = a.health_listen {
        c.health.listen = Some(v);
    }
    if let Some(v) = cli.rescan_interval {
        c.rescan_interval_seconds = v;
    }
    if let Some(v) = a.full_read_every {
        c.full_read_every = v;
    }
    if let Some(v) = a.grace_period {
        c.grace_period_seconds = v;
    }
    if let Some(v) = a.unresponsive_after {
        c.unresponsive_after_seconds = v;
    }
    if a.cap_device_events || a.no_cap_device_events {
        c.cap_device_events = a.cap_device_events;
    }
    if let Some(v) = &cli.node_name {
        c.node_name = Some(v.clone());
    }
    if let Some(m) = &a.mode {
        c.mode = match m.as_str() {
            "release" => crate::config::Mode::Release,
            "clean" => crate::config::Mode::Clean,
            _ => crate::config::Mode::Report,
        };
    }
    if let Some(n) = a.max_actions_per_minute {
        c.max_actions_per_minute = n;
    }
    if cli.no_kubernetes {
        c.kubernetes.enabled = Some(false);
        c.kubernetes.off_by = Some("--no-kubernetes".to_owned());
    }
    if let Some(u) = &cli.kube_url {
        c.kubernetes.url = Some(u.clone());
    }
    if let Some(k) = &cli.kubeconfig {
        c.kubernetes.kubeconfig = Some(k.clone());
    }
    if let Some(b) = cli.kube_silence_bound_seconds {
        c.kubernetes.silence_bound_seconds = Some(b);
    }
    if let Some(j) = &cli.journal {
        c.journal = j.clone();
    }
    // The flag overrides the config's `kubelet_dir` only when given.
    if let Some(k) = &cli.kubelet_dir {
        c.kubelet_dir = k.clone();
    }
    c.trust_unreadable_init |= cli.trust_unreadable_init;
    c.validate()?;
    Ok(c)
}
