//! Compiles `blockjanitor/v1/agent.proto` and `fleet.proto` with protox (a pure-Rust protobuf compiler, so no
//! `protoc` is needed) and generates the tonic client and server, plus the file descriptor set
//! that server reflection serves.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=blockjanitor/v1/agent.proto");
    println!("cargo:rerun-if-changed=blockjanitor/v1/fleet.proto");
    let fds = protox::compile(["blockjanitor/v1/agent.proto", "blockjanitor/v1/fleet.proto"], ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("blockjanitor_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
