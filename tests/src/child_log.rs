//! The child processes the tests start (the agent's `serve`, the console): their JSON log on
//! stderr, kept line by line, with the listeners they announce; and their stop with SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A child's log lines so far, kept by a reader thread.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    /// Every line so far, joined by newlines.
    pub fn text(&self) -> String {
        self.0.lock().map(|g| g.join("\n")).unwrap_or_default()
    }
}

/// Reads `stderr` on a thread: keeps every line in the returned [`Log`] (printed on stderr too
/// with the prefix `echo`, if any) and sends each listener the child announces (`listener`,
/// `address` of a JSON line) on the returned channel.
pub fn follow(stderr: ChildStderr, echo: Option<String>) -> (Log, Receiver<(String, String)>) {
    let log = Log::default();
    let (tx, rx) = mpsc::channel::<(String, String)>();
    let kept = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(prefix) = &echo {
                eprintln!("{prefix}: {line}");
            }
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                if let (Some(l), Some(a)) = (v["listener"].as_str(), v["address"].as_str()) {
                    let _ = tx.send((l.to_owned(), a.to_owned()));
                }
            }
            if let Ok(mut g) = kept.0.lock() {
                g.push(line);
            }
        }
    });
    (log, rx)
}

/// Sends SIGTERM and waits (5 s at most, then SIGKILL); returns the exit code.
pub fn stop(child: &mut Child) -> Option<i32> {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    for _ in 0..250 {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}
