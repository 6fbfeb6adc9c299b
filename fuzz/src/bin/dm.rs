//! AFL++ entry for the `dm` target (see the crate docs); built by `scripts/fuzz.sh`.

fn main() {
    let target = blockjanitor_fuzz::target("dm");
    afl::fuzz!(|data: &[u8]| target(data));
}
