//! AFL++ entry for the `grpc` target (see the crate docs): `cargo afl build --release -p blockjanitor-fuzz`.

fn main() {
    afl::fuzz!(|data: &[u8]| blockjanitor_fuzz::TARGETS.iter().find(|(n, _)| *n == "grpc").map_or((), |(_, f)| f(data)));
}
