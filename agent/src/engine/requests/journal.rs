//! The `journal` request: what the journal has unfinished (open intents, and journaled plans not
//! every step of which finished), read without the engine or the host.

use std::path::Path;

use crate::act::journal::{self, Intent, OpenPlan};

/// What the journal has unfinished.
pub struct JournalAnswer {
    /// The intents no result closed, as journaled.
    pub pending: Vec<Intent>,
    pub plans: Vec<UnfinishedPlan>,
}

/// A journaled plan not every step of which finished.
pub struct UnfinishedPlan {
    pub id: String,
    /// Its operation and the argument it was asked with, `?` when the record lacks them.
    pub operation: String,
    pub argument: String,
    pub finished: usize,
    pub total: usize,
}

impl UnfinishedPlan {
    fn of(p: &OpenPlan) -> Self {
        let word = |w: &str| if w.is_empty() { "?".to_owned() } else { w.to_owned() };
        let body = &p.record.body;
        Self {
            id: p.id.clone(),
            operation: word(&body.request.operation),
            argument: word(&body.request.argument),
            finished: p.finished.len(),
            total: body.steps.len(),
        }
    }
}

/// Reads the journal at `path` (a missing one has nothing unfinished).
pub fn unfinished(path: &Path) -> std::io::Result<JournalAnswer> {
    let pending = journal::pending(path)?;
    let plans = journal::open_plans(path)?.iter().map(UnfinishedPlan::of).collect();
    Ok(JournalAnswer { pending, plans })
}
