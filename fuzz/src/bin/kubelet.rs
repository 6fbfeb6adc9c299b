//! AFL++ entry for the `kubelet` target (see the crate docs); built by `scripts/fuzz.sh`.

fn main() {
    let target = blockjanitor_fuzz::target("kubelet");
    afl::fuzz!(|data: &[u8]| target(data));
}
