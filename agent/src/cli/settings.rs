//! The agent's settings, built once from its flags (and, for `serve`, its config file): the host
//! it reads, how it scans, the engine's settings, the grace clocks kept between one-shot runs.

use super::args::*;
use crate::act::journal;
use crate::config::Config;
use crate::discover::namespaces::MountReader;
use crate::engine::world::LinuxWorld;
use crate::engine::{Engine, Settings};
use crate::host::HostRoot;
use crate::judge::grace::Clocks;
use crate::plan;
use crate::snapshot::ScanOptions;
use anyhow::Result;
use std::path::PathBuf;
use std::time::Duration;

pub fn host(cli: &Cli) -> HostRoot {
    let mut h = HostRoot::new(&cli.root);
    if let Some(p) = &cli.proc {
        h = h.with_proc(p);
    }
    if let Some(s) = &cli.sys {
        h = h.with_sys(s);
    }
    if let Some(d) = &cli.dev {
        h = h.with_dev(d);
    }
    h
}

/// How the one-shot commands read the host.
pub fn scan_options(cli: &Cli) -> ScanOptions {
    ScanOptions {
        reader: MountReader::from(cli.mount_reader),
        kubelet_dir: cli
            .kubelet_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(crate::discover::kubelet::DEFAULT_KUBELET_DIR)),
        trust_unreadable_init: cli.trust_unreadable_init,
        ..ScanOptions::default()
    }
}

/// The engine the one-shot commands drive, with the Kubernetes API's view where it is asked
/// ([`super::kubernetes`]).
pub fn engine(cli: &Cli, host: HostRoot, clean: plan::clean::CleanOptions) -> Engine<LinuxWorld> {
    let interval = Duration::from_secs(cli.rescan_interval.unwrap_or(60).max(1));
    let world = LinuxWorld::new(host, scan_options(cli), Duration::from_secs(cli.timeout));
    super::kubernetes::connect(cli, &world);
    Engine::new(
        world,
        settings(
            Duration::from_secs(cli.grace_period),
            interval,
            clean,
            crate::judge::stall::DEFAULT_THRESHOLD,
        ),
    )
}

/// The engine's settings, for the one-shot commands (from the flags) and `serve` (from its
/// config) alike: the grace period, the longest gap between two observations that keeps a grace
/// clock running (two rescan intervals), what `clean` may do, and when a device that does not
/// answer counts as hung.
pub fn settings(
    grace: Duration,
    rescan_interval: Duration,
    clean: plan::clean::CleanOptions,
    unresponsive_after: Duration,
) -> Settings {
    Settings {
        grace,
        max_gap: rescan_interval * 2,
        clean,
        release: plan::release::ReleaseOptions::default(),
        unresponsive_after,
    }
}

/// The grace clocks the one-shot commands keep in `--state` between runs (stamped with the boot
/// id; a fixture tree keeps none).
pub struct StateFile<'a> {
    pub path: &'a std::path::Path,
    pub live: bool,
    pub clocks: Clocks,
}

impl<'a> StateFile<'a> {
    pub fn load(cli: &'a Cli, host: &HostRoot) -> Self {
        let live = host.is_live();
        let boot = crate::host::clock::boot_id(host);
        let clocks = if live { Clocks::load(&cli.state, boot) } else { Clocks::new(None) };
        Self { path: &cli.state, live, clocks }
    }

    pub fn save(&self) {
        if self.live {
            if let Err(e) = self.clocks.save(self.path) {
                tracing::warn!(
                    "cannot save {}: {e}; the grace period restarts on the next run",
                    self.path.display()
                );
            }
        }
    }
}

/// The `statmount` memo file, when one is kept: `--statmount-memo` is not empty, and the mount
/// tables are read with `statmount`'s help (`--mount-reader auto`).
pub fn statmount_memo_path(cli: &Cli) -> Option<&std::path::Path> {
    let kept = matches!(cli.mount_reader, ReaderArg::Auto) && !cli.statmount_memo.as_os_str().is_empty();
    kept.then_some(cli.statmount_memo.as_path())
}

pub fn journal_path(cli: &Cli) -> PathBuf {
    cli.journal.clone().unwrap_or_else(|| PathBuf::from(journal::DEFAULT_PATH))
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

/// The watches' options: the defaults, or scaled to the configured silence bound.
pub fn watch_options(k: &crate::config::KubernetesConfig) -> crate::kube::WatchOptions {
    crate::kube::WatchOptions::for_bound(k.silence_bound_seconds)
}
