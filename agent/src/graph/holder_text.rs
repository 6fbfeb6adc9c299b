//! The words a holder is described in ([`super::Holder::describe`]): written straight into the
//! one string made, since a node's image disk has thousands of holders, each described at every
//! judging of it.

use crate::model::KernelText;

/// A holder's process (its first pid and that one's `comm`, and the task when the holder is one
/// task's own) in words: `pid 7 (comm)`, `pid 7 (comm) tid 9`, `pid 7`, or nothing.
pub(super) struct Who<'a>(pub(super) Option<u32>, pub(super) Option<&'a KernelText>, pub(super) Option<u32>);

impl std::fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.0, self.1) {
            (Some(p), Some(c)) => write!(f, "pid {p} ({c})")?,
            (Some(p), None) => write!(f, "pid {p}")?,
            _ => return Ok(()),
        }
        match self.2 {
            Some(t) if Some(t) != self.0 => write!(f, " tid {t}"),
            _ => Ok(()),
        }
    }
}

/// Kernel text as shown (escaped), `?` when unknown.
pub(super) struct Shown<'a>(pub(super) Option<&'a KernelText>);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(text) => text.fmt(f),
            None => f.write_str("?"),
        }
    }
}
