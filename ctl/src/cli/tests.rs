//! Unit tests of agentctl's flags: filters, targets, the fleet console, the names of the choices.

use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::client::Target;
use clap::{CommandFactory, Parser, ValueEnum};

use super::args::{Cli, Command, Output};
use super::choices::{KindChoice, VerdictChoice};
use super::console::ConsoleRoute;
use super::fleet_args::FleetCommand;
use super::target;
use crate::names;

pub(super) fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("agentctl").chain(args.iter().copied()))
}

/// How `agentctl fleet ...` (`plugin`: `kubectl-blockjanitor ...`) reaches the console.
pub(super) fn route(cli: &Cli, plugin: bool) -> anyhow::Result<ConsoleRoute> {
    let Command::Fleet { .. } = &cli.command else { panic!("not fleet: {cli:?}") };
    ConsoleRoute::from_cli(cli, plugin)
}

#[test]
fn cli_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn devices_filters() {
    let cli = parse(&["devices", "--kind", "loop", "--verdict", "in_use", "-o", "yaml"]).expect("parse");
    assert_eq!(cli.output, Output::Yaml);
    match cli.command {
        Command::Scan { filter, .. } => {
            assert_eq!(filter.kind.map(|k| k.wire), Some(pb::DeviceKind::Loop));
            assert_eq!(filter.verdict.map(|v| v.wire), Some(pb::Verdict::InUse));
            assert!(!filter.stale);
        }
        other => panic!("parsed as {other:?}"),
    }
    assert!(parse(&["devices", "--stale"]).is_ok());
    assert!(parse(&["devices", "--verdict", "in-use"]).is_ok());
    assert!(parse(&["devices", "--stale", "--verdict", "unused"]).is_err());
    assert!(parse(&["devices", "--kind", "floppy"]).is_err());
}

#[test]
fn scan_takes_columns_in_any_case_and_a_bad_one_names_the_valid_ones() {
    use blockjanitor_rpc::view::columns::Column;
    match parse(&["scan", "--columns", "name,MAJ:MIN,Size,held-by", "--tree"]).expect("parse").command {
        Command::Scan { layout, .. } => {
            assert_eq!(layout.columns, [Column::Name, Column::MajMin, Column::Size, Column::HeldBy]);
            assert!(layout.tree);
        }
        other => panic!("parsed as {other:?}"),
    }
    let err = parse(&["scan", "--columns", "NAME,COLOUR"]).expect_err("COLOUR is no column").to_string();
    for name in ["COLOUR", "NAME", "MAJ:MIN", "SIZE", "TYPE", "VERDICT", "HELD-BY", "PV", "WHY"] {
        assert!(err.contains(name), "the error names {name}: {err}");
    }
}

#[test]
fn cli_names_match_the_agents_names() {
    for k in KindChoice::value_variants() {
        let name = k.to_possible_value().map(|p| p.get_name().to_owned());
        assert_eq!(name, Some(names::kind_name(k.wire as i32)));
    }
    for v in VerdictChoice::value_variants() {
        let name = v.to_possible_value().map(|p| p.get_name().to_owned());
        assert_eq!(name, Some(names::verdict_name(v.wire as i32)));
    }
}

#[test]
fn apply_defaults_to_every_stale_device_and_timeout_is_bounded() {
    // As the agent's: no DEVICE is every stale one.
    match parse(&["apply", "--yes"]).expect("parse").command {
        Command::Apply { devices, yes, .. } => assert!(devices.is_empty() && yes),
        other => panic!("parsed as {other:?}"),
    }
    // The one vocabulary: scan (devices an alias), release and clean of one device.
    assert!(matches!(parse(&["devices", "--stale"]).expect("parse").command, Command::Scan { .. }));
    assert!(matches!(parse(&["scan"]).expect("parse").command, Command::Scan { .. }));
    assert!(matches!(
        parse(&["clean", "loop3", "--apply"]).expect("parse").command,
        Command::Clean { apply: true, .. }
    ));
    assert!(matches!(
        parse(&["release", "rbd3"]).expect("parse").command,
        Command::Release { apply: false, .. }
    ));
    assert!(parse(&["clean"]).is_err(), "clean needs its device");
    assert!(parse(&["apply", "loop3", "--yes"]).is_ok());
    // --identity binds an apply to an earlier plan: repeatable, may be "", needs --yes.
    let cli =
        parse(&["apply", "loop3", "loop4", "--yes", "--identity", "a", "--identity", ""]).expect("parse");
    match cli.command {
        Command::Apply { devices, yes, identities, release } => {
            assert_eq!(devices, ["loop3", "loop4"]);
            assert!(yes && !release);
            assert_eq!(identities, ["a", ""]);
        }
        other => panic!("parsed as {other:?}"),
    }
    match parse(&["apply", "--release", "loop3", "--yes"]).expect("parse").command {
        Command::Apply { release, .. } => assert!(release),
        other => panic!("parsed as {other:?}"),
    }
    assert!(parse(&["apply", "loop3", "--identity", "a"]).is_err(), "--identity without --yes");
    assert!(parse(&["--timeout", "0", "node"]).is_err());
    assert!(parse(&["node", "--timeout", "5"]).is_ok());
}

#[test]
fn fleet_targets_the_console() {
    let cli = parse(&[
        "fleet",
        "where",
        "shop/db",
        "--console",
        "console:9444",
        "--cert",
        "c",
        "--key",
        "k",
        "--ca",
        "a",
    ])
    .expect("parse");
    match route(&cli, false).expect("target") {
        ConsoleRoute::Direct(Target::Tcp(t)) => {
            assert_eq!((t.addr.as_str(), t.server_name.as_str()), ("console:9444", "console"))
        }
        other => panic!("{other:?}"),
    }
    let cli = parse(&["fleet", "nodes", "--console", "console:9444", "--addr", "n:1"]).expect("parse");
    assert!(route(&cli, false).is_err(), "--addr is one agent, not the console");
    let cli = parse(&["fleet", "multiattach", "pvc/shop/db", "-o", "yaml"]).expect("parse");
    assert!(matches!(cli.command, Command::Fleet { command: FleetCommand::Multiattach { .. } }));
    assert!(parse(&["fleet", "where"]).is_err(), "where needs something to look for");
}

#[test]
fn targets() {
    let cli = parse(&["--socket", "/tmp/a.sock", "node"]).expect("parse");
    assert_eq!(target(&cli).expect("target"), Target::Unix("/tmp/a.sock".into()));
    let cli = parse(&["--addr", "node1:9443", "--cert", "c.pem", "--key", "k.pem", "--ca", "ca.pem", "node"])
        .expect("parse");
    match target(&cli).expect("target") {
        Target::Tcp(t) => assert_eq!(t.server_name, "node1"),
        other => panic!("{other:?}"),
    }
    let cli = parse(&["--addr", "node1:9443", "--cert", "c.pem", "node"]).expect("parse");
    let e = target(&cli).expect_err("missing files");
    assert_eq!(e.to_string(), "--addr needs --cert, --key and --ca (mutual TLS); missing --key, --ca");
    let cli = parse(&["--cert", "c.pem", "node"]).expect("parse");
    assert!(target(&cli).is_err());
    let cli = parse(&["--addr", "node1", "--cert", "c", "--key", "k", "--ca", "a", "node"]).expect("parse");
    assert!(target(&cli).is_err());
}

/// Every subcommand's `--help` (the fleet's too) shows an example, and every example parses.
#[test]
fn every_subcommand_has_an_example_that_parses() {
    fn walk(c: &mut clap::Command, path: &mut Vec<String>, checked: &mut usize) {
        let found = blockjanitor_rpc::help_examples::examples(&c.render_long_help().to_string(), "agentctl");
        if !path.is_empty() {
            let shown =
                found.iter().any(|w| w.iter().skip(1).filter(|a| !a.starts_with('-')).eq(path.iter()))
                    || found.iter().any(|w| path.iter().all(|p| w.contains(p)));
            assert!(shown, "`agentctl {} --help` shows no example of it", path.join(" "));
        }
        for words in found {
            Cli::try_parse_from(&words)
                .unwrap_or_else(|e| panic!("the example {words:?} does not parse: {e}"));
            *checked += 1;
        }
        for sub in c.get_subcommands_mut().filter(|s| s.get_name() != "help") {
            path.push(sub.get_name().to_owned());
            walk(sub, path, checked);
            path.pop();
        }
    }
    let mut checked = 0;
    walk(&mut Cli::command(), &mut Vec::new(), &mut checked);
    assert!(checked >= 20, "{checked} examples");
}
