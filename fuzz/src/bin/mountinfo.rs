//! AFL++ entry for the `mountinfo` target (see the crate docs); built by `scripts/fuzz.sh`.

fn main() {
    let target = blockjanitor_fuzz::target("mountinfo");
    afl::fuzz!(|data: &[u8]| target(data));
}
