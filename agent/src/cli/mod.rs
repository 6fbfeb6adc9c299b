//! The agent binary's side: its flags and commands ([`args`]), its settings built once
//! ([`settings`]), the one-shot commands ([`commands`]; `holders` in [`holders`]; `release`,
//! `clean`, `plan` and `apply` through the one request workflow in [`requests`]; an orphaned pod
//! volume directory's `clean` through the directory workflow in [`dir_requests`]), `serve`
//! ([`serve`]), what goes to stdout ([`output`]) and the agent's own text ([`render`]). Each
//! command is a request to the engine's request API ([`crate::engine::requests`]), answered on
//! the wire ([`crate::engine::wire`]) or in the engine's words; what the answer means as an
//! exit code is said here. JSON and YAML go through blockjanitor-rpc's `view`, as agentctl's do.

pub mod args;
pub mod commands;
pub mod dir_requests;
pub mod holders;
pub mod output;
pub mod render;
pub mod requests;
pub mod serve;
pub mod settings;
