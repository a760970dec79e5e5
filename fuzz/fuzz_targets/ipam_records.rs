//! The `ipam_records` target: [`fuzz::ipam_records`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::ipam_records(data));
