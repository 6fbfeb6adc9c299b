//! The agent binary's side: its commands, its settings and the renderers of every output shape.

pub mod render;
