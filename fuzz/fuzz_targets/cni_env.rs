//! The `cni_env` target: [`fuzz::cni_env`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::cni_env(data));
