//! The agent binary's side: its flags and commands ([`args`]), its settings built once
//! ([`settings`]), the one-shot commands ([`commands`]), `serve` ([`serve`]) and the renderers of
//! every output shape ([`render`]).

pub mod args;
pub mod commands;
pub mod render;
pub mod serve;
pub mod settings;
