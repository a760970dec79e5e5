//! A fast hasher for the calculation's integer-keyed tables (endpoint ids, identities, rule
//! ids, policy keys): the multiply-rotate hash of rustc's `FxHasher`. The keys are numbers the
//! agent allocates, not input an attacker picks, so the standard SipHash's flood resistance
//! buys nothing here and costs several times the lookup. String-keyed tables keep SipHash. The
//! map drivers' desired state and dirty sets (`dataplane::map_driver`) use it too.

use std::{
    collections::{HashMap, HashSet},
    hash::{BuildHasher, Hasher},
};

/// Builds [`Fx`] hashers.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FxBuild;

impl BuildHasher for FxBuild {
    type Hasher = Fx;

    fn build_hasher(&self) -> Fx {
        Fx(0)
    }
}

/// rustc's `FxHasher` (one word at a time: rotate, xor, multiply).
pub(crate) struct Fx(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Fx {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        // The table picks a bucket by the low bits, and a product's low bits see only the
        // input's low bits (an address's first octets: every 10.100.x.y would share a bucket):
        // mix the high bits down (murmur3's finaliser, one multiply).
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
}

/// A `HashMap` with [`Fx`].
pub(crate) type FastMap<K, V> = HashMap<K, V, FxBuild>;
/// A `HashSet` with [`Fx`].
pub(crate) type FastSet<K> = HashSet<K, FxBuild>;

#[cfg(test)]
mod tests {
    use std::{collections::HashSet, hash::BuildHasher as _};

    use super::{FastMap, FxBuild};

    #[test]
    fn addresses_that_differ_in_their_last_octets_spread_over_the_low_bits() {
        // 4,096 pod addresses 10.100.x.y: a table of 4,096 buckets indexes by the low 12 bits;
        // a random hash fills about 2,589 of them (without the finaliser: one).
        let buckets: HashSet<u64> = (0..4096_u32)
            .map(|i| {
                let [_, _, c, d] = i.to_be_bytes();
                FxBuild.hash_one([10_u8, 100, c, d]) & 0xfff
            })
            .collect();
        assert!(buckets.len() > 2400, "{} buckets of 4,096", buckets.len());
    }

    #[test]
    fn a_fast_map_is_a_map() {
        let mut m = FastMap::default();
        for i in 0..1000_u32 {
            m.insert(i, i * 2);
        }
        assert_eq!(m.len(), 1000);
        assert!((0..1000).all(|i| m.get(&i) == Some(&(i * 2))));
    }
}
