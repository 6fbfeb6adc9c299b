//! AFL++ entry for the `kmsg` target (see the crate docs); built by `scripts/fuzz.sh`.

fn main() {
    let target = blockjanitor_fuzz::target("kmsg");
    afl::fuzz!(|data: &[u8]| target(data));
}
