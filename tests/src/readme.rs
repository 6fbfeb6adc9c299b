//! The README's documented commands, read from the README itself, so that a test runs them exactly
//! as a reader would copy them (not a version of them the test keeps).

use crate::deploy::repo;

/// The first fenced ```` ```sh ```` block of the README's section `heading` (a `## ` line), as
/// written: every line between the fences, comments included.
pub fn sh_block(heading: &str) -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section = readme
        .split("\n## ")
        .find(|s| s.lines().next().is_some_and(|l| l.trim() == heading))
        .unwrap_or_else(|| panic!("README.md has no section `## {heading}`"));
    let start =
        section.find("```sh\n").unwrap_or_else(|| panic!("README section `{heading}` has no ```sh block"));
    // A block may be indented (under a list item): it ends at the first line that is only a fence.
    let body = &section[start + "```sh\n".len()..];
    let lines: Vec<&str> = body.lines().take_while(|l| l.trim() != "```").collect();
    if lines.len() == body.lines().count() {
        panic!("README section `{heading}`: unclosed ```sh block");
    }
    lines.join("\n")
}

/// The commands of a block (its lines that are not comments or blank; a trailing comment after a
/// command is kept, as the shell reads it).
pub fn commands(block: &str) -> Vec<&str> {
    block.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quick_start_gives_the_main_job_and_the_test_command() {
        let block = sh_block("Quick start");
        assert_eq!(commands(&block), ["./scripts/scan.sh", "./scripts/test.sh"], "{block}");
    }
}
