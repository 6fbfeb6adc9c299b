//! AFL++ entry for the `proc` target (see the crate docs): `cargo afl build --release -p blockjanitor-fuzz`.

fn main() {
    afl::fuzz!(|data: &[u8]| blockjanitor_fuzz::TARGETS.iter().find(|(n, _)| *n == "proc").map_or((), |(_, f)| f(data)));
}
