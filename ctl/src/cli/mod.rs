//! `agentctl`: talk to the blockjanitor agent on this node (unix socket) or on another node (TCP
//! with mutual TLS), or to the fleet console (`fleet`, and the kubectl plugin). Parses flags
//! ([`args`], [`fleet_args`]), makes the calls ([`node`], [`fleet`]), prints; the formatting is
//! in blockjanitor-rpc's `view`, shared with the agent. Exit codes (`view::exit`, the agent's
//! own): 0 free or done, 1 error, 2 held or not carried out (no --yes, a step deferred), 3
//! unknown, 4 refused (a plan refused by a safety rule, or the call: FailedPrecondition,
//! PermissionDenied on an apply).

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use blockjanitor_rpc::client::{self, Target, TcpTarget};
use clap::{CommandFactory, Parser};

use args::{Cli, Command};
use console::ConsoleRoute;
use output::write_out;

mod args;
pub use blockjanitor_rpc::view::choices;
mod console;
mod fleet;
mod fleet_args;
mod kube_args;
mod node;
mod output;

#[cfg(test)]
mod console_tests;
#[cfg(test)]
mod tests;

/// Whether this runs as the kubectl plugin (`kubectl-blockjanitor`, run by `kubectl blockjanitor
/// ...`).
fn invoked_as_plugin() -> bool {
    std::env::args_os()
        .next()
        .is_some_and(|a| Path::new(&a).file_name().is_some_and(|n| n == "kubectl-blockjanitor"))
}

/// As the kubectl plugin, the arguments are those of `agentctl fleet`.
fn arguments() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if invoked_as_plugin() {
        args.insert(1, "fleet".into());
    }
    args
}

/// Whether `args` (the words after the program's name) is a command line agentctl accepts
/// (`plugin`: as `kubectl blockjanitor ...`, whose words are `agentctl fleet`'s): the commands
/// the docs and runbooks give are checked with it. `Err`: clap's first line saying why not.
pub fn parses(args: &[&str], plugin: bool) -> Result<(), String> {
    let mut all = vec!["agentctl"];
    if plugin {
        all.push("fleet");
    }
    all.extend_from_slice(args);
    Cli::try_parse_from(all)
        .map(|_| ())
        .map_err(|e| e.to_string().lines().next().unwrap_or_default().to_owned())
}

/// agentctl's `main`: parses the flags (a usage error exits 1, `--help` 0), runs the command,
/// and prints an error as one line (exit 1; 4 when the agent refused the call by a safety rule).
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse_from(arguments()) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", blockjanitor_rpc::errors::one_line(e.as_ref()));
            ExitCode::from(output::error_code(&e))
        }
    }
}

/// Where to connect, from the flags.
fn target(cli: &Cli) -> Result<Target> {
    let Some(addr) = &cli.addr else {
        if cli.cert.is_some() || cli.key.is_some() || cli.ca.is_some() || cli.server_name.is_some() {
            bail!("--cert, --key, --ca and --server-name are for TCP: add --addr HOST:PORT");
        }
        return Ok(Target::Unix(cli.socket.clone()));
    };
    let (host, _) = client::split_host_port(addr)
        .with_context(|| format!("--addr '{addr}' is not HOST:PORT (e.g. node1:9443 or [fd00::1]:9443)"))?;
    let missing: Vec<&str> = [("--cert", &cli.cert), ("--key", &cli.key), ("--ca", &cli.ca)]
        .into_iter()
        .filter(|(_, v)| v.is_none())
        .map(|(flag, _)| flag)
        .collect();
    let (Some(cert), Some(key), Some(ca)) = (&cli.cert, &cli.key, &cli.ca) else {
        bail!("--addr needs --cert, --key and --ca (mutual TLS); missing {}", missing.join(", "));
    };
    Ok(Target::Tcp(TcpTarget {
        addr: addr.clone(),
        cert: cert.clone(),
        key: key.clone(),
        ca: ca.clone(),
        server_name: cli.server_name.clone().unwrap_or_else(|| host.to_owned()),
    }))
}

fn run(cli: &Cli) -> Result<u8> {
    output::configure(cli.output, cli.quiet);
    if let Command::Completions { shell } = &cli.command {
        let mut buf = Vec::new();
        clap_complete::generate(*shell, &mut Cli::command(), "agentctl", &mut buf);
        write_out(&String::from_utf8_lossy(&buf))?;
        return Ok(0);
    }
    if let Command::Fleet { command } = &cli.command {
        let route = ConsoleRoute::from_cli(cli, invoked_as_plugin())?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the runtime")?;
        let direct = match &route {
            ConsoleRoute::Direct(t) => Some(t.clone()),
            ConsoleRoute::Kube(_) => None,
        };
        let hint = |e| match &direct {
            Some(t) => tls_hint(t)(e),
            None => e,
        };
        return rt
            .block_on(async {
                let channel = route.channel(Duration::from_secs(cli.timeout)).await?;
                // explain's object namespace, as kubectl's: -n, else the context's, else default.
                let object_namespace = match (console::explains(cli), &cli.kube.namespace, &route) {
                    (true, Some(n), _) => n.clone(),
                    (true, None, ConsoleRoute::Kube(r)) => crate::kubectl::context_namespace(r).await?,
                    _ => "default".to_owned(),
                };
                fleet::fleet(cli, command, channel, &object_namespace).await
            })
            .map_err(hint);
    }
    if cli.kube.any() {
        bail!(
            "--kubeconfig, --context, -n, --console-namespace and --ca-configmap reach the fleet console: use them with `fleet`"
        );
    }
    let target = target(cli)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    rt.block_on(node::run_async(cli, &target)).map_err(tls_hint(&target))
}

/// Over TLS, an agent that rejects the client certificate just drops the connection after the
/// handshake: say so.
fn tls_hint(target: &Target) -> impl Fn(anyhow::Error) -> anyhow::Error + '_ {
    move |e| {
        let msg = e.to_string();
        let broken = ["Unknown: ", "Unavailable: ", "Cancelled: "].iter().any(|p| msg.starts_with(p));
        if matches!(target, Target::Tcp(_)) && broken && msg.contains("transport error") {
            anyhow::anyhow!(
                "{msg} (over TLS this usually means the agent rejected the client certificate: is --cert signed \
                 by the agent's client CA?)"
            )
        } else {
            e
        }
    }
}
