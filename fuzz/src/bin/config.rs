//! AFL++ entry for the `config` target (see the crate docs); built by `scripts/fuzz.sh`.

fn main() {
    let target = blockjanitor_fuzz::target("config");
    afl::fuzz!(|data: &[u8]| target(data));
}
