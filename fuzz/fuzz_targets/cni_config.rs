//! The `cni_config` target: [`fuzz::cni_config`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::cni_config(data));
