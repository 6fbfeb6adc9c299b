//! Errors as text: an error and its causes on one line, for the last line a binary prints.

/// The error and its causes on one line, each cause once (the library's errors already name
/// theirs), with no line breaks.
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !msg.contains(&text) {
            msg = format!("{msg}: {text}");
        }
        cause = c.source();
    }
    msg.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("cannot read /sys/x: {source}")]
    struct Read {
        source: std::io::Error,
    }

    #[test]
    fn causes_once_without_line_breaks() {
        let e = Read { source: std::io::Error::other("disk on fire") };
        assert_eq!(super::one_line(&e), "cannot read /sys/x: disk on fire");
        let e = Read { source: std::io::Error::other("two\nlines") };
        assert_eq!(super::one_line(&e), "cannot read /sys/x: two lines");
    }
}
