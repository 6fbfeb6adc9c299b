//! AFL++ entry for the `sysfs` target (see the crate docs); built by `scripts/fuzz.sh`.

fn main() {
    let target = blockjanitor_fuzz::target("sysfs");
    afl::fuzz!(|data: &[u8]| target(data));
}
