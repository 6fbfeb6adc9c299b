//! AFL++ entry for the `ceph_addr` target (see the crate docs); built by `scripts/fuzz.sh`.

fn main() {
    let target = blockjanitor_fuzz::target("ceph_addr");
    afl::fuzz!(|data: &[u8]| target(data));
}
