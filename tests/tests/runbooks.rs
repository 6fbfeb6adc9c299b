//! The runbooks (`docs/runbooks/`, one page per alert) say what the alert rules say and give only
//! commands that work: each page's table has the rule's severity and its expression (and `for`)
//! as the PrometheusRule has them, an impact line, a way onto the node or to the console, a
//! decision section; every `agentctl` and `kubectl blockjanitor` command in its code blocks parses
//! with agentctl's own parser, every `blockjanitor-agent` command with the agent's, and every
//! `kubectl` that selects the project's pods selects them by their component label in the
//! project's namespace (`app.kubernetes.io/component=agent` or `=console`: a bare name selector
//! would match the console's pods too).

use std::collections::BTreeMap;

use blockjanitor_tests::deploy::repo;
use blockjanitor_tests::doc_commands::{check_command, code_lines, words};

/// (severity, for, expression with white space folded) of every alert in the shipped rules.
fn alerts() -> BTreeMap<String, (String, Option<String>, String)> {
    let mut out = BTreeMap::new();
    for f in [
        "deploy/components/monitoring/prometheusrule.yaml",
        "deploy/components/console-monitoring/prometheusrule.yaml",
    ] {
        let text = std::fs::read_to_string(repo().join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("yaml");
        for g in doc["spec"]["groups"].as_sequence().expect("groups") {
            for r in g["rules"].as_sequence().expect("rules") {
                let Some(alert) = r["alert"].as_str() else { continue };
                let severity = r["labels"]["severity"].as_str().expect("severity").to_owned();
                let r#for = r["for"].as_str().map(str::to_owned);
                let expr = r["expr"].as_str().expect("expr").split_whitespace().collect::<Vec<_>>().join(" ");
                out.insert(alert.to_owned(), (severity, r#for, expr));
            }
        }
    }
    out
}

#[test]
fn every_runbook_says_what_its_rule_says_and_gives_commands_that_work() {
    let mut wrong = Vec::new();
    for (alert, (severity, r#for, expr)) in alerts() {
        let path = repo().join(format!("docs/runbooks/{alert}.md"));
        let page = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let row = |name: &str| {
            page.lines()
                .find_map(|l| l.strip_prefix(&format!("| {name} | ")))
                .map(|r| r.trim_end_matches(" |").to_owned())
        };
        match row("severity") {
            Some(s) if s == severity => {}
            other => wrong.push(format!("{alert}: severity {other:?}, the rule says {severity}")),
        }
        let fires =
            format!("`{expr}`{}", r#for.as_ref().map_or(" (at once)".to_owned(), |f| format!(" for {f}")));
        match row("fires when") {
            Some(f) if f == fires => {}
            other => wrong.push(format!("{alert}: fires when {other:?}, the rule says {fires}")),
        }
        if row("impact").is_none_or(|i| i.len() < 40) {
            wrong.push(format!("{alert}: no impact row"));
        }
        for section in ["## What it means", "## Confirm", "## Decide", "## What not to do"] {
            if !page.contains(section) {
                wrong.push(format!("{alert}: no section '{section}'"));
            }
        }
        if !page.contains("## Get onto the node") && !page.contains("## Get to the console") {
            wrong.push(format!("{alert}: no way onto the node or to the console"));
        }
        for line in code_lines(&page) {
            if let Some(why) = check_command(&line) {
                wrong.push(format!("{alert}: `{line}`: {why}"));
            }
        }
    }
    assert!(wrong.is_empty(), "runbooks that disagree with their rules or the CLI:\n{}", wrong.join("\n"));
}

/// The check itself catches what it is for.
#[test]
fn the_command_check_refuses_what_does_not_parse_and_bare_selectors() {
    assert!(check_command("kubectl -n blockjanitor exec \"$POD\" -- agentctl devices --stale").is_none());
    assert!(check_command("kubectl -n blockjanitor exec \"$POD\" -- agentctl devices --stael").is_some());
    assert!(check_command("kubectl blockjanitor sweep --kind multi_node").is_none());
    assert!(check_command("kubectl blockjanitor sweep --knd multi_node").is_some());
    assert!(
        check_command("kubectl -n blockjanitor get pods -l app.kubernetes.io/name=blockjanitor").is_some()
    );
    assert!(check_command("kubectl get pods -l app.kubernetes.io/component=agent").is_some());
    assert!(check_command("blockjanitor-agent holders /dev/loop0 --output json").is_none());
    assert!(check_command("blockjanitor-agent holders --wrong").is_some());
    assert_eq!(words("a 'b c' \"d\" ''"), ["a", "b c", "d", ""]);
    assert_eq!(words("a -o json | jq '.x | .y' > f"), ["a", "-o", "json"]);
    assert_eq!(words("a 'x|y' 2>/dev/null"), ["a", "x|y"]);
    assert!(check_command("agentctl scan -o json | jq -r '.devices[] | .name'").is_none());
}
