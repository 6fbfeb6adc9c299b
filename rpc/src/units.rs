//! Sizes for people (`8M`, `97.7G`), shared by every renderer: the agent's CLI, agentctl and the
//! console. Written as `lsblk` writes its SIZE column (util-linux's default: powers of 1024, one
//! letter, at most one decimal, none when it rounds to zero), so a size reads the same in both.

/// The suffixes, one per power of 1024.
const LETTERS: [char; 7] = ['B', 'K', 'M', 'G', 'T', 'P', 'E'];

/// Sizes as `lsblk` prints them: `0B`, `512B`, `1K`, `97.7G`, `1.5G`, `1024K` (a fraction that
/// rounds up to a whole unit stays in that unit, as lsblk leaves it).
pub fn size(bytes: u64) -> String {
    // The power of 1024 (as a shift of 0, 10, ... 60) below which `bytes` stays.
    let exp = (10..=60).step_by(10).find(|s| bytes < (1u64 << s)).map_or(60, |s| s - 10);
    let letter = LETTERS[exp / 10];
    if exp == 0 {
        return format!("{bytes}{letter}");
    }
    let mut whole = bytes >> exp;
    let rest = bytes & ((1u64 << exp) - 1);
    // Three decimals, then rounded to one (4/5), as lsblk does it.
    let thousandths =
        if rest >= u64::MAX / 1000 { ((rest / 1024) * 1000) >> (exp - 10) } else { (rest * 1000) >> exp };
    let mut tenth = (thousandths + 50) / 100;
    if tenth == 10 {
        whole += 1;
        tenth = 0;
    }
    if tenth == 0 {
        format!("{whole}{letter}")
    } else {
        format!("{whole}.{tenth}{letter}")
    }
}

#[cfg(test)]
mod tests {
    use super::size;

    /// What lsblk (util-linux 2.38) prints for these sizes.
    #[test]
    fn sizes_read_as_lsblk_writes_them() {
        for (bytes, want) in [
            (0, "0B"),
            (512, "512B"),
            (1023, "1023B"),
            (1024, "1K"),
            (1536, "1.5K"),
            (1 << 20, "1M"),
            (8 << 20, "8M"),
            (100 << 20, "100M"),
            (1536 << 20, "1.5G"),
            (3 << 30, "3G"),
            (104_857_600_000, "97.7G"),
            (256 << 30, "256G"),
            ((1 << 20) - 1, "1024K"),
            (1_048_575 << 10, "1024M"),
            (1_100_000, "1M"),
            (u64::MAX, "16E"),
        ] {
            assert_eq!(size(bytes), want, "{bytes} bytes");
        }
    }
}
