//! The console's alerts (deploy/components/console-monitoring/prometheusrule.yaml) against the
//! console's own series: every `blockjanitor_console_*` name an alert uses is served, every
//! finding kind has its alert and no alert names a kind the sweep does not count, and
//! `promtool check rules` accepts the groups (skipped without promtool, failed under CI=true).

use crate::index::Index;
use crate::metrics::Metrics;
use crate::sweep::{kind_name, KINDS};

const RULE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/components/console-monitoring/prometheusrule.yaml"
));

fn names(text: &str, prefix: &str, allowed: impl Fn(char) -> bool) -> Vec<String> {
    let mut out: Vec<String> = text
        .match_indices(prefix)
        .map(|(i, _)| text[i..].chars().take_while(|c| allowed(*c)).collect::<String>())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[test]
fn every_alert_uses_a_served_series_and_every_kind_has_an_alert() {
    let index = Index::new();
    index.write().upsert_node("a", "127.0.0.1:1", "static", Some("refused"));
    let sweeper = crate::sweeper::Sweeper::new(index, None);
    sweeper.flush();
    let served = Metrics::new(sweeper, None).expect("metrics").render();
    let used = names(RULE, "blockjanitor_console_", |c| c.is_ascii_alphanumeric() || c == '_');
    assert!(used.len() >= 3, "{used:?}");
    for n in &used {
        assert!(
            served.lines().any(|l| l.starts_with(&format!("{n}{{")) || l.starts_with(&format!("{n} "))),
            "{n} is not served:\n{served}"
        );
    }
    let kinds: Vec<String> = names(RULE, "kind=\"", |c| c != '}')
        .iter()
        .map(|k| k.trim_start_matches("kind=\"").trim_end_matches('"').to_owned())
        .collect();
    let all: Vec<String> = KINDS.iter().map(|k| kind_name(*k).to_owned()).collect();
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(kinds, sorted, "one alert per finding kind");
    assert_eq!(RULE.matches("- alert: ").count(), KINDS.len() + 2, "the kinds, incomplete, console down");
}

#[test]
fn promtool_accepts_the_rules() {
    let Ok(path) = which("promtool") else {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "promtool is missing under CI=true");
        eprintln!("SKIPPED: promtool is not on PATH (Debian package prometheus)");
        return;
    };
    // promtool reads the rule groups (the PrometheusRule's spec) as a rules file.
    let spec = RULE.split_once("\nspec:\n").expect("a spec").1;
    let groups: String =
        spec.lines().map(|l| l.strip_prefix("  ").unwrap_or(l)).map(|l| format!("{l}\n")).collect();
    let file = std::env::temp_dir().join(format!("blockjanitor-console-rules-{}.yaml", std::process::id()));
    std::fs::write(&file, groups).expect("write");
    let out = std::process::Command::new(path).args(["check", "rules"]).arg(&file).output();
    let _ = std::fs::remove_file(&file);
    let out = out.expect("run promtool");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("SUCCESS: 5 rules found"), "{text}");
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(())
}
