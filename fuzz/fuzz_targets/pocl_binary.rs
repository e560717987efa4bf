#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crane_fuzz::pocl_binary(data));
