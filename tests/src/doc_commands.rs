//! Commands in the project's documents (README.md, docs/, runbooks, CONTRIBUTING.md), checked
//! against the CLIs' own parsers: every `blockjanitor-agent`, `agentctl` and `kubectl blockjanitor`
//! line of a code block must parse as its binary would parse it, and every `kubectl` that selects
//! the project's pods selects them by their component label in the project's namespace.

use clap::Parser;

/// The lines of a page's fenced code blocks, comments cut, continuation lines joined.
pub fn code_lines(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    let mut pending = String::new();
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside;
            continue;
        }
        if !inside {
            continue;
        }
        let line = line.split(" #").next().unwrap_or_default().trim_end();
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(line);
        out.push(std::mem::take(&mut pending));
    }
    out
}

/// Words of a command line as a shell splits them (quotes removed; no expansion), up to the first
/// unquoted pipe, redirection, `;` or `&&`: the words of its first command.
pub fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut w = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        if quote.is_none() && matches!(c, '|' | '>' | '<' | ';' | '&') {
            // A redirection's number (`2>`) is not an argument.
            if w.chars().all(|c| c.is_ascii_digit()) && !any {
                w.clear();
            }
            break;
        }
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => w.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if !w.is_empty() || any {
                    out.push(std::mem::take(&mut w));
                }
                any = false;
            }
            (None, c) => w.push(c),
        }
    }
    if !w.is_empty() || any {
        out.push(w);
    }
    out
}

/// Checks one command line of `page`; why it fails, if it does.
pub fn check_command(line: &str) -> Option<String> {
    let w = words(line);
    let ws: Vec<&str> = w.iter().map(String::as_str).collect();
    // Through `kubectl ... exec POD -- agentctl ...`, or run on the node.
    if let Some(i) = ws.iter().position(|x| *x == "agentctl") {
        return blockjanitor_ctl::cli::parses(&ws[i + 1..], false).err().map(|e| format!("agentctl: {e}"));
    }
    if let Some(i) = ws.windows(2).position(|p| p == ["kubectl", "blockjanitor"]) {
        return blockjanitor_ctl::cli::parses(&ws[i + 2..], true)
            .err()
            .map(|e| format!("kubectl blockjanitor: {e}"));
    }
    if let Some(i) = ws.iter().position(|x| *x == "blockjanitor-agent") {
        let args = std::iter::once("blockjanitor-agent").chain(ws[i + 1..].iter().copied());
        return blockjanitor::cli::args::Cli::try_parse_from(args)
            .err()
            .map(|e| format!("blockjanitor-agent: {e}"));
    }
    if ws.first() == Some(&"kubectl") && ws.contains(&"pods") && ws.contains(&"-l") {
        let selector = ws.iter().skip_while(|x| **x != "-l").nth(1).copied().unwrap_or_default();
        let namespaced = ws.windows(2).any(|p| p == ["-n", "blockjanitor"]);
        let component = selector
            .split(',')
            .any(|s| s == "app.kubernetes.io/component=agent" || s == "app.kubernetes.io/component=console");
        if !namespaced || !component {
            return Some(format!(
                "selects pods by '{selector}'{}: select the agent's or the console's by app.kubernetes.io/component",
                if namespaced { "" } else { " outside -n blockjanitor" }
            ));
        }
    }
    None
}
