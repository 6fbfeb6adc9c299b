//! Where `fleet` finds the console: `--console HOST:PORT` (or BLOCKJANITOR_CONSOLE) with
//! certificate files, or through the Kubernetes API (the kubectl plugin's way, and `agentctl
//! fleet` given `--kubeconfig`, `--context`, `-n` or `--tls-secret`): the kubeconfig, the
//! console's pod, a port-forward (see [`crate::kubectl`]).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use blockjanitor_rpc::client::{self, Target, TcpTarget};
use tonic::transport::Channel;

use super::args::Cli;
use super::fleet_args::FleetCommand;
use crate::kubectl::{self, Identity, Route};

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
    pub(crate) fn from_cli(cli: &Cli, command: &FleetCommand, plugin: bool) -> Result<Self> {
        if cli.addr.is_some() {
            bail!("--addr names one agent; fleet talks to the console: use --console or the kubeconfig (--context, -n)");
        }
        match (&cli.console, cli.kube.any()) {
            (Some(_), true) => bail!(
                "--console and the kubeconfig flags (--kubeconfig, --context, -n, --tls-secret) both name the \
                 console: give one (unset BLOCKJANITOR_CONSOLE to go through the kubeconfig)"
            ),
            (Some(addr), false) => direct(cli, addr).map(Self::Direct),
            (None, true) => Ok(Self::Kube(kube_route(cli, command)?)),
            (None, false) if plugin => Ok(Self::Kube(kube_route(cli, command)?)),
            (None, false) => bail!(
                "fleet needs the console: --context/-n/--kubeconfig to reach it through the Kubernetes API \
                 (as kubectl blockjanitor does by default), or --console HOST:PORT (or BLOCKJANITOR_CONSOLE) \
                 with --cert, --key and --ca"
            ),
        }
    }

    /// A channel to the console, the attempt bounded by `timeout`.
    pub(crate) async fn channel(&self, timeout: Duration) -> Result<Channel> {
        match self {
            Self::Direct(target) => Ok(client::connect_channel(target, timeout).await?),
            Self::Kube(route) => Ok(kubectl::connect(route, timeout).await?),
        }
    }
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

/// Through the kubeconfig: the client certificate from files when given, else from the Secret
/// (`--tls-secret`, or the viewer's; the operator's for apply, which needs that role).
fn kube_route(cli: &Cli, command: &FleetCommand) -> Result<Route> {
    let identity = match (files(cli)?, &cli.kube.tls_secret) {
        (Some(_), Some(_)) => {
            bail!("--tls-secret and --cert/--key/--ca both name the client certificate: give one")
        }
        (Some((cert, key, ca)), None) => Identity::Files { cert, key, ca },
        (None, Some(secret)) => Identity::Secret(secret.clone()),
        (None, None) => Identity::Secret(
            match command {
                FleetCommand::Apply { .. } => kubectl::DEFAULT_OPERATOR_SECRET,
                _ => kubectl::DEFAULT_VIEWER_SECRET,
            }
            .to_owned(),
        ),
    };
    Ok(Route {
        kubeconfig: cli.kube.kubeconfig.clone(),
        context: cli.kube.context.clone(),
        namespace: cli.kube.namespace.clone(),
        identity,
        server_name: cli.server_name.clone().unwrap_or_else(|| kubectl::DEFAULT_SERVER_NAME.to_owned()),
    })
}
