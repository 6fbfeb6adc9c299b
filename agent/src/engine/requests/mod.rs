//! The engine's request API for the fronts (issue 37): what the one-shot CLI and the gRPC
//! service call, so that neither reaches past the engine into a stage.
//!
//! - [`setup`]: where the host is and how to read it, the engine's settings in a front's words;
//! - [`OneShot`]: the engine for one run of the agent binary, with what a run keeps between
//!   runs (the grace clocks of the state file, the statmount memo of the commands that only
//!   show) and the journal; its requests: `scan` and `holders` ([`show`]), `release`, `clean`,
//!   `plan` and `apply` through the one request workflow ([`acting_requests`]);
//! - [`journal`]: what the journal has unfinished;
//! - [`api`]: the Kubernetes API's view a one-shot run judges with.
//!
//! The answers on the wire, which every front returns and prints (through blockjanitor-rpc's
//! `view`, as agentctl does), are [`super::wire`]'s. What a request
//! came to is a [`super::outcome::OutcomeClass`] (or, for `holders`, held and complete): how the
//! process says it to a script is the CLI's word, not the engine's.

pub mod acting_requests;
pub mod api;
pub mod journal;
pub mod setup;
pub mod show;

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::world::LinuxWorld;
use super::{Engine, Settings};
use crate::engine::statmount_cache_file;
use crate::judge::grace::Clocks;
use api::ApiWanted;
use setup::HostSpec;

/// How a one-shot run is set up, from the agent binary's flags.
#[derive(Debug, Clone)]
pub struct OneShotOptions {
    pub host: HostSpec,
    pub settings: Settings,
    pub api: ApiWanted,
    /// Where the grace clocks are kept between runs (`--state`; not written for fixture trees).
    pub state: PathBuf,
    /// Where what `statmount` said of each mount is kept between runs (`None`: nowhere). Only
    /// the requests that only show (`holders`, `scan`: [`show`]) load it; every other request,
    /// and the re-check before each step, asks the kernel afresh.
    pub statmount_memo: Option<PathBuf>,
    pub journal: PathBuf,
    /// How long an applying run waits for another writer of the journal.
    pub lock_wait: Duration,
    /// Who asks, for the journal and the audit log (`cli (uid 0)`).
    pub by: String,
}

/// The grace clocks a one-shot run keeps in its state file between runs (stamped with the boot
/// id; a fixture tree keeps none).
struct StateFile {
    path: PathBuf,
    live: bool,
    clocks: Clocks,
}

impl StateFile {
    fn load(path: &Path, host: &crate::host::HostRoot) -> Self {
        let live = host.is_live();
        let boot = crate::host::clock::boot_id(host);
        let clocks = if live { Clocks::load(path, boot) } else { Clocks::new(None) };
        Self { path: path.to_owned(), live, clocks }
    }

    fn save(&self) {
        if self.live {
            if let Err(e) = self.clocks.save(&self.path) {
                tracing::warn!(
                    "cannot save {}: {e}; the grace period restarts on the next run",
                    self.path.display()
                );
            }
        }
    }
}

/// The engine for one run of the agent binary, with its memory between runs.
pub struct OneShot {
    engine: Engine<LinuxWorld>,
    state: StateFile,
    /// Where the statmount memo is kept, and the memo once a request that only shows loaded it
    /// (saved after its scans).
    memo_path: Option<PathBuf>,
    memo: Option<statmount_cache_file::Kept>,
    journal: PathBuf,
    lock_wait: Duration,
    by: String,
}

impl OneShot {
    /// Loads the grace clocks, then builds the engine with the Kubernetes API's view as
    /// [`OneShotOptions::api`] says (which may wait for it to vouch, [`api`]).
    pub fn open(o: OneShotOptions) -> Self {
        let state = StateFile::load(&o.state, &o.host.host());
        let world = o.host.world();
        api::connect(&o.api, &world);
        let engine = Engine::new(world, o.settings);
        let (journal, lock_wait, by) = (o.journal, o.lock_wait, o.by);
        Self { engine, state, memo_path: o.statmount_memo, memo: None, journal, lock_wait, by }
    }

    /// The line a report opens with when the Kubernetes API's word is missing (off, not asked,
    /// or it cannot vouch): `None` while it vouches.
    pub fn api_line(&self) -> Option<String> {
        api::api_line(&self.engine.world)
    }

    /// The grace clocks (and the statmount memo, if loaded) saved, after the scans of a request.
    fn save(&mut self) {
        self.state.save();
        if let Some(m) = &mut self.memo {
            m.save();
        }
    }
}
