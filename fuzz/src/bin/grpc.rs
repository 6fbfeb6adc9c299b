//! AFL++ entry for the `grpc` target (see the crate docs); built by `scripts/fuzz.sh`.

fn main() {
    let target = blockjanitor_fuzz::target("grpc");
    afl::fuzz!(|data: &[u8]| target(data));
}
