//! Per-sample sampling seeds: a sample's seed depends only on the run's seed, its prompt group and
//! its index in the group, so a sample draws the same tokens whatever shares its batch.

use ooze_core::SplitMix64;

/// The sampling seed of sample `index` of group `group`.
pub fn sample_seed(run_seed: u64, group: u64, index: usize) -> u64 {
    SplitMix64::new(
        run_seed
            ^ group.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ (index as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f),
    )
    .next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_differ_per_sample_and_repeat() {
        let a = sample_seed(1, 5, 0);
        assert_eq!(a, sample_seed(1, 5, 0));
        assert_ne!(a, sample_seed(1, 5, 1));
        assert_ne!(a, sample_seed(1, 6, 0));
        assert_ne!(a, sample_seed(2, 5, 0));
    }
}
