//! One exit-code table for both CLIs (issue 38): README's "Exit codes" table, both binaries'
//! `--help` and `rpc::view::exit::TABLE` (the constants every command exits with) are the same
//! table. The cases that reach each code, in both CLIs against one scene, are
//! `cli_conformance.rs` (0, 1, 2, 4, and `apply` without `--yes`), `console.rs` (`fleet plan`
//! and `fleet apply` by the same table) and `fail_closed.rs` (3).

use std::process::Command;

use blockjanitor_rpc::view::exit;
use blockjanitor_tests::agent_bin;
use blockjanitor_tests::deploy::repo;

/// README's table rows: (code, meaning), in order.
fn readme_rows() -> Vec<(u8, String)> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section = readme.split("## Exit codes").nth(1).expect("README has an Exit codes section");
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let code = cells.get(1)?.trim_matches('`').parse::<u8>().ok()?;
            Some((code, cells.get(2)?.to_string()))
        })
        .collect()
}

#[test]
fn the_readme_table_is_the_table_the_code_exits_by() {
    let rows = readme_rows();
    let table: Vec<(u8, String)> = exit::TABLE.iter().map(|(c, w, _)| (*c, (*w).to_owned())).collect();
    assert_eq!(rows, table, "README's Exit codes table and rpc::view::exit::TABLE");
    // The constants are the codes the table names, each once.
    let codes: Vec<u8> = exit::TABLE.iter().map(|r| r.0).collect();
    assert_eq!(codes, [exit::DONE, exit::ERROR, exit::HELD, exit::UNKNOWN, exit::REFUSED]);
    assert_eq!(exit::NOT_DONE, exit::HELD, "apply that carried out nothing: as held");
}

#[test]
fn both_clis_help_print_that_table() {
    let section = exit::help_section();
    for bin in [agent_bin(), agent_bin().with_file_name("agentctl")] {
        let out = Command::new(&bin).arg("--help").output().expect("run --help");
        assert_eq!(out.status.code(), Some(0));
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.trim_end().ends_with(section.trim_end()),
            "{}'s --help does not end with the shared table:\n{help}",
            bin.display()
        );
    }
}
