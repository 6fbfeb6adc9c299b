//! Error text for the command-line tools: one line, each cause once.

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
    #[test]
    fn causes_once() {
        let inner = std::io::Error::other("disk on fire");
        let outer = crate::discover::DiscoverError::Read { path: "/sys/x".into(), source: inner };
        assert_eq!(super::one_line(&outer), "cannot read /sys/x: disk on fire");
    }
}
