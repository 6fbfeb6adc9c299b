//! Error text for the command-line tools: one line, each cause once.

/// The error and its causes on one line (shared with the console and agentctl).
pub use blockjanitor_rpc::errors::one_line;

#[cfg(test)]
mod tests {
    #[test]
    fn causes_once() {
        let inner = std::io::Error::other("disk on fire");
        let outer = crate::discover::DiscoverError::Read { path: "/sys/x".into(), source: inner };
        assert_eq!(super::one_line(&outer), "cannot read /sys/x: disk on fire");
    }
}
