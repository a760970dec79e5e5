//! Internet checksum arithmetic the programs' rewrites share (RFC 1071, RFC 1624), and how a
//! rewrite tells an skb's checksum state from what the kernel's helper did to the field. Pure
//! functions on values as loaded from the packet: the ones'-complement sum does not depend on
//! byte order, so loaded words need no swapping.

/// The ones'-complement sum `~m + m'` of a 32-bit word's change from `old` to `new`: what
/// [`apply`] applies to any checksum covering the word (compute it once for several).
#[inline(always)]
#[must_use]
pub fn change4(old: u32, new: u32) -> u16 {
    let old = !old;
    !fold((old & 0xffff) + (old >> 16) + (new & 0xffff) + (new >> 16))
}

/// A checksum after the words it covers changed by `change` ([`change4`]), RFC 1624's
/// `HC' = ~(~HC + ~m + m')`.
#[inline(always)]
#[must_use]
pub fn apply(check: u16, change: u16) -> u16 {
    fold(u32::from(!check) + u32::from(change))
}

/// An Internet checksum after one of the 16-bit words it covers changed from `old` to `new`.
#[inline(always)]
#[must_use]
pub fn replace2(check: u16, old: u16, new: u16) -> u16 {
    fold(u32::from(!check) + u32::from(!old) + u32::from(new))
}

/// The complement of a 32-bit ones'-complement sum folded to 16 bits (at most five 16-bit terms,
/// so two folds are enough).
#[inline(always)]
fn fold(sum: u32) -> u16 {
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// Equal in ones'-complement arithmetic: the two zeros (`0` and `0xffff`) are one value, and so
/// are UDP's computed zero and the all-ones it is sent as.
#[inline(always)]
#[must_use]
pub fn same(a: u16, b: u16) -> bool {
    zero_as_zero(a) == zero_as_zero(b)
}

/// `0xffff` as `0`, anything else as it is; arithmetic, no branch (each branch multiplies the
/// paths the BPF verifier walks).
#[inline(always)]
fn zero_as_zero(x: u16) -> u16 {
    let all_ones = ((u32::from(x) + 1) >> 16) as u16;
    x & all_ones.wrapping_sub(1)
}

/// What an skb's upper-layer checksum field holds, as far as a rewrite needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// The segment's full checksum (`CHECKSUM_NONE`, `_UNNECESSARY`, `_COMPLETE`): a port's
    /// change updates it.
    Full,
    /// `CHECKSUM_PARTIAL`: only the pseudo header's sum, which no port is part of.
    Partial,
    /// Cannot be told apart (the address change is zero in ones'-complement arithmetic, or the
    /// helper did neither): the kernel's helper must apply the port's change.
    Unknown,
}

/// The checksum state of an skb, from its upper-layer checksum field `before` and `after` the
/// kernel's `bpf_l4_csum_replace` applied an address change whose sum is `change` ([`change4`])
/// with `BPF_F_PSEUDO_HDR`. The kernel (`inet_proto_csum_replace4`) updates a full checksum as
/// [`apply`] does, subtracting the change (`~(~HC + ~m + m')`), and a partial one the other way
/// round, adding it (`HC + ~m + m'`: it holds the pseudo header's sum, not its complement); the
/// two results are the same value only when the change sums to zero. Programs cannot read
/// `ip_summed`; this tells it for no second helper call.
#[inline(always)]
#[must_use]
pub fn state(before: u16, after: u16, change: u16) -> State {
    let full = apply(before, change);
    let partial = !apply(!before, change);
    if same(full, partial) {
        State::Unknown
    } else if same(after, full) {
        State::Full
    } else if same(after, partial) {
        State::Partial
    } else {
        State::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071's checksum of `bytes` (an even length), as loaded.
    fn checksum(bytes: &[u8]) -> u16 {
        let mut sum: u32 = bytes
            .chunks(2)
            .map(|c| u32::from(u16::from_ne_bytes([c[0], c[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// A small deterministic generator (xorshift), so the cases are the same on every run.
    fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    /// The kernel's two updates of a field for an address change with the pseudo header flag,
    /// written from `inet_proto_csum_replace4` (32-bit `csum_add` with end-around carry, then
    /// `csum_fold`, which complements).
    fn kernel(check: u16, from: u32, to: u32, partial: bool) -> u16 {
        fn add(a: u32, b: u32) -> u32 {
            let (s, c) = a.overflowing_add(b);
            s + u32::from(c)
        }
        fn csum_fold(s: u32) -> u16 {
            let s = (s & 0xffff) + (s >> 16);
            let s = (s & 0xffff) + (s >> 16);
            !(s as u16)
        }
        let diff = |start: u32| add(add(start, !from), to);
        if partial {
            !csum_fold(diff(u32::from(check)))
        } else {
            csum_fold(diff(!u32::from(check)))
        }
    }

    #[test]
    fn replacing_words_matches_recomputing() {
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..10_000 {
            let mut data = [0u8; 20];
            for b in &mut data {
                *b = rng(&mut seed) as u8;
            }
            let check = checksum(&data);
            let at = (rng(&mut seed) % 5) as usize * 4;
            let old = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
            let new = rng(&mut seed) as u32;
            data[at..at + 4].copy_from_slice(&new.to_ne_bytes());
            assert!(same(apply(check, change4(old, new)), checksum(&data)));
            let at = (rng(&mut seed) % 10) as usize * 2;
            let old = u16::from_ne_bytes(data[at..at + 2].try_into().unwrap());
            let check = checksum(&data);
            let new = rng(&mut seed) as u16;
            data[at..at + 2].copy_from_slice(&new.to_ne_bytes());
            assert!(same(replace2(check, old, new), checksum(&data)));
        }
    }

    #[test]
    fn the_state_is_what_the_kernel_did() {
        let mut seed = 0x2545_f491_4f6c_dd1d;
        let (mut told, mut unknown) = (0, 0);
        for _ in 0..100_000 {
            let check = rng(&mut seed) as u16;
            let (old, new) = (rng(&mut seed) as u32, rng(&mut seed) as u32);
            for partial in [false, true] {
                let after = kernel(check, old, new, partial);
                match state(check, after, change4(old, new)) {
                    State::Full => {
                        assert!(!partial, "{check:#x} {old:#x} {new:#x}");
                        told += 1;
                    }
                    State::Partial => {
                        assert!(partial, "{check:#x} {old:#x} {new:#x}");
                        told += 1;
                    }
                    State::Unknown => unknown += 1,
                }
            }
        }
        // Only a change that is zero in ones'-complement arithmetic cannot be told.
        assert!(unknown * 1000 < told, "{unknown} unknown of {told}");
    }

    #[test]
    fn only_the_two_zeros_are_the_same() {
        assert!(same(0, 0xffff) && same(0xffff, 0) && same(0x1234, 0x1234));
        assert!(!same(0x1234, !0x1234) && !same(0, 1));
    }

    #[test]
    fn a_change_that_sums_to_nothing_is_unknown() {
        // 10.0.1.2 and 1.2.10.0 have the same ones'-complement sum (their 16-bit words swapped).
        let (old, new) = (
            u32::from_ne_bytes([10, 0, 1, 2]),
            u32::from_ne_bytes([1, 2, 10, 0]),
        );
        for partial in [false, true] {
            let after = kernel(0x1234, old, new, partial);
            assert_eq!(state(0x1234, after, change4(old, new)), State::Unknown);
        }
        // A field the helper did not touch as either state would: unknown.
        let (old, new) = (
            u32::from_ne_bytes([10, 0, 0, 1]),
            u32::from_ne_bytes([10, 0, 0, 9]),
        );
        assert_eq!(state(0x1234, 0x1234, change4(old, new)), State::Unknown);
    }
}
