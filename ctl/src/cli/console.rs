//! Where `fleet` finds the console: `--console HOST:PORT` (or BLOCKJANITOR_CONSOLE) with
//! certificate files, or through the Kubernetes API (the kubectl plugin's way, and `agentctl
//! fleet` given `--kubeconfig`, `--context`, `-n` or `--ca-configmap`): the kubeconfig, the
//! console's pod, a port-forward, the user's own token (see [`crate::kubectl`]).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use blockjanitor_rpc::client::{self, Target, TcpTarget};
use tonic::service::interceptor::InterceptedService;

use super::args::Cli;
use crate::kubectl::{self, Bearer, CaSource, ConsoleChannel, Credentials, Route};

/// How the console is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ConsoleRoute {
    /// `--console HOST:PORT` with mutual TLS.
    Direct(Target),
    /// Through the API server's port-forward.
    Kube(Route),
}

impl ConsoleRoute {
    /// From the flags; `plugin`: run as `kubectl-blockjanitor`.
    pub(crate) fn from_cli(cli: &Cli, plugin: bool) -> Result<Self> {
        if cli.addr.is_some() {
            bail!("--addr names one agent; fleet talks to the console: use --console or the kubeconfig (--context, -n)");
        }
        // explain's -n is the object's namespace, as in kubectl: it names no console.
        let names_console = if explains(cli) { cli.kube.names_the_console() } else { cli.kube.any() };
        match (&cli.console, names_console) {
            (Some(_), true) => bail!(
                "--console and the kubeconfig flags (--kubeconfig, --context, -n, --ca-configmap) both name the \
                 console: give one (unset BLOCKJANITOR_CONSOLE to go through the kubeconfig)"
            ),
            (Some(addr), false) => direct(cli, addr).map(Self::Direct),
            (None, true) => Ok(Self::Kube(kube_route(cli)?)),
            (None, false) if plugin => Ok(Self::Kube(kube_route(cli)?)),
            (None, false) => bail!(
                "fleet needs the console: --context/-n/--kubeconfig to reach it through the Kubernetes API \
                 (as kubectl blockjanitor does by default), or --console HOST:PORT (or BLOCKJANITOR_CONSOLE) \
                 with --cert, --key and --ca"
            ),
        }
    }

    /// A channel to the console, the attempt bounded by `timeout`.
    pub(crate) async fn channel(&self, timeout: Duration) -> Result<ConsoleChannel> {
        match self {
            Self::Direct(target) => Ok(InterceptedService::new(
                client::connect_channel(target, timeout).await?,
                Bearer::default(),
            )),
            Self::Kube(route) => Ok(kubectl::connect(route, timeout).await?),
        }
    }
}

/// Whether the command is `fleet explain` (whose -n is the object's namespace).
pub(crate) fn explains(cli: &Cli) -> bool {
    matches!(
        &cli.command,
        super::args::Command::Fleet { command: super::fleet_args::FleetCommand::Explain { .. } }
    )
}

/// The certificate files from the flags, or for fleet from BLOCKJANITOR_CERT, _KEY, _CA (the
/// local commands never pick them up from there); `None` when none is given.
fn files(cli: &Cli) -> Result<Option<(PathBuf, PathBuf, PathBuf)>> {
    let file =
        |flag: &Option<PathBuf>, var: &str| flag.clone().or_else(|| std::env::var_os(var).map(PathBuf::from));
    match (file(&cli.cert, "BLOCKJANITOR_CERT"), file(&cli.key, "BLOCKJANITOR_KEY"), file(&cli.ca, "BLOCKJANITOR_CA")) {
        (None, None, None) => Ok(None),
        (Some(cert), Some(key), Some(ca)) => Ok(Some((cert, key, ca))),
        _ => bail!("--cert, --key and --ca (or BLOCKJANITOR_CERT, _KEY, _CA) go together: mutual TLS needs all three"),
    }
}

/// `--console HOST:PORT` with the certificate files.
fn direct(cli: &Cli, addr: &str) -> Result<Target> {
    let (host, _) = client::split_host_port(addr)
        .with_context(|| format!("--console '{addr}' is not HOST:PORT (e.g. blockjanitor-console:9444)"))?;
    let Some((cert, key, ca)) = files(cli)? else {
        bail!("--console needs --cert, --key and --ca (or BLOCKJANITOR_CERT, _KEY, _CA): mutual TLS");
    };
    Ok(Target::Tcp(TcpTarget {
        addr: addr.to_owned(),
        cert,
        key,
        ca,
        server_name: cli.server_name.clone().unwrap_or_else(|| host.to_owned()),
    }))
}

/// Through the kubeconfig: the user's own token, the console's CA from the ConfigMap
/// (`--ca-configmap`, default the one the console publishes) or `--ca`; or, with `--cert`,
/// `--key` and `--ca`, a client certificate of one's own.
fn kube_route(cli: &Cli) -> Result<Route> {
    let file =
        |flag: &Option<PathBuf>, var: &str| flag.clone().or_else(|| std::env::var_os(var).map(PathBuf::from));
    let (cert, key, ca) = (
        file(&cli.cert, "BLOCKJANITOR_CERT"),
        file(&cli.key, "BLOCKJANITOR_KEY"),
        file(&cli.ca, "BLOCKJANITOR_CA"),
    );
    let credentials = match (cert, key, ca, &cli.kube.ca_configmap) {
        (_, _, Some(_), Some(_)) => bail!("--ca-configmap and --ca both name the console's CA: give one"),
        (Some(cert), Some(key), Some(ca), None) => Credentials::Certificate { cert, key, ca },
        (None, None, Some(ca), None) => Credentials::Kubeconfig { ca: CaSource::File(ca) },
        (None, None, None, configmap) => Credentials::Kubeconfig {
            ca: CaSource::ConfigMap(configmap.clone().unwrap_or_else(|| kubectl::DEFAULT_CA_CONFIGMAP.to_owned())),
        },
        _ => bail!(
            "--cert and --key go together, with --ca (or BLOCKJANITOR_CERT, _KEY, _CA): a client certificate of \
             your own; without them the plugin sends your kubeconfig's token"
        ),
    };
    let (namespace, find_namespace) = match (explains(cli), &cli.kube.console_namespace, &cli.kube.namespace)
    {
        (true, Some(c), _) => (Some(c.clone()), false),
        (true, None, _) => (None, true),
        (false, Some(c), Some(n)) if c != n => {
            bail!("-n {n} and --console-namespace {c} both name the console's namespace: give one")
        }
        (false, c, n) => (c.clone().or_else(|| n.clone()), false),
    };
    Ok(Route {
        kubeconfig: cli.kube.kubeconfig.clone(),
        context: cli.kube.context.clone(),
        namespace,
        find_namespace,
        credentials,
        server_name: cli.server_name.clone().unwrap_or_else(|| kubectl::DEFAULT_SERVER_NAME.to_owned()),
    })
}
