//! What the journal's recovery did, said line by line (on stderr, or in the daemon's log). Every
//! table and text of an answer goes through blockjanitor-rpc's `view` on the wire messages,
//! shared with agentctl: this file holds no renderer of its own.

use crate::engine::outcome::Outcome;
use crate::engine::recover::Recovery;

/// Says what the journal's recovery did through `say`: each interrupted step closed (or left
/// open), each unfinished plan resumed or left for its own command.
pub fn say_recovery(out: &Outcome, say: impl Fn(&str)) {
    say_recovery_of(&out.recovery, &say);
    for u in &out.unfinished {
        say(u);
    }
}

/// Says what the journal's recovery did: each interrupted step closed, or left open and why.
pub fn say_recovery_of(recovery: &Recovery, say: impl Fn(&str)) {
    for (i, how) in &recovery.resolved {
        say(&format!("recovered interrupted step {} ({}): {}", i.id, how.word, how.detail));
    }
    for (id, why) in &recovery.left_open {
        say(&format!("journal step {id} left open: {why}"));
    }
}
