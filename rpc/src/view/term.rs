//! What the terminal on stdout allows: colour (only on a terminal, and only while `NO_COLOR` is
//! unset or empty: https://no-color.org), and its width (the terminal's, else `$COLUMNS`, else
//! none: piped text is never cut to a width it does not have). Plain ANSI codes: no dependency.

use std::io::IsTerminal;

use blockjanitor_proto::v1 as pb;

/// What a table may do on this stdout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Term {
    /// Verdicts in colour.
    pub colour: bool,
    /// The width to fit a table in (`None`: no limit).
    pub width: Option<usize>,
}

impl Term {
    /// This process's stdout, as the environment says (see the module docs).
    pub fn stdout() -> Self {
        let tty = std::io::stdout().is_terminal();
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let columns = std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse().ok()).filter(|w| *w > 0);
        Self { colour: tty && !no_color, width: if tty { terminal_width().or(columns) } else { columns } }
    }
}

/// The width of the terminal on stdout, if the kernel says.
fn terminal_width() -> Option<usize> {
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct we pass, which outlives the call;
    // fd 1 is only read from.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then_some(usize::from(ws.ws_col))
}

/// The SGR code a verdict is shown in: stale red, suspect/unknown/outage yellow, protected dim,
/// the others (in use, unused) plain.
fn verdict_code(verdict: i32) -> Option<&'static str> {
    match pb::Verdict::try_from(verdict).ok()? {
        pb::Verdict::Stale => Some("31"),
        pb::Verdict::Suspect | pb::Verdict::Unknown | pb::Verdict::Outage => Some("33"),
        pb::Verdict::InUse => Some("32"),
        pb::Verdict::Protected => Some("2"),
        _ => None,
    }
}

/// `text` in the verdict's colour when `colour` is on (padding stays outside the codes).
pub fn paint_verdict(text: &str, verdict: i32, colour: bool) -> String {
    match verdict_code(verdict).filter(|_| colour) {
        Some(code) => {
            let trimmed = text.trim_end();
            let pad = &text[trimmed.len()..];
            format!("\x1b[{code}m{trimmed}\x1b[0m{pad}")
        }
        None => text.to_owned(),
    }
}
