//! AFL++ entry for the `events` target (see the crate docs); built by `scripts/fuzz.sh`.

fn main() {
    let target = blockjanitor_fuzz::target("events");
    afl::fuzz!(|data: &[u8]| target(data));
}
