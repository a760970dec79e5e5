//! The `manifest` target: [`fuzz::manifest`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::manifest(data));
