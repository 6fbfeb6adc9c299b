//! AFL++ entry for the `proc` target (see the crate docs); built by `scripts/fuzz.sh`.

fn main() {
    let target = blockjanitor_fuzz::target("proc");
    afl::fuzz!(|data: &[u8]| target(data));
}
