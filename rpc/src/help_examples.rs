//! The example command lines of a `--help` text, for the CLIs' own tests (agentctl's and the
//! agent's): every subcommand's help must show at least one, and each must parse.

/// The commands of the `EXAMPLES:` section of `help` that start with `bin`, each as its words
/// (see [`commands`]). A line that starts with another program (`rbd status ... | agentctl ...`)
/// contributes what follows the pipe.
pub fn examples(help: &str, bin: &str) -> Vec<Vec<String>> {
    let Some((_, section)) = help.split_once("EXAMPLES:") else { return Vec::new() };
    let section = section.split("\n\n").next().unwrap_or_default();
    section.lines().flat_map(commands).filter(|words| words.first().is_some_and(|w| w == bin)).collect()
}

/// The commands of one shell line, each as its words: `|`, `;` and `&&` end a command, `#` the
/// line, a redirection (`>`, `2>`, `<`) the command's words; quotes and `$(...)` keep what they
/// hold in one word.
fn commands(line: &str) -> Vec<Vec<String>> {
    let (mut out, mut cmd, mut word) = (Vec::new(), Vec::new(), String::new());
    let (mut quote, mut depth, mut started, mut redirected) = (None, 0usize, false, false);
    let end_word = |cmd: &mut Vec<String>, word: &mut String, started: &mut bool| {
        if *started || !word.is_empty() {
            cmd.push(std::mem::take(word));
        }
        *started = false;
    };
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (None, '(') if word.ends_with('$') || depth > 0 => {
                depth += 1;
                word.push(c);
            }
            (None, ')') if depth > 0 => {
                depth -= 1;
                word.push(c);
            }
            (None, c) if depth > 0 => word.push(c),
            (None, '#') => break,
            (None, '|' | ';' | '&') => {
                if !redirected {
                    end_word(&mut cmd, &mut word, &mut started);
                }
                (word, started, redirected) = (String::new(), false, false);
                if !cmd.is_empty() {
                    out.push(std::mem::take(&mut cmd));
                }
            }
            (None, _) if redirected => {}
            (None, '>' | '<') => {
                word.retain(|c| !c.is_ascii_digit());
                end_word(&mut cmd, &mut word, &mut started);
                redirected = true;
            }
            (None, ' ' | '\t') => end_word(&mut cmd, &mut word, &mut started),
            (None, c) => word.push(c),
        }
    }
    if !redirected {
        end_word(&mut cmd, &mut word, &mut started);
    }
    if !cmd.is_empty() {
        out.push(cmd);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_lines_become_words() {
        let help = "Usage: x\n\nEXAMPLES:\n  agentctl node -o json\n  rbd status k8s/img | agentctl fleet who-watches -\n  \
agentctl apply loop3 --identity \"$(agentctl plan loop3 -o json | jq -r .x)\"   # bound\n  \
agentctl watch -o json | jq -c 'select(.type == \"x\")'\n  agentctl release rbd3 --force-busy 'INC-1: gone'\n  \
agentctl completions bash > /etc/x 2>/dev/null; agentctl node\n\nEXIT CODES:\n  agentctl nope";
        assert_eq!(
            examples(help, "agentctl"),
            [
                vec!["agentctl", "node", "-o", "json"],
                vec!["agentctl", "fleet", "who-watches", "-"],
                vec!["agentctl", "apply", "loop3", "--identity", "$(agentctl plan loop3 -o json | jq -r .x)"],
                vec!["agentctl", "watch", "-o", "json"],
                vec!["agentctl", "release", "rbd3", "--force-busy", "INC-1: gone"],
                vec!["agentctl", "completions", "bash"],
                vec!["agentctl", "node"],
            ]
        );
    }
}
