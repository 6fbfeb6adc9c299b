//! The blockjanitor agent's gRPC API, generated from `blockjanitor/v1/agent.proto`, and the
//! fleet console's (`fleet.proto`, same package). Nothing but
//! generated code lives here.

/// Version 1 of the API.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("blockjanitor.v1");

    /// The encoded file descriptor set, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("blockjanitor_descriptor");
}
