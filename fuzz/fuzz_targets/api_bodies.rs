//! The `api_bodies` target: [`fuzz::api_bodies`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::api_bodies(data));
